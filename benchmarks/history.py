"""The console's history (llmgw/core/history.py) at 5,000 nodes of 8 GPUs.

1. A whole day recorded for 5,000 node groups, the fleet's and 500 models' (what a day of
   `llmgw serve` keeps when no Prometheus is named): the memory it holds (tracemalloc,
   which sees numpy's arrays too) and the rings' own bytes, against the issue's 50 MB;
   how long one step's record takes; how long reading one node's window takes.
2. The fleet's sampler (fleet/console/samples.py) reading a fleet of 5,000 nodes reporting every
   reading, in the benchmark's own database: one step's cost on the serving process.

Prints one JSON line per figure.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import tracemalloc

NODES = int(os.environ.get("BENCH_HISTORY_NODES", 5000))
MODELS = int(os.environ.get("BENCH_HISTORY_MODELS", 500))
RUNS = int(os.environ.get("BENCH_RUNS", 21))
AIM_MB = 50


def _readings(schemas, t: float) -> dict:
    from fleet.console.samples import FLEET, REPLICAS
    from llmgw.core.traffic import MODEL

    node_schema, names = schemas
    util = 50 + 40 * ((t // 60) % 2)
    values = [util] * len(names)
    out = {f"node:n{i:05d}": (node_schema, values) for i in range(NODES)}
    out["fleet"] = (FLEET, [util, 50.0, NODES * 8.0, float(NODES)])
    for m in range(MODELS):
        out[f"model:m{m:04d}"] = (MODEL, [10.0, 400.0, 0.2, 0.0])
        out[f"replicas:m{m:04d}"] = (REPLICAS, [2.0, 2.0])
    return out


def history_day() -> list[dict]:
    from benchmarks.day import DAY, day_times
    from fleet.console.samples import node_schema
    from llmgw.core.history import History

    step = 15.0
    schema = node_schema(tuple(range(8)))
    history = History(step)
    end = (time.time() // DAY) * DAY + DAY / 2
    times = day_times(step, end)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    record_s = []
    for t in times:
        readings = _readings((schema, schema.names), t)
        started = time.perf_counter()
        history.record(t, readings)
        record_s.append(time.perf_counter() - started)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    window_s = []
    for i in range(RUNS):
        started = time.perf_counter()
        history.window(f"node:n{i:05d}", i % 4, end)
        window_s.append(time.perf_counter() - started)
    scale = {"nodes": NODES, "gpus": NODES * 8, "models": MODELS, "step_s": step,
             "records": len(times)}  # fmt: skip
    return [
        {"figure": "history_memory_mb", "value": round(held / 2**20, 1), "aim": AIM_MB,
         "rings_mb": round(history.nbytes() / 2**20, 1), "scale": scale},
        {"figure": "history_record_ms", "median": _ms(record_s, 50), "p95": _ms(record_s, 95),
         "aim": None, "scale": scale},
        {"figure": "history_window_ms", "median": _ms(window_s, 50), "p95": _ms(window_s, 95),
         "aim": None, "scale": scale},
    ]  # fmt: skip


def _ms(values: list[float], q: int) -> float:
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000, 2)


def sampler() -> list[dict]:
    from django.conf import settings

    from benchmarks.pages import fleet_build
    from fleet.console.samples import fleet_sample

    fleet_build(NODES, models=MODELS)
    sample_s = []
    for _ in range(max(5, RUNS // 3)):
        started = time.perf_counter()
        readings = fleet_sample(time.time())
        sample_s.append(time.perf_counter() - started)
    heard = sum(1 for k in readings if k.startswith("node:"))
    assert heard == NODES, f"the sampler heard {heard} of {NODES} nodes"
    scale = {"nodes": NODES, "gpus": NODES * 8, "models": MODELS,
             "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]}  # fmt: skip
    return [
        {"figure": "history_sample_ms", "median": _ms(sample_s, 50), "p95": _ms(sample_s, 95),
         "aim": None, "scale": scale},
    ]  # fmt: skip


def main() -> None:
    from benchmarks.common import django_ready

    django_ready()
    for figure in [*history_day(), *sampler()]:
        print(json.dumps(figure), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
