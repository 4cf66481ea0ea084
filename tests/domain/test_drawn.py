"""What a shard draws as `GET /models/{name}/power` gives it: its node's last readings, absent
where unreported or stale (fleet/domain/drawn.py)."""

from __future__ import annotations

import pytest

from fleet.domain.drawn import NodeDraw, shard_draw

HEARD = NodeDraw({0: 310.0, 1: 290.0}, cpu_w=120.0, age_s=4.0)


@pytest.mark.parametrize(
    ("node", "indices", "gpus", "cpu"),
    [
        (HEARD, (0, 1), [310.0, 290.0], 120.0),
        (HEARD, (1, 3), [290.0, None], 120.0),  # GPU 3 reports no draw: absent, not 0
        (HEARD, (), [], 120.0),  # a CPU shard: its node's CPU draw
        (NodeDraw({0: 310.0}, age_s=4.0), (0,), [310.0], None),  # no RAPL on this node
        (NodeDraw({0: 310.0}, 120.0, age_s=15.0), (0,), [310.0], 120.0),  # at the limit: fresh
        (NodeDraw({0: 310.0}, 120.0, age_s=15.5), (0,), [None], None),  # past it: stale
        (NodeDraw({0: 310.0}, 120.0, age_s=None), (0,), [None], None),  # never heard from
        (None, (0,), [None], None),  # a node not found
    ],
)
def test_a_shard_draws_what_its_node_last_said_while_fresh(node, indices, gpus, cpu):
    drawn = shard_draw("n1", indices, node, stale_after=15.0)

    assert drawn == {
        "node": "n1",
        "gpus": [{"index": i, "power_w": w} for i, w in zip(indices, gpus, strict=True)],
        "cpu_power_w": cpu,
    }
