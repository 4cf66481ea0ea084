"""Spreading a model's replicas over racks, PDUs and the location tree (docs/facility.md):
a preference only.

Pure. A node's place is in its labels: `llmgw.io/rack`, `llmgw.io/pdu` (two for a
dual-fed rack), and the design's location tree above the rack, `llmgw.io/row`,
`llmgw.io/room`, `llmgw.io/zone` and `llmgw.io/site`. A node without a rack label is a
rack of its own; one without a PDU label draws from a PDU of its own rack's; one
without a row, room, zone or site label is one of its own, as large as the level below.
`Spread` counts, per model, the replicas holding room at each place (a replica counts
once in each it touches). Among nodes that fit, placement prefers the rack holding the
fewest of the model's replicas, then the PDU (the fuller of a dual-fed node's two), then
the row, room, zone and site, before its usual order. When no node carries a location
label, every count is 0 and placement is what it was without them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from .power import (
    PDU_LABEL,
    RACK_LABEL,
    ROOM_LABEL,
    ROW_LABEL,
    SITE_LABEL,
    ZONE_LABEL,
    pdus_of,
)

# The places spreading counts, smallest first: the order of its key.
LEVELS = ("rack", "pdu", "row", "room", "zone", "site")
TREE = (("row", ROW_LABEL), ("room", ROOM_LABEL), ("zone", ZONE_LABEL), ("site", SITE_LABEL))
# The label of each of `LEVELS`.
LEVEL_LABELS = (RACK_LABEL, PDU_LABEL, ROW_LABEL, ROOM_LABEL, ZONE_LABEL, SITE_LABEL)
LOCATION_LABELS = LEVEL_LABELS
MOST_SAID = 6


def rack_of(node_id: str, labels: Mapping[str, str]) -> str:
    """The node's rack, or the node itself when it has no rack label."""
    return (labels.get(RACK_LABEL) or "").strip() or f"node {node_id}"


def zone_of(node_id: str, labels: Mapping[str, str]) -> str:
    """The node's zone, or its rack when it has no zone label."""
    return (labels.get(ZONE_LABEL) or "").strip() or rack_of(node_id, labels)


def places_of(node_id: str, labels: Mapping[str, str]) -> tuple[tuple[str, ...], ...]:
    """The node's places at each of `LEVELS`: its rack; its PDUs (its rack's own when it
    names none); then each level of the tree, or the level below's when it has no label.
    Names are prefixed by their level, so a row and a rack of one name are not one place."""
    rack = rack_of(node_id, labels)
    pdus = tuple(f"pdu {p}" for p in pdus_of(labels)) or (f"pdu of {rack}",)
    out: list[tuple[str, ...]] = [(rack,), pdus]
    below = rack
    for level, label in TREE:
        if value := (labels.get(label) or "").strip():
            below = f"{level} {value}"
        out.append((below,))
    return tuple(out)


def located(labels: Iterable[Mapping[str, str]]) -> bool:
    """Whether any node says where it is: only then does spreading change anything."""
    return any(any(ls.get(label) for label in LOCATION_LABELS) for ls in labels)


