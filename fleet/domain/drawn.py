"""What a model's ready replicas draw now, as the agents of their nodes last reported it:
what `llmgw ctl bench` samples while it measures (docs/facility.md, Tokens per watt), with
the power limit each GPU was held to and its default, so that a measurement says the share
of its default it was taken at (docs/facility.md, What a capped replica counts).

Pure. A reading is absent, never 0, where the node never made it and where it is stale:
the node not heard from within LLMGW_UNREACHABLE_SECONDS, so its last figure is no longer
what it draws or is held to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuReading:
    """One GPU's power as its agent last reported it, in watts: what it draws, the limit it
    is held to and its default limit; None where it did not say."""

    power_w: float | None = None
    limit_w: float | None = None
    default_w: float | None = None


@dataclass(frozen=True)
class NodeDraw:
    """A node's power as its agent last reported it: each GPU's readings by index, its CPU
    packages' draw (RAPL), and how many seconds ago it was heard from (None: never)."""

    gpus: Mapping[int, GpuReading] = field(default_factory=dict)
    cpu_w: float | None = None
    age_s: float | None = None

    def fresh(self, stale_after: float) -> bool:
        return self.age_s is not None and self.age_s <= stale_after


def shard_draw(
    node_id: str, indices: Iterable[int], node: NodeDraw | None, stale_after: float
) -> dict:
    """A shard's readings as `GET /models/{name}/power` gives them: each of its GPUs' draw,
    power limit and default limit, and its node's CPU draw; None where unreported or stale."""
    known = node if node is not None and node.fresh(stale_after) else NodeDraw()
    gpus = []
    for i in indices:
        g = known.gpus.get(i, GpuReading())
        gpus.append(
            {
                "index": i,
                "power_w": g.power_w,
                "power_limit_w": g.limit_w,
                "power_default_w": g.default_w,
            }
        )
    return {"node": node_id, "gpus": gpus, "cpu_power_w": known.cpu_w}


__all__ = ["GpuReading", "NodeDraw", "shard_draw"]
