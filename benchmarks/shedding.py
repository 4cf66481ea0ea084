"""Shedding's cost in a pure pass (`decide`) at 5,000 nodes in 125 racks with 10,000
one-GPU replicas running (2,500 models of four) and 5 racks hot for an hour: the pass
without shedding, with shedding due in all 5 racks (a move each), and with shedding on but
every rack within its interval (nothing due, the usual pass). Median of BENCH_RUNS. Prints
one JSON line per figure, with the machine's load average at the start.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import replace

NODES = int(os.environ.get("BENCH_NODES", 5000))
RUNS = int(os.environ.get("BENCH_RUNS", 5))


def main() -> None:
    from benchmarks.common import django_ready

    django_ready()
    from fleet.domain.conditions import Facility, State
    from fleet.domain.power import RACK_LABEL
    from llmgw.core.config import Shedding
    from tests.domain.builders import NOW, gpu_node, model, replica, run, snapshot

    nodes = [gpu_node(f"n{i}", gpus=8, labels={RACK_LABEL: f"r{i // 40}"}) for i in range(NODES)]
    models = [model(f"m{j}", min=4) for j in range(NODES // 2)]
    reps = [
        replica(f"m{k // 4}-{k % 4}", f"m{k // 4}", on=f"n{k % NODES}", gpus=(k // NODES,))
        for k in range(len(models) * 4)
    ]
    snap = snapshot(nodes, models, reps)
    at = NOW.timestamp()
    hot = State("hot", at - 3600, "inlet 34 °C", (at - 3600, at - 3600), (None, None))
    states = {("rack", f"r{i}"): hot for i in range(5)}
    on = Shedding(True, delay=600, interval=300)
    print(json.dumps({"load_average": os.getloadavg()[0], "nodes": NODES, "replicas": len(reps)}))
    for name, fac in (
        ("decide, 5 racks hot, shedding off", Facility(states, (), True, at)),
        ("decide, 5 racks due to shed (5 moves)", Facility(states, (), True, at, on)),
        (
            "decide, 5 racks hot within their interval",
            Facility(states, (), True, at, on, {d: at - 10 for d in states}),
        ),
    ):
        s, took = replace(snap, facility=fac), []
        for _ in range(RUNS):
            start = time.perf_counter()
            plan = run(s)
            took.append(time.perf_counter() - start)
        print(json.dumps({"figure": name, "median_s": round(statistics.median(took), 3),
                          "retires": len(plan.retires)}))  # fmt: skip


if __name__ == "__main__":
    main()
