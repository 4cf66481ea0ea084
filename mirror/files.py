"""`GET /api/v1/mirror/files/{sha256}`: verified files by digest, to agents only.

A plain ASGI app in front of Django, as the gateway is: a file of tens of
gigabytes is streamed in 1 MiB reads off the loop, where Django's file
response would hand the loop 4 KiB blocks one thread hop at a time. ``Range``
is answered 206 (one range, as agents and curl ask), ``ETag`` is the digest,
so ``If-None-Match`` and ``If-Range`` need no look at the file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from email.utils import formatdate

from llmgw.core.db import database_call

PREFIX = "/api/v1/mirror/files/"
_PATH = re.compile(r"^/api/v1/mirror/files/([0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
CHUNK = 1 << 20


# Why a bearer may not read a file, given its secret and the file's digest: (HTTP status,
# sentence), or None when it may. The root hands the fleet's rule in (a node reads only
# what it runs), so this app needs no knowledge of nodes.
Refusal = Callable[..., "tuple[int, str] | None"]


class MirrorFiles:
    """Serves mirror files to whom ``refusal`` lets; passes every other request to ``inner``."""

    def __init__(self, inner, *, refusal: Refusal) -> None:
        self.inner = inner
        self.refusal = refusal

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.inner(scope, receive, send)
            return
        await _serve(scope, receive, send, self.refusal)


def _touch(digest: str) -> None:
    from llmgw.core import clock
    from mirror.services import weights_touch

    weights_touch(sha256=digest, now=clock.now())


async def _serve(scope, receive, send, refusal: Refusal) -> None:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    if scope["method"] not in ("GET", "HEAD"):
        await _answer(
            send, 405, "Mirror files are read with GET or HEAD.", [(b"allow", b"GET, HEAD")]
        )
        return
    auth = headers.get("authorization", "")
    secret = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    m = _PATH.match(scope["path"])
    if not secret:
        await _answer(send, 401, "A node's credential is needed: Authorization: Bearer <token>.")
        return
    if not m:
        await _answer(send, 404, "A mirror file is named by its 64-digit lowercase sha256.")
        return
    digest = m[1]
    refused = await database_call(refusal)(secret=secret, sha256=digest)
    if refused is not None:
        await _answer(send, *refused)
        return
    from mirror import store

    path = store.blob(digest)
    try:
        size = os.stat(path).st_size
    except OSError:
        await _answer(send, 404, f"The mirror holds no file with sha256 {digest}.")
        return
    etag = f'"{digest}"'
    common = [(b"etag", etag.encode()), (b"accept-ranges", b"bytes")]
    if headers.get("if-none-match") in (etag, "*"):
        await send({"type": "http.response.start", "status": 304, "headers": common})
        await send({"type": "http.response.body", "body": b""})
        return
    start, end, status = 0, size - 1, 200
    ask = headers.get("range")
    if ask and headers.get("if-range", etag) == etag:
        r = _RANGE.match(ask.strip())
        parsed = _bounds(r, size) if r else None
        if parsed is None:
            await _answer(
                send,
                416,
                f"The range {ask!r} is not within the file's {size} bytes.",
                [(b"content-range", f"bytes */{size}".encode())],
            )
            return
        start, end = parsed
        status = 206
        common.append((b"content-range", f"bytes {start}-{end}/{size}".encode()))
    length = end - start + 1 if size else 0
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/octet-stream"),
                (b"content-length", str(length).encode()),
                *common,
            ],
        }
    )
    if scope["method"] == "HEAD" or length == 0:
        await send({"type": "http.response.body", "body": b""})
        return
    if start == 0:
        await database_call(_touch)(digest)
    gone = asyncio.Event()
    watcher = asyncio.ensure_future(_until_disconnect(receive, gone))
    try:
        await _stream(send, path, start, length, gone)
    finally:
        watcher.cancel()


async def _until_disconnect(receive, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client hangs up, so the rest of the file is not read for nobody."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


def _bounds(r: re.Match, size: int) -> tuple[int, int] | None:
    first, last = r[1], r[2]
    if not first and not last:
        return None
    if not first:  # the last N bytes
        n = int(last)
        return (max(size - n, 0), size - 1) if n > 0 and size else None
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or (last and int(last) < start):
        return None
    return start, end


async def _stream(send, path, start: int, length: int, gone: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    f = await loop.run_in_executor(None, open, path, "rb")
    try:
        await loop.run_in_executor(None, f.seek, start)
        left = length
        while left > 0 and not gone.is_set():
            block = await loop.run_in_executor(None, f.read, min(CHUNK, left))
            if not block:
                break
            left -= len(block)
            await send({"type": "http.response.body", "body": block, "more_body": left > 0})
        if left > 0:
            # The file shrank under us, or the client left: end the body short.
            await send({"type": "http.response.body", "body": b""})
    finally:
        f.close()


async def _answer(send, status: int, detail: str, extra: list | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The server's clock, as HTTP has it: `llmgw doctor` compares a node's with it.
                (b"date", formatdate(usegmt=True).encode()),
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
