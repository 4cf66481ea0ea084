"""The gateway offers fleet its load and metrics through the kernel, with no import between them."""

from dataclasses import replace

from llmgw.core import sources
from llmgw.gateway.load import BOARD
from llmgw.gateway.metrics import REQUESTS


def test_a_reading_nobody_offered_is_absent_never_a_zero():
    assert sources.read("nothing.offered.this") is None
    assert sources.read("nothing.offered.this", absent="") == ""


def test_the_gateway_offers_its_load_and_metrics_once_django_has_started(monkeypatch, settings):
    # Embedded, the load is this process's board (with Redis, the processes' sum there).
    settings.LLMGW = replace(settings.LLMGW, redis_url=None)
    monkeypatch.setitem(BOARD.running, "chat", 3)
    monkeypatch.setitem(BOARD.waiting, "chat", 2)
    assert sources.read(sources.GATEWAY_LOAD)["chat"] == (3, 2)
    REQUESTS.labels(model="chat", code="200").inc()
    assert 'llmgw_gateway_requests_total{code="200",model="chat"}' in sources.read(
        sources.GATEWAY_METRICS
    )
