"""What a model's ready replicas draw now, as the agents of their nodes last reported it:
what `llmgw ctl bench` samples while it measures (docs/facility.md, Tokens per watt).

Pure. A reading is absent, never 0, where the node never made it and where it is stale:
the node not heard from within LLMGW_UNREACHABLE_SECONDS, so its last figure is no longer
what it draws.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeDraw:
    """A node's power as its agent last reported it: each GPU's draw by index, its CPU
    packages' (RAPL), and how many seconds ago it was heard from (None: never)."""

    gpus: Mapping[int, float] = field(default_factory=dict)
    cpu_w: float | None = None
    age_s: float | None = None

    def fresh(self, stale_after: float) -> bool:
        return self.age_s is not None and self.age_s <= stale_after


def shard_draw(
    node_id: str, indices: Iterable[int], node: NodeDraw | None, stale_after: float
) -> dict:
    """A shard's readings as `GET /models/{name}/power` gives them: each of its GPUs' draw
    and its node's CPU draw, None where unreported or stale."""
    known = node if node is not None and node.fresh(stale_after) else NodeDraw()
    return {
        "node": node_id,
        "gpus": [{"index": i, "power_w": known.gpus.get(i)} for i in indices],
        "cpu_power_w": known.cpu_w,
    }


__all__ = ["NodeDraw", "shard_draw"]
