"""The processes the gateway benchmark starts, and the peers it measures llmgw against.

Each peer is installed once under var/bench/ and started on a free loopback port in
front of the same engine the "direct" target calls, with the engine's key:

- LiteLLM's proxy, `litellm[proxy]` from PyPI in a venv of its own, with one model,
  no database, logging at ERROR and a master key;
- Portkey's gateway, `@portkey-ai/gateway` from npm under var/bench/portkey/, run by
  node headless (no log console); each request names the provider (openai) and the
  engine as its custom host in headers, as Portkey's clients do without a config.
  Its stream reader waits 25 ms (a setTimeout) before passing on the first event, which
  its time to first token shows;
- the Rust routers, each from PyPI in a venv of its own under ~/.cache/llmgw/peers/
  <name>-<version> (made on the first run, then reused): vLLM's `vllm-router` and
  SGLang's `sglang-router` (started as `smg launch`), on loopback with their Prometheus
  listener on a free loopback port too, given the engines as `--worker-urls` and a
  policy (`cache_aware`, the default of both, unless said). Neither holds keys of its
  own: each passes the caller's Authorization header on, so the engines they front must
  accept the one key the caller sends.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
PATIENCE_S = 120.0
LITELLM = os.environ.get("BENCH_LITELLM", "1") != "0"
LITELLM_SPEC = os.environ.get("BENCH_LITELLM_SPEC", "litellm[proxy]==1.106.12")
LITELLM_VENV = Path(os.environ.get("BENCH_LITELLM_VENV", REPO / "var" / "bench" / "litellm-venv"))
PORTKEY = os.environ.get("BENCH_PORTKEY", "1") != "0"
PORTKEY_VERSION = os.environ.get("BENCH_PORTKEY_VERSION", "1.15.2")
PORTKEY_DIR = Path(os.environ.get("BENCH_PORTKEY_DIR", REPO / "var" / "bench" / "portkey"))
# The gateway asks for @hono/node-server ^1.3.3, which npm resolves to the newest 1.x;
# from 1.14.2 on, its Response keeps an upstream fetch's immutable headers, and every
# streamed chat fails ("TypeError: immutable" in updateHeaders: Portkey-AI/gateway#1389,
# #1550). 1.14.1 is the newest that streams.
HONO_NODE_SERVER = "1.14.1"
# The gateway calls hono's serve() without a hostname, so node would listen on every
# interface; this preload makes a listen on a bare port a listen on loopback only, so
# an open proxy is never reachable from the network while the benchmark runs.
_LOOPBACK_ONLY = (
    'data:text/javascript,import net from "node:net";const listen=net.Server.prototype.listen;'
    "net.Server.prototype.listen=function(port,host,...rest){"
    'if(typeof port==="number"&&host===undefined)host="127.0.0.1";'
    "return listen.call(this,port,host,...rest)}"
)


@dataclass(frozen=True)
class Peer:
    """A proxy in front of the engine: where to send requests, with what key and extra
    headers, which processes to count the CPU of, and the version installed."""

    name: str
    port: int
    key: str
    pids: Callable[[], list[int]]
    headers: tuple[tuple[str, str], ...] = ()
    version: str | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes have used, from /proc."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def machine_cpu() -> dict:
    """Every process's name and CPU seconds (user and system, all its threads), and the
    machine's busy and stolen seconds over all its cores, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                head, tail = (p / "stat").read_text().rsplit(")", 1)
            except OSError:
                continue
            fields = tail.split()
            pids[int(p.name)] = (head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / tick)
    # cpu  user nice system idle iowait irq softirq steal ...
    jiffies = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = sum(jiffies[:3]) + jiffies[5] + jiffies[6]
    return {"pids": pids, "busy": busy / tick, "steal": jiffies[7] / tick}


def cores_by_role(before: dict, after: dict, roles: dict[str, list[int]], seconds: float) -> dict:
    """The cores each role's processes used between two `machine_cpu` readings `seconds`
    apart (a process in two roles counts in the first); PostgreSQL's and Redis' servers
    by name; the rest of the machine's busy time as "everything else"; and "steal", the
    time the host gave to other machines."""
    was = before["pids"]
    used = {
        pid: cpu - was[pid][1] if pid in was else cpu for pid, (_, cpu) in after["pids"].items()
    }
    named = {
        "postgres": [p for p, (comm, _) in after["pids"].items() if comm.startswith("postgres")],
        "redis": [p for p, (comm, _) in after["pids"].items() if comm.startswith("redis-server")],
    }
    out: dict[str, float] = {}
    counted: set[int] = set()
    for role, pids in {**roles, **named}.items():
        mine = {p for p in pids if p in used} - counted
        counted |= mine
        out[role] = sum(used[p] for p in mine)
    out["everything else"] = after["busy"] - before["busy"] - sum(out.values())
    out["steal"] = after["steal"] - before["steal"]
    return {role: round(cpu / seconds, 3) for role, cpu in out.items()}


def tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc."""
    parents: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, ()))
    return out


def wait(what: str, check, timeout: float = PATIENCE_S, proc: subprocess.Popen | None = None):
    """`check()`'s first truthy answer, tried every 0.3 s; raises RuntimeError when
    `proc` exits first or `timeout` passes."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: {proc.args[0]} exited with {proc.returncode}; see its log")
        try:
            got = check()
            if got:
                return got
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            last = exc
        time.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}" + (f" ({last})" if last else ""))


class Procs:
    """What this benchmark started, each in a session of its own, stopped in reverse."""

    def __init__(self, home: Path) -> None:
        self.home, self.procs = home, []
        self.named: dict[str, subprocess.Popen] = {}

    def spawn(self, name: str, cmd: list[str], env: dict) -> subprocess.Popen:
        """Start `cmd` with its output in `<home>/<name>.log`; stopped by `stop`."""
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - the child writes it for its life
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        self.named[name] = proc
        return proc

    def stop(self) -> None:
        """SIGTERM each process group, newest first; SIGKILL any still there after 20 s."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def _not_installed(figure: str, note: str) -> None:
    print(
        json.dumps({"bench": "gateway", "figure": figure, "value": None, "note": note}), flush=True
    )


def _peer_env(home: Path) -> dict:
    # No database, cache or outbound proxy of the caller's: each peer talks to the
    # engine on loopback and to nothing else.
    drop = {"DATABASE_URL", "REDIS_URL", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"}
    env = {k: v for k, v in os.environ.items() if k.upper() not in drop}
    env.update(NO_PROXY="*", HOME=str(home))
    return env


def _litellm_binary() -> Path | None:
    """LiteLLM's `litellm` command, installed into its venv on the first run; None (and a
    line saying why) when it cannot be."""
    binary = LITELLM_VENV / "bin" / "litellm"
    if binary.exists():
        return binary
    python = shutil.which("python3.11") or sys.executable
    log = REPO / "var" / "bench" / "litellm-install.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"installing {LITELLM_SPEC} into {LITELLM_VENV} (a few minutes; log {log})",
          file=sys.stderr, flush=True)  # fmt: skip
    with open(log, "wb") as out:
        made = subprocess.run([python, "-m", "venv", str(LITELLM_VENV)], stdout=out, stderr=out)
        if made.returncode == 0:
            made = subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", LITELLM_SPEC],
                                  stdout=out, stderr=out, timeout=1800)  # fmt: skip
    if made.returncode != 0 or not binary.exists():
        _not_installed("litellm", f"{LITELLM_SPEC} could not be installed; see {log}")
        return None
    return binary


def start_litellm(procs: Procs, home: Path, engine_url: str, key: str, model: str) -> Peer | None:
    """LiteLLM's proxy serving `model` from the engine, once it answers its liveness
    check; None when BENCH_LITELLM=0 or it cannot be installed."""
    binary = _litellm_binary() if LITELLM else None
    if binary is None:
        return None
    master = "sk-bench-" + secrets.token_hex(16)
    config = home / "litellm.yaml"
    config.write_text(json.dumps({  # JSON is YAML
        "model_list": [{"model_name": model, "litellm_params": {
            "model": f"openai/{model}", "api_base": f"{engine_url}/v1", "api_key": key}}],
        "litellm_settings": {"telemetry": False, "set_verbose": False},
        "general_settings": {"master_key": master},
    }, indent=1))  # fmt: skip
    env = _peer_env(home)
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False", LITELLM_LOG="ERROR")
    port = free_port()
    proc = procs.spawn("litellm", [str(binary), "--config", str(config), "--host", "127.0.0.1",
                                   "--port", str(port), "--num_workers", "1"], env)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait(
        "LiteLLM's proxy to answer",
        lambda: httpx.get(f"{url}/health/liveliness", timeout=2).status_code == 200,
        timeout=180,
        proc=proc,
    )
    version = subprocess.run([str(LITELLM_VENV / "bin" / "python"), "-c",
                              "import importlib.metadata as m; print(m.version('litellm'))"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    return Peer("litellm", port, master, lambda: tree(proc.pid), version=version)


def _portkey_script() -> Path | None:
    """The gateway's start script (its package's "bin"), installed with npm on the first
    run or when the pinned version changes; None (and a line saying why) when it cannot be."""
    modules = PORTKEY_DIR / "node_modules"
    script = modules / "@portkey-ai" / "gateway" / "build" / "start-server.js"

    def version(name: str) -> str | None:
        try:
            return json.loads((modules / name / "package.json").read_text())["version"]
        except (OSError, ValueError, KeyError):
            return None

    def installed() -> bool:
        return (script.exists() and version("@portkey-ai/gateway") == PORTKEY_VERSION
                and version("@hono/node-server") == HONO_NODE_SERVER)  # fmt: skip

    if installed():
        return script
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        _not_installed("portkey", "node and npm are needed to run Portkey's gateway; not found")
        return None
    spec = f"@portkey-ai/gateway@{PORTKEY_VERSION}"
    log = REPO / "var" / "bench" / "portkey-install.log"
    PORTKEY_DIR.mkdir(parents=True, exist_ok=True)
    manifest = {"private": True, "overrides": {"@hono/node-server": HONO_NODE_SERVER}}
    (PORTKEY_DIR / "package.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"installing {spec} into {PORTKEY_DIR} (log {log})", file=sys.stderr, flush=True)
    with open(log, "wb") as out:
        # Its only install script is patch-package, and the package ships no patches.
        made = subprocess.run([npm, "install", "--prefix", str(PORTKEY_DIR), "--ignore-scripts",
                               "--save-exact", "--no-audit", "--no-fund", spec], stdout=out, stderr=out, timeout=900)  # fmt: skip
    if made.returncode != 0 or not installed():
        _not_installed("portkey", f"{spec} could not be installed; see {log}")
        return None
    return script


def start_portkey(procs: Procs, home: Path, engine_url: str, key: str, model: str) -> Peer | None:
    """Portkey's gateway in front of the engine, once a chat request through it comes back
    with the engine's own answer and a streamed one ends with [DONE]; None when
    BENCH_PORTKEY=0 or it cannot be installed. Raises RuntimeError when it answers wrong."""
    script = _portkey_script() if PORTKEY else None
    if script is None:
        return None
    node = shutil.which("node") or "node"
    port = free_port()
    proc = procs.spawn("portkey", [node, "--import", _LOOPBACK_ONLY, str(script), f"--port={port}",
                                   "--headless"], _peer_env(home))  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait("Portkey's gateway to answer", lambda: httpx.get(url, timeout=2).status_code == 200,
         proc=proc)  # fmt: skip
    headers = (("x-portkey-provider", "openai"), ("x-portkey-custom-host", f"{engine_url}/v1"))
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

    def ask(base: str, body: dict, extra: tuple = ()) -> httpx.Response:
        return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=10,
                          headers={"Authorization": f"Bearer {key}", **dict(extra)})  # fmt: skip

    def said(answer: httpx.Response) -> str | None:
        try:
            return answer.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return None

    # The sim's words are seeded by the prompt: the same words through Portkey as direct
    # show it reached the engine and passed the answer on.
    direct, through = ask(engine_url, chat), ask(url, chat, headers)
    if through.status_code != 200 or said(through) is None or said(through) != said(direct):
        raise RuntimeError(f"Portkey's gateway answered {through.status_code}: {through.text[:300]} "
                           f"where the engine answered {direct.text[:300]}")  # fmt: skip
    streamed = ask(url, {**chat, "stream": True}, headers)
    if streamed.status_code != 200 or "[DONE]" not in streamed.text:
        raise RuntimeError(f"Portkey's gateway streamed {streamed.status_code}: {streamed.text[:300]}")  # fmt: skip
    node_version = subprocess.run(
        [node, "--version"], capture_output=True, text=True
    ).stdout.strip()
    version = f"{PORTKEY_VERSION} (node {node_version}, @hono/node-server {HONO_NODE_SERVER})"
    return Peer("portkey", port, key, lambda: tree(proc.pid), headers, version)


# The Rust routers


@dataclass(frozen=True)
class Router:
    """A Rust router from PyPI: its package, the version pinned, the command in its venv
    that starts it in front of given workers, what its --log-level calls quiet, and the
    environment variable that leaves it out ("0") or pins another version."""

    name: str
    version: str
    command: tuple[str, ...]
    quiet: str
    switch: str


def _router(name: str, version: str, command: tuple[str, ...], quiet: str) -> Router:
    switch = "BENCH_" + name.upper().replace("-", "_")
    return Router(name, os.environ.get(f"{switch}_VERSION", version), command, quiet, switch)


VLLM_ROUTER = _router("vllm-router", "0.1.17", ("vllm-router",), "warning")
SGLANG_ROUTER = _router("sglang-router", "0.3.2", ("smg", "launch"), "warn")
ROUTERS = (VLLM_ROUTER, SGLANG_ROUTER)


def peers_dir() -> Path:
    """Where the routers' venvs are made: BENCH_PEERS_DIR, else ~/.cache/llmgw/peers."""
    default = Path.home() / ".cache" / "llmgw" / "peers"
    return Path(os.environ.get("BENCH_PEERS_DIR") or default)