class Spread:
    """Per model, how many of its replicas each rack, PDU and place of the tree holds.

    Only the levels some node has a label for are counted (the rack always): a level no
    node names repeats the one below it, which orders nothing, and each level counted
    costs every node judged."""

    def __init__(self, labels: Mapping[str, Mapping[str, str]]):
        self.levels = tuple(
            i
            for i, label in enumerate(LEVEL_LABELS)
            if i == 0 or any(ls.get(label) for ls in labels.values())
        )
        self.places = {
            n: tuple(places_of(n, ls)[i] for i in self.levels) for n, ls in labels.items()
        }
        self.racks = {n: p[0][0] for n, p in self.places.items()}
        self.names = [
            frozenset(name for p in self.places.values() for name in p[level])
            for level in range(len(self.levels))
        ]
        self.zero = (0,) * len(self.levels)
        # Per model, per level counted, the replicas at each place.
        self.counts: dict[str, list[dict[str, int]]] = defaultdict(
            lambda: [defaultdict(int) for _ in self.levels]
        )

    def add(self, model: str, nodes: Iterable[str]) -> None:
        """One more replica of `model`, on these nodes."""
        nodes = [n for n in nodes if n in self.places]
        counts = self.counts[model]
        for level in range(len(self.levels)):
            for place in {name for n in nodes for name in self.places[n][level]}:
                counts[level][place] += 1

    def holds(self, model: str) -> bool:
        """Whether any replica of `model` is counted: else every rack holds 0 of it."""
        return bool(model) and model in self.counts and any(self.counts[model][0].values())

    def key(self, model: str, node_id: str) -> tuple[int, ...]:
        """The replicas of `model` at this node's rack, PDU (the fuller of two), row,
        room, zone and site (those counted): fewest first."""
        counts, places = self.counts.get(model), self.places.get(node_id)
        if not model or counts is None or places is None:
            return self.zero
        out = []
        for at, names in zip(counts, places, strict=True):
            if len(names) == 1:
                out.append(at.get(names[0], 0))
            else:
                out.append(max(at.get(name, 0) for name in names))
        return tuple(out)

    def floor(self, model: str) -> tuple[int, ...]:
        """No node's key is below this at any level: the fewest replicas of `model` any
        place of each level holds (0 where some place holds none)."""
        counts = self.counts.get(model)
        if counts is None:
            return self.zero
        return tuple(
            0 if len(at) < len(names) else min(at.values(), default=0)
            for at, names in zip(counts, self.names, strict=True)
        )

    def first(
        self,
        model: str,
        holders: Iterable[str],
        ordered: Iterable[str],
        fits: Callable[[str], bool],
        key: Callable[[str], tuple],
    ) -> str | None:
        """The node that fits with the least `key` (spread first, then placement's order),
        found without judging every node: `holders` (of the weights, already judged fit)
        are all weighed; the rest come in `ordered`, the index's order (placement's own
        after the spread: joined by NVLink where that orders anything, fewest free, then
        id), and the search stops at the first at places as empty as any."""
        floor = self.floor(model)
        parts = len(floor)
        weighed = set(holders)
        best = min(((key(n), n) for n in weighed), default=None)
        if best is not None and best[0][:parts] == floor:
            return best[1]
        for node_id in ordered:
            if node_id in weighed or not fits(node_id):
                continue
            k = key(node_id)
            if best is None or k < best[0]:
                best = (k, node_id)
            if k[:parts] == floor:
                break
        return best[1] if best is not None else None

    def said(self, model: str, chosen: str) -> str:
        """The spread a placement chose by, in a sentence: "spread over racks: r2 holds 0,
        r1 holds 1" (the chosen rack, then the racks holding some of the model's replicas)."""
        counts = self.counts.get(model)
        racks = counts[0] if counts is not None else {}
        mine = self.racks.get(chosen, "")
        others = sorted((r for r in racks if r != mine), key=lambda r: (racks[r], r))
        shown = [mine, *others][:MOST_SAID]
        text = ", ".join(f"{r} holds {racks.get(r, 0)}" for r in shown)
        if len(others) + 1 > len(shown):
            text += f" and {len(others) + 1 - len(shown)} more"
        return f"spread over racks: {text}"


def location_of(labels: Mapping[str, str]) -> dict[str, str]:
    """Where the node's labels say it is: site, room, row, zone, rack and PDU, those it
    carries."""
    out = {}
    named = (
        ("site", SITE_LABEL),
        ("room", ROOM_LABEL),
        ("row", ROW_LABEL),
        ("zone", ZONE_LABEL),
        ("rack", RACK_LABEL),
        ("pdu", PDU_LABEL),
    )
    for key, label in named:
        if value := (labels.get(label) or "").strip():
            out[key] = value
    return out
