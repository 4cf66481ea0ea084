"""`/metrics`: the fleet's gauges in Prometheus' text format, read from the database per scrape.

Every figure is read from one snapshot of the database when Prometheus asks
(style.md: gauges about the fleet are read by a collector at scrape time), so
any `llmgw serve` process behind a balancer answers the same: nothing about
the fleet is kept in this process but label text and registered GPUs, both
keyed by what the database says they are made of.

The text is rendered straight from that snapshot with the label text cached:
prometheus_client's own exposition spends about 10 µs a sample, a second at
100,000 series. `FleetCollector` hands the same families to a prometheus_client
registry for anyone who wants them there, and the tests hold the two to the
same text.

What a node did not measure has no series at all — a zero would read as a
machine at 0 °C drawing nothing — and readings from a node not heard from for
as long as it takes to call it unreachable are not published.
"""

from __future__ import annotations

import gc
import gzip
import json
import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import NamedTuple

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from catalog.domain import ModelSpec
from catalog.selectors import catalog_load
from llmgw.core import clock, sources
from llmgw.core.outage import Outage
from tenancy.quota import RESOURCES, ZERO, Amount, Holding
from tenancy.selectors import quota_policy_load

from .connections import agents_text
from .domain.gpuclass import CLASS_LABEL
from .domain.passes import stale_warning
from .domain.reconcile import desired_replicas
from .domain.types import HOLDING, ModelState as ModelStateView
from .engine_installs import install_rows
from .models import Gpu, Lease, ModelState, Node, Replica, Shard
from .reconciler import ADVISORY_KEY, LEASE

log = logging.getLogger("llmgw.metrics")

NODE = ("node",)
GPU = ("class", "gpu", "node")  # sorted, as the text format writes them
_THROTTLE = (*GPU, "reason")


@dataclass(frozen=True)
class Desc:
    """One metric: its name, what it means, its labels, and gauge or counter."""

    name: str
    help: str
    labels: tuple[str, ...]
    kind: str = "gauge"

    @property
    def sample(self) -> str:
        return self.name + "_total" if self.kind == "counter" else self.name

    @property
    def header(self) -> str:
        help_text = self.help.replace("\\", r"\\").replace("\n", r"\n")
        return f"# HELP {self.sample} {help_text}\n# TYPE {self.sample} {self.kind}"


