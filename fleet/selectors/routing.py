"""What the gateway routes by: the active replicas and their first endpoints, what their
engines last said, and why an on-demand model cannot start. Also read by the reconciler's
snapshot (the engines' load) and the pages."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.db.models import Count, Max

from ..domain.readings import Reading, replica_reading
from ..domain.refusals import one_line
from ..domain.types import ACTIVE, ReplicaView
from ..models import Event, ModelState, Node, Replica, Shard
from .rows import chunks
from .state import replica_views


def replica_readings(replicas: Iterable[ReplicaView] | None = None) -> dict[str, Reading]:
    """What the engines of ready replicas last said, by replica id (`replica_reading`), as
    their agents report it; a replica whose engine said nothing has no entry. Of these
    replicas, or of every ready one (the gateway's, two queries and a few per 500 nodes)."""
    if replicas is None:
        rows = Shard.objects.filter(replica__state="ready").order_by()
        shards = list(rows.values_list("replica_id", "id", "node_id"))
    else:
        shards = [(r.id, s.id, s.node_id) for r in replicas if r.state == "ready" for s in r.shards]
    if not shards:
        return {}
    said: dict[str, dict] = {}
    for chunk in chunks(sorted({node for _, _, node in shards})):
        for node_id, engines in Node.objects.filter(pk__in=chunk, state=Node.READY).values_list(
            "id", "load__engines"
        ):
            if isinstance(engines, dict):
                said[node_id] = engines
    figures: dict[str, list] = defaultdict(list)
    for replica_id, shard_id, node_id in shards:
        # A node's figures count only for shards placed on it.
        shard = said.get(node_id, {}).get(shard_id)
        if shard is not None:
            figures[replica_id].append(shard)
    out = {}
    for replica_id, found in figures.items():
        if (reading := replica_reading(found)) is not None:
            out[replica_id] = reading
    return out


def replicas_print() -> tuple:
    """(state, count, latest state change) per state, in one scan of the replicas: the
    gateway reads its routes again only when this moved."""
    rows = Replica.objects.order_by().values_list("state").annotate(Count("id"), Max("state_since"))
    return tuple(sorted(rows))


def routing_rows(*, since: datetime | None) -> list[tuple]:
    """What the gateway routes by: (id, model, profile, state, first shard's endpoint, state
    since, unhealthy) of each active replica; with `since`, of every replica whose state
    changed from then on, whatever its state now."""
    qs = Replica.objects.order_by()
    qs = qs.filter(state__in=ACTIVE) if since is None else qs.filter(state_since__gte=since)
    rows = qs.values_list("id", "model", "profile", "state", "state_since", "unhealthy_since")
    if since is None:
        endpoints = dict(
            Shard.objects.filter(rank=0, replica__state="ready").values_list(
                "replica_id", "endpoint"
            )
        )
    else:
        endpoints = _first_endpoints([r[0] for r in rows if r[3] == "ready"])
    return [
        (i, m, p, st, endpoints.get(i, ""), t, sick is not None) for i, m, p, st, t, sick in rows
    ]


def _first_endpoints(replica_ids: list[str]) -> dict[str, str]:
    """Each replica's first shard's endpoint, read in chunks the databases accept."""
    out: dict[str, str] = {}
    for chunk in chunks(replica_ids):
        out.update(
            Shard.objects.filter(replica_id__in=chunk, rank=0).values_list("replica_id", "endpoint")
        )
    return out


def on_demand_trouble(model: str) -> str | None:
    """Why an on-demand model cannot start, from the reconciler's last word: None while
    it may still come."""
    row = (
        ModelState.objects.filter(pk=model)
        .values("parked_since", "parked_reason", "unplaceable", "explanation")
        .first()
    )
    if row is None:
        return None
    if row["parked_since"]:
        return f"parked: {row['parked_reason'] or 'it failed to start too often'}"
    if row["unplaceable"]:
        first = one_line(row["explanation"] or [])
        return f"no room: {first or 'no node can take it now'}"
    return None


def adapters_held(*, model: str | None = None) -> dict[str, tuple[str, ...]]:
    """The adapters each ready replica (of `model`, or every one) holds, by replica id, as
    its engine last said (`Reading.adapters`); a replica whose engine said nothing of them
    is left out: unknown, not none."""
    replicas = None if model is None else replica_views(model=model)
    return {
        replica_id: tuple(name for name, _ in reading.adapters)
        for replica_id, reading in replica_readings(replicas).items()
        if reading.adapters is not None
    }


def adapter_said(*, adapter: str, since: datetime) -> tuple[str, str, str] | None:
    """What agents last said of loading `adapter` since `since` (their adapter_status, kept
    as events naming it): ("loaded" or "failed", the replica, the sentence with the
    engine's words); None when nothing yet."""
    row = (
        Event.objects.filter(
            model=adapter, kind__in=("adapter_loaded", "adapter_failed"), last_at__gte=since
        )
        .order_by("-last_at", "-id")
        .values_list("kind", "replica", "message")
        .first()
    )
    return (row[0].removeprefix("adapter_"), row[1], row[2]) if row else None
