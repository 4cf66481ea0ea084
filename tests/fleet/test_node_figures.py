"""A node's figures the cluster page sorts by stay true through every writer: registering,
placing, a shard ending, forgetting a node, and the heartbeats' load."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.models import Node, Replica, Shard
from fleet.nodes.figures import node_figures_refresh
from fleet.nodes.heard import node_live_flush
from fleet.nodes.identity import node_forget
from fleet.nodes.live import NodeWrite
from fleet.nodes.registration import node_register
from fleet.nodes.reports import shard_status_record
from fleet.protocol import Load, Register, ShardStatus
from fleet.reconciler.run import reconcile_once

from .builders import (
    H100,
    L4,
    T0,
    agent_credential,
    gpu_model,
    model_added,
    node_add,
    register_frame,
    running_shard,
)

pytestmark = pytest.mark.django_db


def figures(node_id: str) -> tuple:
    """GPUs total and free, their classes and the replicas held, as the row keeps them."""
    return Node.objects.filter(pk=node_id).values_list(
        "gpu_total", "gpu_free", "gpu_classes", "replica_count"
    )[0]


def test_a_registered_node_has_its_gpus_and_classes():
    node_add("gpu-a", now=T0, gpus=(H100, L4))
    node_add("cpu-b", now=T0, gpus=())
    assert figures("gpu-a") == (2, 2, ["h100-80g", "l4-24g"], 0)
    # No GPUs: none free is no figure, not a zero.
    assert figures("cpu-b") == (0, None, [], 0)


def test_registering_again_with_a_class_label_names_the_class():
    node_add("gpu-a", now=T0)
    node_add("gpu-a", now=T0 + timedelta(seconds=1), labels={"llmgw.io/gpu-class": "h100-nvl"})
    assert figures("gpu-a") == (2, 2, ["h100-nvl"], 0)


def test_placing_then_a_failed_shard_takes_then_gives_back_a_gpu(no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    assert figures("gpu-a") == (2, 1, ["h100-80g"], 1)

    shard = Shard.objects.get()
    shard_status_record(
        node_id="gpu-a",
        msg=ShardStatus(type="shard_status", shard_id=shard.id, state="failed"),
        now=T0 + timedelta(seconds=1),
    )
    assert Replica.objects.get().state == "failed"
    assert figures("gpu-a") == (2, 2, ["h100-80g"], 0)


def two_node_replica() -> None:
    """A ready replica with a shard of two GPUs on each of gpu-a and gpu-b."""
    node_add("gpu-a", now=T0)
    node_add("gpu-b", now=T0)
    Replica.objects.create(
        id="big-1", model="big", profile="gpu", profile_fp="x", state="ready",
        state_since=T0, created_at=T0,
    )  # fmt: skip
    for rank, node_id in enumerate(("gpu-a", "gpu-b")):
        Shard.objects.create(
            id=f"big-1-{rank}", replica_id="big-1", node_id=node_id, rank=rank,
            gpu_indices=[0, 1], http_port=20000, state="ready",
        )  # fmt: skip
    node_figures_refresh(replicas=["big-1"])
    assert figures("gpu-b") == (2, 0, ["h100-80g"], 1)


def test_forgetting_a_node_frees_what_its_replicas_held_elsewhere():
    two_node_replica()
    node_forget(node_id="gpu-a", actor="ops", now=T0)
    assert figures("gpu-b") == (2, 2, ["h100-80g"], 0)


def test_a_node_registering_without_its_shard_frees_the_replicas_gpus_elsewhere():
    two_node_replica()
    node_add("gpu-a", now=T0 + timedelta(seconds=1))  # reports no shard: big-1 failed
    assert Replica.objects.get().state == "failed"
    assert figures("gpu-a") == figures("gpu-b") == (2, 2, ["h100-80g"], 0)


def test_a_node_registering_with_what_it_runs_changes_nothing_elsewhere():
    two_node_replica()
    node_add("gpu-b", now=T0 + timedelta(seconds=1), shards=(
        {**running_shard("big-1", "big", "gpu"), "shard_id": "big-1-1",
         "endpoint": "http://10.0.0.7:20000", "gpu_indices": [0, 1]},
    ))  # fmt: skip
    assert Replica.objects.get().state == "ready"
    assert figures("gpu-a") == figures("gpu-b") == (2, 0, ["h100-80g"], 1)


def test_a_node_registering_again_as_it_was_writes_only_its_own_row(django_assert_num_queries):
    """What 5,000 nodes do together when the control plane restarts: each register is its
    own row read and written, its GPUs and shards read, and nothing else."""
    two_node_replica()
    shard = {**running_shard("big-1", "big", "gpu"), "shard_id": "big-1-1",
             "endpoint": "http://10.0.0.7:20000", "gpu_indices": [0, 1]}  # fmt: skip
    node_add("gpu-b", now=T0 + timedelta(seconds=1), shards=(shard,))
    again = Register.model_validate(register_frame("gpu-b", shards=(shard,)))
    credential = agent_credential("gpu-b")
    # Its row locked and written, its GPUs and shards read; and the (save)point's two.
    with django_assert_num_queries(6):
        node_register(
            msg=again,
            session="again",
            now=T0 + timedelta(seconds=2),
            credential=credential,
            seen_addr="10.0.0.7",
        )
    assert figures("gpu-b") == (2, 0, ["h100-80g"], 1)


def test_the_load_figures_follow_every_heartbeat_and_what_is_not_said_is_null():
    node_add("gpu-a", now=T0)
    assert Node.objects.values_list("load1", "memory_used_bytes", "cpu_temp_c").get() == (
        None,
        None,
        None,
    )
    node_live_flush(
        writes=[
            NodeWrite(
                node_id="gpu-a", session="session-gpu-a", last_seen=T0,
                sample=Load(load1=2.5, memory_used_bytes=1 << 30, inlet_temp_c=21.0),
                engines={}, memory_total_mb=None, cpu_count=None, used_replicas=frozenset(),
            )
        ],
        now=T0,
    )  # fmt: skip
    node = Node.objects.get()
    assert (node.load1, node.memory_used_bytes, node.inlet_temp_c) == (2.5, 1 << 30, 21.0)
    assert (node.cpu_temp_c, node.cpu_power_w) == (None, None)


@pytest.mark.parametrize(
    "sample, engines",
    [
        (None, {}),
        (None, {"gpu-a-r1-0": {"running": 1, "waiting": 0}}),
        (Load(load1=0.5, gpus=[{"index": 0, "temp_c": 61.5}]), {}),
        (Load(cpu_percent=12.5), {"gpu-a-r1-0": {"running": 2, "waiting": 3}}),
    ],
)
def test_the_load_is_stored_as_the_heartbeat_said_it_with_the_engines_beside(sample, engines):
    node_add("gpu-a", now=T0)
    node_live_flush(
        writes=[
            NodeWrite(
                node_id="gpu-a", session="session-gpu-a", last_seen=T0, sample=sample,
                engines=engines, memory_total_mb=None, cpu_count=None, used_replicas=frozenset(),
            )
        ],
        now=T0,
    )  # fmt: skip
    said = sample.model_dump(exclude_none=True) if sample is not None else {}
    assert Node.objects.get().load == ({**said, "engines": engines} if engines else said)
    assert Node.objects.get().last_seen == T0
