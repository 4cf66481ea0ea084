"""The cluster page's nodes, sorted and filtered by the database, are those the Python
sort and filters gave, in the same order, on every column both ways.

The reference is the page's code before the database sorted: each node's figures worked
out from its rows (`reference_rows`), filtered and sorted in Python. Fleets come with ties,
figures not reported and some that are no reading (text, true, zero memory).
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings, strategies as st

from fleet.console import reads as ps
from fleet.domain.gpuclass import CLASS_LABEL
from fleet.domain.types import HOLDING, NodeView
from fleet.models import Gpu, Node, Replica, Shard
from fleet.nodes.figures import node_figures_refresh
from fleet.selectors.state import caches_clear, node_registrations, replica_views
from llmgw.core import clock

pytestmark = pytest.mark.django_db


def _figure(value):
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def reference_rows() -> list[dict]:
    """Every node as the page's `node_rows` read it before the figures were columns."""
    used: dict[str, set[int]] = defaultdict(set)
    on_node: dict[str, set[str]] = defaultdict(set)
    for r in replica_views():
        if r.state not in HOLDING:
            continue
        for s in r.shards:
            used[s.node_id].update(s.gpu_indices)
            on_node[s.node_id].add(r.id)
    nodes = list(Node.objects.values_list("id", "state", "cordoned", "draining", "spec_at"))
    registered = node_registrations({n[0]: n[4] for n in nodes})
    out = []
    for node in Node.objects.all():
        gpus = registered[node.id]["gpus"]
        classes = tuple(sorted({g.gpu_class for g in gpus}))
        load = node.load
        shown = NodeView(
            id=node.id, state=node.state, cordoned=node.cordoned, draining=node.draining
        )
        out.append(
            {
                "id": node.id,
                "state": shown.shown_state,
                "labels": registered[node.id]["labels"],
                "gpu_total": len(gpus),
                "gpu_free": sum(1 for g in gpus if g.healthy and g.index not in used[node.id]),
                "memory_gb": node.memory_total_mb / 1024 if node.memory_total_mb else None,
                "cpu_count": node.cpu_count or None,
                "load1": _figure(load.get("load1")),
                "replicas": len(on_node[node.id]),
                "classes": classes,
            }
        )
    return out


def reference_filter(rows, *, state="", label=None, gpu_class=""):
    return [
        r
        for r in rows
        if (not state or r["state"] == state)
        and (label is None or r["labels"].get(label[0]) == label[1])
        and (not gpu_class or gpu_class in r["classes"])
    ]


REFERENCE_KEYS = {
    "id": lambda r: r["id"],
    "state": lambda r: ps.SHOWN_STATES.index(r["state"]) if r["state"] in ps.SHOWN_STATES else 5,
    "gpus_free": lambda r: r["gpu_free"] if r["gpu_total"] else None,
    "memory": lambda r: r["memory_gb"],
    "cpus": lambda r: r["cpu_count"],
    "load": lambda r: r["load1"],
}


def reference_sort(rows, key, *, descending=False):
    """The page's Python sort: by `key`, ties by id, a node not reporting it last."""
    get = REFERENCE_KEYS[key]
    known = sorted((r for r in rows if get(r) is not None), key=lambda r: r["id"])
    known.sort(key=get, reverse=descending)
    return known + sorted((r for r in rows if get(r) is None), key=lambda r: r["id"])


def test_the_reference_covers_every_column_the_page_sorts_by():
    assert tuple(REFERENCE_KEYS) == ps.SORTS


node_specs = st.fixed_dictionaries(
    {
        "state": st.sampled_from(["ready", "ready", "unreachable", "lost"]),
        "cordoned": st.booleans(),
        "draining": st.booleans(),
        "memory_total_mb": st.sampled_from([None, 0, 64 * 1024, 128 * 1024]),
        "cpu_count": st.sampled_from([None, 0, 8, 32]),
        "load1": st.sampled_from(["absent", 0, 0.0, 1.5, 4, "busy", True, None]),
        "gpus": st.lists(
            st.tuples(st.sampled_from(["h100-80g", "l4-24g"]), st.booleans()), max_size=3
        ),
        "class_label": st.sampled_from([None, None, "", "h100-nvl"]),
        "rack": st.sampled_from([None, "r1", "r2"]),
        "held": st.lists(
            st.tuples(st.integers(0, 3), st.sampled_from(sorted(HOLDING) + ["stopped", "failed"])),
            max_size=3,
        ),
    }
)
# Ids chosen so that the order by id and by every figure differ, with '-', '.' and capitals.
IDS = ["a", "B", "b-2", "b.1", "b1", "c", "n10", "n9", "Z-1"]