# In the order they are written. Labels are listed sorted, as they appear in the text.
DESCS = (
    Desc("llmgw_node_up", "1 while a node's agent is heard from (ready); 0 when unreachable or lost.", NODE),
    Desc("llmgw_node_gpus", "GPUs a node registered.", NODE),
    Desc("llmgw_node_gpus_free", "A node's healthy GPUs that no replica holds.", NODE),
    Desc("llmgw_node_cpus", "CPUs a node's agent may run on, as it last said; absent when it did not say.", NODE),
    Desc("llmgw_node_memory_total_bytes", "A node's memory, as its agent last said; absent when it did not say.", NODE),
    Desc("llmgw_node_last_seen_timestamp_seconds", "When a node's agent was last heard from, as the database has it.", NODE),
    Desc("llmgw_node_cpu_percent", "How busy a node's CPUs were over the agent's last sample.", NODE),
    Desc("llmgw_node_memory_used_bytes", "A node's memory in use.", NODE),
    Desc("llmgw_node_memory_available_bytes", "A node's memory available to start new work.", NODE),
    Desc("llmgw_node_load1", "A node's load average over one minute.", NODE),
    Desc("llmgw_node_load5", "A node's load average over five minutes.", NODE),
    Desc("llmgw_node_load15", "A node's load average over fifteen minutes.", NODE),
    Desc("llmgw_node_cpu_temperature_celsius", "A node's hottest CPU sensor.", NODE),
    Desc("llmgw_node_cpu_power_watts", "A node's CPU packages' power draw, from RAPL.", NODE),
    Desc("llmgw_node_inlet_temperature_celsius", "A node's inlet or ambient air sensor, where its board has one.", NODE),
    Desc("llmgw_gpu_memory_total_bytes", "A GPU's memory, as registered.", GPU),
    Desc("llmgw_gpu_healthy", "1 while a GPU is healthy and may be given to replicas.", GPU),
    Desc("llmgw_gpu_memory_used_bytes", "A GPU's memory in use.", GPU),
    Desc("llmgw_gpu_utilization_percent",
         "How busy a GPU was over the last sample period. Absent when the driver does not report it, "
         "which is not the same as idle.", GPU),
    Desc("llmgw_gpu_temperature_celsius", "A GPU's reported temperature.", GPU),
    Desc("llmgw_gpu_memory_temperature_celsius", "A GPU's memory (HBM) temperature, where the driver reports it.", GPU),
    Desc("llmgw_gpu_power_watts", "A GPU's power draw now.", GPU),
    Desc("llmgw_gpu_power_limit_watts", "The power limit a GPU is held to.", GPU),
    Desc("llmgw_gpu_throttled",
         "1 while something holds a GPU's clocks down: sw_power_cap, hw_slowdown, sw_thermal, hw_thermal, power_brake.",
         _THROTTLE),
    Desc("llmgw_replicas", "Replicas of a model in each state it has any in.", ("model", "state")),
    Desc("llmgw_model_replicas_ready", "Replicas of a model ready to serve.", ("model",)),
    Desc("llmgw_model_desired", "Replicas a model wants now: its minimum, what load added, or one while an on-demand model is asked for.", ("model",)),
    Desc("llmgw_model_failures", "A model's failed starts in a row; reset once a replica is ready.", ("model",)),
    Desc("llmgw_model_parked", "1 when a model failed too often in a row and is no longer retried until restarted.", ("model",)),
    Desc("llmgw_model_unplaceable", "1 when a model is short of replicas and the last attempt found no node to place one on.", ("model",)),
    Desc("llmgw_model_preempted", "Replicas of a model stopped to make room for a model of a higher capacity class.",
         ("class", "model"), "counter"),
    Desc("llmgw_capacity_holds", "What a part of the tenancy tree holds of a resource, its own models' replicas and those beneath it.",
         ("resource", "scope")),
    Desc("llmgw_capacity_guarantee", "What a part of the tenancy tree is guaranteed of a resource.", ("resource", "scope")),
    Desc("llmgw_capacity_limit", "The most of a resource a part of the tenancy tree may hold.", ("resource", "scope")),
    Desc("llmgw_node_engine_install", "Where installing an engine stands on a node: 1 for the current state "
         "(installing, installed, failed), as its agent last said.", ("engine", "node", "state", "version")),
    Desc("llmgw_leader", "1 for the process holding the reconciler's lease; it is held only while a pass runs.", ("holder",)),
    Desc("llmgw_reconciler_last_pass_timestamp_seconds", "When the last reconciler pass began, whichever process ran it.", ()),
    Desc("llmgw_reconciler_settling", "1 while the reconciler waits after a start for agents to report before it places anything.", ()),
    Desc("llmgw_reconciler_stale", "1 when no reconciler pass ran for three intervals (at least 15 s): beat stopped, or no worker; `llmgw ctl models` says so too.", ()),
)  # fmt: skip
BY_NAME = {d.name: d for d in DESCS}


# Families per node and per GPU, in the order their cached line prefixes are kept.
NODE_METRICS = tuple(d.name for d in DESCS if d.labels == NODE)
GPU_METRICS = tuple(d.name for d in DESCS if d.labels == GPU)
_MiB = 1048576.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _prefix(desc: Desc, values: tuple) -> str:
    """The start of a series' line: a newline ending the one before, name, labels, a space."""
    if not desc.labels:
        return f"\n{desc.sample} "
    pairs = ",".join(f'{n}="{_escape(str(v))}"' for n, v in zip(desc.labels, values, strict=True))
    return f"\n{desc.sample}{{{pairs}}} "


class _GpuRow(NamedTuple):
    index: int
    memory_mb: int | None
    healthy: bool
    gpu_class: str
    prefixes: tuple[str, ...]  # one per GPU_METRICS


