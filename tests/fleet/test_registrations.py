"""Registrations written in batches (a fleet registering again after a restart) leave what
the same registrations one at a time would, and one's refusal or failure is its own."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from fleet.models import Gpu, Node, Replica, Shard
from fleet.nodes import registration
from fleet.nodes.identity import AgentCredential, Refused
from fleet.nodes.registration import node_register, registrations_write
from fleet.protocol import Register

from .builders import (
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

T1 = datetime(2026, 3, 2, 9, 5, tzinfo=UTC)


@pytest.fixture
def fleet(monkeypatch):
    """Nodes a (runs a ready replica), b and c registered at T0; registrations after at T1."""
    model_added(gpu_model("llama"))
    for node_id in ("gpu-a", "gpu-b", "gpu-c"):
        node_add(node_id, now=T0)
    replica = Replica.objects.create(
        id="llama-r1", model="llama", profile="gpu", state="ready", state_since=T0, created_at=T0
    )
    Shard.objects.create(
        id="llama-r1-0", replica=replica, node_id="gpu-a", gpu_indices=[0], state="ready", http_port=20000,
        endpoint="http://10.0.0.7:20000",
    )  # fmt: skip
    monkeypatch.setattr(registration.clock, "now", lambda: T1)


def call(node_id: str, **frame) -> dict:
    return {
        "msg": Register.model_validate(register_frame(node_id, **frame)),
        "session": f"again-{node_id}",
        "credential": agent_credential(node_id),
        "seen_addr": "10.0.0.7",
    }


def restart_calls() -> list[dict]:
    return [
        call("gpu-a", shards=(running_shard("llama-r1", "llama", "gpu"),)),
        call("gpu-b", gpus=(L4,)),  # its GPUs changed meanwhile
        call("gpu-c", gpus=(L4,)),
        call("gpu-new"),  # joins with the join token
        call("gpu-c", labels={"rack": "7"}),  # a second session of one node, its H100s back
    ]


def rows() -> list:
    """The fleet's rows, less what is random (a credential's digest, a row's revision)."""
    return [
        [
            {k: v for k, v in n.items() if k not in ("credential_hash", "rev")}
            for n in Node.objects.order_by("id").values()
        ],
        list(Gpu.objects.order_by("node", "index").values("node", "index", "name", "uuid")),
        list(Replica.objects.order_by("id").values("id", "state")),
        list(Shard.objects.order_by("id").values("id", "node", "state")),
    ]


def answered(answers) -> list:
    return [
        (type(a).__name__, str(a))
        if isinstance(a, Exception)
        else (a.at, a.commands, a.approved, a.node_token is not None)
        for a in answers
    ]


def outcome(write) -> tuple[list, list]:
    """What `write` answered and left, undone afterwards."""
    with transaction.atomic():
        answers = write(restart_calls())
        left = rows()
        transaction.set_rollback(True)
    return answered(answers), left


def one_at_a_time(calls: list[dict]) -> list:
    answers = []
    for c in calls:
        try:
            answers.append(node_register(now=T1, **c))
        except Refused as exc:
            answers.append(exc)
    return answers


def test_a_batch_leaves_what_the_same_registrations_one_at_a_time_would(fleet):
    batch = outcome(registrations_write)
    assert batch == outcome(one_at_a_time)
    nodes = {n["id"]: n for n in batch[1][0]}
    assert nodes["gpu-c"]["labels"] == {"rack": "7"}  # the later session's
    assert [g["name"] for g in batch[1][1] if g["node"] == "gpu-b"] == ["NVIDIA L4"]
    assert {g["name"] for g in batch[1][1] if g["node"] == "gpu-c"} == {"NVIDIA H100 80GB HBM3"}


def test_a_batch_reads_its_nodes_gpus_and_shards_once_for_all(fleet):
    calls = [call(n) for n in ("gpu-b", "gpu-c")]  # each as it was: nothing else is read
    with CaptureQueriesContext(connection) as queries:
        registrations_write(calls)

    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    for table in ("fleet_gpu", "fleet_shard"):
        assert sum(f'FROM "{table}"' in sql for sql in reads) == 1, table


def test_a_refusal_in_a_batch_is_its_own(fleet):
    calls = [call("gpu-a"), call("gpu-b")]
    calls[0]["credential"] = AgentCredential(node_id="gpu-b")  # another node's credential

    answers = registrations_write(calls)

    assert isinstance(answers[0], Refused) and "node gpu-b's" in str(answers[0])
    assert Node.objects.get(pk="gpu-b").session == "again-gpu-b"
    assert Node.objects.get(pk="gpu-a").session == "session-gpu-a"


def test_a_failure_in_a_batch_undoes_only_its_own(fleet, monkeypatch):
    reconcile_reported = registration._reconcile_reported_shards

    def fails_for_b(node, *args):
        if node.id == "gpu-b":
            raise RuntimeError("gpu-b's row could not be written")
        return reconcile_reported(node, *args)

    monkeypatch.setattr(registration, "_reconcile_reported_shards", fails_for_b)
    answers = registrations_write([call("gpu-a"), call("gpu-b"), call("gpu-c")])

    assert isinstance(answers[1], RuntimeError)
    sessions = dict(Node.objects.values_list("id", "session"))
    assert sessions == {"gpu-a": "again-gpu-a", "gpu-b": "session-gpu-b", "gpu-c": "again-gpu-c"}
