"""Reading what happened, for people: the event log's rows (fleet/event_log.py writes
them) and the audit log's changes (tenancy), as one list, newest first, paged by a cursor.
`llmgw ctl events`, `GET /api/v1/events` and the model and node pages read it here.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from django.db.models import Q

from llmgw.core import clock
from llmgw.core.errors import Invalid
from llmgw.core.text import ago
from tenancy.selectors import audit_rows, scope_tree

from .. import models

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
