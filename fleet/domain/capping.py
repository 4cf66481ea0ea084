"""Power caps kept, not only sent on a change (docs/facility.md, "Power capping").

A cap is sent when a node's domains turn warm or hot, or cool (shedding.power_caps). A
limit set through NVML holds until the driver reloads, and a command to a node that is
away is lost, so sending on a change alone leaves a node that joins a warm rack, or
whose driver reloads, at its default until the rack's condition next changes. So each
pass compares what each node's GPUs report (their limit in force, their default and the
least they allow) with what is wanted there, and sends the cap again where they differ:
at most once per RESEND_S per node, which is longer than a heartbeat takes to show a
limit set, so a send not yet seen is not sent again (no command storm).

What llmgw sets is `share` × a GPU's default, or the least the card allows when that is
more (the agent clamps to it). A GPU wanted capped is kept when its limit is over that:
one held lower by something else (a BMC, an operator) is left alone. A GPU wanted at its
default is let go again only where llmgw's own record (`Sent.held`) says it held that node,
and only while the GPU is still at that cap: the figure alone cannot tell llmgw's cap from
an operator's `nvidia-smi -pl 560` on a 700 W card in a cool rack, and a limit someone else
set is theirs. The record is kept until the let-go is seen (`released`). A GPU whose limit
or default is not reported is unknown, and only the change is sent for it, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .conditions import HOT, WARM, Domain

# Watts a reported limit may differ from the one wanted and still be it: NVML sets whole
# milliwatts and nvidia-smi prints hundredths, and a card rounds its limit to its own step.
TOLERANCE_W = 1.0
# Seconds before a node whose GPUs still report the wrong limit is sent its cap again.
RESEND_S = 120.0


def wanted(
    conditions: Mapping[Domain, str], domains: Iterable[Domain], share: float
) -> float | None:
    """The share a node's GPUs are to be held to: `share` while any of its domains is warm
    or hot, None (their default) once none is."""
    return share if any(conditions.get(d) in (WARM, HOT) for d in domains) else None


@dataclass(frozen=True)
class Limit:
    """One GPU's power limits as its node's heartbeat reports them; None is not reported."""

    index: int
    limit_w: float | None
    default_w: float | None
    min_w: float | None = None

    @classmethod
    def of(cls, gpu: Mapping) -> Limit:
        """From a heartbeat's `load.gpus[]` entry."""
        return cls(
            gpu.get("index", 0),
            gpu.get("power_limit_w"),
            gpu.get("power_default_w"),
            gpu.get("power_min_w"),
        )

    def capped_w(self, share: float) -> float | None:
        """What llmgw's cap sets this GPU to: the share of its default, or its least."""
        if self.default_w is None:
            return None
        return max(share * self.default_w, self.min_w or 0.0)


def off(g: Limit, want: float | None, share: float) -> bool:
    """Whether a GPU's reported limit is not what is wanted (`want`: the share it is to be
    held to, None: its default); False when its limit or default is not reported."""
    cap = g.capped_w(share if want is None else want)
    if g.limit_w is None or cap is None or g.default_w is None:
        return False
    if want is not None:
        return g.limit_w > cap + TOLERANCE_W
    # Let go only what is still at llmgw's cap, and only where that cap is below the default.
    return abs(g.limit_w - cap) <= TOLERANCE_W and cap < g.default_w - TOLERANCE_W


def first_off(gpus: Iterable[Limit], want: float | None, share: float) -> Limit | None:
    """The first GPU of a node not held as wanted, for the sentence; None when none is
    (or none says)."""
    return next((g for g in gpus if off(g, want, share)), None)


@dataclass(frozen=True)
class Sent:
    """What llmgw last sent a node: the cap (None: let go) and when, and the share it last
    held the node to (None: never, or its let-go was seen), kept across a let-go until the
    node's GPUs are seen at their default: that share is the only proof a limit is llmgw's."""

    share: float | None
    at: float
    held: float | None = None

    def then(self, share: float | None, at: float) -> Sent:
        """The record once `share` is sent at `at`: a let-go keeps the share it lets go of."""
        return Sent(share, at, share if share is not None else self.held)


@dataclass(frozen=True)
class Resend:
    """A node whose GPUs still report the wrong limit: the cap to send it again, and why."""

    node: str
    share: float | None
    gpu: Limit


def _off_gpu(
    want: float | None, gpus: Iterable[Limit], share: float, last: Sent | None
) -> Limit | None:
    """The GPU to send a node's cap again for: wanted capped, one over the cap; wanted at its
    default, one still at the cap llmgw's record says it set there, and none without it."""
    if want is not None:
        return first_off(gpus, want, share)
    if last is None or last.held is None:
        return None  # llmgw never held this node: whatever its limit, it is not llmgw's
    return first_off(gpus, None, last.held)


def resends(
    nodes: Mapping[str, tuple[float | None, Iterable[Limit]]],
    share: float,
    sent: Mapping[str, Sent],
    now: float,
) -> list[Resend]:
    """Per node (its wanted cap, its GPUs' limits), whether to send its cap again: a GPU
    reports the wrong limit, and the same cap was not sent within RESEND_S (`sent`: per
    node, what llmgw last sent it)."""
    out = []
    for node, (want, gpus) in sorted(nodes.items()):
        last = sent.get(node)
        g = _off_gpu(want, gpus, share, last)
        if g is None:
            continue
        if last is not None and last.share == want and 0 <= now - last.at < RESEND_S:
            continue
        out.append(Resend(node, want, g))
    return out


def released(
    nodes: Mapping[str, tuple[float | None, Iterable[Limit]]], sent: Mapping[str, Sent]
) -> list[str]:
    """The nodes llmgw held whose let-go is seen: wanted at their default, and no GPU still
    at llmgw's cap. Their record goes, so a limit set there later is not taken for llmgw's."""
    return sorted(
        node
        for node, (want, gpus) in nodes.items()
        if want is None
        and (last := sent.get(node)) is not None
        and last.held is not None
        and first_off(gpus, None, last.held) is None
    )


def said(r: Resend) -> str:
    """The sentence of a cap sent again, with the figures that called for it."""
    g = r.gpu
    if r.share is not None:
        return (
            f"held node {r.node}'s GPUs to {r.share:.0%} of their default power limit again: "
            f"GPU {g.index} reports a limit of {g.limit_w:,.0f} W, over the "
            f"{g.capped_w(r.share):,.0f} W wanted (it is in a warm or hot domain)"
        )
    return (
        f"let node {r.node}'s GPUs back to their default power limit again: GPU {g.index} is "
        f"still held to {g.limit_w:,.0f} W of its {g.default_w:,.0f} W default "
        "(none of its domains is warm or hot)"
    )
