"""`llmgw serve`: daphne serving the control plane; embedded, the reconciler runs on its loop."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import pprint
import signal
import socket
import sys
from dataclasses import dataclass
from functools import partial

from llmgw.core.inbox import Inbox

log = logging.getLogger("llmgw.serve")


def _prepare(embedded: bool) -> None:
    """Tables and the catalog file before the first request: a bad catalog stops the start."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    if embedded:
        call_command("migrate", interactive=False, verbosity=0)
    else:
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            raise SystemExit("llmgw: the database needs migrating first: run llmgw migrate")
    if settings.LLMGW.catalog is not None:
        from catalog.declared import read_catalog_adapters, read_catalog_file
        from catalog.domain import CatalogError
        from catalog.services import (
            declared_adapters_prune,
            declared_adapters_sync,
            declared_sync,
        )
        from llmgw.core.errors import Invalid

        try:
            adapters = read_catalog_adapters(settings.LLMGW.catalog)
            declared_adapters_prune(keep={a.name for a in adapters})
            declared_sync(specs=read_catalog_file(settings.LLMGW.catalog))
            declared_adapters_sync(specs=adapters)
        except (CatalogError, Invalid) as exc:
            raise SystemExit(f"llmgw: LLMGW_CATALOG: {exc}") from None


def _lighter_requests() -> None:
    """Two costs Twisted pays on every HTTP request that daphne never uses, found by profiling
    the gateway at 3,000 requests/s (docs/benchmarks.md, Gateway):

    - parsing a POST's Content-Type with the email package, for form fields Twisted would
      put in `request.args`; daphne hands the body to the app, which parses it itself. It
      was 10% of the serving loop's time, and the only cyclic garbage a request left.
    - formatting an access-log line into Twisted's legacy log, which nothing reads here.
    """
    from daphne import http_protocol

    class Request(http_protocol.WebRequest):
        """Also: a gateway request's body past the gateway's bound is refused as it arrives.
        Twisted would otherwise store all of it (in a temporary file past 100 KB) before
        the gateway, which refuses it, is even called."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._parsePOSTFormSubmission = False
            self._body_bytes = 0
            self._refused = False

        def _for_gateway(self) -> bool:
            return getattr(self.channel, "_path", b"").startswith(b"/v1/")

        def _refuse_too_large(self) -> None:
            import io

            from llmgw.gateway.answers import too_large

            self._refused = True
            self.content = io.BytesIO()
            body = too_large().body()
            head = (
                b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            )
            self.channel.transport.write(head + body)
            self.channel.loseConnection()

        def gotLength(self, length):
            from llmgw.gateway.answers import MAX_BODY_BYTES

            if length is not None and length > MAX_BODY_BYTES and self._for_gateway():
                self._refuse_too_large()
                return
            super().gotLength(length)

        def handleContentChunk(self, data):
            from llmgw.gateway.answers import MAX_BODY_BYTES

            if self._refused:
                return
            self._body_bytes += len(data)
            if self._body_bytes > MAX_BODY_BYTES and self._for_gateway():
                self._refuse_too_large()
                return
            super().handleContentChunk(data)

        def process(self):
            if self._refused:
                return
            super().process()
            if self.transport is None and self.channel is not None:
                # Upgraded: daphne handed the socket to a websocket protocol, but Twisted's
                # HTTP channel, still the socket's producer, kept this request (its headers
                # and body), 5 KB for as long as an agent's socket is open.
                self.channel.requests.clear()

    http_protocol.WebRequest = Request  # what daphne's HTTPFactory builds its requests from
    http_protocol.HTTPFactory.log = lambda self, request: None


class _Formatted:
    """An object pretty-printed only when a log line that shows it is written."""

    __slots__ = ("obj",)

    def __init__(self, obj) -> None:
        self.obj = obj

    def __str__(self) -> str:
        return pprint.pformat(self.obj)


@dataclass(frozen=True, slots=True)
class _Opened:
    """An open websocket's request, as daphne still reads it."""

    path: str


