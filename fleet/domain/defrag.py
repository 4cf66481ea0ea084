"""Defragmentation across NVLink domains (docs/fabric.md, Defragmentation).

A replica over several trays fits only inside one NVLink domain (placement/fabric.py).
When no domain has the trays free, but one would once some smaller replicas on its
trays ran in another domain instead, those replicas move: each move is a replacement
placed outside the domain first, then the old replica retires and stops once its
replacement is ready, as a drain's replicas do (stopping.py) -- so no model runs fewer
replicas than it did, and none goes below its minimum. Only a replica preemption could
take at all moves (ready, past its minimum lifetime, on one node: the preemption
context's standing), and never one of a class above the model it makes room for.

`plan_defrag` is the pure plan; `defragment` runs after every model's step and says
the plan in the model's explanation, doing it only with LLMGW_DEFRAG on
(`Timings.defrag`); `defrag_dry_run` answers what it would do now, changing nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from catalog.domain import ModelSpec, Profile
from llmgw.core.config import Timings
from tenancy.quota import ZERO, Amount

from .capacity import standing
from .holdings import placement_amount, profile_amount
from .measured import ordered_profiles
from .placement import Inventory, Placement, refuse
from .placement.fabric import Domain
from .plan import Event, Pass, Retire
from .preemption import Context
from .refusals import DEFRAG
from .starting import start_replica
from .types import HOLDING, ModelState, NodeView, ReplicaView, Reservation, Snapshot

# A plan moving more replicas than this is not made: the churn would outweigh the gain.
MAX_MOVES = 8


@dataclass(frozen=True)
class Move:
    """One replica moved out of the domain: its replacement's placement elsewhere."""

    replica: ReplicaView
    model: ModelSpec
    to: Placement

    @property
    def said(self) -> str:
        where = ", ".join(sorted(self.replica.nodes))
        to = ", ".join(s.node_id for s in self.to.shards)
        return f"{self.replica.id} of {self.model.name} from {where} to {to}"


@dataclass(frozen=True)
class Defrag:
    """What makes room for `model` in `domain`: the moves, the replicas already leaving it
    that it counts on (retiring), and the placement it gets once they are gone."""

    model: str
    domain: Domain
    moves: tuple[Move, ...]
    leaving: tuple[str, ...]
    room: Placement

    @property
    def text(self) -> str:
        where = f"domain {self.domain[0]} clique {self.domain[1]}"
        trays = len(self.room.shards)
        freed = f"free {trays} trays of {where} for {self.model}"
        parts = []
        if self.moves:
            parts.append("moving " + ", ".join(m.said for m in self.moves))
        if self.leaving:
            parts.append("once " + ", ".join(self.leaving) + " have left")
        return f"{' '.join(parts)} would {freed}"


def _domain(node: NodeView, gpu_class: str) -> Domain | None:
    """The NVLink domain of a node's GPUs of this class, with IMEX up; None otherwise."""
    found = {g.domain for g in node.gpus if g.gpu_class == gpu_class}
    if len(found) != 1 or node.imex is not True:
        return None
    return found.pop()


def _movable(want: ModelSpec, node: str, ctx: Context) -> list[ReplicaView]:
    """The replicas on a node that may move for `want`, largest first: on one node, any
    preemptor could take them (ready, past their minimum lifetime), not taken already, and
    not of a class above `want`'s."""
    out = [
        s.replica
        for s in ctx.standing.get(node, ())
        if not s.multi
        and not s.refusal
        and s.replica.id not in ctx.taken
        and s.model.name != want.name
        and s.model.class_rank <= want.class_rank
    ]
    return sorted(out, key=lambda r: (-r.amount.gpus, r.id))


def _tray_cost(
    inv: Inventory, node: str, profile: Profile, leaving: list[ReplicaView], movers: list
) -> list[ReplicaView] | None:
    """The fewest of `movers` (largest first) whose going frees this tray for a shard;
    None when all of them going would not."""
    for k in range(len(movers) + 1):
        trial = inv.trial([node], [*leaving, *movers[:k]])
        if refuse(trial.rooms[node], profile, frozenset(), "", None) is None:
            return movers[:k]
    return None


@dataclass(frozen=True)
class _Trays:
    """The trays of one domain chosen to be freed for a profile: per tray, the replicas
    to move off it and those already leaving it."""

    profile: Profile
    domain: Domain
    trays: tuple[str, ...]
    every: frozenset[str]  # all the domain's trays: no replacement goes there
    moving: tuple[ReplicaView, ...]
    leaving: tuple[ReplicaView, ...]

    @property
    def where(self) -> str:
        return f"domain {self.domain[0]} clique {self.domain[1]}"


