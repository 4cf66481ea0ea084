"""GPU power capping, the gentler alternative to shedding (docs/facility.md, "Power
capping"): when a domain's condition changes, each node whose domains are now warm or hot,
or no longer, is told to hold its GPUs to a share of their default power limit, or to let
them go (the agent's `power_cap` command, fleet/agent/sensors.py). Under observe-only each
is said and nothing is sent.

Sent on a change only: a limit set through NVML holds until the driver is reloaded, so an
agent that reconnects keeps it; a node that joins a warm rack later is not capped until its
rack's condition next changes.
"""

from __future__ import annotations

import logging

from django.conf import settings

from ..domain.conditions import Domain, domains_of
from ..domain.plan import Event
from ..domain.shedding import power_caps
from ..models import DomainCondition, Node
from ..nodes.dispatch import Command

log = logging.getLogger("llmgw.facility")


def caps_decide(changes: list[Event]) -> tuple[list[Command], list[Event]]:
    """The power_cap commands this step's condition changes call for, and an event each."""
    share = settings.LLMGW.facility_power_cap
    changed = [e for e in changes if e.kind == "facility_condition"]
    if share is None or not changed:
        return [], []
    after: dict[Domain, str] = {
        (k, n): c
        for k, n, c in DomainCondition.objects.filter(condition__in=("warm", "hot")).values_list(
            "kind", "name", "condition"
        )
    }
    before = dict(after)
    for e in changed:
        kind, name = e.fields["domain"].split(":", 1)
        before[(kind, name)] = e.fields.get("was", "unknown")
    nodes = {n: domains_of(labels or {}) for n, labels in Node.objects.values_list("id", "labels")}
    wanted = power_caps(before, after, nodes, share)
    enforce = settings.LLMGW.facility_enforce
    commands, events = [], []
    for node, cap in wanted.items():
        said = (
            f"held node {node}'s GPUs to {cap:.0%} of their default power limit: "
            "it is in a warm or hot domain"
            if cap is not None
            else f"let node {node}'s GPUs back to their default power limit: "
            "none of its domains is warm or hot"
        )
        if enforce:
            commands.append(Command(node, {"type": "power_cap", "share": cap}))
        else:
            said = f"would have {said} (LLMGW_FACILITY_ENFORCE is off)"
        event = Event(said, "facility_power_cap", node=node, share=cap)
        log.info(event, extra={"event": event.kind, **event.fields})
        events.append(event)
    return commands, events
