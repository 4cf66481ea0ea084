"""The one REST API object: auth, one error shape, and a router per app under /api/v1/."""

from __future__ import annotations

import json
import logging

from django.core.exceptions import RequestDataTooBig
from django.db import DataError
from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer, SessionAuthIsStaff

from llmgw import __version__
from llmgw.errors import Invalid, ServiceError
from llmgw.permissions import refusal
from llmgw.text import SURROGATE, surrogate_refusal
from tenancy.models import Token
from tenancy.selectors import token_find

log = logging.getLogger("llmgw.api")

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


class AdminToken(HttpBearer):
    """`Authorization: Bearer <admin token>`; the actor is X-Llmgw-Actor, else the token's name."""

    def authenticate(self, request: HttpRequest, token: str):
        found = token_find(secret=token, kind=Token.ADMIN)
        if found is None:
            return None
        name = claimed_actor(request.META.get(ACTOR_HEADER, "")) or found.name
        request.actor = Actor(name, token=f"{found.name} ({found.prefix}…)")
        return found


class StaffSession(SessionAuthIsStaff):
    """A logged-in staff user of the pages (CSRF checked on writes), holding the Django
    permissions the operation names (llmgw/permissions.py); refused with a 403 and the
    sentence saying which it lacks. An operation naming none is for superusers alone."""

    def __init__(self, *perms: str):
        super().__init__()
        self.perms = perms

    def _get_key(self, request: HttpRequest):
        # CSRF protects a session's cookie; a call with no staff session has none to
        # protect, and is told it needs a token (401), not that a CSRF check failed.
        user = request.user
        if not (user.is_authenticated and user.is_active and user.is_staff):
            return None
        return super()._get_key(request)

    def authenticate(self, request: HttpRequest, key):
        user = super().authenticate(request, key)
        if user is None:
            return None
        if self.perms:
            sentence = refusal(user, *self.perms)
        elif not user.is_superuser:
            sentence = f"{user.get_username()} may not make this call: it is for superusers."
        else:
            sentence = ""
        if sentence:
            raise HttpError(403, sentence)
        request.actor = user.get_username()
        return user


def can(*perms: str) -> list:
    """An operation's auth: an admin token, or a staff session holding `perms`."""
    return [AdminToken(), StaffSession(*perms)]


def actor(request: HttpRequest) -> str:
    return getattr(request, "actor", "") or "unknown"


def _not_json(constant: str):
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


class JsonParser(Parser):
    """Ninja's JSON bodies, refused before any schema or handler sees them when a string
    holds a lone UTF-16 surrogate, which no database takes: a 400 naming the field."""

    def parse_body(self, request: HttpRequest):
        data = super().parse_body(request)
        refused = surrogate_refusal(data)
        if refused:
            raise Invalid(refused)
        return data


api = NinjaAPI(
    title="llmgw",
    version=__version__,
    description="The llmgw control plane: nodes, models, replicas and the reconciler.",
    auth=[AdminToken(), StaffSession()],
    urls_namespace="api",
    parser=JsonParser(),
)


def _detail(request, text: str, status: int):
    return api.create_response(request, {"detail": text}, status=status)


@api.exception_handler(ServiceError)
def _service_error(request, exc: ServiceError):
    return _detail(request, str(exc), exc.status)


@api.exception_handler(AuthenticationError)
def _unauthorized(request, exc):
    return _detail(
        request,
        "An admin token is needed: Authorization: Bearer <token> (llmgw createtoken NAME).",
        401,
    )


@api.exception_handler(RequestDataTooBig)
def _too_big(request, exc):
    return _detail(request, "The request body is too large.", 413)


@api.exception_handler(DataError)
def _unstorable(request, exc: DataError):
    """A value the database refuses (a NUL character, a number out of range) is bad input."""
    log.warning("refused %s %s: %s", request.method, request.path, str(exc).splitlines()[0])
    return _detail(
        request,
        "The request holds a value the database cannot take: a number out of range "
        "or a character such as NUL.",
        400,
    )


@api.exception_handler(UnicodeEncodeError)
def _surrogate(request, exc: UnicodeEncodeError):
    """Text no UTF-8 can carry that reached the database by a way no check knew of."""
    log.warning("refused %s %s: %s", request.method, request.path, exc.reason)
    return _detail(request, f"The request {SURROGATE}.", 400)


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    if isinstance(exc.__cause__, ServiceError):
        # Ninja wraps whatever the body's parser raised (JsonParser) in a 400 of its own.
        return _service_error(request, exc.__cause__)
    return _detail(request, str(exc), exc.status_code)


@api.exception_handler(ValidationError)
def _invalid(request, exc: ValidationError):
    """Pydantic's errors as one sentence naming the field, so a caller knows what to fix."""
    err = exc.errors[0] if exc.errors else {}
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "payload", "query", "path")]
    where = ".".join(loc)
    msg = err.get("msg", "invalid request")
    if err.get("type") == "json_invalid":
        return _detail(request, "The body is not valid JSON.", 400)
    return _detail(request, f"{where}: {msg}" if where else msg, 400)


def _routers() -> None:
    from catalog.api import router as catalog_router
    from fleet.api import router as fleet_router
    from mirror.api import router as mirror_router
    from tenancy.api import router as tenancy_router

    api.add_router("/", fleet_router)
    # Before the catalog: POST /models/serve is the mirror's, not a model called "serve".
    api.add_router("/", mirror_router)
    api.add_router("/", catalog_router)
    api.add_router("/", tenancy_router)


_routers()
