"""Preemption, quotas, measurements and load through the reconciler's shell, over real rows."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
from django.db import DatabaseError

from catalog.models import Measurement, Model
from fleet.domain.readings import Reading
from fleet.models import ModelState, Node, Replica
from fleet.nodes.reports import shard_status_record
from fleet.protocol import ShardStatus
from fleet.reconciler.run import MEASUREMENTS, POLICY, reconcile_once
from fleet.selectors.inputs import Revised
from llmgw.core import clock
from tenancy.models import CapacityQuota, Organization, Team

from .builders import T0, at, gpu_model, model_added, node_add
from .test_reconciler import heard, ready

pytestmark = pytest.mark.django_db

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559}


def stopped(replica: Replica, now: datetime) -> None:
    for shard in replica.shards.all():
        shard_status_record(
            node_id=shard.node_id,
            msg=ShardStatus(type="shard_status", shard_id=shard.id, state="stopped"),
            now=now,
        )


def test_a_critical_model_takes_a_standard_replicas_gpu_and_the_room_waits_for_it(no_settle):
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    for r in Replica.objects.all():
        ready(r, at(10))
    heard("gpu-a", at(400))
    model_added(gpu_model("vital", **{"class": "critical"}))

    result = reconcile_once(now=at(400))

    victim = Replica.objects.get(state="draining")
    freed = victim.shards.get().gpu_indices
    assert (victim.model, victim.preempted_for) == ("chat", "vital")
    assert victim.drain_deadline == at(430)
    chat = ModelState.objects.get(pk="chat")
    assert (chat.held_for, chat.preempted, chat.held_until) == ("vital", 1, at(700))
    vital = ModelState.objects.get(pk="vital")
    assert [r["victims"] for r in vital.reserved] == [[victim.pk]]
    assert any("preempted for vital (critical)" in line for line in result["events"])

    heard("gpu-a", at(431))
    events = reconcile_once(now=at(431))["events"]
    assert any(
        f"stopping preempted replica {victim.pk}: it gave room to vital" in e for e in events
    )
    stopped(Replica.objects.get(pk=victim.pk), at(432))
    heard("gpu-a", at(435))
    reconcile_once(now=at(435))

    placed = Replica.objects.get(model="vital")
    assert placed.shards.get().gpu_indices == freed
    assert ModelState.objects.get(pk="vital").reserved == []
    assert Replica.objects.filter(model="chat").count() == 1


def test_a_quota_limit_refuses_a_replica_and_says_which_scope(no_settle):
    acme = Organization.objects.create(name="Acme")
    team = Team.objects.create(org=acme, name="ml")
    CapacityQuota.objects.create(scope=f"org:{acme.pk}", limit_gpus=1)
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 2}, owner=f"team:{team.pk}"))

    reconcile_once(now=T0)

    assert Replica.objects.count() == 1
    state = ModelState.objects.get(pk="chat")
    assert state.unplaceable
    assert state.explanation[0]["reasons"] == ["org:Acme is at its capacity limit (2 GPUs of 1)"]


def test_quotas_are_read_again_only_when_their_revision_moves_and_kept_when_the_store_fails(
    caplog,
):
    revision, reads, down = [1], [], [False]

    def ask():
        if down[0]:
            raise DatabaseError("the database went away")
        return revision[0]

    def read():
        reads.append(revision[0])
        return f"policy {revision[0]}"

    cached = Revised("capacity quotas", ask, read, "empty")
    assert cached.get() == "policy 1"
    assert cached.get() == "policy 1" and reads == [1], "unchanged: the store is not asked"
    revision[0] = 2
    assert cached.get() == "policy 2", "changed: read at once, however soon"
    down[0] = True
    revision[0] = 3
    with caplog.at_level(logging.WARNING, logger="llmgw.reconciler"):
        assert cached.get() == "policy 2", "a failing store keeps the last good policy"
        assert cached.get() == "policy 2"
    assert reads == [1, 2]
    # Said once, with its cause and no traceback: the pass's own outage line has that.
    [said] = [r for r in caplog.records if "could not read" in r.getMessage()]
    assert said.getMessage() == (
        "could not read capacity quotas (the database went away); keeping the last ones"
    )
    assert said.exc_info is None
    down[0] = False
    assert cached.get() == "policy 3" and reads == [1, 2, 3]
    fresh = Revised("capacity quotas", lambda: (_ for _ in ()).throw(DatabaseError()), read, "e")
    assert fresh.get() == "e", "never read: nothing governed rather than a failed pass"


def test_every_write_the_policy_is_built_from_moves_its_revision(admin_client):
    from tenancy.selectors import quota_policy_revision
    from tenancy.services import org_create, project_create, quota_clear, quota_set, team_create

    seen = [quota_policy_revision()]

    def moved() -> bool:
        seen.append(quota_policy_revision())
        return seen[-1] > seen[-2]

    acme = org_create(name="Acme", actor="t")
    assert moved()
    team = team_create(org="Acme", name="ml", actor="t")
    assert moved()
    project = project_create(team="Acme/ml", name="training", actor="t")
    assert moved()
    quota_set(scope="team:Acme/ml", guarantee={"gpus": 2}, limit=None, actor="t")
    assert moved()
    renamed = admin_client.post(f"/admin/tenancy/team/{team.pk}/change/", {"name": "research"})
    assert renamed.status_code == 302 and moved()
    quota_clear(scope="team:Acme/research", actor="t")
    assert moved()
    for kind, pk in (("project", project.pk), ("team", team.pk), ("organization", acme.pk)):
        deleted = admin_client.post(f"/admin/tenancy/{kind}/{pk}/delete/", {"post": "yes"})
        assert deleted.status_code == 302 and moved(), kind
    assert not Organization.objects.exists()


def test_a_quota_set_acts_at_the_next_pass_and_the_store_is_asked_only_then(no_settle):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tenancy.services import quota_set

    acme = Organization.objects.create(name="Acme")
    team = Team.objects.create(org=acme, name="ml")
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 2}, owner=f"team:{team.pk}"))
    reconcile_once(now=T0)
    assert Replica.objects.count() == 2
    heard("gpu-a", at(1))
    with CaptureQueriesContext(connection) as unchanged:
        reconcile_once(now=at(1))
    assert not [q for q in unchanged.captured_queries if "tenancy_capacityquota" in q["sql"]]

    # A limit lowered at once below what runs: the very next pass refuses one more.
    quota_set(scope="org:Acme", guarantee=None, limit={"gpus": 1}, actor="ops")
    Replica.objects.filter(pk=Replica.objects.order_by("created_at").last().pk).delete()
    heard("gpu-a", at(2))
    reconcile_once(now=at(2))

    assert Replica.objects.count() == 1
    state = ModelState.objects.get(pk="chat")
    assert state.explanation[0]["reasons"] == ["org:Acme is at its capacity limit (2 GPUs of 1)"]


def test_a_measurement_saved_acts_at_the_next_pass(no_settle, api):
    node_add("gpu-a", now=T0, gpus=(H100, H100, H100, H100))
    model_added(
        {
            "name": "chat",
            "source": "hf://acme/chat",
            "scaling": {"min": 0, "max": 0},
            "profiles": [
                {"name": "tp2", "engine": "sim", "gpu_class": "h100-80g", "tp": 2},
                {"name": "tp1", "engine": "sim", "gpu_class": "h100-80g"},
            ],
        }
    )
    reconcile_once(now=T0)  # measurements read: none
    for profile, tps in (("tp2", 300.0), ("tp1", 200.0)):
        response = api.call(
            "PUT",
            "/models/chat/capacity",
            {"profile": profile, "max_concurrency": 8, "tok_per_sec": tps},
        )
        assert response.status_code == 200, response.content
    assert api.call("POST", "/models/chat/scale", {"min": 1, "max": 1}).status_code == 200
    heard("gpu-a", at(1))
    reconcile_once(now=at(1))

    assert Replica.objects.get().profile == "tp1", "200 tokens/s per GPU beats 150"


def test_the_reconciler_takes_engine_load_and_scales_up_held_busy(no_settle, settings):
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 1, "max": 2}))
    reconcile_once(now=T0)
    first = Replica.objects.get()
    ready(first, at(1))
    shard = first.shards.get()
    Node.objects.filter(pk="gpu-a").update(
        load={"engines": {shard.id: {"running": 4, "waiting": 3}}}
    )
    for second in (5, 35, 66):
        heard("gpu-a", at(second))
        Node.objects.filter(pk="gpu-a").update(
            load={"engines": {shard.id: {"running": 4, "waiting": 3}}}
        )
        reconcile_once(now=at(second))

    assert Replica.objects.count() == 2
    assert ModelState.objects.get(pk="chat").extra == 1


def test_kv_caches_full_past_the_models_ceiling_scale_it_up_with_nothing_waiting(
    no_settle, settings
):
    from fleet.models import Event
    from fleet.selectors import listings
    from fleet.selectors.routing import replica_readings
    from fleet.selectors.state import replica_views

    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 1, "max": 2, "kv_ceiling": 0.8}))
    reconcile_once(now=T0)
    first = Replica.objects.get()
    ready(first, at(1))
    shard = first.shards.get()
    said = {"running": 4, "waiting": 0, "kv_cache": 0.93, "prefix_hit_rate": 0.5}
    for second in (5, 35, 66):
        heard("gpu-a", at(second))
        Node.objects.filter(pk="gpu-a").update(load={"engines": {shard.id: said}})
        reconcile_once(now=at(second))

    assert replica_readings(replica_views())[first.id] == Reading(4, 0, 0.93, 0.5)
    assert replica_readings()[first.id] == Reading(4, 0, 0.93, 0.5)  # the gateway's: every one
    [listed] = [r for r in listings.replicas_list(model="chat") if r["id"] == first.id]
    assert listed["engine"] == said
    assert ModelState.objects.get(pk="chat").extra == 1
    assert Event.objects.filter(
        message__contains="its engines' KV caches 93% full on average, above its ceiling of 80%"
    ).exists()


def test_a_replica_whose_engine_said_nothing_has_no_reading(no_settle):
    from fleet.selectors.routing import replica_readings

    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat"))
    reconcile_once(now=T0)
    ready(Replica.objects.get(), at(1))
    assert replica_readings() == {}


def test_requests_waiting_at_the_gateway_scale_a_model_up_too(no_settle, settings):
    from dataclasses import replace

    from llmgw.gateway.load import BOARD

    settings.LLMGW = replace(settings.LLMGW, redis_url=None)  # the board of this process

    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 1, "max": 2}))
    reconcile_once(now=T0)
    ready(Replica.objects.get(), at(1))
    # No engine said anything; the gateway has 2 running and 3 waiting.
    BOARD.running["chat"], BOARD.waiting["chat"] = 2, 3
    for second in (5, 35, 66):
        heard("gpu-a", at(second))
        reconcile_once(now=at(second))

    assert ModelState.objects.get(pk="chat").extra == 1
    assert Replica.objects.count() == 2


def test_a_model_the_gateway_has_seen_idle_is_quiet_and_gives_back_its_extra(no_settle, settings):
    from dataclasses import replace

    from llmgw.gateway.load import BOARD

    settings.LLMGW = replace(
        settings.LLMGW,
        redis_url=None,  # the board of this process
        timings=replace(settings.LLMGW.timings, scale_down_after=60),
    )
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 1, "max": 2}))
    ModelState.objects.create(model="chat", extra=1)
    reconcile_once(now=T0)
    for r in Replica.objects.all():
        ready(r, at(1))
    BOARD.running["chat"], BOARD.waiting["chat"] = 0, 0
    for second in (5, 40, 70):
        heard("gpu-a", at(second))
        reconcile_once(now=at(second))

    assert ModelState.objects.get(pk="chat").extra == 0


def test_a_measured_profile_serving_more_per_gpu_is_placed_first(no_settle):
    node_add("gpu-a", now=T0, gpus=(H100, H100, H100, H100))
    model_added(
        {
            "name": "chat",
            "source": "hf://acme/chat",
            "profiles": [
                {"name": "tp2", "engine": "sim", "gpu_class": "h100-80g", "tp": 2},
                {"name": "tp1", "engine": "sim", "gpu_class": "h100-80g"},
            ],
        }
    )
    chat = Model.objects.get(name="chat")
    for profile, tps in (("tp2", 300.0), ("tp1", 200.0)):
        Measurement.objects.create(
            model=chat, profile=profile, max_concurrency=8, tok_per_sec=tps, measured_at=T0
        )
    MEASUREMENTS.clear()
    POLICY.clear()

    reconcile_once(now=T0)

    assert Replica.objects.get().profile == "tp1", "200 tokens/s per GPU beats 150"


def test_a_model_shows_whom_it_gave_room_to_only_while_it_is_held(no_settle, api):
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    for r in Replica.objects.all():
        ready(r, at(10))
    heard("gpu-a", at(400))
    model_added(gpu_model("vital", **{"class": "critical"}))
    reconcile_once(now=at(400))
    ModelState.objects.filter(pk="chat").update(held_until=clock.now() + timedelta(minutes=5))

    held = api.call("GET", "/models/chat").json()
    assert (held["held_for"], held["preempted"]) == ("vital", 1)
    assert {m["name"]: m["held_for"] for m in api.call("GET", "/models").json()} == {
        "chat": "vital",
        "vital": "",
    }

    # The model it gave way to has what it wants: the hold is over.
    ModelState.objects.filter(pk="vital").update(desired=0)
    assert api.call("GET", "/models/chat").json()["held_for"] == ""


def test_a_hold_ends_when_the_model_it_gave_room_to_is_removed(no_settle, api):
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    for r in Replica.objects.all():
        ready(r, at(10))
    heard("gpu-a", at(400))
    model_added(gpu_model("vital", **{"class": "critical"}))
    reconcile_once(now=at(400))
    ModelState.objects.filter(pk="chat").update(held_until=clock.now() + timedelta(minutes=5))
    assert api.call("GET", "/models/chat").json()["held_for"] == "vital"

    assert api.call("DELETE", "/models/vital").status_code == 200

    # Every view stops naming it at once, and the next pass ends the hold itself.
    assert api.call("GET", "/models/chat").json()["held_for"] == ""
    assert {m["name"]: m["held_for"] for m in api.call("GET", "/models").json()} == {"chat": ""}
    heard("gpu-a", at(401))
    reconcile_once(now=at(401))
    chat = ModelState.objects.get(pk="chat")
    assert (chat.held_for, chat.held_until, chat.preempted) == ("", None, 1)


def test_decisions_are_logged_once_each_as_structured_lines(no_settle, caplog):
    import json
    import logging

    from llmgw.core.logs import JsonFormatter

    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    for r in Replica.objects.all():
        ready(r, at(10))
    heard("gpu-a", at(400))
    model_added(gpu_model("vital", **{"class": "critical"}))

    with caplog.at_level(logging.INFO, logger="llmgw.reconciler"):
        reconcile_once(now=at(400))

    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    preemptions = [line for line in lines if line.get("event") == "preemption"]
    assert len(preemptions) == 1
    assert preemptions[0]["model"] == "chat"
    assert preemptions[0]["preempted_for"] == "vital"
    assert preemptions[0]["preempted_for_class"] == "critical"
    assert "preempted for vital (critical)" in preemptions[0]["message"]
