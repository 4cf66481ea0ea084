"""Engine processes: one per shard, started, watched and stopped.

Each engine runs in its own process group, so stopping it reaches the
workers it forks too (vLLM's), and logs to ``<state-dir>/logs/<shard>.log``.
Every state change is handed to ``on_change`` as a ``shard_status`` message;
the supervisor does not know about connections, so engines keep running
while the agent is away from the control plane. Each engine is written down
in the state folder (ledger.py) while it runs, so an agent that was killed
adopts its engines again when it starts (``adopt``) rather than leaving them
orphans on their GPUs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from fleet.agent.adapters import AdapterError, AdapterRef, EngineAdapters, adapter_status
from fleet.agent.cache import CacheError, WeightCache
from fleet.agent.contain import (
    OUTGROWN_GRACE_S,
    WATCH_INTERVAL_S,
    KernelLimits,
    MemoryReader,
    join_cgroup,
    reservation,
)
from fleet.agent.discovery import is_loopback
from fleet.agent.enginelog import failure_tail, tail_lines
from fleet.agent.engines import (
    SIM_COMMAND,
    CacheWindow,
    EngineError,
    NodeContext,
    ShardSpec,
    build_command,
    engine_load,
)
from fleet.agent.install import Installer, InstallError, engine_ref, missing
from fleet.agent.ledger import (
    AdoptedProcess,
    Entry,
    Ledger,
    boot_id,
    group_members,
    kill_group,
    proc_stat,
    running,
    terminate,
)
from fleet.agent.ports import choose_port, host_for_url
from fleet.domain.causes import ended_said
from fleet.domain.containment import GB, Limits, judge, outgrown_said
from mirror.domain.refs import FolderRef, RefError, weights_from_message

log = logging.getLogger(__name__)

FETCHING, STARTING, READY, FAILED, STOPPED = "fetching", "starting", "ready", "failed", "stopped"
HEALTH_POLL_S = 0.5
SHUTDOWN_GRACE_S = 10.0

# Variables of the agent's own that an engine must not inherit: the join
# token would let any engine (running a model's own code) pose as the node.
_WITHHELD_ENV = ("LLMGW_TOKEN", "LLAMA_API_KEY", "VLLM_API_KEY", "LLMGW_ENGINE_API_KEY")


def _log_name(shard_id: str) -> str:
    # Shard ids come from the control plane; keep them inside logs/.
    return re.sub(r"[^A-Za-z0-9._-]", "_", shard_id) + ".log"


def log_tail(path: Path | None) -> str:
    """The engine's last words for a failure's detail (enginelog.failure_tail)."""
    return failure_tail(path)


def _with_tail(sentence: str, path: Path | None) -> str:
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
    # When its engine was spawned (Unix seconds): its startup timeout counts from here.
    started_at: float = 0.0
    # Since when its engine has used more than its reservation allows (monotonic seconds).
    over_since: float | None = None
    # The cgroup its engine runs in where the kernel holds it to its room (contain.py).
    cgroup: Path | None = None

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


class Supervisor:
    """Starts, watches and stops the engines of this node's shards."""

    def __init__(
        self,
        state_dir: Path,
        *,
        advertise_addr: str,
        port_range: tuple[int, int] = (20000, 29999),
        cpu_count: int | None = None,
        sim_command: Sequence[str] | None = None,
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

    def process_groups(self) -> dict[str, int]:
        """Each running shard's engine pid, which is also its process group."""
        return {
            s.spec.shard_id: s.process.pid
            for s in self._shards.values()
            if s.process is not None and running(s.process)
        }

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

    async def start(self, msg: dict[str, Any]) -> None:
        """Start the shard a ``start_shard`` message describes.

        A shard already running is re-reported, not started twice. What
        cannot be started is reported ``failed`` with a sentence.
        """
        try:
            spec = ShardSpec.from_message(msg)
        except EngineError as exc:
            shard_id = msg.get("shard_id")
            log.warning("start_shard refused: %s", exc)
            if isinstance(shard_id, str) and shard_id:
                self.on_change(status_message(shard_id, FAILED, detail=str(exc)))
            return
        if self._closing:
            self.on_change(status_message(spec.shard_id, FAILED, detail="The agent is stopping."))
            return
        existing = self._shards.get(spec.shard_id)
        if existing is not None:
            log.info("shard %s already runs here (%s)", spec.shard_id, existing.state)
            self._emit(existing)
            return
        shard = Shard(spec=spec)
        self._shards[spec.shard_id] = shard
        # A build is installed only where the engine is missing: one given to the agent or
        # on its PATH is used as it is.
        build = msg.get("engine_build") if missing(spec.engine) else None
        if msg.get("weights") is not None or build is not None:
            # A fetch takes minutes: the session keeps serving commands meanwhile.
            shard.state = FETCHING
            shard.watcher = asyncio.create_task(
                self._fetch_then_launch(shard, msg.get("weights"), build),
                name=f"fetch-{spec.shard_id}",
            )
            return
        await self._launch(shard)

    async def _install(self, shard: Shard, raw: Any) -> bool:
        """Install the shard's engine from the mirror; whether it may go on (else it is failed)."""
        loop = asyncio.get_running_loop()

        def progress(done: int, total: int | None) -> None:
            # Called from the install's thread.
            loop.call_soon_threadsafe(self._progress, shard, done, total)

        try:
            if self.installer is None:
                raise InstallError("This agent installs no engines (it has no state folder).")
            ref = engine_ref(raw)
            self._progress(shard, 0, ref.size)
            await self.installer.ensure(ref, on_progress=progress)
        except InstallError as exc:
            if shard.stop_task is None:
                self._finish(shard, FAILED, detail=str(exc))
            return False
        return shard.stop_task is None

    async def _fetch_then_launch(self, shard: Shard, raw: Any, build: Any = None) -> None:
        """Install the shard's engine and put its weights in the cache (each when asked), then
        start its engine on the verified file."""
        if build is not None and not await self._install(shard, build):
            return
        if raw is None:
            shard.state = STARTING
            shard.watcher = None
            await self._launch(shard)
            return
        spec = shard.spec
        try:
            if self.cache is None:
                raise CacheError("This agent keeps no weight cache (--cache-dir).")
            ref = weights_from_message(raw)
            shard.weights_digests = ref.digests
            loop = asyncio.get_running_loop()

            def progress(done: int, total: int | None) -> None:
                # Called from the fetch's thread.
                loop.call_soon_threadsafe(self._progress, shard, done, total)

            if isinstance(ref, FolderRef):
                if not self.cache.folder_path(ref).is_dir():
                    self._progress(shard, 0, ref.size)
                path = await self.cache.ensure_folder(ref, source=spec.source, on_progress=progress)
            else:
                if not self.cache.path(ref.sha256).exists():
                    self._progress(shard, 0, ref.size)
                path = await self.cache.ensure(ref, source=spec.source, on_progress=progress)
        except (CacheError, RefError) as exc:
            if shard.stop_task is None:
                self._finish(shard, FAILED, detail=str(exc))
            return
        except Exception as exc:
            # Never left "fetching" with nothing fetching: the control plane waits on it.
            log.exception("shard %s: fetching its weights failed", spec.shard_id)
            if shard.stop_task is None:
                self._finish(shard, FAILED, detail=f"Fetching the weights failed: {exc}.")
            return
        if shard.stop_task is not None:
            return  # stopped while it fetched: stop() has reported it
        shard.spec = replace(spec, source=str(path))
        shard.state = STARTING
        shard.watcher = None
        await self._launch(shard)

    def _progress(self, shard: Shard, done: int, total: int | None) -> None:
        if shard.state == FETCHING and shard.stop_task is None:
            self._emit(shard, progress={"done": done, "total": total})

    async def _launch(self, shard: Shard) -> None:
        spec = shard.spec
        try:
            await self._spawn(shard)
        except (EngineError, OSError) as exc:
            self._finish(shard, FAILED, detail=_spawn_failure(spec, exc))
            return
        if shard.stop_task is not None:
            # Stopped while it was being spawned: stop() has reported it.
            assert shard.process is not None
            await terminate(shard.process, grace_s=0)
            return
        self._emit(shard)
        shard.watcher = asyncio.create_task(self._watch(shard), name=f"watch-{spec.shard_id}")
        self._watch_memory()

    def _watch_memory(self) -> None:
        """Start reading the engines' memory, once, from the first engine on."""
        if self._memory_task is None or self._memory_task.done():
            self._memory_task = asyncio.create_task(self._memory_loop(), name="memory-watch")

    async def _memory_loop(self) -> None:
        """Every ``watch_interval_s``: each engine's memory against its reservation; one
        past it by the margin for the grace is stopped (containment.judge)."""
        while not self._closing:
            await asyncio.sleep(self.watch_interval_s)
            try:
                await self._memory_pass()
            except Exception:
                log.exception("the engines' memory could not be read")

    async def _memory_pass(self) -> None:
        """Read every watched engine's memory once and stop those the rule says to."""
        watched = {
            s.spec.shard_id: s
            for s in list(self._shards.values())
            if s.process is not None
            and s.stop_task is None
            and running(s.process)
            and (s.spec.memory_gb or s.spec.gpu_indices)
        }
        if not watched:
            return
        leaders = {k: s.process.pid for k, s in watched.items() if s.process is not None}
        gpus = {k: s.spec.gpu_indices for k, s in watched.items()}
        readings = await asyncio.to_thread(self.memory.read, leaders, gpus)
        now = time.monotonic()
        for shard_id, (use, gpu_bytes) in readings.items():
            shard = watched[shard_id]
            if shard.stop_task is not None or self._shards.get(shard_id) is not shard:
                continue
            spec = shard.spec
            verdict = judge(
                spec.engine,
                reservation(spec.memory_gb, gpu_bytes),
                use,
                over_since=shard.over_since,
                now=now,
                limits=Limits(margin=spec.memory_margin, grace_s=spec.memory_grace_s),
            )
            shard.over_since = verdict.over_since
            if verdict.stop:
                shard.stop_task = asyncio.create_task(
                    self._stop_outgrown(shard, verdict.said), name=f"outgrown-{shard_id}"
                )

    async def _stop_outgrown(self, shard: Shard, said: str) -> None:
        """Stop an engine that outgrew its reservation; its replica fails with ``said``."""
        log.warning("shard %s: %s", shard.spec.shard_id, said)
        code = await terminate(shard.process, OUTGROWN_GRACE_S) if shard.process else None
        if shard.watcher is not None:
            shard.watcher.cancel()
        self._finish(
            shard,
            FAILED,
            exit_code=code,
            detail=_with_tail(said, shard.log_path),
            stopped_for="memory",
        )

    async def _spawn(self, shard: Shard) -> None:
        spec = shard.spec
        taken = {s.port for s in self._shards.values() if s.port is not None}
        port = choose_port(spec.http_port, self.port_range, taken)
        if spec.http_port and port != spec.http_port:
            log.info("port %d is taken here; shard %s gets %d", spec.http_port, spec.shard_id, port)
        node = NodeContext(
            port=port,
            cpu_count=self.cpu_count,
            bind_host=self.bind_host,
            sim_command=self.sim_command,
        )
        command = build_command(spec, node)
        shard.port = port
        shard.endpoint = self._endpoint(port)
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        shard.log_path = logs / _log_name(spec.shard_id)
        env = {k: v for k, v in os.environ.items() if k not in _WITHHELD_ENV}
        env.update(command.env)
        cgroup = self._cgroup_for(spec)
        with open(shard.log_path, "ab") as out:
            shard.process = await asyncio.create_subprocess_exec(
                *command.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                # In its cgroup before it runs: all it allocates and forks is held.
                preexec_fn=(lambda: join_cgroup(cgroup)) if cgroup is not None else None,
            )
        shard.cgroup = cgroup
        shard.started_at = time.time()
        self._record(shard)
        log.info(
            "shard %s: started %s (pid %d, port %d)",
            spec.shard_id,
            command.argv[0],
            shard.process.pid,
            port,
        )

    def _cgroup_for(self, spec: ShardSpec) -> Path | None:
        """The cgroup the shard's engine is to run in, with memory.max at its reservation
        plus the margin; None where the kernel holds nothing here or it declared none."""
        if self.kernel is None or not spec.memory_gb:
            return None
        limit = int(spec.memory_gb * GB * (1 + spec.memory_margin))
        return self.kernel.prepare(spec.shard_id, limit)

    def _endpoint(self, port: int) -> str:
        return f"http://{host_for_url(self.advertise_addr)}:{port}"

    def ledger_flush(self) -> None:
        """Write down every engine as it is now: this agent is about to be replaced by its
        next release (fleet/agent/upgrade.py), which adopts them."""
        for shard in list(self._shards.values()):
            self._record(shard)

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

    async def _watch(self, shard: Shard) -> None:
        """Poll /health until ready, then wait for the engine to exit."""
        proc = shard.process
        assert proc is not None
        loop = asyncio.get_running_loop()
        # From its spawn: an engine adopted while starting has had some of it already.
        elapsed = max(time.time() - shard.started_at, 0.0) if shard.started_at else 0.0
        deadline = loop.time() + shard.spec.startup_timeout_s - elapsed
        exited = asyncio.ensure_future(proc.wait())
        while not exited.done():
            if shard.state != STARTING:
                await asyncio.wait({exited})
            elif await self._healthy(shard):
                shard.state = READY
                log.info("shard %s is ready at %s", shard.spec.shard_id, shard.endpoint)
                self._record(shard)
                self._emit(shard)
            elif loop.time() >= deadline:
                timeout = shard.spec.startup_timeout_s
                shard.stop_task = asyncio.current_task()  # so stop() does not race us
                code = await terminate(proc, grace_s=5.0)
                self._finish(
                    shard,
                    FAILED,
                    exit_code=code,
                    detail=_with_tail(
                        f"The engine did not answer /health within {timeout:g} s.",
                        shard.log_path,
                    ),
                )
                return
            else:
                await asyncio.wait({exited}, timeout=HEALTH_POLL_S)
        if shard.stop_task is not None:
            return  # being stopped: stop() reports it
        code = proc.returncode
        kill_group(proc.pid)  # what it forked and left behind
        peak = self.kernel.oom_killed(shard.cgroup) if self.kernel and shard.cgroup else None
        if peak is not None and shard.spec.memory_gb:
            # The kernel held it to its room: said as the watch says it.
            said = outgrown_said(
                shard.spec.engine, used=peak, reserved=int(shard.spec.memory_gb * GB)
            )
            detail = _with_tail(said, shard.log_path)
            self._finish(shard, FAILED, exit_code=code, detail=detail, stopped_for="memory")
            return
        # An adopted engine is not our child: how it ended is not known (ended_said says so).
        detail = _with_tail(ended_said(code), shard.log_path)
        self._finish(shard, FAILED, exit_code=code, detail=detail)

    async def _healthy(self, shard: Shard) -> bool:
        headers = {"Authorization": f"Bearer {shard.spec.api_key}"} if shard.spec.api_key else {}
        try:
            r = await self._client().get(f"http://127.0.0.1:{shard.port}/health", headers=headers)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def _finish(self, shard: Shard, state: str, **extra: Any) -> None:
        shard.state = state
        if self._shards.get(shard.spec.shard_id) is shard:
            del self._shards[shard.spec.shard_id]
            self.ledger.drop(shard.spec.shard_id)
        if shard.cgroup is not None:
            KernelLimits.remove(shard.cgroup)
        if self.cache is not None:
            # Used until now: reclaim counts its idle days from here, not from its start.
            for digest in shard.weights_digests:
                self.cache.touch(digest)
        log.info(
            "shard %s %s%s",
            shard.spec.shard_id,
            state,
            f": {extra['detail']}" if extra.get("detail") else "",
        )
        self._emit(shard, **extra)

    async def stop(self, shard_id: str, grace_s: float) -> None:
        """Stop a shard: SIGTERM to its group, SIGKILL after ``grace_s``, then ``stopped``.

        A shard that does not run here is reported ``stopped`` at once, so the
        control plane's view converges either way.
        """
        shard = self._shards.get(shard_id)
        if shard is None:
            self.on_change(status_message(shard_id, STOPPED, detail="Not running on this node."))
            return
        if shard.stop_task is None:
            shard.stop_task = asyncio.create_task(self._stop(shard, grace_s))
        await asyncio.shield(shard.stop_task)

    async def _stop(self, shard: Shard, grace_s: float) -> None:
        never_ready = shard.state == STARTING
        # No process yet: start() is still spawning it, and kills it after.
        code = await terminate(shard.process, grace_s) if shard.process else None
        if shard.watcher is not None:
            shard.watcher.cancel()
        # Stopped before it ever answered (the control plane gave up on it): what it said
        # meanwhile is why, so it goes along as for a failure.
        detail = (
            _with_tail("Stopped before the engine answered /health.", shard.log_path)
            if never_ready and shard.process is not None
            else None
        )
        self._finish(shard, STOPPED, exit_code=code, detail=detail)

    async def adopt(self, grace_s: float = SHUTDOWN_GRACE_S) -> list[str]:
        """Take back the engines an earlier run of this agent started and left running.

        An engine written down (ledger.py) whose pid is still the same process (same start
        time, same boot) and answers /health is watched from now on as if started here
        (health, load, stop with grace, its log), so ``register`` lists it; so is one still
        starting within its startup timeout. Any other of ours is stopped (SIGTERM to its
        group, SIGKILL after ``grace_s``), what a dead one left in its process group is
        killed, and its entry dropped. Returns the shard ids adopted.
        """
        entries = [e for e in self.ledger.entries() if e.spec.shard_id not in self._shards]
        adopted = await asyncio.gather(*(self._adopt_one(e, grace_s) for e in entries))
        return sorted(shard_id for shard_id in adopted if shard_id)

    async def _adopt_one(self, entry: Entry, grace_s: float) -> str | None:
        spec = entry.spec
        now = proc_stat(entry.pid)
        proc = AdoptedProcess.attach(entry) if entry.is_ours(now) else None
        if proc is None:
            self.ledger.drop(spec.shard_id)
            # Its engine is gone; workers it forked may not be (they hold GPU memory). A pid
            # given to another process since says none are: a group's id is not reused.
            mine = now is None and entry.boot == boot_id()
            left = group_members(entry.pid, entry.start_time) if mine else []
            if left:
                kill_group(entry.pid)
            log.info(
                "shard %s: its engine (pid %d) is no longer running%s; forgotten",
                spec.shard_id,
                entry.pid,
                f", killed the {len(left)} processes it left" if left else "",
            )
            return None
        log_path = Path(entry.log_path) if entry.log_path else None
        shard = Shard(
            spec=spec,
            port=entry.port,
            endpoint=self._endpoint(entry.port),
            process=proc,
            log_path=log_path if log_path and log_path.is_file() else None,
            weights_digests=entry.digests(),
            started_at=entry.started_at,
        )
        healthy = False
        for attempt in range(3):  # a busy engine may miss one
            if attempt:
                await asyncio.sleep(HEALTH_POLL_S)
            if healthy := await self._healthy(shard):
                break
        starting = (
            entry.state == STARTING and time.time() < entry.started_at + spec.startup_timeout_s
        )
        if not (healthy or starting):
            log.warning(
                "shard %s: its engine (pid %d) from an earlier run does not answer /health on "
                "port %d; stopping it",
                spec.shard_id,
                entry.pid,
                entry.port,
            )
            await terminate(proc, grace_s)
            self.ledger.drop(spec.shard_id)
            return None
        shard.state = READY if healthy else STARTING
        self._shards[spec.shard_id] = shard
        self._record(shard)
        shard.watcher = asyncio.create_task(self._watch(shard), name=f"watch-{spec.shard_id}")
        self._watch_memory()
        log.info(
            "shard %s: adopted its engine from an earlier run (pid %d, port %d, %s)",
            spec.shard_id,
            entry.pid,
            entry.port,
            shard.state,
        )
        return spec.shard_id

    async def stop_all(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop every engine, each given at most ``grace_s`` before SIGKILL.

        Nothing is started after this is called.
        """
        self._closing = True

        async def one(shard: Shard) -> None:
            if shard.stop_task is None:
                await self.stop(shard.spec.shard_id, grace_s)
                return
            # Already stopping, perhaps with a longer grace: hold it to ours.
            try:
                await asyncio.wait_for(asyncio.shield(shard.stop_task), grace_s)
            except TimeoutError:
                if shard.process is not None:
                    kill_group(shard.process.pid)
                await shard.stop_task

        await asyncio.gather(*(one(s) for s in self.shards()), return_exceptions=True)

    def weights_in_use(self) -> set[str]:
        """Digests of the cached weights this node's shards run on or are fetching."""
        return {d for s in self._shards.values() for d in s.weights_digests}

    def log_lines(self, shard_id: str, lines: int) -> list[str] | None:
        """The last ``lines`` lines of a shard's engine log, cleaned (enginelog.tail_lines),
        whether the engine still runs or not; None when this node has no log of it."""
        return tail_lines(self.state_dir / "logs" / _log_name(shard_id), lines)

    async def engine_loads(self) -> list[dict[str, Any]]:
        """``engine_load`` entries for ready shards whose metrics could be read."""
        ready = [s for s in self.shards() if s.state == READY]
        loads = await asyncio.gather(*(self._engine_load(s) for s in ready))
        kept = {s.spec.shard_id for s in ready}
        for gone in self._cache_windows.keys() - kept:
            del self._cache_windows[gone]
        return [entry for entry in loads if entry is not None]

    async def _engine_load(self, shard: Shard) -> dict[str, Any] | None:
        figures: dict[str, Any] = await self._load_figures(shard)
        if shard.spec.adapter_slots > 0:
            # Absent when it cannot be read: unknown, where [] says it holds none.
            try:
                held = await self.adapters_of(shard).held()
            except AdapterError as exc:
                log.debug("shard %s: adapters unreadable: %s", shard.spec.shard_id, exc)
            else:
                figures["adapters"] = [h.to_message() for h in held]
        return {"shard_id": shard.spec.shard_id, **figures} if figures else None

    async def _load_figures(self, shard: Shard) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {shard.spec.api_key}"} if shard.spec.api_key else {}
        try:
            r = await self._client().get(f"http://127.0.0.1:{shard.port}/metrics", headers=headers)
        except httpx.HTTPError as exc:
            log.debug("shard %s: metrics unreadable: %s", shard.spec.shard_id, exc)
            return {}
        if r.status_code != 200:
            return {}
        figures = engine_load(shard.spec.engine, r.text)
        hits, queries = figures.pop("cache_hits", None), figures.pop("cache_queries", None)
        if hits is not None and queries is not None:
            window = self._cache_windows.setdefault(shard.spec.shard_id, CacheWindow())
            rate = window.add(time.monotonic(), hits, queries)
            if rate is not None:
                figures["prefix_hit_rate"] = round(rate, 4)
        return figures

    def adapters_of(self, shard: Shard) -> EngineAdapters:
        """The adapters of the shard's engine, through its API on this node."""
        return EngineAdapters(
            self._client(),
            engine=shard.spec.engine,
            base_url=f"http://127.0.0.1:{shard.port}",
            api_key=shard.spec.api_key,
            started_with=shard.spec.adapters,
        )

    async def load_adapter(self, msg: dict[str, Any]) -> None:
        """Load the adapter a ``load_adapter`` command names on its shard's engine, and say
        how it went in an ``adapter_status``: loaded, or failed with the engine's words."""
        adapter = msg.get("adapter")
        shard_id, name = _command_ids(
            msg, adapter.get("name") if isinstance(adapter, dict) else None
        )
        if shard_id is None:
            return
        try:
            ref = AdapterRef.from_message(msg.get("adapter"))
            await self.adapters_of(self._ready(shard_id)).load(ref)
        except AdapterError as exc:
            log.warning("shard %s: adapter %s not loaded: %s", shard_id, name, exc)
            self.on_change(adapter_status(shard_id, name, FAILED, str(exc)))
            return
        log.info("shard %s: adapter %s loaded", shard_id, name)
        self.on_change(adapter_status(shard_id, name, "loaded"))

    async def unload_adapter(self, msg: dict[str, Any]) -> None:
        """Unload the adapter an ``unload_adapter`` command names from its shard's engine, and
        say how it went in an ``adapter_status``: unloaded, or failed with the engine's words."""
        shard_id, name = _command_ids(msg, msg.get("name"))
        if shard_id is None:
            return
        try:
            await self.adapters_of(self._ready(shard_id)).unload(name)
        except AdapterError as exc:
            log.warning("shard %s: adapter %s not unloaded: %s", shard_id, name, exc)
            self.on_change(adapter_status(shard_id, name, FAILED, str(exc)))
            return
        log.info("shard %s: adapter %s unloaded", shard_id, name)
        self.on_change(adapter_status(shard_id, name, "unloaded"))

    def _ready(self, shard_id: str) -> Shard:
        """The shard, ready; raises AdapterError saying why it is not."""
        shard = self._shards.get(shard_id)
        if shard is None:
            raise AdapterError(f"Shard {shard_id} does not run on this node.")
        if shard.state != READY or shard.port is None:
            raise AdapterError(f"Shard {shard_id} is {shard.state}, not ready.")
        if shard.spec.adapter_slots <= 0:
            raise AdapterError(
                f"Shard {shard_id}'s profile {shard.spec.profile_name or '(unnamed)'} serves "
                "no adapters (0 adapter slots)."
            )
        return shard

    async def close(self) -> None:
        """Stop watching the engines' memory; release the HTTP client."""
        if self._memory_task is not None:
            self._memory_task.cancel()
            self._memory_task = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def _command_ids(msg: dict[str, Any], name: Any) -> tuple[str | None, str]:
    """An adapter command's shard and adapter name; no shard id when it lacks either (an
    answer could name neither, so it is logged instead)."""
    shard_id = msg.get("shard_id")
    if not (isinstance(shard_id, str) and shard_id and isinstance(name, str) and name):
        log.warning("%s without a shard_id or an adapter name: %r", msg.get("type"), msg)
        return None, ""
    return shard_id, name


def _spawn_failure(spec: ShardSpec, exc: Exception) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"The {spec.engine} engine is not installed on this node ({exc.filename} not found)."
    if isinstance(exc, EngineError):
        return str(exc)
    return f"The engine could not be started: {exc}."
