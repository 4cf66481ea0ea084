"""What placing a model answers: where each shard goes, or why no profile fits."""

from __future__ import annotations

from dataclasses import dataclass

from catalog.domain import Profile

from ..refusals import binding, one_line

MAX_REASONS_PER_PROFILE = 25


@dataclass(frozen=True)
class ShardPlan:
    node_id: str
    rank: int
    gpu_indices: tuple[int, ...]
    memory_gb: float | None
    cpu_cores: int | None
    http_port: int


@dataclass(frozen=True)
class Placement:
    profile: Profile
    shards: tuple[ShardPlan, ...]
    # What the choice went by beyond the usual order, in sentences: the spread over racks,
    # a draw that could not be counted against a budget (docs/facility.md).
    said: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """Why no profile could be placed: per profile, a sentence per node (or one for all)."""

    reasons: tuple[tuple[str, tuple[str, ...]], ...]
    # Per profile, every refusal, uncut: its one line (refusals.binding) is made only when
    # the explanation is asked for, not by the trials of preemption and headroom.
    judged: tuple[tuple[str, ...], ...] = ()

    def as_explanation(self) -> list[dict]:
        summaries = (binding(j).text for j in self.judged)
        said = dict(zip((p for p, _ in self.reasons), summaries, strict=False))
        return [
            {"profile": p, "reasons": list(r), **({"summary": said[p]} if said.get(p) else {})}
            for p, r in self.reasons
        ]

    def summary(self) -> str:
        return one_line(self.as_explanation()) or "no profile fits"


def cap(reasons: list[str]) -> list[str]:
    """At most MAX_REASONS_PER_PROFILE sentences, the rest counted."""
    if len(reasons) <= MAX_REASONS_PER_PROFILE:
        return reasons
    more = len(reasons) - MAX_REASONS_PER_PROFILE
    return [*reasons[:MAX_REASONS_PER_PROFILE], f"and {more} more nodes"]
