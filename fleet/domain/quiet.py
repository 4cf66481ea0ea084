"""Models a pass need not look at again: their step did nothing, and nothing it reads moved.

A model's step (`reconcile._reconcile_model`) is a function of its spec, its replicas
as housekeeping left them, its state at its turn, its load, what the whole pass shares
(the timings, whether it settles, the measurements, the weights being fetched, the
nodes being drained) and `now`. When a step added nothing to the plan and took nothing
from the room or the quota picture, `QuietModels` keeps its inputs and the state it
returned, with the time up to which no clock of the model could change what it decides
(a backoff ending, an on-demand model's idle timeout, a drain's deadline). The next
pass whose inputs are the very same, before that time, takes the kept state instead of
running the step again: the same inputs give the same decision, and a decision that
did nothing does nothing again.

Steps that read more than their own model are kept only with what else they read. A
model that looked for room, found none, preemption included, and did nothing (it stays
unplaceable) read every node's room and every replica: it is kept with the pass's
*world* (`World`: the nodes as placement sees them, every live replica, the room kept,
the power, the quota picture and the measurements as the pass began) and taken again
only in a pass whose world is the very same, before the world's own first clock (a
replica's protection ending or its age in minutes, which the reasons say, moving; an
on-demand replica becoming idle enough to evict; a hold or a kept room running out),
and only while no step before it in the pass changed anything (`untouched`). Never
kept: one held back for another (it reads that model's state and replicas), one whose
replicas retire (they are taken from the pass's preemption), one placed or preempted
for, and one scaling from a load whose clocks run. The shell keeps one `QuietModels` a
process; it holds no decision that was not worked out by a full step from the same
inputs.

The key every step shares is derived from the snapshot's fields (`shared_key`): a field
added to `Snapshot` joins it with nothing to remember, and a change to it makes every
kept step run again. A field is kept out of it only where it is named in `KEYED_APART`
(it joins the key per model or in the world, each step reading only its own part) or
`LEFT_OUT` (no step reads it), each with why; tests/domain/test_quiet_key.py fails on a
field the key does not follow. A field that moves every pass though nothing changed (as
`heard` does) belongs in one of them, or every model runs every pass:
tests/fleet/test_reconciler_quiet.py, a pass over real rows, says so.

What it buys (benchmarks/reconcile_pass.py, docs/benchmarks.md "A reconciler pass with
nothing to do"): at 5,000 nodes, 10,000 replicas and 5,020 models, 20 of them
unplaceable, `decide` took 969 ms over every model and 37 ms as the pass runs it with
the models skipped, the whole pass 1,461 ms before the world was kept and 103 ms after
(SQLite, 2026-12-02); a stuck model's search is about 50 ms at that scale. Before any
model was unplaceable, 33 ms over every model against 19 ms as run. Its cost: every pass
compares each model's inputs with those it was last decided from, about 15 ms of the
pass at that scale, and the world about 7 ms. tests/domain/test_quiet.py holds every
plan it makes to a full pass's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from catalog.domain import ModelSpec

from .types import Load, ModelState, NodeView, ReplicaView, Snapshot

# What a step read (`_reconcile_model`): its own model and clocks only; or also the room it
# looked for and found none in.
OWN, WORLD = "own", "world"

# The snapshot's fields that join the memo's key other than through the key every step
# shares (`shared_key`): each step is kept with its own part (`QuietModels.get`), and a
# step looking for room with all of it (`world_of`). In the shared key they would make
# every kept step run again whenever any model's part moved.
KEYED_APART: Mapping[str, str] = {
    "models": "each step is kept with its own spec; the world holds every model's",
    "replicas": "each step is kept with its own, as housekeeping left them; the world "
    "holds every live one",
    "states": "each step is kept with its own state; the world's clocks read the holds",
    "loads": "each step is kept with its own load (they move with every engine's report)",
    "nodes": "only a step looking for room reads them: the world holds them as liveness "
    "left them; which are draining joins the shared key (`Pass.draining`)",
    "policy": "only a step looking for room reads the quotas: the world holds them",
    "power": "only a step looking for room reads it (the GPUs' draw moves with their "
    "reports): the world holds it",
}
# The snapshot's fields no step reads, so they join no key: what they change, a step
# reads from its own part or the world.
LEFT_OUT: Mapping[str, str] = {
    "heard": "moves with every heartbeat; read only by liveness and health, before any "
    "step, into the nodes' and replicas' states",
    "silence_floor": "read only by liveness and health, before any step, as `heard`",
    "failures": "read only by housekeeping, before any step, into the model states it counts",
}


def shared_key(snap: Snapshot, *more: object) -> tuple:
    """What every step of a pass shares (`QuietModels.begin`): every field of the snapshot
    but those `KEYED_APART` or `LEFT_OUT`, by name, each mapping copied (the shell may hand
    over the same one changed), then `more` (the timings, the nodes draining)."""
    # As a plain `type`: mypy checks a class against Hashable by its instances' __hash__.
    kind: type = type(snap)
    values = ((name, getattr(snap, name)) for name in shared_fields(kind))
    return (*((n, dict(v) if isinstance(v, Mapping) else v) for n, v in values), *more)


@cache
def shared_fields(kind: type) -> tuple[str, ...]:
    """The names of the fields of a snapshot type that join the shared key."""
    return tuple(
        f.name for f in fields(kind) if f.name not in KEYED_APART and f.name not in LEFT_OUT
    )


@dataclass(frozen=True)
class Quiet:
    """One step that did nothing: what it read, what it returned, and until when."""

    spec: ModelSpec
    # A list, compared with the pass's own in C (each view first by identity: the
    # snapshot reuses the views of unchanged rows).
    replicas: list[ReplicaView]
    state_in: ModelState
    load: Load | None
    state_out: ModelState
    since: datetime
    # The first moment one of its clocks could decide otherwise; None: none runs.
    until: datetime | None
    # Kept with the pass's world (the number `QuietModels` gave it), 0: with none.
    world: int = 0


@dataclass(frozen=True)
class World:
    """What a step looking for room reads beyond its own model, as the pass began (`key`,
    compared by value), and the first moment one of its clocks moves (`until`)."""

    key: tuple
    until: datetime | None


class QuietModels:
    """Per model, its last step that did nothing, for the next pass to reuse while its
    inputs stay the same (see the module's docstring). Not thread-safe: one pass at a
    time uses it, as passes run one at a time."""

    def __init__(self) -> None:
        self._kept: dict[str, Quiet] = {}
        self._shared: object = None
        self._order: tuple[object, list[ModelSpec]] | None = None
        # The last world worked out and its number (a new number when it differs); this
        # pass's, once asked for; how to work it out, and what "untouched" compares.
        self._world: World | None = None
        self._world_no = 0
        self._world_now: World | None = None
        self._world_of: Callable[[], World] | None = None
        self._touched: Callable[[], object] | None = None
        self._untouched: object = None
        # What the last pass did: steps skipped and steps run (for tests and benchmarks).
        self.skipped = 0
        self.ran = 0

    def begin(
        self,
        shared: object,
        world: Callable[[], World] | None = None,
        touched: Callable[[], object] | None = None,
    ) -> None:
        """Start a pass: what every step shares (when it changed, nothing kept holds); how
        to work out its world, and what the pass has changed so far (`touched()`, the same
        as now while no step changed anything)."""
        if shared != self._shared:
            self._kept.clear()
            self._shared = shared
        self.skipped = self.ran = 0
        self._world_now, self._world_of, self._touched = None, world, touched
        self._untouched = touched() if touched is not None else None

    def world(self) -> tuple[int, World] | None:
        """This pass's world and its number, worked out once a pass (None: no way to)."""
        if self._world_of is None:
            return None
        if self._world_now is None:
            now = self._world_of()
            if self._world is None or now.key != self._world.key:
                self._world_no += 1
            # The same world keeps its number; its first clock is this pass's.
            self._world = self._world_now = now
        return self._world_no, self._world_now

    def untouched(self) -> bool:
        """Whether no step of this pass changed anything yet (the plan, the room, usage)."""
        return self._touched is not None and self._touched() == self._untouched

    def get(
        self,
        spec: ModelSpec,
        replicas: list[ReplicaView],
        state: ModelState,
        load: Load | None,
        now: datetime,
    ) -> ModelState | None:
        """The state its step returned from the same inputs, while no clock of it ran out;
        None: run the step."""
        kept = self._kept.get(spec.name)
        if (
            kept is None
            or not (kept.since <= now and (kept.until is None or now < kept.until))
            or not (kept.spec is spec or kept.spec == spec)
            or not (kept.state_in is state or kept.state_in == state)
            or kept.load != load
            or kept.replicas != replicas
        ):
            return None
        if kept.world and not (
            self.untouched()
            and (world := self.world()) is not None
            and world[0] == kept.world
            and (world[1].until is None or now < world[1].until)
        ):
            return None
        self.skipped += 1
        return kept.state_out

    def put(self, quiet: Quiet | None, name: str) -> None:
        """Keep a step that did nothing (`quiet`), or forget the model's (None)."""
        self.ran += 1
        if quiet is None:
            self._kept.pop(name, None)
        else:
            self._kept[name] = quiet

    def ordered(self, key: object, order: Callable[[], list[ModelSpec]]) -> list[ModelSpec]:
        """The pass's order of models (`order()`), worked out again only when what it is
        worked out from (`key`) changed."""
        if self._order is None or self._order[0] != key:
            self._order = (key, order())
        return self._order[1]

    def trim(self, names: Collection[str]) -> None:
        """Forget models that are gone."""
        if len(self._kept) > len(names):
            for gone in self._kept.keys() - set(names):
                del self._kept[gone]


def world_of(
    p: Any,
    nodes: Mapping[str, NodeView],
    alive: Sequence[ReplicaView],
    reserved: Mapping[str, Sequence[object]],
    usage: Mapping[str, object],
) -> World:
    """The world of a pass (`p`, a plan.Pass) as it began: its nodes after liveness, its
    live replicas, the room kept, what each scope held (`usage`, copied before any step),
    the power, the quota policy, the models and measurements; and its first clock."""
    snap, now, t = p.snap, p.now, p.t
    key = (
        # The shell hands over the same view of a node while its row is the same (its
        # last-seen time is apart, in snap.heard): the tuples compare by identity first.
        tuple(nodes.values()),
        tuple(alive),
        {m: tuple(r) for m, r in reserved.items()},
        snap.power,
        snap.policy,
        dict(usage),
        snap.models,
        snap.measurements,
    )
    clocks: list[datetime] = []
    protected_since = now - timedelta(seconds=t.min_lifetime)
    for r in alive:
        if r.ready_at is not None and r.ready_at > protected_since and r.state == "ready":
            # Protected after it became ready; the reasons say for how many minutes.
            age = (now - r.ready_at).total_seconds()
            tick = min(t.min_lifetime, 60 * (age // 60 + 1))
            clocks.append(r.ready_at + timedelta(seconds=tick))
        if r.last_used_at is not None:
            if r.last_used_at >= now:  # idle time still to start: the order of victims moves
                clocks.append(r.last_used_at + timedelta(microseconds=1))
            elif (m := snap.models.get(r.model)) is not None and m.on_demand:
                clocks.append(r.last_used_at + timedelta(seconds=t.eviction_grace))
    for s in snap.states.values():
        clocks.extend(c for c in (s.held_until, s.reserved_until) if c is not None)
    return World(key, min((c for c in clocks if c > now), default=None))
