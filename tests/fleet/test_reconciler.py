"""The reconciler's shell over real rows: passes at a given `now`, the lease, the settle period."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.services import model_remove, model_scale
from fleet.models import ModelState, Node, Replica, Shard
from fleet.nodes.heard import node_live_flush
from fleet.nodes.live import NodeWrite
from fleet.nodes.reports import shard_status_record
from fleet.protocol import Load, ShardStatus
from fleet.reconciler import run as reconciler
from fleet.reconciler.run import lease_release, lease_take, reconcile_once
from fleet.services import node_set_schedule

from .builders import T0, at, gpu_model, model_added, node_add

pytestmark = pytest.mark.django_db


def heard(node_id: str, now: datetime, **figures) -> None:
    """The write-behind of a heartbeat from the node's current connection."""
    node_live_flush(
        writes=[
            NodeWrite(
                node_id=node_id,
                session=f"session-{node_id}",
                last_seen=now,
                sample=None,
                engines={},
                memory_total_mb=figures.get("memory_total_mb"),
                cpu_count=figures.get("cpu_count"),
                used_replicas=frozenset(),
            )
        ],
        now=now,
    )


def ready(replica: Replica, now: datetime) -> None:
    for shard in replica.shards.all():
        shard_status_record(
            node_id=shard.node_id,
            msg=ShardStatus(type="shard_status", shard_id=shard.id, state="ready"),
            now=now,
        )


@pytest.fixture
def sent(monkeypatch):
    """The commands passes send to agents, recorded when their transaction commits."""
    commands = []
    monkeypatch.setattr(reconciler, "dispatch", commands.extend)
    return commands


@pytest.fixture
def committed(sent, django_capture_on_commit_callbacks):
    """Run a pass and its after-commit work, as outside a test's transaction."""

    def run(now: datetime) -> dict:
        with django_capture_on_commit_callbacks(execute=True):
            return reconcile_once(now=now)

    return run


def test_a_pass_places_a_missing_replica_and_records_the_models_state(no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)

    result = reconcile_once(now=T0)

    assert (result["ran"], result["settling"], result["starts"]) == (True, False, 1)
    replica = Replica.objects.get()
    assert (replica.model, replica.state, replica.created_at) == ("llama", "pending", T0)
    assert replica.shards.get().node_id == "gpu-a"
    assert ModelState.objects.get(pk="llama").desired == 1


def test_start_commands_are_sent_only_when_the_pass_commits(
    no_settle, sent, django_capture_on_commit_callbacks
):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        reconcile_once(now=T0)
    assert sent == []

    for callback in callbacks:
        callback()
    assert [(c.node_id, c.payload["type"]) for c in sent] == [("gpu-a", "start_shard")]


