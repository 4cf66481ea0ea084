"""Checks for the fields of a translated API's body. Each returns the value when it has the
right shape and raises a 400 (`answers.bad_request`) naming the field by its path
(`input[2].content[0].text`) when it does not: a client learns what to fix, and no
malformed value reaches the translation."""

from __future__ import annotations

from llmgw.gateway.answers import Refused, bad_request

MISSING = object()


def refuse(param: str, message: str, code: str = "invalid_value") -> Refused:
    return bad_request(f"'{param}': {message}", code, param=param)


def only_known(body: dict, known: frozenset[str], where: str = "") -> None:
    """Refuse a field the translation does not know: silently dropping it could change the
    answer the client asked for (OpenAI and Anthropic refuse unknown fields too)."""
    for name in body:
        if name not in known:
            raise refuse(f"{where}{name}", "this field is not supported.", "unknown_parameter")


def obj(value: object, param: str) -> dict:
    if not isinstance(value, dict):
        raise refuse(param, "must be a JSON object.", "invalid_type")
    return value


def array(value: object, param: str, *, empty: bool = True) -> list:
    if not isinstance(value, list):
        raise refuse(param, "must be an array.", "invalid_type")
    if not value and not empty:
        raise refuse(param, "must not be empty.")
    return value


def text(value: object, param: str) -> str:
    if not isinstance(value, str):
        raise refuse(param, "must be a string.", "invalid_type")
    return value


def flag(value: object, param: str) -> bool:
    if not isinstance(value, bool):
        raise refuse(param, "must be true or false.", "invalid_type")
    return value


def whole(value: object, param: str, *, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise refuse(param, f"must be a whole number, {least} or more.", "invalid_type")
    return value


def number(value: object, param: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise refuse(param, f"must be a number from {low:g} to {high:g}.", "invalid_type")
    return value


def one_of(value: object, param: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        names = ", ".join(repr(a) for a in allowed)
        raise refuse(param, f"must be one of {names}.")
    return value  # type: ignore[return-value]


def sampling(body: dict, chat: dict, *, temperature_max: float) -> None:
    """`temperature` and `top_p`, null or absent meaning the engine's default, copied into
    `chat` when given."""
    for name, high in (("temperature", temperature_max), ("top_p", 1.0)):
        value = body.get(name)
        if value is not None:
            chat[name] = number(value, name, 0.0, high)


def stream(body: dict) -> bool:
    """`stream`: true, false, or null (as the SDKs send it for `stream=None`)."""
    value = body.get("stream")
    return False if value is None else flag(value, "stream")
