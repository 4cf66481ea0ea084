"""One node's free room as placement counts it, and what one placement asks of a node."""

from __future__ import annotations

from dataclasses import dataclass, field

from catalog.domain import Profile

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
    # GPUs of the profile's class a node must give one shard (made once, from the profile).
    need: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "need", self.profile.gpus_on_each_node)
