"""A shard's engine process from a ``start_shard`` to its end: its engine installed and
its weights fetched where asked, spawned in a process group (and cgroup) of its own with
a port and a log, stopped with a grace."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleet.agent.cache import CacheError
from fleet.agent.contain import join_cgroup
from fleet.agent.engines import EngineError, NodeContext, ShardSpec, build_command, engine_slots
from fleet.agent.install import InstallError, engine_ref, missing
from fleet.agent.ledger import kill_group, terminate
from fleet.agent.ports import choose_port
from fleet.agent.shard_watch import ShardWatch
from fleet.agent.shards import (
    FAILED,
    FETCHING,
    SHUTDOWN_GRACE_S,
    STARTING,
    STOPPED,
    Shard,
    log,
    log_name,
    status_message,
    with_tail,
)
from fleet.domain.containment import GB
from mirror.domain.refs import FolderRef, RefError, weights_from_message

# Variables of the agent's own that an engine must not inherit: the join
# token would let any engine (running a model's own code) pose as the node.
_WITHHELD_ENV = ("LLMGW_TOKEN", "LLAMA_API_KEY", "VLLM_API_KEY", "LLMGW_ENGINE_API_KEY")


class ShardProcesses(ShardWatch):
    """Starts and stops the shards' engines."""

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
            sim_power_file=str(self.sim_power_file) if self.sim_power_file else None,
        )
        command = build_command(spec, node)
        shard.slots = engine_slots(spec.engine, command.argv)
        shard.port = port
        shard.endpoint = self._endpoint(port)
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        shard.log_path = logs / log_name(spec.shard_id)
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
            with_tail("Stopped before the engine answered /health.", shard.log_path)
            if never_ready and shard.process is not None
            else None
        )
        self._finish(shard, STOPPED, exit_code=code, detail=detail)

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


def _spawn_failure(spec: ShardSpec, exc: Exception) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"The {spec.engine} engine is not installed on this node ({exc.filename} not found)."
    if isinstance(exc, EngineError):
        return str(exc)
    return f"The engine could not be started: {exc}."