def _lighter_handshakes() -> None:
    """autobahn pretty-prints every new websocket's thirty settings for a debug line that is
    never written (`log.debug("...", attrs=pformat(...))` formats before the call): 3.5% of
    the server while 5,000 agents connected again after a restart. Now formatted only if
    that line is written. And the handshake's leftovers are let go once a websocket is
    open."""
    from autobahn.websocket import protocol

    protocol.pformat = _Formatted
    # The module's one other use must still be a string.
    protocol.Timings.__str__ = lambda self: pprint.pformat(self._timings)

    from daphne.ws_protocol import WebSocketProtocol

    opened = WebSocketProtocol.onOpen

    def let_go_of_the_handshake(self):
        """What only the handshake reads, let go once the websocket is open: the request's
        bytes and headers, autobahn's copies and the scope's (3 KB a connection, an agent's
        credential among them). The one websocket, the agents', reads its headers when it
        connects; after, only the path is read (daphne's access log)."""
        opened(self)
        self.request = _Opened(self.request.path)
        self.clean_headers.clear()  # the scope's own list
        self.http_request_data = self.http_headers = None

    WebSocketProtocol.onOpen = let_go_of_the_handshake


def _close_reasons() -> None:
    """daphne closes a websocket with the code the application gave and drops its reason,
    so an agent was never told why it was closed (too many frames, the database away).
    The reason is sent, cut to the 123 bytes a close frame holds."""
    from daphne.ws_protocol import WebSocketProtocol

    handle_reply = WebSocketProtocol.handle_reply

    def with_reason(self, message):
        reason = message.get("reason") if message.get("type") == "websocket.close" else None
        if not reason or self.state == self.STATE_CONNECTING:
            return handle_reply(self, message)
        code = message.get("code") or 1000
        self.sendClose(code=code, reason=reason.encode()[:123].decode(errors="ignore"))

    WebSocketProtocol.handle_reply = with_reason


def _header_deadline(seconds: float) -> None:
    """A connection must finish a request's headers within `seconds` of opening, or of its
    last answer when it is kept alive, or it is closed: a client sending its headers a byte
    at a time (slowloris) would otherwise hold a connection for as long as it likes, since
    Twisted's idle timeout starts again with every byte. Bodies and answers, a stream or a
    mirror file however long, are not timed by this; idle connections still close after
    Twisted's 60 s without a byte."""
    from twisted.internet import reactor
    from twisted.web import http

    made, headers, done, lost = (
        http.HTTPChannel.connectionMade,
        http.HTTPChannel.allHeadersReceived,
        http.HTTPChannel.requestDone,
        http.HTTPChannel.connectionLost,
    )

    def arm(channel) -> None:
        disarm(channel)
        channel._llmgw_deadline = reactor.callLater(seconds, channel.transport.abortConnection)

    def disarm(channel) -> None:
        deadline = getattr(channel, "_llmgw_deadline", None)
        if deadline is not None and deadline.active():
            deadline.cancel()

    def connection_made(self):
        made(self)
        arm(self)

    def all_headers_received(self):
        disarm(self)
        headers(self)

    def request_done(self, request):
        done(self, request)
        if not self._handlingRequest and self.transport is not None:
            arm(self)

    def connection_lost(self, reason):
        disarm(self)
        lost(self, reason)

    http.HTTPChannel.connectionMade = connection_made
    http.HTTPChannel.allHeadersReceived = all_headers_received
    http.HTTPChannel.requestDone = request_done
    http.HTTPChannel.connectionLost = connection_lost


