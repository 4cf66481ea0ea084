"""What a shard draws as `GET /models/{name}/power` gives it: its node's last readings, absent
where unreported or stale (fleet/domain/drawn.py)."""

from __future__ import annotations

import pytest

from fleet.domain.drawn import GpuReading, NodeDraw, shard_draw

CAPPED = GpuReading(310.0, limit_w=560.0, default_w=700.0)
HEARD = NodeDraw({0: CAPPED, 1: GpuReading(290.0)}, cpu_w=120.0, age_s=4.0)
DRAWING = {0: GpuReading(310.0)}
NOTHING = GpuReading()


@pytest.mark.parametrize(
    ("node", "indices", "gpus", "cpu"),
    [
        (HEARD, (0, 1), [CAPPED, GpuReading(290.0)], 120.0),
        (HEARD, (1, 3), [GpuReading(290.0), NOTHING], 120.0),  # GPU 3 says nothing: absent, not 0
        (HEARD, (), [], 120.0),  # a CPU shard: its node's CPU draw
        (NodeDraw(DRAWING, age_s=4.0), (0,), [GpuReading(310.0)], None),  # no RAPL on this node
        (NodeDraw(DRAWING, 120.0, age_s=15.0), (0,), [GpuReading(310.0)], 120.0),  # at the limit
        (NodeDraw({0: CAPPED}, 120.0, age_s=15.5), (0,), [NOTHING], None),  # past it: stale, limits too
        (NodeDraw(DRAWING, 120.0, age_s=None), (0,), [NOTHING], None),  # never heard from
        (None, (0,), [NOTHING], None),  # a node not found
    ],
)  # fmt: skip
def test_a_shard_draws_what_its_node_last_said_while_fresh(node, indices, gpus, cpu):
    drawn = shard_draw("n1", indices, node, stale_after=15.0)

    assert drawn == {
        "node": "n1",
        "gpus": [
            {
                "index": i,
                "power_w": g.power_w,
                "power_limit_w": g.limit_w,
                "power_default_w": g.default_w,
            }
            for i, g in zip(indices, gpus, strict=True)
        ],
        "cpu_power_w": cpu,
    }
