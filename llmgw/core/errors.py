"""Errors services raise, each a sentence for the operator; the API maps them to HTTP once."""


class ServiceError(Exception):
    status = 400


class Invalid(ServiceError):
    """Something the caller can fix: a bad field or value (400)."""

    status = 400


class NotFound(ServiceError):
    """An unknown name or id (404)."""

    status = 404


class Forbidden(ServiceError):
    """The caller may not do a part of what it asked: a permission it lacks (403)."""

    status = 403


class Conflict(ServiceError):
    """The request clashes with what exists: a duplicate, a declared model (409)."""

    status = 409


class Upstream(ServiceError):
    """Something outside llmgw the request needed did not answer: the hub, a source (502)."""

    status = 502


def cause(exc: BaseException) -> str:
    """What went wrong, for a sentence: the exception's first line (its type when it says
    nothing), at most 200 characters."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
