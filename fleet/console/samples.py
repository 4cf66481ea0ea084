"""The fleet's readings for the console's history (llmgw/core/history.py), and the charts
the cluster and node pages draw of them.

Each step, in a few queries whatever the size of the fleet: every node heard from within
LLMGW_UNREACHABLE_SECONDS gives its CPU and memory use and, per registered GPU, its
utilisation, memory use, temperature and power, each only when its agent measured it; a
node not heard from gives nothing (a gap, not a zero). The fleet gives its GPUs' mean
utilisation over those that report one, the share of its GPUs held by replicas and its
ready nodes; each model its replicas ready and holding room.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Count, Q

from catalog.selectors import catalog_load
from llmgw.core.charts import Chart, Line
from llmgw.core.history import Reading, Schema
from llmgw.core.promql import quoted

from ..domain.types import HOLDING
from ..models import Node, Replica, Shard
from ..selectors.rows import aware, raw_json, raw_values
from ..selectors.state import node_registrations

# A percentage to half a point, degrees to one, watts to five.
_PERCENT, _DEGREES, _WATTS = 2.0, 1.0, 0.2
GPU_SERIES = (("util", _PERCENT), ("memory", _PERCENT), ("temp", _DEGREES), ("power", _WATTS))
FLEET = Schema(("gpu_util", "gpus_held", "gpus", "nodes_ready"))
REPLICAS = Schema(("ready", "holding"))
# The sample runs beside the serving loop, in Python throughout: while it runs, the loop
# waits up to the switch interval (5 ms) for the interpreter after every socket call. It
# stalled heartbeats 50–65 ms every step at 5,000 nodes (docs/benchmarks.md), so it
# lets the interpreter go for a moment after each slice of nodes.
_SLICE = 100
_PAUSE_S = 0.002
_schemas: dict[tuple[int, ...], Schema] = {}


def node_schema(indices: tuple[int, ...]) -> Schema:
    """A node's series: its CPU and memory use, then four per GPU (one object per shape)."""
    schema = _schemas.get(indices)
    if schema is None:
        names = ["cpu", "memory"]
        scales = [_PERCENT, _PERCENT]
        for i in indices:
            for name, scale in GPU_SERIES:
                names.append(f"gpu{i}.{name}")
                scales.append(scale)
        schema = _schemas[indices] = Schema(tuple(names), tuple(scales))
    return schema


def _percent(part, whole) -> float | None:
    if part is None or not whole:
        return None
    return 100.0 * part / whole


def node_reading(load: dict, memory_total_mb: int | None, gpus: list[tuple[int, int | None]]):
    """A node's reading from its load as stored and its GPUs (index, memory MB)."""
    values: list[float | None] = [
        load.get("cpu_percent"),
        _percent(load.get("memory_used_bytes"), (memory_total_mb or 0) * 1048576),
    ]
    by_index = {g.get("index"): g for g in load.get("gpus") or () if isinstance(g, dict)}
    utils = []
    for index, memory_mb in gpus:
        g = by_index.get(index, {})
        util = g.get("utilization")
        if util is not None:
            utils.append(util)
        values += [
            util,
            _percent(g.get("memory_used_mb"), memory_mb),
            g.get("temp_c"),
            g.get("power_w"),
        ]
    return values, utils


