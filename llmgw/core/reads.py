"""Reads one request makes more than once, made once.

A page built of parts (a model's: its view, its replicas, its explanation, headroom and
the preemption dry run) asks the same selectors again and again: the catalog, every
model's state, every replica. Inside `once_each()` the first read of each is kept, and
the rest are answered from it (a selector asked for one model's rows takes them from the
whole read), so what the page shows is one moment's and the page makes each read once.
Outside it, nothing is kept: the reconciler and the API read afresh every time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_kept: ContextVar[dict[str, Any] | None] = ContextVar("llmgw_reads_kept", default=None)


@contextmanager
def once_each() -> Iterator[None]:
    token = _kept.set({})
    try:
        yield
    finally:
        _kept.reset(token)


def sharing() -> bool:
    """Whether reads are kept now (inside once_each)."""
    return _kept.get() is not None


def once(key: str, read: Callable[[], Any]) -> Any:
    """`read()`, or, inside once_each, what it gave the first time `key` was read."""
    kept = _kept.get()
    if kept is None:
        return read()
    if key not in kept:
        kept[key] = read()
    return kept[key]
