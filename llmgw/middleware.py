"""The database being away is an outage to say, not a bug: a 503 with a sentence.

Without this a request during a PostgreSQL outage got Django's HTML 500 page, whether it
came from `llmgw ctl`, a script or a browser, and a traceback in the log per request. The
REST API answers its usual `{"detail": ...}` shape; the pages a plain sentence. The log
says the outage when it starts and when it ends (llmgw.core.outage), not per request.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse

from llmgw.core.outage import Outage

log = logging.getLogger("llmgw.database")

SENTENCE = (
    "The control plane's database is not answering; nothing was changed. Try again in a moment."
)
_outage = Outage("reaching the database for a request", log)


class DatabaseAway:
    """Turns a database that cannot be reached into a 503 (Retry-After: 5)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        # /metrics answers its last scrape while the database is away: no sign it is back.
        if response.status_code < 500 and request.path != "/metrics":
            _outage.worked()
        return response

    def process_exception(self, request, exc):
        if not isinstance(exc, OperationalError | InterfaceError):
            return None
        _outage.failed(exc)
        if request.path.startswith("/api/"):
            response = JsonResponse({"detail": SENTENCE}, status=503)
        else:
            response = HttpResponse(SENTENCE, status=503, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = "5"
        # Said once for the outage above, not by Django once per request.
        response._has_been_logged = True
        return response
