"""A model's replicas on their way in, in its step of a reconciler pass (beside
`stopping.py`, on their way out): placing the missing ones, and preempting for them
when there is no room. Where a replica can run is placement's rule; who may be
preempted is preemption's.

`scale_up` places them one after another, into the room kept for the model
first, else spread over nodes that do not run it yet; when a quota limit
refuses one, or nothing fits, it says why once. With no room it preempts:
the victims drain with the preemption grace, their models are held, and the
room is kept for the model (`end_holds` ends the holds that are over).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from catalog.domain import ModelSpec, Profile

from .holdings import placement_amount
from .measured import ordered_profiles
from .placement import MAX_REASONS_PER_PROFILE, Inventory, Placement
from .plan import Drain, Event, Pass, Plan, Start
from .preemption import Preemption, place_kept, preempt, reserved_amount
from .refusals import one_line, settled
from .types import HOLDING, ModelState, Reservation, shard_id


def scale_up(
    model: ModelSpec, state: ModelState, missing: int, p: Pass
) -> tuple[ModelState, bool, tuple]:
    """Place the missing replicas one after another, each seeing what the previous took;
    when there is no room, preempt, and say why when that cannot help either."""
    name, inv, ctx = model.name, p.inv, p.ctx
    profiles = ordered_profiles(model, p.snap.measurements)
    for _ in range(missing):
        # The room kept for it is its own to place into, and no longer counted as coming.
        mine = inv.unreserve(name)
        kept = reserved_amount(state.reserved)
        ctx.charge(model.owner, kept, -1)
        # Into the room kept for it first, on the GPUs kept: not into another's leftovers.
        placed = place_kept(inv, profiles, state.reserved, model.source) or _place(
            model, profiles, inv
        )
        if isinstance(placed, Placement):
            need = placement_amount(placed)
            over = ctx.policy.at_limit(model.owner, ctx.usage, need) if model.owner else ""
            if over:
                inv.rereserve(name, mine)
                ctx.charge(model.owner, kept)
                explanation = ({"profile": placed.profile.name, "reasons": [over]},)
                _refusal_said(model, state, explanation, over, p.plan)
                return state, True, explanation
            start_replica(model, placed, p)
            ctx.charge(model.owner, need)
            state = replace(state, reserved=(), reserved_until=None)
            continue
        if in_flight := _in_flight(model, state, p):
            inv.rereserve(name, mine)
            ctx.charge(model.owner, kept)
            why = f"waiting for room being freed by {', '.join(in_flight)}"
            return state, False, ({"profile": "", "reasons": [why]},)
        return _make_room(model, state, profiles, placed, p)
    return state, False, ()


def _in_flight(model: ModelSpec, state: ModelState, p: Pass) -> list[str]:
    """Its victims still holding room, and those of another whose room it counts on."""
    counted = {v for r in state.reserved for v in r.victims}
    return [
        r.id
        for r in p.ctx.alive
        if r.state in HOLDING and (r.preempted_for == model.name or r.id in counted)
    ]


def _make_room(
    model: ModelSpec, state: ModelState, profiles: list[Profile], refused: list[dict], p: Pass
) -> tuple[ModelState, bool, tuple]:
    """Nothing fits and no room is being freed for it: preempt; when that cannot help
    either, say why (once)."""
    name = model.name
    # Its victims are gone and it still does not fit (the node went away, say): the
    # room kept is no use to it; let it go and look again. The holds for it end: the
    # room they gave is let go.
    if state.reserved:
        end_holds(p, name)
    state = replace(state, reserved=(), reserved_until=None)
    result = preempt(model, profiles, p.live.get(name, 0), p.inv, p.ctx, _avoid(model, p.inv))
    if result.victims or result.waits_for:
        why = (
            f"making room: stopping {_victim_list(result)}"
            if result.victims
            else f"waiting for room being freed by {', '.join(r for r, _ in result.waits_for)}"
        )
        state = _apply_preemption(model, state, result, p)
        return state, False, ({"profile": "", "reasons": [why]},)
    lines = [*result.blocked, *(x.why for x in result.protected)]
    explanation = tuple(refused)
    if lines:
        explanation += ({"profile": "preemption", "reasons": lines[:MAX_REASONS_PER_PROFILE]},)
    _refusal_said(model, state, explanation, one_line(refused) or "no profile fits", p.plan)
    return state, True, explanation


def _refusal_said(
    model: ModelSpec, state: ModelState, explanation: tuple, first: str, plan: Plan
) -> None:
    """Say a model cannot be placed once, and again only when the reason changes."""
    if state.unplaceable and settled(state.explanation) == tuple(explanation):
        return
    plan.events.append(
        Event(f"model {model.name} cannot be placed: {first}", "unplaceable", model=model.name)
    )


def _victim_list(result: Preemption) -> str:
    return ", ".join(f"{v.replica} of {v.model}" for v in result.victims)


def _apply_preemption(
    model: ModelSpec, state: ModelState, result: Preemption, p: Pass
) -> ModelState:
    """Drain the victims with the preemption grace, hold their models, keep the room (with
    the room already being freed that it counts on)."""
    now, t = p.now, p.t
    deadline = now + timedelta(seconds=t.preempt_grace)
    until = now + timedelta(seconds=t.preempt_hold)
    placed = result.placement
    # Preemption gives victims or room being freed only with the placement they make (answer).
    assert placed is not None
    p.ctx.charge(model.owner, placement_amount(placed))
    # The whole placement it counted on is kept for it: the free part now, the victims'
    # part once they are gone. Another model later in this pass cannot take the free part.
    by_node: dict[str, list[str]] = {}
    for replica, node in [(v.replica, v.node) for v in result.victims] + result.waits_for:
        by_node.setdefault(node, []).append(replica)
    reserved = tuple(
        Reservation(
            s.node_id, s.gpu_indices, s.memory_gb, s.cpu_cores, tuple(by_node.get(s.node_id, ()))
        )
        for s in placed.shards
    )
    p.ctx.preempted(model.name, [v.replica for v in result.victims], reserved)
    p.inv.keep(model.name, reserved)
    for v in result.victims:
        why = (
            f"replica {v.replica} of {v.model} ({v.capacity_class}) preempted for {model.name} "
            f"({model.effective_class}): {v.why}"
        )
        p.plan.drains.append(Drain(v.replica, deadline, why, preempted_for=model.name))
        p.plan.events.append(
            Event(
                why,
                "preemption",
                replica=v.replica,
                model=v.model,
                model_class=v.capacity_class,
                node=v.node,
                preempted_for=model.name,
                preempted_for_class=model.effective_class,
            )
        )
        held = p.states.get(v.model) or ModelState(model=v.model)
        p.states[v.model] = replace(
            held, held_until=until, held_for=model.name, preempted=held.preempted + 1
        )
        p.live[v.model] = p.live.get(v.model, 0) - 1
    return replace(state, reserved=reserved, reserved_until=until)


def _avoid(model: ModelSpec, inv: Inventory) -> frozenset[str]:
    return frozenset(inv.model_nodes.get(model.name, ()))


def start_replica(model: ModelSpec, placed: Placement, p: Pass, reserved: bool = False) -> None:
    """Start a replica on `placed`, its room taken from the inventory unless `reserved`
    already (shedding takes it as it chooses, so two moves of a pass never share it)."""
    replica_id = p.new_id(model.name)
    shards = tuple((shard_id(replica_id, s.rank), s) for s in placed.shards)
    if not reserved:
        p.inv.reserve(model.name, placed)
    where = ", ".join(s.node_id for s in placed.shards)
    # What the choice went by beyond the usual order: the spread over racks, a draw that
    # could not be counted against a budget.
    said = "".join(f"; {line}" for line in placed.said)
    p.plan.starts.append(
        Start(replica_id, model.name, placed.profile, shards, f"placed on {where}{said}")
    )
    p.plan.events.append(
        Event(
            f"replica {replica_id} of {model.name} placed on {where} ({placed.profile.name}){said}",
            "placement",
            replica=replica_id,
            model=model.name,
            profile=placed.profile.name,
            nodes=[s.node_id for s in placed.shards],
        )
    )
    p.live[model.name] = p.live.get(model.name, 0) + 1


def _place(model: ModelSpec, profiles: list[Profile], inv: Inventory) -> Placement | list[dict]:
    """Spread over nodes that do not run the model yet; give that up when it is the only obstacle."""
    placed = inv.place_spread(profiles, _avoid(model, inv), model.source, model.name)
    return placed if isinstance(placed, Placement) else placed.as_explanation()


def end_holds(p: Pass, to: str = "") -> None:
    """End the holds that are over for good, so that no view names them again: run out, or
    for a model removed or parked since; with `to`, every hold for that model, which let
    the room it was given go. (A hold for a model that has its replicas is over only while
    it has them: it holds again if that model wants more before the hold runs out.)"""
    for name, state in p.states.items():
        if not (state.held_for or state.held_until):
            continue
        if to and state.held_for != to:
            continue
        wants = p.states.get(state.held_for) if state.held_for in p.snap.models else None
        if (
            not to
            and state.held_until
            and p.now < state.held_until
            and wants is not None
            and not wants.parked_since
        ):
            continue
        p.states[name] = replace(state, held_for="", held_until=None)
