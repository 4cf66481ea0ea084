"""The supervisor's table of shards: one ``Shard`` per engine, what is said when one
changes (``status_message``), and the steps its parts share: emit a change, finish a
shard, write it down in the ledger.

Each engine runs in its own process group, so stopping it reaches the workers it forks
too (vLLM's), and logs to ``<state-dir>/logs/<shard>.log``. Every state change is handed
to ``on_change`` as a ``shard_status`` message; the supervisor does not know about
connections, so engines keep running while the agent is away from the control plane.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fleet.agent.cache import WeightCache
from fleet.agent.contain import WATCH_INTERVAL_S, KernelLimits, MemoryReader
from fleet.agent.discovery import is_loopback
from fleet.agent.enginelog import failure_tail
from fleet.agent.engines import SIM_COMMAND, CacheWindow, ShardSpec
from fleet.agent.install import Installer
from fleet.agent.ledger import AdoptedProcess, Entry, Ledger, boot_id, proc_stat
from fleet.agent.ports import host_for_url

# The supervisor's parts all log as the supervisor, as it did when it was one module.
log = logging.getLogger("fleet.agent.supervisor")

FETCHING, STARTING, READY, FAILED, STOPPED = "fetching", "starting", "ready", "failed", "stopped"
HEALTH_POLL_S = 0.5
SHUTDOWN_GRACE_S = 10.0


def log_name(shard_id: str) -> str:
    """The name of the shard's engine log in ``<state-dir>/logs/``."""
    # Shard ids come from the control plane; keep them inside logs/.
    return re.sub(r"[^A-Za-z0-9._-]", "_", shard_id) + ".log"


def log_tail(path: Path | None) -> str:
    """The engine's last words for a failure's detail (enginelog.failure_tail)."""
    return failure_tail(path)


def with_tail(sentence: str, path: Path | None) -> str:
    """A failure's sentence with the engine's last words below it, when it left some."""
    tail = log_tail(path)
    return f"{sentence}\n{tail}" if tail else sentence


@dataclass
class Shard:
    """One engine process and what the control plane knows of it."""

    spec: ShardSpec
    state: str = STARTING
    port: int | None = None
    endpoint: str | None = None
    process: asyncio.subprocess.Process | AdoptedProcess | None = None
    log_path: Path | None = None
    watcher: asyncio.Task[None] | None = None
    stop_task: asyncio.Task[None] | None = None
    # The cached weights files it runs on (or is fetching), which reclaim leaves alone: one
    # for a GGUF, every file of a folder.
    weights_digests: tuple[str, ...] = ()
    # The cached files of the adapters its engine was given from the mirror, by adapter name:
    # left alone by reclaim too while it holds them.
    adapter_digests: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The adapters whose files are being fetched for it, by name: (bytes done, of total).
    adapter_fetches: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    # When its engine was spawned (Unix seconds): its startup timeout counts from here.
    started_at: float = 0.0
    # Since when its engine has used more than its reservation allows (monotonic seconds).
    over_since: float | None = None
    # The cgroup its engine runs in where the kernel holds it to its room (contain.py).
    cgroup: Path | None = None
    # How many requests its engine runs at once, as its command sets it (None: unknown).
    slots: int | None = None

    def digests(self) -> tuple[str, ...]:
        """Every cached file it uses: its weights' and its adapters'."""
        return self.weights_digests + tuple(d for ds in self.adapter_digests.values() for d in ds)

    @property
    def pid(self) -> int | None:
        """The engine's pid, which is also its process group."""
        return self.process.pid if self.process else None

    def register_entry(self) -> dict[str, Any]:
        """The shard's entry in ``register.shards``."""
        entry = {
            "shard_id": self.spec.shard_id,
            "replica_id": self.spec.replica_id,
            "model": self.spec.model,
            "profile": self.spec.profile_name,
            "profile_fp": self.spec.profile_fp,
            "gpu_indices": list(self.spec.gpu_indices),
            "endpoint": self.endpoint,
            "state": self.state,
        }
        return {k: v for k, v in entry.items() if v is not None}


