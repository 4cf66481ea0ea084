"""Where a replica can run: filters that refuse nodes in sentences, then an order to pick by.

`Inventory` is the free room on each node, built from the snapshot and updated
as replicas are placed in a pass, so each placement sees what the previous took.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

from catalog.domain import Profile

from .power import Ledger, Power
from .refusals import SHORT, UNAVAILABLE, UNSUITED, NodeRefusal, binding, one_line
from .spread import Spread, located
from .types import FABRIC_LABEL, HOLDING, NodeView, ReplicaView, Reservation, ShardView

PORT_BASE = 20000
MAX_REASONS_PER_PROFILE = 25
# From this many nodes, one-node GPU placements go through an index of free GPUs.
INDEX_FROM = 64


@dataclass
class NodeRoom:
    """What one node has left, as placement counts it."""

    node: NodeView
    # class -> indices free to place on: healthy, held by no replica nor by other processes
    free_gpus: dict[str, list[int]] = field(default_factory=dict)
    memory_reserved: float = 0.0
    cores_reserved: int = 0
    shards: int = 0
    ports: set[int] = field(default_factory=set)

    # Zero is unknown, never a reading (domain.md): a node reporting 0 constrains nothing.
    @property
    def memory_free(self) -> float | None:
        if not self.node.memory_gb:
            return None
        return self.node.memory_gb - self.memory_reserved

    @property
    def cores_free(self) -> int | None:
        if not self.node.cpu_count:
            return None
        return self.node.cpu_count - self.cores_reserved

    def copy(self) -> NodeRoom:
        return NodeRoom(
            node=self.node,
            free_gpus={c: list(i) for c, i in self.free_gpus.items()},
            memory_reserved=self.memory_reserved,
            cores_reserved=self.cores_reserved,
            shards=self.shards,
            ports=set(self.ports),
        )

    def next_port(self) -> int:
        port = PORT_BASE
        while port in self.ports:
            port += 1
        return port


@dataclass(frozen=True)
class ShardPlan:
    node_id: str
    rank: int
    gpu_indices: tuple[int, ...]
    memory_gb: float | None
    cpu_cores: int | None
    http_port: int


@dataclass(frozen=True)
class Placement:
    profile: Profile
    shards: tuple[ShardPlan, ...]
    # What the choice went by beyond the usual order, in sentences: the spread over racks,
    # a draw that could not be counted against a budget (docs/facility.md).
    said: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """Why no profile could be placed: per profile, a sentence per node (or one for all)."""

    reasons: tuple[tuple[str, tuple[str, ...]], ...]
    # Per profile, every refusal, uncut: its one line (refusals.binding) is made only when
    # the explanation is asked for, not by the trials of preemption and headroom.
    judged: tuple[tuple[str, ...], ...] = ()

    def as_explanation(self) -> list[dict]:
        summaries = (binding(j).text for j in self.judged)
        said = dict(zip((p for p, _ in self.reasons), summaries, strict=False))
        return [
            {"profile": p, "reasons": list(r), **({"summary": said[p]} if said.get(p) else {})}
            for p, r in self.reasons
        ]

    def summary(self) -> str:
        return one_line(self.as_explanation()) or "no profile fits"


class Inventory:
    """Free GPUs, memory, cores and ports per node, after what holding replicas take."""

    def __init__(
        self,
        nodes: Mapping[str, NodeView],
        replicas: Iterable[ReplicaView],
        reserved: Mapping[str, Iterable[Reservation]] | None = None,
        power: Power | None = None,
    ):
        # Built on first use: a pass with nothing to place never needs it.
        self._nodes = nodes
        self._replicas = replicas
        self._power = power
        self._rooms: dict[str, NodeRoom] | None = None
        # Watts held under each rack's and PDU's budget (None: no budget applies), and each
        # model's replicas per rack and zone (None: no node says where it is).
        self.ledger: Ledger | None = None
        self.spread: Spread | None = None
        self._model_nodes: dict[str, set[str]] = defaultdict(set)
        # Per model, room freed for it by preemption, taken from everyone else meanwhile.
        self.reserved: dict[str, list[Reservation]] = {
            m: list(r) for m, r in (reserved or {}).items() if r
        }
        # Built on the first one-node GPU placement of a large inventory: per GPU class, the
        # nodes by how many of those GPUs they have free (ids sorted), and who holds weights.
        self._buckets: dict[str, dict[int, list[str]]] | None = None
        self._weights: dict[str, list[str]] = {}
        self._holding: dict[str, ReplicaView] = {}

    @classmethod
    def of_rooms(cls, rooms: dict[str, NodeRoom]) -> Inventory:
        inv = cls({}, ())
        inv._rooms = rooms
        return inv

    def trial(self, node_ids: Iterable[str], release: Iterable[ReplicaView] = ()) -> Inventory:
        """A copy of some nodes' room with these replicas' shards given back: what placement
        would find there if they stopped. The inventory itself is not changed."""
        rooms = {n: self.rooms[n].copy() for n in node_ids if n in self.rooms}
        trial = Inventory.of_rooms(rooms)
        # The whole budgets go with it: what the victims draw is freed in their rack too.
        trial.ledger = self.ledger.copy() if self.ledger is not None else None
        trial.spread = self.spread
        for replica in release:
            for shard in replica.shards:
                trial._give_back(shard)
        return trial

    @property
    def rooms(self) -> dict[str, NodeRoom]:
        if self._rooms is None:
            self._build()
        return self._rooms

    @property
    def model_nodes(self) -> dict[str, set[str]]:
        if self._rooms is None:
            self._build()
        return self._model_nodes

    def _build(self) -> None:
        self._rooms = {}
        labels = {n.id: n.labels for n in self._nodes.values()}
        self.ledger = Ledger.of(self._power, labels)
        self.spread = Spread(labels) if located(labels.values()) else None
        for node in self._nodes.values():
            free: dict[str, list[int]] = defaultdict(list)
            for gpu in node.gpus:
                if gpu.free_to_place:
                    free[gpu.gpu_class].append(gpu.index)
            self._rooms[node.id] = NodeRoom(node=node, free_gpus=dict(free))
        self._holding = {}
        for replica in self._replicas:
            if replica.state in HOLDING:
                self._holding[replica.id] = replica
                for shard in replica.shards:
                    self._take(shard)
                    self._model_nodes[replica.model].add(shard.node_id)
                if self.spread is not None:
                    self.spread.add(replica.model, replica.nodes)
        for model, held in list(self.reserved.items()):
            self.reserved.pop(model)
            self.keep(model, held)

    def keep(self, model: str, room: Iterable[Reservation]) -> None:
        """Keep room for a model: what of it is free now is taken from everyone else; what
        its victims still hold stays theirs until they are gone, then is kept too."""
        kept = []
        for r in room:
            here = self.rooms.get(r.node_id)
            if here is None:
                continue
            victims = [
                s
                for v in r.victims
                if (held := self._holding.get(v)) is not None
                for s in held.shards
                if s.node_id == r.node_id
            ]
            busy = {i for s in victims for i in s.gpu_indices}
            free = {i for ids in here.free_gpus.values() for i in ids}
            kept.append(
                Reservation(
                    r.node_id,
                    tuple(i for i in r.gpu_indices if i in free and i not in busy),
                    max((r.memory_gb or 0.0) - sum(s.memory_gb or 0.0 for s in victims), 0.0),
                    max((r.cpu_cores or 0) - sum(s.cpu_cores or 0 for s in victims), 0),
                    r.victims,
                )
            )
        for r in kept:
            self._take(r)
        if kept:
            self.reserved.setdefault(model, []).extend(kept)

    def unreserve(self, model: str) -> list[Reservation]:
        """Give a model the room kept for it (to place into); returns it, to keep it again."""
        if self._rooms is None:  # built first: building applies the reservations
            self._build()
        held = self.reserved.pop(model, [])
        for r in held:
            self._give_back(r)
        return held

    def rereserve(self, model: str, held: list[Reservation]) -> None:
        """Keep again, exactly, room a model could not use this time."""
        for r in held:
            self._take(r)
        if held:
            self.reserved[model] = held

    def _index(self) -> dict[str, dict[int, list[str]]]:
        if self._buckets is None:
            buckets: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
            weights: dict[str, list[str]] = defaultdict(list)
            for node_id in sorted(self.rooms):
                room = self.rooms[node_id]
                for cls, free in room.free_gpus.items():
                    buckets[cls][len(free)].append(node_id)
                for source in room.node.weights:
                    weights[source].append(node_id)
            self._buckets, self._weights = buckets, weights
        return self._buckets

    def _reindex(self, room: NodeRoom, before: dict[str, int]) -> None:
        """Move a node between free-count buckets after its free GPUs changed."""
        if self._buckets is None:
            return
        for cls, free in room.free_gpus.items():
            was = before.get(cls, 0)
            if was != len(free):
                self._buckets[cls][was].remove(room.node.id)
                bisect.insort(self._buckets[cls][len(free)], room.node.id)

    def _take(self, shard: ShardView | ShardPlan | Reservation) -> None:
        room = self.rooms.get(shard.node_id)
        if room is None:
            return
        taken = set(shard.gpu_indices)
        if taken:
            before = {c: len(i) for c, i in room.free_gpus.items()}
            for cls, indices in room.free_gpus.items():
                room.free_gpus[cls] = [i for i in indices if i not in taken]
            self._reindex(room, before)
            if self.ledger is not None:
                self.ledger.take(room.node.id, taken)
        room.memory_reserved += shard.memory_gb or 0.0
        room.cores_reserved += shard.cpu_cores or 0
        if not isinstance(shard, Reservation):
            room.shards += 1
            room.ports.add(shard.http_port)

    def _give_back(self, shard: ShardView | Reservation) -> None:
        room = self.rooms.get(shard.node_id)
        if room is None:
            return
        given = set(shard.gpu_indices)
        before = {c: len(i) for c, i in room.free_gpus.items()}
        for gpu in room.node.gpus:
            if gpu.index in given and gpu.free_to_place:
                free = room.free_gpus.setdefault(gpu.gpu_class, [])
                if gpu.index not in free:
                    free.append(gpu.index)
        if given:
            self._reindex(room, before)
            if self.ledger is not None:
                self.ledger.take(room.node.id, given, -1)
        room.memory_reserved -= shard.memory_gb or 0.0
        room.cores_reserved -= shard.cpu_cores or 0
        if not isinstance(shard, Reservation):
            room.shards -= 1
            room.ports.discard(shard.http_port)

    def reserve(self, model: str, placement: Placement) -> None:
        """Take a placement's room so the next placement in this pass sees it gone."""
        for shard in placement.shards:
            self._take(shard)
            self.model_nodes[model].add(shard.node_id)
        if self.spread is not None:
            self.spread.add(model, (s.node_id for s in placement.shards))

    def place(
        self,
        profiles: Sequence[Profile],
        *,
        avoid: frozenset[str] = frozenset(),
        weights_source: str = "",
        judge: bool = True,
        model: str = "",
    ) -> Placement | Refusal:
        """The first profile, in the order given, that fits; else why each did not (with
        `judge=False`, an indexed search that finds nothing does not judge every node).
        With `model`, its replicas are spread over racks and zones (spread.py)."""
        reasons, judged = [], []
        for profile in profiles:
            result = self._place_profile(profile, avoid, weights_source, judge, model)
            if isinstance(result, Placement):
                return result
            reasons.append((profile.name, tuple(_cap(result))))
            judged.append(tuple(result))
        return Refusal(tuple(reasons), tuple(judged))

    def place_spread(
        self, profiles: Sequence[Profile], avoid: frozenset[str], source: str = "", model: str = ""
    ) -> Placement | Refusal:
        """Place avoiding nodes that already run the model; give that up when it is the only
        obstacle (a second replica on one node still survives an engine crash)."""
        placed = self.place(
            profiles, avoid=avoid, weights_source=source, judge=not avoid, model=model
        )
        if isinstance(placed, Placement) or not avoid:
            return placed
        return self.place(profiles, weights_source=source, model=model)

    def _first_fit(
        self, profile: Profile, avoid: frozenset[str], source: str, model: str = ""
    ) -> NodeRoom | None:
        """The node a one-node GPU profile goes to, found through the index rather than by
        judging every node: holders of the weights first, then the fewest free (pack). While
        the model's replicas are spread over racks, the rack and zone holding fewest of them
        come before both (`Spread.first`)."""
        buckets = self._index().get(profile.gpu_class)
        if not buckets:
            return None
        need, rooms, spread = profile.gpus_on_each_node, self.rooms, self.spread

        def fits(node_id: str) -> bool:
            return refuse(rooms[node_id], profile, avoid, source, self.ledger) is None

        held = [n for n in self._weights.get(source, ()) if fits(n)] if source else []
        ordered = (
            n
            for free in sorted(f for f, ids in buckets.items() if f >= need and ids)
            for n in buckets[free]
            if n not in avoid
        )
        if spread is not None and spread.holds(model):

            def key(node_id: str) -> tuple:
                return (*spread.key(model, node_id), *_preference(rooms[node_id], profile, source))

            found = spread.first(model, held, ordered, fits, key)
            return rooms[found] if found is not None else None
        if held:
            return min(
                (rooms[n] for n in held),
                key=lambda r: (len(r.free_gpus.get(profile.gpu_class, ())), r.node.id),
            )
        return next((rooms[n] for n in ordered if fits(n)), None)

    def _place_profile(
        self,
        profile: Profile,
        avoid: frozenset[str],
        source: str,
        judge: bool = True,
        model: str = "",
    ) -> Placement | list[str]:
        spread = self.spread if self.spread is not None and self.spread.holds(model) else None
        if profile.nodes == 1 and not profile.cpu_only and len(self.rooms) >= INDEX_FROM:
            room = self._first_fit(profile, avoid, source, model)
            if room is not None:
                return self._placed(profile, [room], model, spread is not None)
            if not judge:
                return []
            # Nothing fits: judge every node, for the sentences saying why.
        eligible: list[NodeRoom] = []
        refused: list[str] = []
        for room in self.rooms.values():
            why = refuse(room, profile, avoid, source, self.ledger)
            if why is None:
                eligible.append(room)
            else:
                refused.append(why)

        def order(r: NodeRoom) -> tuple:
            near = spread.key(model, r.node.id) if spread is not None else (0, 0)
            return (*near, *_preference(r, profile, source))

        if profile.nodes == 1:
            if eligible:
                best = min(eligible, key=order)
                return self._placed(profile, [best], model, spread is not None)
            return refused or ["there are no nodes"]
        eligible.sort(key=order)
        chosen = _fabric_group(eligible, profile.nodes)
        if chosen is not None and self.ledger is not None:
            # Each shard alone was judged by `refuse`; together they may pass a budget.
            each = [(r.node.id, self._shard(r, profile, 0).gpu_indices) for r in chosen]
            if over := self.ledger.refusal_together(each):
                return [*refused, over]
        if chosen is None:
            groups = defaultdict(int)
            for room in eligible:
                if FABRIC_LABEL in room.node.labels:
                    groups[room.node.labels[FABRIC_LABEL]] += 1
            largest = max(groups.values(), default=0)
            refused.append(
                f"no {FABRIC_LABEL} group has {profile.nodes} eligible nodes (the largest has {largest})"
            )
            return refused
        return self._placed(profile, chosen, model, spread is not None)

    def _placed(
        self, profile: Profile, rooms: list[NodeRoom], model: str, spread: bool = False
    ) -> Placement:
        """The placement on these nodes, with what it went by said (spread, unknown draw)."""
        shards = tuple(self._shard(r, profile, i) for i, r in enumerate(rooms))
        said = []
        if spread and self.spread is not None:
            said.append(self.spread.said(model, rooms[0].node.id))
        if self.ledger is not None:
            said.extend(u for s in shards if (u := self.ledger.unknown(s.node_id, s.gpu_indices)))
        return Placement(profile, shards, tuple(said))

    def _shard(self, room: NodeRoom, profile: Profile, rank: int) -> ShardPlan:
        need = profile.gpus_on_each_node
        indices = tuple(sorted(room.free_gpus.get(profile.gpu_class, []))[:need]) if need else ()
        return ShardPlan(
            node_id=room.node.id,
            rank=rank,
            gpu_indices=indices,
            memory_gb=profile.min_memory_gb,
            cpu_cores=profile.reserved_cores,
            http_port=room.next_port(),
        )


