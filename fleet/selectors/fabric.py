"""The GPU fabric as operators read it (GET /api/v1/fabric, `llmgw ctl fabric`): each
NVLink domain with its GPUs free and in all, its trays (nodes) with IMEX on each, the
replicas spanning them, and what keeps GPUs out of service. Reads only.

Everything comes from the views placement reads (fleet/selectors/state.py, through the
pure rules of fleet/domain/fabric.py: its `domain_trays` groups the trays into domains,
as the /fabric page does), so a GPU is "free" here exactly when placement
would give it out: healthy, not held by another process, no problem, not cordoned, and
held by no replica.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from ..domain.fabric import Domain, domain_trays
from ..domain.types import HOLDING, GpuView, NodeView, ReplicaView
from .facility import held_gpus
from .state import node_views, replica_views


def gpu_kept_said(node_id: str, gpu: GpuView) -> str | None:
    """Why a GPU takes no new replica, in a sentence: its problem, else its cordon."""
    if gpu.problem:
        return gpu.problem
    return f"GPU {gpu.index} of node {node_id} is cordoned" if gpu.cordoned else None


def held_by_node(replicas: Iterable[ReplicaView]) -> dict[str, set[int]]:
    """The GPU indices replicas holding room hold, per node."""
    held: dict[str, set[int]] = defaultdict(set)
    for node_id, indices in held_gpus(replicas):
        held[node_id].update(indices)
    return held


def _imex(node: NodeView) -> str | None:
    return None if node.imex is None else "up" if node.imex else "down"


def _tray(node: NodeView, gpus: list[GpuView], held: set[int], spanning: list[str]) -> dict:
    problems = [s for g in gpus if (s := gpu_kept_said(node.id, g))]
    return {
        "node": node.id,
        "state": node.shown_state,
        "gpus_total": len(gpus),
        "gpus_free": sum(1 for g in gpus if g.free_to_place and g.index not in held),
        "imex": _imex(node),
        "replicas": spanning,
        "problems": problems,
    }


def fabric_read() -> dict:
    """Every NVLink domain the nodes' GPUs report, and every GPU kept out of service (a
    problem, a cordon) on any node, in a domain or not."""
    nodes = node_views()
    replicas = replica_views()
    held = held_by_node(replicas)
    spanning: dict[str, list[str]] = defaultdict(list)
    for r in replicas:
        if r.state in HOLDING and len(r.nodes) > 1:
            for node_id in sorted(r.nodes):
                spanning[node_id].append(r.id)
    problems = [
        s for node_id in sorted(nodes) for g in nodes[node_id].gpus
        if (s := gpu_kept_said(node_id, g))
    ]  # fmt: skip
    domains = [
        _domain_out(d, [_tray(n, gpus, held.get(n.id, set()), spanning[n.id]) for n, gpus in trays])
        for d, trays in domain_trays(nodes.values()).items()
    ]
    return {"domains": domains, "problems": problems}


def _domain_out(domain: Domain, trays: list[Mapping]) -> dict:
    uuid, clique = domain
    return {
        "name": f"domain {uuid} clique {clique}",
        "cluster_uuid": uuid,
        "clique": clique,
        "gpus_total": sum(t["gpus_total"] for t in trays),
        "gpus_free": sum(t["gpus_free"] for t in trays),
        "imex_up": sum(1 for t in trays if t["imex"] == "up"),
        "replicas": sorted({r for t in trays for r in t["replicas"]}),
        "trays": list(trays),
    }
