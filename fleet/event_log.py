"""What happened to each model, replica and node, kept for people to read: `llmgw ctl
events`, the model and node pages, `GET /api/v1/events`.

Two sources, one list, newest first:

- the reconciler's decisions (placed, preempted for whom, failed with its cause, parked,
  cannot be placed and why, scaled, restarted, a node's state) and what agents report of
  their shards (fetching, starting, ready, failed with the engine's own line), written
  here as they happen; the same sentence again about the same thing counts on its last
  row (`count`, `last_at`) instead of adding one, so a model that stays unplaceable is one
  row however many passes say so;
- who changed what (scaled, class, owner, drained, approved, quotas and limits): the
  audit log (tenancy), read beside them.

Rows older than LLMGW_EVENTS_KEEP_DAYS are deleted by the reconciler, at most hourly;
the audit log is kept. Reading them (both sources, one list) is fleet/selectors/events.py.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import F

from . import models
from .domain.plan import Event

# (kind, model, node, replica) -> (row id, message, last said) of the latest row this
# process wrote or read.
_last: OrderedDict[tuple[str, str, str, str], tuple[int, str, datetime]] = OrderedDict()
_LAST_MAX = 20_000
_remembering = threading.Lock()
EXPIRE_EVERY_S = 3600.0
_expired_at = float("-inf")


def record(events: Iterable[Event | str], *, now: datetime) -> None:
    """Keep each event (fleet.domain.plan.Event, or a plain sentence such as a stop's
    reason): a new row, or one more on the latest row about the same thing when it says the
    same (within REPEAT_WITHIN: after that it is told again)."""
    keyed = [(_subject(e), e) for e in events]
    if not keyed:
        return
    _recall([key for key, _ in keyed if key not in _last], now)
    again: dict[int, tuple[tuple, Event | str]] = {}
    new: list[tuple[tuple, models.Event]] = []
    for key, h in keyed:
        last = _last.get(key)
        if last is not None and last[1] == str(h) and now - last[2] < REPEAT_WITHIN:
            again[last[0]] = (key, h)
            _remember(key, (last[0], last[1], now))
            continue
        new.append((key, _row(key, h, now)))
        _last.pop(key, None)  # a second sentence in this batch is a row of its own
    if again:
        rows = models.Event.objects.filter(pk__in=list(again))
        if rows.update(count=F("count") + 1, last_at=now) < len(again):
            # Some were deleted meanwhile (kept too long, by another process): told anew.
            there = set(rows.values_list("pk", flat=True))
            new += [(key, _row(key, h, now)) for pk, (key, h) in again.items() if pk not in there]
    if new:
        models.Event.objects.bulk_create([row for _, row in new])
        for key, row in new:
            if row.pk is not None:  # else found in the database next time
                _remember(key, (row.pk, row.message, now))


def _row(key: tuple, event: Event | str, now: datetime) -> models.Event:
    return models.Event(
        at=now,
        last_at=now,
        kind=key[0],
        model=key[1],
        node=key[2],
        replica=key[3],
        message=str(event),
        fields=_plain(getattr(event, "fields", None) or {}),
    )


REPEAT_WITHIN = timedelta(days=1)


def _subject(event: Event | str) -> tuple[str, str, str, str]:
    """What an event is about, from its figures: its kind, model, node and replica (a
    replica over several nodes is told under the first, docs/events.md); a plain sentence
    is a decision about nothing named."""
    fields = getattr(event, "fields", None) or {}
    nodes = fields.get("nodes") or ()
    node = fields.get("node") or (nodes[0] if nodes else "")
    kind = getattr(event, "kind", "") or "decision"
    return (
        kind[:40],
        str(fields.get("model") or "")[:64],
        str(node)[:64],
        str(fields.get("replica") or "")[:80],
    )


def _recall(keys: list[tuple], now: datetime) -> None:
    """The latest rows of subjects this process has not written, read in one query per
    few hundred (a pass that says something of every node of a fleet just started)."""
    for i in range(0, len(keys), 500):
        chunk = set(keys[i : i + 500])
        rows = models.Event.objects.filter(
            last_at__gte=now - REPEAT_WITHIN,
            kind__in={k[0] for k in chunk},
            model__in={k[1] for k in chunk},
            node__in={k[2] for k in chunk},
            replica__in={k[3] for k in chunk},
        ).order_by("last_at", "id")
        for pk, kind, model, node, replica, message, at in rows.values_list(
            "id", "kind", "model", "node", "replica", "message", "last_at"
        ):
            key = (kind, model, node, replica)
            if key in chunk:
                _remember(key, (pk, message, at))


def expire(*, now: datetime, keep_days: float) -> int:
    """Delete rows last said more than `keep_days` ago, at most once an hour a process;
    how many went."""
    global _expired_at
    if time.monotonic() - _expired_at < EXPIRE_EVERY_S:
        return 0
    _expired_at = time.monotonic()
    gone, _ = models.Event.objects.filter(last_at__lt=now - timedelta(days=keep_days)).delete()
    _last.clear()
    return gone


def _remember(key: tuple, last: tuple[int, str, datetime]) -> None:
    # Several threads record (the pass, the agents' calls, the heartbeats' writer): the
    # steps together, never around a database call.
    with _remembering:
        _last[key] = last
        _last.move_to_end(key)
        while len(_last) > _LAST_MAX:
            _last.popitem(last=False)


def _plain(fields: dict) -> dict:
    """Figures as JSON holds them: a datetime as its ISO text, anything else odd as text."""
    out = {}
    for k, v in fields.items():
        if isinstance(v, datetime):
            v = v.isoformat()
        elif isinstance(v, tuple | set | frozenset):
            v = list(v)
        elif not isinstance(v, str | int | float | bool | list | dict | type(None)):
            v = str(v)
        out[str(k)] = v
    return out
