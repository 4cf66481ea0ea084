"""The gateway's HTTP/1.1 client to the engines: keep-alive connections pooled per engine,
one request at a time on each, the answer parsed as it arrives (Content-Length, chunked,
or to the close) straight off asyncio's transport. It does the one thing the gateway asks
of a client, send a prepared body and pass the answer back, with less Python a request
than aiohttp's (docs/benchmarks.md, "where a request's CPU goes"): the start of a
request's head is made once per engine and path, a connection is its own answer, and the
read timeout is one timer a request, not one a read.

`Pool.post` gives a `Connection` whose head has arrived (`status`, `content_type`); its
body is read with `read` (b"" at its end) and the connection handed back with `release`,
which keeps it for the next request only when its answer was read to the end."""

from __future__ import annotations

import asyncio
import ssl
import time
from urllib.parse import urlsplit

CONNECT_S = 5.0  # to open a connection
READ_S = 600.0  # the most an engine may go quiet while answering
IDLE_S = 60.0  # an idle connection is closed after this long
MAX_IDLE = 256  # idle connections kept per engine
MAX_HEAD = 64 * 1024  # an answer's status line and headers
MAX_SIZE_LINE = 1024  # a chunk's size line
HIGH, LOW = 256 * 1024, 64 * 1024  # reading pauses past HIGH unread bytes, resumes under LOW

# A chunked body's state, in Connection.left besides the bytes of a chunk still to come.
_SIZE, _CRLF, _TRAILER = -1, -2, -3


class Cut(Exception):
    """The engine could not be reached, or its connection closed or went quiet before the
    answer was whole. `timeout`: it went quiet (or would not connect in time), not cut."""

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class NotHTTP(Exception):
    """The engine answered what is not HTTP/1.x."""


class Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, and the answer to its request in flight."""

    def __init__(self, pool: Pool, origin: str) -> None:
        self.pool, self.origin = pool, origin
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.busy = False  # a request is in flight on it
        self.idle_since = 0.0
        self.status = 0
        self.content_type = ""
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._begin()

    def _begin(self) -> None:
        self.status, self.content_type = 0, ""
        self.received = False  # any byte of the answer has come
        self.ended = False
        self.error: Exception | None = None
        self._keep = True
        self._head = b""  # the head so far, until it is whole
        self._has_head = False
        self._chunked = False
        self._left = -1  # Content-Length's bytes to come (-1: to the close); chunked: above
        self._raw = b""  # chunked: bytes not yet decoded
        self._body: list[bytes] = []
        self._unread = 0
        self._paused = False
        self._last = 0.0

    # asyncio's side

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self._has_head and not self._chunked and self._left < 0 and not self.ended:
            self._end()  # a body that ends at the close
        elif not self.ended and self.error is None:
            why = f": {exc}" if exc else ""
            self._fail(Cut(f"the engine closed the connection{why}"))
        self._wake()

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes no request asked for: the connection is not to be trusted
            self.lost = True
            self.transport.close()
            return
        self.received = True
        self._last = time.monotonic()
        if not self._has_head:
            data = self._read_head(data)
            if not data:
                return
        if self._chunked:
            self._dechunk(data)
        elif self._left >= 0:
            if len(data) >= self._left:
                if len(data) > self._left:
                    self._keep = False  # more than it said: the connection is not reused
                    data = data[: self._left]
                self._left = 0
                if data:
                    self._push(data)
                self._end()
            else:
                self._left -= len(data)
                self._push(data)
        elif self.ended:
            self._keep = False  # bytes after a whole answer: not to be trusted again
        else:
            self._push(data)

    def eof_received(self) -> None:
        return None  # close the transport: connection_lost tells the rest

    # The answer, parsed

    def _read_head(self, data: bytes) -> bytes:
        """The head taken from `data` once it is whole; the body's bytes after it."""
        head = self._head + data if self._head else data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > MAX_HEAD:
                self._invalid(f"a head of more than {MAX_HEAD:,} bytes")
            else:
                self._head = head
            return b""
        self._head = b""
        try:
            self._parse_head(head[:end])
        except NotHTTP as exc:
            self._fail(exc)
            self.transport.close()
            return b""
        rest = head[end + 4 :]
        if self.status < 200:  # 1xx: an interim answer, the real one follows
            return self._read_head(rest) if rest else b""
        self._has_head = True
        if self._left == 0:
            self._end()
        else:
            self._wake()
        return rest

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        first = lines[0]
        if not first.startswith(b"HTTP/1.") or first[12:13] not in (b"", b" "):
            raise NotHTTP(f"its first line is {first[:80]!r}")
        try:
            self.status = int(first[9:12])
        except ValueError:
            raise NotHTTP(f"its first line is {first[:80]!r}") from None
        self._keep = first[7:8] == b"1"
        self._left, self._chunked = -1, False
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise NotHTTP(f"a header line is {line[:80]!r}")
            name = name.lower()
            if name == b"content-length":
                try:
                    self._left = int(value)
                except ValueError:
                    raise NotHTTP(f"its Content-Length is {value[:40]!r}") from None
                if self._left < 0:
                    raise NotHTTP(f"its Content-Length is {value[:40]!r}")
            elif name == b"content-type":
                self.content_type = value.strip().decode("latin-1")
            elif name == b"transfer-encoding":
                self._chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"connection" and b"close" in value.lower():
                self._keep = False
        if self._chunked:
            self._left = _SIZE
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self._left = 0
        elif self._left < 0:
            self._keep = False  # to the close

    def _dechunk(self, data: bytes) -> None:
        buf = self._raw + data if self._raw else data
        pos, size, out = 0, len(buf), []
        while pos < size and not self.ended:
            left = self._left
            if left > 0:
                take = min(left, size - pos)
                out.append(buf if take == size else buf[pos : pos + take])
                pos += take
                self._left = left - take or _CRLF
            elif left == _CRLF:
                if size - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    return self._invalid("a chunk not ended by CRLF")
                pos += 2
                self._left = _SIZE
            else:  # a size line, or a trailer line (an empty one ends the body)
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if size - pos > MAX_SIZE_LINE:
                        return self._invalid("a chunk size line too long")
                    break
                line, pos = buf[pos:eol], eol + 2
                if left == _TRAILER:
                    if not line:
                        self._end()
                    continue
                try:
                    n = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    n = -1
                if n < 0:
                    return self._invalid(f"a chunk size of {line[:40]!r}")
                self._left = n or _TRAILER
        if self.ended and pos < size:
            self._keep = False
        self._raw = buf[pos:] if pos < size and not self.ended else b""
        if out:
            self._push(out[0] if len(out) == 1 else b"".join(out))
        if self.ended:
            self._wake()

    def _invalid(self, what: str) -> None:
        self._fail(NotHTTP(what))
        self.transport.close()

    def _push(self, data: bytes) -> None:
        self._body.append(data)
        self._unread += len(data)
        if self._unread > HIGH and not self._paused and not self.lost:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _end(self) -> None:
        self.ended = True
        self._wake()

    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc
        self._keep = False
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _quiet(self) -> None:
        """The read timeout, checked once READ_S has passed since the last byte: one timer
        a request, moved on whenever bytes came meanwhile or the reader held them back."""
        since = time.monotonic() - self._last
        if self._paused or since < READ_S:
            self._timer = asyncio.get_running_loop().call_later(
                READ_S - since if not self._paused else READ_S, self._quiet
            )
            return
        self._fail(Cut(f"the engine said nothing for {READ_S:g} s", timeout=True))
        self.transport.close()

    # The caller's side

    async def send(self, data: bytes) -> None:
        """Send a request's bytes and wait for its answer's head."""
        self._last = time.monotonic()
        self.busy = True
        self.transport.write(data)
        self._timer = asyncio.get_running_loop().call_later(READ_S, self._quiet)
        while not self._has_head:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def read(self) -> bytes:
        """The body's next bytes, as many as have come; b"" at its end. Cut or NotHTTP for
        an answer that did not end as it said it would."""
        while True:
            if self._body:
                body = self._body
                data = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                self._unread = 0
                if self._paused and not self.lost:
                    self._paused = False
                    self.transport.resume_reading()
                return data
            if self.ended:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait()

    def release(self) -> None:
        """Done with the answer: the connection kept for another request when its answer
        was read to its end, else closed."""
        self.busy = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.ended and self._keep and not self.lost and not self._body:
            self._begin()
            self.pool.keep(self)
        else:
            self.lost = True
            if self.transport is not None:
                self.transport.close()


