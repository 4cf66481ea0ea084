"""How many workers `llmgw serve` runs, and their own series summed for `/metrics`
(issue 13, item 5). The workers serving one cluster are tests/e2e/test_workers.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from llmgw.cli import workers
from llmgw.core import worker_series

# A worker's share: requests answered, a refusal, requests running at the gateway.
_WORKER = """
import sys
import time
from fleet.nodes import connections
from llmgw.gateway import metrics
for _ in range(int(sys.argv[1])):
    metrics.series("small").answered(200)
connections.REFUSED.labels("join_rate").inc()
metrics.load_gauges({"small": (int(sys.argv[1]), 0)})
"""


def test_one_worker_per_core_in_production_and_one_embedded(monkeypatch):
    monkeypatch.setattr(workers, "cores", lambda: 6)
    assert workers.workers_wanted(None, embedded=False) == 6
    assert workers.workers_wanted(None, embedded=True) == 1
    assert workers.workers_wanted(3, embedded=False) == 3
    assert workers.workers_wanted(1, embedded=True) == 1


def test_several_workers_embedded_are_refused_with_the_reason():
    with pytest.raises(SystemExit, match="--workers 2 needs REDIS_URL"):
        workers.workers_wanted(2, embedded=True)


def test_one_process_has_no_shared_folder(monkeypatch):
    monkeypatch.delenv(worker_series.FOLDER_ENV, raising=False)
    assert worker_series.summed_text() is None


def test_workers_series_are_summed_and_a_gone_workers_gauges_leave(monkeypatch):
    folder = worker_series.made()
    try:
        env = {**os.environ, worker_series.FOLDER_ENV: folder}
        pids = []
        for requests in (2, 5):
            proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(requests)], env=env)
            assert proc.wait(timeout=60) == 0
            pids.append(proc.pid)
        monkeypatch.setenv(worker_series.FOLDER_ENV, folder)

        text = worker_series.summed_text()
        assert 'llmgw_gateway_requests_total{code="200",model="small"} 7.0' in text
        assert 'llmgw_agent_refused_total{reason="join_rate"} 2.0' in text
        assert 'llmgw_gateway_requests_running{model="small"} 7.0' in text
        # Counters that counted nothing say nothing, as one process's registry does.
        assert "llmgw_agent_frames_dropped" not in text

        worker_series.worker_gone(folder, pids[1])
        text = worker_series.summed_text()
        assert 'llmgw_gateway_requests_total{code="200",model="small"} 7.0' in text
        assert 'llmgw_gateway_requests_running{model="small"} 2.0' in text
    finally:
        worker_series.removed(folder)
    assert not os.path.exists(folder)


def _accepted(listener: socket.socket) -> int:
    """How many connections wait on `listener`, accepted and closed."""
    listener.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


@pytest.fixture
def supervisor():
    """Supervisors made in a test (their sockets only: no workers start), their series'
    folders removed after."""
    made: list[workers.Supervisor] = []

    def make(port: int, count: int) -> workers.Supervisor:
        made.append(workers.Supervisor("127.0.0.1", port, count, renderer=None))
        return made[-1]

    yield make
    for sup in made:
        worker_series.removed(sup.series)


def test_each_worker_has_a_socket_of_its_own_and_the_kernel_spreads_connections(supervisor):
    sup = supervisor(0, 4)
    listeners = sup.listen()
    try:
        assert {s.getsockname()[1] for s in listeners} == {sup.port}
        clients = [socket.create_connection(("127.0.0.1", sup.port)) for _ in range(64)]
        time.sleep(0.2)
        counts = [_accepted(s) for s in listeners]
        for client in clients:
            client.close()
        # Hashed over four sockets, each gets some; one shared socket gave 43 of 64 to one
        # of two. (All 64 to three sockets or fewer: a chance of 4 × 0.75^64, 4e-8.)
        assert sum(counts) == 64, counts
        assert all(count > 0 for count in counts), counts
    finally:
        for s in listeners:
            s.close()


def test_a_port_already_served_is_refused_even_by_a_server_sharing_ports(supervisor):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
            supervisor(port, 2).listen()
    finally:
        held.close()
    first = supervisor(port, 2)
    listeners = first.listen()
    try:
        # Another `llmgw serve --workers` on the same port would take a share of its
        # connections without a word: it is refused.
        with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
            supervisor(port, 2).listen()
    finally:
        for s in listeners:
            s.close()


def test_a_dead_workers_socket_is_closed_and_its_successor_gets_a_new_one(monkeypatch, supervisor):
    sup = supervisor(0, 2)
    listeners = sup.listen()
    started = []
    monkeypatch.setattr(sup, "_start", lambda i, listener: started.append((i, listener)))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    sup.started[1] = time.monotonic() - 2 * workers.RESTART_BACKOFF_S  # not young: no wait
    try:
        new = sup._died(1, dead, listeners[1])
        assert listeners[1].fileno() == -1  # closed: the kernel hashes over the living only
        assert started == [(1, new)]
        assert new.getsockname()[1] == sup.port
        listeners[1] = new
        clients = [socket.create_connection(("127.0.0.1", sup.port)) for _ in range(32)]
        time.sleep(0.2)
        counts = [_accepted(s) for s in listeners]
        for client in clients:
            client.close()
        assert sum(counts) == 32 and all(counts), counts
    finally:
        for s in listeners:
            s.close()