def _trays(
    want: ModelSpec,
    profile: Profile,
    domain: Domain,
    trays: list[str],
    inv: Inventory,
    ctx: Context,
    leaving: list[ReplicaView],
) -> _Trays | str:
    """The `profile.nodes` trays of one domain freed by the fewest moves, or why there are
    none ("" when its trays are free already: what binds is not the fabric)."""
    where = f"domain {domain[0]} clique {domain[1]}"
    costs = []
    for node in trays:
        gone = [r for r in leaving if node in r.nodes]
        movers = _tray_cost(inv, node, profile, gone, _movable(want, node, ctx))
        if movers is not None:
            costs.append((len(movers), node, movers, gone))
    costs.sort(key=lambda c: (c[0], c[1]))
    chosen = costs[: profile.nodes]
    if len(chosen) < profile.nodes:
        return f"{where}: only {len(costs)} trays could be freed; the replica needs {profile.nodes}"
    moving = tuple(r for c in chosen for r in c[2])
    left = tuple(r for c in chosen for r in c[3])
    if not moving and not left:
        return ""
    if len(moving) > MAX_MOVES:
        return f"{where}: it would take {len(moving)} moves, more than {MAX_MOVES}"
    return _Trays(profile, domain, tuple(c[1] for c in chosen), frozenset(trays), moving, left)


def _moves(
    want: ModelSpec, t: _Trays, inv: Inventory, ctx: Context, measurements: Mapping
) -> Defrag | str:
    """Each move's replacement placed outside the domain (within its owner's limits), and
    the placement `want` gets on the trays once they are gone; or why not."""
    out = inv.trial(inv.rooms)
    usage = dict(ctx.usage)
    moves = []
    for r in t.moving:
        m = ctx.models[r.model]
        runs = inv.model_nodes.get(m.name, set()) | out.model_nodes.get(m.name, set())
        placed = _replacement(out, m, t.every, frozenset(runs), measurements)
        if placed is None:
            return f"{t.where}: no room outside it for a replacement of {r.id} of {m.name}"
        need = placement_amount(placed)
        if m.owner and (over := ctx.policy.at_limit(m.owner, usage, need)):
            return f"{t.where}: a replacement of {r.id} of {m.name} would pass a limit: {over}"
        _charge(usage, ctx.policy.chain(m.owner), need)
        out.reserve(m.name, placed)
        moves.append(Move(r, m, placed))
    freed = out.trial(t.trays, [*t.moving, *t.leaving])
    room = freed.place([t.profile], model=want.name)
    if not isinstance(room, Placement):
        return f"{t.where}: its trays freed would still not take {want.name}"
    left = tuple(sorted({r.id for r in t.leaving}))
    return Defrag(want.name, t.domain, tuple(moves), left, room)


def _replacement(
    out: Inventory, m: ModelSpec, avoid: frozenset[str], runs: frozenset[str], measurements: Mapping
) -> Placement | None:
    """Where a moved replica's replacement goes, outside the domain: as its model's own
    step places (starting.py), on a node not running the model yet if there is one."""
    profiles = ordered_profiles(m, measurements)
    for away in (avoid | runs, avoid):
        placed = out.place(profiles, avoid=away, weights_source=m.source, model=m.name)
        if isinstance(placed, Placement):
            return placed
    return None


def _charge(usage: dict[str, Amount], chain: Iterable[str], need: Amount) -> None:
    for s in chain:
        usage[s] = usage.get(s, ZERO) + need


def plan_defrag(
    want: ModelSpec, inv: Inventory, ctx: Context, measurements: Mapping
) -> Defrag | list[str] | None:
    """The plan with the fewest moves that makes room for one replica of `want` over
    several trays of one NVLink domain; else why each domain cannot be freed; None when
    no such profile of it meets a known domain (defragmentation has nothing to say)."""
    why: list[str] = []
    found: list[tuple[int, int, _Trays]] = []
    leaving = [r for r in ctx.alive if r.retiring and r.state in HOLDING]
    for rank, profile in enumerate(ordered_profiles(want, measurements)):
        if profile.nodes < 2 or profile.cpu_only:
            continue
        if want.owner and ctx.policy.at_limit(want.owner, ctx.usage, profile_amount(profile)):
            continue  # its owner's limit binds, not the fabric
        domains: dict[Domain, list[str]] = {}
        for node_id in sorted(inv.rooms):
            d = _domain(inv.rooms[node_id].node, profile.gpu_class)
            if d is not None:
                domains.setdefault(d, []).append(node_id)
        for domain in sorted(domains):
            t = _trays(want, profile, domain, domains[domain], inv, ctx, leaving)
            if isinstance(t, str):
                why += [t] if t else []
            else:
                found.append((len(t.moving), rank, t))
    # The fewest moves first; placing the replacements is tried only until one fits.
    for _, _, t in sorted(found, key=lambda f: (f[0], f[1], f[2].domain)):
        plan = _moves(want, t, inv, ctx, measurements)
        if isinstance(plan, Defrag):
            return plan
        why.append(plan)
    return why or None


