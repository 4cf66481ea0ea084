"""Plain-text rendering for ``llmgw ctl``: tables, key/value blocks and small formatters.

Everything here is pure: values in, text out. A value the server left out (or
sent as ``None`` or an empty string or list) is shown as ``-``. Absent is
unknown, so nothing here turns a missing figure into ``0``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

DASH = "-"

# Two spaces between columns, as `kubectl get` and the seed's tabwriter do.
GAP = "  "


def is_absent(value: Any) -> bool:
    """Whether a value says nothing: ``None``, ``""``, or an empty list or mapping."""
    return value is None or (isinstance(value, str | list | tuple | dict) and not value)


def cell(value: Any) -> str:
    """A value as one table cell: ``-`` when absent, ``yes``/``no`` for booleans."""
    if is_absent(value):
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, list | tuple):
        return joined(value)
    return str(value)


def number(value: Any, digits: int = 1) -> str:
    """``16.0`` → ``16``, ``5.25`` → ``5.2`` (at most ``digits`` decimals); absent → ``-``."""
    if value is None or isinstance(value, bool):
        return DASH
    if isinstance(value, int):
        return str(value)
    try:
        figure = float(value)
    except (TypeError, ValueError):
        return str(value)
    text = f"{figure:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def gb(value: Any) -> str:
    """``16`` → ``16 GB``; absent → ``-``."""
    return DASH if value is None else f"{number(value)} GB"


def size(n: int | None) -> str:
    """Bytes for people: 253.1 MB, 1.2 GB; unknown is a dash, never 0."""
    if n is None:
        return DASH
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def joined(values: Iterable[Any] | None, sep: str = ", ") -> str:
    """Values joined with ``sep``, or ``-`` when there are none."""
    items = [str(v) for v in values or () if not is_absent(v)]
    return sep.join(items) if items else DASH


def render(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A table: headers in capitals, each column as wide as its widest cell.

    Cells go through :func:`cell`, so absent values read ``-``. The last column
    is not padded, so no line ends in spaces.
    """
    head = [h.upper() for h in headers]
    body = [[cell(v) for v in row] for row in rows]
    for row in body:
        if len(row) != len(head):
            raise ValueError(f"a row has {len(row)} cells for {len(head)} columns")
    widths = [max([len(h)] + [len(row[i]) for row in body]) for i, h in enumerate(head)]
    lines = []
    for row in [head, *body]:
        padded = [text.ljust(width) for text, width in zip(row, widths, strict=True)]
        lines.append(GAP.join(padded).rstrip())
    return "\n".join(lines)


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    """``key: value`` lines with the values lined up; absent values read ``-``."""
    if not pairs:
        return ""
    width = max(len(key) for key, _ in pairs) + 1
    return "\n".join(f"{(key + ':').ljust(width)} {cell(value)}".rstrip() for key, value in pairs)


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 timestamp as an aware datetime (UTC when it names no zone); else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        # fromisoformat takes "Z" from 3.11 on; naive times are the server's UTC.
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def age(value: Any, now: datetime | None = None) -> str:
    """How long ago an ISO 8601 time was: ``3s``, ``2m``, ``5h``, ``3d``; ``-`` when unknown.

    A time slightly in the future (the server's clock ahead of ours) reads
    ``0s`` rather than a negative age.
    """
    when = parse_time(value)
    if when is None:
        return DASH
    now = now or datetime.now(UTC)
    seconds = max(int((now - when).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 60 * 60:
        return f"{seconds // 60}m"
    if seconds < 48 * 60 * 60:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"
