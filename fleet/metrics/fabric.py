"""The GPU fabric's series of a node: NVLinks, ECC, fabric registration, Xids, IMEX and
InfiniBand, from what its agent last said (fleet/protocol.py Fabric, as the node's and its
GPUs' rows keep it).

Worked out once per registration or changed report (fleet/metrics/by_node.py caches them
by the node's spec_at and fabric_at, which those move) and added to each scrape while the node is heard
from. What the agent did not say has no series: an absent counter is unknown, not 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ..protocol import NVLINK_ERRORS

# (name, label values in the Desc's order, value)
Line = tuple[str, tuple, float]

# Each NVLink error counter with its `kind` label: replay_errors is kind="replay".
_NVLINK_KINDS = tuple((key, key.removesuffix("_errors")) for key in NVLINK_ERRORS)
_ECC = (
    ("corrected_volatile", "corrected", "volatile"),
    ("uncorrected_volatile", "uncorrected", "volatile"),
    ("corrected_aggregate", "corrected", "aggregate"),
    ("uncorrected_aggregate", "uncorrected", "aggregate"),
)
_REPAIRS = (
    ("retired_pending", "retire_pending"),
    ("remap_pending", "remap_pending"),
    ("remap_failure", "remap_failed"),
)
_IB_COUNTERS = ("link_downed", "symbol_errors", "port_rcv_errors")


def fabric_lines(
    node_id: str,
    gpus: Iterable[tuple[int, str, Any]],
    imex: Any,
    ib_ports: Any,
) -> tuple[Line, ...]:
    """Every fabric series of a node: `gpus` as (index, class, its row's `fabric`), and
    the node's rows' `imex` and `ib_ports`. A part that is not what the protocol says
    (a row written by hand) is skipped, not the scrape."""
    lines: list[Line] = []
    for index, cls, report in gpus:
        if isinstance(report, Mapping):
            lines.extend(_gpu_lines(node_id, index, cls, report))
    if isinstance(imex, Mapping) and imex.get("state") in ("up", "down"):
        lines.append(
            ("llmgw_node_imex_up", (str(imex.get("domain") or ""), node_id), imex["state"] == "up")
        )
    for port in ib_ports if isinstance(ib_ports, list) else ():
        if isinstance(port, Mapping):
            lines.extend(_port_lines(node_id, port))
    return tuple((name, values, float(value)) for name, values, value in lines)


def _gpu_lines(node_id: str, index: int, cls: str, report: Mapping) -> list:
    lines: list = []
    for link in _dicts(report.get("nvlinks")):
        n = link.get("link")
        if not _count(n):
            continue
        if isinstance(link.get("up"), bool):
            lines.append(("llmgw_gpu_nvlink_up", (cls, index, n, node_id), link["up"]))
        for key, kind in _NVLINK_KINDS:
            if _count(link.get(key)):
                lines.append(("llmgw_gpu_nvlink_errors", (cls, index, kind, n, node_id), link[key]))
    ecc = report.get("ecc")
    if isinstance(ecc, Mapping):
        for key, kind, scope in _ECC:
            if _count(ecc.get(key)):
                lines.append(("llmgw_gpu_ecc_errors", (cls, index, kind, node_id, scope), ecc[key]))
        for key, state in _REPAIRS:
            if isinstance(ecc.get(key), bool):
                lines.append(("llmgw_gpu_memory_repair", (cls, index, node_id, state), ecc[key]))
    fabric = report.get("fabric")
    if isinstance(fabric, Mapping):
        state = fabric.get("state")
        if state in ("not_started", "in_progress", "completed"):
            lines.append(("llmgw_gpu_fabric_state", (cls, index, node_id, state), 1))
        clique, cluster = fabric.get("clique_id"), fabric.get("cluster_uuid")
        if state == "completed" and cluster and _count(clique):
            lines.append(("llmgw_gpu_nvlink_joined", (cls, clique, cluster, index, node_id), 1))
    xids = report.get("xids")
    seen = Counter(x for x in xids if _count(x)) if isinstance(xids, list) else {}
    for xid, times in sorted(seen.items()):
        lines.append(("llmgw_gpu_xid", (cls, index, node_id, xid), times))
    return lines


def _port_lines(node_id: str, port: Mapping) -> list:
    device, number = str(port.get("device") or ""), port.get("port")
    if not device or not _count(number):
        return []
    at = (device, node_id, number)
    lines: list = []
    if port.get("state"):
        lines.append(("llmgw_node_ib_port_active", at, str(port["state"]).upper() == "ACTIVE"))
    rate = port.get("rate_gbps")
    if isinstance(rate, int | float) and not isinstance(rate, bool) and rate > 0:
        lines.append(("llmgw_node_ib_port_rate_gbps", at, rate))
    for key in _IB_COUNTERS:
        if _count(port.get(key)):
            lines.append(("llmgw_node_ib_port_errors", (key, *at), port[key]))
    return lines


def _dicts(value: Any) -> list[Mapping]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _count(value: Any) -> bool:
    """Whether `value` is a count (a non-negative int, not a bool); 0 included."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
