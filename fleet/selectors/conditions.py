"""The facility domains' conditions and holds, read: for the reconciler's snapshot
(`facility_load`), and for people (`conditions_list`: `ctl facility`, the Racks table,
`/metrics`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.core.cache import cache
from django.db.models import Exists, OuterRef, Subquery

from llmgw.core import clock

from ..domain.conditions import Facility, Hold, State, said
from ..facility.observe import FAILURES_KEY, state_of
from ..models import DomainCondition, DomainHold


def holds_load() -> tuple[Hold, ...]:
    return tuple(
        Hold(k, n, r, b)
        for k, n, r, b in DomainHold.objects.values_list("kind", "name", "reason", "held_by")
    )


def facility_load(now: datetime | None = None) -> Facility | None:
    """What placement reads: the warm and hot domains' states and every hold, and whether
    conditions are enforced. Two small queries; None when no domain is warm, hot or held."""
    rows = DomainCondition.objects.filter(condition__in=("warm", "hot"))
    states = {(r.kind, r.name): state_of(r) for r in rows}
    holds = holds_load()
    if not states and not holds:
        return None
    at = (now or clock.now()).timestamp()
    shed_at = {(r.kind, r.name): r.shed_at.timestamp() for r in rows if r.shed_at is not None}
    return Facility(
        states, holds, settings.LLMGW.facility_enforce, at, settings.LLMGW.facility_shed, shed_at
    )


@dataclass(frozen=True)
class DomainSaid:
    """A domain's condition and hold as people see them."""

    kind: str
    name: str
    condition: str
    said: str
    since: datetime | None
    read_at: datetime | None
    age_s: float | None
    held_by: str = ""
    hold_reason: str = ""
    held: bool = False

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "condition": self.condition,
            "said": self.said,
            "since": self.since,
            "reading_age_s": self.age_s,
            "held": self.held,
            "held_by": self.held_by,
            "hold_reason": self.hold_reason,
        }


def conditions_list(now: datetime | None = None) -> list[DomainSaid]:
    """Every domain with a condition row or a hold, by kind and name: two queries."""
    now = now or clock.now()
    at = now.timestamp()
    holds = {(h.kind, h.name): h for h in holds_load()}
    out: dict[tuple[str, str], DomainSaid] = {}
    for row in DomainCondition.objects.all():
        d = (row.kind, row.name)
        h = holds.get(d)
        age = (now - row.read_at).total_seconds() if row.read_at is not None else None
        out[d] = DomainSaid(
            row.kind, row.name, row.condition, said(d, state_of(row), at), row.since,
            row.read_at, age, h.by if h else "", h.reason if h else "", h is not None,
        )  # fmt: skip
    for d, h in holds.items():
        if d not in out:
            out[d] = DomainSaid(
                d[0], d[1], "unknown", said(d, State(), at), None, None, None, h.by, h.reason, True
            )
    return [out[d] for d in sorted(out)]


@dataclass(frozen=True)
class RackCondition:
    """A rack's or PDU's condition and hold, for a row of the cluster page's Racks table."""

    condition: str
    said: str
    held: str = ""


def rack_conditions(now: datetime | None = None) -> dict[tuple[str, str], RackCondition]:
    """Each rack's, PDU's and held phase's condition and hold, by (kind, name): one query (a
    hold makes its domain's row, services.domain_hold)."""
    at = (now or clock.now()).timestamp()
    held = DomainHold.objects.filter(kind=OuterRef("kind"), name=OuterRef("name"))
    rows = DomainCondition.objects.filter(kind__in=("rack", "pdu", "phase")).annotate(
        held_by=Subquery(held.values("held_by")[:1]),
        hold_reason=Subquery(held.values("reason")[:1]),
        is_held=Exists(held),
    )
    out = {}
    for row in rows:
        d = (row.kind, row.name)
        hold = ""
        if row.is_held:
            hold = f"held by {row.held_by or 'an operator'}"
            hold += f": {row.hold_reason}" if row.hold_reason else ""
        out[d] = RackCondition(row.condition, said(d, state_of(row), at), hold)
    return out


def rack_condition(
    conditions: dict[tuple[str, str], RackCondition], kind: str, name: str
) -> RackCondition | None:
    """A Racks table row's condition (None: never read nor held). A PDU phase has none of
    its own: it shows its PDU's, with its own hold."""
    own = conditions.get((kind, name))
    if kind != "phase":
        return own
    pdu = conditions.get(("pdu", name.rpartition("/")[0]))
    if pdu is None:
        return own
    return RackCondition(pdu.condition, pdu.said, own.held if own is not None else "")


def sources_failed() -> dict:
    """What the last facility step found wrong with the sources: per source, why in a
    sentence and since when; `checked_at` None when no step has said (none ran here yet)."""
    found = cache.get(FAILURES_KEY)
    if not isinstance(found, dict):
        return {"checked_at": None, "failed": []}
    when = lambda at: datetime.fromtimestamp(at, UTC)  # noqa: E731
    return {
        "checked_at": when(found["at"]),
        "failed": [f | {"since": when(f["since"])} for f in found.get("failed", ())],
    }
