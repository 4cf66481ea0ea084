"""What ``llmgw ctl bench`` says its replicas drew: their GPUs' power (or, for replicas on
CPUs, their nodes' CPU packages', RAPL) sampled each second while a level ran, from
``GET /models/{name}/power``, as their agents last reported it.

Pure: answers in, a level's mean draw or why it is unknown out. Unknown stays unknown: one
GPU that reports no draw leaves the whole draw unknown, never a smaller figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PowerSample:
    """What the model's ready replicas drew at one moment, in watts summed over them; None
    when a reading was absent, with ``silent`` saying whose."""

    watts: float | None
    silent: tuple[str, ...] = ()


@dataclass(frozen=True)
class Drawn:
    """What the replicas drew over a level: the mean of its samples, None when a sample was
    unknown (``silent`` says why) or none was taken."""

    watts: float | None = None
    silent: tuple[str, ...] = ()


def _watts(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if value > 0 else None  # zero is no reading, never a draw


def _shards(view: Any) -> list[Mapping[str, Any]]:
    replicas = view.get("replicas") if isinstance(view, Mapping) else None
    return [
        s
        for r in (replicas if isinstance(replicas, list) else ())
        if isinstance(r, Mapping)
        for s in r.get("shards") or ()
        if isinstance(s, Mapping)
    ]


def power_sample(view: Any) -> PowerSample | None:
    """The draw ``GET /models/{name}/power`` says: each GPU the replicas hold, and for a shard
    on no GPU its node's CPU draw, each counted once (two CPU replicas on one node share
    its draw). None when no replica is ready: no sample, not an unknown one."""
    shards = _shards(view)
    if not shards:
        return None
    gpus: dict[tuple[str, Any], float] = {}
    cpus: dict[str, float] = {}
    silent: list[str] = []
    for shard in shards:
        node = str(shard.get("node") or "?")
        held = [g for g in shard.get("gpus") or () if isinstance(g, Mapping)]
        for g in held:
            if (w := _watts(g.get("power_w"))) is None:
                silent.append(f"node {node}'s GPUs report no draw")
            else:
                gpus[(node, g.get("index"))] = w
        if not held:
            if (w := _watts(shard.get("cpu_power_w"))) is None:
                silent.append(f"node {node} reports no CPU draw (RAPL)")
            else:
                cpus[node] = w
    if silent:
        return PowerSample(None, tuple(dict.fromkeys(silent)))
    return PowerSample(sum(gpus.values()) + sum(cpus.values()))


def mean_draw(samples: Sequence[PowerSample]) -> Drawn:
    """The mean of a level's samples; unknown when any sample is (whose readings were absent,
    each said once) or none was taken."""
    silent = tuple(dict.fromkeys(why for s in samples if s.watts is None for why in s.silent))
    if silent or not samples or any(s.watts is None for s in samples):
        return Drawn(None, silent)
    return Drawn(sum(s.watts or 0.0 for s in samples) / len(samples))


def per_watt(tok_per_sec: float, watts: float | None) -> float | None:
    """Tokens per second per watt drawn (tokens per joule); None where the draw is unknown."""
    return tok_per_sec / watts if watts else None


def power_text(watts: float | None, silent: Sequence[str], tok_per_sec: float) -> str | None:
    """The sentence under the capacity: "its replicas drew 1,240 W on average, 0.33 tokens
    per watt", or why the draw is unknown; None when no sample was taken."""
    if watts is not None:
        rate = per_watt(tok_per_sec, watts) or 0.0
        return f"its replicas drew {watts:,.0f} W on average there, {rate:.3g} tokens per watt"
    if silent:
        return "power not measured: " + "; ".join(silent)
    return None


__all__ = ["Drawn", "PowerSample", "mean_draw", "per_watt", "power_sample", "power_text"]