# Line prefixes (the label text) by what they are made of, and each node's GPUs as last
# registered, keyed by the node's spec_at: it moves whenever the node registers, the only
# time its GPUs change. Both are derived from what the database says, so every process
# writes the same text. Beside them only the text of numbers outlives a scrape.
_series: dict[tuple, str] = {}
_node_prefixes: dict[str, tuple[str, ...]] = {}
_gpus: dict[str, tuple[object, tuple[_GpuRow, ...]]] = {}
_indices: dict[str, tuple[int, ...]] = {}
_formatted: dict[float, str] = {}
_lock = threading.Lock()
_STALE_ALL = 500  # more registrations than this since the last scrape: read every GPU at once
# The scrape runs in a worker thread of the process whose event loop serves the agents, and
# holds the GIL while it works: left alone, it gives it up only every 5 ms
# (sys.getswitchinterval), and the loop, which needs it after every read and write, waits
# that long each time. Sleeping 0 s every few nodes (a quarter of a millisecond of work)
# lets the loop in: a loop's round trips during scrapes at 100,000 series went from a p99
# of 20-35 ms to 0.5-2 ms, on 2 cores.
_YIELD_EVERY = 4
_yield = partial(time.sleep, 0)


def caches_clear() -> None:
    """Forget cached label text and GPUs (tests reuse node ids across databases)."""
    with _lock:
        for cache in (_series, _node_prefixes, _gpus, _indices, _formatted):
            cache.clear()


def _line(name: str, values: tuple = ()) -> str:
    key = (name, values)
    hit = _series.get(key)
    if hit is None:
        hit = _series[key] = _prefix(BY_NAME[name], values)
    return hit


def _format(value: float) -> str:
    """floatToGoString, remembered: most values on a scrape (0, 1, counts, temperatures) repeat."""
    text = _formatted[value] = floatToGoString(value)
    return text


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


def _labels_of(prefix: str) -> dict[str, str]:
    text = prefix.partition("{")[2].rpartition("}")[0]
    return {
        k: re.sub(r"\\[\\n\"]", lambda m: _UNESCAPE[m.group(0)], v) for k, v in _LABEL.findall(text)
    }


class Scrape:
    """The series of one scrape: per metric, each series' line prefix and its value.

    Kept as two lists per metric rather than a tuple per sample: at 100,000 series the
    tuples, and the garbage collector walking them, were a third of a scrape.
    """

    def __init__(self) -> None:
        self.prefixes: dict[str, list[str]] = {d.name: [] for d in DESCS}
        self.values: dict[str, list[float]] = {d.name: [] for d in DESCS}

    def add(self, name: str, values: tuple, value: float) -> None:
        self.values[name].append(float(value))
        self.prefixes[name].append(_line(name, values))

    def lists(self, name: str) -> tuple[list[str], list[float]]:
        return self.prefixes[name], self.values[name]

    def text(self) -> str:
        """The Prometheus text format (0.0.4), as prometheus_client writes it."""
        out: list[str] = []
        get, fmt = _formatted.get, _format
        for d in DESCS:
            prefixes = self.prefixes[d.name]
            if not prefixes:
                continue
            _yield()
            parts: list[str] = [""] * (2 * len(prefixes))
            parts[0::2] = prefixes
            values = self.values[d.name]
            texts = list(map(get, values))
            if None in texts:
                texts = [t if t is not None else fmt(v) for t, v in zip(texts, values, strict=True)]
            parts[1::2] = texts
            out.append(d.header + "".join(parts))
        if len(_formatted) > 200_000:
            _formatted.clear()
        return "\n".join(out) + "\n" if out else ""

    def families(self) -> Iterator[Metric]:
        """The same series as prometheus_client metric families."""
        for d in DESCS:
            prefixes = self.prefixes[d.name]
            if not prefixes:
                continue
            family = Metric(d.name, d.help, d.kind)
            family.samples = [
                Sample(d.sample, _labels_of(p), v)
                for p, v in zip(prefixes, self.values[d.name], strict=True)
            ]
            yield family

    def series(self) -> int:
        return sum(len(p) for p in self.prefixes.values())


