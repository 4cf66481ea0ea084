"""`{{ value|bytes }}`: a size in bytes as every page says it, in decimal units (253.1 MB,
as Hugging Face and the mirror count them); a builtin of every template (settings).

One formatter for the mirror's files, a node's weight cache and an engine's memory, so the
same file never reads 253.1 MB on one page and 241.4 MB (MiB called MB) on another.
Nothing, zero or anything not a number is a dash: zero is unknown, never "0 B".
"""

from __future__ import annotations

from django import template

register = template.Library()

_UNITS = ("kB", "MB", "GB", "TB")


def size_text(n: object) -> str:
    """253.1 MB, 16 GB, 512 B; a dash when not known."""
    if isinstance(n, bool) or not isinstance(n, int | float) or n <= 0:
        return "–"
    if n < 1000:
        return f"{n:.0f} B"
    value = n / 1000
    for unit in _UNITS:
        if value < 1000 or unit == _UNITS[-1]:
            break
        value /= 1000
    return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"


@register.filter(name="bytes")
def bytes_filter(value: object) -> str:
    return size_text(value)
