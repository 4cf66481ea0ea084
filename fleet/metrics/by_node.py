"""The nodes' and GPUs' series of a scrape, and what replicas hold of them.

Each node's GPUs are cached as last registered, keyed by the node's spec_at: it moves
whenever the node registers, the only time its GPUs change; and with them its fabric's
series, keyed also by its fabric_at, which moves whenever its agent says the fabric
changed. A fresh node's load gives
its readings and its GPUs', each only when measured; one not heard from for as long
as it takes to call it unreachable publishes none.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

from tenancy.quota import Amount

from ..domain.fabric import gpu_problem
from ..domain.gpuclass import CLASS_LABEL
from ..domain.types import HOLDING
from ..models import Gpu, Node, Shard
from ..selectors.rows import aware, raw_json, raw_values
from .fabric import Line, fabric_lines
from .series import BY_NAME, GPU_METRICS, NODE_METRICS, YIELD_EVERY, Scrape, line_prefix, yield_now

log = logging.getLogger("llmgw.metrics")
_MiB = 1048576.0


class _GpuRow(NamedTuple):
    index: int
    memory_mb: int | None
    healthy: bool
    gpu_class: str
    prefixes: tuple[str, ...]  # one per GPU_METRICS
    # Kept out of service (fleet/domain/fabric.py gpu_problem, or cordoned): not free.
    kept: bool = False


# Each node's line prefixes and GPUs as last registered, and the GPU indices of shards by
# their raw text; derived from what the database says, so every process writes the same.
_node_prefixes: dict[str, tuple[str, ...]] = {}
_gpus: dict[str, tuple[object, tuple[_GpuRow, ...]]] = {}
_indices: dict[str, tuple[int, ...]] = {}
# Each node's fabric series as last reported (fleet/metrics/fabric.py), kept with its GPUs.
_fabric: dict[str, tuple[Line, ...]] = {}
_STALE_ALL = 500  # more registrations than this since the last scrape: read every GPU at once


def node_caches_clear() -> None:
    """Forget cached node label text and GPUs; the caller holds the scrape's lock."""
    for cache in (_node_prefixes, _gpus, _indices, _fabric):
        cache.clear()


def node_caches_trim() -> None:
    """Forget the shards' parsed GPU indices once there are too many kinds of them."""
    if len(_indices) > 10_000:
        _indices.clear()


def _gpu_rows(stale: dict[str, object]) -> None:
    """Read the GPUs (and class override) of nodes that registered since they were cached."""
    rows = Gpu.objects.order_by()
    if len(stale) <= _STALE_ALL:
        rows = rows.filter(node_id__in=list(stale))
    found: dict[str, list[_GpuRow]] = defaultdict(list)
    reports: dict[str, list[tuple]] = defaultdict(list)
    descs = [BY_NAME[n] for n in GPU_METRICS]
    fields = ("node_id", "index", "gpu_class", "memory_mb", "healthy", "node__labels", "fabric")
    for *row, cordoned in rows.values_list(*fields, "cordoned"):
        node_id, index, gpu_class, memory_mb, healthy, labels, fabric = row
        if node_id not in stale:
            continue
        override = labels.get(CLASS_LABEL) if isinstance(labels, dict) else None
        cls = str(override or gpu_class)
        prefixes = tuple(line_prefix(d, (cls, index, node_id)) for d in descs)
        kept = bool(cordoned) or _problem(node_id, index, fabric)
        found[node_id].append(_GpuRow(index, memory_mb, bool(healthy), cls, prefixes, kept))
        if fabric is not None:
            reports[node_id].append((index, cls, fabric))
    nodes = Node.objects.order_by().exclude(imex__isnull=True, ib_ports__isnull=True)
    if len(stale) <= _STALE_ALL:
        nodes = nodes.filter(pk__in=list(stale))
    ports = {n: (imex, ib) for n, imex, ib in nodes.values_list("id", "imex", "ib_ports")}
    for node_id, spec_at in stale.items():
        _gpus[node_id] = (spec_at, tuple(sorted(found.get(node_id, ()))))
        imex, ib = ports.get(node_id, (None, None))
        _fabric[node_id] = fabric_lines(node_id, sorted(reports.get(node_id, ())), imex, ib)


def _problem(node_id: str, index: int, fabric: object) -> bool:
    """Whether a GPU's fabric report keeps it out of service, as placement reads it."""
    if not isinstance(fabric, dict):
        return False
    return gpu_problem({**fabric, "index": index}, node_id=node_id) is not None