def _raw(qs, fields: tuple[str, ...]) -> list[tuple]:
    """Rows of `fields` as the driver returns them, without Django's per-value converters."""
    sql, params = qs.values_list(*fields).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _when(value) -> datetime | None:
    """A datetime from a raw row: SQLite gives text, PostgreSQL an aware datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _json(value):
    return json.loads(value) if isinstance(value, str | bytes) else value


def _gpu_rows(stale: dict[str, object]) -> None:
    """Read the GPUs (and class override) of nodes that registered since they were cached."""
    rows = Gpu.objects.order_by()
    if len(stale) <= _STALE_ALL:
        rows = rows.filter(node_id__in=list(stale))
    found: dict[str, list[_GpuRow]] = defaultdict(list)
    descs = [BY_NAME[n] for n in GPU_METRICS]
    for node_id, index, gpu_class, memory_mb, healthy, labels in rows.values_list(
        "node_id", "index", "gpu_class", "memory_mb", "healthy", "node__labels"
    ):
        if node_id not in stale:
            continue
        override = labels.get(CLASS_LABEL) if isinstance(labels, dict) else None
        cls = str(override or gpu_class)
        prefixes = tuple(_prefix(d, (cls, index, node_id)) for d in descs)
        found[node_id].append(_GpuRow(index, memory_mb, bool(healthy), cls, prefixes))
    for node_id, spec_at in stale.items():
        _gpus[node_id] = (spec_at, tuple(sorted(found.get(node_id, ()))))


class _Held(NamedTuple):
    """What replicas hold now: GPU indices per node, and per model what its shards hold."""

    gpus: dict[str, set[int]]
    models: dict[str, Amount]


def _held() -> _Held:
    """One read of every shard of a replica holding room (fleet.domain.types.HOLDING).

    A model's amount is summed as a replica's is (ReplicaView.amount: per shard its GPUs,
    reserved cores and memory), so the quotas' holds match `GET /quotas`.
    """
    gpus: dict[str, set[int]] = defaultdict(set)
    per_model: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    shards = Shard.objects.filter(replica__state__in=HOLDING).order_by()
    rows = _raw(shards, ("node_id", "gpu_indices", "cpu_cores", "memory_gb", "replica__model"))
    for i, (node_id, indices, cores, memory_gb, model) in enumerate(rows):
        if i % (_YIELD_EVERY * 128) == 0:
            _yield()
        if isinstance(indices, str):
            parsed = _indices.get(indices)
            if parsed is None:
                parsed = _indices[indices] = tuple(json.loads(indices) or ())
            indices = parsed
        held = per_model[model]
        if indices:
            gpus[node_id].update(indices)
            held[0] += len(indices)
        held[1] += cores or 0
        held[2] += memory_gb or 0.0
    return _Held(gpus, {m: Amount(g, c, mem) for m, (g, c, mem) in per_model.items()})


def _prefixes_of(node_id: str) -> tuple[str, ...]:
    hit = _node_prefixes.get(node_id)
    if hit is None:
        hit = _node_prefixes[node_id] = tuple(_prefix(BY_NAME[n], (node_id,)) for n in NODE_METRICS)
    return hit


def _nodes(scrape: Scrape, now: datetime, fresh_s: float, allocated: dict[str, set[int]]) -> None:
    rows = _raw(
        Node.objects.order_by("id"),
        ("id", "state", "last_seen", "spec_at", "cpu_count", "memory_total_mb", "load"),
    )
    stale = {r[0]: r[3] for r in rows if r[0] not in _gpus or _gpus[r[0]][0] != r[3]}
    if stale:
        _gpu_rows(stale)
    if len(_gpus) > len(rows) or len(_node_prefixes) > len(rows):
        ids = {r[0] for r in rows}
        for cache in (_gpus, _node_prefixes):
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
    (gmem_p, gmem_v), (health_p, health_v) = (scrape.lists(n) for n in GPU_METRICS[:2])
    readings = _Readings(scrape)
    none: set[int] = set()
    for i, (node_id, state, last_seen, _, cpus, memory_mb, load) in enumerate(rows):
        if i % _YIELD_EVERY == 0:
            _yield()
        pre = _prefixes_of(node_id)
        gpus = _gpus[node_id][1]
        held = allocated.get(node_id, none)
        up_v.append(1.0 if state == Node.READY else 0.0)
        up_p.append(pre[0])
        gpus_v.append(float(len(gpus)))
        gpus_p.append(pre[1])
        free_v.append(float(sum(1 for g in gpus if g.healthy and g.index not in held)))
        free_p.append(pre[2])
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
        seen = _when(last_seen)
        if seen is None:
            continue
        seen_v.append(seen.timestamp())
        seen_p.append(pre[5])
        if (now - seen).total_seconds() >= fresh_s or not load:
            continue
        try:
            readings.add(node_id, pre, gpus, _json(load))
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


def _models(scrape: Scrape, now: datetime, catalog: dict[str, ModelSpec]) -> None:
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for model, state, n in (
        Replica.objects.order_by().values_list("model", "state").annotate(n=Count("id"))
    ):
        counts[model][state] = n
    for model in sorted(counts):
        for state, n in sorted(counts[model].items()):
            scrape.add("llmgw_replicas", (model, state), n)
    states = {
        row[0]: row
        for row in _raw(
            ModelState.objects.order_by(),
            ("model", "desired", "failures", "parked_since", "unplaceable", "preempted"),
        )
    }
    for name in sorted(catalog):
        spec = catalog[name]
        row = states.get(name)
        if row is None:
            # Before its first pass a model wants what its scaling says, not nothing.
            desired = desired_replicas(spec, ModelStateView(model=name), now)
            failures, parked, unplaceable, preempted = 0, False, False, 0
        else:
            _, desired, failures, parked_since, unplaceable, preempted = row
            parked = parked_since is not None
        model = (name,)
        scrape.add("llmgw_model_replicas_ready", model, counts[name].get("ready", 0))
        scrape.add("llmgw_model_desired", model, desired)
        scrape.add("llmgw_model_failures", model, failures)
        scrape.add("llmgw_model_parked", model, 1 if parked else 0)
        scrape.add("llmgw_model_unplaceable", model, 1 if unplaceable else 0)
        scrape.add("llmgw_model_preempted", (spec.effective_class, name), preempted)


def _quotas(scrape: Scrape, catalog: dict[str, ModelSpec], held: dict[str, Amount]) -> None:
    policy = quota_policy_load()
    if not policy.quotas:
        return
    # One holding per model is enough for the sums: usage adds each along its owner's chain.
    usage = policy.usage(
        Holding(replica=model, owner=spec.owner, amount=held[model], since=_EPOCH)
        for model, spec in catalog.items()
        if model in held
    )
    for scope in sorted(policy.quotas, key=policy.name):
        q = policy.quotas[scope]
        holds = usage.get(scope, ZERO)
        for r in RESOURCES:
            guarantee, limit = getattr(q.guarantee, r), getattr(q.limit, r)
            if guarantee is None and limit is None:
                continue
            labels = (r, policy.name(scope))
            scrape.add("llmgw_capacity_holds", labels, getattr(holds, r))
            if guarantee is not None:
                scrape.add("llmgw_capacity_guarantee", labels, guarantee)
            if limit is not None:
                scrape.add("llmgw_capacity_limit", labels, limit)


def _reconciler(scrape: Scrape, now: datetime) -> None:
    row = (
        Lease.objects.filter(pk=LEASE)
        .values_list("holder", "expires_at", "last_pass_at", "settle_until", "served_since")
        .first()
    )
    if row is None:
        return
    holder, expires_at, last_pass_at, settle_until, served_since = row
    if holder and expires_at > now and (connection.vendor != "postgresql" or _pass_locked()):
        scrape.add("llmgw_leader", (holder,), 1)
    if last_pass_at is not None:
        settling = settle_until is not None and now < settle_until
        scrape.add("llmgw_reconciler_last_pass_timestamp_seconds", (), last_pass_at.timestamp())
        scrape.add("llmgw_reconciler_settling", (), 1 if settling else 0)
    if last_pass_at is not None or served_since is not None:
        stale = stale_warning(
            now=now,
            last_pass_at=last_pass_at,
            served_since=served_since,
            embedded=settings.LLMGW.embedded,
            t=settings.LLMGW.timings,
        )
        scrape.add("llmgw_reconciler_stale", (), 0 if stale is None else 1)


def _pass_locked() -> bool:
    """Whether some session holds the pass's advisory lock: the row names a holder that a
    SIGKILL left there until it expires, the lock went with its session."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND ((classid::bigint << 32) | objid::bigint) = %s",
            [ADVISORY_KEY],
        )
        return cursor.fetchone() is not None


