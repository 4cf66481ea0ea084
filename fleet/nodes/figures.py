"""The figures the cluster page derives per node, kept in the node's own columns.

A node's GPUs total and free, their classes and the replicas it runs come from its Gpu
rows, its labels and the holding replicas' shards. Worked out per request they were most
of the page at 5,000 nodes (in SQL too: a subquery over shards and GPUs cost 50 ms on
SQLite), so every writer that changes one of those rows calls `node_figures_refresh` in
its own transaction, and the page sorts, filters and counts by the columns.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from django.db import connection, transaction

from ..domain.gpuclass import CLASS_LABEL
from ..domain.types import HOLDING, GpuView
from ..models import Gpu, Node, Shard
from ..selectors.rows import chunks
from ..selectors.state import gpu_fabric_fields


class NodeFigures(NamedTuple):
    """What the page shows of a node's GPUs and replicas; gpu_free is None without GPUs."""

    gpu_total: int
    gpu_free: int | None
    gpu_classes: list[str]
    replica_count: int


def node_figures(
    labels: Mapping | None,
    gpus: Iterable[tuple[int, str, bool]],
    held: Iterable[tuple[str, Iterable[int]]],
) -> NodeFigures:
    """A node's figures from its labels, its GPUs (index, class, in service) and the shards
    of holding replicas on it (replica id, GPU indices).

    A GPU is free when it is in service (`gpu_in_service`: healthy, no problem, not
    cordoned) and no holding replica has it, as placement and `nodes_list` count it; a
    class label names every GPU's class, as placement sees them.
    """
    override = labels.get(CLASS_LABEL) if isinstance(labels, Mapping) else None
    used: set[int] = set()
    replicas: set[str] = set()
    for replica_id, indices in held:
        used.update(indices or ())
        replicas.add(replica_id)
    gpus = list(gpus)
    return NodeFigures(
        gpu_total=len(gpus),
        gpu_free=sum(1 for i, _, serving in gpus if serving and i not in used) if gpus else None,
        gpu_classes=sorted({override or c for _, c, _ in gpus}),
        replica_count=len(replicas),
    )


def gpu_in_service(
    node_id: str, index: int, healthy: bool, fabric: Mapping | None, cordoned: bool
) -> bool:
    """Whether placement may give the GPU out once no replica holds it, by placement's own
    rule (`GpuView.free_to_place`): a problem in its fabric report or a cordon keeps it
    from new replicas, so the page must not count it free."""
    fields = gpu_fabric_fields(node_id, index, fabric, cordoned=cordoned)
    return GpuView(index=index, gpu_class="", healthy=healthy, **fields).free_to_place


def node_figures_refresh(*, nodes: Iterable[str] = (), replicas: Iterable[str] = ()) -> None:
    """Work the figures out again for these nodes and those the replicas' shards are on.

    Call it in the writer's transaction, after its writes. The nodes' rows are locked
    first, in id order: on PostgreSQL two writers for one node then read one after the
    other, so the later never writes figures from before the earlier committed.
    """
    ids = set(nodes)
    replica_ids = list(set(replicas))
    for chunk in chunks(replica_ids):
        ids.update(Shard.objects.filter(replica_id__in=chunk).values_list("node_id", flat=True))
    if not ids:
        return
    with transaction.atomic():
        for chunk in chunks(sorted(ids)):
            _refresh(chunk)


def _refresh(ids: list[str]) -> None:
    current = {
        row[0]: row[1:]
        for row in Node.objects.select_for_update()
        .filter(pk__in=ids)
        .order_by("pk")
        .values_list("id", "labels", "gpu_total", "gpu_free", "gpu_classes", "replica_count")
    }
    gpus: dict[str, list[tuple]] = defaultdict(list)
    for node_id, index, cls, healthy, fabric, cordoned in (
        Gpu.objects.filter(node_id__in=current)
        .order_by()
        .values_list("node_id", "index", "gpu_class", "healthy", "fabric", "cordoned")
    ):
        serving = gpu_in_service(node_id, index, healthy, fabric, cordoned)
        gpus[node_id].append((index, cls, serving))
    held: dict[str, list[tuple]] = defaultdict(list)
    for node_id, replica_id, indices in (
        Shard.objects.filter(node_id__in=current, replica__state__in=HOLDING)
        .order_by()
        .values_list("node_id", "replica_id", "gpu_indices")
    ):
        held[node_id].append((replica_id, indices))
    changed = []
    for node_id, (labels, *was) in current.items():
        now = node_figures(labels, gpus[node_id], held[node_id])
        if tuple(now) != tuple(was):
            changed.append((now, node_id))
    _write(changed)


def _write(changed: list[tuple[NodeFigures, str]]) -> None:
    """One prepared UPDATE run for every changed node, as fleet.nodes.reports._write_live does."""
    if not changed:
        return
    classes = Node._meta.get_field("gpu_classes")
    rows = [
        (f.gpu_total, f.gpu_free, classes.get_db_prep_save(f.gpu_classes, connection),
         f.replica_count, node_id)
        for f, node_id in changed
    ]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {Node._meta.db_table} SET gpu_total = %s, gpu_free = %s, gpu_classes = %s,"
            " replica_count = %s WHERE id = %s",
            rows,
        )
