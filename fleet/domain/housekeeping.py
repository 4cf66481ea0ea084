"""The start of a reconciler pass, and a model's failures: what is heard, lost and failed.

Nodes gone silent are marked unreachable, then lost (`liveness`); replicas that
stopped, failed or were on a lost node are forgotten, a stop not heard is asked
again, and a start past its timeout is stopped (`housekeeping`). Each failure
counts against its model, backs it off and at last parks it; a replica ready
since clears the count (`clear_failures_once_ready`); `why_not_now` says why a
model is not placed this pass (parked, backing off, settling, waiting for its
weights).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from llmgw.core.config import Timings

from .plan import Event, Forget, NodeChange, Plan, Stop, duration, seconds_since
from .types import Failure, ModelState, NodeView, ReplicaView, Snapshot

SETTLING = "waiting for agents to report their shards after a control plane restart"


def liveness(snap: Snapshot, now: datetime, t: Timings, plan: Plan) -> dict[str, NodeView]:
    """Unreachable after a short silence, lost after a long one, counted from the floor."""
    nodes = {}
    heard, floor = snap.heard, snap.silence_floor
    # Heard within the window (and after the floor): nothing to work out, most nodes most passes.
    recent = now - timedelta(seconds=min(t.unreachable, t.lost))
    if floor is not None:
        recent = max(recent, floor)
    for node in snap.nodes.values():
        seen = heard.get(node.id)
        if seen is not None and seen > recent and node.state == "ready":
            nodes[node.id] = node
            continue
        seen = seen or now
        if floor is not None and seen < floor:
            seen = floor
        silent = seconds_since(seen, now)
        state = node.state
        if state != "lost" and silent >= t.lost:
            state = "lost"
        elif state == "ready" and silent >= t.unreachable:
            state = "unreachable"
        if state != node.state:
            why = f"nothing heard for {duration(silent)}"
            plan.node_changes.append(NodeChange(node.id, state, why))
            plan.events.append(
                Event(f"node {node.id} is {state}: {why}", "node_state", node=node.id, state=state)
            )
            node = replace(node, state=state)
        nodes[node.id] = node
    return nodes


def _record_failure(
    state: ModelState, now: datetime, reason: str, t: Timings, failure: Failure
) -> ModelState:
    failures = state.failures + 1
    backoff = min(t.backoff_base * 2 ** (failures - 1), t.backoff_max)
    parked = failures >= t.park_after
    return replace(
        state,
        failures=failures,
        last_failure_at=now,
        backoff_until=now + timedelta(seconds=backoff),
        parked_since=state.parked_since or (now if parked else None),
        parked_reason=reason if parked and not state.parked_since else state.parked_reason,
        last_failure=replace(failure, at=now),
    )


def _failure(snap: Snapshot, r: ReplicaView, reason: str) -> Failure:
    """What the agent said of a failed replica, else the reason the pass has for it."""
    said = snap.failures.get(r.id)
    if said is not None:
        return said
    return Failure(r.id, node=r.shards[0].node_id if r.shards else "", detail=reason)


# A replica still stopping this long after its grace is asked again: the first stop_shard
# may have been lost (the agent away, the channel layer down).
STOP_AGAIN_AFTER_S = 30


def housekeeping(
    snap: Snapshot,
    nodes: dict[str, NodeView],
    now: datetime,
    t: Timings,
    plan: Plan,
    states: dict[str, ModelState],
) -> list[ReplicaView]:
    """Forget what no longer runs, count failures, time out slow starts; return what still holds room."""
    alive = []
    # A ready replica whose nodes are all there and not lost has nothing to be done to it
    # here: most replicas, most passes (the loop below would find the same, slower).
    present = {k for k, n in nodes.items() if n.state != "lost"}
    for r in snap.replicas:
        if r.state == "ready" and r.nodes <= present:
            alive.append(r)
            continue
        if r.state == "stopped":
            plan.forgets.append(Forget(r.id, "stopped"))
            continue
        if _forget_lost(r, nodes, plan):
            continue
        if r.state == "failed":
            kept = _failed(r, snap, now, t, plan, states)
        elif r.state == "stopping":
            kept = _stop_again(r, now, plan)
        elif r.state in ("pending", "starting"):
            kept = _time_out_start(r, snap, now, t, plan, states)
        else:
            kept = r
        if kept is not None:
            alive.append(kept)
    return alive


def _running(r: ReplicaView) -> list:
    return [s for s in r.shards if s.state not in ("failed", "stopped")]


def _forget_lost(r: ReplicaView, nodes: dict[str, NodeView], plan: Plan) -> bool:
    """A replica with a shard on a lost (or vanished) node is forgotten, its other shards
    stopped; True when it was."""
    lost = sorted(
        s.node_id for s in r.shards if (n := nodes.get(s.node_id)) is None or n.state == "lost"
    )
    if not lost:
        return False
    node = lost[0]
    if any(s.node_id not in lost for s in _running(r)):
        plan.stops.append(Stop(r.id, 0, f"node {node} was lost", lost_node=node))
    plan.forgets.append(Forget(r.id, f"node {node} was lost", lost_node=node))
    plan.events.append(
        Event(
            f"replica {r.id} of {r.model} lost with node {node}",
            "replica_lost",
            replica=r.id,
            model=r.model,
            node=node,
        )
    )
    return True


def _failed(
    r: ReplicaView,
    snap: Snapshot,
    now: datetime,
    t: Timings,
    plan: Plan,
    states: dict[str, ModelState],
) -> ReplicaView | None:
    """A failed replica counts against its model and is forgotten; None. One shard of a
    multi-node replica failed: the others stop before their room is free (it stays,
    stopping)."""
    reason = r.reason or "failed"
    if r.counts_as_failure:
        _count_failure(r, reason, snap, now, t, states)
    plan.events.append(
        Event(
            f"replica {r.id} of {r.model} failed: {reason}",
            "replica_failed",
            replica=r.id,
            model=r.model,
        )
    )
    if len(r.shards) < 2 or not _running(r):
        plan.forgets.append(Forget(r.id, reason))
        return None
    plan.stops.append(Stop(r.id, 0, f"replica {r.id} failed: {reason}"))
    return replace(r, state="stopping")


def _stop_again(r: ReplicaView, now: datetime, plan: Plan) -> ReplicaView:
    """A replica still stopping well past its grace is asked again."""
    if seconds_since(r.state_since, now) > r.stop_grace_s + STOP_AGAIN_AFTER_S:
        plan.stops.append(
            Stop(r.id, 0, f"replica {r.id} is still stopping; asking its agents again")
        )
    return r


def _time_out_start(
    r: ReplicaView,
    snap: Snapshot,
    now: datetime,
    t: Timings,
    plan: Plan,
    states: dict[str, ModelState],
) -> ReplicaView:
    """A start past its profile's startup timeout is stopped and counts as a failure.
    Fetching weights has its own end (bytes stop coming and the agent says failed), and
    while agents settle after a restart nothing is timed out."""
    if snap.settling or any(s.state == "fetching" for s in r.shards):
        return r
    # Counted from the reconciler's restart at the earliest: agents had no chance
    # before; and from its start once starting, so a long fetch is not counted.
    started = r.state_since if r.state == "starting" else r.created_at
    started = max(started, snap.silence_floor) if snap.silence_floor else started
    if seconds_since(started, now) <= (timeout := _startup_timeout(snap, r)):
        return r
    reason = f"replica {r.id} did not become ready within {duration(timeout)}"
    plan.stops.append(Stop(r.id, 0, reason))
    plan.events.append(Event(reason, "replica_failed", replica=r.id, model=r.model))
    _count_failure(r, reason, snap, now, t, states)
    return replace(r, state="stopping")


def _count_failure(
    r: ReplicaView,
    reason: str,
    snap: Snapshot,
    now: datetime,
    t: Timings,
    states: dict[str, ModelState],
) -> None:
    """Count a failure against the replica's model, when it is still in the catalog."""
    if r.model in states:
        states[r.model] = _record_failure(
            states[r.model], now, reason, t, _failure(snap, r, reason)
        )


def _startup_timeout(snap: Snapshot, r: ReplicaView) -> int:
    model = snap.models.get(r.model)
    profile = model.profile(r.profile) if model else None
    return profile.startup_timeout_s if profile else 600


def clear_failures_once_ready(replicas: list[ReplicaView], state: ModelState) -> ModelState:
    """A replica that became ready since the last failure clears the count and the backoff."""
    if not state.failures:
        return state
    since = state.last_failure_at
    if any(
        r.state == "ready" and (since is None or (r.ready_at and r.ready_at >= since))
        for r in replicas
    ):
        return replace(state, failures=0, backoff_until=None, last_failure=None)
    return state


def why_not_now(state: ModelState, snap: Snapshot, now: datetime) -> str:
    if state.parked_since:
        return f"parked after {state.failures} failures in a row: {state.parked_reason}; llmgw ctl retry to try again"
    if state.backoff_until and now < state.backoff_until:
        # An absolute time: a countdown would change the stored explanation every pass.
        return f"backing off after {state.failures} failures; next try at {state.backoff_until:%H:%M:%S} UTC"
    if snap.settling:
        return SETTLING
    return snap.weights_waiting.get(state.model, "")
