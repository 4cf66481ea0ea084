"""The ASGI router: `/v1/` to the gateway, `/api/v1/mirror/files/` to the mirror's file
server, other HTTP to Django (pages, admin, REST API), `/ws/agent/` to the agent consumer."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import path  # noqa: E402

from fleet.consumers import AgentConsumer  # noqa: E402
from llmgw.gateway.app import Gateway  # noqa: E402
from mirror.files import MirrorFiles  # noqa: E402

gateway = Gateway(MirrorFiles(ASGIStaticFilesHandler(django_asgi)))
application = ProtocolTypeRouter(
    {
        "http": gateway,
        "websocket": URLRouter([path("ws/agent/", AgentConsumer.as_asgi())]),
    }
)
