"""Suggested cores for a CPU model: half the smallest ready node it fits on (domain.md, Catalog)."""

from __future__ import annotations

import pytest

from catalog.domain import suggested_cores


@pytest.mark.parametrize(
    "memory_gb, nodes, cores",
    [
        # Half the smallest CPU count among the nodes with room.
        (8, [(64, 32), (128, 16)], 8),
        # A node too small for the model is not where it would run.
        (100, [(64, 8), (128, 32)], 16),
        # A node that does not say its memory counts as having enough; zero is not saying.
        (100, [(None, 8), (128, 32)], 4),
        (100, [(0, 12), (128, 32)], 6),
        # The model's own need unknown: every node fits.
        (None, [(4, 6), (128, 32)], 3),
        # Exactly enough memory is enough.
        (64, [(64, 10)], 5),
        # At least one.
        (8, [(64, 1)], 1),
        (8, [(64, 3)], 1),
        # No node says how many CPUs it has: nothing to suggest.
        (8, [(64, None), (64, 0)], 0),
        (8, [], 0),
        # Those that do not say are left out; the rest still count.
        (8, [(64, None), (64, 20)], 10),
        # No node has room: nothing to suggest either.
        (512, [(64, 16), (128, 32)], 0),
    ],
)
def test_suggested_cores(memory_gb, nodes, cores):
    assert suggested_cores(memory_gb, nodes) == cores


def test_any_iterable_of_nodes_will_do():
    assert suggested_cores(8, iter([(64, 16), (64, 8)])) == 4
