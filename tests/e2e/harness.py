"""A real cluster for end-to-end tests: `llmgw serve`, `llmgw agent`s and sim engines as processes.

Embedded (SQLite, reconciler in the server) always; production (PostgreSQL,
Redis, a Celery worker and beat) when DATABASE_URL and REDIS_URL are set.
Every wait is bounded, and everything started is stopped at the end.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
PATIENCE_S = 60.0
SECRET = "e2e-secret-" + "x" * 40


# A model of one CPU core on the sim engine, answering at once: what most cluster tests run.
SMALL = {
    "name": "small",
    "source": "org/small-model",
    "profiles": [
        {
            "name": "cpu",
            "engine": "sim",
            "cpu_cores": 1,
            "min_memory_gb": 1,
            "args": ["--ttft-ms", "2", "--tokens-per-sec", "2000"],
            "startup_timeout": 60,
        }
    ],
}

# A model of one GPU on the sim engine, one replica kept: what the clients' tests talk to.
TALK = {
    "name": "talk",
    "source": "org/talk",
    "scaling": {"min": 1},
    "profiles": [
        {
            "name": "one",
            "engine": "sim",
            "gpu_class": "h100-80g",
            "tp": 1,
            "args": ["--ttft-ms", "5", "--tokens-per-sec", "500"],
            "startup_timeout": 60,
        }
    ],
}

# Tests of several servers or workers: they share PostgreSQL and Redis.
needs_production = pytest.mark.skipif(
    not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
    reason="servers share PostgreSQL and Redis; DATABASE_URL and REDIS_URL are not set",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    what: str, check: Callable[[], object], timeout: float = PATIENCE_S, every: float = 0.2
):
    """Poll until `check()` is truthy and return it; fail the test naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (httpx.HTTPError, KeyError, IndexError) as exc:
            last_error = exc
        time.sleep(every)
    raise AssertionError(
        f"timed out waiting for {what}" + (f" (last error: {last_error})" if last_error else "")
    )


def listener_pid(port: int) -> int | None:
    """The pid of the process listening on a TCP port here, read from /proc."""
    inodes = {i for lp, _, state, i in _tcp_rows() if state == "0A" and lp == port}
    return next((pid for pid in _pids() if _socket_inodes(pid) & inodes), None)


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