def test_a_lost_nodes_replica_is_forgotten_and_replaced_elsewhere(no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    node_add("gpu-b", now=T0)
    reconcile_once(now=T0)
    first = Replica.objects.get()
    ready(first, T0)
    gone = first.shards.get().node_id
    kept = ({"gpu-a", "gpu-b"} - {gone}).pop()

    events = []
    for second in range(5, 70, 5):
        heard(kept, at(second))
        events += reconcile_once(now=at(second))["events"]
        if second == 15:
            assert Node.objects.get(pk=gone).state == Node.UNREACHABLE
            assert Replica.objects.get(pk=first.pk).state == "ready"

    assert Node.objects.get(pk=gone).state == Node.LOST
    assert not Replica.objects.filter(pk=first.pk).exists()
    replacement = Replica.objects.get()
    assert replacement.shards.get().node_id == kept
    assert any(f"lost with node {gone}" in line for line in events)
    # A lost node is not the model's fault: nothing counts against it.
    assert ModelState.objects.get(pk="llama").failures == 0


def test_an_unreachable_node_heard_from_again_is_ready_again(no_settle):
    node_add("gpu-a", now=T0)
    for second in (0, 5, 10, 15):
        reconcile_once(now=at(second))
    assert Node.objects.get(pk="gpu-a").state == Node.UNREACHABLE

    heard("gpu-a", at(18))
    reconcile_once(now=at(20))

    assert Node.objects.get(pk="gpu-a").state == Node.READY


def test_a_fleet_gone_silent_is_marked_in_a_few_statements_not_one_per_node(no_settle, settings):
    settings.LLMGW = replace(
        settings.LLMGW, agents=replace(settings.LLMGW.agents, joins_per_minute=10_000)
    )
    for n in range(1200):
        node_add(f"gpu-{n:04d}", now=T0)
    reconcile_once(now=T0)
    heard("gpu-0007", at(14))  # still talking: stays ready

    with CaptureQueriesContext(connection) as queries:
        reconcile_once(now=at(15))

    states = dict(Node.objects.values_list("id", "state"))
    assert states.pop("gpu-0007") == Node.READY
    assert set(states.values()) == {Node.UNREACHABLE}
    assert set(Node.objects.exclude(pk="gpu-0007").values_list("state_since", flat=True)) == {
        at(15)
    }
    node_writes = [
        q
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith("UPDATE")
        and "fleet_node" in q["sql"].split("SET")[0]
    ]
    assert len(node_writes) == 3  # 1,199 nodes, in runs of 500


def test_a_lost_node_heard_from_after_the_snapshot_keeps_its_replica(no_settle, monkeypatch):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    replica = Replica.objects.get()
    ready(replica, T0)
    decide = reconciler.decide

    def heard_while_deciding(snap, now, *args, **kwargs):
        plan = decide(snap, now, *args, **kwargs)
        if now == at(60):
            heard("gpu-a", at(60))  # its heartbeat is written between snapshot and write
        return plan

    monkeypatch.setattr(reconciler, "decide", heard_while_deciding)
    for second in range(5, 65, 5):
        reconcile_once(now=at(second))

    assert Node.objects.get(pk="gpu-a").state == Node.READY  # heard: ready again
    assert Replica.objects.get(pk=replica.pk).state == "ready"


def test_a_heartbeat_of_an_older_connection_is_not_written(no_settle):
    node_add("gpu-a", now=T0)

    node_live_flush(
        writes=[
            NodeWrite(
                node_id="gpu-a",
                session="an-older-session",
                last_seen=at(30),
                sample=Load(cpu_percent=99),
                engines={},
                memory_total_mb=1024,
                cpu_count=1,
                used_replicas=frozenset(),
            )
        ],
        now=at(30),
    )

    node = Node.objects.get(pk="gpu-a")
    assert (node.last_seen, node.load, node.cpu_count) == (T0, {}, 32)


def test_a_node_reporting_less_memory_is_believed(no_settle):
    node_add("gpu-a", now=T0, memory_total_mb=65536)

    heard("gpu-a", at(5), memory_total_mb=32768)

    assert Node.objects.get(pk="gpu-a").memory_total_mb == 32768


def test_the_lease_refuses_a_second_holder_until_it_expires():
    assert lease_take(holder="worker-1", now=T0, seconds=60)

    assert not lease_take(holder="worker-2", now=at(30), seconds=60)
    assert lease_take(holder="worker-1", now=at(30), seconds=60)
    assert not lease_take(holder="worker-2", now=at(89), seconds=60)
    assert lease_take(holder="worker-2", now=at(90), seconds=60)


def test_a_released_lease_is_free_at_once():
    lease_take(holder="worker-1", now=T0)

    lease_release(holder="worker-1")

    assert lease_take(holder="worker-2", now=at(1))


def test_a_pass_does_nothing_while_another_holds_the_lease(no_settle):
    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL keeps passes apart by an advisory lock: test_reconciler_lock.py")
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    lease_take(holder="elsewhere", now=T0)

    result = reconcile_once(now=at(1))

    assert result["ran"] is False
    assert Replica.objects.count() == 0


def test_nothing_is_placed_while_the_reconciler_settles_after_a_start():
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)

    passes = {}
    for second in (0, 10, 20, 29, 31):
        heard("gpu-a", at(second))
        passes[second] = reconcile_once(now=at(second))

    assert [passes[s]["settling"] for s in (0, 10, 20, 29)] == [True] * 4
    assert [passes[s]["starts"] for s in (0, 10, 20, 29)] == [0] * 4
    assert (passes[31]["settling"], passes[31]["starts"]) == (False, 1)


