"""`{{ value|when }}`: a time as the pages show it, relative ("3 min ago", "in 2 min")
with the exact time on hover and in `datetime`; a builtin of every template (settings).

Takes an aware datetime or ISO 8601 text (the API's views keep times as text); anything
else, or nothing, is a dash, never an error on the page.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils.html import format_html

from . import clock
from .text import ago

register = template.Library()


def _time(value: object) -> datetime | None:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@register.filter(is_safe=True)
def when(value: object) -> str:
    then = _time(value)
    if then is None:
        return "–"
    now = clock.now()
    said = ago(then, now) if then <= now else f"in {ago(now, then).removesuffix(' ago')}"
    exact = then.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return format_html('<time datetime="{}" title="{}">{}</time>', then.isoformat(), exact, said)