class Cluster:
    """Processes of one test cluster and an admin client for its REST API."""

    def __init__(self, home: Path, *, production: bool, mirror_sources: Path | None = None):
        self.home = home
        self.production = production
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        self.env.update(
            LLMGW_HOME=str(home),
            LLMGW_SECRET_KEY=SECRET,
            LLMGW_RECONCILE_INTERVAL_SECONDS="0.5",
            LLMGW_SETTLE_SECONDS="1",
            LLMGW_UNREACHABLE_SECONDS="2",
            LLMGW_LOST_SECONDS="5",
            LLMGW_DRAIN_GRACE_SECONDS="5",
            LLMGW_MIN_LIFETIME_SECONDS="1",
            LLMGW_PREEMPT_GRACE_SECONDS="1",
            PYTHONUNBUFFERED="1",
        )
        if mirror_sources is not None:
            # The folder the mirror may add weights from by path.
            self.env["LLMGW_MIRROR_SOURCES"] = str(mirror_sources)
        self.database = None
        if production:
            self.database = f"llmgw_e2e_{secrets.token_hex(4)}"
            base = urlparse(os.environ["DATABASE_URL"])
            self.env["DATABASE_URL"] = base._replace(path=f"/{self.database}").geturl()
            self.env["REDIS_URL"] = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/7"
            self.env["LLMGW_RECONCILE_INTERVAL_SECONDS"] = "1"
            self._admin_sql(f'CREATE DATABASE "{self.database}"')
            import redis

            redis.Redis.from_url(self.env["REDIS_URL"]).flushdb()
        self._run("migrate")
        self.admin_token = self._run("createtoken", "e2e").strip().splitlines()[-1]
        self.agent_token = (
            self._run("createtoken", "--agent", "e2e-agents").strip().splitlines()[-1]
        )
        self.client = httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=10,
        )

    def _admin_sql(self, sql: str) -> None:
        import psycopg

        url = urlparse(os.environ["DATABASE_URL"])._replace(path="/postgres").geturl()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql)

    def _run(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "llmgw", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"llmgw {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - the child writes it for its life
        proc = subprocess.Popen(
            cmd,
            env=self.env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.home / f"{name}.log").read_text(errors="replace")

    def start_server(self, *flags: str) -> None:
        proc = self._spawn(
            "serve", [sys.executable, "-m", "llmgw", "serve", "--port", str(self.port), *flags]
        )
        wait_for(
            "llmgw serve to answer",
            lambda: proc.poll() is None and httpx.get(f"{self.url}/api/v1/openapi.json"),
        )
        if self.production and "worker" not in self.procs:
            celery = [sys.executable, "-m", "celery", "-A", "llmgw"]
            worker = [*celery, "worker", "--pool", "solo", "--loglevel", "INFO"]
            self._spawn("worker", [*worker, "-n", "reconciler@%h"])
            # Downloads have a worker of their own (queue mirror), as in production.
            self._spawn("mirror", [*worker, "-Q", "mirror", "-n", "mirror@%h"])
            self._spawn(
                "beat",
                [
                    *celery,
                    "beat",
                    "--loglevel",
                    "INFO",
                    "--schedule",
                    str(self.home / "beat-schedule"),
                ],
            )

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def start_agent(self, node_id: str, *flags: str, port_range: str) -> None:
        self._spawn(
            f"agent-{node_id}",
            [
                sys.executable, "-m", "llmgw", "agent", "--server", self.url, "--token", self.agent_token,
                "--node-id", node_id, "--state-dir", str(self.home / node_id), "--heartbeat-interval", "0.5",
                "--port-range", port_range, *flags,
            ],
        )  # fmt: skip

    def ctl(self, *argv: str) -> subprocess.CompletedProcess:
        """`llmgw ctl ARGV` against this cluster as its admin, as an operator runs it."""
        return subprocess.run(
            [sys.executable, "-m", "llmgw", "ctl", "--server", self.url, *argv],
            env={**self.env, "LLMGW_TOKEN": self.admin_token},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def get(self, path: str, **params):
        r = self.client.get(path, params=params)
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: dict | None = None):
        r = self.client.post(path, json=body)
        assert r.status_code < 300, f"POST {path}: {r.status_code} {r.text}"
        return r.json()

    def ready_replicas(self, model: str) -> list[dict]:
        return [r for r in self.get("/replicas", model=model) if r["state"] == "ready"]

    def close(self) -> None:
        for name in [n for n in self.procs if n.startswith("agent-")] + list(self.procs):
            if name in self.procs:
                self.stop(name)
        self.client.close()
        if self.database:
            self._admin_sql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


def gateway_project(cluster: Cluster, name: str) -> int:
    """A project in an organization and team of its own, made over REST; its ID."""
    org = cluster.post("/orgs", {"name": name})
    team = cluster.post("/teams", {"org": org["id"], "name": "team"})
    return cluster.post("/projects", {"team": team["id"], "name": "project"})["id"]


def gateway_key(cluster: Cluster, project: int, name: str, **extra: object) -> dict:
    """A gateway API key for a project (`extra`: models, limits), returned once the gateway
    knows it: POST /keys's answer, with the secret."""
    made = cluster.post("/keys", {"project": project, "name": name, **extra})
    headers = {"Authorization": f"Bearer {made['secret']}"}
    wait_for(
        f"the gateway to know key {name}",
        lambda: httpx.get(f"{cluster.url}/v1/models", headers=headers).status_code == 200,
        timeout=20,
    )
    return made


def engine_gauge(endpoint: str, name: str) -> float:
    """A sim engine's figure read from its /metrics: `requests_running` and
    `requests_waiting` under vLLM's names (`vllm:num_requests_running`), as it publishes
    them, others (requests_total) as its own `llmgw_sim:<name>`."""
    series = f"vllm:num_{name}" if name in ("requests_running", "requests_waiting") else None
    series = series or f"llmgw_sim:{name}"
    text = httpx.get(f"{endpoint}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(f"{series}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"{series} is not in {endpoint}/metrics")


def _tcp_rows() -> list[tuple[int, int, str, str]]:
    """(local port, remote port, state, inode) of every TCP socket here, from /proc."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, remote = (int(a.rsplit(":", 1)[1], 16) for a in (f[1], f[2]))
            rows.append((local, remote, f[3], f[9]))
    return rows


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def serving_pid(server_port: int, client_port: int, pids: list[int]) -> int | None:
    """Which of `pids` holds the server's end of the connection from `client_port`."""
    inodes = {i for lp, rp, _, i in _tcp_rows() if lp == server_port and rp == client_port}
    return next((pid for pid in pids if _socket_inodes(pid) & inodes), None)


def client_ports(pid: int, server_port: int) -> list[int]:
    """The local ports of `pid`'s connections to `server_port`."""
    mine = _socket_inodes(pid)
    return [
        lp for lp, rp, state, i in _tcp_rows() if rp == server_port and state == "01" and i in mine
    ]


_STAFF_SESSION = """
import django
django.setup()
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
import sys
user, _ = get_user_model().objects.get_or_create(username=sys.argv[1], defaults={"is_staff": True, "is_superuser": True})
session = SessionStore()
session["_auth_user_id"] = str(user.pk)
session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
session["_auth_user_hash"] = user.get_session_auth_hash()
session.create()
print(session.session_key)
"""


def staff_cookie(cluster: Cluster, name: str = "ops") -> str:
    """A logged-in staff superuser's session key, made in the cluster's own database."""
    done = subprocess.run(
        [sys.executable, "-c", _STAFF_SESSION, name],
        env={**cluster.env, "DJANGO_SETTINGS_MODULE": "llmgw.settings"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]