@contextmanager
def _snapshot():
    """One consistent read of the database, taking no lock a writer waits for.

    PostgreSQL: a repeatable-read, read-only transaction. SQLite: a plain (deferred) BEGIN,
    which in WAL mode reads one snapshot; Django's own atomic() would BEGIN IMMEDIATE here
    (settings.py) and hold the write lock for the whole scrape, keeping the heartbeats'
    write-behind and the reconciler waiting. Inside a caller's transaction, that one.
    """
    if connection.in_atomic_block:
        yield
    elif connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield
    elif connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            try:
                yield
            finally:
                cursor.execute("ROLLBACK")  # it wrote nothing
    else:
        with transaction.atomic():
            yield


def _scrape(now: datetime) -> Scrape:
    scrape = Scrape()
    with _snapshot():
        held = _held()
        catalog = catalog_load()
        _nodes(scrape, now, settings.LLMGW.timings.unreachable, held.gpus)
        _models(scrape, now, catalog)
        _quotas(scrape, catalog, held.models)
        _reconciler(scrape, now)
        for node_id, engine, version, state in install_rows():
            scrape.add("llmgw_node_engine_install", (engine, node_id, state, version), 1)
    if len(_series) > 2 * scrape.series() + 10_000:
        _series.clear()
    if len(_indices) > 10_000:
        _indices.clear()
    return scrape


