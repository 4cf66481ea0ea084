"""What a node's agent says of its GPU fabric (fleet/agent/fabric.py), recorded: each GPU's
report and the node's IMEX and InfiniBand ports, and whether placement reads anything new
of them (what only ticks on a healthy GPU does not move the node's spec)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from ..models import Gpu, Node
from ..protocol import (
    NVLINK_ERRORS,
    Fabric,
)
from .figures import node_figures_refresh


def gpu_reports(fabric: Fabric | None) -> dict[int, dict]:
    """Each GPU's report as its Gpu row keeps it (`fabric`), by index: the protocol's
    GpuFabricReport without its index and without what it did not say (absent, or its default)."""
    if fabric is None:
        return {}
    return {g.index: g.model_dump(exclude={"index"}, exclude_defaults=True) for g in fabric.gpus}


def node_fabric(fabric: Fabric | None) -> tuple[dict | None, list[dict] | None]:
    """The node's IMEX and InfiniBand ports as its row keeps them (`imex`, `ib_ports`)."""
    if fabric is None:
        return None, None
    imex = fabric.imex.model_dump(exclude_defaults=True) if fabric.imex is not None else None
    ports = fabric.ib_ports
    return imex, [p.model_dump(exclude_defaults=True) for p in ports] if ports is not None else None


def gpu_fabric_write(gpus: list[Gpu], reports: dict[int, dict]) -> bool:
    """Give each of the node's Gpu rows its report; whether any changed."""
    changed = [g for g in gpus if g.fabric != reports.get(g.index)]
    for g in changed:
        g.fabric = reports.get(g.index)
    if changed:
        Gpu.objects.bulk_update(changed, ["fabric"])
    return bool(changed)


def node_fabric_record(*, node_id: str, fabric: Fabric, now: datetime) -> None:
    """What a heartbeat says of the node's fabric (it says so only when it changed): each
    GPU's report, IMEX and the InfiniBand ports. ``fabric_at`` moves with it (the metrics'
    cached series are keyed by it); ``spec_at`` only when what placement reads of it
    changed, as at a registration: the node's number moves (migration 0015) and the
    reconciler builds its view again. Error counters that tick every few seconds on a
    large fleet must not rebuild views each time."""
    with transaction.atomic():
        node = Node.objects.filter(pk=node_id).only("imex").first()
        if node is None:
            return
        gpus = list(Gpu.objects.filter(node_id=node_id))
        before = _placed_by(node.imex, {g.index: g.fabric for g in gpus})
        imex, ports = node_fabric(fabric)
        reports = gpu_reports(fabric)
        fields = {"imex": imex, "ib_ports": ports, "fabric_at": now}
        placed_changed = _placed_by(imex, {g.index: reports.get(g.index) for g in gpus}) != before
        if placed_changed:
            fields["spec_at"] = now
        Node.objects.filter(pk=node_id).update(**fields)
        gpu_fabric_write(gpus, reports)
        if placed_changed:
            # A problem come or gone changes the GPUs the cluster page counts free.
            node_figures_refresh(nodes=[node_id])


# What placement does not read of a GPU's report (fleet/domain/fabric.py): counts that
# tick on a healthy GPU. Uncorrected volatile ECC errors, pending repairs, Xids, the
# fabric's state and the links' up and peers it does.
_TICKING = {
    "nvlinks": NVLINK_ERRORS,
    "ecc": ("corrected_volatile", "corrected_aggregate"),
}


def _placed_by(imex: dict | None, reports: dict[int, dict | None]) -> tuple:
    """The parts of a node's fabric placement reads: IMEX's state, and each GPU's report
    without its ticking counters."""

    def steady(report: dict | None):
        if not isinstance(report, dict):
            return report
        out = dict(report)
        if isinstance(out.get("ecc"), dict):
            out["ecc"] = {k: v for k, v in out["ecc"].items() if k not in _TICKING["ecc"]}
        if isinstance(out.get("nvlinks"), list):
            out["nvlinks"] = [
                {k: v for k, v in ln.items() if k not in _TICKING["nvlinks"]}
                if isinstance(ln, dict)
                else ln
                for ln in out["nvlinks"]
            ]
        return out

    state = imex.get("state") if isinstance(imex, dict) else None
    return state, {i: steady(r) for i, r in sorted(reports.items())}
