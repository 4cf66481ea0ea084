"""The fleet's metrics as described, and one scrape's series written as Prometheus text.

Each metric's name, help, labels and kind (`DESCS`, in the order they are written);
the label text of each series, cached by what it is made of, and the text of
numbers; `Scrape`, the series of one scrape as a line prefix and a value each,
written as the text format or handed over as prometheus_client families. Beside
them what every family's read shares: rows read raw, and the yield that lets the
agents' event loop in. The families themselves are read in fleet/metrics/by_node.py
and fleet/metrics/by_model.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

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
    Desc("llmgw_node_gpus_free", "A node's GPUs placement may give out: healthy, no fabric problem, not cordoned, and held by no replica.", NODE),
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
    Desc("llmgw_node_multinode_replicas", "Replicas over several nodes with a shard on a node: IMEX down in its domain stops them.", NODE),
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
    # The GPU fabric, as each node's agent last said (fleet/agent/fabric.py); only from a node
    # heard from lately, and each only where the machine says it.
    Desc("llmgw_gpu_nvlink_up", "1 while a GPU's NVLink is up, 0 while it is down.", ("class", "gpu", "link", "node")),
    Desc("llmgw_gpu_nvlink_errors", "A GPU's NVLink data-link errors (replay, recovery, crc_flit, crc_data), as NVML counts them.",
         ("class", "gpu", "kind", "link", "node"), "counter"),
    Desc("llmgw_gpu_ecc_errors", "A GPU's memory ECC errors, corrected or uncorrected: volatile since the driver last loaded, "
         "aggregate over its life.", ("class", "gpu", "kind", "node", "scope"), "counter"),
    Desc("llmgw_gpu_memory_repair", "1 while a GPU's memory waits for a reset to retire pages (retire_pending) or remap rows "
         "(remap_pending), or a row remapping failed (remap_failed); 0 when it says none.", ("class", "gpu", "node", "state")),
    Desc("llmgw_gpu_fabric_state", "Where a GPU's registration with the NVLink fabric stands: 1 for the current state "
         "(not_started, in_progress, completed).", ("class", "gpu", "node", "state")),
    Desc("llmgw_gpu_nvlink_joined", "1 for a GPU joined to an NVLink domain: the fabric's cluster UUID and its clique.",
         ("class", "clique", "cluster", "gpu", "node")),
    Desc("llmgw_gpu_xid", "Critical Xid errors of a GPU NVML told its agent of since the agent started (the last 32).",
         ("class", "gpu", "node", "xid")),
    Desc("llmgw_node_imex_up", "1 while a node's IMEX service is up, 0 while it is down; absent where none is installed.",
         ("domain", "node")),
    Desc("llmgw_node_ib_port_active", "1 while an InfiniBand port is ACTIVE, 0 otherwise.", ("device", "node", "port")),
    Desc("llmgw_node_ib_port_rate_gbps", "An InfiniBand port's rate.", ("device", "node", "port")),
    Desc("llmgw_node_ib_port_errors", "An InfiniBand port's error counters: link_downed, symbol_errors, port_rcv_errors.",
         ("counter", "device", "node", "port"), "counter"),
    Desc("llmgw_replicas", "Replicas of a model in each state it has any in.", ("model", "state")),
    Desc("llmgw_model_replicas_ready", "Replicas of a model ready to serve.", ("model",)),
    Desc("llmgw_model_desired", "Replicas a model wants now: its minimum, what load added, or one while an on-demand model is asked for.", ("model",)),
    Desc("llmgw_model_failures", "A model's failed starts in a row; reset once a replica is ready.", ("model",)),
    Desc("llmgw_model_parked", "1 when a model failed too often in a row and is no longer retried until restarted.", ("model",)),
    Desc("llmgw_model_unplaceable", "1 when a model is short of replicas and the last attempt found no node to place one on.", ("model",)),
    Desc("llmgw_model_preempted", "Replicas of a model stopped to make room for a model of a higher capacity class.",
         ("class", "model"), "counter"),
    Desc("llmgw_replica_running", "Requests a ready replica's engine said it runs, as its agent last read its metrics.", ("model", "replica")),
    Desc("llmgw_replica_waiting", "Requests a ready replica's engine said it queues: all its slots or KV cache taken.", ("model", "replica")),
    Desc("llmgw_replica_kv_cache_usage_ratio", "The share of a ready replica's KV cache in use, 0 to 1; absent for an engine that does not say "
         "(a recent llama-server).", ("model", "replica")),
    Desc("llmgw_replica_prefix_cache_hit_ratio", "Prompt tokens a ready replica's engine found in its prefix cache over those it looked up, "
         "over the last minute; absent while it looked up none.", ("model", "replica")),
    Desc("llmgw_adapter_loaded", "1 for each LoRA adapter a ready replica's engine holds, as its agent last said; none for an "
         "engine that said nothing of adapters.", ("adapter", "model", "replica")),
    Desc("llmgw_capacity_holds", "What a part of the tenancy tree holds of a resource, its own models' replicas and those beneath it.",
         ("resource", "scope")),
    Desc("llmgw_capacity_guarantee", "What a part of the tenancy tree is guaranteed of a resource.", ("resource", "scope")),
    Desc("llmgw_capacity_limit", "The most of a resource a part of the tenancy tree may hold.", ("resource", "scope")),
    Desc("llmgw_node_engine_install", "Where installing an engine stands on a node: 1 for the current state "
         "(installing, installed, failed), as its agent last said.", ("engine", "node", "state", "version")),
    Desc("llmgw_domain_power_budget_watts", "The most a power domain (a rack, PDU, PDU phase, row, room or site) may draw, as an operator set it (llmgw ctl facility set).", ("kind", "name")),
    Desc("llmgw_domain_power_limit_watts", "What placement loads a power domain to: its budget less its safety margin.", ("kind", "name")),
    Desc("llmgw_domain_reserved_watts", "What placement counts as held in a power domain: its GPUs' estimate, each node's own share and the other equipment declared.", ("kind", "name")),
    Desc("llmgw_domain_measured_watts", "What a power domain is measured to draw: its facility meter (a Prometheus power_watts signal) where it has one, else each node's whole draw from its BMC where it reports one, and for the others the GPUs held by replicas there and their own draw (their RAPL reading, else the per-node share); absent where no GPU held there and no node reports its draw.", ("kind", "name")),
    Desc("llmgw_domain_power_held_watts", "What the GPUs held by replicas in a power domain draw as placement counts it: per GPU the larger of its power limit and its measured draw.", ("kind", "name")),
    Desc("llmgw_domain_condition", "A rack's, PDU's, row's, room's or zone's thermal condition: 1 for the one it is in (ok, warm, hot, unknown: "
         "no fresh reading), 0 for the others (llmgw ctl facility conditions).", ("condition", "kind", "name")),
    Desc("llmgw_domain_reading_age_seconds", "Seconds since a domain's newest facility reading, fresh or not; past its source's "
         "stale_after the domain is unknown.", ("kind", "name")),
    Desc("llmgw_domain_held", "1 while an operator holds a domain: no new placements there (llmgw ctl facility hold).", ("kind", "name")),
    Desc("llmgw_facility_conditions_enforced", "1 when hot domains are refused and warm ones placed last; 0 observe-only "
         "(LLMGW_FACILITY_ENFORCE).", ()),
    Desc("llmgw_leader", "1 for the process holding the reconciler's lease; it is held only while a pass runs.", ("holder",)),
    Desc("llmgw_reconciler_last_pass_timestamp_seconds", "When the last reconciler pass began, whichever process ran it.", ()),
    Desc("llmgw_reconciler_settling", "1 while the reconciler waits after a start for agents to report before it places anything.", ()),
    Desc("llmgw_reconciler_stale", "1 when no reconciler pass ran for three intervals (at least 15 s): beat stopped, or no worker; `llmgw ctl models` says so too.", ()),
)  # fmt: skip
BY_NAME = {d.name: d for d in DESCS}


# Families per node and per GPU, in the order their cached line prefixes are kept.
NODE_METRICS = tuple(d.name for d in DESCS if d.labels == NODE)
GPU_METRICS = tuple(d.name for d in DESCS if d.labels == GPU)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def line_prefix(desc: Desc, values: tuple) -> str:
    """The start of a series' line: a newline ending the one before, name, labels, a space."""
    if not desc.labels:
        return f"\n{desc.sample} "
    pairs = ",".join(f'{n}="{_escape(str(v))}"' for n, v in zip(desc.labels, values, strict=True))
    return f"\n{desc.sample}{{{pairs}}} "


