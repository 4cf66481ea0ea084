"""Engines nodes install from the mirror, through the control plane: placement offers a node
lacking the engine when the mirror holds a build for its platform, start_shard carries the
build, what agents say of their installs is kept, explained and refused on."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import timedelta

import pytest

from catalog.selectors.listings import model_explain
from fleet.models import ModelState, Node, Replica, Shard
from fleet.nodes.heard import node_engines_record
from fleet.nodes.registration import node_register
from fleet.protocol import BadMessage, EngineInstallReport, Register, parse
from fleet.reconciler import run as reconciler
from fleet.reconciler.run import reconcile_once
from mirror.builds import engine_build_add
from tests.fleet.builders import T0, agent_credential

from .builders import cpu_model, model_added, register_frame

pytestmark = pytest.mark.django_db

BINARY = b"#!/bin/sh\necho 'version: 6000'\n"


@pytest.fixture(autouse=True)
def mirror_dir(settings, tmp_path):
    mirror = replace(settings.LLMGW.mirror, dir=tmp_path / "mirror")
    settings.LLMGW = replace(settings.LLMGW, mirror=mirror)


@pytest.fixture
def sent(monkeypatch):
    commands = []
    monkeypatch.setattr(reconciler, "dispatch", commands.extend)
    return commands


def a_build(platform="linux-x86_64", version="b6000"):
    build, _ = engine_build_add(
        data=io.BytesIO(BINARY),
        engine="llamacpp",
        version=version,
        platform=platform,
        actor="ops",
        now=T0,
    )
    return build


def a_node(node_id="cpu-a", *, engines=None, installs=(), platform="linux-x86_64"):
    frame = {
        **register_frame(node_id, gpus=()),
        "engines": engines or {"sim": "0.11.0"},
        "platform": platform,
        "engine_installs": list(installs),
    }
    node_register(
        msg=Register.model_validate(frame),
        session=f"s-{node_id}",
        now=T0,
        credential=agent_credential(node_id),
        seen_addr="10.0.0.7",
    )


def a_llamacpp_model(name="tiny"):
    data = cpu_model(name)
    data["profiles"][0]["engine"] = "llamacpp"
    return model_added(data)


def starts(sent):
    return [c.payload for c in sent if c.payload["type"] == "start_shard"]


def test_a_node_lacking_the_engine_is_refused_while_the_mirror_holds_no_build(no_settle):
    a_llamacpp_model()
    a_node()
    reconcile_once(now=T0)
    assert Replica.objects.count() == 0
    reasons = ModelState.objects.get(pk="tiny").explanation[0]["reasons"]
    assert reasons == ["node cpu-a has no llamacpp engine installed"]


def test_with_a_build_for_its_platform_it_is_placed_and_start_shard_carries_the_build(
    no_settle, sent, django_capture_on_commit_callbacks
):
    build = a_build()
    a_build(platform="linux-aarch64", version="b6001")
    a_llamacpp_model()
    a_node()
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_once(now=T0)

    (start,) = starts(sent)
    assert start["engine_build"] == {
        "engine": "llamacpp",
        "version": "b6000",
        "sha256": build.sha256,
        "size": len(BINARY),
        "url": f"/api/v1/mirror/files/{build.sha256}",
    }


def test_a_node_that_has_the_engine_is_sent_no_build(
    no_settle, sent, django_capture_on_commit_callbacks
):
    a_build()
    a_llamacpp_model()
    a_node(engines={"sim": "0.11.0", "llamacpp": "6000"})
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_once(now=T0)
    (start,) = starts(sent)
    assert "engine_build" not in start


def test_a_node_of_another_platform_or_an_agent_that_installs_nothing_is_refused(no_settle):
    a_build()
    a_llamacpp_model()
    a_node("arm", platform="linux-aarch64")
    a_node("old", platform="")
    reconcile_once(now=T0)
    assert Replica.objects.count() == 0


def test_a_failed_install_refuses_the_node_with_its_sentence(no_settle):
    a_build()
    a_llamacpp_model()
    failed = {"engine": "llamacpp", "version": "b6000", "state": "failed", "detail": "no room."}
    a_node(installs=[failed])
    reconcile_once(now=T0)
    reasons = ModelState.objects.get(pk="tiny").explanation[0]["reasons"]
    assert reasons == ["node cpu-a could not install llamacpp b6000: no room."]


def test_explain_says_which_node_is_installing_the_engine_and_how_far(no_settle):
    a_build()
    a_llamacpp_model()
    a_node()
    reconcile_once(now=T0)
    replica = Replica.objects.get()
    Shard.objects.filter(replica=replica).update(
        state="fetching", progress_done=500_000, progress_total=2_000_000
    )
    node_engines_record(
        node_id="cpu-a",
        engines=None,
        installs=[EngineInstallReport(engine="llamacpp", version="b6000", state="installing")],
        now=T0 + timedelta(seconds=5),
    )
    assert model_explain(name="tiny")["installing"] == [
        f"node cpu-a is installing llamacpp b6000 for replica {replica.id} (0.5 of 2.0 MB)"
    ]


def test_an_install_reported_in_a_heartbeat_makes_the_engine_the_nodes(no_settle):
    a_node()
    later = T0 + timedelta(seconds=30)
    node_engines_record(
        node_id="cpu-a",
        engines={"sim": "0.11.0", "llamacpp": "6000"},
        installs=[EngineInstallReport(engine="llamacpp", version="b6000", state="installed")],
        now=later,
    )
    node = Node.objects.get()
    assert node.engines == {"sim": "0.11.0", "llamacpp": "6000"}
    assert node.engine_installs == [
        {"engine": "llamacpp", "version": "b6000", "state": "installed", "detail": ""}
    ]
    # Moved, so the reconciler's cache of what nodes registered reads it again.
    assert node.spec_at == later


def test_a_heartbeat_with_installs_is_validated():
    hb = parse(
        '{"type": "heartbeat", "seq": 1, "engine_installs": '
        '[{"engine": "llamacpp", "version": "b6000", "state": "failed", "detail": "no room."}]}'
    )
    assert hb.engine_installs[0].detail == "no room."
    assert parse('{"type": "heartbeat", "seq": 1}').engine_installs is None
    with pytest.raises(BadMessage, match="engine_installs.0.state"):
        parse(
            '{"type": "heartbeat", "seq": 1, "engine_installs": '
            '[{"engine": "llamacpp", "version": "b6000", "state": "done"}]}'
        )
    with pytest.raises(BadMessage, match="platform"):
        parse('{"type": "register", "node_id": "n1", "platform": "Linux x86_64"}')


def test_the_node_page_shows_its_engines_and_where_each_install_stands(client):
    from django.contrib.auth import get_user_model

    failed = {"engine": "llamacpp", "version": "b6000", "state": "failed", "detail": "no room."}
    a_node(installs=[failed])
    client.force_login(
        get_user_model().objects.create_user("alice", is_staff=True, is_superuser=True)
    )
    page = client.get("/nodes/cpu-a").content.decode()
    assert '<span class="badge" data-engine="sim">sim 0.11.0</span>' in page
    assert "llamacpp b6000 failed: no room.</span>" in page
