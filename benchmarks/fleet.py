"""A fleet of real agents against one `llmgw serve`: connections held, heartbeats, restart,
silence and a reconciler pass, at AGENTS nodes of 8 GPUs each.

An embedded `llmgw serve` in a temporary LLMGW_HOME (PostgreSQL, Redis, a Celery worker
and beat when DATABASE_URL and REDIS_URL are set), on 127.0.0.1, with the default timings
(settling after a start shortened, as benchmarks/recovery.py does). AGENTS simulated
agents (benchmarks/fleet_agents.py) in PROCS client processes, asyncio and `websockets`
in each, join with a join token, heartbeat every 5 s (the agent's interval) and answer
the control plane's commands as `llmgw agent` does. In order:

1. connections held and the server's RSS per connection (VmRSS, of its workers together
   with `--workers`, before the agents, after a warm-up few, and after all of them
   registered and heartbeated twice);
2. heartbeat handling with all of them heartbeating for SECONDS: some heartbeats are
   followed by the same seq again, answered with an error once the heartbeat before it
   was handled; from the heartbeat's send to that answer, p50 and p99;
3. a reconciler pass (POST /reconcile) with a model of REPLICAS sim replicas placed;
4. silence: 100 agents stop heartbeating with their connections open, and 100 others drop
   their sockets without a close frame; from the last heartbeat (or the drop) to their
   nodes shown unreachable by GET /nodes/{id}, each polled as fast as the server answers;
5. `llmgw serve` stopped with SIGTERM and started again on the same home and port: until
   every agent was answered `registered` again, and until GET /nodes shows all ready.

BENCH_FLEET_HOLD=15000 only connects that many, holds them SECONDS and reports 1.
Env: BENCH_FLEET_AGENTS (5000), BENCH_FLEET_SECONDS (30), BENCH_FLEET_PROCS,
BENCH_FLEET_JOIN_WINDOW (agents joining at once the first time, 100),
BENCH_FLEET_REPLICAS (8), BENCH_FLEET_ONLY (some of heartbeats,reconcile,silence,restart),
BENCH_FLEET_KEEP=1 keeps the home (logs) and prints where. Everything started is stopped
at the end, on Ctrl-C and on error too.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.fleet_agents import HEARTBEAT_INTERVAL_S, client_main, raise_nofile  # noqa: E402
from benchmarks.heartbeats import _cpu_seconds  # noqa: E402
from benchmarks.recovery import _default_timings  # noqa: E402
from tests.e2e.harness import Cluster  # noqa: E402

HOLD = int(os.environ.get("BENCH_FLEET_HOLD", 0))
AGENTS = HOLD or int(os.environ.get("BENCH_FLEET_AGENTS", 5000))
SECONDS = float(os.environ.get("BENCH_FLEET_SECONDS", 30))
PROCS = int(os.environ.get("BENCH_FLEET_PROCS", 0)) or max(2, min(8, -(-AGENTS // 1500)))
# First joins: at most this many agents connecting and not yet registered at a time.
JOIN_WINDOW = int(os.environ.get("BENCH_FLEET_JOIN_WINDOW", 100))
REPLICAS = int(os.environ.get("BENCH_FLEET_REPLICAS", 8))
KEEP = os.environ.get("BENCH_FLEET_KEEP") == "1"
# Some of the figures only (heartbeats, reconcile, silence, restart; comma-separated).
ONLY = (
    set(os.environ["BENCH_FLEET_ONLY"].split(",")) if os.environ.get("BENCH_FLEET_ONLY") else None
)
WARM = min(20, max(1, AGENTS // 20))
SILENT = min(100, AGENTS // 4)
PROBES_PER_SECOND = 50
MODEL = {
    "name": "fleet",
    "source": "org/fleet",
    "profiles": [{"name": "tp2", "engine": "sim", "gpu_class": "h100-80g", "tp": 2}],
    "scaling": {"min": REPLICAS},
}


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1) if xs else None


def _serving(pid: int) -> list[int]:
    """The processes that serve: `llmgw serve` itself, or with workers (production) each
    worker it started (not the metrics renderer beside them)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    workers = [
        int(c) for c in children
        if b"--worker-fd" in Path(f"/proc/{c}/cmdline").read_bytes()
    ]  # fmt: skip
    return workers or [pid]


