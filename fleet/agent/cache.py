"""The agent's weight cache: files fetched from the mirror, kept by digest.

``<cache-dir>/sha256/<digest>`` is a file whose bytes were hashed on the way
in and matched; nothing else is ever put there. A fetch writes to
``<cache-dir>/partial/<digest>.part`` and resumes from it after a cut or an
agent restart. Two shards that want the same file wait on one fetch. Before a
fetch the free disk is checked against what is still to come, so a node short
of room says so with the figures rather than filling its disk.

Beside each file, ``<digest>.json`` names the sources it was fetched for and
when a shard last used it: what ``register`` reports and reclaim reads.

A model that is a folder (a Hugging Face repository) is fetched file by file
into the same store, then assembled as ``<cache-dir>/folders/<key>/``: a link
to each file under its path in the folder (a hard link, a symlink where the
disk has none), beside ``<key>.json`` listing the files. The engine is given
that folder. Deleting a file deletes the folders it is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mirror.domain.refs import FolderRef, RefError, WeightsRef, safe_path
from mirror.transfer import TransferError, fetch_from_mirror, mirror_url

log = logging.getLogger(__name__)

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# Left free on the cache's disk beyond the file itself: logs, the engine's own files.
DISK_MARGIN_BYTES = 1 << 30
GB = 1 << 30


class CacheError(Exception):
    """Weights that could not be put in the cache; the message is a sentence."""


class WeightCache:
    """Fetches weights from the mirror into ``root`` and says what it holds."""

    def __init__(self, root: Path, *, server: str, bearer: Callable[[], str]) -> None:
        self.root = root
        self.server = server
        # The node's credential as it is when a fetch starts (fleet/agent/credentials.py).
        self.bearer = bearer
        self._fetches: dict[str, asyncio.Task[Path]] = {}

    def path(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256

    def _part(self, sha256: str) -> Path:
        return self.root / "partial" / f"{sha256}.part"

    def _meta_path(self, sha256: str) -> Path:
        return self.root / "sha256" / f"{sha256}.json"

    def held(self) -> list[dict[str, Any]]:
        """What ``register`` and heartbeats report: each file's digest, size and sources."""
        out: list[dict[str, Any]] = []
        folder = self.root / "sha256"
        if not folder.is_dir():
            return out
        for p in sorted(folder.iterdir()):
            if not _HEX64.match(p.name):
                continue
            meta = self._meta(p.name)
            entry: dict[str, Any] = {"sha256": p.name, "size": p.stat().st_size}
            sources = meta.get("sources") or []
            if sources:
                entry["source"] = sources[0]
            if isinstance(meta.get("used_at"), int | float):
                # When a shard last started on it: what reclaim goes by.
                entry["used_at"] = round(float(meta["used_at"]), 1)
            out.append(entry)
        return out

    def sources(self) -> dict[str, list[str]]:
        """Each held digest's sources, for a register's ``weights``."""
        return {w["sha256"]: self._meta(w["sha256"]).get("sources") or [] for w in self.held()}

    def _meta(self, sha256: str) -> dict[str, Any]:
        try:
            data = json.loads(self._meta_path(sha256).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def touch(self, sha256: str) -> None:
        """Note that a shard used this file until now (it just ended)."""
        if self.path(sha256).exists():
            with contextlib.suppress(OSError):
                self._note(sha256, None)

    def _note(self, sha256: str, source: str | None) -> None:
        meta = self._meta(sha256)
        sources = [s for s in meta.get("sources") or [] if isinstance(s, str)]
        if source and source not in sources:
            sources.append(source)
        meta.update(sources=sources[-8:], used_at=time.time())
        tmp = self._meta_path(sha256).with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        tmp.replace(self._meta_path(sha256))

    async def ensure(
        self,
        ref: WeightsRef,
        *,
        source: str | None = None,
        on_progress: Callable[[int, int | None], None] | None = None,
    ) -> Path:
        """The cached file for ``ref``, fetched first if it is not held; raises CacheError,
        a disk that fails (full, read-only, a file where a folder should be) included."""
        try:
            if self._held(ref):
                self._note(ref.sha256, source)
                return self.path(ref.sha256)
            task = self._fetches.get(ref.sha256)
            if task is None:
                task = asyncio.ensure_future(self._fetch(ref, on_progress))
                self._fetches[ref.sha256] = task
                task.add_done_callback(lambda _t: self._fetches.pop(ref.sha256, None))
            got = await asyncio.shield(task)
            self._note(ref.sha256, source)
            return got
        except OSError as exc:
            raise CacheError(
                f"The weights {ref.file} could not be put in the cache at {self.root}: "
                f"{exc.strerror or exc}."
            ) from None

    async def _fetch(
        self, ref: WeightsRef, on_progress: Callable[[int, int | None], None] | None
    ) -> Path:
        part = self._part(ref.sha256)
        have = part.stat().st_size if part.exists() else 0
        self.root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.root).free
        need = max(ref.size - have, 0) + DISK_MARGIN_BYTES
        if free < need:
            raise CacheError(
                f"This node has {free / GB:.1f} GB free in {self.root}; {ref.file} needs "
                f"{(ref.size - have) / GB:.1f} GB more and {DISK_MARGIN_BYTES / GB:.0f} GB is kept "
                "free: nothing was fetched."
            )
        url = mirror_url(self.server, ref.url)
        log.info(
            "fetching %s (%d bytes) from %s%s",
            ref.file,
            ref.size,
            url,
            f", resuming at {have}" if have else "",
        )
        try:
            got = await asyncio.to_thread(
                fetch_from_mirror,
                self.server,
                self.bearer(),
                ref.url,
                dest=self.path(ref.sha256),
                part=part,
                sha256=ref.sha256,
                size=ref.size,
                what=ref.file,
                on_progress=on_progress,
            )
        except TransferError as exc:
            raise CacheError(
                f"The weights {ref.file} could not be fetched from the mirror: {exc}"
            ) from None
        log.info(
            "fetched %s: sha256 %s, %d bytes (resumed from %d)",
            ref.file,
            got.sha256,
            got.size,
            got.resumed_from,
        )
        return self.path(ref.sha256)

    def delete(self, digests: list[str], *, in_use: set[str]) -> list[str]:
        """Delete held files not ``in_use``, and the folders they are in; returns the digests
        deleted."""
        gone = []
        for digest in digests:
            if not _HEX64.match(digest) or digest in in_use or digest in self._fetches:
                continue
            path = self.path(digest)
            if path.exists():
                path.unlink()
                self._meta_path(digest).unlink(missing_ok=True)
                gone.append(digest)
        if gone:
            self._drop_folders(set(gone))
        return gone

    def folder_path(self, folder: FolderRef) -> Path:
        return self.root / "folders" / folder.key

    async def ensure_folder(
        self,
        folder: FolderRef,
        *,
        source: str | None = None,
        on_progress: Callable[[int, int | None], None] | None = None,
    ) -> Path:
        """The assembled folder for ``folder``, each file fetched first where it is not held
        (one fetch per digest, resumed from its part); raises CacheError with a sentence: a
        path that would leave the folder, a disk short of what is still to come, a file that
        fails."""
        try:
            for f in folder.files:
                safe_path(f.file)
        except RefError as exc:
            raise CacheError(f"{folder.name} cannot be assembled: {exc}") from None
        wanted = {f.sha256: f for f in folder.files}
        missing = [f for f in wanted.values() if not self._held(f)]
        self._room_for(folder, missing)
        total = sum(f.size for f in wanted.values())
        done = total - sum(f.size for f in missing)
        for f in missing:

            def progress(d: int, _t: int | None, base: int = done) -> None:
                if on_progress is not None:
                    on_progress(base + d, total)

            await self.ensure(f, source=source, on_progress=progress)
            done += f.size
        for f in wanted.values():
            if f not in missing:
                self._note(f.sha256, source)  # held already: used from now
        try:
            return self._assemble(folder)
        except OSError as exc:
            raise CacheError(
                f"{folder.name} could not be assembled in {self.root / 'folders'}: "
                f"{exc.strerror or exc}."
            ) from None

    def _held(self, ref: WeightsRef) -> bool:
        path = self.path(ref.sha256)
        return path.exists() and path.stat().st_size == ref.size

    def _room_for(self, folder: FolderRef, missing: list[WeightsRef]) -> None:
        """Refuse, before any fetch, a folder whose files still to come do not fit."""
        if not missing:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        have = sum(
            self._part(f.sha256).stat().st_size for f in missing if self._part(f.sha256).exists()
        )
        more = max(sum(f.size for f in missing) - have, 0)
        free = shutil.disk_usage(self.root).free
        if free < more + DISK_MARGIN_BYTES:
            raise CacheError(
                f"This node has {free / GB:.1f} GB free in {self.root}; {folder.name} needs "
                f"{more / GB:.1f} GB more ({len(missing)} of its {len(folder.files)} files) and "
                f"{DISK_MARGIN_BYTES / GB:.0f} GB is kept free: nothing was fetched."
            )

    def _assemble(self, folder: FolderRef) -> Path:
        """Link each held file under its path in a new folder, then move it into place at
        once: an engine never sees a folder half made."""
        final = self.folder_path(folder)
        if final.is_dir():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{final.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for f in folder.files:
            target = tmp / f.file
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                target.hardlink_to(self.path(f.sha256))
            except OSError:
                target.symlink_to(self.path(f.sha256))
        manifest = {f.file: f.sha256 for f in folder.files}
        final.with_suffix(".json").write_text(json.dumps({"files": manifest}))
        tmp.rename(final)
        return final

    def _drop_folders(self, digests: set[str]) -> None:
        """Remove every assembled folder that holds one of ``digests``."""
        root = self.root / "folders"
        if not root.is_dir():
            return
        for manifest in root.glob("*.json"):
            try:
                files = json.loads(manifest.read_text()).get("files") or {}
            except (OSError, ValueError, AttributeError):
                files = {}
            if digests & set(files.values()) or not files:
                shutil.rmtree(manifest.with_suffix(""), ignore_errors=True)
                manifest.unlink(missing_ok=True)
