"""Where one room offers a reading another asks for, with no import between them.

The gateway offers its load (requests running and waiting per model, over every gateway
process) and the text of its metrics when Django starts, in every process
(llmgw/gateway/apps.py); fleet asks for them, for the autoscaler and for `/metrics`. A
reading nobody offered is absent: the asker gets its `absent` value, never a zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

GATEWAY_LOAD = "gateway.load"  # () -> {model: (running, waiting)}, None when unknown
GATEWAY_METRICS = "gateway.metrics"  # () -> Prometheus text

_offered: dict[str, Callable[[], Any]] = {}


def offer(name: str, read: Callable[[], Any]) -> None:
    """Offer `read` as the source of reading `name` (the last offer stands)."""
    _offered[name] = read


def read(name: str, absent: Any = None) -> Any:
    """What the source offered under `name` reads now; `absent` when none was offered."""
    source = _offered.get(name)
    return absent if source is None else source()
