"""Engine processes: one per shard, started, watched and stopped.

``Supervisor`` is made of parts, each in a module of its own: the table of shards and
what is said of them (shards.py), their processes' start and stop (shard_process.py),
watching their health and memory (shard_watch.py), adopting an earlier run's engines
(shard_adoption.py), the adapters' commands (shard_adapters.py) and what it reports
(shard_reports.py). Callers import it, and the names below, from here.
"""

from __future__ import annotations

from fleet.agent.shard_adoption import ShardAdoption
from fleet.agent.shard_process import ShardProcesses
from fleet.agent.shard_reports import ShardReports
from fleet.agent.shards import (
    FAILED,
    FETCHING,
    HEALTH_POLL_S,
    READY,
    SHUTDOWN_GRACE_S,
    STARTING,
    STOPPED,
    Shard,
    log_tail,
    status_message,
)

__all__ = [
    "FAILED",
    "FETCHING",
    "HEALTH_POLL_S",
    "READY",
    "SHUTDOWN_GRACE_S",
    "STARTING",
    "STOPPED",
    "Shard",
    "Supervisor",
    "log_tail",
    "status_message",
]


class Supervisor(ShardProcesses, ShardAdoption, ShardReports):
    """Starts, watches and stops the engines of this node's shards."""

    async def close(self) -> None:
        """Stop watching the engines' memory; release the HTTP client."""
        if self._memory_task is not None:
            self._memory_task.cancel()
            self._memory_task = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None
