"""The REST API's fleet half and what every endpoint shares: auth, actors, errors."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from fleet.models import Node
from llmgw.core import clock
from tenancy.models import AuditEvent
from tests.helpers import detail

from .builders import L4, gpu_model, model_added, node_add

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer llmgw_adm_wrong", "Bearer ", "Basic b3BzOm9wcw==", "Bearer " + "x" * 5000],
)
def test_the_api_refuses_a_request_without_a_valid_admin_token(authorization):
    headers = {"HTTP_AUTHORIZATION": authorization} if authorization else {}

    response = Client().get("/api/v1/nodes", **headers)

    assert response.status_code == 401
    assert "token" in detail(response)


def test_an_agent_token_is_not_an_admin_token(agent_token):
    response = Client().get("/api/v1/nodes", HTTP_AUTHORIZATION=f"Bearer {agent_token}")

    assert response.status_code == 401


def test_a_staff_session_may_use_the_api_and_acts_as_its_user():
    node_add("gpu-a", now=clock.now())
    client = Client()
    client.force_login(
        get_user_model().objects.create_user("alice", is_staff=True, is_superuser=True)
    )

    listed = client.get("/api/v1/nodes")
    cordoned = client.post("/api/v1/nodes/gpu-a/cordon")

    assert listed.status_code == 200
    assert cordoned.status_code == 200
    assert AuditEvent.objects.get().actor == "alice"


def test_a_staff_session_must_send_the_csrf_token_to_change_anything():
    node_add("gpu-a", now=clock.now())
    client = Client(enforce_csrf_checks=True)
    client.force_login(
        get_user_model().objects.create_user("alice", is_staff=True, is_superuser=True)
    )
    client.get("/api/v1/nodes")  # any page sets the cookie; the API reads it like a page

    forged = client.post("/api/v1/nodes/gpu-a/cordon")
    client.cookies["csrftoken"] = "a" * 32
    sent = client.post("/api/v1/nodes/gpu-a/cordon", HTTP_X_CSRFTOKEN="a" * 32)

    assert forged.status_code in (401, 403)
    assert sent.status_code == 200
    assert list(AuditEvent.objects.values_list("actor", flat=True)) == ["alice"]


def test_a_session_of_a_user_who_is_not_staff_is_refused():
    client = Client()
    client.force_login(get_user_model().objects.create_user("bob", is_staff=False))

    assert client.get("/api/v1/nodes").status_code == 401


def test_nodes_lists_each_node_with_its_gpus_and_figures(api):
    node_add("gpu-a", now=clock.now())
    node_add("gpu-b", now=clock.now(), gpus=(L4,), cpu_count=8, labels={"rack": "7"})

    response = api.call("GET", "/nodes")

    assert response.status_code == 200
    nodes = {n["id"]: n for n in response.json()}
    assert sorted(nodes) == ["gpu-a", "gpu-b"]
    b = nodes["gpu-b"]
    assert (b["state"], b["gpu_total"], b["gpu_free"], b["gpu_class"]) == ("ready", 1, 1, "l4-24g")
    assert (b["cpu_count"], b["memory_gb"], b["labels"]) == (8, 256.0, {"rack": "7"})
    assert b["disk"] == {"free_gb": 500.0, "total_gb": 1000.0}


def test_a_node_counts_the_gpus_its_replicas_hold(api, no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=clock.now())
    api.call("POST", "/reconcile")

    node = api.call("GET", "/nodes/gpu-a").json()

    assert (node["gpu_total"], node["gpu_free"]) == (2, 1)
    assert len(node["replicas"]) == 1


def test_an_unknown_node_is_404_with_a_sentence(api):
    response = api.call("GET", "/nodes/gpu-zz")

    assert response.status_code == 404
    assert "gpu-zz" in detail(response)


@pytest.mark.parametrize(
    "action, shown, cordoned, draining",
    [
        ("cordon", "cordoned", True, False),
        ("drain", "draining", True, True),
    ],
)
def test_cordon_and_drain_change_the_node_and_record_who_did_it(
    api, action, shown, cordoned, draining
):
    node_add("gpu-a", now=clock.now())

    response = api.call("POST", f"/nodes/gpu-a/{action}", HTTP_X_LLMGW_ACTOR="carol")

    assert response.status_code == 200
    assert "gpu-a" in detail(response)
    node = Node.objects.get(pk="gpu-a")
    assert (node.cordoned, node.draining) == (cordoned, draining)
    assert api.call("GET", "/nodes/gpu-a").json()["state"] == shown
    event = AuditEvent.objects.get()
    assert (event.actor, event.action, event.target) == ("carol", f"node.{action}", "gpu-a")


def test_uncordon_clears_cordon_and_drain_and_the_actor_defaults_to_the_token_name(api):
    node_add("gpu-a", now=clock.now())
    api.call("POST", "/nodes/gpu-a/drain")

    response = api.call("POST", "/nodes/gpu-a/uncordon")

    assert response.status_code == 200
    node = Node.objects.get(pk="gpu-a")
    assert (node.cordoned, node.draining) == (False, False)
    assert api.call("GET", "/nodes/gpu-a").json()["state"] == "ready"
    assert list(AuditEvent.objects.order_by("at").values_list("actor", "action")) == [
        ("ops", "node.drain"),
        ("ops", "node.uncordon"),
    ]


def test_cordoning_an_unknown_node_is_404_and_records_nothing(api):
    response = api.call("POST", "/nodes/gpu-zz/cordon")

    assert response.status_code == 404
    assert AuditEvent.objects.count() == 0


def test_replicas_can_be_listed_for_one_model(api, no_settle):
    model_added(gpu_model("llama"))
    model_added(gpu_model("mistral"))
    node_add("gpu-a", now=clock.now())
    api.call("POST", "/reconcile")

    every = api.call("GET", "/replicas").json()
    llama = api.call("GET", "/replicas?model=llama").json()

    assert sorted(r["model"] for r in every) == ["llama", "mistral"]
    assert [r["model"] for r in llama] == ["llama"]
    shard = llama[0]["shards"][0]
    assert (llama[0]["state"], llama[0]["profile"], shard["node"]) == ("pending", "gpu", "gpu-a")
    assert len(shard["gpu_indices"]) == 1
    assert llama[0]["outdated"] is False


def test_reconcile_runs_a_pass_and_answers_what_it_did(api, no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=clock.now())

    response = api.call("POST", "/reconcile")

    assert response.status_code == 200
    body = response.json()
    assert (body["ran"], body["settling"], body["starts"], body["stops"]) == (True, False, 1, 0)
    assert any("placed on gpu-a" in line for line in body["events"])


def test_reconcile_says_when_it_is_settling(api):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=clock.now())

    body = api.call("POST", "/reconcile").json()

    assert (body["ran"], body["settling"], body["starts"]) == (True, True, 0)


def test_the_openapi_schema_is_served(api):
    response = api.call("GET", "/openapi.json")

    assert response.status_code == 200
    paths = response.json()["paths"]
    assert {"/api/v1/nodes", "/api/v1/models", "/api/v1/reconcile"} <= set(paths)


def test_a_body_larger_than_needed_is_refused_without_a_500(api):
    model_added(gpu_model("llama"))
    body = json.dumps({"min": 1, "pad": "x" * (2 * 1024 * 1024)})

    for path in ("/models", "/models/llama/scale"):
        response = api.call("POST", path, body)
        assert response.status_code in (400, 413), path
        detail(response)
