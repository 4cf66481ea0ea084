"""Why a node was refused, and the one line that names what binds.

Placement's filters (placement/filters.py) answer a `NodeRefusal`: its sentence, with the
node, how close it came and how much it lacks beside it. `binding` turns one
profile's refusals into the one line that events, restarts, "Needs attention",
`ctl models` and the gateway's 503 show: the nodes that came closest, in
placement's own words, then how many others were refused for what. The first
node refused is often the least useful one to name (a CPU node, for a GPU
model); the one short of a GPU, or draining, is the one an operator can act on.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# How close a refused node came, closest first: short of room (the right GPU class,
# engine and labels, too little free); able to run it but not taking anything now
# (draining, cordoned, unreachable); unable to run it at all (wrong class, labels, engine).
SHORT, UNAVAILABLE, UNSUITED = 0, 1, 2
# Within "short of room", what it lacks, in the order named.
KINDS = ("gpus", "cores", "memory", "disk", "power")
MAX_NAMED = 3
# The explanation's entry where defragmentation says its plan (defrag.py): beside what
# binds, like preemption's, never the one line, nor a change in why a model is refused.
DEFRAG = "defragmentation"
# The entry where shedding says a move off a hot domain (shedding.py), the same way.
SHED = "shedding"


def settled(explanation: Sequence[Mapping]) -> tuple:
    """An explanation without defragmentation's entry: what placement itself said."""
    return tuple(
        e
        for e in explanation
        if not (isinstance(e, Mapping) and e.get("profile") in (DEFRAG, SHED))
    )


class NodeRefusal(str):
    """Placement's sentence of why a node was refused (it compares and prints as that
    sentence), with the node, how close it came (`tier`), what it lacks (`kind`) and how
    much (`missing`, in that kind's units), and the words to count it among others by:
    `group` is the predicate, singular and plural ("has no h100-80g GPUs", "have no ...")."""

    node: str
    tier: int
    kind: str
    missing: float
    group: tuple[str, str]

    def __new__(
        cls,
        text: str,
        node: str,
        tier: int,
        group: tuple[str, str],
        kind: str = "",
        missing: float = 0.0,
    ) -> NodeRefusal:
        said = super().__new__(cls, text)
        said.node, said.tier, said.group = node, tier, group
        said.kind, said.missing = kind, missing
        return said

    @property
    def own_words(self) -> str:
        """The sentence without its leading "node ": ``gpu-a has 0 free ... needs 4``."""
        prefix = f"node {self.node} "
        return self[len("node ") :] if self.startswith(prefix) else str(self)

    def closeness(self) -> tuple:
        kind = KINDS.index(self.kind) if self.kind in KINDS else len(KINDS)
        return (self.tier, kind, self.missing, self.node)


@dataclass(frozen=True)
class Binding:
    """A profile's refusals in one line: the closest nodes named, the others counted."""

    named: tuple[NodeRefusal, ...]
    # (predicate, how many), the most first: the refused nodes not named, by what refused them.
    counted: tuple[tuple[tuple[str, str], int], ...]
    # Sentences about no one node (no fabric group large enough, no nodes at all).
    other: tuple[str, ...]

    @property
    def text(self) -> str:
        # A sentence about them all (no fabric group large enough) binds first.
        parts = [*self.other, *(r.own_words for r in self.named)]
        others = " other" if self.named else ""
        for (one, many), n in self.counted:
            parts.append(f"{n}{others} node{'' if n == 1 else 's'} {one if n == 1 else many}")
        return "; ".join(parts)


def binding(reasons: Iterable[str]) -> Binding:
    """The nodes that came closest (short of room first, fewest missing; then those not
    taking anything now), at most MAX_NAMED, or when none did the first of the rest; and
    every other refused node counted once by what refused it. Sentences that are not
    about one node are kept as they are."""
    by_node: dict[str, NodeRefusal] = {}
    other: list[str] = []
    for r in reasons:
        if isinstance(r, NodeRefusal):
            by_node.setdefault(r.node, r)
        elif r not in other:
            other.append(r)
    # Only the few named are ordered: a full fleet refuses thousands of nodes.
    close = (r for r in by_node.values() if r.tier < UNSUITED)
    named = tuple(heapq.nsmallest(MAX_NAMED, close, key=NodeRefusal.closeness))
    # When no node came close, the closest of the rest still speaks for itself.
    named = named or tuple(heapq.nsmallest(1, by_node.values(), key=NodeRefusal.closeness))
    shown = {r.node for r in named}
    counts: dict[tuple[str, str], int] = {}
    for r in by_node.values():
        if r.node not in shown:
            counts[r.group] = counts.get(r.group, 0) + 1
    counted = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return Binding(named, counted, tuple(other))


def one_line(explanation: Sequence[Mapping]) -> str:
    """The reconciler's explanation of a failed placement in one line: each profile's
    binding reasons (its `summary`), named by profile when there are several; for an
    explanation with no summary (a wait, a hold, one stored before summaries), its first
    reason. What preemption could not take stays in the explanation."""
    entries = [
        e
        for e in explanation
        if isinstance(e, Mapping) and e.get("profile") not in ("preemption", DEFRAG, SHED)
    ]
    lines = []
    for e in entries:
        line = e.get("summary") or next(iter(e.get("reasons") or ()), "")
        if line:
            lines.append((e.get("profile") or "", line))
    if len(lines) > 1 and all(p for p, _ in lines):
        return ". ".join(f"profile {p}: {line}" for p, line in lines)
    return lines[0][1] if lines else ""
