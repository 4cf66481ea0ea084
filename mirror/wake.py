"""Have the mirror's worker look for due files now rather than at its next look.

Embedded, the worker thread in `llmgw serve` (mirror/worker.py) waits on an event this
module holds; in production a Celery worker on the mirror's queue is sent the task by its
name. It imports nothing of the mirror, so the services and the worker may both use it.
"""

from __future__ import annotations

import threading

from celery import current_app
from django.conf import settings

TASK = "mirror.tasks.fetch"

_event = threading.Event()


def wake() -> None:
    """Have the worker look for work now. Callable from any thread."""
    if settings.LLMGW.embedded:
        _event.set()
    else:
        current_app.send_task(TASK)


def wait(seconds: float) -> None:
    """The embedded worker, idle: wait until woken or `seconds` pass."""
    _event.wait(seconds)
    _event.clear()
