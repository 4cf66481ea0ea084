"""The LoRA adapters' commands: ``load_adapter`` and ``unload_adapter`` carried out on a
ready shard's engine, each answered with an ``adapter_status``."""

from __future__ import annotations

from typing import Any

from fleet.agent.adapters import AdapterError, AdapterRef, EngineAdapters, adapter_status
from fleet.agent.shards import FAILED, READY, Shard, ShardTable, log


class AdapterCommands(ShardTable):
    """Loads and unloads adapters on the shards' engines."""

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


def _command_ids(msg: dict[str, Any], name: Any) -> tuple[str | None, str]:
    """An adapter command's shard and adapter name; no shard id when it lacks either (an
    answer could name neither, so it is logged instead)."""
    shard_id = msg.get("shard_id")
    if not (isinstance(shard_id, str) and shard_id and isinstance(name, str) and name):
        log.warning("%s without a shard_id or an adapter name: %r", msg.get("type"), msg)
        return None, ""
    return shard_id, name
