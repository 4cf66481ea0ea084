"""Run a reconciler pass soon rather than at the next interval.

Embedded, the loop in `llmgw serve` (fleet/reconciler/run.py `run_forever`) waits on an event
this module holds; in production a Celery worker is sent the task by its name. It imports
nothing of fleet, so the gateway, the services and the reconciler may all use it.
"""

from __future__ import annotations

import asyncio

from celery import current_app
from django.conf import settings

TASK = "fleet.tasks.reconcile"

_woken: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None


def listen() -> asyncio.Event:
    """The event the embedded loop waits on between passes, set by `wake()` (on this loop)."""
    global _woken
    event = asyncio.Event()
    _woken = (asyncio.get_running_loop(), event)
    return event


def wake() -> None:
    """Run a pass soon: an on-demand model was asked for, or a replica was found unreachable.

    Embedded, the loop stops waiting; in production a Celery worker is sent the task (the
    pass lock keeps it from running beside beat's). Callable from any thread.
    """
    if settings.LLMGW.embedded:
        if _woken is not None:
            loop, event = _woken
            loop.call_soon_threadsafe(event.set)
        return
    current_app.send_task(TASK)
