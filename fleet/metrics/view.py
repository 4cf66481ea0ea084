"""`GET /metrics`: the fleet's series (from the renderer process when one runs,
fleet/metrics/renderer.py), the gateway's, and the agents' connections (summed over
the workers of one server, llmgw/core/worker_series.py)."""

from __future__ import annotations

import gzip

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from llmgw.core import sources, worker_series

from ..nodes.connections import agents_text
from . import renderer as metrics_renderer
from .collector import fleet_or_last


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """`GET /metrics`: no authentication, like any exporter; gzip when asked, as Prometheus does.

    A plain (sync) view: daphne runs it in a worker thread, off the event loop that
    serves the agents; the fleet's series, and the gzip, come from the renderer when one
    runs.
    """
    zipped = "gzip" in request.headers.get("Accept-Encoding", "")
    own = worker_series.summed_text()  # a worker's: every worker's, summed
    if own is None:
        own = sources.read(sources.GATEWAY_METRICS, absent="") + agents_text()
    mine = own.encode()
    body = metrics_renderer.RENDERER.body(mine, gzip=zipped)
    if body is None:
        body = fleet_or_last().encode() + mine
        if zipped:
            body = gzip.compress(body, compresslevel=metrics_renderer.COMPRESSLEVEL)
    response = HttpResponse(content_type=CONTENT_TYPE_PLAIN_0_0_4)
    if zipped:
        response["Content-Encoding"] = "gzip"
    response["Vary"] = "Accept-Encoding"
    response.content = body
    return response