def router_venv(router: Router) -> Path:
    """The venv of `router` at its pinned version: one per version, made once."""
    return peers_dir() / f"{router.name}-{router.version}"


def _venv_python() -> str:
    """The interpreter the peers' venvs are made with: 3.11, where both routers ship wheels."""
    return shutil.which("python3.11") or sys.executable


def router_binary(router: Router) -> tuple[Path | None, str | None]:
    """The router's command in its venv, installed with pip on the first run; or None and
    the sentence saying why not (left out by its switch, or pip could not install it)."""
    if os.environ.get(router.switch, "1") == "0":
        return None, f"{router.switch}=0 leaves {router.name} out"
    venv = router_venv(router)
    binary = venv / "bin" / router.command[0]
    if binary.exists():
        return binary, None
    spec = f"{router.name}=={router.version}"
    log = venv.parent / f"{venv.name}.install.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"installing {spec} into {venv} (log {log})", file=sys.stderr, flush=True)
    with open(log, "wb") as out:
        failed = _pip_into(venv, spec, out)
    if failed is None and not binary.exists():
        failed = f"it has no {router.command[0]} command"
    if failed is not None:
        shutil.rmtree(venv, ignore_errors=True)  # half a venv would pass for an install
        return None, f"{spec} could not be installed from PyPI ({failed}); see {log}"
    return binary, None