def _server_class():
    """daphne's Server, letting go of a finished request at once.

    daphne keeps every request, its application task and queue until a sweep that runs
    once a second. At 4,000 gateway requests a second that is some 50,000 live objects,
    which is what set off each young garbage collection, and each then walked all of
    them to free nothing: a 10-25 ms pause of the serving loop every thousand requests,
    and the gateway's p99. A request whose connection is done and whose application
    ended cleanly is now dropped when the later of the two happens; anything else (an
    error to log, a task to cancel) is still left to daphne's sweep.
    """
    from daphne.server import Server

    class Reaping(Server):
        def listen_success(self, port):
            # Kept to stop listening on when the server is asked to stop (stopping.py).
            self.__dict__.setdefault("ports", []).append(port)
            super().listen_success(port)

        def create_application(self, protocol, scope):
            """daphne's, with an `Inbox` for what the application receives (an asyncio
            Queue was 3.3 KB a connection, held as long as an agent's socket is open)."""
            assert "application_instance" not in self.connections[protocol]
            inbox = Inbox()
            scope.setdefault("asgi", {"version": "3.0"})
            app = self.application(
                scope=scope, receive=inbox.get, send=partial(self.handle_reply, protocol)
            )
            if protocol not in self.connections:
                app.close()
                return None
            instance = self.connections[protocol]["application_instance"] = asyncio.ensure_future(
                app, loop=asyncio.get_event_loop()
            )
            instance.add_done_callback(lambda _done: self._reap(protocol))
            return inbox

        def protocol_disconnected(self, protocol):
            super().protocol_disconnected(protocol)
            self._reap(protocol)

        def _reap(self, protocol) -> None:
            details = self.connections.get(protocol)
            if not details or "disconnected" not in details:
                return
            instance = details.get("application_instance")
            if instance is None or (
                instance.done() and not instance.cancelled() and instance.exception() is None
            ):
                del self.connections[protocol]

        async def handle_reply(self, protocol, message):
            """Also: a body sent in parts waits while the client is slower than the app.

            daphne hands every part to Twisted at once, and Twisted keeps what the client
            has not taken yet: a mirror file streamed to a slow agent grew the process by
            the file's size. Here the request is given a push producer, which Twisted
            pauses when its write buffer fills and resumes when it drains, and each
            part's send waits until then (the gateway's streams pace the same way)."""
            body = message.get("type") == "http.response.body"
            more = body and message.get("more_body", False)
            pacer = getattr(protocol, "_llmgw_pacer", None)
            if body and not more and pacer is not None:
                protocol._llmgw_pacer = None
                protocol.unregisterProducer()
            await super().handle_reply(protocol, message)
            if not more or getattr(protocol, "finished", True):
                return
            if pacer is None:
                pacer = protocol._llmgw_pacer = Pacer()
                protocol.registerProducer(pacer, True)
            await pacer.wait()

    return Reaping


class Pacer:
    """A Twisted push producer the asyncio side waits on: paused while the connection's
    write buffer is full, resumed when it drains, stopped when the connection is lost."""

    def __init__(self) -> None:
        self._ready = asyncio.Event()
        self._ready.set()
        self.stopped = False

    def pauseProducing(self) -> None:
        if not self.stopped:
            self._ready.clear()

    def resumeProducing(self) -> None:
        self._ready.set()

    def stopProducing(self) -> None:
        self.stopped = True
        self._ready.set()

    async def wait(self) -> None:
        await self._ready.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llmgw serve", description="Run the llmgw control plane.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--workers",
        type=_workers,
        default=None,
        help="processes serving the port (production only; default: one per core)",
    )
    # A worker of `llmgw serve --workers N`: the listening socket it inherits, the renderer.
    parser.add_argument("--worker-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-socket", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    # daphne installs Twisted's asyncio reactor, on a new loop, when imported: the loop is
    # uvloop's from here (front.py), and daphne comes before Django and the rest.
    from .front import uvloop_installed

    uvloop_installed()
    import daphne.server  # noqa: F401

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django

    django.setup()
    from django.conf import settings

    cfg = settings.LLMGW
    if cfg.web.allowed_hosts is None:
        from llmgw.core.web import served_hosts

        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, *served_hosts(args.host)]
    from fleet.metrics.renderer import RENDERER

    if args.worker_fd is not None:
        RENDERER.attach(args.metrics_socket)
        return _serve(args, socket.socket(fileno=args.worker_fd), cfg, worker=True)

    from .workers import Supervisor, bound, workers_wanted

    workers = workers_wanted(args.workers, embedded=cfg.embedded)
    _prepare(cfg.embedded)
    from fleet.reconciler.run import served_record
    from llmgw.core import clock

    # Agents reconnect from now: the reconciler settles before it places anything.
    served_record(now=clock.now())
    # /metrics renders the fleet's series in a process of its own, off the serving loops.
    RENDERER.start()
    if workers == 1:
        return _serve(args, bound(args.host, args.port, reuse_port=False), cfg)
    return Supervisor(args.host, args.port, workers, RENDERER).run()


def _stop_when_orphaned(parent: int) -> None:
    """A worker whose `llmgw serve` is gone (killed: it could pass nothing on) stops as
    if told to, gracefully. Its own session keeps a terminal's Ctrl-C, which the first
    process passes on once, from reaching it twice."""
    loop = asyncio.get_event_loop()

    def look() -> None:
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            loop.call_later(1, look)

    loop.call_later(1, look)


