"""The nodes a profile over several nodes takes together: they must share a fabric."""

from __future__ import annotations

from collections import defaultdict

from ..types import FABRIC_LABEL
from .room import NodeRoom


def fabric_group(eligible: list[NodeRoom], count: int) -> list[NodeRoom] | None:
    """The first `count` nodes, in the order given, of the first fabric (by name) that has
    that many; None when none has."""
    groups: dict[str, list[NodeRoom]] = defaultdict(list)
    for room in eligible:
        fabric = room.node.labels.get(FABRIC_LABEL)
        if fabric:
            groups[fabric].append(room)
    # Groups keep the preference order of `eligible`; ties between fabrics go by name.
    for fabric in sorted(groups):
        if len(groups[fabric]) >= count:
            return groups[fabric][:count]
    return None


def no_group_said(eligible: list[NodeRoom], count: int) -> str:
    """The sentence when no fabric group has `count` eligible nodes, with the largest."""
    groups: dict[str, int] = defaultdict(int)
    for room in eligible:
        if FABRIC_LABEL in room.node.labels:
            groups[room.node.labels[FABRIC_LABEL]] += 1
    largest = max(groups.values(), default=0)
    return f"no {FABRIC_LABEL} group has {count} eligible nodes (the largest has {largest})"
