"""The fleet's series rendered in a process of its own, which `llmgw serve` starts.

Reading and writing 100,000 series is a few hundred milliseconds of Python. Done in the
serving process, even in a worker thread, that time is taken from the event loop that
handles the agents' heartbeats and the gateway's requests (one interpreter lock): a
scrape every 2 s moved the heartbeats' p99 by +74 %. Here the serving process only asks
over a pipe and waits, which releases the lock, and adds its own few series (the
gateway's, the agents' connections) to the bytes it gets back. What is rendered is the
same function as in the server (`fleet.metrics.fleet_or_last`), so the text is the same,
byte for byte; when no renderer runs (a test, `manage.py`) the view renders in its own
process as before.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from multiprocessing.connection import Connection

from llmgw.core.outage import Outage

log = logging.getLogger("llmgw.metrics")

# A scrape the renderer has not answered by then is given up, and the renderer replaced:
# Prometheus' own scrape timeout is 10 s by default.
ANSWER_TIMEOUT_S = 30.0
ASK = b"scrape"


class Renderer:
    """The renderer process and the pipe to it; one scrape at a time asks it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._pipe: Connection | None = None
        self._database: str | None = None
        self._outage = Outage("rendering the fleet's metrics in their own process", log)

    def start(self) -> None:
        """Start the renderer, reading the database this process reads."""
        from django.db import connection

        with self._lock:
            self._database = str(connection.settings_dict["NAME"])
            self._spawn()

    def _spawn(self) -> None:
        ours, theirs = multiprocessing.Pipe()
        # spawn, not fork: a fork of a server with threads and open connections copies
        # their locks mid-use.
        process = multiprocessing.get_context("spawn").Process(
            target=serve, args=(theirs, self._database), name="llmgw-metrics", daemon=True
        )
        process.start()
        theirs.close()
        self._process, self._pipe = process, ours

    def fleet(self) -> bytes | None:
        """The fleet's series as the renderer wrote them; None when no renderer runs, or it
        did not answer (it is then replaced, and the caller renders this scrape itself)."""
        with self._lock:
            if self._pipe is None:
                return None
            try:
                self._pipe.send_bytes(ASK)
                if not self._pipe.poll(ANSWER_TIMEOUT_S):
                    raise TimeoutError(f"no answer in {ANSWER_TIMEOUT_S:g} s")
                text = self._pipe.recv_bytes()
            except (EOFError, OSError, TimeoutError) as exc:
                self._outage.failed(exc)
                self._end()
                self._spawn()
                return None
            self._outage.worked()
            return text

    def stop(self) -> None:
        """Stop the renderer (the server is stopping); scrapes are rendered here after."""
        with self._lock:
            self._end()

    def _end(self) -> None:
        if self._pipe is not None:
            self._pipe.close()
        if self._process is not None:
            self._process.terminate()
            self._process.join(5)
        self._process = self._pipe = None


RENDERER = Renderer()


def serve(pipe: Connection, database: str | None) -> None:
    """The renderer's whole life (this module imports no Django, so that a process spawned
    here can import it before Django is set up): set Django up on the server's database, then answer each
    ask with the fleet's series until the server closes the pipe (or dies: the same)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django

    django.setup()
    from django.db import connection

    from .metrics import fleet_or_last

    if database is not None:
        # The server may read another database than its settings name (a test's).
        connection.close()
        connection.settings_dict["NAME"] = database
    while True:
        try:
            pipe.recv_bytes()
        except (EOFError, OSError):
            return
        pipe.send_bytes(fleet_or_last().encode())
