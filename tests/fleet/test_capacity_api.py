"""Headroom, target and the preemption dry run over REST: answers that change nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from catalog.services import measurement_save
from fleet.models import ModelState, Replica
from fleet.reconciler.run import reconcile_once
from llmgw.core import clock
from tenancy.models import CapacityQuota, Organization, Team
from tests.helpers import detail

from .builders import cpu_model, model_added, node_add
from .test_reconciler import ready

pytestmark = pytest.mark.django_db

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559}
EIGHT = (H100,) * 8


def tp8(name: str, **extra) -> dict:
    profile = {"name": "tp8", "engine": "sim", "gpu_class": "h100-80g", "tp": 8}
    return {"name": name, "source": f"hf://acme/{name}", "profiles": [profile], **extra}


def measure(model: str, profile: str, tok_per_sec: float, concurrency: int = 16) -> None:
    """What `ctl bench --save` stores, through its service (which moves the revision)."""
    measurement_save(
        model=model,
        profile=profile,
        max_concurrency=concurrency,
        tok_per_sec=tok_per_sec,
        actor="bench",
        now=clock.now(),
    )


def test_a_target_is_sized_from_the_measurement_and_the_room(api):
    for n in ("1", "2", "3"):
        node_add(n, now=clock.now(), gpus=EIGHT)
    model_added(tp8("llama", scaling={"min": 0, "max": 0}))

    response = api.call("GET", "/models/llama/target?tokens_per_sec=1000")
    assert response.status_code == 400
    assert "ctl bench llama --save" in detail(response)

    measure("llama", "tp8", 500)
    view = api.call("GET", "/models/llama/target?tokens_per_sec=1200").json()
    assert (view["needed"], view["per_replica_tok_per_sec"], view["profile"]) == (3, 500, "tp8")
    assert (view["more"], view["fits"], view["blocked"]) == (3, True, [])

    view = api.call("GET", "/models/llama/target?tokens_per_sec=2000").json()
    assert (view["needed"], view["fits"], view["room"]) == (4, False, 3)
    assert view["blocked"], "a fourth does not fit on three nodes, and it should say why"


def test_headroom_counts_what_is_there_and_says_what_one_more_serves(api, no_settle):
    node_add("1", now=clock.now(), gpus=EIGHT)
    node_add("2", now=clock.now(), gpus=EIGHT)
    model_added(tp8("llama"))
    reconcile_once(now=clock.now())
    measure("llama", "tp8", 450)

    view = api.call("GET", "/models/llama/headroom?limit=5").json()

    assert (view["current"], view["more"], view["limited"]) == (1, 1, False)
    assert view["tok_per_sec"] == 450
    assert len(view["nodes"]) == 1
    assert view["blocked"], "the edge is explained"
    assert Replica.objects.count() == 1, "headroom placed nothing"


def test_reserved_cores_bound_the_room_as_memory_does(api, no_settle):
    node_add("a", now=clock.now(), gpus=(), cpu_count=8, memory_total_mb=64 * 1024)
    model_added(cpu_model("coder", cores=3, memory_gb=6))
    reconcile_once(now=clock.now())
    shard = Replica.objects.get().shards.get()
    assert (shard.cpu_cores, shard.memory_gb) == (3, 6)

    view = api.call("GET", "/models/coder/headroom?limit=10").json()

    # Memory would allow nine more; cores allow one: 8 - 3 = 5, then 2.
    assert view["more"] == 1
    assert "node a has 8 CPUs with 2 free, needs 3" in view["blocked"]


def test_headroom_stops_at_a_quota_limit_as_at_a_full_node(api, no_settle):
    acme = Organization.objects.create(name="Acme")
    team = Team.objects.create(org=acme, name="web")
    CapacityQuota.objects.create(scope=f"org:{acme.pk}", limit_gpus=8)
    node_add("1", now=clock.now(), gpus=EIGHT)
    node_add("2", now=clock.now(), gpus=EIGHT)
    model_added(tp8("web-chat", owner=f"team:{team.pk}"))
    reconcile_once(now=clock.now())

    view = api.call("GET", "/models/web-chat/headroom?limit=5").json()

    assert (view["more"], view["blocked"]) == (
        0,
        ["org:Acme is at its capacity limit (16 GPUs of 8)"],
    )


def test_the_preemption_dry_run_names_victims_and_protections_and_changes_nothing(api, no_settle):
    now = clock.now()
    node_add("1", now=now, gpus=EIGHT)
    model_added(tp8("chat"))
    reconcile_once(now=now)
    chat = Replica.objects.get()
    ready(chat, now - timedelta(minutes=1))
    model_added(tp8("vital", **{"class": "critical"}))

    young = api.call("GET", "/models/vital/preemption").json()
    assert young["victims"] == []
    assert young["protected"][0]["why"].startswith(f"candidate {chat.pk} is protected until")

    Replica.objects.filter(pk=chat.pk).update(ready_at=now - timedelta(hours=1))
    view = api.call("GET", "/models/vital/preemption").json()

    assert (view["class"], view["fits"]) == ("critical", False)
    assert view["victims"] == [
        {
            "replica": chat.pk,
            "model": "chat",
            "class": "standard",
            "node": "1",
            "why": "part of a lower class's minimum",
        }
    ]
    assert "would stop 1 replica" in view["summary"]
    assert Replica.objects.get().state == "ready", "a dry run stopped something"
    assert not ModelState.objects.filter(pk="chat", preempted__gt=0).exists()


@pytest.mark.parametrize(
    "path",
    [
        "/models/llama/headroom?limit=0",
        "/models/llama/headroom?limit=-3",
        "/models/llama/headroom?limit=many",
        "/models/llama/headroom?limit=100000",
        "/models/llama/target",
        "/models/llama/target?tokens_per_sec=-5",
        "/models/llama/target?tokens_per_sec=nan",
        "/models/llama/target?tokens_per_sec=inf",
        "/models/llama/target?tokens_per_sec=lots",
    ],
)
def test_bad_figures_are_refused_with_a_sentence(api, path):
    model_added(tp8("llama"))

    response = api.call("GET", path)

    assert response.status_code == 400
    assert detail(response)


@pytest.mark.parametrize("what", ["headroom", "target?tokens_per_sec=10", "preemption"])
def test_an_unknown_model_is_a_404(api, what):
    response = api.call("GET", f"/models/nope/{what}")

    assert response.status_code == 404
    assert "nope" in detail(response)


def test_a_model_shows_what_its_replicas_use_beside_what_they_reserve(api, no_settle):
    node_add("a", now=clock.now(), gpus=(), cpu_count=16, memory_total_mb=64 * 1024)
    model_added(cpu_model("coder", cores=2, memory_gb=6))
    reconcile_once(now=clock.now())
    replica = Replica.objects.get()
    ready(replica, clock.now())
    shard = replica.shards.get()
    from fleet.models import Node

    Node.objects.filter(pk="a").update(
        load={"shards": {shard.id: {"rss_bytes": int(8.2 * 1024**3), "cpu_cores": 1.9}}}
    )

    view = api.call("GET", "/models/coder").json()

    assert view["measured_memory_gb"] == 8.2
    assert any("use 8.2 GB but reserve 6 GB" in w for w in view["warnings"])


def test_a_model_nobody_measured_shows_no_use_and_a_cpu_model_a_suggestion(api):
    node_add("a", now=clock.now(), gpus=(), cpu_count=16, memory_total_mb=64 * 1024)
    node_add("b", now=clock.now(), gpus=(), cpu_count=8, memory_total_mb=8 * 1024)
    model_added(cpu_model("coder", cores=2, memory_gb=12))
    model_added(tp8("llama"))

    views = {v["name"]: v for v in api.call("GET", "/models").json()}

    assert views["coder"]["measured_memory_gb"] is None
    assert views["coder"]["suggested_cores"] == 8, "half of a's 16: b is too small"
    assert views["llama"]["suggested_cores"] is None


def test_a_quota_set_through_the_api_reaches_the_dry_run_and_the_next_pass_at_once(api, no_settle):
    # web's chat holds the only node; ml's train is of the same class, so by class alone
    # nothing may be stopped for it. Once ml is guaranteed the node, what web holds is on
    # loan: the dry run says so at once, and the very next pass takes it back.
    acme = Organization.objects.create(name="Acme")
    Team.objects.create(org=acme, name="web")
    Team.objects.create(org=acme, name="ml")
    now = clock.now()
    node_add("1", now=now, gpus=EIGHT)
    model_added(tp8("chat", owner="team:Acme/web"))
    reconcile_once(now=now)
    chat = Replica.objects.get()
    ready(chat, now - timedelta(hours=1))
    model_added(tp8("train", owner="team:Acme/ml"))
    reconcile_once(now=now)  # the pass reads the policy: no quota yet
    before = api.call("GET", "/models/train/preemption").json()
    assert before["victims"] == []
    assert any(
        "is standard like train, and at its own minimum" in p["why"] for p in before["protected"]
    )

    put = api.call("PUT", "/quotas", {"scope": "team:Acme/ml", "guarantee": {"gpus": 8}})
    assert put.status_code == 200, put.content

    view = api.call("GET", "/models/train/preemption").json()
    assert [(v["replica"], v["why"]) for v in view["victims"]] == [
        (chat.pk, "borrowed beyond its owner's guarantee")
    ]
    reconcile_once(now=now)
    assert Replica.objects.get(pk=chat.pk).preempted_for == "train"

    # Cleared: the dry run answers with no guarantee again, straight away.
    assert api.call("DELETE", "/quotas/team:Acme%2Fml").status_code == 200
    Replica.objects.filter(pk=chat.pk).update(state="ready", preempted_for="", drain_deadline=None)
    ModelState.objects.filter(pk="train").update(reserved=[], reserved_until=None)
    assert api.call("GET", "/models/train/preemption").json()["victims"] == []