def _entry(found: Defrag | list[str], doing: bool) -> dict:
    """The plan as the model's explanation says it (`explain`, the console)."""
    if isinstance(found, list):
        return {"profile": DEFRAG, "reasons": found[:3]}
    said = found.text if doing else f"{found.text} (LLMGW_DEFRAG is off: said, not done)"
    return {"profile": DEFRAG, "reasons": [said]}


def defragment(p: Pass) -> None:
    """After every model's step: for each model left unplaceable that has a profile over
    several trays, plan the moves that would free one NVLink domain for it and say them
    in its explanation (once in an event); with LLMGW_DEFRAG on, do them."""
    snap = p.snap
    wanting = [
        m
        for m in snap.models.values()
        if (s := p.states.get(m.name)) is not None and s.unplaceable and not s.parked_since
    ]
    for want in sorted(wanting, key=lambda m: (-m.class_rank, m.name)):
        found = plan_defrag(want, p.inv, p.ctx, snap.measurements)
        if found is None:
            continue
        doing = p.t.defrag and isinstance(found, Defrag)
        entry = _entry(found, doing)
        state = p.states[want.name]
        was = snap.states.get(want.name)
        if not was or entry not in was.explanation:
            kind = "defrag" if isinstance(found, Defrag) else "defrag_blocked"
            p.plan.events.append(
                Event(f"model {want.name}: {entry['reasons'][0]}", kind, model=want.name)
            )
        if isinstance(found, Defrag) and doing:
            p.states[want.name] = _do(want, found, state, p)
        else:
            p.states[want.name] = replace(state, explanation=(*state.explanation, entry))


def _do(want: ModelSpec, found: Defrag, state: ModelState, p: Pass) -> ModelState:
    """Start each move's replacement, retire the replica it replaces (it stops once the
    replacement is ready), and keep the freed trays for `want` as preemption keeps room."""
    for move in found.moves:
        start_replica(move.model, move.to, p)
        why = f"moves to make room for {want.name} in domain {found.domain[0]} clique {found.domain[1]}"
        p.plan.retires.append(Retire(move.replica.id, why))
        p.ctx.taken.add(move.replica.id)
        p.live[move.model.name] = p.live.get(move.model.name, 0) - 1
    going = {m.replica.id: m.replica for m in found.moves}
    going.update((r.id, r) for r in p.ctx.alive if r.id in found.leaving)
    reserved = tuple(
        Reservation(
            s.node_id,
            s.gpu_indices,
            s.memory_gb,
            s.cpu_cores,
            tuple(sorted(rid for rid, r in going.items() if s.node_id in r.nodes)),
        )
        for s in found.room.shards
    )
    p.ctx.charge(want.owner, placement_amount(found.room))
    p.inv.keep(want.name, reserved)
    waiting = f"waiting for room being freed by {', '.join(sorted(going))}"
    return replace(
        state,
        unplaceable=False,
        explanation=({"profile": "", "reasons": [waiting]}, _entry(found, True)),
        reserved=reserved,
        reserved_until=p.now + timedelta(seconds=p.t.preempt_hold),
    )


def defrag_dry_run(model: ModelSpec, snap: Snapshot, now: datetime, t: Timings) -> dict:
    """What defragmentation would move now to make room for one replica of `model` over
    several trays, and why not; changing nothing (as the preemption dry run)."""
    st = standing(snap, now, t)
    st.inv.unreserve(model.name)
    found = plan_defrag(model, st.inv, st.ctx, snap.measurements)
    out: dict[str, Any] = {"model": model.name, "done": t.defrag, "moves": [], "blocked": []}
    if found is None:
        out["summary"] = f"{model.name} has no profile over several trays of an NVLink domain"
    elif isinstance(found, list):
        out["blocked"] = found
        out["summary"] = f"no NVLink domain can be freed for {model.name}"
    else:
        out["domain"] = f"domain {found.domain[0]} clique {found.domain[1]}"
        out["moves"] = [_move_dict(m) for m in found.moves]
        out["leaving"] = list(found.leaving)
        out["summary"] = found.text
    return out


def _move_dict(m: Move) -> dict:
    return {
        "replica": m.replica.id,
        "model": m.model.name,
        "from": sorted(m.replica.nodes),
        "to": [s.node_id for s in m.to.shards],
    }


__all__: Sequence[str] = ["Defrag", "Move", "defrag_dry_run", "defragment", "plan_defrag"]
