"""The control plane's own health in one read: its database, Redis, the reconciler's last
pass, the workers, the nodes by state and the models that need attention (`GET
/api/v1/status`, `llmgw ctl status`).

A part that cannot be asked (Redis, the workers in embedded mode) is said as not used,
with why, never as healthy; one that fails to answer is said with its error.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

from django.conf import settings
from django.db import connection

from catalog.selectors.listings import model_views

from ..models import Node
from .passes import reconciler_status

# How long the Celery workers have to answer a ping, and Redis to answer its own.
WORKER_PING_S = 1.0
REDIS_TIMEOUT_S = 2.0


def control_plane_status(*, now: datetime) -> dict:
    """Every part's health, as GET /api/v1/status answers it."""

    return {
        "database": database_health(),
        "redis": redis_health(),
        "reconciler": reconciler_status(now=now),
        "workers": workers_health(),
        "nodes": nodes_by_state(),
        "attention": needing_attention(model_views()),
    }


def database_health() -> dict:
    """The database answers a query, and how fast."""
    started = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # a status page says what failed rather than failing itself
        return {"ok": False, "vendor": connection.vendor, "ms": None, "said": str(exc)[:300]}
    ms = round((time.perf_counter() - started) * 1000, 1)
    return {"ok": True, "vendor": connection.vendor, "ms": ms, "said": f"{connection.vendor}"}


def redis_health() -> dict:
    """Redis answers a PING, and how fast; not used in embedded mode."""
    url = settings.LLMGW.redis_url
    if not url:
        return {
            "ok": None,
            "ms": None,
            "said": "not used: embedded mode keeps its layers in memory",
        }
    import redis

    started = time.perf_counter()
    try:
        redis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        ).ping()
    except Exception as exc:
        return {"ok": False, "ms": None, "said": f"no answer: {exc}"[:300]}
    ms = round((time.perf_counter() - started) * 1000, 1)
    return {"ok": True, "ms": ms, "said": "answers PING"}


def workers_health() -> dict:
    """The Celery workers that answer a ping (the reconciler's and the mirror's); in
    embedded mode the reconciler runs inside llmgw serve and there are none to ask."""
    if settings.LLMGW.embedded:
        return {"ok": None, "names": [], "said": "not used: the reconciler runs inside llmgw serve"}
    # The process's Celery app, which the root configures (llmgw/celery.py); an app does
    # not import the root.
    from celery import current_app as app

    try:
        answers = app.control.ping(timeout=WORKER_PING_S) or []
    except Exception as exc:
        return {"ok": False, "names": [], "said": f"cannot ask the workers: {exc}"[:300]}
    names = sorted(name for answer in answers for name in answer)
    if not names:
        return {
            "ok": False,
            "names": [],
            "said": f"no Celery worker answered within {WORKER_PING_S:g} s",
        }
    return {"ok": True, "names": names, "said": f"{len(names)} answered"}


def nodes_by_state() -> dict[str, int]:
    """How many nodes are ready, unreachable and lost, and of those how many are cordoned
    or draining."""
    counts: Counter[str] = Counter({Node.READY: 0, Node.UNREACHABLE: 0, Node.LOST: 0})
    for state, cordoned, draining in Node.objects.values_list("state", "cordoned", "draining"):
        counts[state] += 1
        counts["cordoned"] += bool(cordoned and not draining)
        counts["draining"] += bool(draining)
    return {"cordoned": 0, "draining": 0, **counts}


def needing_attention(models: list[dict]) -> list[dict]:
    """The models that cannot run as asked, as the cluster page's "Needs attention" counts
    them: parked, failing, or that cannot be placed; each with why (its status's sentence,
    which for a failing model is the engine's line that says why, or else that line)."""
    out = []
    for m in models:
        failure = m.get("last_failure") or {}
        if not (m.get("parked") or m.get("unplaceable") or failure):
            continue
        why = m.get("reason") or failure.get("said") or ""
        out.append({"name": m["name"], "status": m.get("status") or "", "reason": why})
    return out
