"""One pass at a time on PostgreSQL: an advisory lock that dies with the process holding it.

A real second process runs a real pass and is killed with SIGKILL in the middle of it;
the next pass here runs at once, without settling (a worker died, not the control plane).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.db import connection

from fleet.models import Lease
from fleet.reconciler.run import ADVISORY_KEY, LEASE, reconcile_once
from llmgw.core import clock

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="advisory locks are PostgreSQL's; SQLite keeps the lease",
    ),
]

# A worker's pass that stops in the middle, holding the lock, until it is killed.
MID_PASS = """
import sys, time
import django
django.setup()
from fleet.reconciler import run as reconciler

def stuck(*args, **kwargs):
    print("mid-pass", flush=True)
    time.sleep(600)

reconciler.decide = stuck
reconciler.reconcile_once()
"""


def _worker() -> subprocess.Popen:
    url = urlparse(os.environ["DATABASE_URL"])._replace(path=f"/{connection.settings_dict['NAME']}")
    env = {**os.environ, "DATABASE_URL": url.geturl(), "DJANGO_SETTINGS_MODULE": "llmgw.settings"}
    env.pop("REDIS_URL", None)
    return subprocess.Popen(
        [sys.executable, "-c", MID_PASS], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True
    )


def _lock_holders() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND ((classid::bigint << 32) | objid::bigint) = %s",
            [ADVISORY_KEY & 0xFFFFFFFFFFFFFFFF],
        )
        return cursor.fetchone()[0]


def test_a_worker_killed_mid_pass_holds_nothing_up_and_the_next_pass_runs_at_once():
    now = clock.now()
    # Passes have been running every 5 s for a while: nothing to settle for.
    Lease.objects.create(
        name=LEASE,
        expires_at=now,
        last_pass_at=now - timedelta(seconds=5),
        settled_from=now - timedelta(minutes=10),
        settle_until=now - timedelta(minutes=9, seconds=30),
    )
    worker = _worker()
    try:
        assert worker.stdout.readline().strip() == "mid-pass"
        assert _lock_holders() == 1
        assert reconcile_once()["ran"] is False

        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        # The server ends the dead client's session as soon as it reads its closed socket.
        deadline = time.monotonic() + 10
        while _lock_holders() and time.monotonic() < deadline:
            time.sleep(0.05)

        after = reconcile_once()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    assert after["ran"] is True
    assert after["settling"] is False
    assert _lock_holders() == 0  # let go at the end of the pass


def test_two_passes_here_one_after_the_other_both_run():
    assert reconcile_once()["ran"] is True
    assert reconcile_once()["ran"] is True
    assert _lock_holders() == 0
