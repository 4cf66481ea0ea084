"""The facility's pass step at 5,000 nodes in 125 racks: reading the agents' sensors and
stepping every domain's condition (`conditions_observe`), and reading what placement
needs of them (`facility_load`). Each node in a rack, two PDUs, a row and a zone; every
node reports 8 GPUs and an inlet, and 5 racks run hot. Prints one JSON line per figure,
with the machine's load average at the start.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from datetime import timedelta

NODES = int(os.environ.get("BENCH_NODES", 5000))
RACKS = int(os.environ.get("BENCH_RACKS", 125))
RUNS = int(os.environ.get("BENCH_RUNS", 7))


def main() -> None:
    from benchmarks.common import django_ready, gpu_nodes

    django_ready()
    from fleet.facility.observe import conditions_observe
    from fleet.models import DomainCondition, Gpu, Node
    from fleet.selectors.conditions import facility_load
    from llmgw.core import clock

    for table in (Gpu, Node, DomainCondition):
        table.objects.all().delete()
    now = clock.now()
    gpu_nodes(NODES, now)
    per = max(NODES // RACKS, 1)
    rows = []
    for i in range(NODES):
        rack = i // per
        hot = rack < 5
        labels = {
            "llmgw.io/rack": f"r{rack:03d}",
            "llmgw.io/pdu": f"r{rack:03d}-a,r{rack:03d}-b",
            "llmgw.io/row": f"{rack // 5}",
            "llmgw.io/zone": f"z{rack // 25}",
        }
        gpus = [
            {"index": g, "temp_c": 88 if hot else 60, "throttle": ["sw_thermal"] if hot else []}
            for g in range(8)
        ]
        rows.append(
            Node(
                id=f"n{i:05d}",
                labels=labels,
                load={"gpus": gpus, "inlet_temp_c": 35 if hot else 22},
            )
        )
    Node.objects.bulk_update(rows, ["labels", "load"], batch_size=500)

    load = os.getloadavg()[0]

    def timed(step) -> float:
        best = []
        for _ in range(RUNS):
            start = time.perf_counter()
            step()
            best.append(time.perf_counter() - start)
        return round(statistics.median(best) * 1000, 1)

    # Hot racks need their hold time: step past it first.
    for k in range(0, 200, 20):
        at = now + timedelta(seconds=k)
        Node.objects.update(last_seen=at)
        conditions_observe(now=at, force=True)
    at = now + timedelta(seconds=200)
    observe_ms = timed(lambda: conditions_observe(now=at, force=True))
    fac = facility_load(at)
    load_ms = timed(lambda: facility_load(at))
    domains = DomainCondition.objects.count()
    hot = DomainCondition.objects.filter(condition="hot").count()
    for name, value in (
        ("conditions_observe_ms", observe_ms),
        ("facility_load_ms", load_ms),
        ("domains", domains),
        ("hot_domains", hot),
        ("standing_nodes", len(fac.of({n.id: n.labels for n in Node.objects.all()})) if fac else 0),
    ):
        print(json.dumps({"bench": "conditions", "figure": name, "value": value, "nodes": NODES,
                          "racks": RACKS, "load1": round(load, 2)}))  # fmt: skip


if __name__ == "__main__":
    main()
