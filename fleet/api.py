"""Nodes, replicas and the reconciler over REST."""

from __future__ import annotations

import math

from django.conf import settings
from ninja import Query, Router

from catalog.domain import MAX_REPLICAS
from llmgw.core import clock
from llmgw.core.api import actor
from llmgw.core.errors import Invalid
from tenancy.auth import can

from . import services
from .nodes import identity, logs, upgrades
from .nodes.dispatch import dispatch, node_disconnect
from .reconciler.run import reconcile_once
from .schemas import (
    ApproveIn,
    DefragOut,
    DetailOut,
    DomainConditionOut,
    DomainHoldIn,
    DomainHoldOut,
    EngineLogOut,
    EventsOut,
    FabricOut,
    FacilityDomainOut,
    FacilitySourcesOut,
    HeadroomOut,
    ModelPowerOut,
    NodeOut,
    PowerBudgetIn,
    PowerBudgetOut,
    PreemptionOut,
    ReconcileOut,
    ReconcilerOut,
    ReleaseIn,
    ReleaseOut,
    ReplicaOut,
    TargetOut,
    UpgradeIn,
)
from .selectors import (
    conditions,
    dry_runs,
    events,
    fabric,
    facility,
    listings,
    passes,
    state,
    status,
)

router = Router(tags=["fleet"])


@router.get("/nodes", response=list[NodeOut], auth=can("fleet.view_node"))
def nodes_list(request):
    return listings.nodes_list()


@router.get("/nodes/{node_id}", response=NodeOut, auth=can("fleet.view_node"))
def node_get(request, node_id: str):
    return listings.nodes_list(node_id=node_id)[0]


def _schedule(request, node_id: str, action: str) -> dict:
    return {
        "detail": services.node_set_schedule(node_id=node_id, action=action, actor=actor(request))
    }


@router.post("/nodes/{node_id}/cordon", response=DetailOut, auth=can("fleet.change_node"))
def node_cordon(request, node_id: str):
    return _schedule(request, node_id, "cordon")


@router.post("/nodes/{node_id}/uncordon", response=DetailOut, auth=can("fleet.change_node"))
def node_uncordon(request, node_id: str):
    return _schedule(request, node_id, "uncordon")


@router.post("/nodes/{node_id}/drain", response=DetailOut, auth=can("fleet.change_node"))
def node_drain(request, node_id: str):
    return _schedule(request, node_id, "drain")


def _gpu_cordon(request, node_id: str, index: int, cordoned: bool) -> dict:
    said = services.gpu_set_cordon(
        node_id=node_id, index=index, cordoned=cordoned, actor=actor(request), now=clock.now()
    )
    return {"detail": said}


@router.post(
    "/nodes/{node_id}/gpus/{index}/cordon", response=DetailOut, auth=can("fleet.change_node")
)
def gpu_cordon(request, node_id: str, index: int):
    """Keep new replicas off one GPU; the replica it runs stays (`ctl gpu cordon`)."""
    return _gpu_cordon(request, node_id, index, True)


@router.post(
    "/nodes/{node_id}/gpus/{index}/uncordon", response=DetailOut, auth=can("fleet.change_node")
)
def gpu_uncordon(request, node_id: str, index: int):
    """Let placement give one GPU out again."""
    return _gpu_cordon(request, node_id, index, False)


@router.post("/nodes/{node_id}/approve", response=DetailOut, auth=can("fleet.change_node"))
def node_approve(request, node_id: str, payload: ApproveIn | None = None):
    """Let a node held by LLMGW_NODE_APPROVAL=manual into placement; `{"address"}` also
    believes its engines are at that address (behind NAT or a proxy)."""
    address = payload.address if payload else ""
    sentence = identity.node_approve(
        node_id=node_id, actor=actor(request), address=address, now=clock.now()
    )
    return {"detail": sentence}


@router.post("/releases", response=ReleaseOut, auth=can("fleet.upgrade_node"))
def release_offer(request, payload: ReleaseIn):
    """The llmgw release nodes would be upgraded to: the mirror's `version`, or without one
    the release this control plane runs (its wheel built and kept on first asking)."""
    return upgrades.release_for_upgrade(
        version=payload.version, actor=actor(request), now=clock.now()
    )


