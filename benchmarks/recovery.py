"""How fast the cluster heals, with the default timings (a pass every 5 s, unreachable after
15 s): an engine killed with SIGKILL until its replacement is ready, and, with PostgreSQL
and Redis (DATABASE_URL and REDIS_URL set), a Celery worker killed with SIGKILL mid-life
until the next pass runs on the worker that is left.

Real processes on 127.0.0.1 in a temporary LLMGW_HOME: `llmgw serve`, one `llmgw agent`
with a simulated CPU node, a sim engine; in production mode Celery beat and two workers.
RUNS of each (BENCH_RECOVERY_RUNS, default 3), the median printed with every run.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.harness import Cluster, listener_pid, wait_for  # noqa: E402

RUNS = int(os.environ.get("BENCH_RECOVERY_RUNS", 3))
FAST = (
    "LLMGW_RECONCILE_INTERVAL_SECONDS", "LLMGW_SETTLE_SECONDS", "LLMGW_UNREACHABLE_SECONDS",
    "LLMGW_LOST_SECONDS", "LLMGW_DRAIN_GRACE_SECONDS", "LLMGW_MIN_LIFETIME_SECONDS",
    "LLMGW_PREEMPT_GRACE_SECONDS",
)  # fmt: skip
MODEL = {
    "name": "heal",
    "source": "org/heal",
    "profiles": [{"name": "cpu", "engine": "sim", "cpu_cores": 1, "min_memory_gb": 1}],
}


def emit(name: str, values: list[float], **scale) -> None:
    print(
        json.dumps(
            {
                "bench": "recovery",
                "figure": name,
                "value": round(statistics.median(values), 2),
                "unit": "s",
                "runs": [round(v, 2) for v in values],
                "aim": 15,
                "scale": {"timings": "defaults", "cpus": os.cpu_count(), **scale},
            }
        ),
        flush=True,
    )


def _default_timings(cluster: Cluster) -> None:
    for name in FAST:
        cluster.env.pop(name, None)
    # Settling after the start is not what is timed here.
    cluster.env["LLMGW_SETTLE_SECONDS"] = "1"


def engine_crash(production: bool) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-heal-") as tmp:
        cluster = Cluster(Path(tmp), production=production)
        try:
            _default_timings(cluster)
            cluster.start_server()
            cluster.start_agent(
                "cpu-a", "--memory-gb", "8", "--cpus", "4", port_range="37000-37099"
            )
            cluster.post("/models", MODEL)
            took = []
            for _ in range(RUNS):
                [ready] = wait_for("a ready replica", lambda: cluster.ready_replicas("heal") or None,
                                   timeout=120)  # fmt: skip
                port = int(ready["endpoint"].rsplit(":", 1)[1])
                began = time.monotonic()
                os.kill(listener_pid(port), signal.SIGKILL)
                wait_for(
                    "the replacement",
                    lambda r=ready: (
                        [x for x in cluster.ready_replicas("heal") if x["id"] != r["id"]] or None
                    ),
                    timeout=120,
                )
                took.append(time.monotonic() - began)
            return took
        finally:
            cluster.close()


def worker_death() -> list[float]:
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-heal-") as tmp:
        cluster = Cluster(Path(tmp), production=True)
        try:
            _default_timings(cluster)
            cluster.start_server()
            worker = [sys.executable, "-m", "celery", "-A", "llmgw", "worker", "--pool", "solo"]
            cluster._spawn("worker-2", [*worker, "--loglevel", "INFO", "-n", "second@%h"])
            took = []
            for _ in range(RUNS):
                last = _last_pass(cluster)
                wait_for("a pass", lambda last=last: _last_pass(cluster) != last, timeout=60)
                # Kill whichever worker ran it, just after it began: its lock dies with it.
                time.sleep(0.2)
                victim = "worker" if "worker" in cluster.procs else "worker-2"
                os.killpg(cluster.procs.pop(victim).pid, signal.SIGKILL)
                began, seen = time.monotonic(), _last_pass(cluster)
                wait_for("the next pass", lambda s=seen: _last_pass(cluster) != s, timeout=120)
                took.append(time.monotonic() - began)
                name = f"worker-{len(took) + 2}"
                cluster._spawn(name, [*worker, "--loglevel", "INFO", "-n", f"{name}@%h"])
            return took
        finally:
            cluster.close()


def _last_pass(cluster: Cluster) -> str | None:
    return cluster.get("/reconciler").get("last_pass_at")


def main() -> int:
    emit("engine_crash_to_replacement_ready_s", engine_crash(production=False), mode="embedded")
    if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
        emit("worker_killed_to_next_pass_s", worker_death(), mode="production")
    else:
        print(json.dumps({"bench": "recovery", "skipped": "worker death: no DATABASE_URL and "
                          "REDIS_URL"}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