def _rss_kb(pid: int) -> int:
    """The serving processes' resident memory together."""
    total = 0
    for each in _serving(pid):
        for line in Path(f"/proc/{each}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _cpu_s(pid: int) -> float:
    """The serving processes' CPU time together."""
    return sum(_cpu_seconds(each) for each in _serving(pid))


def _load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class Clients:
    """The client processes, each a share of the agents, asked things over pipes."""

    def __init__(self, url: str, token: str) -> None:
        ctx = multiprocessing.get_context("fork")  # nothing here runs threads yet
        self.pipes, self.procs, self.shares = [], [], []
        per = -(-AGENTS // PROCS)
        for first in range(0, AGENTS, per):
            count = min(per, AGENTS - first)
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=client_main, args=(theirs, first, count, url, token), daemon=True
            )
            proc.start()
            self.pipes.append(ours)
            self.procs.append(proc)
            self.shares.append(range(first, first + count))

    def ask(self, cmd: str, args: list | None = None, timeout: float = 60) -> list:
        """Send every process `cmd` (with its own entry of `args`); their replies in order."""
        for i, pipe in enumerate(self.pipes):
            pipe.send((cmd, None if args is None else args[i]))
        replies = []
        for pipe in self.pipes:
            if not pipe.poll(timeout):
                raise RuntimeError(f"a client process did not answer {cmd!r} in {timeout:.0f} s")
            replies.append(pipe.recv())
        return replies

    def stats(self) -> dict:
        """Every process's stats, summed (lists joined, events counted together)."""
        total: dict = {"events": Counter(), "latencies": [], "again": []}
        for s in self.ask("stats"):
            for key, value in s.items():
                if key == "events":
                    total["events"].update(value)
                elif key in ("latencies", "again"):
                    total[key] += value
                elif key == "last_since_mark":
                    total[key] = max(total.get(key, 0.0), value)
                else:
                    total[key] = total.get(key, 0) + value
        return total

    def by_share(self, numbers: list[int]) -> list[list[int]]:
        return [[n for n in numbers if n in share] for share in self.shares]

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # one that died already
                pipe.send(("stop", None))
        deadline = time.monotonic() + 15
        for proc in self.procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def _wait(what: str, check, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(every)
    print(json.dumps({"bench": "fleet", "note": f"gave up waiting for {what} after "
                      f"{timeout:.0f} s"}), flush=True)  # fmt: skip
    return None


def _emit(figure: str, scale: dict, **fields) -> None:
    print(json.dumps({"bench": "fleet", "figure": figure, **fields, "scale": scale}), flush=True)


def _connect(clients: Clients, pid: int, scale: dict) -> dict:
    """Figure 1: a few agents first (what the first connection loads is not per
    connection), then all; RSS once they have all heartbeated twice."""
    rss0 = _rss_kb(pid)
    clients.pipes[0].send(("start", (WARM, 0.0)))
    clients.pipes[0].recv()
    _wait("the warm-up agents", lambda: clients.stats()["connected"] >= WARM, 60)
    time.sleep(2 * HEARTBEAT_INTERVAL_S)
    base = _rss_kb(pid)
    began = time.monotonic()
    done = _join(clients, deadline=began + max(120.0, AGENTS / 20))
    joined = time.monotonic() - began
    time.sleep(2 * HEARTBEAT_INTERVAL_S + 1)  # every agent heartbeated, its load kept
    stats = clients.stats()
    rss = _rss_kb(pid)
    held = stats["connected"]
    per_kb = (rss - base) / max(1, held - WARM)
    _emit("connections_held", scale, value=held, asked=AGENTS, aim=15000,
          all_joined=done, join_s=round(joined, 1), join_window=JOIN_WINDOW,
          registrations_per_second=round((held - WARM) / joined, 1),
          events=dict(stats["events"]))  # fmt: skip
    _emit("server_rss_per_connection_kb", scale, value=round(per_kb, 1), aim=40,
          rss_empty_mb=round(rss0 / 1024, 1), rss_warm_mb=round(base / 1024, 1),
          rss_mb=round(rss / 1024, 1), connections=held)  # fmt: skip
    return stats


def _join(clients: Clients, deadline: float) -> bool:
    """Start the agents that have not started, JOIN_WINDOW at a time: the first join is
    the setting up, paced to what the server takes (the restart is the stampede). Whether
    all of them registered by `deadline`."""
    started = [WARM] + [0] * (len(clients.shares) - 1)
    while time.monotonic() < deadline:
        connected = clients.stats()["connected"]
        if connected >= AGENTS:
            return True
        room = JOIN_WINDOW - (sum(started) - connected)
        more = [0] * len(started)
        if room > 0:
            for i, share in enumerate(clients.shares):
                more[i] = min(-(-room // len(started)), len(share) - started[i])
                started[i] += more[i]
        if any(more):
            clients.ask("start", [(m, 0.0) for m in more])
        time.sleep(0.25)
    return False


def _heartbeats(clients: Clients, pid: int, scale: dict) -> None:
    """Figure 2: probes while every agent heartbeats on its interval."""
    fraction = min(1.0, PROBES_PER_SECOND * HEARTBEAT_INTERVAL_S / AGENTS)
    before, began, beats0 = _cpu_s(pid), time.monotonic(), clients.stats()["beats"]
    clients.ask("probe", [fraction] * len(clients.pipes))
    time.sleep(SECONDS)
    clients.ask("probe", [0.0] * len(clients.pipes))
    stats = clients.stats()
    wall, cpu = time.monotonic() - began, _cpu_s(pid) - before
    lat = stats["latencies"]
    _emit("heartbeat_handling_ms", scale, p50=_pct(lat, 0.5), p99=_pct(lat, 0.99),
          max=_pct(lat, 1.0), aim_p99=100, probes=len(lat), probe_timeouts=stats["probe_timeouts"],
          heartbeats_per_second=round((stats["beats"] - beats0) / wall, 1),
          server_cpu_percent=round(100 * cpu / wall, 1), late_client_beats=stats["late_beats"],
          seconds=round(wall, 1), connected=stats["connected"])  # fmt: skip


def _reconcile(cluster: Cluster, api: httpx.Client, clients: Clients, scale: dict) -> None:
    """Figure 5: POST /reconcile with every node reporting and REPLICAS replicas placed."""
    cluster.post("/models", MODEL)
    ready = _wait("the replicas", lambda: _ready_replicas(api) >= REPLICAS, 60, 1.0)
    took, skipped = [], 0
    for _ in range(7):
        began = time.perf_counter()
        r = api.post("/reconcile")
        elapsed = time.perf_counter() - began
        if r.status_code == 200 and r.json().get("ran"):
            took.append(elapsed)
        else:
            skipped += 1  # the embedded loop's own pass held the lease
        time.sleep(0.5)
    _emit("reconcile_pass_ms", scale, median=round(statistics.median(took) * 1000, 1) if took else None,
          max=round(max(took) * 1000, 1) if took else None, runs=len(took), not_run=skipped,
          replicas_ready=bool(ready), replicas=REPLICAS, shards_reported=clients.stats()["shards"],
          how="POST /api/v1/reconcile, wall time at the client")  # fmt: skip


def _ready_replicas(api: httpx.Client) -> int:
    return sum(r["state"] == "ready" for r in _get(api, "/replicas", model="fleet"))


def _all_ready_at(api: httpx.Client, target: int) -> float | None:
    """Now, when GET /nodes shows `target` nodes ready; else None."""
    ready = sum(n["state"] == "ready" for n in _get(api, "/nodes"))
    return time.monotonic() if ready >= target else None


def _get(api: httpx.Client, path: str, **params):
    r = api.get(path, params=params)
    r.raise_for_status()
    return r.json()


def _silence(clients: Clients, api: httpx.Client, scale: dict) -> None:
    """Figure 4: SILENT agents go quiet with their connections open, SILENT others drop
    their sockets; each until GET /nodes shows its node unreachable."""
    pool = sorted(n for share in clients.ask("idle") for n in share if n >= WARM)
    step = max(1, len(pool) // (2 * SILENT))
    picked = pool[::step][: 2 * SILENT]
    modes = {"open": picked[0::2], "abort": picked[1::2]}
    began: dict[str, dict[int, float]] = {}
    for mode, numbers in modes.items():
        began[mode] = {}
        for reply in clients.ask("silence", [(s, mode) for s in clients.by_share(numbers)]):
            for n, (silenced, last_beat) in reply.items():
                # Open: silent since its last heartbeat. Abort: since the socket dropped.
                began[mode][n] = last_beat if mode == "open" else silenced
    # One node at a time, those not yet seen: the whole list is seconds long at thousands.
    pending = {n: f"/nodes/fleet-{n:05d}" for numbers in modes.values() for n in numbers}
    seen: dict[int, float] = {}
    rounds = []
    deadline = time.monotonic() + 3 * 15 + 15  # thrice the default silence, and a pass
    while pending and time.monotonic() < deadline:
        asked = time.monotonic()
        for n, path in list(pending.items()):
            if _get(api, path)["state"] == "unreachable":
                seen[n] = time.monotonic()
                del pending[n]
        rounds.append(time.monotonic() - asked)
        time.sleep(0.2)
    clients.ask("resume", clients.by_share(picked))
    for mode, what in (("open", "heartbeats stopped, connection kept open"),
                       ("abort", "socket dropped, no close frame")):  # fmt: skip
        took = [seen[n] - t for n, t in began[mode].items() if n in seen]
        _emit(f"silence_to_unreachable_s_{mode}", scale, p50=_p_s(took, 0.5), p99=_p_s(took, 0.99),
              max=_p_s(took, 1.0), aim_p99=15, nodes=len(began[mode]), shown=len(took), how=what,
              measured_from="last heartbeat sent" if mode == "open" else "the drop",
              poll_round_s=round(statistics.mean(rounds), 2) if rounds else None)  # fmt: skip


_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))


def _p_s(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2) if xs else None


def _restart(cluster: Cluster, api: httpx.Client, clients: Clients, scale: dict) -> None:
    """Figure 3: SIGTERM, start again on the same home and port, until all registered."""
    _wait("everyone back", lambda: clients.stats()["connected"] >= AGENTS, 60, 1.0)
    before = clients.stats()
    target = before["connected"]  # AGENTS, unless some never joined
    clients.ask("mark")
    term = time.monotonic()
    cluster.stop("serve")
    down = time.monotonic()
    cluster.start_server()
    up = time.monotonic()
    patience = 120.0
    done = _wait("all registered again",
                 lambda: clients.stats()["since_mark"] >= target, patience, 0.5)  # fmt: skip
    stats = clients.stats()
    last = stats["last_since_mark"]
    ready_at = (
        _wait("all ready in the API", lambda: _all_ready_at(api, target), 60, 1.0) if done else None
    )
    events = stats["events"] - before["events"]
    # Where the time went: when the attempts that registered began (the agents' backoff
    # after failing while the server was down), and how long each then took (the server).
    began = [attempt - up for attempt, _ in stats["again"]]
    took = [registered - max(attempt, up) for attempt, registered in stats["again"]]
    _emit("restart_to_all_registered_s", scale, value=round(last - up, 1) if done else None,
          aim=30, gave_up_after_s=None if done else patience,
          from_sigterm=round(last - term, 1) if done else None, stop_s=round(down - term, 1),
          start_s=round(up - down, 1), registered_again=stats["since_mark"], of=target,
          all_ready_in_api_s=round(ready_at - up, 1) if ready_at else None,
          attempt_began_after_up_s={q: _p_s(began, p) for q, p in _QUANTILES},
          attempt_took_s={q: _p_s(took, p) for q, p in _QUANTILES},
          measured_from="the new server answering HTTP", events_since_sigterm=dict(events))  # fmt: skip


# What the server logs of nodes coming and going: how many nodes, over the whole run.
NODE_EVENTS = {
    "unreachable_for_silence": "is unreachable: nothing heard",
    "unreachable_connection_closed": "is unreachable: its connection closed",
    "heard_from_again": "heard from again, ready",
    "ready_again": "is ready again",
    "lost": " is lost",
}


def _log_summary(home: Path, scale: dict) -> None:
    """What the server logged at WARNING and above, by kind (the first 160 characters, with
    numbers taken out), and how often it logged nodes coming and going."""
    kinds: Counter[str] = Counter()
    nodes: Counter[str] = Counter()
    for log in sorted(home.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if re.search(r"\b(WARNING|ERROR|CRITICAL|Traceback)\b", line):
                kinds[f"{log.stem}: " + re.sub(r"\d+", "N", line[24:])[:160]] += 1
            for name, text in NODE_EVENTS.items():
                if text in line:
                    nodes[name] += line.count("fleet-")  # some lines name many nodes
    _emit("server_log", scale, warnings_and_errors=sum(kinds.values()),
          kinds=dict(kinds.most_common(12)), nodes_logged=dict(nodes),
          home=str(home) if KEEP else None)  # fmt: skip


def main() -> int:
    soft, hard = raise_nofile()
    need = AGENTS + 256  # the server's sockets, its database and logs
    production = bool(os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    home = Path(tempfile.mkdtemp(prefix="llmgw-bench-fleet-"))
    cluster = clients = api = None
    # SIGTERM stops everything as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scale = {"agents": AGENTS, "gpus_per_agent": 8, "heartbeat_interval_s": HEARTBEAT_INTERVAL_S,
             "client_processes": PROCS, "machine_cores": os.cpu_count(), "load1_at_start": _load1(),
             "mode": "production" if production else "embedded",
             "database": "postgresql" if production else "sqlite", "timings": "defaults, settle 1 s",
             "nofile": [soft, hard], "client_on_same_machine": True}  # fmt: skip
    if hard < need:
        print(json.dumps({"bench": "fleet", "warning": f"the open-files hard limit ({hard}) is "
                          f"below the {need} the server needs for {AGENTS} agents: connections "
                          "past it are refused"}), flush=True)  # fmt: skip
    try:
        cluster = Cluster(home, production=production)
        _default_timings(cluster)
        cluster.env["LLMGW_JOINS_PER_MINUTE"] = str(max(60, 10 * AGENTS))
        cluster.start_server()
        token = cluster.agent_token
        api = httpx.Client(
            base_url=f"{cluster.url}/api/v1",
            headers={"Authorization": f"Bearer {cluster.admin_token}"},
            timeout=120,
        )
        clients = Clients(f"ws://127.0.0.1:{cluster.port}/ws/agent/", token)
        pid = cluster.procs["serve"].pid
        _connect(clients, pid, scale)
        if HOLD:
            time.sleep(SECONDS)
            _emit("connections_held_after_s", scale, value=clients.stats()["connected"],
                  seconds=SECONDS)  # fmt: skip
        else:
            figures = {"heartbeats": lambda: _heartbeats(clients, pid, scale),
                       "reconcile": lambda: _reconcile(cluster, api, clients, scale),
                       "silence": lambda: _silence(clients, api, scale),
                       "restart": lambda: _restart(cluster, api, clients, scale)}  # fmt: skip
            for name, measure in figures.items():
                if ONLY is None or name in ONLY:
                    measure()
    finally:
        if clients is not None:
            clients.close()
        if api is not None:
            api.close()
        if cluster is not None:
            cluster.close()
        _log_summary(home, scale)
        if not KEEP:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
