"""The playground (`/playground`, staff only): chat with a model through the gateway.

The page holds a key of the staff user's own project (tenancy/services/playground.py), kept in
their session and made on their first visit of a session, and static/playground.js
sends the conversation to `/v1/chat/completions` with it, streamed, as any client of the
gateway would: the limits, the usage and the routing are the gateway's. Beside each
answer it shows the time to its first token, its tokens a second and the replica that
answered (the gateway's X-Llmgw-Replica header). The page is never cached: it carries
the key's secret.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_GET

from fleet.selectors.state import replica_views
from llmgw.core.pages import page, staff_required
from llmgw.core.permissions import needs
from tenancy.services.playground import playground_key_make, playground_key_usable

from .selectors import catalog_load

SESSION_KEY = "llmgw_playground_key"


def _key(request: HttpRequest) -> str:
    """The session's playground key secret, made when it has none usable."""
    held = request.session.get(SESSION_KEY)
    if isinstance(held, dict) and playground_key_usable(held.get("id")):
        return held["secret"]
    key, secret = playground_key_make(user=request.user.get_username())
    request.session[SESSION_KEY] = {"id": key.pk, "secret": secret}
    return secret


@staff_required
@needs("catalog.view_model", "tenancy.add_apikey")
@require_GET
def playground(request: HttpRequest) -> HttpResponse:
    ready: dict[str, int] = {}
    for r in replica_views():
        if r.state == "ready":
            ready[r.model] = ready.get(r.model, 0) + 1
    models = [
        {"name": name, "aliases": spec.aliases, "ready": ready.get(name, 0)}
        for name, spec in sorted(catalog_load().items())
    ]
    asked = request.GET.get("model", "")
    chosen = asked if any(m["name"] == asked for m in models) else ""
    if not chosen:
        chosen = next(
            (m["name"] for m in models if m["ready"]), models[0]["name"] if models else ""
        )
    context = {
        "section": "playground",
        "models": models,
        "chosen": chosen,
        "asked_unknown": asked if asked and asked != chosen else "",
        "secret": _key(request) if models else "",
    }
    response = page(request, "catalog/playground.html", context)
    add_never_cache_headers(response)
    return response
