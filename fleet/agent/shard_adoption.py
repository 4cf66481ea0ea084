"""Adopting the engines an earlier run of this agent left running (written down in the
state folder, ledger.py), so an agent that was killed or upgraded takes them back rather
than leaving them orphans on their GPUs; and writing them all down before an upgrade."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fleet.agent.ledger import (
    AdoptedProcess,
    Entry,
    boot_id,
    group_members,
    kill_group,
    proc_stat,
    terminate,
)
from fleet.agent.shard_watch import ShardWatch
from fleet.agent.shards import HEALTH_POLL_S, READY, SHUTDOWN_GRACE_S, STARTING, Shard, log


class ShardAdoption(ShardWatch):
    """Takes back the engines of an earlier run."""

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

    def ledger_flush(self) -> None:
        """Write down every engine as it is now: this agent is about to be replaced by its
        next release (fleet/agent/upgrade.py), which adopts them."""
        for shard in list(self._shards.values()):
            self._record(shard)
