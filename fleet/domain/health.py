"""Which ready replicas are not to be routed to: no ghost replicas (pure).

A ready replica whose node has not been heard from for the unreachable window (counted
from the reconciler's restart at the earliest, as liveness is) has nothing confirming
an engine behind it: it is marked unhealthy, which every gateway stops routing to,
long before the node is lost and the replica replaced. A gateway that could not reach
a replica marks it itself (fleet/services.py `replica_unhealthy_mark`). The mark is
cleared once every node of the replica was heard from after it: an agent whose engine
had died says so (the shard fails and the replica is replaced).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from .types import NodeView, ReplicaView


@dataclass(frozen=True)
class HealthChange:
    """Mark a replica unhealthy (with the reason), or clear its mark (reason None)."""

    replica_id: str
    reason: str | None


def _silence(seen: datetime | None, now: datetime, floor: datetime | None) -> float:
    seen = seen or now
    if floor is not None and seen < floor:
        seen = floor
    return (now - seen).total_seconds()


def health_changes(
    replicas: Sequence[ReplicaView],
    nodes: Mapping[str, NodeView],
    heard: Mapping[str, datetime],
    now: datetime,
    *,
    unreachable: float,
    floor: datetime | None,
) -> list[HealthChange]:
    """The marks to set and clear this pass, given the nodes as liveness left them and
    when each was last heard from."""
    out = []
    # Only a node not ready marks a replica: with none, only marks to clear are looked at.
    not_ready = {k for k, n in nodes.items() if n.state != "ready"}
    if not not_ready:
        replicas = [r for r in replicas if r.unhealthy_since is not None]
    for r in replicas:
        if r.state != "ready" or not r.shards:
            continue
        if r.unhealthy_since is None:
            if not_ready.isdisjoint(r.nodes):
                continue
            for s in r.shards:
                node = nodes.get(s.node_id)
                if node is None or node.state == "ready":
                    continue
                silent = _silence(heard.get(node.id), now, floor)
                if silent >= unreachable:
                    out.append(
                        HealthChange(r.id, f"node {node.id} not heard from for {silent:.0f} s")
                    )
                    break
            continue
        if all(
            (n := nodes.get(s.node_id)) is not None
            and n.state == "ready"
            and (seen := heard.get(s.node_id)) is not None
            and seen > r.unhealthy_since
            for s in r.shards
        ):
            out.append(HealthChange(r.id, None))
    return out