def status_message(
    shard_id: str,
    state: str,
    *,
    endpoint: str | None = None,
    detail: str | None = None,
    exit_code: int | None = None,
    progress: dict[str, int | None] | None = None,
    stopped_for: str | None = None,
) -> dict[str, Any]:
    """A ``shard_status`` message; what is unknown is left out. ``stopped_for``: "memory"
    when the agent stopped the engine for outgrowing its reservation."""
    msg: dict[str, Any] = {"type": "shard_status", "shard_id": shard_id, "state": state}
    for key, value in (
        ("endpoint", endpoint),
        ("detail", detail),
        ("exit_code", exit_code),
        ("progress", progress),
        ("stopped_for", stopped_for),
    ):
        if value is not None:
            msg[key] = value
    return msg


class ShardTable:
    """The shards whose engines run on this node, and what every part of the supervisor
    does to one of them: report it, finish it, write it down."""

    def __init__(
        self,
        state_dir: Path,
        *,
        advertise_addr: str,
        port_range: tuple[int, int] = (20000, 29999),
        cpu_count: int | None = None,
        sim_command: Sequence[str] | None = None,
        sim_power_file: Path | None = None,
        cache: WeightCache | None = None,
        installer: Installer | None = None,
        memory: MemoryReader | None = None,
        kernel: KernelLimits | None = None,
        watch_interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.state_dir = state_dir
        # What reads each engine's memory, and the cgroups that hold it where there are.
        self.memory = memory if memory is not None else MemoryReader()
        self.kernel = kernel
        self.watch_interval_s = watch_interval_s
        self._memory_task: asyncio.Task[None] | None = None
        self.cache = cache
        self.installer = installer
        self.advertise_addr = advertise_addr
        self.port_range = port_range
        self.cpu_count = cpu_count
        self.sim_command = tuple(sim_command) if sim_command else SIM_COMMAND
        self.sim_power_file = sim_power_file
        # Called with every shard_status message; the client sets it.
        self.on_change: Callable[[dict[str, Any]], None] = lambda msg: None
        self._shards: dict[str, Shard] = {}
        self.ledger = Ledger(state_dir / "shards")
        self._http: httpx.AsyncClient | None = None
        self._cache_windows: dict[str, CacheWindow] = {}  # per shard: its prefix cache's reads
        self._closing = False

    @property
    def bind_host(self) -> str:
        """Where the sim engine listens: loopback only when advertised so."""
        return "127.0.0.1" if is_loopback(self.advertise_addr) else "0.0.0.0"

    def shards(self) -> list[Shard]:
        """The shards whose engines run now (starting or ready)."""
        return list(self._shards.values())

    def get(self, shard_id: str) -> Shard | None:
        """The running shard with this id, if any."""
        return self._shards.get(shard_id)

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # Engines are on this machine: a proxy from the environment
            # would only get in the way.
            self._http = httpx.AsyncClient(timeout=2.0, trust_env=False)
        return self._http

    def _emit(self, shard: Shard, **extra: Any) -> None:
        self.on_change(
            status_message(shard.spec.shard_id, shard.state, endpoint=shard.endpoint, **extra)
        )

    def _finish(self, shard: Shard, state: str, **extra: Any) -> None:
        shard.state = state
        if self._shards.get(shard.spec.shard_id) is shard:
            del self._shards[shard.spec.shard_id]
            self.ledger.drop(shard.spec.shard_id)
        if shard.cgroup is not None:
            KernelLimits.remove(shard.cgroup)
        if self.cache is not None:
            # Used until now: reclaim counts its idle days from here, not from its start.
            for digest in shard.digests():
                self.cache.touch(digest)
        log.info(
            "shard %s %s%s",
            shard.spec.shard_id,
            state,
            f": {extra['detail']}" if extra.get("detail") else "",
        )
        self._emit(shard, **extra)

    def _record(self, shard: Shard) -> None:
        """Write down the shard's engine (ledger.py), as it is now."""
        proc, port = shard.process, shard.port
        if self._shards.get(shard.spec.shard_id) is not shard or proc is None or port is None:
            return  # stopped, or not spawned: nothing is left to adopt
        stat = proc_stat(proc.pid)
        if stat is None:
            return  # it exited already: its watcher reports it
        self.ledger.record(
            Entry(
                spec=shard.spec,
                pid=proc.pid,
                start_time=stat.start_time,
                boot=boot_id(),
                port=port,
                log_path=str(shard.log_path or ""),
                state=shard.state,
                started_at=shard.started_at,
                weights_sha256=shard.weights_digests[0] if shard.weights_digests else None,
                weights_digests=shard.weights_digests,
            )
        )

    def _endpoint(self, port: int) -> str:
        return f"http://{host_for_url(self.advertise_addr)}:{port}"
