"""The free room on every node, and `place`, which composes the filters and the scorers.

`Inventory` is the free room on each node, built from the snapshot and updated
as replicas are placed in a pass, so each placement sees what the previous took.
`place` asks every node the filters (filters.py), orders those that pass by the
scorers (scorers.py), and for a profile over several nodes takes a fabric group
(fabric.py); on large fleets a one-node GPU profile goes through an index that
finds what that would, judging only the nodes it walks.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain

from catalog.domain import Profile

from ..conditions import Facility, Standing
from ..power import Ledger, Power
from ..spread import Spread, located
from ..types import HOLDING, NodeView, ReplicaView, Reservation, ShardView
from . import filters, scorers
from .fabric import fabric_group, no_group_said
from .outcome import Placement, Refusal, ShardPlan, cap
from .room import Ask, NodeRoom

# From this many nodes, one-node GPU placements go through an index of free GPUs.
INDEX_FROM = 64


class Inventory:
    """Free GPUs, memory, cores and ports per node, after what holding replicas take."""

    def __init__(
        self,
        nodes: Mapping[str, NodeView],
        replicas: Iterable[ReplicaView],
        reserved: Mapping[str, Iterable[Reservation]] | None = None,
        power: Power | None = None,
        facility: Facility | None = None,
    ):
        # Built on first use: a pass with nothing to place never needs it.
        self._nodes = nodes
        self._replicas = replicas
        self._power = power
        self._facility = facility
        # Per node in a warm, hot or held domain, its standing (None: no node is), and
        # whether conditions are enforced (conditions.Facility).
        self.standing: dict[str, Standing] | None = None
        self.enforce = facility.enforce if facility is not None else False
        self._rooms: dict[str, NodeRoom] | None = None
        # Watts held under each rack's and PDU's budget (None: no budget applies), and each
        # model's replicas per rack, PDU and place of the tree (None: no node says where it is).
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
        # Under power budgets, the same split by the budgeted racks and PDUs a node is in,
        # so the walk can take the domains with most watts left first (`_walk_by_power`).
        self._by_domains: dict[str, dict[int, dict[tuple, list[str]]]] = {}
        self._weights: dict[str, list[str]] = {}
        self._holding: dict[str, ReplicaView] = {}
        # Whether any node says which of its GPUs NVLink joins (None: not looked yet).
        self._links: bool | None = None

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
        trial.standing, trial.enforce = self.standing, self.enforce
        for replica in release:
            declared = self._declared(replica)
            for shard in replica.shards:
                trial._give_back(shard, declared)
        return trial

    @property
    def rooms(self) -> dict[str, NodeRoom]:
        if self._rooms is None:
            self._build()
        assert self._rooms is not None  # _build sets it
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
        if self._facility is not None:
            self.standing = self._facility.of(labels) or None
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
                declared = self._declared(replica)
                for shard in replica.shards:
                    self._take(shard, declared)
                    self._model_nodes[replica.model].add(shard.node_id)
                if self.spread is not None:
                    self.spread.add(replica.model, replica.nodes)
        if self.ledger is not None and self._power is not None:
            self.ledger.meter(self._power.metered)
        for model, held in list(self.reserved.items()):
            self.reserved.pop(model)
            self.keep(model, held)

    def _declared(self, replica: ReplicaView) -> float | None:
        """What each shard of a holding replica is declared to draw: its profile's
        `power_watts` shared over its shards; None when it declares none."""
        if self._power is None or not replica.shards:
            return None
        declared = self._power.declared.get((replica.model, replica.profile))
        return declared / len(replica.shards) if declared else None

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
                    if self.ledger is not None:
                        self._domain_bucket(cls, len(free), node_id).append(node_id)
                for source in room.node.weights:
                    weights[source].append(node_id)
            self._buckets, self._weights = buckets, weights
        return self._buckets

    def _domain_bucket(self, cls: str, free: int, node_id: str) -> list[str]:
        assert self.ledger is not None  # only kept under budgets
        domains = self.ledger.node_domains.get(node_id, ())
        by_free = self._by_domains.setdefault(cls, {})
        return by_free.setdefault(free, {}).setdefault(domains, [])

    def _reindex(self, room: NodeRoom, before: dict[str, int]) -> None:
        """Move a node between free-count buckets after its free GPUs changed."""
        if self._buckets is None:
            return
        node_id = room.node.id
        for cls, free in room.free_gpus.items():
            was = before.get(cls, 0)
            if was != len(free):
                self._buckets[cls][was].remove(node_id)
                bisect.insort(self._buckets[cls][len(free)], node_id)
                if self.ledger is not None:
                    self._domain_bucket(cls, was, node_id).remove(node_id)
                    bisect.insort(self._domain_bucket(cls, len(free), node_id), node_id)

    def _walk_by_power(self, cls: str, free: int) -> Iterable[str]:
        """The nodes with `free` GPUs of a class free in the scorers' order under power
        budgets: those whose fullest budgeted domain has most watts left first (a node
        under none first of all), then whose PDU phase has most left, then by id
        (scorers.most_power_left)."""
        ledger = self.ledger
        assert ledger is not None
        groups = self._by_domains.get(cls, {}).get(free, {})
        runs: dict[tuple[float, float], list[list[str]]] = defaultdict(list)
        for domains, ids in groups.items():
            if ids:
                runs[_room_left(ledger, domains)].append(ids)
        for left in sorted(runs):
            yield from heapq.merge(*runs[left])

    def _take(
        self, shard: ShardView | ShardPlan | Reservation, declared_w: float | None = None
    ) -> None:
        room = self.rooms.get(shard.node_id)
        if room is None:
            return
        taken = set(shard.gpu_indices)
        room.taken |= taken
        if taken:
            before = {c: len(i) for c, i in room.free_gpus.items()}
            for cls, indices in room.free_gpus.items():
                room.free_gpus[cls] = [i for i in indices if i not in taken]
            self._reindex(room, before)
        if self.ledger is not None:
            self.ledger.take(room.node.id, taken, 1, shard.cpu_cores, declared_w)
        room.memory_reserved += shard.memory_gb or 0.0
        room.cores_reserved += shard.cpu_cores or 0
        if not isinstance(shard, Reservation):
            room.shards += 1
            room.ports.add(shard.http_port)

    def _give_back(self, shard: ShardView | Reservation, declared_w: float | None = None) -> None:
        room = self.rooms.get(shard.node_id)
        if room is None:
            return
        given = set(shard.gpu_indices)
        room.taken -= given
        before = {c: len(i) for c, i in room.free_gpus.items()}
        for gpu in room.node.gpus:
            if gpu.index in given and gpu.free_to_place:
                free = room.free_gpus.setdefault(gpu.gpu_class, [])
                if gpu.index not in free:
                    free.append(gpu.index)
        if given:
            self._reindex(room, before)
        if self.ledger is not None:
            self.ledger.take(room.node.id, given, -1, shard.cpu_cores, declared_w)
        room.memory_reserved -= shard.memory_gb or 0.0
        room.cores_reserved -= shard.cpu_cores or 0
        if not isinstance(shard, Reservation):
            room.shards -= 1
            room.ports.discard(shard.http_port)

    def reserve(self, model: str, placement: Placement) -> None:
        """Take a placement's room so the next placement in this pass sees it gone."""
        declared = placement.profile.shard_power_w
        for shard in placement.shards:
            self._take(shard, declared)
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
        With `model`, its replicas are spread over racks, PDUs and the tree (spread.py)."""
        reasons, judged = [], []
        for profile in profiles:
            ask = self._ask(profile, avoid, weights_source, model)
            result = self._place_profile(ask, judge)
            if isinstance(result, Placement):
                return result
            reasons.append((profile.name, tuple(cap(result))))
            judged.append(tuple(result))
        return Refusal(tuple(reasons), tuple(judged))

    def _ask(self, profile: Profile, avoid: frozenset[str], source: str, model: str) -> Ask:
        """What placing this profile asks of every node. The spread is read as it stands
        before the inventory is built (on a fresh inventory it is not there yet); the power
        budgets are read once it is."""
        spread = self.spread if self.spread is not None and self.spread.holds(model) else None
        if self._rooms is None:  # built first: the ledger is made with the rooms
            self._build()
        return Ask(
            profile, avoid, source, self.ledger, model, spread, self.links,
            self.standing, self.enforce,
        )  # fmt: skip

    @property
    def links(self) -> bool:
        """Whether any node says which of its GPUs NVLink joins (scorers.joined_by_nvlink)."""
        if self._links is None:
            self._links = any(r.node.links for r in self.rooms.values())
        return self._links

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

    def _first_fit(self, ask: Ask) -> NodeRoom | None:
        """The node a one-node GPU profile goes to, found through the index rather than by
        judging every node, in the scorers' order: while the model's replicas are spread
        over racks, the places holding fewest of them first (`Spread.first`); then
        holders of the weights; then, where NVLink is said, nodes that can give a joined
        set; then the fewest free (pack)."""
        profile, source, model = ask.profile, ask.source, ask.model
        buckets = self._index().get(profile.gpu_class)
        if not buckets:
            return None
        need, rooms, spread = ask.need, self.rooms, ask.spread

        refused, key = filters.judge(ask), scorers.order(ask)

        def fits(node_id: str) -> bool:
            return refused(rooms[node_id]) is None

        held = [n for n in self._weights.get(source, ()) if fits(n)] if source else []

        by_power = scorers.levels_power(ask)

        def walk() -> Iterable[str]:  # the fewest free first, then most watts left, then id
            for free in sorted(f for f, ids in buckets.items() if f >= need and ids):
                ids = self._walk_by_power(profile.gpu_class, free) if by_power else buckets[free]
                yield from (n for n in ids if n not in ask.avoid)

        ordered: Iterable[str] = walk()
        if scorers.joins(ask):
            # Nodes that can give a joined set, then the rest: the scorer's order.
            def apart(n: str) -> int:
                return int(scorers.joined_by_nvlink(rooms[n], ask)[0])

            ordered = chain((n for n in walk() if not apart(n)), (n for n in walk() if apart(n)))
        if spread is not None:
            found = spread.first(model, held, ordered, fits, lambda n: key(rooms[n]))
            return rooms[found] if found is not None else None
        if held:
            return min((rooms[n] for n in held), key=key)
        return next((rooms[n] for n in ordered if fits(n)), None)

    def _place_profile(self, ask: Ask, judge: bool = True) -> Placement | list[str]:
        """Filter every node, order those that pass by the scorers, take the first (or the
        first fabric group); else every refusal, for the sentences."""
        profile = ask.profile
        if (
            profile.nodes == 1
            and not profile.cpu_only
            and len(self.rooms) >= INDEX_FROM
            and not scorers.cools(ask)  # the index walks no conditions: judge every node
        ):
            room = self._first_fit(ask)
            if room is not None:
                return self._placed(profile, [room], ask.model, ask.spread is not None)
            if not judge:
                return []
            # Nothing fits: judge every node, for the sentences saying why.
        eligible: list[NodeRoom] = []
        refusals: list[str] = []
        refused, key = filters.judge(ask), scorers.order(ask)
        for room in self.rooms.values():
            why = refused(room)
            if why is None:
                eligible.append(room)
            else:
                refusals.append(why)
        if profile.nodes == 1:
            if eligible:
                best = min(eligible, key=key)
                return self._placed(profile, [best], ask.model, ask.spread is not None)
            return refusals or ["there are no nodes"]
        eligible.sort(key=key)
        return self._place_group(ask, eligible, refusals)

    def _place_group(
        self, ask: Ask, eligible: list[NodeRoom], refusals: list[str]
    ) -> Placement | list[str]:
        """A profile over several nodes: the first NVLink domain or fabric group with enough
        eligible nodes (fabric.py), unless together they pass a power budget."""
        profile = ask.profile
        chosen = fabric_group(eligible, ask)
        if chosen is None:
            return [*refusals, *no_group_said(eligible, ask, self.rooms.values())]
        if self.ledger is not None:
            # Each shard alone was judged by the filters; together they may pass a budget.
            each = [(r.node.id, self._shard(r, profile, 0).gpu_indices) for r in chosen]
            if over := self.ledger.refusal_together(each, profile.shard_power_w):
                return [*refusals, over]
        return self._placed(profile, chosen, ask.model, ask.spread is not None)

    def _placed(
        self, profile: Profile, rooms: list[NodeRoom], model: str, spread: bool = False
    ) -> Placement:
        """The placement on these nodes, with what it went by said (spread, unknown draw)."""
        shards = tuple(self._shard(r, profile, i) for i, r in enumerate(rooms))
        said = []
        if spread and self.spread is not None:
            said.append(self.spread.said(model, rooms[0].node.id))
        if self.ledger is not None:
            said.extend(
                u
                for s in shards
                if (
                    u := self.ledger.unknown(
                        s.node_id, s.gpu_indices, s.cpu_cores, profile.shard_power_w
                    )
                )
            )
        said.extend(self._observed(rooms))
        return Placement(profile, shards, tuple(said))

    def _observed(self, rooms: list[NodeRoom]) -> list[str]:
        """Observe-only (conditions not enforced): what enforcing them would have done with
        this placement, in a sentence each, so people can judge the thresholds first."""
        if self.enforce or not self.standing:
            return []
        out = []
        for room in rooms:
            s = self.standing.get(room.node.id)
            if s is None or not s.level:
                continue
            done = "refused" if s.level >= 2 else "put after cooler domains"
            out.append(f"would have {done} node {room.node.id}: {s.said}")
        return out

    def _shard(self, room: NodeRoom, profile: Profile, rank: int) -> ShardPlan:
        need = profile.gpus_on_each_node
        indices = room.gpus_for(profile.gpu_class, need) if need else ()
        return ShardPlan(
            node_id=room.node.id,
            rank=rank,
            gpu_indices=indices,
            memory_gb=profile.min_memory_gb,
            cpu_cores=profile.reserved_cores,
            http_port=room.next_port(),
        )


def _room_left(ledger: Ledger, domains: tuple) -> tuple[float, float]:
    """`scorers.most_power_left`'s part for a node in these budgeted domains."""
    return ledger.roomiest(domains)
