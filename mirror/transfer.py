"""Fetching one file over HTTP into place: resumed, hashed, checked, then renamed.

Used by the mirror's worker (from the hub or an https source) and by agents
(from the mirror). Nothing here knows Django: the agent imports it too.

A fetch writes to a ``.part`` file beside nothing else; a fetch that is cut
keeps it, and the next one asks for the rest with a ``Range`` (hashing what
is already there first, so the digest covers every byte). Only a file whose
SHA-256 matches is renamed into place; one that does not is deleted, since
its bytes are wrong somewhere and resuming would keep them.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import httpx

from llmgw.core.errors import cause

CHUNK = 1 << 20
SINK_BLOCK = 1 << 20
PROGRESS_EVERY_S = 1.0


class TransferError(Exception):
    """A fetch that did not end in a verified file; the message is a sentence.

    ``retry`` says whether trying again could help: a connection cut or a 503
    may pass, a digest that does not match or a 404 will not.
    """

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class Fetched:
    """What was put in place."""

    sha256: str
    size: int
    resumed_from: int


def sha256_file(path: Path, *, upto: int | None = None) -> tuple[hashlib._Hash, int]:
    """The running hash of a file's first ``upto`` bytes (all of it when None)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while upto is None or n < upto:
            want = CHUNK if upto is None else min(CHUNK, upto - n)
            block = f.read(want)
            if not block:
                break
            h.update(block)
            n += len(block)
    return h, n


