"""The one clock the shell reads; the rules are handed `now`."""

from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)
