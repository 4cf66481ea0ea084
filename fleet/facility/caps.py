"""GPU power capping, the gentler alternative to shedding (docs/facility.md, "Power
capping"): when a domain's condition changes, each node whose domains are now warm or hot,
or no longer, is told to hold its GPUs to a share of their default power limit, or to let
them go (the agent's `power_cap` command, fleet/agent/sensors.py). Under observe-only each
is said and nothing is sent.

Kept, not only sent on a change: a node that joins a warm rack, whose driver reloads, or
that was away when its cap was sent reports a limit that is not the one wanted, and is sent
its cap again, at most once per fleet.domain.capping.RESEND_S (capping.py says how the
limits are compared). What each node was last sent, when, and the share llmgw held it to
are kept in the cache (Redis where there is one), so reconcilers in several processes do
not each send it, and a let-go is sent again only to a node llmgw's own record says it
held: the record of a node let go stays until its heartbeat shows the let-go.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.core.cache import cache

from ..domain import capping
from ..domain.conditions import Domain, domains_of
from ..domain.plan import Event
from ..domain.shedding import power_caps
from ..models import DomainCondition, Node
from ..nodes.dispatch import Command

log = logging.getLogger("llmgw.facility")

# {node: [share, at, held]}: the cap last sent, when, and the share llmgw holds it to.
SENT_KEY = "llmgw:facility:power_caps_sent"

Nodes = dict[str, tuple[tuple[Domain, ...], str, list[dict]]]  # id: (domains, state, GPUs)
Sent = dict[str, capping.Sent]  # id: what llmgw last sent it


def caps_decide(changes: list[Event], now: datetime) -> tuple[list[Command], list[Event]]:
    """The power_cap commands this step calls for, and an event each: those its condition
    changes call for, then those of nodes whose GPUs still report the wrong limit."""
    share = settings.LLMGW.facility_power_cap
    if share is None:
        return [], []
    changed = [e for e in changes if e.kind == "facility_condition"]
    enforce = settings.LLMGW.facility_enforce
    if not changed and not enforce:
        return [], []  # observe-only sends nothing, so there is nothing to keep
    after: dict[Domain, str] = {
        (k, n): c
        for k, n, c in DomainCondition.objects.filter(condition__in=("warm", "hot")).values_list(
            "kind", "name", "condition"
        )
    }
    nodes: Nodes = {
        n: (domains_of(labels or {}), state, gpus or [])
        for n, labels, state, gpus in Node.objects.values_list(
            "id", "labels", "state", "load__gpus"
        )
    }
    at = now.timestamp()
    sent = _sent_load()
    kept = dict(sent)
    commands, events = _on_change(changed, after, nodes, share, enforce, sent, at)
    if enforce:
        kept_commands, kept_events = _kept(after, nodes, share, sent, at)
        commands += kept_commands
        events += kept_events
    if sent != kept:
        cache.set(SENT_KEY, {n: [s.share, s.at, s.held] for n, s in sent.items()}, timeout=None)
    return commands, events


def _sent_load() -> Sent:
    """The record in the cache; one written before it kept `held` ([share, at]) counts the
    share it last sent as the one it held."""
    out: Sent = {}
    for node, v in (cache.get(SENT_KEY) or {}).items():
        out[node] = capping.Sent(v[0], v[1], v[2] if len(v) > 2 else v[0])
    return out


def _on_change(
    changed: list[Event],
    after: dict[Domain, str],
    nodes: Nodes,
    share: float,
    enforce: bool,
    sent: Sent,
    at: float,
) -> tuple[list[Command], list[Event]]:
    """A cap for each node whose domains turned warm or hot, or cooled: sent whatever its
    GPUs report (a GPU that reports no limit is known only this way)."""
    if not changed:
        return [], []
    before = dict(after)
    for e in changed:
        kind, name = e.fields["domain"].split(":", 1)
        before[(kind, name)] = e.fields.get("was", "unknown")
    domains = {n: ds for n, (ds, _, _) in nodes.items()}
    commands: list[Command] = []
    events: list[Event] = []
    for node, cap in power_caps(before, after, domains, share).items():
        said = (
            f"held node {node}'s GPUs to {cap:.0%} of their default power limit: "
            "it is in a warm or hot domain"
            if cap is not None
            else f"let node {node}'s GPUs back to their default power limit: "
            "none of its domains is warm or hot"
        )
        if enforce:
            commands.append(_send(node, cap, sent, at))
        else:
            said = f"would have {said} (LLMGW_FACILITY_ENFORCE is off)"
        events.append(_event(said, node, cap))
    return commands, events


def _kept(
    after: dict[Domain, str], nodes: Nodes, share: float, sent: Sent, at: float
) -> tuple[list[Command], list[Event]]:
    """A cap sent again to each ready node whose GPUs report a limit that is not it (a
    let-go only to a node llmgw held); the record of a node whose let-go is seen goes."""
    reported = {
        n: (capping.wanted(after, ds, share), [capping.Limit.of(g) for g in gpus])
        for n, (ds, state, gpus) in nodes.items()
        if state == Node.READY and gpus
    }
    for node in capping.released(reported, sent):
        del sent[node]
    commands: list[Command] = []
    events: list[Event] = []
    for r in capping.resends(reported, share, sent, at):
        commands.append(_send(r.node, r.share, sent, at))
        events.append(_event(capping.said(r), r.node, r.share))
    return commands, events


def _send(node: str, cap: float | None, sent: Sent, at: float) -> Command:
    sent[node] = (sent.get(node) or capping.Sent(None, at)).then(cap, at)
    return Command(node, {"type": "power_cap", "share": cap})


def _event(said: str, node: str, cap: float | None) -> Event:
    event = Event(said, "facility_power_cap", node=node, share=cap)
    log.info(event, extra={"event": event.kind, **event.fields})
    return event


def caps_clear() -> None:
    """Forget when each node was last sent its cap (the tests start afresh)."""
    cache.delete(SENT_KEY)
