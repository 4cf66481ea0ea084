"""The database numbers a row anew on every write, and a pass reads in full only the rows
whose number moved (fleet/selectors/rows.py RowsByRevision, migration fleet.0014)."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.db import connection

from fleet.models import ModelState, Node, Replica, Shard
from fleet.selectors import rows as fleet_rows, state as selectors
from fleet.selectors.rows import RowsByRevision
from llmgw.core import clock

from .builders import node_add
from .test_pages import place

pytestmark = pytest.mark.django_db

REVISED = [m for m in apps.get_models() if any(f.name == "rev" for f in m._meta.fields)]


def _rev(model, pk) -> int:
    return model.objects.values_list("rev", flat=True).get(pk=pk)


@pytest.fixture
def replica():
    now = clock.now()
    node_add("gpu-a", now=now)
    place("r1", "llama", "gpu-a", [0], now=now)
    ModelState.objects.create(model="llama", desired=1)
    return now


def test_every_table_read_by_revision_has_its_triggers_after_every_migration():
    # A migration that rebuilds one of these tables on SQLite drops its triggers: this says so.
    assert {m._meta.db_table for m in REVISED} == {
        "fleet_node",
        "fleet_replica",
        "fleet_shard",
        "fleet_modelstate",
    }
    for model in REVISED:
        assert fleet_rows._triggers_there(model._meta.db_table), model.__name__


@pytest.mark.parametrize(("model", "pk"), [(Replica, "r1"), (Shard, "r1-0"), (ModelState, "llama")])
def test_every_kind_of_write_gives_the_row_a_new_number(replica, model, pk):
    seen = [_rev(model, pk)]
    row = model.objects.get(pk=pk)
    row.save()  # writes back the number it read: the database's new one wins
    seen.append(_rev(model, pk))
    model.objects.filter(pk=pk).update(**{_field(model): _value(model, 1)})
    seen.append(_rev(model, pk))
    table, column = model._meta.db_table, model._meta.get_field(_field(model)).column
    key = model._meta.pk.column
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE {key} = %s", [_value(model, 2), pk])
    seen.append(_rev(model, pk))
    assert len(set(seen)) == len(seen), seen
    assert 0 not in seen  # an insert is numbered too


def test_a_nodes_number_moves_with_what_its_view_is_built_from_and_not_with_heartbeats(replica):
    viewed = importlib.import_module("fleet.migrations.0015_node_revisions").VIEWED
    assert ("id", *viewed) == selectors._NODE_VIEWED
    changes = {
        "state": "unreachable",
        "cordoned": True,
        "draining": True,
        "approved": False,
        "memory_total_mb": 4096,
        "cpu_count": 7,
        "spec_at": clock.now() + timedelta(seconds=1),
    }
    assert set(changes) == set(viewed)
    seen = [_rev(Node, "gpu-a")]
    # What a heartbeat writes: its time, its load, and its figures again as they were.
    node = Node.objects.get(pk="gpu-a")
    Node.objects.filter(pk="gpu-a").update(
        last_seen=clock.now() + timedelta(seconds=5),
        load={"gpu_util": 0.5},
        memory_total_mb=node.memory_total_mb,
        cpu_count=node.cpu_count,
    )
    assert _rev(Node, "gpu-a") == seen[0]
    for column, value in changes.items():
        Node.objects.filter(pk="gpu-a").update(**{column: value})
        seen.append(_rev(Node, "gpu-a"))
        assert seen[-1] != seen[-2], column


def _field(model) -> str:
    return {Replica: "reason", Shard: "detail", ModelState: "parked_reason"}[model]


def _value(model, n: int) -> str:
    return f"written {n}"


def test_rows_by_revision_read_the_same_rows_as_a_full_read_and_only_the_moved_in_full(
    replica, monkeypatch
):
    now = replica
    for i in range(2, 6):
        place(f"r{i}", "llama", "gpu-a", [i], now=now)
    fields = ("id", "model", "state", "reason")
    reader = RowsByRevision(Replica, fields, order=lambda r: r[0])
    reads: list[tuple[tuple, list]] = []  # what each read asked for, and the ids it got
    raw = fleet_rows.raw_values

    def counted(qs, asked):
        out = raw(qs, asked)
        reads.append((asked, sorted(r[0] for r in out)))
        return out

    monkeypatch.setattr(fleet_rows, "raw_values", counted)

    def full() -> list[tuple]:
        return sorted(Replica.objects.order_by().values_list(*fields))

    assert reader.read() == full()
    reads.clear()
    assert reader.read() == full()
    assert reads == []  # nothing moved: the table's fingerprint says so, no row is read
    Replica.objects.filter(pk="r3").update(reason="moved")
    Replica.objects.filter(pk="r5").delete()
    place("r9", "llama", "gpu-a", [7], now=now)
    reads.clear()
    after = reader.read()
    assert after == full()
    assert ("r3", "llama", "ready", "moved") in after and all(r[0] != "r5" for r in after)
    # The numbers, then only the moved row and the new one in full.
    assert reads == [
        (("id", "rev"), ["r1", "r2", "r3", "r4", "r9"]),
        ((*fields, "rev"), ["r3", "r9"]),
    ]


def test_a_table_whose_rows_are_the_same_but_stored_anew_is_read_again_and_still_right(replica):
    reader = RowsByRevision(Replica, ("id", "reason"))
    first = reader.read()
    # A fingerprint that moved without any row moving (as a table rewritten on disk would):
    # the numbers are compared, nothing is read in full, and the rows are last read's.
    reader._last = ("another order", *reader._last[1:])
    assert reader.read() == first
    assert reader._last[0] != "another order"


def test_without_its_triggers_a_table_is_read_in_full_and_still_right(replica, monkeypatch):
    reader = RowsByRevision(Replica, ("id", "reason"))
    reader.read()
    monkeypatch.setattr(fleet_rows, "_kept", {})
    monkeypatch.setattr(fleet_rows, "_triggers_there", lambda table: False)
    Replica.objects.filter(pk="r1").update(reason="unseen by number")
    assert reader.read() == [("r1", "unseen by number")]


def test_the_pass_reads_the_same_replicas_and_states_by_revision_as_in_full(replica):
    now = replica
    place("r2", "qwen", "gpu-a", [1], now=now)
    ModelState.objects.create(
        model="qwen",
        explanation=[{"profile": "gpu", "reasons": ["no room"]}],
        reserved=[
            {"replica": "r2", "node": "gpu-a", "gpu_indices": [1], "memory_gb": 1, "cpu_cores": 1}
        ],
    )
    selectors.caches_clear()
    for step in range(3):
        by_revision = (
            selectors.replica_views(by_revision=True),
            selectors.model_states(by_revision=True),
        )
        # Read in full (the views of rows equal to the ones read by revision are shared).
        assert by_revision == (selectors.replica_views(), selectors.model_states()), step
        Replica.objects.filter(pk="r1").update(state="draining", reason=f"step {step}")
        Shard.objects.filter(pk="r2-0").update(state="failed")
        ModelState.objects.filter(pk="llama").update(explanation=[{"reasons": [str(step)]}])
    states = selectors.model_states(by_revision=True)
    assert states["qwen"].reserved and states["qwen"].explanation


def test_a_row_made_and_saved_again_through_one_instance_is_numbered_each_time(replica):
    now = replica
    row = Replica.objects.create(
        id="r7", model="llama", profile="gpu", profile_fp="x", state="pending",
        state_since=now, created_at=now,
    )  # fmt: skip
    first = _rev(Replica, "r7")
    row.state = "starting"
    row.save()
    assert Replica.objects.get(pk="r7").state == "starting"
    assert _rev(Replica, "r7") not in (0, first)


def test_a_nodes_view_is_the_same_object_while_only_its_heartbeats_move(replica):
    now = replica
    node_add("gpu-0", now=now)  # stored after gpu-a, sorted before it
    views, heard = selectors.nodes_heard()
    assert list(views) == ["gpu-0", "gpu-a"]
    later = now + timedelta(seconds=5)
    # Heartbeats move every row on disk on PostgreSQL: the order and the views stay.
    Node.objects.update(last_seen=later, load={"gpu_util": 0.5})
    again, heard = selectors.nodes_heard()
    assert list(again) == ["gpu-0", "gpu-a"]
    assert all(again[n] is views[n] for n in views)
    assert heard == {"gpu-0": later, "gpu-a": later}
    Node.objects.filter(pk="gpu-a").update(cordoned=True)
    cordoned = selectors.node_views()
    assert cordoned["gpu-a"].cordoned and cordoned["gpu-0"] is views["gpu-0"]
