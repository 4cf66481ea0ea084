"""The fleet's series rendered in a process of its own, which `llmgw serve` starts.

Reading and writing 100,000 series is a few hundred milliseconds of Python. Done in the
serving process, even in a worker thread, that time is taken from the event loop that
handles the agents' heartbeats and the gateway's requests (one interpreter lock): a
scrape every 2 s moved the heartbeats' p99 by +74 %. Here a serving process only asks
over a Unix socket and waits, which releases the lock: it sends its own few series (the
gateway's, the agents' connections) with the ask, and gets back the whole body, gzipped
here when the scrape asked for it (compressing 7 MB is tens of milliseconds more taken
from the serving process otherwise, and 0.5 MB crosses the socket rather than 7).
`llmgw serve` starts one renderer however many workers it runs (`start`); each worker
asks it (`attach`). What is rendered is the same function as in the server
(`fleet.metrics.collector.fleet_or_last`), so the text is the same, byte for byte; when no
renderer runs (a test, `manage.py`), or it does not answer, the view renders in its own
process as before.
"""

from __future__ import annotations

import gzip
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

from llmgw.core.outage import Outage

log = logging.getLogger("llmgw.metrics")

# A scrape the renderer has not answered by then is given up (and, by the process that
# started it, the renderer replaced): Prometheus' own scrape timeout is 10 s by default.
ANSWER_TIMEOUT_S = 30.0
# How long a first ask waits for a renderer still setting Django up.
START_TIMEOUT_S = 30.0
# An ask: one byte for how the body is wanted, then the asking process's own series.
PLAIN, GZIP = b"p", b"g"
NICENESS = 10
# Prometheus asks for gzip; level 1 is most of the saving for a fraction of the time.
COMPRESSLEVEL = 1


class Renderer:
    """The renderer, as a serving process sees it: the one it started, or one it attached to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._folder: Path | None = None
        self._database: str | None = None
        self.address: str | None = None
        self._conn: Connection | None = None
        self._outage = Outage("rendering the fleet's metrics in their own process", log)

    def start(self) -> None:
        """Start a renderer reading the database this process reads, at a socket in a
        folder of its own (0700)."""
        from django.db import connection

        with self._lock:
            self._database = str(connection.settings_dict["NAME"])
            self._folder = Path(tempfile.mkdtemp(prefix="llmgw-metrics-"))
            self.address = str(self._folder / "renderer.sock")
            self._spawn()

    def attach(self, address: str) -> None:
        """Ask the renderer another process started (a worker of `llmgw serve`)."""
        with self._lock:
            self.address = address

    def _spawn(self) -> None:
        # spawn, not fork: a fork of a server with threads and open connections copies
        # their locks mid-use.
        self._process = multiprocessing.get_context("spawn").Process(
            target=serve,
            args=(self.address, self._database, os.getpid()),
            name="llmgw-metrics",
            daemon=True,
        )
        self._process.start()

    def keep_alive(self) -> None:
        """Start the renderer again if it died (this process started it)."""
        with self._lock:
            if self._process is not None and not self._process.is_alive():
                self._outage.failed(RuntimeError(f"exit code {self._process.exitcode}"))
                self._replace()

    def body(self, own: bytes = b"", *, gzip: bool = False) -> bytes | None:
        """The fleet's series as the renderer wrote them followed by `own`, gzipped when
        asked; None when no renderer runs, or it did not answer (the caller renders this
        scrape itself; a renderer this process started is replaced)."""
        with self._lock:
            if self.address is None:
                return None
            try:
                if self._conn is None:
                    self._conn = self._connect()
                self._conn.send_bytes((GZIP if gzip else PLAIN) + own)
                if not self._conn.poll(ANSWER_TIMEOUT_S):
                    raise TimeoutError(f"no answer in {ANSWER_TIMEOUT_S:g} s")
                text = self._conn.recv_bytes()
            except (EOFError, OSError, TimeoutError) as exc:
                self._outage.failed(exc)
                self._hang_up()
                if self._process is not None:
                    self._replace()
                return None
            self._outage.worked()
            return text

    def _connect(self) -> Connection:
        # The renderer may still be setting Django up: a second or two after a start.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                return Client(self.address, family="AF_UNIX")
            except (FileNotFoundError, ConnectionRefusedError):
                gone = self._process is not None and not self._process.is_alive()
                if gone or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _hang_up(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _replace(self) -> None:
        self._end_process()
        if self.address is not None:
            Path(self.address).unlink(missing_ok=True)
        self._spawn()

    def _end_process(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.join(5)

    def stop(self) -> None:
        """Stop asking; a renderer this process started ends, with its socket's folder."""
        with self._lock:
            self._hang_up()
            self._end_process()
            self._process = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None
            self.address = None


RENDERER = Renderer()


def serve(address: str, database: str | None, parent: int) -> None:
    """The renderer's whole life (this module imports no Django, so that a process spawned
    here can import it before Django is set up): set Django up on the server's database,
    then answer each ask, one render at a time, until the process that started it is gone."""
    # A terminal's Ctrl-C is the server's to act on; it ends this process when it stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Where cores are few, the serving loop comes first: a scrape may take longer, a
    # heartbeat should not.
    os.nice(NICENESS)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django

    django.setup()
    from django.db import close_old_connections, connections

    from .collector import fleet_or_last

    if database is not None:
        # The server may read another database than its settings name (a test's); each
        # answering thread opens its own connection from these settings.
        connections.settings["default"]["NAME"] = database
    rendering = threading.Lock()

    def answer(conn: Connection) -> None:
        with conn:
            while True:
                try:
                    ask = conn.recv_bytes()
                except (EOFError, OSError):
                    return
                with rendering:
                    # As Django does around each request: a connection the database
                    # dropped, or past its age, is not used again.
                    close_old_connections()
                    text = fleet_or_last().encode() + ask[1:]
                if ask[:1] == GZIP:
                    text = gzip.compress(text, compresslevel=COMPRESSLEVEL)
                conn.send_bytes(text)

    def orphaned() -> None:
        # Killed, the server closes nothing: its renderer must not outlive it.
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()
    with Listener(address, family="AF_UNIX") as listener:
        while True:
            threading.Thread(target=answer, args=(listener.accept(),), daemon=True).start()