@router.post("/nodes/{node_id}/upgrade", response=DetailOut, auth=can("fleet.upgrade_node"))
def node_upgrade(request, node_id: str, payload: UpgradeIn):
    """Tell the node's agent to install `version` and re-execute itself, its engines kept
    running; it reports back as events (`upgrade`, `upgrade_failed`)."""
    return {
        "detail": upgrades.node_upgrade(
            node_id=node_id, version=payload.version, actor=actor(request), now=clock.now()
        )
    }


@router.delete("/nodes/{node_id}", response=DetailOut, auth=can("fleet.delete_node"))
def node_forget(request, node_id: str):
    """Forget a node: its credential is revoked, what it ran is given up and stopped, and its
    agent's connection is closed; it can join again only with a join token."""
    detail, commands = identity.node_forget(node_id=node_id, actor=actor(request), now=clock.now())
    dispatch(commands)
    node_disconnect(node_id)
    return {"detail": detail}


@router.get("/replicas", response=list[ReplicaOut], auth=can("fleet.view_replica"))
def replicas_list(request, model: str | None = None):
    return listings.replicas_list(model=model or None)


@router.get("/events", response=EventsOut, auth=can("fleet.view_replica"))
def events_list(
    request,
    model: str | None = None,
    node: str | None = None,
    since: str | None = None,
    before: str | None = None,
    limit: int = 50,
):
    """What happened to models, replicas and nodes, and who changed what, newest first:
    `since` a time or a span back (`1h`), `before` a page's `next`, at most 500 a page."""
    if not 1 <= limit <= events.PAGE_MOST:
        raise Invalid(f"limit must be from 1 to {events.PAGE_MOST}, not {limit}.")
    now = clock.now()
    return events.events_page(
        model=model or None,
        node=node or None,
        since=clock.since(since, now=now) if since else None,
        before=before or None,
        limit=limit,
    )


@router.get("/replicas/{replica_id}/logs", response=EngineLogOut, auth=can("fleet.view_replica"))
async def replica_logs(request, replica_id: str, lines: Query[int] = logs.DEFAULT_LINES):
    """The engine's recent log, read from its node; 503 when the node is away, 504 when it
    does not answer within a few seconds."""
    return await logs.replica_log(replica_id=replica_id, lines=lines)


@router.get("/models/{name}/headroom", response=HeadroomOut, auth=can("catalog.view_model"))
def model_headroom(request, name: str, limit: Query[int] = 10):
    """How many more replicas fit now, placed one after another on a copy of the room."""
    if not 1 <= limit <= MAX_REPLICAS:
        raise Invalid(f"limit must be a whole number from 1 to {MAX_REPLICAS}.")
    return dry_runs.model_headroom(name=name, limit=limit)


@router.get("/models/{name}/target", response=TargetOut, auth=can("catalog.view_model"))
def model_target(request, name: str, tokens_per_sec: Query[float]):
    """Replicas a throughput needs, from the model's measurement, and whether they fit."""
    if not math.isfinite(tokens_per_sec) or tokens_per_sec <= 0:
        raise Invalid("tokens_per_sec must be a positive number.")
    return dry_runs.model_target(name=name, tokens_per_sec=tokens_per_sec)


@router.get("/models/{name}/power", response=ModelPowerOut, auth=can("fleet.view_replica"))
def model_power(request, name: str):
    """What each ready replica of the model draws now, per shard: its GPUs' draw, power limit
    and default limit, and its node's CPU draw, as their agents last reported them, null
    where unreported or stale (what `llmgw ctl bench` samples)."""
    return facility.model_power(name=name, now=clock.now())


@router.get(
    "/models/{name}/preemption",
    response=PreemptionOut,
    by_alias=True,
    auth=can("catalog.view_model"),
)
def model_preemption(request, name: str):
    """What would be stopped now to place one more replica, and why; changes nothing."""
    return dry_runs.model_preemption(name=name)