# Line prefixes (the label text) by what they are made of: derived from what the database
# says, so every process writes the same text. Beside them only the text of numbers
# outlives a scrape.
_series: dict[tuple, str] = {}
_formatted: dict[float, str] = {}

# The scrape runs in a worker thread of the process whose event loop serves the agents, and
# holds the GIL while it works: left alone, it gives it up only every 5 ms
# (sys.getswitchinterval), and the loop, which needs it after every read and write, waits
# that long each time. Sleeping 0 s every few nodes (a quarter of a millisecond of work)
# lets the loop in: a loop's round trips during scrapes at 100,000 series went from a p99
# of 20-35 ms to 0.5-2 ms, on 2 cores.
YIELD_EVERY = 4
yield_now = partial(time.sleep, 0)


def series_caches_clear() -> None:
    """Forget cached label text and the text of numbers; the caller holds the scrape's lock."""
    for cache in (_series, _formatted):
        cache.clear()


def series_cache_trim(series: int) -> None:
    """Forget the label text once it holds far more than a scrape of `series` series uses."""
    if len(_series) > 2 * series + 10_000:
        _series.clear()


def _line(name: str, values: tuple = ()) -> str:
    key = (name, values)
    hit = _series.get(key)
    if hit is None:
        hit = _series[key] = line_prefix(BY_NAME[name], values)
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
            yield_now()
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
