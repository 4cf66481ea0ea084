"""Installing an engine build from the mirror before a shard starts on it: fetched from a
server on loopback, its digest checked, resumed after a cut, installed, probed, one install
however many shards ask; a llama-server the agent already has is used as it is."""

from __future__ import annotations

import asyncio
import hashlib
import stat
import sys

import pytest

from fleet.agent import engines
from fleet.agent.install import BuildRef, Installer, InstallError
from fleet.agent.supervisor import Supervisor
from tests.mirror.hub import Hub

from .helpers import FAKE_ENGINE, PATIENCE_S
from .test_supervisor import start_msg

# llama-server as far as the agent can tell: a version, and a server answering /health
# (the fake engine, given the port and the --alias llama.cpp is started with).
SCRIPT = (
    f"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "version: 6000 (fake)"; exit 0; fi
port=; model=
while [ $# -gt 0 ]; do
  case "$1" in --port) port=$2; shift;; --alias) model=$2; shift;; esac
  shift
done
exec {sys.executable} {FAKE_ENGINE[1]} --port "$port" --model "$model"
""".encode()
    + b"#" * 200_000
    + b"\n"
)
DIGEST = hashlib.sha256(SCRIPT).hexdigest()


@pytest.fixture(autouse=True)
def no_engines(tmp_path, monkeypatch):
    """No llama-server on PATH, and whatever a test installs is forgotten after it."""
    empty = tmp_path / "path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(engines, "_binaries", dict(engines.DEFAULT_BINARIES))
    return empty


@pytest.fixture
def mirror():
    hub = Hub(plain={"llama-server": SCRIPT}).start()
    yield hub
    hub.stop()


def build(hub, *, sha256=DIGEST, size=len(SCRIPT), version="b6000") -> dict:
    return {
        "engine": "llamacpp",
        "version": version,
        "sha256": sha256,
        "size": size,
        "url": f"{hub.url}/files/llama-server",
    }


def llamacpp_msg(hub, shard_id="s1", **build_fields):
    return {
        **start_msg(shard_id, engine="llamacpp"),
        "source": "/models/tiny.gguf",
        "engine_build": build(hub, **build_fields),
    }


class Node:
    """A supervisor that installs engines, with its shard_status messages in order."""

    def __init__(self, tmp_path):
        self.installer = Installer(tmp_path / "engines", server="http://unused", bearer=lambda: "t")
        self.sup = Supervisor(
            tmp_path,
            advertise_addr="127.0.0.1",
            port_range=(25000, 25999),
            cpu_count=2,
            installer=self.installer,
        )
        self.statuses: list[dict] = []
        self.sup.on_change = self.statuses.append

    def of(self, shard_id="s1") -> list[dict]:
        return [m for m in self.statuses if m["shard_id"] == shard_id]

    async def until(self, state, shard_id="s1") -> dict:
        async with asyncio.timeout(PATIENCE_S):
            while not any(m["state"] == state for m in self.of(shard_id)):
                await asyncio.sleep(0.02)
        return [m for m in self.of(shard_id) if m["state"] == state][-1]

    async def close(self):
        await self.sup.stop_all(grace_s=2)
        await self.sup.close()


@pytest.mark.asyncio
async def test_a_missing_engine_is_installed_from_the_mirror_then_the_shard_starts_on_it(
    tmp_path, mirror
):
    node = Node(tmp_path)
    await node.sup.start(llamacpp_msg(mirror))
    await node.until("ready")

    binary = tmp_path / "engines" / "llamacpp" / "b6000" / "llama-server"
    assert binary.read_bytes() == SCRIPT
    assert binary.stat().st_mode & stat.S_IXUSR
    assert engines.engine_binaries()["llamacpp"] == str(binary)
    states = [m["state"] for m in node.of()]
    assert states[0] == "fetching" and states[-2:] == ["starting", "ready"]
    assert node.of()[0]["progress"] == {"done": 0, "total": len(SCRIPT)}
    assert node.installer.reports() == [
        {"engine": "llamacpp", "version": "b6000", "state": "installed"}
    ]
    assert node.installer.engines() == {"llamacpp": "6000 (fake)"}
    # Nothing is left of the download beside the install.
    assert not list((tmp_path / "engines" / ".downloads").iterdir())
    await node.close()


@pytest.mark.asyncio
async def test_two_shards_asking_for_one_engine_wait_on_one_install(tmp_path, mirror):
    import threading

    mirror.hold = threading.Event()
    node = Node(tmp_path)
    await node.sup.start(llamacpp_msg(mirror, "s1"))
    await node.sup.start(llamacpp_msg(mirror, "s2"))
    assert [s.state for s in node.sup.shards()] == ["fetching", "fetching"]
    async with asyncio.timeout(PATIENCE_S):
        while not node.installer.reports():
            await asyncio.sleep(0.01)
    assert node.installer.reports()[0]["state"] == "installing"
    mirror.hold.set()
    await node.until("ready", "s1")
    await node.until("ready", "s2")

    assert mirror.gets == {"llama-server": 1}
    await node.close()


@pytest.mark.asyncio
async def test_a_build_that_does_not_match_its_digest_fails_the_shard_with_a_sentence(
    tmp_path, mirror
):
    node = Node(tmp_path)
    await node.sup.start(llamacpp_msg(mirror, sha256="0" * 64))
    failed = await node.until("failed")

    assert "llamacpp b6000 could not be fetched from the mirror" in failed["detail"]
    assert "does not match its digest" in failed["detail"]
    (report,) = node.installer.reports()
    assert report["state"] == "failed" and report["detail"] == failed["detail"]
    assert not (tmp_path / "engines" / "llamacpp").exists()
    assert not list((tmp_path / "engines" / ".downloads").iterdir())
    # Asked again, it fails at once with the same sentence: the same bytes would not match.
    await node.sup.start(llamacpp_msg(mirror, "s2", sha256="0" * 64))
    assert (await node.until("failed", "s2"))["detail"] == failed["detail"]
    assert mirror.gets == {"llama-server": 1}
    await node.close()


@pytest.mark.asyncio
async def test_a_fetch_cut_short_is_resumed_from_where_it_stopped(tmp_path, mirror):
    mirror.cut_after = {"llama-server": 50_000}
    node = Node(tmp_path)
    await node.sup.start(llamacpp_msg(mirror))
    await node.until("ready")

    assert mirror.ranges == [None, "bytes=50000-"]
    await node.close()


@pytest.mark.asyncio
async def test_a_binary_that_does_not_run_here_fails_with_what_it_said(tmp_path):
    broken = b"#!/bin/sh\necho 'cannot execute: wrong architecture' >&2\nexit 126\n"
    hub = Hub(plain={"llama-server": broken}).start()
    try:
        node = Node(tmp_path)
        msg = llamacpp_msg(hub, sha256=hashlib.sha256(broken).hexdigest(), size=len(broken))
        await node.sup.start(msg)
        failed = await node.until("failed")
    finally:
        hub.stop()
    assert failed["detail"] == (
        "llamacpp b6000 was installed but `llama-server --version` exited 126: "
        "cannot execute: wrong architecture"
    )
    await node.close()


@pytest.mark.asyncio
async def test_a_llama_server_on_path_is_used_as_it_is(tmp_path, mirror, no_engines):
    own = no_engines / "llama-server"
    own.write_bytes(SCRIPT)
    own.chmod(0o755)
    node = Node(tmp_path)
    await node.sup.start(llamacpp_msg(mirror))
    await node.until("ready")

    assert mirror.gets == {}
    assert node.installer.reports() == []
    assert "fetching" not in [m["state"] for m in node.of()]
    await node.close()


@pytest.mark.asyncio
async def test_an_agent_started_again_uses_what_it_installed(tmp_path, mirror, monkeypatch):
    first = Installer(tmp_path / "engines", server="http://unused", bearer=lambda: "t")
    path = await first.ensure(BuildRef.from_message(build(mirror)))
    monkeypatch.setattr(engines, "_binaries", dict(engines.DEFAULT_BINARIES))

    again = Installer(tmp_path / "engines", server="http://unused", bearer=lambda: "t")
    assert again.adopt() == path
    assert engines.engine_binaries()["llamacpp"] == str(path)
    assert again.reports() == [{"engine": "llamacpp", "version": "b6000", "state": "installed"}]
    # The same build asked for again is there already: nothing is fetched.
    assert await again.ensure(BuildRef.from_message(build(mirror))) == path
    assert mirror.gets == {"llama-server": 1}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"engine": "vllm"}, "names no engine this agent installs"),
        ({"version": " "}, "carries no version"),
        ({"sha256": "abc"}, "carries no sha256 digest"),
        ({"size": 0}, "carries no size"),
        ({"url": ""}, "carries no url"),
    ],
)
def test_an_unusable_engine_build_is_a_sentence(change, said):
    raw = {"engine": "llamacpp", "version": "b1", "sha256": "a" * 64, "size": 1, "url": "/x"}
    with pytest.raises(InstallError, match=said):
        BuildRef.from_message({**raw, **change})


@pytest.mark.asyncio
async def test_an_engine_build_the_shard_cannot_use_fails_it_with_that_sentence(tmp_path, mirror):
    node = Node(tmp_path)
    await node.sup.start(llamacpp_msg(mirror, sha256="nope"))
    failed = await node.until("failed")
    assert failed["detail"] == "start_shard's engine_build carries no sha256 digest."
    assert not (tmp_path / "engines" / "llamacpp").exists()
    await node.close()


@pytest.mark.asyncio
async def test_a_disk_that_fails_fails_the_install_with_a_sentence_not_installing_for_ever(
    tmp_path, mirror
):
    (tmp_path / "engines").write_text("a file where the engines folder should be")
    node = Node(tmp_path)
    await node.sup.start(llamacpp_msg(mirror))
    failed = await node.until("failed")

    assert "could not be installed in" in failed["detail"]
    (report,) = node.installer.reports()
    assert report["state"] == "failed"
    await node.close()
