"""A capped GPU's measured capacity (docs/facility.md, "What a capped replica counts").

A measurement (`ctl bench --save`) says what one replica served at its GPUs' default power
limit. Held below it (power capping, a BMC, an operator) a GPU lowers its clocks, and the
measured figure no longer holds: the autoscaler would see room that is not there and leave
demand waiting. So a replica on GPUs held below their default counts its measured figure
times (limit / default) ** k, k being LLMGW_POWER_CAP_EXPONENT: 0.6 unless set, the model's
assumption that throughput falls less than power (clocks and voltage fall together, and
decoding is bound by memory), the same figure the sim engine runs at (docs/benchmarks.md).

Pure. A replica's share is its most capped GPU's (the slowest sets a tensor-parallel
replica's pace); a GPU whose limit or default is not reported is unknown, and unknown is
never a reading: a replica with no GPU known to be capped counts what was measured. A
measurement taken while capped, which says at what share, is not scaled again, only by how
much lower the replica is held than it was; a replica never counts more than was measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .capping import TOLERANCE_W

# The model's assumption until a site measures its cards: share 0.8 keeps 0.8 ** 0.6 = 87.5 %.
DEFAULT_EXPONENT = 0.6


def gpu_share(limit_w: float | None, default_w: float | None) -> float | None:
    """The share of its default power limit a GPU is held to, at most 1 (a limit raised above
    the default gives no more than was measured); None when either figure is unknown."""
    if limit_w is None or default_w is None or limit_w <= 0 or default_w <= 0:
        return None
    if limit_w >= default_w - TOLERANCE_W:
        return 1.0
    return limit_w / default_w


def factor(share: float | None, measured_share: float | None, exponent: float) -> float:
    """What a replica held to `share` counts of a measurement taken at `measured_share` (None:
    at the default): (share / measured) ** exponent, at most 1; 1 when its share is unknown."""
    base = measured_share if measured_share is not None else 1.0
    if share is None or share >= base:
        return 1.0
    return (share / base) ** exponent


@dataclass(frozen=True)
class Caps:
    """The GPUs held below their default power limit, as their nodes' latest heartbeats say:
    per node, per GPU index, the share (below 1) of their default; with the exponent.
    A GPU not in it is at its default or unknown: either way it counts what was measured."""

    shares: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    exponent: float = DEFAULT_EXPONENT

    def held(self, shards: Iterable[tuple[str, Sequence[int]]]) -> tuple[str, float] | None:
        """The node and share of a replica's most capped GPU (its shards as (node, GPU
        indices)); None when none of its GPUs is known to be capped."""
        found = [
            (share, node)
            for node, indices in shards
            for i in indices
            if (share := self.shares.get(node, {}).get(i)) is not None
        ]
        if not found:
            return None
        share, node = min(found)
        return node, share


@dataclass(frozen=True)
class Capped:
    """One replica on capped GPUs: its most capped node, the share, and what it counts."""

    node: str
    share: float
    factor: float


def capped(
    caps: Caps, shards: Iterable[tuple[str, Sequence[int]]], measured_share: float | None
) -> Capped | None:
    """What a replica on these shards counts of its measurement; None when it counts all."""
    held = caps.held(shards)
    if held is None:
        return None
    f = factor(held[1], measured_share, caps.exponent)
    return Capped(held[0], held[1], f) if f < 1.0 else None


@dataclass(frozen=True)
class Counted:
    """What a model's ready replicas count for, in replicas at their measured capacity:
    all of them (`replicas`), those left after one fewer (`fewer`: its strongest gone, the
    safe guess of which scale-down stops), and the capped ones among them."""

    replicas: float
    fewer: float
    capped: tuple[Capped, ...] = ()


def counted(ready: int, held: Sequence[Capped]) -> Counted:
    """Of `ready` replicas, `held` the capped ones: each counts its factor, the rest one."""
    if ready <= 0:
        return Counted(0.0, 0.0)
    held = tuple(held[:ready])
    total = ready - len(held) + sum(c.factor for c in held)
    strongest = 1.0 if len(held) < ready else max(c.factor for c in held)
    return Counted(total, max(total - strongest, 0.0), held)


def replicas_for(units: float, current: Sequence[float]) -> int:
    """Replicas needed to serve `units` (the throughput asked over what one replica was
    measured to serve), the running ones counting `current` each (their factors): the
    strongest running ones first, then new ones counting one each; at least one."""
    have = 0.0
    for n, f in enumerate(sorted(current, reverse=True), start=1):
        have += f
        if have >= units - 1e-9:
            return n
    return max(len(current) + math.ceil(units - have - 1e-9), 1)


def pct(value: float) -> str:
    """0.8 → "80 %", 0.8747 → "87.5 %"."""
    return f"{value * 100:.1f}".rstrip("0").rstrip(".") + " %"


def said(c: Capped, tok_per_sec: float, measured_share: float | None) -> str:
    """The sentence for a replica counting less than was measured, with the figures."""
    at = "" if measured_share is None else f" at {pct(measured_share)} of their default"
    return (
        f"node {c.node}'s GPUs are capped to {pct(c.share)} of their default power: its "
        f"replica counts {pct(c.factor)} of its measured {tok_per_sec:,.0f} tokens/s{at}"
    )
