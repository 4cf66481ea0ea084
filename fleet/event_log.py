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
the audit log is kept.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import F, Q

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


# Reading: one list of both sources, newest first, paged by a cursor.

# Who changed what, as the audit log names its actions: the verb of each sentence.
_DONE = {
    "add": "added",
    "remove": "removed",
    "update": "updated",
    "scale": "scaled",
    "class": "given a class",
    "owner": "given an owner",
    "resources": "given resources",
    "restart": "restarted",
    "retry": "retried",
    "measure": "measured",
    "approve": "approved",
    "forget": "forgotten",
    "set": "set",
    "clear": "cleared",
    "revoke": "revoked",
    "rename": "renamed",
}
# Changes whose detail is a whole spec, said without it.
_WHOLE = frozenset({"add", "update"})
PAGE_MOST = 500


def events_page(
    *,
    model: str | None = None,
    node: str | None = None,
    since: datetime | None = None,
    before: str | None = None,
    limit: int = 50,
) -> dict:
    """Up to `limit` events about `model` and/or `node` (every one when neither), at `since`
    or later, older than the cursor `before` (a page's `next`), newest first; with `next`,
    the cursor of the page after, None at the end. Invalid for a cursor that is not one."""
    from tenancy.selectors import audit_rows, scope_tree

    limit = max(1, min(int(limit), PAGE_MOST))
    cut = _cursor(before) if before else None
    rows = models.Event.objects.all()
    if model:
        rows = rows.filter(model=model)
    if node:
        rows = rows.filter(node=node)
    if since is not None:
        rows = rows.filter(last_at__gte=since)
    if cut is not None:
        at, source, pk = cut
        older = Q(last_at__lt=at) | (Q(last_at=at, pk__lt=pk) if source == 1 else Q(pk__in=[]))
        rows = rows.filter(older)
    said = [_said(r) for r in rows.order_by("-last_at", "-id")[: limit + 1]]
    if not (model and node):  # nobody's change is about a model and a node at once
        target = model or node
        prefix = "model." if model else "node." if node else ""
        changes = audit_rows(
            prefix=prefix,
            target=target,
            since=since,
            before=None if cut is None else cut[0] + _TICK,
            limit=limit + 1 + (0 if cut is None else PAGE_MOST),
        )
        # Said by the names an operator types (team:Acme/ml), not the keys kept (team:7).
        named = any(_SCOPE.match(c[4]) or _scope_in(c[5]) for c in changes)
        names = scope_tree().names if named else {}
        told = (_changed(c, names) for c in changes)
        said += [c for c in told if cut is None or _key(c) < cut][: limit + 1]
    said.sort(key=_key, reverse=True)
    page = said[:limit]
    more = len(said) > limit
    return {"events": [_shown(e) for e in page], "next": _cursor_text(page[-1]) if more else None}


def recent(*, model: str | None = None, node: str | None = None, limit: int = 20) -> list[dict]:
    """The newest events about a model or a node, for its page: times as datetimes, and
    `ago`, the last time said as "3 min ago"."""
    from llmgw.core import clock
    from llmgw.core.text import ago

    now = clock.now()
    out = []
    for e in events_page(model=model, node=node, limit=limit)["events"]:
        at, last = datetime.fromisoformat(e["at"]), datetime.fromisoformat(e["last_at"])
        out.append(e | {"at": at, "last_at": last, "ago": ago(last, now)})
    return out


_TICK = timedelta(microseconds=1)


def _key(e: dict) -> tuple:
    return (e["last_at"], e["source"], e["pk"])


def _said(r: models.Event) -> dict:
    return {
        "source": 1,
        "pk": r.pk,
        "last_at": r.last_at,
        "at": r.at,
        "count": r.count,
        "kind": r.kind,
        "model": r.model,
        "node": r.node,
        "replica": r.replica,
        "message": r.message,
        "by": "",
    }


# The key of a part of the tenancy tree, as changes to it are kept.
_SCOPE = re.compile(r"^(org|team|project):\d+$")


def _scope_in(detail: object) -> bool:
    """Whether a change's figures name a part of the tenancy tree (a model's owner)."""
    return isinstance(detail, dict) and any(
        isinstance(v, str) and _SCOPE.match(v) for v in detail.values()
    )


def _changed(row: tuple, names: dict[str, str]) -> dict:
    pk, at, actor, action, target, detail = row
    noun, _, verb = action.partition(".")
    target = names.get(target, target)
    if target.startswith(f"{noun}:"):  # "org Acme added", not "org org:Acme added"
        target = target[len(noun) + 1 :]
    figures = ", ".join(
        f"{k} {names.get(v, v) if isinstance(v, str) else v}"
        for k, v in (detail or {}).items()
        if isinstance(v, str | int | float)
    )
    sentence = f"{noun} {target} {_DONE.get(verb, verb)} by {actor}"
    if verb in _WHOLE:  # its figures are the whole spec: the model page shows those
        figures = ""
    return {
        "source": 0,
        "pk": pk,
        "last_at": at,
        "at": at,
        "count": 1,
        "kind": action,
        "model": target if noun == "model" else "",
        "node": target if noun == "node" else "",
        "replica": "",
        "message": f"{sentence}: {figures}"[:500] if figures else sentence,
        "by": actor,
    }


def _shown(e: dict) -> dict:
    out = {k: v for k, v in e.items() if k not in ("source", "pk")}
    out["last_at"], out["at"] = e["last_at"].isoformat(), e["at"].isoformat()
    return out


def _cursor_text(e: dict) -> str:
    return f"{e['last_at'].isoformat()}~{e['source']}~{e['pk']}"


def _cursor(text: str) -> tuple[datetime, int, int]:
    from llmgw.core.errors import Invalid

    try:
        at, source, pk = text.split("~")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None or source not in ("0", "1"):
            raise ValueError
        return when, int(source), int(pk)
    except (ValueError, OverflowError):
        raise Invalid(
            f"before must be the `next` of a page of events, not {text[:80]!r}."
        ) from None
