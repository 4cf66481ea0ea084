"""The LoRA adapters' commands: ``load_adapter`` and ``unload_adapter`` carried out on a
ready shard's engine, each answered with an ``adapter_status``.

An adapter whose source the mirror holds (``hf://org/repo``) comes with the mirror's
``weights``, as a model's start does: its files are fetched into the weight cache first
(resumed, checked, assembled as a folder: cache.py) and the engine is given that folder."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from fleet.agent.adapters import (
    AdapterError,
    AdapterRef,
    EngineAdapters,
    adapter_status,
    format_refusal,
    runtime_loading,
)
from fleet.agent.cache import CacheError
from fleet.agent.shards import FAILED, READY, Shard, ShardTable, log
from mirror.domain.refs import FolderRef, RefError, weights_from_message


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
            await self._load(shard_id, msg)
        except AdapterError as exc:
            log.warning("shard %s: adapter %s not loaded: %s", shard_id, name, exc)
            self.on_change(adapter_status(shard_id, name, FAILED, str(exc)))
            return
        log.info("shard %s: adapter %s loaded", shard_id, name)
        self.on_change(adapter_status(shard_id, name, "loaded"))

    async def _load(self, shard_id: str, msg: dict[str, Any]) -> None:
        ref = AdapterRef.from_message(msg.get("adapter"))
        shard = self._ready(shard_id)
        ref = await self._fetched(shard, ref, msg.get("weights"))
        try:
            await self.adapters_of(shard).load(ref)
        except AdapterError:
            self._release(shard, ref.name)  # not held: its files are not in use
            raise

    async def unload_adapter(self, msg: dict[str, Any]) -> None:
        """Unload the adapter an ``unload_adapter`` command names from its shard's engine, and
        say how it went in an ``adapter_status``: unloaded, or failed with the engine's words."""
        shard_id, name = _command_ids(msg, msg.get("name"))
        if shard_id is None:
            return
        try:
            shard = self._ready(shard_id)
            await self.adapters_of(shard).unload(name)
            self._release(shard, name)
        except AdapterError as exc:
            log.warning("shard %s: adapter %s not unloaded: %s", shard_id, name, exc)
            self.on_change(adapter_status(shard_id, name, FAILED, str(exc)))
            return
        log.info("shard %s: adapter %s unloaded", shard_id, name)
        self.on_change(adapter_status(shard_id, name, "unloaded"))

    async def _fetched(self, shard: Shard, ref: AdapterRef, raw: Any) -> AdapterRef:
        """``ref`` with its path the cached copy of the mirror's ``weights`` for it (a folder,
        or one file), fetched first where they are not held; ``ref`` as it is when the
        command carries no weights, or when its engine would refuse it anyway (nothing is
        fetched for a load that cannot be). Raises AdapterError with the cache's sentence."""
        if raw is None or format_refusal(shard.spec.engine, ref):
            return ref
        if not runtime_loading(shard.spec.engine):
            return ref  # llama-server takes adapters at its start only: load() says so
        if self.cache is None:
            raise AdapterError(
                f"This agent keeps no weight cache (--cache-dir): the adapter {ref.name}'s "
                "weights cannot be fetched from the mirror."
            )
        try:
            weights = weights_from_message(raw)
        except RefError as exc:
            raise AdapterError(f"The adapter {ref.name}'s weights are not usable: {exc}") from None
        # In use from now: reclaim leaves them alone while they come and while they are held.
        shard.adapter_digests[ref.name] = weights.digests
        loop = asyncio.get_running_loop()

        def progress(done: int, total: int | None) -> None:
            # Called from the fetch's thread; engine_load says it (shard_reports.py).
            loop.call_soon_threadsafe(shard.adapter_fetches.__setitem__, ref.name, (done, total))

        shard.adapter_fetches[ref.name] = (0, weights.size)
        try:
            if isinstance(weights, FolderRef):
                path = await self.cache.ensure_folder(
                    weights, source=ref.path, on_progress=progress
                )
            else:
                path = await self.cache.ensure(weights, source=ref.path, on_progress=progress)
        except CacheError as exc:
            shard.adapter_digests.pop(ref.name, None)
            raise AdapterError(
                f"The adapter {ref.name}'s weights could not be put in this node's cache: {exc}"
            ) from None
        finally:
            # Its progress callbacks are queued before the fetch ends: taken out after them.
            loop.call_soon(shard.adapter_fetches.pop, ref.name, None)
        log.info(
            "shard %s: adapter %s's weights are in the cache at %s",
            shard.spec.shard_id,
            ref.name,
            path,
        )
        return replace(ref, path=str(path))

    def _release(self, shard: Shard, name: str) -> None:
        """The adapter ``name`` is held no more: its cached files are used until now, and
        reclaim may take them when nothing else uses them."""
        digests = shard.adapter_digests.pop(name, ())
        if self.cache is not None:
            for digest in digests:
                self.cache.touch(digest)

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
