"""The console's Content-Security-Policy: its pages run only the scripts and styles
served from static/ (htmx, console.js, the stylesheets), never anything inline, so a
name or a message that slipped past escaping could run nothing."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
# The REST API's documentation page is Swagger UI as ninja serves it, not the console.
_EXEMPT = ("/api/",)


class ContentSecurityPolicy:
    """Sets POLICY on every HTML response that has none, but the API's documentation."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            response.get("Content-Type", "").startswith("text/html")
            and "Content-Security-Policy" not in response
            and not request.path.startswith(_EXEMPT)
        ):
            response["Content-Security-Policy"] = POLICY
        return response