def test_a_pass_after_a_long_silence_settles_again_and_counts_silence_from_then():
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    for second in (0, 10, 20, 31):
        heard("gpu-a", at(second))
        reconcile_once(now=at(second))
    assert Replica.objects.count() == 1
    model_scale(name="llama", actor="test", scaling={"min": 2})

    # Nobody ran a pass for two minutes, nor wrote the node's heartbeats.
    late = reconcile_once(now=at(151))

    assert (late["settling"], late["starts"]) == (True, 0)
    assert Node.objects.get(pk="gpu-a").state == Node.READY
    for second in (161, 171, 181):
        heard("gpu-a", at(second))
        after = reconcile_once(now=at(second))
    assert (after["settling"], after["starts"]) == (False, 1)


def test_a_pass_with_nothing_to_do_writes_nothing_but_the_lease(no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    ready(Replica.objects.get(), T0)
    heard("gpu-a", at(5))
    reconcile_once(now=at(5))
    heard("gpu-a", at(10))

    with CaptureQueriesContext(connection) as queries:
        result = reconcile_once(now=at(10))

    writes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))
        and "fleet_lease" not in q["sql"]
    ]
    assert result["ran"] and result["events"] == []
    assert writes == []


def test_scaling_down_drains_the_newest_ready_replica(no_settle):
    model_added(gpu_model("llama", scaling={"min": 2}))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    for replica in Replica.objects.all():
        ready(replica, T0)
    model_scale(name="llama", actor="test", scaling={"min": 1})

    heard("gpu-a", at(5))
    result = reconcile_once(now=at(5))

    assert result["drains"] == 1
    assert sorted(Replica.objects.values_list("state", flat=True)) == ["draining", "ready"]


def test_a_removed_models_replicas_are_stopped(no_settle, sent, committed):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    replica = Replica.objects.get()
    ready(replica, T0)
    shard = Shard.objects.get()
    sent.clear()

    model_remove(name="llama", actor="test")
    heard("gpu-a", at(5))
    committed(at(5))

    assert Replica.objects.get().state == "stopping"
    assert [c.payload for c in sent] == [
        {"type": "stop_shard", "shard_id": shard.id, "grace_s": Replica.objects.get().stop_grace_s}
    ]


def test_a_drained_node_gets_a_replacement_first_and_then_stops_its_replica(
    no_settle, sent, committed
):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    old = Replica.objects.get()
    ready(old, T0)
    node_add("gpu-b", now=at(1))

    node_set_schedule(node_id="gpu-a", action="drain", actor="ops")
    for node in ("gpu-a", "gpu-b"):
        heard(node, at(5))
    reconcile_once(now=at(5))

    new = Replica.objects.exclude(pk=old.pk).get()
    assert new.shards.get().node_id == "gpu-b"
    assert Replica.objects.get(pk=old.pk).state == "ready"

    ready(new, at(6))
    sent.clear()
    for node in ("gpu-a", "gpu-b"):
        heard(node, at(10))
    committed(at(10))

    assert Replica.objects.get(pk=old.pk).state == "stopping"
    assert [(c.node_id, c.payload["type"]) for c in sent] == [("gpu-a", "stop_shard")]


