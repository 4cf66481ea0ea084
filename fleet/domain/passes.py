"""When the reconciler settles, and when its passes have stopped: pure rules over timestamps.

Settling exists for a control plane that came back: agents need a moment to reconnect
and say what they run before anything is placed, and silence is not counted from
before the restart. A Celery worker replaced while `llmgw serve` and the agents'
websockets stayed up is no restart: heartbeats went on being written, so nothing
waits for them.
"""

from __future__ import annotations

from datetime import datetime

from llmgw.core.config import Timings


def _since(then: datetime, now: datetime) -> float:
    return (now - then).total_seconds()


def gap_allowed(t: Timings) -> float:
    """The longest pause between passes that is no restart: the unreachable window (a node
    could have been called unreachable meanwhile), and at least three intervals."""
    return max(t.unreachable, 3 * t.reconcile_interval)


def restart_at(
    *,
    now: datetime,
    last_pass_at: datetime | None,
    served_since: datetime | None,
    settled_from: datetime | None,
    fresh_start: bool,
    t: Timings,
) -> datetime | None:
    """When the control plane (re)started, if this pass must settle for a restart it has not
    settled for yet; None otherwise.

    - `fresh_start`: the first pass of a reconciler that lives inside `llmgw serve`
      (embedded), whose start is the control plane's.
    - no pass ever, or none for longer than `gap_allowed`: nothing says heartbeats were
      written meanwhile (the database or every server may have been away).
    - `served_since`, the latest start `llmgw serve` recorded, after the settle last
      started from: that server's agents reconnect from then.
    """
    if fresh_start or last_pass_at is None or _since(last_pass_at, now) > gap_allowed(t):
        return now
    if served_since is not None and (settled_from is None or served_since > settled_from):
        return min(served_since, now)
    return None


def settles(*, now: datetime, settled_from: datetime | None, t: Timings) -> bool:
    """Whether a pass at `now` still settles: within `settle` seconds of the restart."""
    return settled_from is not None and _since(settled_from, now) < t.settle


def stale_after(t: Timings) -> float:
    """Seconds without a pass after which operators are told: three intervals, at least 15."""
    return max(3 * t.reconcile_interval, 15.0)


def stale_warning(
    *,
    now: datetime,
    last_pass_at: datetime | None,
    served_since: datetime | None,
    embedded: bool,
    t: Timings,
) -> str | None:
    """A sentence when no reconciler pass ran for `stale_after`, with the figures; None
    while passes run (or before anything was ever started: nothing to expect yet)."""
    since = last_pass_at or served_since
    if since is None:
        return None
    age = _since(since, now)
    if age <= stale_after(t):
        return None
    cause = (
        "the reconciler in llmgw serve has stopped; see its log"
        if embedded
        else "is celery beat running, and a worker?"
    )
    every = f"every {t.reconcile_interval:g} s expected"
    if last_pass_at is None:
        return f"no reconciler pass since llmgw serve started {age:.0f} s ago ({every}): {cause}"
    return f"no reconciler pass for {age:.0f} s ({every}): {cause}"
