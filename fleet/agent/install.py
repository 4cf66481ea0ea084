"""Installing engine builds from the mirror: ``<state-dir>/engines/<engine>/<version>/``.

When a shard's engine is not on this node (no ``--llama-server``, none on PATH) and its
``start_shard`` carries ``engine_build``, the build is fetched from the mirror with the
code that fetches weights (mirror/transfer.py: resumed after a cut, its SHA-256 checked,
nothing kept that does not match), made executable, put in place by one rename, and run
with ``--version`` before any shard starts on it. One install per engine however many
shards ask; a failed one stays failed, with its sentence, until the agent restarts or
the mirror offers another build. Where each install stands goes in ``register`` and
heartbeats (``engine_installs``). vLLM is installed the same way but with pip, into an
environment of its own (fleet/agent/install_pip.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.agent.discovery import parse_version_output, run_version
from fleet.agent.engines import engine_binaries, use_binary
from fleet.agent.install_pip import (
    PIP_ENGINES,
    PIP_TIMEOUT_S,
    PROGRAMS as PIP_PROGRAMS,
    PipError,
    PipRef,
    pip_install,
)
from mirror.domain.platforms import BINARY_ENGINES, PROGRAMS, version_folder
from mirror.transfer import TransferError, fetch_from_mirror

# What an install calls as bytes arrive: (done, total or None).
Progress = Callable[[int, int | None], None]

log = logging.getLogger(__name__)

INSTALLING, INSTALLED, FAILED = "installing", "installed", "failed"
MANIFEST = "build.json"
PROBE_TIMEOUT_S = 30.0
# `vllm --version` imports torch first.
PIP_PROBE_TIMEOUT_S = 180.0
# Each engine's program in its install folder.
INSTALLED_PROGRAMS = {**PROGRAMS, **PIP_PROGRAMS}
FETCH_TRIES = 3
RETRY_AFTER_S = 0.5
# Left free beside the binary, as the weight cache leaves room for the engine's own files.
DISK_MARGIN_BYTES = 256 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class InstallError(Exception):
    """An engine that could not be installed; the message is a sentence.

    ``retry``: whether asking again could help (a cut connection), unlike a digest that
    does not match or a binary that does not run here.
    """

    def __init__(self, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class BuildRef:
    """``start_shard``'s ``engine_build``: the binary a node lacking the engine installs."""

    engine: str
    version: str
    sha256: str
    size: int
    url: str

    @property
    def name(self) -> str:
        return f"{self.engine} {self.version}"

    @property
    def key(self) -> str:
        """What makes two asks the same install: the binary's digest."""
        return self.sha256

    @classmethod
    def from_message(cls, raw: Any) -> BuildRef:
        """Read ``engine_build``; raises InstallError when it is unusable."""
        if not isinstance(raw, dict):
            raise InstallError("start_shard's engine_build is not an object.")
        engine, version = raw.get("engine"), raw.get("version")
        digest, size, url = raw.get("sha256"), raw.get("size"), raw.get("url")
        if engine not in BINARY_ENGINES:
            raise InstallError("start_shard's engine_build names no engine this agent installs.")
        if not isinstance(version, str) or not version.strip():
            raise InstallError("start_shard's engine_build carries no version.")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise InstallError("start_shard's engine_build carries no sha256 digest.")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise InstallError("start_shard's engine_build carries no size.")
        if not isinstance(url, str) or not url:
            raise InstallError("start_shard's engine_build carries no url.")
        return cls(engine, version.strip(), digest, size, url)


def engine_ref(raw: Any) -> BuildRef | PipRef:
    """``engine_build`` read as what installs it: a binary from the mirror, or a pip
    requirement (vLLM); raises InstallError when it is unusable."""
    if isinstance(raw, dict) and raw.get("engine") in PIP_ENGINES:
        try:
            return PipRef.from_message(raw)
        except PipError as exc:
            raise InstallError(str(exc)) from None
    return BuildRef.from_message(raw)


@dataclass
class Install:
    """Where installing one engine stands here."""

    engine: str
    version: str
    # What identifies the build: its digest, or its pip requirement and index.
    key: str
    state: str
    detail: str = ""
    path: Path | None = None
    # What the installed program says its version is.
    said: str = ""
    # A failure that a later shard's ask tries again (resuming what was fetched).
    retry: bool = False

    def report(self) -> dict[str, str]:
        out = {"engine": self.engine, "version": self.version, "state": self.state}
        if self.detail:
            out["detail"] = self.detail[:2000]
        return out


