"""Several reads one page asks read the fleet once (llmgw.core.reads.once_each)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.selectors import dry_runs
from llmgw.core import clock, reads

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
    with CaptureQueriesContext(connection) as together, reads.once_each():
        shared = dry_runs.model_headroom(name="llama", limit=10)
        dry_runs.model_preemption(name="llama")
    assert shared == alone
    assert _node_reads(apart.captured_queries) == 2 * _node_reads(together.captured_queries)
    # Outside it, each reads the fleet as it is then.
    with CaptureQueriesContext(connection) as after:
        dry_runs.model_headroom(name="llama", limit=10)
    assert _node_reads(after.captured_queries) == _node_reads(together.captured_queries)


def test_inside_once_each_a_models_rows_are_taken_from_the_whole_read_and_equal_a_direct_one(
    django_assert_num_queries,
):
    from fleet.models import ModelState
    from fleet.selectors.state import model_states, replica_views
    from tests.fleet.test_pages import place

    now = clock.now()
    node_add("gpu-a", now=now)
    for name in ("llama", "qwen"):
        model_added(gpu_model(name))
        ModelState.objects.create(model=name, desired=1)
    place("llama-1", "llama", "gpu-a", [0], now=now)
    place("qwen-1", "qwen", "gpu-a", [1], now=now)
    direct = (replica_views(model="qwen"), model_states(name="qwen"), replica_views())
    with reads.once_each():
        first = replica_views(model="qwen"), model_states(name="qwen"), replica_views()
        with django_assert_num_queries(0):
            again = replica_views(model="llama"), model_states(name="llama"), model_states()
    assert first == direct
    assert [r.id for r in again[0]] == ["llama-1"] and list(again[1]) == ["llama"]
    assert sorted(again[2]) == ["llama", "qwen"]
