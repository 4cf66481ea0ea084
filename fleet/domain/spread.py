"""Spreading a model's replicas over racks and zones (docs/facility.md): a preference only.

Pure. A node's rack and zone are its `llmgw.io/rack` and `llmgw.io/zone`
labels; a node without a rack label is a rack of its own, and one without a zone
label is a zone of its own rack. `Spread` counts, per model, the replicas
holding room in each rack and zone (a replica counts once in each it touches).
Among nodes that fit, placement prefers the rack holding the fewest of the
model's replicas, then the zone holding the fewest, before its usual order.
When no node carries a rack or zone label, every count is 0 and placement is
what it was without them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from .power import PDU_LABEL, RACK_LABEL, ZONE_LABEL

MOST_SAID = 6


def rack_of(node_id: str, labels: Mapping[str, str]) -> str:
    """The node's rack, or the node itself when it has no rack label."""
    return (labels.get(RACK_LABEL) or "").strip() or f"node {node_id}"


def zone_of(node_id: str, labels: Mapping[str, str]) -> str:
    """The node's zone, or its rack when it has no zone label."""
    return (labels.get(ZONE_LABEL) or "").strip() or rack_of(node_id, labels)


def located(labels: Iterable[Mapping[str, str]]) -> bool:
    """Whether any node says where it is: only then does spreading change anything."""
    return any(ls.get(RACK_LABEL) or ls.get(ZONE_LABEL) for ls in labels)


class Spread:
    """Per model, how many of its replicas each rack and zone holds."""

    def __init__(self, labels: Mapping[str, Mapping[str, str]]):
        self.racks = {n: rack_of(n, ls) for n, ls in labels.items()}
        self.zones = {n: zone_of(n, ls) for n, ls in labels.items()}
        self.rack_names = frozenset(self.racks.values())
        self.zone_names = frozenset(self.zones.values())
        self.by_rack: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.by_zone: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(self, model: str, nodes: Iterable[str]) -> None:
        """One more replica of `model`, on these nodes."""
        nodes = [n for n in nodes if n in self.racks]
        for rack in {self.racks[n] for n in nodes}:
            self.by_rack[model][rack] += 1
        for zone in {self.zones[n] for n in nodes}:
            self.by_zone[model][zone] += 1

    def holds(self, model: str) -> bool:
        """Whether any replica of `model` is counted: else every rack holds 0 of it."""
        return bool(model) and any(self.by_rack.get(model, {}).values())

    def key(self, model: str, node_id: str) -> tuple[int, int]:
        """The replicas of `model` in this node's rack, then in its zone: fewest first."""
        if not model:
            return (0, 0)
        racks, zones = self.by_rack.get(model, {}), self.by_zone.get(model, {})
        return (
            racks.get(self.racks.get(node_id, ""), 0),
            zones.get(self.zones.get(node_id, ""), 0),
        )

    def floor(self, model: str) -> tuple[int, int]:
        """The fewest replicas of `model` any rack holds, and any zone: no node does better."""
        racks, zones = self.by_rack.get(model, {}), self.by_zone.get(model, {})
        return (
            0 if len(racks) < len(self.rack_names) else min(racks.values(), default=0),
            0 if len(zones) < len(self.zone_names) else min(zones.values(), default=0),
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
        id), and the search stops at the first in a rack and zone as empty as any."""
        floor = self.floor(model)
        weighed = set(holders)
        best = min(((key(n), n) for n in weighed), default=None)
        if best is not None and best[0][:2] == floor:
            return best[1]
        for node_id in ordered:
            if node_id in weighed or not fits(node_id):
                continue
            k = key(node_id)
            if best is None or k < best[0]:
                best = (k, node_id)
            if k[:2] == floor:
                break
        return best[1] if best is not None else None

    def said(self, model: str, chosen: str) -> str:
        """The spread a placement chose by, in a sentence: "spread over racks: r2 holds 0,
        r1 holds 1" (the chosen rack, then the racks holding some of the model's replicas)."""
        racks = self.by_rack.get(model, {})
        mine = self.racks.get(chosen, "")
        others = sorted((r for r in racks if r != mine), key=lambda r: (racks[r], r))
        shown = [mine, *others][:MOST_SAID]
        text = ", ".join(f"{r} holds {racks.get(r, 0)}" for r in shown)
        if len(others) + 1 > len(shown):
            text += f" and {len(others) + 1 - len(shown)} more"
        return f"spread over racks: {text}"


def location_of(labels: Mapping[str, str]) -> dict[str, str]:
    """Where the node's labels say it is: zone, rack and PDU, those it carries."""
    out = {}
    for key, label in (("zone", ZONE_LABEL), ("rack", RACK_LABEL), ("pdu", PDU_LABEL)):
        if value := (labels.get(label) or "").strip():
            out[key] = value
    return out
