"""Text from outside that no UTF-8 can carry: lone UTF-16 surrogates.

JSON (and YAML) may escape half of a surrogate pair on its own, `"\\ud800"`, and Python's
parsers keep it as a `str`. Nothing downstream can encode it: SQLite and PostgreSQL
refuse it, msgpack on the channel layer refuses it, and an agent cannot put it in an
engine's arguments or environment. It is found where the text comes in, and the caller
is told which field holds it. Pure: no Django.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime

_SURROGATE = re.compile("[\ud800-\udfff]")

SURROGATE = (
    "holds a lone UTF-16 surrogate (\\ud800 to \\udfff), which is half of a character "
    "and cannot be stored; send the text as UTF-8"
)


def has_surrogate(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def shown(text: str) -> str:
    """`text` with any surrogate written as its escape, so it can go in a sentence or a log."""
    return text.encode("utf-8", "backslashreplace").decode()


def surrogate_at(value: object) -> str | None:
    """Where the first string in `value` holding a lone surrogate is, at any depth, keys
    included: `name`, `profiles[0].args[1]`, `env` (for a key); "" for `value` itself;
    None when there is none.

    Walked with a list, not by recursion: the value may be nested as deep as the JSON
    parser allows, which leaves no room for a recursive walk."""
    todo: list[tuple[str, object]] = [("", value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, str):
            if has_surrogate(item):
                return path
        elif isinstance(item, Mapping):
            children = []
            for key, child in item.items():
                if isinstance(key, str) and has_surrogate(key):
                    return path
                name = str(key)
                children.append((f"{path}.{name}" if path else name, child))
            todo.extend(reversed(children))
        elif isinstance(item, list | tuple):
            todo.extend(reversed([(f"{path}[{i}]", child) for i, child in enumerate(item)]))
    return None


def surrogate_refusal(value: object, *, where: str = "") -> str | None:
    """The sentence refusing `value` when it holds a lone surrogate, naming the field
    (prefixed by `where`); None when it holds none."""
    path = surrogate_at(value)
    if path is None:
        return None
    field = ", ".join(p for p in (where, path) if p)
    return f"{field}: {SURROGATE}." if field else f"The text {SURROGATE}."


def ago(then: datetime, now: datetime) -> str:
    """How long before `now` `then` was, as a page says it: "12 s ago", "3 min ago",
    "5 h ago", "2 d ago"; "just now" within a second."""
    seconds = (now - then).total_seconds()
    if seconds < 1:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"
