"""A model's replicas on their way out, in its step of a reconciler pass.

Replicas retire for a restart (one at a time, replacement first) or off a node
being drained (`retire`); retired and drained ones stop when their replacement
is ready or their time is up (`stop_retired`); the newest past what is wanted
drain or stop (`scale_down`); and a restart whose replacement finds no room
stops the replica it replaces first (`stop_first`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from catalog.domain import ModelSpec

from .plan import Drain, Event, Pass, Plan, Retire, Stop, Unretire, duration
from .refusals import one_line
from .types import ACTIVE, HOLDING, ModelState, ReplicaView


def retire(
    model: ModelSpec, replicas: list[ReplicaView], state: ModelState, p: Pass
) -> tuple[ModelState, set[str], dict[str, datetime]]:
    """Which of a model's replicas retire: those retiring already, those on a node being
    drained (from now, with the drain grace as their deadline), and, for a restart, one at
    a time. They are taken, so no preemption chooses them. Returns the state, the retiring
    replicas' ids and their deadlines."""
    now, t, plan = p.now, p.t, p.plan
    # Replicas on a node being drained retire: a replacement first, then they drain.
    ended = _drain_ended(model, replicas, p)
    retiring = {r.id for r in replicas if r.retiring and r.id not in ended}
    deadlines = {r.id: r.drain_deadline for r in replicas if r.id in retiring and r.drain_deadline}
    for r in replicas if p.draining else ():
        if (
            r.state in ACTIVE
            and r.id not in retiring
            and any(s.node_id in p.draining for s in r.shards)
        ):
            retiring.add(r.id)
            # It serves until its replacement is ready, or until the drain grace runs out when
            # no room is found for one: a node's drain always ends.
            deadline = now + timedelta(seconds=t.drain_grace)
            node = next(s.node_id for s in r.shards if s.node_id in p.draining)
            plan.retires.append(Retire(r.id, f"its node {node} is draining", deadline=deadline))
            deadlines[r.id] = deadline
    state = _restart_in_turn(model, replicas, state, retiring, plan)
    p.ctx.taken |= retiring
    return state, retiring, deadlines


def _drain_ended(model: ModelSpec, replicas: list[ReplicaView], p: Pass) -> set[str]:
    """The replicas a drain retired whose nodes drain no more (uncordoned): they stay, their
    drain's time is cancelled. A drain's retirement is the one with a deadline; a restart's
    has none and goes on."""
    ended = {
        r.id
        for r in replicas
        if r.retiring
        and r.drain_deadline is not None
        and r.state in ACTIVE
        and not any(s.node_id in p.draining for s in r.shards)
    }
    for r in replicas:
        if r.id in ended:
            nodes = sorted(r.nodes)
            where = (
                f"{nodes[0]} no longer drains"
                if len(nodes) == 1
                else f"{', '.join(nodes[:-1])} and {nodes[-1]} no longer drain"
            )
            p.plan.unretires.append(Unretire(r.id))
            p.plan.events.append(
                Event(
                    f"replica {r.id} of {model.name} stays: {where}",
                    "drain_ended",
                    replica=r.id,
                    model=model.name,
                    nodes=nodes,
                )
            )
    return ended


def _restart_in_turn(
    model: ModelSpec, replicas: list[ReplicaView], state: ModelState, retiring: set[str], plan: Plan
) -> ModelState:
    """Retire one replica started before the restart was asked for at a time, replacement first."""
    asked = state.restart_requested_at
    if asked is None:
        return state
    if any(r.id in retiring and r.state in HOLDING for r in replicas):
        return state
    older = sorted(
        (
            r
            for r in replicas
            if r.state in ACTIVE and r.created_at <= asked and r.id not in retiring
        ),
        key=lambda r: r.created_at,
    )
    if not older:
        plan.events.append(Event(f"model {model.name} restarted", "restart", model=model.name))
        return replace(state, restart_requested_at=None)
    retiring.add(older[0].id)
    plan.retires.append(Retire(older[0].id, "restarting"))
    return state


