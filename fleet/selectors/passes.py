"""What the reconciler says of its own passes: when the last began, whether it settles, why
passes stopped, and the drains that cannot go on for lack of room. Read by the API, ctl,
the model listings and the pages."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings

from ..domain.drains import drain_stuck
from ..domain.refusals import one_line
from ..domain.types import ACTIVE, ReplicaView
from ..models import ModelState, Node, Shard


def reconciler_status(*, now: datetime) -> dict:
    """When the last pass began, whether it settles, and a sentence when passes stopped
    (fleet/domain/passes.py): what `ctl models`, the cluster page and GET /reconciler say."""
    from ..domain.passes import stale_warning
    from ..models import Lease

    row = (
        Lease.objects.filter(pk="reconciler")
        .values_list("last_pass_at", "settle_until", "served_since")
        .first()
    )
    last_pass_at, settle_until, served_since = row or (None, None, None)
    cfg = settings.LLMGW
    return {
        "last_pass_at": last_pass_at,
        "settling": settle_until is not None and now < settle_until,
        "interval_s": cfg.timings.reconcile_interval,
        "warning": stale_warning(
            now=now,
            last_pass_at=last_pass_at,
            served_since=served_since,
            embedded=cfg.embedded,
            t=cfg.timings,
        ),
    }


def drains_stuck(
    *, replicas: Iterable[ReplicaView] | None = None, model: str | None = None
) -> dict[str, str]:
    """Each draining node whose drain cannot go on for lack of room, with the sentence that
    says why and when its replicas stop without a replacement (domain/drains.py); with
    `model`, only that model's part of each. `replicas` are views already read (the
    cluster page's); without them one query reads the drain's replicas. No more query
    while no drain retires a replica."""
    if replicas is None:
        rows = Shard.objects.filter(
            replica__retiring=True, replica__drain_deadline__isnull=False, replica__state__in=ACTIVE
        )
        if model is not None:
            rows = rows.filter(replica__model=model)
        retiring = list(
            rows.values_list("node_id", "replica_id", "replica__model", "replica__drain_deadline")
        )
    else:
        retiring = [
            (s.node_id, r.id, r.model, r.drain_deadline)
            for r in replicas
            if r.retiring
            and r.drain_deadline is not None
            and r.state in ACTIVE
            and model in (None, r.model)
            for s in r.shards
        ]
    if not retiring:
        return {}
    nodes = {node for node, *_ in retiring}
    draining = set(Node.objects.filter(pk__in=nodes, draining=True).values_list("pk", flat=True))
    models = {m for node, _, m, _ in retiring if node in draining}
    why = {
        m: one_line(explanation or [])
        for m, explanation in ModelState.objects.filter(
            model__in=models, unplaceable=True
        ).values_list("model", "explanation")
    }
    per_node: dict[str, list[tuple[str, str, datetime | None]]] = defaultdict(list)
    for node, replica_id, m, deadline in sorted(retiring):
        if node in draining:
            per_node[node].append((replica_id, m, deadline))
    said = {node: drain_stuck(items, why) for node, items in sorted(per_node.items())}
    return {node: sentence for node, sentence in said.items() if sentence}
