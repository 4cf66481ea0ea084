"""What the supervisor reports of its shards besides their states: their engines' load
(with the adapters they hold), process groups, weights in use, and engine logs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from fleet.agent.adapters import AdapterError
from fleet.agent.enginelog import tail_lines
from fleet.agent.engines import CacheWindow, engine_load
from fleet.agent.ledger import running
from fleet.agent.shard_adapters import AdapterCommands
from fleet.agent.shards import READY, Shard, log, log_name


class ShardReports(AdapterCommands):
    """Reads the shards' engines for the heartbeat, the load report and the logs."""

    def process_groups(self) -> dict[str, int]:
        """Each running shard's engine pid, which is also its process group."""
        return {
            s.spec.shard_id: s.process.pid
            for s in self._shards.values()
            if s.process is not None and running(s.process)
        }

    def weights_in_use(self) -> set[str]:
        """Digests of the cached weights this node's shards run on or are fetching, and of
        the adapters their engines hold or are fetching."""
        return {d for s in self._shards.values() for d in s.digests()}

    def log_lines(self, shard_id: str, lines: int) -> list[str] | None:
        """The last ``lines`` lines of a shard's engine log, cleaned (enginelog.tail_lines),
        whether the engine still runs or not; None when this node has no log of it."""
        return tail_lines(self.state_dir / "logs" / log_name(shard_id), lines)

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
            if shard.adapter_fetches:
                figures["adapters_fetching"] = [
                    {"name": name, "done": done, "total": total}
                    for name, (done, total) in sorted(shard.adapter_fetches.items())
                ]
        if figures and shard.slots is not None:
            figures["slots"] = shard.slots
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
