"""Engines kept in their room: a real process that grows past its reservation is stopped
and its replica failed with the sentence; one within it is left alone; GPU memory is read
from NVML by the engine's processes; cgroup v2 limits where one is delegated."""

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleet.agent.contain import KernelLimits, MemoryReader, kernel_limits
from fleet.domain.causes import summary
from fleet.domain.containment import GB

from .helpers import FAKE_ENGINE, PATIENCE_S
from .test_supervisor import start_msg


class Recorder:
    def __init__(self, tmp_path, **kw):
        from fleet.agent.supervisor import Supervisor

        self.sup = Supervisor(
            tmp_path,
            advertise_addr="127.0.0.1",
            port_range=(24000, 24999),
            cpu_count=2,
            sim_command=FAKE_ENGINE,
            watch_interval_s=0.2,
            **kw,
        )
        self.statuses = []
        self.sup.on_change = self.statuses.append

    async def until(self, state):
        async with asyncio.timeout(PATIENCE_S):
            while not (found := [m for m in self.statuses if m["state"] == state]):
                await asyncio.sleep(0.05)
        return found[-1]

    async def close(self):
        await self.sup.stop_all(grace_s=2)
        await self.sup.close()


def watched(msg, *, memory_gb, grace_s=1.0, margin=0.25):
    return {**msg, "memory_gb": memory_gb, "memory_watch": {"margin": margin, "grace_s": grace_s}}


@pytest.mark.asyncio
async def test_an_engine_that_grows_past_its_reservation_is_stopped_with_the_figures(tmp_path):
    rec = Recorder(tmp_path)
    try:
        # 0.1 GB reserved; it takes 20 MB more every 0.1 s, so it is past 125 MB in a second.
        await rec.sup.start(watched(start_msg(args=["--grow-mb", "20"]), memory_gb=0.1))
        await rec.until("ready")
        pid = rec.sup.get("s1").pid
        failed = await rec.until("failed")
        first = failed["detail"].splitlines()[0]
        assert first.startswith("llmgw sim-engine used "), first
        assert first.endswith(
            " GB of its 0.1 GB reservation; stopped. Raise the profile's memory."
        ), first
        used = float(first.split(" used ")[1].split(" GB")[0])
        assert used > 0.125
        assert failed["stopped_for"] == "memory"
        assert failed["exit_code"] == -15  # it went at SIGTERM
        # The engine's own words follow, and the one line is the agent's sentence.
        assert "fake engine for tiny" in failed["detail"]
        assert summary(failed["detail"]) == first
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert rec.sup.shards() == []
        assert [m["state"] for m in rec.statuses] == ["starting", "ready", "failed"]
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_an_engine_within_its_reservation_is_left_alone(tmp_path):
    rec = Recorder(tmp_path)
    try:
        await rec.sup.start(watched(start_msg(), memory_gb=1.0, grace_s=0.2))
        await rec.until("ready")
        await asyncio.sleep(1.5)  # several readings, past the grace
        assert [m["state"] for m in rec.statuses] == ["starting", "ready"]
        assert rec.sup.get("s1").over_since is None
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_an_engine_over_for_less_than_the_grace_is_left_alone(tmp_path):
    rec = Recorder(tmp_path)
    try:
        # Over at once (a Python process is more than 1 MB), but the grace is a minute.
        await rec.sup.start(watched(start_msg(), memory_gb=0.001, grace_s=60))
        await rec.until("ready")
        async with asyncio.timeout(PATIENCE_S):
            while rec.sup.get("s1").over_since is None:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert [m["state"] for m in rec.statuses] == ["starting", "ready"]
    finally:
        await rec.close()


class NVML:
    """NVML over two 80 GB cards; ``held`` maps pid to the bytes it holds on card 0."""

    def __init__(self, held):
        self.held = held

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, i):
        return SimpleNamespace(total=80 * GB, used=0, free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, i):
        if i:
            return [SimpleNamespace(pid=1, usedGpuMemory=None)]
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.held.items()]


def test_gpu_memory_is_what_nvml_says_the_engines_processes_hold():
    me = os.getpid()
    reader = MemoryReader(nvml=NVML({me: 90 * GB, 999_999: 5 * GB}))
    readings = reader.read({"s1": os.getpgrp(), "cpu": os.getpgrp()}, {"s1": (0,), "cpu": ()})
    use, gpu_total = readings["s1"]
    assert use.gpu_bytes == 90 * GB  # not the 5 GB another process holds
    assert gpu_total == 80 * GB  # the one card it was given
    assert use.rss_bytes and use.rss_bytes > 0
    # A shard given no GPUs has no GPU figures: absent, not 0.
    assert readings["cpu"][0].gpu_bytes is None and readings["cpu"][1] is None


def test_no_nvml_reads_no_gpu_memory():
    reader = MemoryReader(nvml=None)
    use, total = reader.read({"s1": os.getpgrp()}, {"s1": (0,)})["s1"]
    assert (use.gpu_bytes, total) == (None, None)


def cgroup_tree(tmp_path: Path, controllers: str = "cpu memory pids") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    own = root / "system.slice" / "llmgw-agent.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text(controllers + "\n")
    (own / "cgroup.subtree_control").write_text("")
    proc = tmp_path / "self-cgroup"
    proc.write_text("0::/system.slice/llmgw-agent.service\n")
    return root, proc


def test_a_delegated_cgroup_holds_each_engine_by_memory_max(tmp_path, monkeypatch):
    root, proc = cgroup_tree(tmp_path)
    own = root / "system.slice" / "llmgw-agent.service"
    (own / "agent").mkdir()
    (own / "agent" / "cgroup.procs").write_text("")
    limits, said = kernel_limits(root, proc)
    assert limits == KernelLimits(own)
    assert (
        said
        == f"engines are held to their reservation by cgroup v2 memory.max under {own}, and watched"
    )
    assert (own / "agent" / "cgroup.procs").read_text().strip() == str(os.getpid())
    assert (own / "cgroup.subtree_control").read_text().strip() == "+memory"

    path = limits.prepare("chat-1/0", int(2.5 * GB))
    assert path == own / "shard-chat-1_0"
    assert (path / "memory.max").read_text().strip() == str(int(2.5 * GB))
    # The kernel's OOM killer ended it: the most it used, as the sentence needs it.
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    (path / "memory.peak").write_text(f"{int(2.5 * GB)}\n")
    assert limits.oom_killed(path) == int(2.5 * GB)
    (path / "memory.events").write_text("oom_kill 0\n")
    assert limits.oom_killed(path) is None


@pytest.mark.parametrize(
    ("case", "controllers", "self_cgroup", "why"),
    [
        (
            "cgroup v1, as on this machine",
            "memory",
            "4:memory:/x\n0::/\n",
            "this machine does not run cgroup v2 alone",
        ),
        ("the root cgroup", "memory", "0::/\n", "the agent runs in the root cgroup"),
        (
            "no memory controller delegated",
            "cpu pids",
            "0::/system.slice/llmgw-agent.service\n",
            "the memory controller is not delegated",
        ),
    ],
)
def test_without_a_delegated_memory_controller_engines_are_only_watched(
    tmp_path, case, controllers, self_cgroup, why
):
    root, proc = cgroup_tree(tmp_path, controllers)
    proc.write_text(self_cgroup)
    limits, said = kernel_limits(root, proc)
    assert limits is None, case
    assert said.startswith("engines' memory is watched every 1 s, without kernel limits: ")
    assert why in said, said