def build(fleet: list[dict]) -> None:
    now = clock.now()
    for node_id, spec in zip(IDS, fleet, strict=False):
        labels = {}
        if spec["class_label"] is not None:
            labels[CLASS_LABEL] = spec["class_label"]
        if spec["rack"] is not None:
            labels["rack"] = spec["rack"]
        load = {} if spec["load1"] == "absent" else {"load1": spec["load1"]}
        Node.objects.create(
            id=node_id, state=spec["state"], cordoned=spec["cordoned"],
            draining=spec["draining"], memory_total_mb=spec["memory_total_mb"],
            cpu_count=spec["cpu_count"], labels=labels, load=load,
            state_since=now, registered_at=now, last_seen=now, spec_at=now,
        )  # fmt: skip
        for index, (gpu_class, healthy) in enumerate(spec["gpus"]):
            Gpu.objects.create(node_id=node_id, index=index, gpu_class=gpu_class, healthy=healthy)
        for n, (index, state) in enumerate(spec["held"]):
            rid = f"{node_id}-r{n}"
            Replica.objects.create(
                id=rid, model="m", profile="p", profile_fp="x", state=state,
                state_since=now, created_at=now,
            )  # fmt: skip
            Shard.objects.create(
                id=f"{rid}-0", replica_id=rid, node_id=node_id, gpu_indices=[index],
                http_port=20000,
            )  # fmt: skip
    node_figures_refresh(nodes=IDS)


FILTERS = [
    {},
    {"state": "ready"},
    {"state": "lost"},
    {"state": "cordoned"},
    {"label": ("rack", "r1")},
    {"gpu_class": "l4-24g"},
    {"gpu_class": "h100-nvl", "label": ("rack", "r2")},
]


def database_order(**asked) -> list[str]:
    table = ps.nodes_table(**asked)
    return [ps.node_row(r)["id"] for r in table.shown(of_class=bool(asked.get("gpu_class")))]


def assert_same_orders() -> None:
    caches_clear()
    reference = reference_rows()
    for filters in FILTERS:
        shown = reference_filter(reference, **filters)
        for key in ps.SORTS:
            for descending in (False, True):
                expected = [r["id"] for r in reference_sort(shown, key, descending=descending)]
                got = database_order(**filters, sort=key, descending=descending)
                assert got == expected, (filters, key, descending)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fleet=st.lists(node_specs, min_size=1, max_size=len(IDS)))
def test_the_database_sorts_and_filters_as_the_python_did(fleet):
    with transaction.atomic():
        build(fleet)
        assert_same_orders()
        transaction.set_rollback(True)


def test_a_fleet_of_ties_and_unknowns_sorts_the_same_both_ways():
    same = {
        "state": "ready", "cordoned": False, "draining": False, "memory_total_mb": 64 * 1024,
        "cpu_count": 8, "load1": 1.5, "gpus": [("h100-80g", True)] * 2, "class_label": None,
        "rack": "r1", "held": [],
    }  # fmt: skip
    unknown = same | {"memory_total_mb": 0, "cpu_count": None, "load1": "busy", "gpus": []}
    build([same, unknown, same, unknown | {"load1": True}, same | {"held": [(0, "ready")]}])
    assert_same_orders()
    assert database_order(sort="load", descending=True) == ["a", "b-2", "b1", "B", "b.1"]


def test_the_counters_count_every_node_whatever_the_filter():
    build(
        [
            {"state": "ready", "cordoned": False, "draining": False, "memory_total_mb": None,
             "cpu_count": None, "load1": "absent", "gpus": [("h100-80g", True)] * 4,
             "class_label": None, "rack": None, "held": [(0, "ready"), (1, "failed")]},
            {"state": "lost", "cordoned": False, "draining": False, "memory_total_mb": None,
             "cpu_count": None, "load1": "absent", "gpus": [("l4-24g", True)],
             "class_label": None, "rack": None, "held": []},
        ]
    )  # fmt: skip
    table = ps.nodes_table(state="lost")
    assert table.counters == {
        "nodes_ready": 1,
        "nodes": 2,
        "gpus_free": 3,
        "gpus": 5,
        "gpus_idle_not_free": "",
    }
    assert table.down == [("B", "lost")]
    assert table.classes == ["h100-80g", "l4-24g"]
    assert [r[0] for r in table.shown(of_class=False)] == ["B"]
