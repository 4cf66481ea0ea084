"""Django admin shows nodes and replicas but changes neither: agents, the API and the reconciler do."""

from __future__ import annotations

import pytest

from fleet.models import Node, Replica
from llmgw.core import clock
from tests.fleet.builders import node_add

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(db) -> Node:
    node_add("gpu-a", now=clock.now())
    return Node.objects.get(pk="gpu-a")


def test_the_node_list_keeps_its_columns_and_says_where_to_cordon(admin_client, node):
    response = admin_client.get("/admin/fleet/node/?cordoned__exact=0&q=gpu")

    assert response.status_code == 200
    page = response.content.decode()
    assert "/admin/fleet/node/gpu-a/change/" in page
    assert "cordon, uncordon and drain with llmgw ctl node" in page
    assert "/admin/fleet/node/add/" not in page


def test_a_node_cannot_be_cordoned_added_or_deleted_in_admin(admin_client, node):
    assert admin_client.get("/admin/fleet/node/gpu-a/change/").status_code == 200
    changed = admin_client.post("/admin/fleet/node/gpu-a/change/", {"cordoned": "on"})
    added = admin_client.post("/admin/fleet/node/add/", {"id": "ghost"})
    deleted = admin_client.post("/admin/fleet/node/gpu-a/delete/", {"post": "yes"})

    assert (changed.status_code, added.status_code, deleted.status_code) == (403, 403, 403)
    node.refresh_from_db()
    assert (node.cordoned, node.draining) == (False, False)
    assert list(Node.objects.values_list("id", flat=True)) == ["gpu-a"]
    assert node.gpus.count() > 0


def test_a_replica_cannot_be_changed_or_deleted_in_admin(admin_client):
    now = clock.now()
    Replica.objects.create(
        id="llama-1",
        model="llama",
        profile="gpu",
        profile_fp="abc",
        state_since=now,
        created_at=now,
    )

    assert admin_client.get("/admin/fleet/replica/").status_code == 200
    assert admin_client.get("/admin/fleet/replica/llama-1/change/").status_code == 200
    changed = admin_client.post("/admin/fleet/replica/llama-1/change/", {"state": "stopped"})
    deleted = admin_client.post("/admin/fleet/replica/llama-1/delete/", {"post": "yes"})

    assert (changed.status_code, deleted.status_code) == (403, 403)
    assert Replica.objects.get().state == "pending"


def test_the_node_list_shows_gpus_memory_and_filters_by_gpu_class(admin_client, node):
    page = admin_client.get("/admin/fleet/node/?gpus__gpu_class=h100-80g").content.decode()

    assert "column-gpu_summary" in page and "× h100-80g" in page
    assert "column-memory" in page
    assert (
        admin_client.get("/admin/fleet/node/?gpus__gpu_class=h100-80g").context["cl"].result_count
        == 1
    )


def test_the_replica_list_shows_its_nodes_and_finds_replicas_by_node(admin_client, node):
    now = clock.now()
    replica = Replica.objects.create(
        id="llama-1",
        model="llama",
        profile="gpu",
        profile_fp="abc",
        state_since=now,
        created_at=now,
    )
    replica.shards.create(id="llama-1-0", node=node, http_port=20000, gpu_indices=[0, 1])

    response = admin_client.get("/admin/fleet/replica/?q=gpu-a")

    assert [r.id for r in response.context["cl"].result_list] == ["llama-1"]
    assert "column-nodes" in response.content.decode()


def test_power_budgets_are_listed_in_admin_but_changed_through_the_api(admin_client, api):
    from fleet.models import PowerBudget

    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 16000})
    body = admin_client.get("/admin/fleet/powerbudget/").content.decode()
    assert "r1" in body and "llmgw ctl facility" in body
    budget = PowerBudget.objects.get()
    assert admin_client.post(f"/admin/fleet/powerbudget/{budget.pk}/delete/", {"post": "yes"})
    assert PowerBudget.objects.count() == 1
