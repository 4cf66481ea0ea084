"""`llmgw serve --workers N`: N processes serving one port, each a whole server.

The first process binds the port N times, one listening socket a worker with SO_REUSEPORT,
and hands each worker its own (the kernel hashes each new connection onto one of the
sockets, so the workers get even shares; one shared socket let whichever worker woke first
take them: 43 of 64 to one of two, docs/benchmarks.md). Each
worker has its own gateway tables and agent connections and works with the others through
the database and the channel layer, exactly as separate servers behind a balancer do
(docs/architecture.md); so more than one needs Redis: embedded, commands to agents and the
gateway's limits live in one process's memory. This process serves nothing itself: it
keeps the workers and the metrics renderer running, starts again a worker that died, and
passes a stop on to every worker, which then stops gracefully (stopping.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time

from llmgw.core import worker_series

log = logging.getLogger("llmgw.serve")

# A worker that dies within this of its start is started again only after this long, so a
# worker that cannot start does not spin.
RESTART_BACKOFF_S = 5.0
# On a stop, how long past the workers' own grace before they are killed.
STOP_MARGIN_S = 10.0


def cores() -> int:
    """The cores this process may run on (its affinity, as a container's cpuset sets it)."""
    return len(os.sched_getaffinity(0))


def workers_wanted(asked: int | None, *, embedded: bool) -> int:
    """How many workers to run: as asked, else one per core in production and one
    embedded. More than one embedded is refused (SystemExit with the reason)."""
    if asked is None:
        return 1 if embedded else cores()
    if asked > 1 and embedded:
        raise SystemExit(
            f"llmgw: --workers {asked} needs REDIS_URL (and DATABASE_URL): embedded, the "
            "commands to agents and the gateway's limits live in one process's memory. "
            "Embedded, llmgw serve runs one process."
        )
    return asked


def bound(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """A socket listening on host:port, or SystemExit saying why it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise SystemExit(f"llmgw: cannot listen on {host}:{port}: {exc}") from None
    listener.listen(1024)
    return listener


class Supervisor:
    """The workers of one `llmgw serve`, and their one listening socket."""

    def __init__(self, host: str, port: int, count: int, renderer) -> None:
        self.host, self.port, self.count, self.renderer = host, port, count, renderer
        self.procs: list[subprocess.Popen | None] = [None] * count
        self.started: list[float] = [0.0] * count
        self.stopping = False
        # Where the workers' own series are summed for `/metrics` (worker_series.py).
        self.series = worker_series.made()

    def run(self) -> int:
        from django.conf import settings

        grace = settings.LLMGW.shutdown_grace
        listeners = self.listen()
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for i in range(self.count):
            self._start(i, listeners[i])
        mode = "production: PostgreSQL and Redis; run Celery worker and beat for the reconciler "
        sys.stderr.write(
            f"llmgw serving on http://{self.host}:{self.port}/ ({self.count} workers; {mode}"
            "and a worker of queue mirror for downloads)\n"
        )
        sys.stderr.flush()
        while not self.stopping:
            time.sleep(0.5)
            if self.stopping:  # the signal that woke the sleep: the renderer may be ending too
                break
            self.renderer.keep_alive()
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None and not self.stopping:
                    listeners[i] = self._died(i, proc, listeners[i])
        # Once the workers have stopped listening, the port refuses, as one server's does.
        for listener in listeners:
            listener.close()
        try:
            return self._wait(grace + STOP_MARGIN_S)
        finally:
            worker_series.removed(self.series)

    def listen(self) -> list[socket.socket]:
        """One listening socket a worker, all on the port with SO_REUSEPORT. The port is
        first bound alone, so a port another server holds (or another `llmgw serve
        --workers`, whose sockets would otherwise take a share of its connections) is
        refused (SystemExit with the reason)."""
        self._bound(reuse_port=False).close()
        return [self._bound(reuse_port=True) for _ in range(self.count)]

    def _bound(self, *, reuse_port: bool) -> socket.socket:
        listener = bound(self.host, self.port, reuse_port=reuse_port)
        if self.port == 0:  # asked for any free port: the workers' sockets share the one given
            self.port = listener.getsockname()[1]
        listener.set_inheritable(True)
        return listener

    def _start(self, i: int, listener: socket.socket) -> None:
        fd = listener.fileno()
        argv = [
            sys.executable,
            "-m",
            "llmgw",
            "serve",
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]
        argv += ["--worker-fd", str(fd), "--metrics-socket", self.renderer.address]
        # A session of its own: a terminal's Ctrl-C reaches this process only, which passes
        # it on once (a second signal would stop a worker at once).
        env = {**os.environ, worker_series.FOLDER_ENV: self.series}
        self.procs[i] = subprocess.Popen(argv, pass_fds=(fd,), start_new_session=True, env=env)
        self.started[i] = time.monotonic()

    def _died(self, i: int, proc: subprocess.Popen, listener: socket.socket) -> socket.socket:
        """Start worker `i` again, on a socket of its own again: the dead worker's is closed
        at once, so the kernel hashes new connections over the living workers' sockets
        while this one starts (those the dead one had not accepted are reset)."""
        young = time.monotonic() - self.started[i] < RESTART_BACKOFF_S
        log.warning(
            "worker %d (pid %d) exited with code %s; starting another%s",
            i + 1,
            proc.pid,
            proc.returncode,
            f" in {RESTART_BACKOFF_S:g} s" if young else "",
        )
        self.procs[i] = None
        worker_series.worker_gone(self.series, proc.pid)
        listener.close()
        if young:
            time.sleep(RESTART_BACKOFF_S)
        listener = self._bound(reuse_port=True)
        if not self.stopping:
            self._start(i, listener)
        return listener

    def _stop(self, signum: int, _frame) -> None:
        if self.stopping:  # asked again: at once, as a single server does
            for proc in self._running():
                proc.kill()
            return
        self.stopping = True
        for proc in self._running():
            proc.send_signal(signal.SIGTERM)

    def _running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p is not None and p.poll() is None]

    def _wait(self, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        for proc in self._running():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker pid %d did not stop in %.0f s; killed", proc.pid, seconds)
                proc.kill()
                proc.wait()
        self.renderer.stop()
        return 0