def _cap(reasons: list[str]) -> list[str]:
    if len(reasons) <= MAX_REASONS_PER_PROFILE:
        return reasons
    more = len(reasons) - MAX_REASONS_PER_PROFILE
    return [*reasons[:MAX_REASONS_PER_PROFILE], f"and {more} more nodes"]


def _gb(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


def refuse(
    room: NodeRoom,
    profile: Profile,
    avoid: frozenset[str],
    source: str,
    ledger: Ledger | None = None,
) -> NodeRefusal | None:
    """Why this node cannot take a shard of this profile now, in a sentence; None when it can.
    With `ledger`, a shard that would take its rack or PDU past a power budget is refused.
    The sentence carries how close the node came (refusals.py), for the one-line summary."""
    node = room.node
    if (why := _unavailable(node, profile, avoid)) is not None:
        return why
    need = profile.gpus_on_each_node
    if (why := _unsuited(node, profile, need)) is not None:
        return why
    cls = profile.gpu_class
    if need:
        total = node.gpu_totals.get(cls, 0)
        free = len(room.free_gpus.get(cls, ()))
        if free < need:
            held = sum(1 for g in node.gpus if g.held and g.gpu_class == cls)
            others = f" ({held} held by other processes)" if held else ""
            return _short(
                node,
                f"has {free} free {cls} GPUs of {total}, needs {need}{others}",
                _said_of_class("has too few free {} GPUs", "have too few free {} GPUs", cls),
                "gpus",
                need - free,
            )
    free_memory = room.memory_free
    if (
        profile.min_memory_gb is not None
        and free_memory is not None
        and free_memory < profile.min_memory_gb
    ):
        return _short(
            node,
            f"has {_gb(node.memory_gb)} GB of memory with "
            f"{_gb(max(free_memory, 0))} GB free, needs {_gb(profile.min_memory_gb)}",
            ("has too little free memory", "have too little free memory"),
            "memory",
            profile.min_memory_gb - max(free_memory, 0),
        )
    cores = profile.reserved_cores
    if cores and room.cores_free is not None and room.cores_free < cores:
        return _short(
            node,
            f"has {node.cpu_count} CPUs with {max(room.cores_free, 0)} free, needs {cores}",
            ("has too few free CPUs", "have too few free CPUs"),
            "cores",
            cores - max(room.cores_free, 0),
        )
    if (
        profile.min_disk_gb is not None
        and node.disk_free_gb is not None
        and not (source and source in node.weights)
        and node.disk_free_gb < profile.min_disk_gb
    ):
        return _short(
            node,
            f"has {_gb(node.disk_free_gb)} GB of disk free, needs {_gb(profile.min_disk_gb)}",
            ("has too little free disk", "have too little free disk"),
            "disk",
            profile.min_disk_gb - node.disk_free_gb,
        )
    if ledger is not None and need:
        indices = tuple(sorted(room.free_gpus.get(cls, []))[:need])
        if (over := ledger.refusal(node.id, indices)) is not None:
            return NodeRefusal(
                over, node.id, SHORT, ("is at a power budget", "are at a power budget"), "power"
            )
    return None


def _short(
    node: NodeView, words: str, group: tuple[str, str], kind: str, missing: float
) -> NodeRefusal:
    return NodeRefusal(f"node {node.id} {words}", node.id, SHORT, group, kind, missing)


def _unavailable(node: NodeView, profile: Profile, avoid: frozenset[str]) -> NodeRefusal | None:
    """Why the node takes nothing now (its state, an operator's order, this model already
    there); one that could run the profile otherwise is close, one that could not is not."""
    if node.state != "ready":
        words, group = f"is {node.state}", (f"is {node.state}", f"are {node.state}")
    elif not node.approved:
        words = f"awaits an operator's approval (llmgw ctl node approve {node.id})"
        group = ("awaits an operator's approval", "await an operator's approval")
    elif node.address_refusal:
        return NodeRefusal(
            node.address_refusal,
            node.id,
            _closeness(node, profile),
            ("has an address not approved", "have addresses not approved"),
        )
    elif node.draining:
        words, group = "is draining", ("is draining", "are draining")
    elif node.cordoned:
        words, group = "is cordoned", ("is cordoned", "are cordoned")
    elif node.id in avoid:
        words = "already runs a replica of this model"
        group = ("already runs a replica of this model", "already run a replica of this model")
    else:
        return None
    return NodeRefusal(f"node {node.id} {words}", node.id, _closeness(node, profile), group)


@cache
def _said_of_class(one: str, many: str, gpu_class: str) -> tuple[str, str]:
    """A refusal's words for counting, made once per GPU class: a full fleet refuses
    thousands of nodes for the same reason."""
    return one.format(gpu_class), many.format(gpu_class)


def _closeness(node: NodeView, profile: Profile) -> int:
    return UNAVAILABLE if _unsuited(node, profile, profile.gpus_on_each_node) is None else UNSUITED


def _unsuited(node: NodeView, profile: Profile, need: int) -> NodeRefusal | None:
    """Why the node could not run the profile even empty and ready: its labels, engine, or
    GPUs of the class (`need` a node)."""
    for key, value in profile.node_selector.items():
        if node.labels.get(key) != value:
            words = f"lacks the label {key}={value}"
            return NodeRefusal(
                f"node {node.id} {words}",
                node.id,
                UNSUITED,
                (words, f"lack the label {key}={value}"),
            )
    if (lacks := engine_refusal(node, profile.engine)) is not None:
        return lacks
    if need and node.gpu_totals.get(profile.gpu_class, 0) == 0:
        cls = profile.gpu_class
        return NodeRefusal(
            f"node {node.id} has no {cls} GPUs",
            node.id,
            UNSUITED,
            _said_of_class("has no {} GPUs", "have no {} GPUs", cls),
        )
    return None


def engine_refusal(node: NodeView, engine: str) -> NodeRefusal | None:
    """Why the node cannot run ``engine``, in a sentence; None when it has it or can install it.

    An engine it lacks is installable when the mirror holds a build for the node's
    platform, unless installing that very version failed there (the agent keeps the
    failure until it restarts; a newer build is tried afresh).
    """
    if node.engines is None or engine in node.engines:
        return None
    offered = node.installable.get(engine)
    tried = node.install_of(engine)
    if tried is not None and tried.state == "failed" and offered in (None, tried.version):
        return NodeRefusal(
            f"node {node.id} could not install {engine} {tried.version}: {tried.detail}",
            node.id,
            UNSUITED,
            (f"could not install {engine}", f"could not install {engine}"),
        )
    if offered is not None:
        return None
    return NodeRefusal(
        f"node {node.id} has no {engine} engine installed",
        node.id,
        UNSUITED,
        (f"has no {engine} engine installed", f"have no {engine} engine installed"),
    )


def could_ever_run(node: NodeView, profile: Profile, source: str = "") -> bool:
    """Whether the node could take a shard of this profile if nothing ran on it: the right
    state, labels, engine, GPU class and size. Preemption looks for victims only there."""
    if node.state != "ready" or not node.approved or node.address_refusal:
        return False
    need = profile.gpus_on_each_node
    if node.draining or node.cordoned or _unsuited(node, profile, need) is not None:
        return False
    usable = sum(1 for g in node.gpus if g.free_to_place and g.gpu_class == profile.gpu_class)
    if need and usable < need:
        return False
    if profile.min_memory_gb and node.memory_gb and node.memory_gb < profile.min_memory_gb:
        return False
    cores = profile.reserved_cores
    if cores and node.cpu_count and node.cpu_count < cores:
        return False
    return not (
        profile.min_disk_gb is not None
        and node.disk_free_gb is not None
        and not (source and source in node.weights)
        and node.disk_free_gb < profile.min_disk_gb
    )


def _preference(room: NodeRoom, profile: Profile, source: str) -> tuple:
    """Weights already there first; then pack GPUs (fewest free) or spread CPU replicas; then id."""
    has_weights = bool(source) and source in room.node.weights
    if profile.cpu_only:
        spread = room.shards
    else:
        spread = len(room.free_gpus.get(profile.gpu_class, []))
    return (not has_weights, spread, room.node.id)


def _fabric_group(eligible: list[NodeRoom], count: int) -> list[NodeRoom] | None:
    groups: dict[str, list[NodeRoom]] = defaultdict(list)
    for room in eligible:
        fabric = room.node.labels.get(FABRIC_LABEL)
        if fabric:
            groups[fabric].append(room)
    # Groups keep the preference order of `eligible`; ties between fabrics go by name.
    for fabric in sorted(groups):
        if len(groups[fabric]) >= count:
            return groups[fabric][:count]
    return None
