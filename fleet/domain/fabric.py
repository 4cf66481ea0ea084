"""What a GPU's fabric report means for placement (docs/fabric.md, "Placement"): pure.

An agent reports per GPU its fabric registration, NVLinks, ECC counters and the Xids it
saw (`fleet.protocol.GpuFabricReport`); the selectors store it and pass it here as the
plain mapping it was sent as (`model_dump()`), so these rules import no protocol. Every
figure may be absent: absent is unknown, never 0, and unknown is never a problem.

- `gpu_problem`: why the GPU takes no new replicas, in a sentence; None when nothing says so.
- `gpu_domain`: the NVLink domain it is in (cluster UUID, clique), once registered.
- `nvlink_peers`: the GPUs of the same node it is joined to by an NVLink that is up.
- `domain_trays`: the nodes (trays) of each NVLink domain, as the API and the page list them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from .types import GpuView, NodeView

Domain = tuple[str, int]

# The Xids after which a GPU needs a reset before it serves again, with the words an
# operator reads. The list is the one issue 40 gives, from NVIDIA's Xid catalog
# (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the codes whose
# immediate action is a GPU reset or a node reboot); the names are the catalog's, short.
XIDS_NEEDING_RESET: Mapping[int, str] = {
    48: "double-bit ECC error",
    63: "row remapping pending",
    64: "row remapping failed",
    74: "NVLink error",
    79: "fallen off the bus",
    92: "high single-bit ECC error rate",
    93: "InfoROM wear limit",
    94: "contained memory error",
    95: "uncontained memory error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# Fabric registration states that say the GPU is in a fabric but not (yet) joined.
NOT_JOINED = frozenset({"not_started", "in_progress"})


def _part(report: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A part of the report (`fabric`, `ecc`) as a mapping; empty when absent."""
    part = report.get(name)
    return part if isinstance(part, Mapping) else {}


def _count(value: object) -> int:
    """A counter as reported; 0 for absent (unknown is no problem) or not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _xid_said(report: Mapping[str, Any]) -> str | None:
    """The newest Xid seen that needs a reset, in words."""
    for xid in reversed(list(report.get("xids") or ())):
        if xid in XIDS_NEEDING_RESET:
            return f"had Xid {xid} ({XIDS_NEEDING_RESET[xid]}), which needs a reset"
    return None


def _ecc_said(ecc: Mapping[str, Any]) -> str | None:
    """Uncorrected errors since the last reset, then rows or pages waiting for one. The
    aggregate counts live for the GPU's life: one error years ago is no reason today."""
    if (n := _count(ecc.get("uncorrected_volatile"))) > 0:
        return f"has {n} uncorrected ECC error{'' if n == 1 else 's'}"
    if ecc.get("remap_failure") is True:
        return "had a row remapping fail"
    if ecc.get("remap_pending") is True:
        return "has row remapping pending"
    if ecc.get("retired_pending") is True:
        return "has retired pages pending"
    return None


def _fabric_said(fabric: Mapping[str, Any]) -> str | None:
    """A registration with the fabric manager not finished, or finished with an error.
    `not_supported` (no fabric: a PCIe card, an HGX board) is no problem."""
    state = fabric.get("state")
    if state in NOT_JOINED:
        return f"has its fabric registration not completed ({state})"
    status = fabric.get("status")
    if state == "completed" and _count(status) != 0:
        return f"failed its fabric registration (NVML status {status})"
    return None


def gpu_problem(report: Mapping[str, Any], *, node_id: str) -> str | None:
    """Why this GPU takes no new replicas, in a sentence with its figures ("GPU 3 of node
    n1 has 2 uncorrected ECC errors"); None when its report says nothing wrong. The first
    cause that applies speaks: an Xid needing a reset, the ECC counters, the fabric."""
    ecc, fabric = _part(report, "ecc"), _part(report, "fabric")
    said = _xid_said(report) or _ecc_said(ecc) or _fabric_said(fabric)
    if said is None:
        return None
    return f"GPU {report.get('index')} of node {node_id} {said}"


def gpu_domain(report: Mapping[str, Any]) -> tuple[str, int] | None:
    """The NVLink domain the GPU is in, (cluster UUID, clique id), once its registration
    completed without an error; None otherwise (no fabric, or not known yet). A UUID of
    zeros is NVML's "no cluster"."""
    fabric = _part(report, "fabric")
    uuid, clique = str(fabric.get("cluster_uuid") or ""), fabric.get("clique_id")
    if fabric.get("state") != "completed" or _count(fabric.get("status")) != 0:
        return None
    if not uuid.strip("0-") or not isinstance(clique, int) or isinstance(clique, bool):
        return None
    return (uuid, clique)


def nvlink_peers(report: Mapping[str, Any]) -> frozenset[int]:
    """The indices of the GPUs on the same node this one reaches by an NVLink that is up
    (a link to an NVSwitch or to another node names no peer)."""
    own = report.get("index")
    peers = set()
    for link in report.get("nvlinks") or ():
        if not isinstance(link, Mapping):
            continue
        peer = link.get("peer_index")
        if link.get("up") is True and isinstance(peer, int) and peer != own:
            peers.add(peer)
    return frozenset(peers)


def domain_trays(nodes: Iterable[NodeView]) -> dict[Domain, list[tuple[NodeView, list[GpuView]]]]:
    """Each NVLink domain the nodes' GPUs report, by UUID then clique, with its trays by
    node id: each a node any of whose GPUs reports the domain, with those GPUs and the
    ones that report none (a registration not completed, counted with the others), not
    those of another domain. GET /api/v1/fabric and the /fabric page both group by it."""
    found: dict[Domain, list[tuple[NodeView, list[GpuView]]]] = defaultdict(list)
    for node in sorted(nodes, key=lambda n: n.id):
        for domain in sorted({g.domain for g in node.gpus if g.domain is not None}):
            gpus = [g for g in node.gpus if g.domain in (domain, None)]
            found[domain].append((node, gpus))
    return {d: found[d] for d in sorted(found)}
