"""What every app's API shares: who acts, and a body judged as JSON by the view itself."""

from __future__ import annotations

import json
from typing import NoReturn

from django.http import HttpRequest

from llmgw.core.errors import Invalid
from llmgw.core.text import surrogate_refusal

ACTOR_HEADER = "HTTP_X_LLMGW_ACTOR"


# An actor is a name recorded beside a change, not a story: one line, printable, this long.
ACTOR_LONGEST = 64


def claimed_actor(header: str) -> str:
    """The name an X-Llmgw-Actor header claims: its first line, printable characters only,
    spaces collapsed, at most ACTOR_LONGEST characters; "" when nothing is left."""
    first = " ".join(header.splitlines()[0].split()) if header.strip() else ""
    return "".join(ch for ch in first if ch.isprintable())[:ACTOR_LONGEST].strip()


class Actor(str):
    """Who acts, as recorded beside a change, and the admin token that made the call
    ("name (prefix…)"; "" for a session): a claimed X-Llmgw-Actor cannot hide who acted.
    Services pass it on as the actor string; audit_record keeps `token` in its own column."""

    token: str

    def __new__(cls, name: str, *, token: str = "") -> Actor:
        made = super().__new__(cls, name)
        made.token = token
        return made


def actor(request: HttpRequest) -> str:
    return getattr(request, "actor", "") or "unknown"


def _not_json(constant: str) -> NoReturn:
    # Python's json reads NaN and Infinity, which JSON has not; a figure of either breaks every rule.
    raise ValueError(f"{constant} is not JSON")


def json_body(request: HttpRequest) -> object:
    """The body of a view that judges its JSON itself (a model, as the catalog file is):
    Invalid when it is not JSON (NaN and Infinity are not), or when a string in it holds
    a lone UTF-16 surrogate, naming where."""
    try:
        data = json.loads(request.body or b"null", parse_constant=_not_json)
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        raise Invalid("The body is not valid JSON.") from None
    refused = surrogate_refusal(data)
    if refused:
        raise Invalid(refused)
    return data
