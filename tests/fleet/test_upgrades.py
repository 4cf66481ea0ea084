"""Telling a node to upgrade, and what its agent reports (issue 14, item 2); the roll with
real agent processes is tests/e2e/test_upgrade.py."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest

from fleet import events, upgrades
from fleet.agent.upgrade import UpgradeError, Upgrader, wheel_name
from fleet.models import EventRecord, Node
from llmgw.core.errors import Invalid, NotFound
from mirror.engines import engine_build_add
from tests.mirror.wheels import wheel

from .builders import node_add

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def release(settings, tmp_path):
    from dataclasses import replace

    settings.LLMGW = replace(settings.LLMGW, mirror=replace(settings.LLMGW.mirror, dir=tmp_path))
    path = wheel(tmp_path / "upload", "9.9.9")
    build, _ = engine_build_add(
        data=io.BytesIO(path.read_bytes()), filename=path.name, engine="llmgw",
        version="9.9.9", actor="t", now=T0,
    )  # fmt: skip
    return build


def test_a_node_is_told_the_release_and_it_is_said(
    release, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(upgrades, "dispatch", sent.extend)
    node_add("gpu-a", now=T0)
    with django_capture_on_commit_callbacks(execute=True):
        said = upgrades.node_upgrade(node_id="gpu-a", version="9.9.9", actor="ops", now=T0)

    assert said.startswith("node gpu-a told to upgrade from llmgw ")
    assert said.endswith(" to 9.9.9 by ops")
    [command] = sent
    assert command.node_id == "gpu-a"
    assert command.payload == {
        "type": "upgrade",
        "version": "9.9.9",
        "sha256": release.sha256,
        "size": release.size,
    }
    assert EventRecord.objects.get(kind="upgrade").message == said
    assert release.platform == "python-any"


def test_what_cannot_be_upgraded_is_told_and_nothing_is_sent(release, monkeypatch):
    sent = []
    monkeypatch.setattr(upgrades, "dispatch", sent.extend)
    node_add("gpu-a", now=T0)
    with pytest.raises(NotFound, match="The mirror holds no llmgw 1.0.0: add its wheel"):
        upgrades.node_upgrade(node_id="gpu-a", version="1.0.0", actor="ops", now=T0)
    with pytest.raises(NotFound, match="There is no node nowhere"):
        upgrades.node_upgrade(node_id="nowhere", version="9.9.9", actor="ops", now=T0)
    Node.objects.filter(pk="gpu-a").update(state=Node.UNREACHABLE)
    with pytest.raises(Invalid, match="node gpu-a is unreachable: its agent cannot be told"):
        upgrades.node_upgrade(node_id="gpu-a", version="9.9.9", actor="ops", now=T0)
    Node.objects.filter(pk="gpu-a").update(state=Node.READY, agent_version="9.9.9")
    said = upgrades.node_upgrade(node_id="gpu-a", version="9.9.9", actor="ops", now=T0)
    assert said == "node gpu-a already runs llmgw 9.9.9"
    assert sent == []


def test_an_agents_report_of_its_upgrade_is_an_event():
    failed = events.parse(
        '{"type": "upgrade_status", "version": "9.9.9", "state": "failed", "detail": "pip: no space"}'
    )
    upgrades.upgrade_reported(node_id="gpu-a", msg=failed, now=T0)
    row = EventRecord.objects.get()
    assert (row.kind, row.node) == ("upgrade_failed", "gpu-a")
    assert row.message == "node gpu-a could not upgrade to llmgw 9.9.9: pip: no space"


@pytest.mark.parametrize(
    "frame",
    [
        '{"type": "upgrade_status", "version": "9.9.9", "state": "done"}',
        '{"type": "upgrade_status", "state": "failed"}',
        '{"type": "upgrade_status", "version": "", "state": "failed"}',
        '{"type": "upgrade_status", "version": "9.9.9", "state": "failed", "detail": "'
        + "x" * 2001
        + '"}',
    ],
)
def test_a_report_that_is_not_one_is_refused(frame):
    with pytest.raises(events.BadMessage):
        events.parse(frame)


@pytest.mark.parametrize(
    "msg, says",
    [
        ({"version": "9.9.9; rm -rf", "sha256": "a" * 64, "size": 1}, "is not a release version"),
        ({"version": "9.9.9", "sha256": "xyz", "size": 1}, "sha256 is not 64"),
        ({"version": "9.9.9", "sha256": "a" * 64, "size": 0}, "size is not a number of bytes"),
        ({"version": "9.9.9", "sha256": "a" * 64, "size": True}, "size is not a number of bytes"),
    ],
)
async def test_an_agent_refuses_an_upgrade_it_cannot_trust(tmp_path, msg, says):
    upgrader = Upgrader(tmp_path, server="http://127.0.0.1:9", bearer=lambda: "t")
    with pytest.raises(UpgradeError, match=says):
        await upgrader.install(msg)
    assert not (tmp_path / "releases").exists()


def test_a_wheel_is_named_as_pip_wants_it():
    assert wheel_name("0.12.0") == "llmgw-0.12.0-py3-none-any.whl"
    assert wheel_name("0.12.0+local-1") == "llmgw-0.12.0+local_1-py3-none-any.whl"
