"""One node's free room as placement counts it, and what one placement asks of a node."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from catalog.domain import Profile

from ..conditions import Standing
from ..power import Ledger
from ..spread import Spread
from ..types import NodeView

PORT_BASE = 20000


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
    # Indices held by replicas or kept for a model: what a GPU out of service could not
    # give even were it in service (filters.gpus_out_of_service).
    taken: set[int] = field(default_factory=set)

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
            taken=set(self.taken),
        )

    def gpus_for(self, gpu_class: str, need: int) -> tuple[int, ...]:
        """The GPUs a shard needing `need` of the class takes here: a set joined to each
        other by NVLink where the node says its links and has one free (`joined`), else
        the lowest free indices. Placement, the power budgets and the scorers all ask
        this, so they speak of the same GPUs."""
        free = sorted(self.free_gpus.get(gpu_class, ()))
        if need >= 2 and self.node.links:
            joined = self.joined(free, need)
            if joined is not None:
                return joined
        return tuple(free[:need])

    def joined(self, free: list[int], need: int) -> tuple[int, ...] | None:
        """The first `need` of these GPUs (sorted) joined each to each by an NVLink that is
        up, found greedily from each in turn (lowest first); None when none is found."""
        links = self.node.links
        for first in free:
            chosen = [first]
            for other in free:
                if len(chosen) == need:
                    break
                if other != first and all(other in links.get(c, ()) for c in chosen):
                    chosen.append(other)
            if len(chosen) == need:
                return tuple(sorted(chosen))
        return None

    def next_port(self) -> int:
        port = PORT_BASE
        while port in self.ports:
            port += 1
        return port


@dataclass(frozen=True, slots=True)
class Ask:
    """What one placement asks of every node, made once per profile: the filters and the
    scorers read it (a filter or scorer that needs a new input gets a field here).

    `avoid`: nodes that already run the model; `source`: where its weights come from;
    `ledger`: the power budgets (None: none apply); `spread`: the model's replicas per rack
    and zone, only while some are counted (None: the racks do not order the nodes)."""

    profile: Profile
    avoid: frozenset[str] = frozenset()
    source: str = ""
    ledger: Ledger | None = None
    model: str = ""
    spread: Spread | None = None
    # Whether any node says which of its GPUs NVLink joins: only then can the NVLink
    # scorer order anything (scorers.joined_by_nvlink).
    links: bool = False
    # Per node in a warm, hot or held facility domain, its standing (conditions.py; None:
    # no node is), and whether conditions are enforced (else observe-only: said, not done).
    standing: Mapping[str, Standing] | None = None
    enforce: bool = False
    # GPUs of the profile's class a node must give one shard (made once, from the profile).
    need: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "need", self.profile.gpus_on_each_node)
