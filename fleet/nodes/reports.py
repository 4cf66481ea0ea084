"""Fleet writes from what agents report: registration (with the shards they still run),
shard status, and the weights they hold. Heartbeats and connections: fleet/nodes/heard.py.

Each public service is one transaction; the commands it returns go to agents only after
that transaction has committed (fleet/nodes/consumers.py sends them).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from catalog.selectors import adapters_load

from .. import event_log
from ..domain.causes import exit_said, summary as failure_summary
from ..domain.endpoints import endpoint_refusal
from ..domain.plan import Event
from ..models import Node, Replica, Shard
from ..protocol import (
    AdapterStatus,
    BadMessage,
    Disk,
    ShardStatus,
    Weight,
)
from .connections import refused
from .dispatch import Command, stop_command
from .failures import failure_log_attach
from .figures import node_figures_refresh

log = logging.getLogger("llmgw.fleet")


def replica_progress(replica_id: str, now: datetime) -> bool:
    """Move a replica along from its shards' states: ready once all are, starting while any
    starts. Compare-and-set, so a stop or drain decided meanwhile is never undone. True when
    it became ready."""
    states = set(Shard.objects.filter(replica_id=replica_id).values_list("state", flat=True))
    if states == {"ready"}:
        return bool(
            Replica.objects.filter(pk=replica_id, state__in=("pending", "starting")).update(
                state="ready", ready_at=now, state_since=now
            )
        )
    if "starting" in states:
        Replica.objects.filter(pk=replica_id, state="pending").update(
            state="starting", state_since=now
        )
    return False


def stopped_once_all_shards_are(replica_id: str, now: datetime) -> None:
    """A stopping replica is stopped once none of its shards runs; the reconciler then forgets it."""
    if (
        not Shard.objects.filter(replica_id=replica_id)
        .exclude(state__in=("stopped", "failed"))
        .exists()
    ):
        Replica.objects.filter(pk=replica_id, state="stopping").update(
            state="stopped", state_since=now
        )


def node_weights_record(*, node_id: str, weights: list[Weight] | None, disk: Disk | None) -> None:
    """What a node's weight cache holds now, and its free disk (a heartbeat says so when
    either changed); what is absent is left as it was."""
    fields: dict = {}
    if weights is not None:
        fields["weights"] = [w.model_dump() for w in weights]
    if disk is not None:
        fields["disk_free_gb"], fields["disk_total_gb"] = disk.free_gb, disk.total_gb
    if fields:
        Node.objects.filter(pk=node_id).update(**fields)


def shard_status_record(*, node_id: str, msg: ShardStatus, now: datetime) -> list[Command]:
    """Record what an agent says of one shard, and move its replica along.

    Only of a shard placed on that node, with an endpoint on its believed address: a
    status with another endpoint raises BadMessage and changes nothing; one of a shard not
    placed there changes nothing, and the engine behind it is told to stop."""
    with transaction.atomic():
        shard = (
            Shard.objects.select_related("replica").filter(pk=msg.shard_id, node_id=node_id).first()
        )
        if shard is None:
            refused(
                "shard_status_not_placed",
                f"node {node_id} sent shard_status for shard {msg.shard_id}, which is not "
                "placed on it; nothing changed",
            )
            if msg.state in ("fetching", "starting", "ready"):
                # Nobody here runs this: a leftover of a replica already forgotten.
                return [stop_command(node_id, msg.shard_id, 0)]
            return []
        _endpoint_check(node_id, msg)
        replica = shard.replica
        was = shard.state
        shard.state = msg.state
        shard.endpoint = msg.endpoint or shard.endpoint
        shard.detail = msg.detail
        shard.exit_code = msg.exit_code
        shard.progress_done = msg.progress.done if msg.progress else None
        shard.progress_total = msg.progress.total if msg.progress else None
        shard.save(
            update_fields=[
                "state",
                "endpoint",
                "detail",
                "exit_code",
                "progress_done",
                "progress_total",
            ]
        )
        if msg.state in ("failed", "stopped"):
            _shard_ended(shard, replica, msg, now)
            node_figures_refresh(replicas=[replica.id])
        elif replica.state in ("stopping", "stopped", "failed"):
            # An engine started again (a start_shard resent while it was away) for a replica
            # given up meanwhile: it must not run on untracked.
            return [stop_command(node_id, shard.id, 0)]
        elif replica_progress(replica.id, now):
            log.info(
                "replica %s of %s is ready",
                replica.id,
                replica.model,
                extra={"replica": replica.id},
            )
            _happened(
                shard, replica, "ready", f"replica {replica.id} of {replica.model} is ready", now
            )
        elif was != msg.state and msg.state in _ON_THE_WAY:
            what = _ON_THE_WAY[msg.state].format(shard=shard.id, node=node_id)
            _happened(
                shard, replica, msg.state, f"replica {replica.id} of {replica.model} {what}", now
            )
    return []


def _endpoint_check(node_id: str, msg: ShardStatus) -> None:
    """Raise BadMessage when the status's endpoint is not on the node's believed address."""
    if not msg.endpoint:
        return
    addr, refusal = Node.objects.filter(pk=node_id).values_list("mgmt_addr", "address_refusal")[0]
    why = refusal or endpoint_refusal(msg.endpoint, addr)
    if why:
        refused("shard_endpoint", f"node {node_id}: {why}")
        raise BadMessage(f"shard_status for {msg.shard_id} refused: {why}")


# A shard's steps to ready, as its events say them.
_ON_THE_WAY = {
    "fetching": "is fetching its weights on node {node}",
    "starting": "is starting its engine on node {node} (shard {shard})",
}


def _happened(shard: Shard, replica: Replica, state: str, message: str, now: datetime) -> None:
    event_log.record(
        [
            Event(
                message,
                f"shard_{state}",
                model=replica.model,
                node=shard.node_id,
                replica=replica.id,
            )
        ],
        now=now,
    )


def _shard_ended(shard: Shard, replica: Replica, msg: ShardStatus, now: datetime) -> None:
    if replica.state in ("stopping", "stopped"):
        if msg.detail:
            failure_log_attach(model=replica.model, replica_id=replica.id, detail=msg.detail)
        stopped_once_all_shards_are(replica.id, now)
        return
    if replica.state == "failed":
        return
    ended = exit_said(msg.exit_code)
    code = f" ({ended})" if ended else ""
    # One line: the engine's log line that says why (causes.summary), else the agent's
    # sentence; the whole tail is kept with the model's failure.
    said = failure_summary(msg.detail)
    detail = f": {said}" if said else ""
    verb = "failed" if msg.state == "failed" else "stopped by itself"
    reason = f"shard {shard.id} on node {shard.node_id} {verb}{code}{detail}"[:500]
    # Failing to start counts toward backoff and parking; a ready replica that ends (an agent
    # restarted, an engine crashed after serving) is replaced without counting against its
    # model, unless its agent stopped it for outgrowing its reservation: started again as
    # it is, it would grow again.
    Replica.objects.filter(pk=replica.pk).exclude(
        state__in=("stopping", "stopped", "failed")
    ).update(
        state="failed",
        state_since=now,
        reason=reason,
        counts_as_failure=replica.state in ("pending", "starting") or msg.stopped_for is not None,
    )
    # The event log says it once, from the reconciler's pass that replaces it.
    log.info(reason, extra={"replica": replica.id, "model": replica.model})


# What an adapter_status says, as its event says it.
_ADAPTER_SAID = {
    "loaded": "adapter {name} is loaded on replica {replica} of {model} (node {node})",
    "unloaded": "adapter {name} is unloaded from replica {replica} of {model} (node {node})",
    "failed": "adapter {name} failed to load on replica {replica} of {model} (node {node}){why}",
}


def adapter_status_record(*, node_id: str, msg: AdapterStatus, now: datetime) -> None:
    """Record what an agent says of an adapter it was asked to load or unload, as an event
    naming the adapter (the gateway waiting for it reads how it went there: fleet.selectors.
    routing.adapter_said). Only of a shard placed on that node; else nothing changes.
    Which adapters each engine holds is what its engine_load says, not this."""
    shard = Shard.objects.select_related("replica").filter(pk=msg.shard_id, node_id=node_id).first()
    if shard is None:
        refused(
            "adapter_status_not_placed",
            f"node {node_id} sent adapter_status for shard {msg.shard_id}, which is not placed "
            "on it; nothing changed",
        )
        return
    replica = shard.replica
    adapter = adapters_load().get(msg.name)
    if adapter is None or adapter.base != replica.model:
        # A node speaks only for its own replicas' adapters: else it could fail the load
        # another replica was asked for, and the requests waiting on it.
        refused(
            "adapter_status_not_its_base",
            f"node {node_id} sent adapter_status for adapter {msg.name} on replica "
            f"{replica.id} of {replica.model}, which is not an adapter of that model; "
            "nothing changed",
        )
        return
    said = failure_summary(msg.detail) if msg.detail else ""
    message = _ADAPTER_SAID[msg.state].format(
        name=msg.name,
        replica=replica.id,
        model=replica.model,
        node=node_id,
        why=f": {said}" if said else "",
    )
    event_log.record(
        [
            Event(
                message[:2000],
                f"adapter_{msg.state}",
                model=msg.name,
                node=node_id,
                replica=replica.id,
                base=replica.model,
            )
        ],
        now=now,
    )