def fetch(
    client: httpx.Client,
    url: str,
    *,
    dest: Path,
    part: Path,
    expected_sha256: str | None = None,
    size: int | None = None,
    headers: Mapping[str, str] | None = None,
    on_progress: Callable[[int, int | None], None] | None = None,
    what: str | None = None,
) -> Fetched:
    """Fetch ``url`` into ``dest`` by way of ``part``; raise TransferError with a sentence.

    ``on_progress(done, total)`` is called about once a second while bytes arrive.
    """
    what = what or url
    part.parent.mkdir(parents=True, exist_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if have and not expected_sha256:
        # Nothing would tell a file changed upstream between tries from its first part:
        # without a digest to check the whole against, it is fetched again from the start.
        part.unlink()
        have = 0
    if size is not None and have > size:
        part.unlink()
        have = 0
    h, have = sha256_file(part, upto=have) if have else (hashlib.sha256(), 0)
    resumed_from = have
    total = size
    if not (size is not None and have == size):
        h, have, total = _download(client, url, part, h, have, size, headers, on_progress, what)
    digest = h.hexdigest()
    if total is not None and have != total:
        raise TransferError(f"{what} ended at {have:,} bytes of {total:,}.", retry=True)
    if expected_sha256 and digest != expected_sha256.lower():
        part.unlink(missing_ok=True)
        raise TransferError(
            f"{what} does not match its digest: expected sha256 {expected_sha256}, "
            f"got {digest} over {have:,} bytes; nothing was kept.",
            retry=False,
        )
    with open(part, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(part, dest)
    return Fetched(sha256=digest, size=have, resumed_from=resumed_from)


def mirror_url(server: str, url: str) -> str:
    """A mirror file's URL as ``start_shard`` gives it: relative to the server the agent
    connects to, or absolute (``LLMGW_MIRROR_URL``)."""
    return urljoin(server.rstrip("/") + "/", url.lstrip("/")) if url.startswith("/") else url


def fetch_from_mirror(
    server: str,
    token: str,
    url: str,
    *,
    dest: Path,
    part: Path,
    sha256: str,
    size: int,
    what: str,
    on_progress: Callable[[int, int | None], None] | None = None,
) -> Fetched:
    """An agent's fetch of a mirror file by digest, with its token (weights and engines)."""
    # The mirror is the control plane (or beside it): no proxy from the environment.
    with httpx.Client(timeout=httpx.Timeout(30.0, read=120.0), trust_env=False) as client:
        return fetch(
            client,
            mirror_url(server, url),
            dest=dest,
            part=part,
            expected_sha256=sha256,
            size=size,
            headers={"authorization": f"Bearer {token}"},
            on_progress=on_progress,
            what=what,
        )


def _download(client, url, part, h, have, size, headers, on_progress, what):
    ask = dict(headers or {})
    if have:
        ask["Range"] = f"bytes={have}-"
    try:
        with client.stream("GET", url, headers=ask, follow_redirects=True) as r:
            if r.status_code == 416 and have:
                # The part holds more than the file now has: start again.
                part.unlink()
                return _download(
                    client, url, part, hashlib.sha256(), 0, size, headers, on_progress, what
                )
            if r.status_code not in (200, 206):
                raise TransferError(
                    _refusal(what, r), retry=r.status_code >= 500 or r.status_code == 429
                )
            if have and r.status_code == 200:
                # The server ignored the range: what it sends is the whole file.
                h, have = hashlib.sha256(), 0
            elif have and not r.headers.get("content-range", "").startswith(f"bytes {have}-"):
                raise TransferError(
                    f"{what} answered a range from {have:,} with "
                    f"{r.headers.get('content-range') or 'no Content-Range'}.",
                    retry=False,
                )
            total = size if size is not None else _total(r, have)
            sink = _Sink(part, h, append=bool(have))
            last = time.monotonic()
            try:
                # As the bytes arrive: a chunk size would hold back what came before a cut.
                for block in r.iter_bytes():
                    sink.put(block)
                    have += len(block)
                    if total is not None and have > total:
                        raise TransferError(
                            f"{what} sent more than its {total:,} bytes.", retry=False
                        )
                    if on_progress and time.monotonic() - last >= PROGRESS_EVERY_S:
                        last = time.monotonic()
                        on_progress(have, total)
            finally:
                # What arrived before a cut is kept, so the next try resumes after it.
                sink.close()
    except httpx.HTTPError as exc:
        raise TransferError(
            f"{what} was cut at {have:,} bytes: {cause(exc)}.", retry=True
        ) from None
    except OSError as exc:
        raise TransferError(
            f"{what} could not be written at {part}: {exc.strerror}.", retry=True
        ) from None
    if on_progress:
        on_progress(have, total)
    return h, have, total


class _Sink:
    """Hashes and writes what arrives, in a thread of its own, so the connection is read
    while the last megabyte is hashed: SHA-256 and the write each let go of the GIL, and
    on a loaded machine the three together were half the speed of the network alone.
    Blocks are gathered into SINK_BLOCK bytes before they are handed over."""

    def __init__(self, part: Path, h: hashlib._Hash, *, append: bool) -> None:
        self._file = open(part, "ab" if append else "wb")  # noqa: SIM115 - closed in close()
        self._h = h
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="llmgw-fetch-sink", daemon=True)
        self._thread.start()

    def put(self, block: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._pending.append(block)
        self._pending_bytes += len(block)
        if self._pending_bytes >= SINK_BLOCK:
            self._hand_over()

    def _hand_over(self) -> None:
        if self._pending:
            self._queue.put(b"".join(self._pending))
            self._pending, self._pending_bytes = [], 0

    def _run(self) -> None:
        while (block := self._queue.get()) is not None:
            if self._error is not None:
                continue
            try:
                self._file.write(block)
            except OSError as exc:
                self._error = exc
                continue
            self._h.update(block)

    def close(self) -> None:
        """Write what is left and wait for it; raises the write's OSError if one failed."""
        self._hand_over()
        self._queue.put(None)
        self._thread.join()
        self._file.close()
        if self._error is not None:
            raise self._error


def _total(r: httpx.Response, have: int) -> int | None:
    rng = r.headers.get("content-range", "")
    if "/" in rng and rng.rsplit("/", 1)[1].isdigit():
        return int(rng.rsplit("/", 1)[1])
    length = r.headers.get("content-length")
    if length and length.isdigit() and "content-encoding" not in r.headers:
        return have + int(length) if r.status_code == 206 else int(length)
    return None


def _refusal(what: str, r: httpx.Response) -> str:
    return f"{what} answered HTTP {r.status_code} {r.reason_phrase}".rstrip() + "."
