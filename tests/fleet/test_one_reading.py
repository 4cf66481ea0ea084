"""Several dry runs asked by one page read the fleet once (fleet.dry_runs.one_reading)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import dry_runs
from llmgw.core import clock

from .builders import gpu_model, model_added, node_add

pytestmark = pytest.mark.django_db


def _node_reads(queries) -> int:
    """Readings of the fleet: each reads the replicas once."""
    return sum(1 for q in queries if 'FROM "fleet_replica"' in q["sql"])


def test_headroom_and_the_preemption_dry_run_share_one_reading_of_the_fleet():
    node_add("gpu-a", now=clock.now())
    model_added(gpu_model("llama"))
    dry_runs.model_headroom(name="llama", limit=10)  # the node's static figures, read once
    with CaptureQueriesContext(connection) as apart:
        alone = dry_runs.model_headroom(name="llama", limit=10)
        dry_runs.model_preemption(name="llama")
    with CaptureQueriesContext(connection) as together, dry_runs.one_reading():
        shared = dry_runs.model_headroom(name="llama", limit=10)
        dry_runs.model_preemption(name="llama")
    assert shared == alone
    assert _node_reads(apart.captured_queries) == 2 * _node_reads(together.captured_queries)
    # Outside it, each reads the fleet as it is then.
    with CaptureQueriesContext(connection) as after:
        dry_runs.model_headroom(name="llama", limit=10)
    assert _node_reads(after.captured_queries) == _node_reads(together.captured_queries)
