"""Engines kept in their room: each engine's memory measured, and one that outgrew its
reservation stopped before it takes the node.

Every second the agent reads each running engine's memory: the resident memory of its
process tree (shard_use.py's sampler, which counts the workers it forked) and, on a node
with real NVIDIA GPUs, the GPU memory NVML says its processes hold. The rule
(fleet/domain/containment.py) says when one has been past its reservation by the margin
for longer than the grace; the supervisor then stops it and fails its replica with the
rule's sentence, a failure of its model's as a crash on start is.

Where the kernel can hold an engine to its room itself it does so too:
``kernel_limits`` finds a cgroup v2 memory controller delegated to the agent (its own
cgroup, or a slice given by systemd's ``Delegate=yes``) and puts each engine in a cgroup of
its own with ``memory.max`` at its reservation plus the margin. The watch runs either way:
it says why in the operator's words, where the kernel's OOM killer only ends the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.agent.shard_use import ShardUseSampler
from fleet.domain.containment import GB, Reservation, Use

log = logging.getLogger(__name__)

# How often each engine's memory is read.
WATCH_INTERVAL_S = 1.0
# An engine stopped for its memory is given this long after SIGTERM: it is taking the node's.
OUTGROWN_GRACE_S = 2.0


def real_nvml() -> Any:
    """The ``pynvml`` module where it imports, else None (no GPU memory is read)."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def reservation(memory_gb: float | None, gpu_bytes: int | None) -> Reservation:
    """A shard's reservation in bytes, from its memory in GB (None or 0: none declared)."""
    memory = int(memory_gb * GB) if memory_gb and memory_gb > 0 else None
    return Reservation(memory_bytes=memory, gpu_bytes=gpu_bytes or None)


class MemoryReader:
    """Reads what engines use: resident memory by process tree, GPU memory by NVML.

    ``nvml``: the ``pynvml`` module (or a stand-in) where the node's GPUs are real; None
    where they are simulated or there are none, and GPU memory is then not read.
    """

    def __init__(self, *, nvml: Any = None, proc_root: str | Path = "/proc") -> None:
        self.nvml = nvml
        self.proc_root = Path(proc_root)
        self._sampler = ShardUseSampler(proc_root=proc_root)

    def read(
        self, leaders: Mapping[str, int], gpus: Mapping[str, Collection[int]]
    ) -> dict[str, tuple[Use, int | None]]:
        """For each shard (its engine's pid in ``leaders``, its GPU indices in ``gpus``):
        what it uses now, and the GPU memory of the GPUs it was given (None: not known)."""
        rss = {k: v.get("rss_bytes") for k, v in self._sampler.sample(leaders).items()}
        held = self._gpu_memory() if self.nvml is not None and any(gpus.values()) else None
        # The processes of each engine's group or session: its workers hold GPU memory too.
        groups = self._sampler.members(set(leaders.values())) if held is not None else {}
        out: dict[str, tuple[Use, int | None]] = {}
        for shard_id, leader in leaders.items():
            given = gpus.get(shard_id) or ()
            gpu_used = gpu_total = None
            if held is not None and given:
                by_pid, totals = held
                members = {p.pid for p in groups.get(leader, ())} | {leader}
                gpu_used = sum(by_pid.get(pid, 0) for pid in members)
                gpu_total = sum(totals.get(i, 0) for i in given) or None
            out[shard_id] = (Use(rss_bytes=rss.get(shard_id), gpu_bytes=gpu_used), gpu_total)
        return out

    def _gpu_memory(self) -> tuple[dict[int, int], dict[int, int]] | None:
        """GPU memory held per pid (over every GPU) and each GPU's total; None when NVML
        cannot say."""
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except Exception:
            return None
        try:
            by_pid: dict[int, int] = {}
            totals: dict[int, int] = {}
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                totals[i] = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    # NVML gives None where it cannot tell (no permission, some drivers).
                    if isinstance(p.usedGpuMemory, int):
                        by_pid[p.pid] = by_pid.get(p.pid, 0) + p.usedGpuMemory
            return by_pid, totals
        except Exception as exc:
            log.debug("GPU memory of the engines unreadable: %s", exc)
            return None
        finally:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()