@router.get(
    "/models/{name}/defrag", response=DefragOut, by_alias=True, auth=can("catalog.view_model")
)
def model_defrag(request, name: str):
    """Which replicas would move to free an NVLink domain for one replica of the model over
    several trays, and why none can be freed; changes nothing (docs/fabric.md)."""
    return dry_runs.model_defrag(name=name)


@router.post("/reconcile", response=ReconcileOut, auth=can("fleet.change_replica"))
def reconcile(request):
    """Run one pass now and answer what it did."""
    return reconcile_once()


@router.get("/reconciler", response=ReconcilerOut, auth=can("fleet.view_replica"))
def reconciler_get(request):
    """When the last pass began, whether it settles, and a sentence when passes stopped."""
    from llmgw.core import clock as clock_

    return passes.reconciler_status(now=clock_.now())


@router.get("/status", auth=can("fleet.view_replica"))
def status_get(request):
    """The control plane's own health: database, Redis, the reconciler's last pass, the
    workers, the nodes by state, the models needing attention (`llmgw ctl status`)."""
    return status.control_plane_status(now=clock.now())


@router.get("/fabric", response=FabricOut, auth=can("fleet.view_node"))
def fabric_get(request):
    """Each NVLink domain the GPUs report: its GPUs free and in all, its trays with IMEX on
    each and the replicas spanning them; and every GPU kept out of service, with why."""
    return fabric.fabric_read()


@router.get("/facility", response=list[FacilityDomainOut], auth=can("fleet.view_powerbudget"))
def facility_list(request):
    """Every rack, PDU and PDU phase the nodes' labels or a budget name: its nodes, GPUs,
    what the GPUs held there draw, and its budget."""
    held = facility.held_shards(state.replica_views())
    return [d.as_dict() for d in facility.facility_domains(held, now=clock.now())]


@router.put("/facility/budgets", response=PowerBudgetOut, auth=can("fleet.change_powerbudget"))
def power_budget_set(request, payload: PowerBudgetIn):
    """Set the most a rack, PDU or PDU phase may draw, in watts or by its feeds, with a
    safety margin and its other equipment; the next reconciler pass places by it."""
    return services.power_budget_set(**payload.dict(), actor=actor(request))


@router.delete(
    # A phase's name holds a slash: r12-a/L2.
    "/facility/budgets/{kind}/{path:name}",
    response=PowerBudgetOut,
    auth=can("fleet.delete_powerbudget"),
)
def power_budget_clear(request, kind: str, name: str):
    """Remove a rack's, PDU's or phase's power budget."""
    return services.power_budget_clear(kind=kind, name=name, actor=actor(request))


@router.get(
    "/facility/conditions",
    response=list[DomainConditionOut],
    auth=can("fleet.view_domaincondition"),
)
def facility_conditions(request):
    """Every rack, PDU, row, room and zone with a condition or a hold, and every PDU phase
    held: its condition in a sentence, its readings' age, whether enforced, and who holds it."""
    enforced = settings.LLMGW.facility_enforce
    return [d.as_dict() | {"enforced": enforced} for d in conditions.conditions_list()]


@router.get(
    "/facility/sources",
    response=FacilitySourcesOut,
    auth=can("fleet.view_domaincondition"),
)
def facility_sources(request):
    """Which facility sources failed at the reconciler's last read, why, and since when."""
    return conditions.sources_failed()


@router.put("/facility/holds", response=DomainHoldOut, auth=can("fleet.add_domainhold"))
def facility_hold(request, payload: DomainHoldIn):
    """Hold a domain: no new placements in it until released; nothing running is stopped."""
    return services.domain_hold(
        kind=payload.kind,
        name=payload.name,
        reason=payload.reason,
        actor=actor(request),
        now=clock.now(),
    )


@router.delete(
    # A phase's name holds a slash: r12-a/L2.
    "/facility/holds/{kind}/{path:name}",
    response=DomainHoldOut,
    auth=can("fleet.delete_domainhold"),
)
def facility_release(request, kind: str, name: str):
    """Release a domain's hold: it takes new placements again from the next pass."""
    return services.domain_release(kind=kind, name=name, actor=actor(request))
