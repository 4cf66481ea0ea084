"""The port `llmgw serve` listens on: the gateway's `/v1/` served by uvicorn's HTTP protocol
(httptools) on the serving loop, everything else handed to daphne.

Twisted's HTTP server and daphne were about half of a gateway request's CPU
(docs/benchmarks.md, Gateway); uvicorn's protocol serving the same app used about 0.4 of
it. daphne still serves what the design gives it: the agents' websockets (Channels), the
console, the REST API and the mirror's files. Both share one loop (Twisted's asyncio
reactor runs on it, uvloop's where it is installed) and one listening socket, which this
module owns: each new connection is read up to the end of its first request line; one
asking for `/v1/…` stays here, any other is handed to daphne as an adopted socket, the
bytes read so far given to it first. Later requests on a kept-alive connection stay with
whichever took the first: both serve every path, the gateway passing what is not its own
to Django, so only where a request is answered differs, never how.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from email.utils import formatdate
from typing import cast

log = logging.getLogger("llmgw.serve")

# An interim answer (uvicorn's "100 Continue"), sent as it comes, not held.
INTERIM = b"HTTP/1.1 1"
# The gateway's paths; a connection whose first request asks for one stays here.
GATEWAY = b"/v1/"
# A first request line longer than this goes to daphne, which answers it (414, 400).
FIRST_LINE_MAX = 8192
# As Twisted's HTTP channel: a kept-alive connection idle this long is closed.
KEEP_ALIVE_S = 60.0
# A request's head (its line and headers) past either bound is refused with a 400 and the
# connection closed, as Twisted refuses past its own (16 KB of headers, 500 of them):
# uvicorn's protocol would keep every header it is sent.
HEAD_MAX_BYTES = 16384 + FIRST_LINE_MAX
HEADERS_MAX = 500
TOO_LARGE = (
    f"The request's head is larger than llmgw takes: at most {HEAD_MAX_BYTES:,} bytes "
    f"and {HEADERS_MAX} headers."
)


class _HeadTooLarge(Exception):
    """Raised from the parser's callbacks to stop it: uvicorn then answers 400 and closes."""