@dataclass(frozen=True)
class KernelLimits:
    """A cgroup v2 folder delegated to the agent, under which each engine gets a cgroup
    of its own with ``memory.max``."""

    root: Path

    def said(self) -> str:
        return f"cgroup v2 memory.max under {self.root}"

    def prepare(self, shard_id: str, limit_bytes: int) -> Path | None:
        """Make the shard's cgroup with ``memory.max`` at ``limit_bytes``; its path, or None
        (said in the log) when the kernel refused."""
        path = self.root / ("shard-" + re.sub(r"[^A-Za-z0-9._-]", "_", shard_id))
        try:
            path.mkdir(exist_ok=True)
            (path / "memory.max").write_text(f"{limit_bytes}\n")
            with contextlib.suppress(OSError):
                # Swapped out is still taken from the node: none of it.
                (path / "memory.swap.max").write_text("0\n")
        except OSError as exc:
            log.warning("shard %s: no cgroup of its own (%s); its memory is watched", shard_id, exc)
            return None
        return path

    def oom_killed(self, path: Path) -> int | None:
        """The most the cgroup's processes used (memory.peak), when the kernel's OOM killer
        ended one of them; None when it did not."""
        try:
            events = dict(
                line.split() for line in (path / "memory.events").read_text().splitlines()
            )
        except (OSError, ValueError):
            return None
        if int(events.get("oom_kill", "0")) == 0:
            return None
        try:
            return int((path / "memory.peak").read_text().strip())
        except (OSError, ValueError):
            max_text = (path / "memory.max").read_text().strip()
            return int(max_text) if max_text.isdigit() else None

    @staticmethod
    def remove(path: Path | None) -> None:
        """Remove a shard's cgroup once its processes are gone."""
        if path is not None:
            with contextlib.suppress(OSError):
                path.rmdir()


def join_cgroup(path: Path) -> None:
    """Move the calling process into the cgroup at ``path``: run in the engine's child
    before it starts the engine, so all it allocates and forks is held from the first byte."""
    (path / "cgroup.procs").write_text("0\n")


def kernel_limits(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_self: Path = Path("/proc/self/cgroup")
) -> tuple[KernelLimits | None, str]:
    """The cgroup v2 folder the agent may put engines under with ``memory.max``, and a
    sentence that says what holds engines to their room here (for the agent's log).

    Usable when the machine runs cgroup v2, the agent's own cgroup offers the memory
    controller and the agent may write there (root, or a slice delegated to it). The agent
    then moves itself into a child ``agent`` (a cgroup with processes cannot give its
    children controllers) and enables the memory controller for its siblings, the engines.
    """
    try:
        lines = proc_self.read_text().splitlines()
    except OSError:
        return None, _watch_only("/proc/self/cgroup cannot be read")
    unified = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    if not unified or len(lines) > 1:
        return None, _watch_only("this machine does not run cgroup v2 alone")
    if unified[0] in ("/", ""):
        # The root cgroup is systemd's (or the host's) to arrange: run the agent under
        # systemd with Delegate=yes to give it a slice of its own.
        return None, _watch_only("the agent runs in the root cgroup, not a delegated one")
    own = cgroup_root / unified[0].lstrip("/")
    if own.name == "agent" and (own.parent / "cgroup.subtree_control").exists():
        own = own.parent  # an earlier run moved itself already
    try:
        if "memory" not in (own / "cgroup.controllers").read_text().split():
            return None, _watch_only(f"the memory controller is not delegated to {own}")
        agent = own / "agent"
        agent.mkdir(exist_ok=True)
        (agent / "cgroup.procs").write_text(f"{os.getpid()}\n")
        (own / "cgroup.subtree_control").write_text("+memory\n")
    except OSError as exc:
        return None, _watch_only(f"{own} cannot be written ({exc.strerror or exc})")
    limits = KernelLimits(own)
    return limits, f"engines are held to their reservation by {limits.said()}, and watched"


def _watch_only(why: str) -> str:
    return f"engines' memory is watched every {WATCH_INTERVAL_S:g} s, without kernel limits: {why}"