def _pip_into(venv: Path, spec: str, out) -> str | None:
    """None once `spec` is installed into a new venv at `venv`, else the step that failed."""
    steps = (("python -m venv", [_venv_python(), "-m", "venv", str(venv)]),
             ("pip install", [str(venv / "bin" / "pip"), "install", "-q", spec]))  # fmt: skip
    for what, cmd in steps:
        try:
            done = subprocess.run(cmd, stdout=out, stderr=out, timeout=900)
        except subprocess.TimeoutExpired:
            return f"{what} ran past 900 s"
        if done.returncode != 0:
            return f"{what} exited {done.returncode}"
    return None


def router_command(router: Router, binary: Path, port: int, metrics_port: int,
                   workers: list[str], policy: str) -> list[str]:  # fmt: skip
    """The command line that starts `router` on 127.0.0.1:`port` in front of `workers`
    with `policy`, its metrics on loopback too (both default to port 29000 on every
    interface, so two would collide), logging only warnings."""
    return [
        str(binary), *router.command[1:], "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--worker-urls", *workers, "--policy", policy, "--log-level", router.quiet,
    ]  # fmt: skip


def start_router(spawn: Callable[[str, list[str], dict], subprocess.Popen], home: Path,
                 router: Router, workers: list[str], key: str, model: str,
                 policy: str = "cache_aware") -> tuple[Peer | None, str | None]:  # fmt: skip
    """`router` in front of `workers` (engine URLs that all accept `key`), once a chat
    request through it is answered and a streamed one ends with [DONE]: the peer, or None
    and the sentence saying why it is left out. Raises RuntimeError when it answers wrong."""
    binary, why = router_binary(router)
    if binary is None:
        return None, why
    port = free_port()
    cmd = router_command(router, binary, port, free_port(), workers, policy)
    proc = spawn(router.name, cmd, _peer_env(home))
    url = f"http://127.0.0.1:{port}"
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

    def ask(body: dict) -> httpx.Response:
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10,
                          headers={"Authorization": f"Bearer {key}"})  # fmt: skip

    # Each registers its workers (health, model info) before it routes: until then it
    # answers 503 or not at all.
    wait(f"{router.name} to pass a chat on", lambda: ask(chat).status_code == 200, proc=proc)
    answer = ask(chat)
    if '"choices"' not in answer.text:
        raise RuntimeError(f"{router.name} answered {answer.status_code}: {answer.text[:300]}")
    streamed = ask({**chat, "stream": True})
    if streamed.status_code != 200 or "[DONE]" not in streamed.text:
        raise RuntimeError(f"{router.name} streamed {streamed.status_code}: {streamed.text[:300]}")
    return Peer(router.name, port, key, lambda: tree(proc.pid), version=router.version), None