def test_an_engine_reporting_ready_for_a_replica_being_stopped_is_told_to_stop(no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    replica = Replica.objects.get()
    Replica.objects.filter(pk=replica.pk).update(state="stopping")
    shard = replica.shards.get()
    commands = shard_status_record(
        node_id="gpu-a",
        msg=ShardStatus(type="shard_status", shard_id=shard.id, state="ready"),
        now=at(1),
    )
    assert [(c.node_id, c.payload["type"], c.payload["shard_id"]) for c in commands] == [
        ("gpu-a", "stop_shard", shard.id)
    ]
    assert Replica.objects.get().state == "stopping", "a late ready does not undo the stop"


def test_a_ready_replica_whose_engine_stops_is_replaced_without_counting_a_failure(no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    replica = Replica.objects.get()
    ready(replica, at(1))
    shard = replica.shards.get()
    # The agent restarted and stopped its engines on the way down.
    shard_status_record(
        node_id="gpu-a",
        msg=ShardStatus(type="shard_status", shard_id=shard.id, state="stopped"),
        now=at(2),
    )
    heard("gpu-a", at(3))
    reconcile_once(now=at(3))
    assert ModelState.objects.get(pk="llama").failures == 0
    assert Replica.objects.exclude(pk=replica.pk).count() == 1


def test_a_retry_asked_while_a_pass_decides_is_not_overwritten(no_settle, monkeypatch):
    model_added(
        gpu_model("llama", gpu_class="a100-80g")
    )  # no node has these: it keeps failing to place
    node_add("gpu-a", now=T0)
    ModelState.objects.create(model="llama", parked_since=T0, parked_reason="boom", failures=5)
    from fleet.selectors import snapshot
    from fleet.services import model_retry

    load = snapshot.snapshot_load

    def retry_after_loading(**kw):
        snap = load(**kw)
        model_retry(name="llama", actor="ops")  # lands between the snapshot and the write
        return snap

    monkeypatch.setattr(reconciler, "snapshot_load", retry_after_loading)
    reconcile_once(now=at(1))
    state = ModelState.objects.get(pk="llama")
    assert (state.parked_since, state.failures) == (None, 0)


def test_a_lost_multi_node_replicas_surviving_shard_is_told_to_stop(no_settle, sent, committed):
    model_added(
        gpu_model("big")
        | {
            "profiles": [
                {"name": "gpu", "engine": "sim", "gpu_class": "h100-80g", "tp": 4, "nodes": 2}
            ]
        }
    )
    for node in ("gpu-a", "gpu-b"):
        node_add(node, now=T0, labels={"llmgw.io/fabric": "ib"})
    committed(T0)
    replica = Replica.objects.get()
    ready(replica, at(1))
    sent.clear()
    for second in range(10, 71, 10):  # passes go on; gpu-a says nothing more: lost after 60 s
        heard("gpu-b", at(second))
        committed(at(second))
    assert ("gpu-b", "stop_shard") in [(c.node_id, c.payload["type"]) for c in sent]
    assert not Replica.objects.filter(pk=replica.pk).exists()


def test_an_engine_a_heartbeat_lists_but_nothing_here_runs_is_stopped(no_settle):
    from fleet.nodes.heard import node_running_unknown

    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    known = Replica.objects.get().shards.get().id
    write = NodeWrite(
        node_id="gpu-a",
        session="session-gpu-a",
        last_seen=at(1),
        sample=None,
        engines={},
        memory_total_mb=None,
        cpu_count=None,
        used_replicas=frozenset(),
        running=frozenset({known, "ghost-abc123-0"}),
    )
    commands = node_running_unknown(writes=[write])
    assert [(c.node_id, c.payload["type"], c.payload["shard_id"]) for c in commands] == [
        ("gpu-a", "stop_shard", "ghost-abc123-0")
    ]


def test_the_kept_rows_are_frozen_once_warm_and_again_as_the_fleet_grows(monkeypatch):
    frozen = []
    monkeypatch.setattr(reconciler.gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setattr(reconciler.gc, "collect", lambda: 0)
    warm = reconciler.WarmFreeze()
    for size in (10, 999):  # a small fleet: a collection costs little
        warm.after(size)
    assert frozen == []
    warm.after(1000)
    warm.after(1200)  # grown by less than a quarter
    assert len(frozen) == 1
    warm.after(1300)
    assert len(frozen) == 2