def stop_retired(
    replicas: list[ReplicaView],
    retiring: set[str],
    deadlines: dict[str, datetime],
    replaced: bool,
    p: Pass,
) -> None:
    """Stop a model's retiring replicas: one not ready yet at once, a ready one once enough
    others are ready (`replaced`) or past its deadline; and a draining one once replaced, or
    when its drain's time is up."""
    now, t, plan = p.now, p.t, p.plan
    for r in replicas:
        if r.id in retiring and r.state in ("pending", "starting"):
            plan.stops.append(Stop(r.id, 0, f"replica {r.id} retired before it was ready"))
        elif r.id in retiring and r.state == "ready" and replaced:
            # Its replacement is ready: the stop's grace lets requests in flight finish.
            plan.stops.append(Stop(r.id, int(t.preempt_grace), f"replica {r.id} is replaced"))
        elif (
            r.id in retiring and r.state == "ready" and r.id in deadlines and now >= deadlines[r.id]
        ):
            why = f"replica {r.id} stops: its node drained {duration(t.drain_grace)} with no room for a replacement"
            plan.stops.append(Stop(r.id, int(t.preempt_grace), why))
        elif r.state == "draining":
            if r.id in retiring and replaced:
                plan.stops.append(
                    Stop(
                        r.id,
                        r.stop_grace_s,
                        f"stopping drained replica {r.id}: its replacement is ready",
                    )
                )
            elif r.drain_deadline is not None and now >= r.drain_deadline:
                why = (
                    f"stopping preempted replica {r.id}: it gave room to {r.preempted_for} "
                    f"after {duration(t.preempt_grace)}"
                    if r.preempted_for
                    else f"stopping drained replica {r.id}: no replacement after {duration(t.drain_grace)}"
                )
                plan.stops.append(Stop(r.id, r.stop_grace_s, why))


def scale_down(model: ModelSpec, active: list[ReplicaView], desired: int, p: Pass) -> None:
    """Take back the newest of `active` past `desired`: a ready one drains (or stops, for an
    on-demand model no longer wanted at all), one not ready yet stops."""
    name, now, t, plan = model.name, p.now, p.t, p.plan
    for r in sorted(active, key=lambda r: r.created_at, reverse=True)[: len(active) - desired]:
        p.ctx.taken.add(r.id)
        if r.state != "ready" or (model.on_demand and desired == 0):
            why = "idle past its idle timeout" if model.on_demand else "scaled down"
            plan.stops.append(Stop(r.id, int(t.preempt_grace), f"replica {r.id} {why}"))
        else:
            deadline = now + timedelta(seconds=t.drain_grace)
            plan.drains.append(
                Drain(r.id, deadline, f"replica {r.id} drains: {name} scaled down to {desired}")
            )
    p.live[name] = desired


def stop_first(
    model: ModelSpec,
    replicas: list[ReplicaView],
    retiring: set[str],
    deadlines: dict[str, datetime],
    explanation: tuple,
    p: Pass,
) -> None:
    """A restart (or a roll) whose replacement finds no room stops the replica it replaces
    first, and its replacement is placed into the room that frees: one replica fewer for a
    while rather than a restart that never ends. A drain's retiring replica has a deadline
    of its own and waits for it."""
    stopping = {s.replica_id for s in p.plan.stops}
    old = [
        r
        for r in replicas
        if r.id in retiring
        and r.state == "ready"
        and r.id not in deadlines
        and r.id not in stopping
    ]
    if not old:
        return
    first = one_line(explanation) or "no profile fits"
    r = old[0]
    why = (
        f"replica {r.id} of {model.name} stops before its replacement starts: no room for "
        f"both ({first}); the replacement is placed into the room it frees"
    )
    p.plan.stops.append(Stop(r.id, int(p.t.preempt_grace), why))
    p.plan.events.append(Event(why, "restart", model=model.name, replica=r.id))
