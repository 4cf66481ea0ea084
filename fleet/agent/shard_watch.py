"""Watching the shards' engines: /health until ready, then their exit, told by its cause;
and their memory against their reservations, stopping one that outgrew its own."""

from __future__ import annotations

import asyncio
import time

import httpx

from fleet.agent.contain import OUTGROWN_GRACE_S, reservation
from fleet.agent.ledger import kill_group, running, terminate
from fleet.agent.shards import (
    FAILED,
    HEALTH_POLL_S,
    READY,
    STARTING,
    Shard,
    ShardTable,
    log,
    with_tail,
)
from fleet.domain.causes import ended_said
from fleet.domain.containment import GB, Limits, judge, outgrown_said


class ShardWatch(ShardTable):
    """Watches each engine from its spawn (or adoption) to its end."""

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
                    detail=with_tail(
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
            detail = with_tail(said, shard.log_path)
            self._finish(shard, FAILED, exit_code=code, detail=detail, stopped_for="memory")
            return
        # An adopted engine is not our child: how it ended is not known (ended_said says so).
        detail = with_tail(ended_said(code), shard.log_path)
        self._finish(shard, FAILED, exit_code=code, detail=detail)

    async def _healthy(self, shard: Shard) -> bool:
        headers = {"Authorization": f"Bearer {shard.spec.api_key}"} if shard.spec.api_key else {}
        try:
            r = await self._client().get(f"http://127.0.0.1:{shard.port}/health", headers=headers)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

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
            detail=with_tail(said, shard.log_path),
            stopped_for="memory",
        )
