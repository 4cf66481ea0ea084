"""Telling a node to upgrade, and what its agent reports (issue 14, item 2); the roll with
real agent processes is tests/e2e/test_upgrade.py."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from fleet import protocol
from fleet.agent.upgrade import UpgradeError, Upgrader, start_refusal
from fleet.models import Event, Node
from fleet.nodes import upgrades
from llmgw.core.errors import Invalid, NotFound
from mirror.builds import engine_build_add
from mirror.domain.releases import wheel_name
from tests.mirror.wheels import MAIN, wheel

from .builders import T0, node_add

pytestmark = pytest.mark.django_db


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
    assert Event.objects.get(kind="upgrade").message == said
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
    failed = protocol.parse(
        '{"type": "upgrade_status", "version": "9.9.9", "state": "failed", "detail": "pip: no space"}'
    )
    upgrades.upgrade_reported(node_id="gpu-a", msg=failed, now=T0)
    row = Event.objects.get()
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
    with pytest.raises(protocol.BadMessage):
        protocol.parse(frame)


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


# Installing beside, trying, then switching (issue 35, item 4), with real processes: pip,
# and `python -m llmgw version` run by a child. The environment is one of the test's own,
# holding a small llmgw 1.0 (tests/mirror/wheels.py), never this one's.
def _environment(folder: Path) -> str:
    """A Python environment with llmgw 1.0 installed; pip found through this one's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = str(folder / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "test-pip.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--quiet", wheel(folder / "w", "1.0")],
        check=True,
    )  # fmt: skip
    return python


def _says(python: str, cwd: Path) -> str:
    """What `llmgw version` says in that environment."""
    done = subprocess.run(
        [python, "-m", "llmgw", "version"], cwd=cwd, capture_output=True, text=True
    )
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


@pytest.fixture
def upgrader(tmp_path, monkeypatch):
    """An agent's upgrader for a fresh environment on llmgw 1.0; what it fetches from the
    mirror is the wheel `offer` puts there."""
    python = _environment(tmp_path / "env")
    offered = {}

    def fetch(self, version, sha256, size):
        self.folder.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(offered["wheel"], self.folder / wheel_name(version)))

    monkeypatch.setattr(Upgrader, "_fetch", fetch)
    made = Upgrader(tmp_path / "state", server="http://127.0.0.1:9", bearer=lambda: "t",
                    python=python)  # fmt: skip
    made.offer = lambda path: offered.update(wheel=path)
    return made


def _msg(version: str) -> dict:
    return {"version": version, "sha256": "a" * 64, "size": 1}


async def test_a_release_that_starts_is_switched_to(upgrader, tmp_path):
    upgrader.offer(wheel(tmp_path / "w", "2.0"))

    assert await upgrader.install(_msg("2.0")) == "2.0"

    assert _says(upgrader.python, tmp_path) == "2.0"
    assert list(upgrader.folder.iterdir()) == []  # nothing left beside


@pytest.mark.parametrize(
    ("made", "said"),
    [
        (
            {"files": {"evil/__init__.py": ""}},
            "does not hold the llmgw package (llmgw/__init__.py)",
        ),
        (
            {"files": {"llmgw/__init__.py": "import llmgw_needs_this\n", "llmgw/__main__.py": ""}},
            "import llmgw_needs_this / ModuleNotFoundError: No module named 'llmgw_needs_this'",
        ),
        (
            {"files": {"llmgw/__init__.py": "", "llmgw/__main__.py": "raise SystemExit(3)\n"}},
            "`llmgw version` with it exited with code 3",
        ),
        (
            {"files": {"llmgw/__init__.py": "__version__ = '1.5'\n", "llmgw/__main__.py": MAIN}},
            "`llmgw version` with it said 1.5, not 2.0",
        ),
    ],
    ids=["no package", "a dependency missing", "exits", "another version"],
)
async def test_a_release_that_does_not_start_leaves_the_old_one_and_says_why(
    upgrader, tmp_path, made, said
):
    upgrader.offer(wheel(tmp_path / "w", "2.0", **made))

    with pytest.raises(UpgradeError, match="^llmgw 2.0 ") as refused:
        await upgrader.install(_msg("2.0"))

    assert said in str(refused.value)
    assert _says(upgrader.python, tmp_path) == "1.0"
    assert list(upgrader.folder.iterdir()) == []
    assert not upgrader.running


def test_a_release_that_does_not_start_is_said_with_the_end_of_what_it_wrote():
    err = "Traceback (most recent call last):\n" + "  File x\n" * 9 + "RuntimeError: boom\n\n"
    assert start_refusal(version="2.0", code=1, out="", err=err) == (
        "`llmgw version` with it exited with code 1: File x / File x / RuntimeError: boom"
    )
    assert start_refusal(version="2.0", code=0, out="1.0\n", err="") == (
        "`llmgw version` with it said 1.0, not 2.0"
    )
    assert start_refusal(version="2.0", code=0, out="", err="") == (
        "`llmgw version` with it said nothing, not 2.0"
    )
    assert start_refusal(version="2.0", code=0, out="a warning\n2.0\n", err="noise") == ""