class Pool:
    """Keep-alive connections to every engine, for one process's requests."""

    def __init__(self) -> None:
        self._idle: dict[str, list[Connection]] = {}
        self._heads: dict[tuple[str, str, str], bytes] = {}
        self._ssl: ssl.SSLContext | None = None

    async def post(
        self, url: str, path: str, authorization: str, body: bytes, extra: dict | None = None
    ) -> Connection:
        """POST `body` (JSON) to `url` + `path`; the connection, its answer's head read.
        Cut when the engine cannot be reached or hangs up first; NotHTTP."""
        start = self._heads.get((url, path, authorization))
        if start is None:
            start = self._head(url, path, authorization)
        more = "".join(f"{k}: {v}\r\n" for k, v in extra.items()).encode() if extra else b""
        data = b"%sContent-Length: %d\r\n%s\r\n%s" % (start, len(body), more, body)
        conn = self._take(url)
        if conn is not None:
            try:
                await conn.send(data)
                return conn
            except Cut as exc:
                conn.release()
                if conn.received or exc.timeout:
                    raise
                # Closed by the engine while it was idle here: once more, on a new one.
            except BaseException:
                conn.release()
                raise
        conn = await self._connect(url)
        try:
            await conn.send(data)
        except BaseException:
            conn.release()
            raise
        return conn

    def _head(self, url: str, path: str, authorization: str) -> bytes:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]  # no userinfo in Host
        target = parts.path.rstrip("/") + path  # under the endpoint's own path, if it has one
        start = (
            f"POST {target} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {authorization}\r\n"
            "Content-Type: application/json\r\n"
        ).encode("latin-1")
        if len(self._heads) > 10_000:
            self._heads.clear()
        self._heads[(url, path, authorization)] = start
        return start

    def _take(self, url: str) -> Connection | None:
        idle = self._idle.get(url)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < IDLE_S:
                return conn
            conn.release()
        return None

    def keep(self, conn: Connection) -> None:
        idle = self._idle.setdefault(conn.origin, [])
        if len(idle) >= MAX_IDLE:
            conn.lost = True
            conn.transport.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def _connect(self, url: str) -> Connection:
        parts = urlsplit(url)
        secure = parts.scheme == "https"
        if secure and self._ssl is None:
            self._ssl = ssl.create_default_context()
        port = parts.port or (443 if secure else 80)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_S):
                _, conn = await loop.create_connection(
                    lambda: Connection(self, url),
                    parts.hostname,
                    port,
                    ssl=self._ssl if secure else None,
                )
        except TimeoutError:
            raise Cut(f"no connection within {CONNECT_S:g} s", timeout=True) from None
        except OSError as exc:
            raise Cut(f"cannot connect to {parts.netloc}: {exc.strerror or exc}") from None
        return conn

    def sweep(self) -> None:
        """Close the connections idle for IDLE_S or more, or closed by their engine."""
        now = time.monotonic()
        for url, idle in list(self._idle.items()):
            kept = [c for c in idle if not c.lost and now - c.idle_since < IDLE_S]
            for conn in idle:
                if conn not in kept:
                    conn.release()
            if kept:
                self._idle[url] = kept
            else:
                del self._idle[url]

    async def close(self) -> None:
        """Close every idle connection (those in use close when released)."""
        for idle in self._idle.values():
            for conn in idle:
                conn.lost = True
                conn.transport.close()
        self._idle.clear()