def uvloop_installed() -> bool:
    """Make the serving loop uvloop's where it is installed: called before daphne is
    imported, which makes the loop Twisted's reactor runs on."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


class Front:
    """The listening socket's server: `/v1/` connections served by uvicorn's protocol,
    the others adopted by daphne's HTTP factory."""

    def __init__(self, app, http_factory, header_timeout: float) -> None:
        from uvicorn.config import Config
        from uvicorn.server import ServerState

        self.config = Config(
            app=app,
            http="httptools",
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            proxy_headers=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=int(KEEP_ALIVE_S),
        )
        self.config.load()
        self.state = ServerState()
        self.http_factory = http_factory
        self.header_timeout = header_timeout
        self.server: asyncio.base_events.Server | None = None
        self._dating: asyncio.TimerHandle | None = None
        self._protocol = _protocol_class()

    async def listen(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._date()
        self.server = await loop.create_server(self._connection, sock=listener, backlog=1024)

    def stopListening(self) -> None:  # noqa: N802 - as a Twisted port is stopped (stopping.py)
        """Stop accepting; idle kept-alive connections close, those answering finish."""
        if self.server is not None:
            self.server.close()
        if self._dating is not None:
            self._dating.cancel()
        for protocol in list(self.state.connections):
            protocol.shutdown()

    def _connection(self) -> asyncio.Protocol:
        return self._protocol(self)

    def _date(self) -> None:
        """The Date header every answer carries, as HTTP/1.1 asks of a server with a clock,
        written once a second rather than per answer."""
        self.state.default_headers = [(b"date", formatdate(usegmt=True).encode())]
        self._dating = asyncio.get_running_loop().call_later(1.0, self._date)

    def hand_to_daphne(self, transport: asyncio.Transport, head: bytes) -> None:
        """Give the connection to daphne: Twisted adopts a copy of its socket, is handed
        what was read of it, and this side lets its own copy go without a word to the
        peer (closing one of two descriptors of a socket leaves the connection open)."""
        from twisted.internet import reactor

        sock = transport.get_extra_info("socket")
        adopting = _Adopting(self.http_factory)
        reactor.adoptStreamConnection(sock.fileno(), sock.family, adopting)
        transport.abort()
        if adopting.built is not None:
            adopting.built.dataReceived(head)


class _Adopting:
    """Twisted's factory for one adopted connection: daphne's, keeping what it built."""

    def __init__(self, factory) -> None:
        self.factory = factory
        self.built = None

    def buildProtocol(self, addr):  # noqa: N802 - Twisted's name
        self.built = self.factory.buildProtocol(addr)
        return self.built

    def doStart(self) -> None:  # noqa: N802 - Twisted's name
        pass

    def doStop(self) -> None:  # noqa: N802 - Twisted's name
        pass


def _protocol_class():
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Connection(HttpToolsProtocol):
        """uvicorn's protocol for one connection, deciding on its first line where it
        goes, and closing it when a request's headers do not arrive within the header
        deadline of its opening or of its last answer (a slow client sending a byte at a
        time would otherwise hold it; uvicorn times only the idle gap between requests).
        Bodies and answers, a stream however long, are not timed by this."""

        def __init__(self, front: Front) -> None:
            super().__init__(front.config, front.state, {})
            self.front = front
            # What was read of the first request line; None once decided where it goes.
            self.head: bytes | None = b""
            self.handed = False
            # Reading a request's head (not its body): the bytes received, the bytes of its
            # URL and headers parsed and how many headers, so far; whether it was too large.
            self.in_head = True
            self.head_bytes = self.head_size = self.header_count = 0
            self.too_large = False
            self.deadline: asyncio.TimerHandle | None = None
            self.cork: _Corked | None = None  # the answering request's side of the transport

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # Asyncio sets it only where the listening socket says TCP, and one made with
            # socket.socket() says 0: Nagle's algorithm then held an answer's second write
            # for the client's delayed ACK (47 ms one at a time, docs/benchmarks.md).
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.head is not None:
                self.head += data
                end = self.head.find(b"\r\n")
                if end < 0 and len(self.head) <= FIRST_LINE_MAX:
                    return
                head, self.head = self.head, None
                if not _for_gateway(head[: end if end >= 0 else FIRST_LINE_MAX]):
                    self._hand_over(head)
                    return
                data = head
            was_in_head = self.in_head
            super().data_received(data)
            if self.in_head and not self.transport.is_closing():
                # Bytes of a head still not whole: counted from the chunk after the one it
                # began in (a chunk may end a body and begin the next head), so at most one
                # read more is held. A head that is whole is bounded by its callbacks.
                self.head_bytes = self.head_bytes + len(data) if was_in_head else 0
                if self.head_bytes > HEAD_MAX_BYTES:
                    self.send_400_response(TOO_LARGE)

        def send_400_response(self, msg: str) -> None:
            super().send_400_response(TOO_LARGE if self.too_large else msg)

        def on_url(self, url: bytes) -> None:
            self.head_size += len(url)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self.header_count += 1
            self.head_size += len(name) + len(value)
            if self.header_count > HEADERS_MAX or self.head_size > HEAD_MAX_BYTES:
                self.too_large = True
                raise _HeadTooLarge
            super().on_header(name, value)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self.in_head, self.head_bytes, self.head_size, self.header_count = True, 0, 0, 0

        def _hand_over(self, head: bytes) -> None:
            self._disarm()
            self.handed = True
            self.connections.discard(self)
            try:
                self.front.hand_to_daphne(self.transport, head)
            except Exception:  # noqa: BLE001 - a connection lost, never the server
                log.warning("could not hand a connection to daphne", exc_info=True)
                self.transport.abort()

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self.handed:
                return
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._disarm()
            self.in_head = False
            super().on_headers_complete()

        def _start_asgi_task(self, cycle, app) -> None:
            # The request answered now (the next of those pipelined, after it), its head held
            # for its body's first write. Shaped as a transport where the cycle uses one.
            self.cork = _Corked(self.transport, self.loop)
            cycle.transport = cast(asyncio.Transport, self.cork)
            super()._start_asgi_task(cycle, app)

        def on_response_complete(self) -> None:
            # Nothing more is coming for what is held (a HEAD's head), and a graceful stop
            # closes the connection now.
            if self.cork is not None:
                self.cork.let_go()
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self.deadline = self.loop.call_later(self.front.header_timeout, self.transport.abort)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

    return Connection


class _Corked:
    """A request's side of its connection's transport, sending its answer's head with the
    first bytes of its body: uvicorn writes the two apart, two system calls and, with
    TCP_NODELAY, two packets for every whole answer. A head is held until its body's first
    write or the end of the loop's turn, whichever comes first, so a stream's head is never
    held back waiting for its first event."""

    __slots__ = ("fresh", "held", "loop", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.fresh = True  # nothing written yet: the first write is held
        self.held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            self.transport.writelines((held, data))
        elif self.fresh and not data.startswith(INTERIM):
            # The answer's head; "100 Continue" before it is sent as it comes.
            self.fresh, self.held = False, data
            self.loop.call_soon(self.let_go)
        else:
            self.transport.write(data)

    def let_go(self) -> None:
        held, self.held = self.held, None
        if held is not None and not self.transport.is_closing():
            self.transport.write(held)

    def close(self) -> None:
        self.let_go()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str):
        return getattr(self.transport, name)


def _for_gateway(line: bytes) -> bool:
    """Whether a first request line (`POST /v1/chat/completions HTTP/1.1`) asks for the
    gateway."""
    parts = line.split(b" ", 2)
    return len(parts) == 3 and parts[1].startswith(GATEWAY)
