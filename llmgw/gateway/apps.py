from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The gateway has no models; it is an app so that, in every process Django starts in
    (a server, a Celery worker running the reconciler, a test), it offers fleet its load and
    its metrics through the kernel (llmgw/core/sources.py) without fleet importing it, and
    its sampler of the console's history (llmgw/core/history.py)."""

    name = "llmgw.gateway"
    label = "gateway"

    def ready(self) -> None:
        from llmgw.core import history, sources

        from .load import gateway_loads
        from .metrics import gateway_text
        from .samples import Rates

        sources.offer(sources.GATEWAY_LOAD, gateway_loads)
        sources.offer(sources.GATEWAY_METRICS, gateway_text)
        history.sampler("gateway", Rates())