@contextmanager
def _quiet_gc():
    """No cyclic garbage collection while a scrape allocates its few hundred thousand objects,
    none of them in cycles: the collector walking them cost as much as the scrape itself."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def fleet_scrape(*, now: datetime | None = None) -> Scrape:
    """Every fleet series, from one snapshot of the database (repeatable read on PostgreSQL).

    A fixed number of queries, however many nodes, GPUs and models there are.
    """
    with _lock, _quiet_gc():
        return _scrape(now or clock.now())


def fleet_text(*, now: datetime | None = None) -> str:
    """`fleet_scrape(...).text()`, in one go."""
    with _lock, _quiet_gc():
        return _scrape(now or clock.now()).text()


class FleetCollector(Collector):
    """The fleet's series for a prometheus_client registry, from one scrape per collect()."""

    def collect(self) -> Iterator[Metric]:
        yield from fleet_scrape().families()


_last_good = {"text": ""}
_scrape_outage = Outage(
    "reading the fleet's metrics from the database", logging.getLogger("llmgw.metrics")
)
DATABASE_DOWN = (
    "# HELP llmgw_database_up Whether this process could read the fleet from the database "
    "for this scrape; while 0 the fleet's series are those of its last good scrape.\n"
    "# TYPE llmgw_database_up gauge\nllmgw_database_up 0.0\n"
)


def _fleet_or_last() -> str:
    """The fleet's series; while the database is away, the last good ones and
    llmgw_database_up 0, so a scrape answers and says what it is (never an HTML 500)."""
    try:
        text = fleet_text()
    except (OperationalError, InterfaceError) as exc:
        _scrape_outage.failed(exc)
        return _last_good["text"] + DATABASE_DOWN
    _scrape_outage.worked()
    _last_good["text"] = text
    return text


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """`GET /metrics`: no authentication, like any exporter; gzip when asked, as Prometheus does.

    A plain (sync) view: daphne runs it in a worker thread, off the event loop that
    serves the agents.
    """
    gateway = sources.read(sources.GATEWAY_METRICS, absent="")
    body = (_fleet_or_last() + gateway + agents_text()).encode()
    response = HttpResponse(content_type=CONTENT_TYPE_PLAIN_0_0_4)
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        body = gzip.compress(body, compresslevel=1)
        response["Content-Encoding"] = "gzip"
    response["Vary"] = "Accept-Encoding"
    response.content = body
    return response
