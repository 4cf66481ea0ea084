"""The mirror's worker: claims a file that is due, fetches it, and says how it went.

Embedded, a thread of `llmgw serve` runs it, woken when weights are added and
every few seconds for retries. In production a Celery worker that holds
LLMGW_MIRROR_DIR runs ``mirror.tasks.fetch`` (queue ``mirror``), sent when
weights are added and scheduled by beat. Either way the claim on a file is a
compare-and-set with a lease, so one file has one download at a time.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import stat
import threading
from pathlib import Path

import httpx
from django.conf import settings
from django.db import close_old_connections

from llmgw.core import clock
from llmgw.core.outage import Outage

from . import services, store, wake
from .domain.sources import inside
from .models import WeightFile
from .resolve import hub_endpoint, hub_headers
from .transfer import CHUNK, TransferError, fetch

log = logging.getLogger("llmgw.mirror")

IDLE_WAKE_S = 5.0
_thread: threading.Thread | None = None


def work_once() -> bool:
    """Fetch one due file; False when nothing was due."""
    f = services.file_claim(now=clock.now())
    if f is None:
        return False
    if services.file_from_blob(file=f):
        log.info("mirror: %s is already held as sha256 %s", f.path, f.expected_sha256[:12])
        return True
    log.info("mirror: fetching %s of %s", f.path, f.weights.source)
    try:
        got = _fetch(f)
    except TransferError as exc:
        state = services.file_failed(
            file_id=f.pk, detail=str(exc), retry=exc.retry, now=clock.now()
        )
        log.warning("mirror: %s: %s (%s)", f.path, exc, state)
        return True
    services.file_done(file_id=f.pk, sha256=got[0], size=got[1])
    log.info("mirror: %s ready, sha256 %s, %d bytes", f.path, got[0], got[1])
    return True


def work_until_idle(limit: int = 1000) -> int:
    """Fetch what is due, one file after another; returns how many were tried."""
    n = 0
    while n < limit and work_once():
        n += 1
    return n


def _fetch(f: WeightFile) -> tuple[str, int]:
    def progress(done: int, total: int | None) -> None:
        services.file_progress(file_id=f.pk, done=done, total=total, now=clock.now())

    part = store.part(f.pk)
    if f.fetch_url.startswith("file://"):
        return _copy(f, part, progress)
    headers = hub_headers() if f.fetch_url.startswith(hub_endpoint() + "/") else {}
    with httpx.Client(timeout=httpx.Timeout(30.0, read=60.0)) as client:
        got = fetch(
            client,
            f.fetch_url,
            dest=part.with_suffix(".verified"),
            part=part,
            expected_sha256=f.expected_sha256 or None,
            size=f.size,
            headers=headers,
            on_progress=progress,
            what=f.path,
        )
    _keep(part.with_suffix(".verified"), got.sha256)
    return got.sha256, got.size


def _copy(f: WeightFile, part: Path, progress) -> tuple[str, int]:
    src = Path(httpx.URL(f.fetch_url).path)
    h = hashlib.sha256()
    done = 0
    try:
        part.parent.mkdir(parents=True, exist_ok=True)
        with _open_source(src, f) as r, open(part, "wb") as w:
            while block := r.read(CHUNK):
                w.write(block)
                h.update(block)
                done += len(block)
                if done % (64 * CHUNK) < CHUNK:
                    progress(done, f.size)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise TransferError(f"{src} could not be read: {exc.strerror}.", retry=True) from None
    digest = h.hexdigest()
    if f.expected_sha256 and digest != f.expected_sha256:
        part.unlink(missing_ok=True)
        raise TransferError(
            f"{f.path} does not match its digest: expected sha256 {f.expected_sha256}, "
            f"got {digest} over {done:,} bytes; nothing was kept.",
            retry=False,
        )
    _keep(part, digest)
    return digest, done


def _open_source(src: Path, f: WeightFile):
    """The local file to copy, checked again now: still inside LLMGW_MIRROR_SOURCES, not
    a link (one swapped since it was added could point anywhere), a regular file (a FIFO
    would hang the worker), and the size it had when added."""
    if not inside(os.path.realpath(src), settings.LLMGW.mirror.sources):
        raise TransferError(f"{src} is no longer inside LLMGW_MIRROR_SOURCES.", retry=False)
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise TransferError(
            f"{src} cannot be read: {exc.strerror}.", retry=exc.errno != errno.ELOOP
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (f.size is not None and info.st_size != f.size):
        os.close(fd)
        raise TransferError(
            f"{src} changed since it was added: it is not the regular file of "
            f"{f.size:,} bytes it was."
            if f.size is not None
            else f"{src} is not a regular file.",
            retry=False,
        )
    return os.fdopen(fd, "rb")


def _keep(path: Path, digest: str) -> None:
    dest = store.blob(digest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        path.unlink()
    else:
        shutil.move(path, dest)


def start_embedded() -> None:
    """Start the worker thread inside `llmgw serve` (embedded mode)."""
    global _thread
    if _thread is not None:
        return
    services.claims_release()
    _thread = threading.Thread(target=_loop, name="llmgw-mirror", daemon=True)
    _thread.start()


def _loop() -> None:
    outage = Outage("the mirror's worker", log)
    while True:
        try:
            busy = work_once()
        except Exception as exc:
            outage.failed(exc)
            busy = False
        else:
            outage.worked()
        finally:
            close_old_connections()
        if not busy:
            wake.wait(IDLE_WAKE_S)