def missing(engine: str) -> bool:
    """Whether this node has no program for ``engine`` (given, on PATH, or installed)."""
    program = engine_binaries().get(engine)
    return program is None or shutil.which(program) is None


class Installer:
    """Installs engine builds from the mirror under ``root`` and says where each stands."""

    def __init__(
        self,
        root: Path,
        *,
        server: str,
        bearer: Callable[[], str],
        pip_timeout_s: float = PIP_TIMEOUT_S,
    ) -> None:
        self.root = root
        self.server = server
        # The node's credential as it is when a fetch starts (fleet/agent/credentials.py).
        self.bearer = bearer
        self.pip_timeout_s = pip_timeout_s
        self._installs: dict[str, Install] = {}
        self._tasks: dict[str, asyncio.Task[Path]] = {}

    def reports(self) -> list[dict[str, str]]:
        """``engine_installs`` for ``register`` and heartbeats."""
        return [i.report() for i in sorted(self._installs.values(), key=lambda i: i.engine)]

    def engines(self) -> dict[str, str]:
        """The engines installed here and the versions they said they are."""
        return {
            e: i.said or i.version
            for e, i in self._installs.items()
            if i.state == INSTALLED and i.path
        }

    def adopt(self) -> Path | None:
        """Use what an earlier run installed, for each engine this node has no program of.

        The newest install of each is used; returns the last one taken, if any.
        """
        taken = None
        for engine in sorted(BINARY_ENGINES | PIP_ENGINES):
            if not missing(engine):
                continue
            found = []
            for manifest in (self.root / engine).glob(f"*/{MANIFEST}"):
                try:
                    meta = json.loads(manifest.read_text())
                except (OSError, ValueError):
                    continue
                binary = manifest.parent / INSTALLED_PROGRAMS[engine]
                if isinstance(meta, dict) and binary.is_file() and os.access(binary, os.X_OK):
                    found.append((manifest.stat().st_mtime, binary, meta))
            if not found:
                continue
            _, binary, meta = max(found, key=lambda f: f[0])
            use_binary(engine, str(binary))
            self._installs[engine] = Install(
                engine=engine,
                version=str(meta.get("version") or binary.parent.name),
                key=str(meta.get("key") or meta.get("sha256") or ""),
                state=INSTALLED,
                path=binary,
            )
            log.info("using %s installed earlier: %s", engine, binary)
            taken = binary
        return taken

    async def ensure(
        self,
        ref: BuildRef | PipRef,
        *,
        on_progress: Progress | None = None,
    ) -> Path:
        """The installed program for ``ref``'s engine, installing it first; raises InstallError.

        Shards asking while it installs wait on the one install.
        """
        task = self._tasks.get(ref.engine)
        if task is None:
            done = self._installs.get(ref.engine)
            if done is not None and done.key == ref.key:
                if done.state == INSTALLED and done.path is not None:
                    return done.path
                if done.state == FAILED and not done.retry:
                    raise InstallError(done.detail)
            # Said at once, so a heartbeat sent before the fetch begins says so.
            self._installs[ref.engine] = Install(ref.engine, ref.version, ref.key, INSTALLING)
            task = asyncio.ensure_future(self._install(ref, on_progress))
            self._tasks[ref.engine] = task
            task.add_done_callback(lambda _t: self._tasks.pop(ref.engine, None))
        return await asyncio.shield(task)

    async def _install(self, ref: BuildRef | PipRef, on_progress: Progress | None) -> Path:
        state = self._installs[ref.engine]
        try:
            if isinstance(ref, PipRef):
                log.info("installing %s with pip (%s)", ref.name, ref.requirement)
                binary = await asyncio.to_thread(self._pip_install, ref)
                version = await asyncio.to_thread(_probe, binary, ref, PIP_PROBE_TIMEOUT_S)
            else:
                log.info("installing %s (%d bytes) from the mirror", ref.name, ref.size)
                binary = await asyncio.to_thread(self._install_sync, ref, on_progress)
                version = await asyncio.to_thread(_probe, binary, ref)
        except OSError as exc:
            # A disk that fails (full, read-only) ends the install with a sentence too, rather
            # than leaving it "installing" for ever; trying again may help once it is mended.
            error = InstallError(
                f"{ref.name} could not be installed in {self.root}: {exc.strerror or exc}.",
                retry=True,
            )
            state.state, state.detail, state.retry = FAILED, str(error), True
            log.warning("installing %s failed: %s", ref.name, error)
            raise error from None
        except InstallError as exc:
            state.state, state.detail, state.retry = FAILED, str(exc), exc.retry
            log.warning("installing %s failed: %s", ref.name, exc)
            raise
        use_binary(ref.engine, str(binary))
        state.state, state.path, state.said = INSTALLED, binary, version
        log.info("installed %s in %s; it says it is %s", ref.name, binary.parent, version)
        return binary

    def _pip_install(self, ref: PipRef) -> Path:
        try:
            return pip_install(self.root, ref, timeout_s=self.pip_timeout_s)
        except PipError as exc:
            # Kept, as a build that does not run is: placement stops sending this version
            # here, and a new pin (or the agent restarted) tries afresh.
            raise InstallError(str(exc)) from None
        except OSError as exc:
            raise InstallError(
                f"{ref.name} could not be installed in {self.root}: {exc.strerror or exc}."
            ) from None

    def _install_sync(self, ref: BuildRef, on_progress: Progress | None) -> Path:
        folder = self.root / ref.engine / version_folder(ref.version)
        binary = folder / PROGRAMS[ref.engine]
        if _installed(folder, ref.sha256):
            return binary
        downloads = self.root / ".downloads"
        dest, part = downloads / ref.sha256, downloads / f"{ref.sha256}.part"
        if not dest.exists():
            self._fetch(ref, dest, part, on_progress)
        # Put together beside its final name, then renamed into place in one step, so a
        # shard never starts on half an install.
        staging = folder.with_name(f".{folder.name}.{os.getpid()}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        os.replace(dest, staging / PROGRAMS[ref.engine])
        (staging / PROGRAMS[ref.engine]).chmod(0o755)
        manifest = {"engine": ref.engine, "version": ref.version, "sha256": ref.sha256}
        (staging / MANIFEST).write_text(json.dumps(manifest) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
        return binary

    def _fetch(self, ref: BuildRef, dest: Path, part: Path, on_progress: Progress | None) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        free = shutil.disk_usage(dest.parent).free
        if free < ref.size - have + DISK_MARGIN_BYTES:
            raise InstallError(
                f"{ref.name} needs {(ref.size - have) / 1e6:.1f} MB and this node has "
                f"{free / 1e6:.1f} MB free in {self.root}; nothing was fetched."
            )
        for attempt in range(1, FETCH_TRIES + 1):
            try:
                fetch_from_mirror(
                    self.server,
                    self.bearer(),
                    ref.url,
                    dest=dest,
                    part=part,
                    sha256=ref.sha256,
                    size=ref.size,
                    what=ref.name,
                    on_progress=on_progress,
                )
                return
            except TransferError as exc:
                if not exc.retry or attempt == FETCH_TRIES:
                    raise InstallError(
                        f"{ref.name} could not be fetched from the mirror: {exc}",
                        retry=exc.retry,
                    ) from None
                # A cut: the next try asks for the rest of what the part holds.
                log.warning("fetching %s, try %d: %s; resuming", ref.name, attempt, exc)
                time.sleep(RETRY_AFTER_S * attempt)


def _installed(folder: Path, sha256: str) -> bool:
    try:
        meta = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("sha256") == sha256


def _probe(binary: Path, ref: BuildRef | PipRef, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Run the installed program with ``--version``, as discovery probes engines; the version
    it says, or InstallError when it does not run here."""
    try:
        done = run_version(binary, timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(
            f"{ref.name} was installed but does not run on this node: {exc}."
        ) from None
    said = parse_version_output(done.stdout + "\n" + done.stderr)
    if done.returncode != 0:
        raise InstallError(
            f"{ref.name} was installed but `{binary.name} --version` exited "
            f"{done.returncode}: {said or '(no output)'}"
        )
    return said or "unknown"
