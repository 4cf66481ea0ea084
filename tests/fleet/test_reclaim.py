"""Reclaim through the shell: the control plane tells a node to delete cached weights no
replica on it uses, once old or while its disk is short."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from catalog.services import model_add
from fleet.models import Node
from fleet.nodes.reclaim import weights_reclaim
from fleet.nodes.reports import node_weights_record
from fleet.protocol import Disk, Weight
from fleet.reconciler.run import reconcile_once
from mirror.models import WeightFile
from mirror.worker import work_until_idle
from tests.fleet.builders import node_add
from tests.mirror.test_weights import mirror_dir  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC)
OLD = "0" * 64


def _held(digest: str, *, days_ago: float, size: int = 1000) -> Weight:
    return Weight(sha256=digest, size=size, used_at=time.time() - days_ago * 86400)


@pytest.fixture
def served(api, mirror_dir, no_settle):  # noqa: F811
    """A model on mirror weights with a replica on gpu-a; returns the weights' digest."""
    path = mirror_dir / "allowed" / "tiny.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 1000)
    api.call("POST", "/weights", {"source": str(path)})
    work_until_idle()
    model_add(
        data={
            "name": "tiny",
            "source": str(path),
            "profiles": [{"name": "cpu", "engine": "sim", "cpu_cores": 1, "min_memory_gb": 1}],
        },
        actor="test",
    )
    node_add("gpu-a", now=NOW)
    reconcile_once(now=NOW)
    return WeightFile.objects.get().sha256


def test_old_weights_nothing_uses_are_deleted_and_what_a_replica_uses_is_kept(served):
    node_weights_record(
        node_id="gpu-a",
        weights=[_held(served, days_ago=30), _held(OLD, days_ago=30)],
        disk=None,
    )

    (cmd,) = weights_reclaim(now=NOW, force=True)

    assert cmd.node_id == "gpu-a"
    assert cmd.payload == {"type": "delete_weights", "sha256": [OLD]}


def test_a_node_short_of_disk_loses_the_least_recently_used(served):
    recent = "1" * 64
    node_weights_record(
        node_id="gpu-a",
        weights=[_held(recent, days_ago=1, size=8 << 30), _held(OLD, days_ago=2, size=8 << 30)],
        disk=Disk(free_gb=4, total_gb=100),
    )

    (cmd,) = weights_reclaim(now=NOW, force=True)

    # 4 GB free, floor 10: the older goes first (4 + 8 = 12 ≥ 10) and that is enough.
    assert cmd.payload["sha256"] == [OLD]


def test_nothing_to_reclaim_sends_nothing_and_a_lost_node_is_left_alone(served):
    node_weights_record(node_id="gpu-a", weights=[_held(OLD, days_ago=1)], disk=None)
    assert weights_reclaim(now=NOW, force=True) == []

    node_weights_record(node_id="gpu-a", weights=[_held(OLD, days_ago=30)], disk=None)
    Node.objects.update(state=Node.LOST)
    assert weights_reclaim(now=NOW, force=True) == []


def test_reclaim_runs_a_few_times_an_hour_not_every_pass(served):
    node_weights_record(node_id="gpu-a", weights=[_held(OLD, days_ago=30)], disk=None)

    assert weights_reclaim(now=NOW, force=True)
    assert weights_reclaim(now=NOW + timedelta(seconds=5)) == []
