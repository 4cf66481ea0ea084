"""The one clock the shell reads; the rules are handed `now`."""

import re
from datetime import UTC, datetime, timedelta

from .errors import Invalid

_SPAN_RE = re.compile(r"^([0-9]{1,9})([smhdw])$")
_SPAN_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SINCE_LONGEST = 64


def now() -> datetime:
    return datetime.now(UTC)


def since(text: str, *, now: datetime, what: str = "since") -> datetime:
    """A time asked for as an ISO 8601 time (UTC when it names no zone) or a span back from
    `now` (`90s`, `15m`, `24h`, `7d`, `2w`). Raises Invalid with an example of each form
    for anything else."""
    text = text.strip()
    refused = Invalid(
        f"{what} must be a time such as 2026-01-31T09:00:00Z or a span such as 15m, 24h "
        f"or 7d, not {text[:_SINCE_LONGEST]!r}."
    )
    if len(text) > _SINCE_LONGEST:
        raise refused
    try:
        span = _SPAN_RE.match(text.lower())
        if span:
            return now - timedelta(seconds=int(span[1]) * _SPAN_UNITS[span[2]])
        when = datetime.fromisoformat(text)
    except (ValueError, OverflowError):  # not a time, or one before the year 1
        raise refused from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)
