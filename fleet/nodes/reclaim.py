"""Reclaim: tell agents to delete cached weights no replica on them uses, once unused for
LLMGW_WEIGHTS_KEEP_DAYS or while their free disk is under LLMGW_WEIGHTS_DISK_FLOOR_GB
(the rule is mirror.domain.reclaim). Run from the reconciler's pass, a few times an hour."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.conf import settings

from catalog.selectors import model_sources
from mirror.domain.reclaim import Cached, reclaim
from mirror.selectors import digests_by_source

from ..models import Node, Shard
from .dispatch import Command

log = logging.getLogger("llmgw.fleet")

RECLAIM_EVERY_S = 300.0
_last_run = {"at": float("-inf")}


def weights_reclaim(*, now: datetime, force: bool = False) -> list[Command]:
    """The delete_weights commands due now; [] when it ran less than RECLAIM_EVERY_S ago."""
    if not force and time.monotonic() - _last_run["at"] < RECLAIM_EVERY_S:
        return []
    _last_run["at"] = time.monotonic()
    nodes = list(
        Node.objects.filter(state=Node.READY)
        .exclude(weights=[])
        .values_list("id", "weights", "disk_free_gb")
    )
    if not nodes:
        return []
    cfg = settings.LLMGW.mirror
    digest_of = digests_by_source(model_sources())
    models_on = defaultdict(set)
    for node_id, model in Shard.objects.filter(node_id__in=[n for n, _, _ in nodes]).values_list(
        "node_id", "replica__model"
    ):
        models_on[node_id].add(model)
    commands = []
    for node_id, weights, free_gb in nodes:
        cached = [_cached(w) for w in weights or () if isinstance(w, dict) and w.get("sha256")]
        in_use = {d for m in models_on[node_id] for d in digest_of.get(m, ())}
        gone = reclaim(
            cached,
            in_use=in_use,
            now=now,
            keep=timedelta(days=cfg.keep_days),
            free_bytes=None if free_gb is None else int(free_gb * (1 << 30)),
            floor_bytes=int(cfg.disk_floor_gb * (1 << 30)),
        )
        for r in gone:
            log.info(
                "node %s deletes cached weights %s: %s",
                node_id,
                r.sha256[:12],
                r.why,
                extra={"node": node_id, "event": "weights_reclaimed"},
            )
        if gone:
            commands.append(
                Command(node_id, {"type": "delete_weights", "sha256": [r.sha256 for r in gone]})
            )
    return commands


def _cached(w: dict) -> Cached:
    used = w.get("used_at")
    when = datetime.fromtimestamp(used, UTC) if isinstance(used, int | float) else None
    return Cached(sha256=w["sha256"], size=int(w.get("size") or 0), used_at=when)
