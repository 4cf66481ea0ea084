"""A node's drain over real rows (issue 37, 1): stuck for lack of room, it says so and why
in the API (`ctl nodes`), the node page and "Needs attention", and a restart asked
meanwhile says what it waits for; an uncordon ends it, its timeout with it."""

from __future__ import annotations

import re

import pytest

from fleet.models import Event, Replica
from fleet.reconciler.run import reconcile_once
from fleet.selectors.listings import nodes_list
from fleet.services import model_restart, node_set_schedule
from llmgw.cli.ctl_capacity import render_headroom
from llmgw.cli.ctl_models import replicas_cell, serving
from llmgw.cli.ctl_nodes import render_node, render_nodes
from llmgw.cli.ctl_replicas import render_replicas

from .builders import H100, T0, at, gpu_model, model_added, node_add
from .test_reconciler import heard, ready

pytestmark = pytest.mark.django_db

NODES = ("gpu-a", "gpu-b")
WHY = "gpu-b has 0 free h100-80g GPUs of 1, needs 1; gpu-a is draining"


def passes(seconds: float) -> None:
    for node in NODES:
        heard(node, at(seconds))
    reconcile_once(now=at(seconds))


@pytest.fixture
def stuck(no_settle) -> Replica:
    """Two one-GPU nodes, each held by a critical model (nothing to preempt); gpu-a drains,
    and chat, on it, has nowhere to go."""
    model_added(gpu_model("chat", **{"class": "critical"}))
    model_added(gpu_model("vital", **{"class": "critical"}))
    for node in NODES:
        node_add(node, now=T0, gpus=(H100,))
    passes(0)
    for r in Replica.objects.all():
        ready(r, at(1))
    chat = Replica.objects.get(model="chat")
    assert chat.shards.get().node_id == "gpu-a"
    node_set_schedule(node_id="gpu-a", action="drain", actor="ops")
    passes(5)
    chat.refresh_from_db()
    assert chat.retiring and chat.drain_deadline == at(305)
    return chat


def test_a_stuck_drain_says_why_and_when_in_ctl_nodes(stuck, api):
    said = f"stuck: no room for chat's replacement ({WHY}); {stuck.id} stops at 09:05:05 UTC"
    gpu_a, gpu_b = api.call("GET", "/nodes").json()
    assert gpu_a["drain_stuck"] == said and gpu_b["drain_stuck"] == ""
    assert f"  gpu-a: drain {said}" in render_nodes([gpu_a, gpu_b]).splitlines()
    assert [
        " ".join(line.split()) for line in render_node(gpu_a).splitlines() if "drain:" in line
    ] == [f"drain: {said}"]


def test_a_retiring_replica_reads_as_retiring_with_why(stuck, api):
    table = render_replicas(api.call("GET", "/replicas?model=chat").json())
    assert "ready, retiring: its node gpu-a is draining" in table


def test_a_restart_during_a_stuck_drain_says_what_it_waits_for(stuck):
    said = model_restart(name="chat", actor="ops", now=at(10))
    assert said == (
        "model chat restarts once its replicas retiring off a draining node are done; it "
        f"waits for the drain of gpu-a, stuck: no room for chat's replacement ({WHY}); "
        f"{stuck.id} stops at 09:05:05 UTC. Then each replica is replaced, one at a time"
    )


def test_a_stuck_drain_is_on_the_node_page_and_needs_attention(stuck, client, django_user_model):
    client.force_login(
        django_user_model.objects.create_user("ops", password="x", is_staff=True, is_superuser=True)
    )
    node = client.get("/nodes/gpu-a").content.decode()
    assert f"Its drain is stuck: no room for chat&#x27;s replacement ({WHY})" in node
    cluster = client.get("/").content.decode()
    text = re.search(r'<section id="attention".*?</section>', cluster, re.S).group(0)
    assert (
        'the drain of <a href="/nodes/gpu-a">gpu-a</a> is stuck: no room for chat&#x27;s '
        f"replacement ({WHY})"
    ) in text


def test_an_uncordon_ends_the_drain_and_cancels_its_timeout(stuck):
    said = node_set_schedule(node_id="gpu-a", action="uncordon", actor="ops")
    assert said == "node gpu-a uncordoned and its drain ended: what it was moving stays"
    passes(60)
    stuck.refresh_from_db()
    assert (stuck.retiring, stuck.drain_deadline, stuck.reason) == (False, None, "")
    assert nodes_list()[0]["drain_stuck"] == ""
    # Said on the node's page too: its events.
    said = Event.objects.get(kind="drain_ended")
    assert (said.node, said.message) == (
        "gpu-a",
        f"replica {stuck.id} of chat stays: gpu-a no longer drains",
    )
    passes(400)  # past the drain's five minutes
    stuck.refresh_from_db()
    assert stuck.state == "ready"


def test_ctl_models_and_headroom_count_a_retiring_replica_alike(stuck, api):
    chat = api.call("GET", "/models/chat").json()
    room = api.call("GET", "/models/chat/headroom?limit=10").json()
    assert (chat["ready"], chat["retiring"], chat["desired"]) == (0, 1, 1)
    assert (room["current"], room["retiring"]) == (0, 1)
    assert replicas_cell(chat) == "0/1 +1 retiring"
    assert render_headroom(room, 10).startswith("chat: 0 running, 1 retiring; room for 0 more")
    # Not "ready": it is short of a replica, and says why.
    assert (chat["status"], chat["reason"]) == ("unplaceable", WHY)
    assert serving(chat) == "yes"