class Held(NamedTuple):
    """What replicas hold now: GPU indices per node, per model what its shards hold, and
    per node how many replicas over several nodes have a shard on it."""

    gpus: dict[str, set[int]]
    models: dict[str, Amount]
    spanning: dict[str, int]
    # Per shard (node, GPU indices, cores, model, profile, replica), for the power budgets.
    shards: list[tuple]


def held_read() -> Held:
    """One read of every shard of a replica holding room (fleet.domain.types.HOLDING).

    A model's amount is summed as a replica's is (ReplicaView.amount: per shard its GPUs,
    reserved cores and memory), so the quotas' holds match `GET /quotas`.
    """
    gpus: dict[str, set[int]] = defaultdict(set)
    per_model: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    shards = Shard.objects.filter(replica__state__in=HOLDING).order_by()
    rows = raw_values(
        shards,
        (
            "node_id",
            "gpu_indices",
            "cpu_cores",
            "memory_gb",
            "replica__model",
            "replica_id",
            "replica__profile",
        ),
    )
    nodes_of: dict[str, set[str]] = defaultdict(set)
    shards = []
    for i, (node_id, indices, cores, memory_gb, model, replica_id, profile) in enumerate(rows):
        if i % (YIELD_EVERY * 128) == 0:
            yield_now()
        if isinstance(indices, str):
            parsed = _indices.get(indices)
            if parsed is None:
                parsed = _indices[indices] = tuple(json.loads(indices) or ())
            indices = parsed
        nodes_of[replica_id].add(node_id)
        shards.append((node_id, indices, cores, model, profile, replica_id))
        held = per_model[model]
        if indices:
            gpus[node_id].update(indices)
            held[0] += len(indices)
        held[1] += cores or 0
        held[2] += memory_gb or 0.0
    spanning: dict[str, int] = defaultdict(int)
    for nodes in nodes_of.values():
        if len(nodes) > 1:
            for node_id in nodes:
                spanning[node_id] += 1
    models = {m: Amount(g, c, mem) for m, (g, c, mem) in per_model.items()}
    return Held(gpus, models, spanning, shards)


def _prefixes_of(node_id: str) -> tuple[str, ...]:
    hit = _node_prefixes.get(node_id)
    if hit is None:
        hit = _node_prefixes[node_id] = tuple(
            line_prefix(BY_NAME[n], (node_id,)) for n in NODE_METRICS
        )
    return hit


def node_series(
    scrape: Scrape,
    now: datetime,
    fresh_s: float,
    allocated: dict[str, set[int]],
    spanning: Mapping[str, int],
) -> None:
    """Add each node's and GPU's series to `scrape`: what it registered and, heard from
    within `fresh_s` seconds, what its load measured. `allocated`: GPU indices held per node;
    `spanning`: replicas over several nodes with a shard on each (Held.spanning)."""
    rows = raw_values(
        Node.objects.order_by("id"),
        (
            "id",
            "state",
            "last_seen",
            "spec_at",
            "cpu_count",
            "memory_total_mb",
            "load",
            "fabric_at",
        ),
    )
    # Keyed by both: a changed fabric moves fabric_at alone when placement reads none of it.
    stale = {
        r[0]: (r[3], r[7]) for r in rows if r[0] not in _gpus or _gpus[r[0]][0] != (r[3], r[7])
    }
    if stale:
        _gpu_rows(stale)
    if len(_gpus) > len(rows) or len(_node_prefixes) > len(rows):
        ids = {r[0] for r in rows}
        for cache in (_gpus, _node_prefixes, _fabric):
            for gone in cache.keys() - ids:
                del cache[gone]
    (
        (up_p, up_v),
        (gpus_p, gpus_v),
        (free_p, free_v),
        (cpus_p, cpus_v),
        (mem_p, mem_v),
        (seen_p, seen_v),
    ) = (scrape.lists(n) for n in NODE_METRICS[:6])
    span_p, span_v = scrape.lists("llmgw_node_multinode_replicas")
    (gmem_p, gmem_v), (health_p, health_v) = (scrape.lists(n) for n in GPU_METRICS[:2])
    readings = _Readings(scrape)
    none: set[int] = set()
    for i, (node_id, state, last_seen, _, cpus, memory_mb, load, _) in enumerate(rows):
        if i % YIELD_EVERY == 0:
            yield_now()
        pre = _prefixes_of(node_id)
        gpus = _gpus[node_id][1]
        held = allocated.get(node_id, none)
        up_v.append(1.0 if state == Node.READY else 0.0)
        up_p.append(pre[0])
        gpus_v.append(float(len(gpus)))
        gpus_p.append(pre[1])
        free_v.append(
            float(sum(1 for g in gpus if g.healthy and not g.kept and g.index not in held))
        )
        free_p.append(pre[2])
        span_v.append(float(spanning.get(node_id, 0)))
        span_p.append(pre[15])
        if cpus:
            cpus_v.append(float(cpus))
            cpus_p.append(pre[3])
        if memory_mb:
            mem_v.append(memory_mb * _MiB)
            mem_p.append(pre[4])
        for g in gpus:
            if g.memory_mb:
                gmem_v.append(g.memory_mb * _MiB)
                gmem_p.append(g.prefixes[0])
            health_v.append(1.0 if g.healthy else 0.0)
            health_p.append(g.prefixes[1])
        seen = aware(last_seen)
        if seen is None:
            continue
        seen_v.append(seen.timestamp())
        seen_p.append(pre[5])
        if (now - seen).total_seconds() >= fresh_s:
            continue
        for name, values, value in _fabric[node_id]:
            scrape.add(name, values, value)
        if not load:
            continue
        try:
            readings.add(node_id, pre, gpus, raw_json(load))
        except (TypeError, ValueError, AttributeError):
            # Written only after validation; a row that is not is skipped, not the scrape.
            log.warning("node %s: unreadable load; its readings are left out", node_id)


