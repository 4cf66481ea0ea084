"""The ASGI router: `/v1/` to the gateway, `/api/v1/mirror/files/` to the mirror's file
server, other HTTP to Django (pages, admin, REST API), `/ws/agent/` to the agent consumer."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.exceptions import SuspiciousFileOperation  # noqa: E402
from django.http import Http404  # noqa: E402
from django.urls import path  # noqa: E402

from fleet.nodes.consumers import AgentConsumer  # noqa: E402
from fleet.nodes.identity import mirror_refusal  # noqa: E402

# The project's Celery app, imported to be this process's current one: a wake sent from here
# (fleet/reconciler/wake.py, mirror/wake.py) goes to its broker, not to Celery's default app.
from llmgw.celery import app as celery_app  # noqa: E402, F401
from llmgw.core import tracing  # noqa: E402
from llmgw.gateway.app import Gateway  # noqa: E402
from mirror.files import MirrorFiles  # noqa: E402


class StaticFiles(ASGIStaticFilesHandler):
    """The console's static files. A path that climbs out of the static folders
    (`/static/../llmgw/settings.py`) is a file that is not there, a 404: Django's handler
    lets the SuspiciousFileOperation out, and daphne answered it with a 500."""

    def serve(self, request):
        try:
            return super().serve(request)
        except SuspiciousFileOperation:
            raise Http404("There is no such static file.") from None


# Spans over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT says where (docs/tracing.md).
tracing.configure()
gateway = Gateway(MirrorFiles(StaticFiles(django_asgi), refusal=mirror_refusal))
application = ProtocolTypeRouter(
    {
        "http": gateway,
        "websocket": URLRouter([path("ws/agent/", AgentConsumer.as_asgi())]),
    }
)
