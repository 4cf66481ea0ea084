"""What ``llmgw ctl bench`` says its replicas drew: their GPUs' power (or, for replicas on
CPUs, their nodes' CPU packages', RAPL) sampled each second while a level ran, from
``GET /models/{name}/power``, as their agents last reported it.

And the share of their default power limit the replicas' GPUs were held to while it ran, so
that a measurement taken on capped GPUs says so (``power_share``) and is not scaled down
again for the same cap (fleet/domain/capped.py, docs/facility.md "What a capped replica
counts"). A replica's share is its most held GPU's, as a capped replica counts; a limit
raised past the default counts as the default, as there.

Pure: answers in, a level's mean draw and share, or why each is unknown, out. Unknown stays
unknown: one GPU that reports no draw leaves the whole draw unknown, never a smaller
figure, and one that reports no limit or no default leaves the share unknown, as does a
limit that changed while the level ran or replicas held to different shares (its figure
would mix two capacities).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.domain.capped import gpu_share, pct

# Shares this close are one cap: a card rounds its limit to its own step (a watt or so).
SAME_SHARE = 0.005


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


def _replicas(view: Any) -> list[Mapping[str, Any]]:
    replicas = view.get("replicas") if isinstance(view, Mapping) else None
    return [r for r in (replicas if isinstance(replicas, list) else ()) if isinstance(r, Mapping)]


def _replica_shards(replica: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    shards = replica.get("shards")
    return [s for s in (shards if isinstance(shards, list) else ()) if isinstance(s, Mapping)]


def _shards(view: Any) -> list[Mapping[str, Any]]:
    return [s for r in _replicas(view) for s in _replica_shards(r)]


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


@dataclass(frozen=True)
class ShareSample:
    """The share of their default power limit the ready replicas' GPUs were held to at one
    moment: per replica on GPUs, (replica, the node of its most held GPU, that GPU's share,
    at most 1); or why it is unknown (``silent``). Replicas on CPUs have no share."""

    replicas: tuple[tuple[str, str, float], ...] = ()
    silent: tuple[str, ...] = ()


@dataclass(frozen=True)
class HeldTo:
    """The share of their default power limit the GPUs were held to over a level: None when
    unknown (``silent`` says why) or when no GPU was sampled (nothing to say)."""

    share: float | None = None
    silent: tuple[str, ...] = ()


def _gpu_share(gpu: Mapping[str, Any], node: str) -> float | str:
    """A GPU's share of its default power limit, or why it is unknown."""
    limit, default = _watts(gpu.get("power_limit_w")), _watts(gpu.get("power_default_w"))
    if limit is None:
        return f"node {node}'s GPUs report no power limit"
    if default is None:
        return f"node {node}'s GPUs report no default power limit"
    share = gpu_share(limit, default)
    return 1.0 if share is None else share  # both known and above 0: never None


def share_sample(view: Any) -> ShareSample | None:
    """Each ready replica's share as ``GET /models/{name}/power`` says it: its most held GPU's
    (the slowest sets a tensor-parallel replica's pace). None when no replica is ready."""
    replicas = _replicas(view)
    if not replicas:
        return None
    found: list[tuple[str, str, float]] = []
    silent: list[str] = []
    for n, r in enumerate(replicas):
        held: list[tuple[float, str]] = []
        for shard in _replica_shards(r):
            node = str(shard.get("node") or "?")
            for g in shard.get("gpus") or ():
                share = _gpu_share(g, node) if isinstance(g, Mapping) else None
                if isinstance(share, str):
                    silent.append(share)
                elif share is not None:
                    held.append((share, node))
        if held:
            share, node = min(held)
            found.append((str(r.get("id") or n), node, share))
    if silent:
        return ShareSample(silent=tuple(dict.fromkeys(silent)))
    return ShareSample(tuple(found))


def _mixes(why: str) -> str:
    return f"{why}, so the figure would mix two capacities"


def _changed(samples: Sequence[ShareSample]) -> list[str]:
    """Each replica whose share changed while the level ran, in a sentence: from its first
    sample's share to the one farthest from it, on the node of its lowest."""
    seen: dict[str, list[tuple[float, str]]] = {}
    for sample in samples:
        for replica, node, share in sample.replicas:
            seen.setdefault(replica, []).append((share, node))
    out = []
    for held in seen.values():
        if max(held)[0] - min(held)[0] <= SAME_SHARE:
            continue
        was = held[0][0]
        now = max(held, key=lambda h: abs(h[0] - was))[0]
        out.append(
            _mixes(
                f"node {min(held)[1]}'s GPUs' power limit changed while the level ran (from "
                f"{pct(was)} to {pct(now)} of their default)"
            )
        )
    return out


def held_to(samples: Sequence[ShareSample]) -> HeldTo:
    """The share a level's GPUs were held to: one every sample held, within SAME_SHARE (the
    lowest of them); unknown when a sample is (each reason said once), when a limit changed
    while it ran, or when its replicas were held to different shares."""
    silent = tuple(dict.fromkeys(why for s in samples for why in s.silent))
    if silent:
        return HeldTo(None, silent)
    held = [(share, node) for s in samples for _, node, share in s.replicas]
    if not held:
        return HeldTo()
    lo, hi = min(held), max(held)
    if hi[0] - lo[0] <= SAME_SHARE:
        return HeldTo(lo[0])
    why = _changed(samples) or [
        _mixes(
            "its replicas were held to different shares of their default power limit "
            f"({pct(lo[0])} on node {lo[1]}, {pct(hi[0])} on node {hi[1]})"
        )
    ]
    return HeldTo(None, tuple(dict.fromkeys(why)))


def held_text(share: float | None) -> str | None:
    """The sentence under the draw when the GPUs were held below their default power limit:
    "its GPUs were held to 80 % of their default power limit there"; None otherwise."""
    if share is None or share >= 1.0:
        return None
    return f"its GPUs were held to {pct(share)} of their default power limit there"


__all__ = [
    "SAME_SHARE",
    "Drawn",
    "HeldTo",
    "PowerSample",
    "ShareSample",
    "held_text",
    "held_to",
    "mean_draw",
    "per_watt",
    "power_sample",
    "power_text",
    "share_sample",
]
