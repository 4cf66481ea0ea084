"""The one REST API object: auth, one error shape, and a router per app under /api/v1/."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.db import DataError
from django.http import HttpRequest
from django.http.multipartparser import MultiPartParserError
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from llmgw import __version__
from llmgw.core.errors import Invalid, ServiceError
from llmgw.core.text import SURROGATE, surrogate_refusal
from tenancy.auth import AdminToken, StaffSession

log = logging.getLogger("llmgw.api")


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


@api.exception_handler(MultiPartParserError)
def _unparsable(request, exc: MultiPartParserError):
    """A multipart body Django cannot read (no boundary, a bad length): the caller's
    mistake, said in a sentence and one log line, not Django's traceback and HTML page."""
    log.warning("refused %s %s: %s", request.method, request.path, exc)
    response = _detail(
        request,
        f"The body is not a multipart upload that can be read ({exc}): send it as "
        "multipart/form-data with its boundary, as llmgw ctl engines add does.",
        400,
    )
    # Said above, not again by Django's request log.
    response._has_been_logged = True
    return response


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