class _Readings:
    """A fresh load's readings, each only when measured: a zero sensor is one not measured.

    Unrolled rather than table-driven: this runs for every GPU at every scrape. Each value
    is computed before anything is appended, so a bad one leaves the lists in step.
    """

    _NODE = (
        # (key in the load, index in NODE_METRICS, published when 0)
        ("cpu_percent", 6, True),
        ("memory_used_bytes", 7, True),
        ("memory_available_bytes", 8, True),
        ("load1", 9, True),
        ("load5", 10, True),
        ("load15", 11, True),
        ("cpu_temp_c", 12, False),
        ("cpu_power_w", 13, False),
        ("inlet_temp_c", 14, False),
    )

    def __init__(self, scrape: Scrape):
        self.scrape = scrape
        self.node = [(key, i, zero, scrape.lists(NODE_METRICS[i])) for key, i, zero in self._NODE]
        # The bound appends of each reading's prefixes and values, for the loop below.
        self.gpu = [lst.append for n in GPU_METRICS[2:] for lst in scrape.lists(n)]

    def add(self, node_id: str, pre: tuple[str, ...], gpus: tuple[_GpuRow, ...], load: dict):
        for key, i, zero_is_a_reading, (p, v) in self.node:
            value = load.get(key)
            if value is None or isinstance(value, bool):
                continue
            if value > 0 or (zero_is_a_reading and value == 0):
                v.append(float(value))
                p.append(pre[i])
        reported = load.get("gpus")
        if not reported or not gpus:
            return
        if len(reported) == len(gpus) and all(
            r.get("index") == g.index for r, g in zip(reported, gpus, strict=True)
        ):
            pairs = zip(gpus, reported, strict=True)  # the usual: every GPU, in index order
        else:
            by_index = {r.get("index"): r for r in reported}
            pairs = ((g, by_index[g.index]) for g in gpus if g.index in by_index)
        used_p, used_v, util_p, util_v, t_p, t_v, mt_p, mt_v, w_p, w_v, lim_p, lim_v = self.gpu
        for g, r in pairs:
            gp = g.prefixes
            value = r.get("memory_used_mb")
            if value is not None:
                used_v(value * _MiB)
                used_p(gp[2])
            value = r.get("utilization")
            if value is not None:
                util_v(float(value))
                util_p(gp[3])
            value = r.get("temp_c")
            if value and value > 0:
                t_v(float(value))
                t_p(gp[4])
            value = r.get("memory_temp_c")
            if value and value > 0:
                mt_v(float(value))
                mt_p(gp[5])
            value = r.get("power_w")
            if value and value > 0:
                w_v(float(value))
                w_p(gp[6])
            value = r.get("power_limit_w")
            if value and value > 0:
                lim_v(float(value))
                lim_p(gp[7])
            for reason in r.get("throttle") or ():
                self.scrape.add("llmgw_gpu_throttled", (g.gpu_class, g.index, node_id, reason), 1)