def fleet_sample(now: float) -> dict[str, Reading]:
    """Every heard node's reading, the fleet's and each model's replicas."""
    heard_since = datetime.fromtimestamp(now, UTC) - timedelta(
        seconds=settings.LLMGW.timings.unreachable
    )
    nodes = raw_values(
        Node.objects.order_by(), ("id", "state", "last_seen", "load", "memory_total_mb", "spec_at")
    )
    # What each node registered, as the reconciler's views keep it: read again only for
    # nodes that registered since.
    registered = node_registrations({row[0]: aware(row[5]) for row in nodes})
    readings: dict[str, Reading] = {}
    utils: list[float] = []
    total = ready = 0
    for i, (node_id, state, last_seen, load, memory_total_mb, _) in enumerate(nodes):
        if i % _SLICE == _SLICE - 1:
            time.sleep(_PAUSE_S)
        mine = [(g.index, g.memory_mb) for g in registered[node_id]["gpus"]]
        total += len(mine)
        if state != Node.READY:
            continue
        ready += 1
        seen = aware(last_seen)
        if seen is None or seen < heard_since:
            continue
        values, node_utils = node_reading(raw_json(load) or {}, memory_total_mb, mine)
        utils += node_utils
        readings[f"node:{node_id}"] = (node_schema(tuple(i for i, _ in mine)), values)
    held = 0
    for (indices,) in raw_values(
        Shard.objects.filter(replica__state__in=HOLDING).order_by(), ("gpu_indices",)
    ):
        held += len(raw_json(indices) or ())
    readings["fleet"] = (
        FLEET,
        [
            sum(utils) / len(utils) if utils else None,
            100.0 * held / total if total else None,
            float(total),
            float(ready),
        ],
    )
    # Every model of the catalog: none ready is a count of none.
    counts = {name: [0.0, 0.0] for name in catalog_load()}
    for row in (
        Replica.objects.order_by()
        .values("model")
        .annotate(
            ready=Count("id", filter=Q(state="ready")),
            holding=Count("id", filter=Q(state__in=HOLDING)),
        )
    ):
        counts[row["model"]] = [float(row["ready"]), float(row["holding"])]
    for model, values in counts.items():
        readings[f"replicas:{model}"] = (REPLICAS, values)
    return readings


def cluster_charts() -> tuple[Chart, ...]:
    return (
        Chart(
            "gpu-use",
            "GPU use",
            "%",
            "fleet",
            (
                Line("utilisation (mean)", "gpu_util", "avg(llmgw_gpu_utilization_percent)"),
                Line(
                    "held by replicas",
                    "gpus_held",
                    "100 * (1 - sum(llmgw_node_gpus_free * llmgw_node_up) / sum(llmgw_node_gpus))",
                ),
            ),
            top=100.0,
        ),
    )


def node_charts(
    node_id: str, indices: tuple[int, ...], *, memory: bool = True
) -> tuple[Chart, ...]:
    """The node page's charts: its CPU, and its memory when it reports its use (`memory`),
    and one line per GPU of `indices` (none: no GPU charts)."""
    node = f"node={quoted(node_id)}"

    def per_gpu(name: str) -> tuple[Line, ...]:
        return tuple(Line(f"GPU {i}", f"gpu{i}.{name}", match=(("gpu", str(i)),)) for i in indices)

    host = [Line("CPU", "cpu", f"llmgw_node_cpu_percent{{{node}}}")]
    if memory:
        host.append(
            Line(
                "memory",
                "memory",
                f"100 * llmgw_node_memory_used_bytes{{{node}}} / llmgw_node_memory_total_bytes{{{node}}}",
            )
        )
    charts = [
        Chart(
            "host",
            "CPU and memory" if memory else "CPU",
            "%",
            f"node:{node_id}",
            tuple(host),
            top=100.0,
            note="" if memory else "its memory use is not reported",
        )
    ]
    if indices:
        charts += [
            Chart(
                "gpu-util",
                "GPU utilisation",
                "%",
                f"node:{node_id}",
                per_gpu("util"),
                f"llmgw_gpu_utilization_percent{{{node}}}",
                top=100.0,
            ),
            Chart(
                "gpu-memory",
                "GPU memory used",
                "%",
                f"node:{node_id}",
                per_gpu("memory"),
                f"100 * llmgw_gpu_memory_used_bytes{{{node}}} "
                f"/ llmgw_gpu_memory_total_bytes{{{node}}}",
                top=100.0,
            ),
            Chart(
                "gpu-temp",
                "GPU temperature",
                "°C",
                f"node:{node_id}",
                per_gpu("temp"),
                f"llmgw_gpu_temperature_celsius{{{node}}}",
            ),
            Chart(
                "gpu-power",
                "GPU power",
                "W",
                f"node:{node_id}",
                per_gpu("power"),
                f"llmgw_gpu_power_watts{{{node}}}",
            ),
        ]
    return tuple(charts)
