"""What the agent started, kept in its state folder, so that a restarted agent finds its engines.

Engines run in sessions of their own: an agent killed with SIGKILL leaves them
running. Each engine has one JSON file in ``<state-dir>/shards/``, written
atomically and readable by the agent's user only (it holds the engine's key),
with what adopting it again needs (the shard's spec, its port and log) and what
tells it apart from a later process given the same pid: its start time in
``/proc/<pid>/stat`` and the boot it started in. The supervisor
(``Supervisor.adopt``) reads them at start. Here too: stopping an engine's
process group, whether the agent started it in this run or adopted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fleet.agent.adapters import AdapterRef
from fleet.agent.engines import ShardSpec

log = logging.getLogger(__name__)

PROC = Path("/proc")
BOOT_ID = PROC / "sys/kernel/random/boot_id"
# How often an engine is looked at where the kernel gives no pidfd to wait on.
POLL_S = 0.5


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that say which process a pid is now."""

    state: str
    pgrp: int
    session: int
    start_time: int  # clock ticks after boot


def proc_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """The process ``pid`` is now; None when there is none (or only its zombie)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name is in parentheses and may hold spaces and parentheses itself.
    rest = text[text.rfind(")") + 2 :].split()
    try:
        stat = ProcStat(rest[0], int(rest[2]), int(rest[3]), int(rest[19]))
    except (IndexError, ValueError):
        return None
    return None if stat.state in ("Z", "X") else stat


def boot_id(path: Path = BOOT_ID) -> str:
    """This boot's id; start times count from it, so one from another boot says nothing."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Entry:
    """One engine the agent started: its process, where it listens, what it runs."""

    spec: ShardSpec
    pid: int
    start_time: int
    boot: str
    port: int
    log_path: str
    state: str  # "starting" or "ready", as last seen
    started_at: float  # Unix seconds: its startup timeout counts from here
    weights_sha256: str | None = None
    # Every file's digest where its weights are a folder (weights_sha256 is the first: an
    # entry written by an earlier release has only that).
    weights_digests: tuple[str, ...] = ()

    def digests(self) -> tuple[str, ...]:
        """The digests of the cached files its engine runs on."""
        if self.weights_digests:
            return tuple(self.weights_digests)
        return (self.weights_sha256,) if self.weights_sha256 else ()

    def to_json(self) -> str:
        body = asdict(self)
        body["spec"]["gpu_indices"] = list(self.spec.gpu_indices)
        return json.dumps(body, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Entry:
        """Read one back; raises ValueError (or TypeError) on anything else."""
        body = json.loads(text)
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise ValueError("not a ledger entry")
        names = {f.name for f in fields(ShardSpec)}
        spec = {k: v for k, v in body["spec"].items() if k in names}
        spec["gpu_indices"] = tuple(int(i) for i in spec.get("gpu_indices") or ())
        spec["adapters"] = tuple(AdapterRef.from_message(a) for a in spec.get("adapters") or ())
        digests = tuple(str(d) for d in body.get("weights_digests") or ())
        entry = cls(**{**body, "spec": ShardSpec(**spec), "weights_digests": digests})
        for name, kind in (("pid", int), ("start_time", int), ("port", int), ("boot", str)):
            if not isinstance(getattr(entry, name), kind):
                raise ValueError(f"{name} is not {kind.__name__}")
        if entry.pid <= 1:
            raise ValueError(f"pid {entry.pid} is no engine's")
        return entry

    def is_ours(self, stat: ProcStat | None) -> bool:
        """Whether ``stat`` (its pid's process now) is this engine, not a later one given the
        same pid."""
        return stat is not None and stat.start_time == self.start_time and self.boot == boot_id()


def _file_name(shard_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", shard_id) + ".json"


class Ledger:
    """The engines this agent started and has not seen end, one file each."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def record(self, entry: Entry) -> None:
        """Write (or rewrite) an engine's entry in one step, 0600.

        A failure is logged, not raised: the engine runs whether or not it is
        written down, and only a later agent adopting it needs the file.
        """
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:  # mkstemp makes it 0600
                    f.write(entry.to_json())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.folder / _file_name(entry.spec.shard_id))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.warning(
                "shard %s: cannot write it down in %s (%s); an agent restarted before it "
                "ends will not find it",
                entry.spec.shard_id,
                self.folder,
                exc,
            )

    def drop(self, shard_id: str) -> None:
        """Forget an engine that has ended."""
        with contextlib.suppress(FileNotFoundError):
            (self.folder / _file_name(shard_id)).unlink()

    def entries(self) -> list[Entry]:
        """Every engine written down; a file that cannot be read is logged and removed."""
        try:
            paths = sorted(p for p in self.folder.glob("*.json") if p.is_file())
        except OSError:
            return []
        out = []
        for path in paths:
            try:
                out.append(Entry.from_json(path.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("dropping %s: not an engine this agent can read (%s)", path, exc)
                with contextlib.suppress(OSError):
                    path.unlink()
        return out


def group_members(pgid: int, since: int, proc: Path = PROC) -> list[int]:
    """Processes still in the session and process group ``pgid`` that started no earlier
    than ``since``: what an engine forked and left behind when it died (vLLM's workers)."""
    found = []
    for child in proc.iterdir():
        if not child.name.isdigit():
            continue
        stat = proc_stat(int(child.name), proc)
        if stat and stat.pgrp == pgid and stat.session == pgid and stat.start_time >= since:
            found.append(int(child.name))
    return found


class AdoptedProcess:
    """An engine an earlier run of the agent started, watched as one of its own.

    It is not this process's child, so its exit code is never known: ``returncode``
    stays None and ``exited`` says it is gone. The wait is on a pidfd where the
    kernel has them, else on ``/proc`` every ``POLL_S``.
    """

    def __init__(self, entry: Entry) -> None:
        self.pid = entry.pid
        self.returncode: int | None = None
        self.exited = False
        self._start_time = entry.start_time
        self._gone = asyncio.Event()
        self._fd: int | None = None
        self._poller: asyncio.Task[None] | None = None

    @classmethod
    def attach(cls, entry: Entry) -> AdoptedProcess | None:
        """Watch the entry's engine; None when it is not (or no longer) running."""
        proc = cls(entry)
        loop = asyncio.get_running_loop()
        try:
            proc._fd = os.pidfd_open(entry.pid)
        except ProcessLookupError:
            return None
        except (AttributeError, OSError):
            proc._fd = None
        # Asked again once the pidfd holds it: the pid may have been given to another since.
        if not entry.is_ours(proc_stat(entry.pid)):
            proc._close()
            return None
        if proc._fd is not None:
            loop.add_reader(proc._fd, proc._ended)
        else:
            proc._poller = asyncio.create_task(proc._poll(), name=f"poll-{entry.pid}")
        return proc

    async def _poll(self) -> None:
        while (stat := proc_stat(self.pid)) is not None and stat.start_time == self._start_time:
            await asyncio.sleep(POLL_S)
        self._ended()

    def _ended(self) -> None:
        self.exited = True
        self._close()
        self._gone.set()

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    async def wait(self) -> int | None:
        """Until it has exited; its exit code is not known."""
        await self._gone.wait()
        return None


def running(proc: Any) -> bool:
    """Whether an engine process (a child, or one adopted) has not exited."""
    return proc.returncode is None and not getattr(proc, "exited", False)


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def terminate(
    proc: asyncio.subprocess.Process | AdoptedProcess, grace_s: float
) -> int | None:
    """SIGTERM the process group, SIGKILL it after ``grace_s``; the exit code (None for an
    adopted engine, whose end is not known)."""
    if running(proc):
        kill_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), max(grace_s, 0.0))
        except TimeoutError:
            log.warning("pid %d outlived its %g s grace; killing it", proc.pid, grace_s)
            kill_group(proc.pid)
            await proc.wait()
    # The leader is gone; whatever it forked into the group goes with it.
    kill_group(proc.pid)
    return proc.returncode