def _workers(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes (1 or more)")
    return count


def _serve(args, listener: socket.socket, cfg, *, worker: bool = False) -> int:
    """Serve the listening socket in this process until stopped: the whole of `llmgw
    serve`, or one of its workers (which leaves the embedded loops and the start's notes to
    the first). The socket is the front's (front.py), which hands daphne what is not the
    gateway's; daphne itself listens on nothing."""
    _lighter_requests()
    _lighter_handshakes()
    _close_reasons()
    Server = _server_class()
    _header_deadline(cfg.header_timeout)
    from fleet.metrics.renderer import RENDERER
    from llmgw.asgi import application, gateway

    _usage_journal(gateway, cfg.home)

    def ready() -> None:
        from twisted.internet import reactor

        # Everything loaded at start lives as long as the process: moved out of the
        # collector's sight. And full collections made rare: each walks every object the
        # connections hold, and paused heartbeats for 100 ms and more at 500 agents.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)

        def start() -> None:
            if cfg.prometheus_url is None:
                from llmgw.core import history

                # The console's charts read this process's history (docs/console.md).
                history.HISTORY.clear(cfg.history_step)
                asyncio.get_event_loop().create_task(history.run_forever())
            if cfg.embedded:
                from fleet.reconciler.run import run_forever
                from mirror.worker import start_embedded

                asyncio.get_event_loop().create_task(run_forever(cfg.timings.reconcile_interval))
                # Downloads resume where a restart cut them.
                start_embedded()

        def flush_usage() -> None:
            if gateway.runtime is not None:
                gateway.runtime.flush_now()
            elif gateway.journal is not None:
                gateway.journal.close(remove=True)  # no request came: it holds nothing

        reactor.callWhenRunning(_front, server, listener, gateway, cfg.header_timeout)
        reactor.callWhenRunning(start)
        reactor.callWhenRunning(stop_on_signals, server, cfg.shutdown_grace)
        # The last seconds of the gateway's usage are written before the process ends.
        reactor.addSystemEventTrigger("before", "shutdown", flush_usage)
        reactor.addSystemEventTrigger("after", "shutdown", RENDERER.stop)
        if worker:
            reactor.callWhenRunning(_stop_when_orphaned, os.getppid())
            return
        mode = (
            f"embedded: SQLite in {cfg.home}, reconciler and mirror in this process"
            if cfg.embedded
            else "production: PostgreSQL and Redis; run Celery worker and beat for the reconciler "
            "and a worker of queue mirror for downloads"
        )
        sys.stderr.write(f"llmgw serving on http://{args.host}:{args.port}/ ({mode})\n")
        sys.stderr.flush()

    from llmgw.cli.stopping import stop_on_signals

    server = Server(
        application=application,
        # daphne refuses to start with no endpoint; it is given one and told to listen on
        # none (the front listens, above), so only its HTTP factory takes connections.
        endpoints=["front"],
        # SIGTERM and SIGINT stop it gracefully (stopping.py), not at once as Twisted would.
        signal_handlers=False,
        verbosity=0,
        # Agents stay connected for weeks: no wall-clock limit on a websocket, only pings.
        websocket_timeout=-1,
        ping_interval=20,
        ping_timeout=30,
        ready_callable=ready,
    )
    server.endpoints = []
    server.run()
    return 0


def _front(server, listener: socket.socket, gateway, header_timeout: float) -> None:
    """Start the front on the serving loop, kept among the ports a stop stops listening on."""
    from .front import Front

    front = Front(gateway, server.http_factory, header_timeout)
    server.__dict__.setdefault("ports", []).append(front)
    asyncio.get_event_loop().create_task(front.listen(listener))


def _usage_journal(gateway, home) -> None:
    """This process's usage journal, opened (and so locked) before the journals of processes
    that died are settled into the Usage rows (llmgw/gateway/journal.py): each worker of
    `--workers N` has its own, and any of them settles a dead one's."""
    from django.db import connection

    from llmgw.gateway.journal import Journal, journals_settle

    try:
        gateway.journal = Journal.open(home)
    except OSError as exc:
        # Serving goes on; what a crash of this process cuts is then lost, as it was before.
        log.error("no usage journal: %s cannot be written (%s)", home / "usage", exc)
    try:
        journals_settle(home)
    finally:
        connection.close()  # the serving threads open their own
