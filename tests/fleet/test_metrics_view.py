"""`/metrics` with the fleet's series rendered in a process of its own, as `llmgw serve` runs it."""

from __future__ import annotations

import gzip
import zlib

import pytest

from fleet.metrics import collector as metrics
from fleet.metrics.collector import fleet_or_last
from fleet.metrics.renderer import Renderer
from llmgw.core import clock

from .builders import H100, L4, gpu_model, model_added, node_add
from .test_metrics import SENSED, heard
from .test_pages import place

# The renderer reads what this test wrote, from its own connection: written for real.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster():
    now = clock.now()
    node_add("gpu-a", now=now, gpus=(H100, H100))
    node_add("gpu-b", now=now, gpus=(L4,))
    model_added(gpu_model("chat"))
    place("r1", "chat", "gpu-a", [0], now=now)
    heard("gpu-a", now, SENSED)
    metrics.caches_clear()


@pytest.fixture
def renderer():
    made = Renderer()
    made.start()
    yield made
    made.stop()


def test_the_renderer_writes_the_fleet_byte_for_byte_as_the_server_would(cluster, renderer):
    rendered = renderer.body()

    assert rendered == fleet_or_last().encode()
    assert b'llmgw_node_up{node="gpu-a"} 1' in rendered
    assert b'llmgw_gpu_utilization_percent{class="h100-80g",gpu="0",node="gpu-a"} 97' in rendered


def test_the_view_answers_the_same_with_the_renderer_as_without(
    cluster, renderer, client, monkeypatch
):
    from fleet.metrics import renderer as metrics_renderer

    alone = client.get("/metrics").content
    monkeypatch.setattr(metrics_renderer, "RENDERER", renderer)
    through = client.get("/metrics").content

    assert through == alone
    assert b"llmgw_replicas{" in through


def test_a_gzipped_scrape_is_compressed_by_the_renderer_and_reads_the_same(
    cluster, renderer, client, monkeypatch
):
    from fleet.metrics import renderer as metrics_renderer

    alone = client.get("/metrics").content
    monkeypatch.setattr(metrics_renderer, "RENDERER", renderer)
    zipped = client.get("/metrics", headers={"Accept-Encoding": "gzip"})

    assert zipped["Content-Encoding"] == "gzip"
    # One gzip stream, the server's own series in it: a client reading one member (httpx,
    # zlib's gzip mode) reads everything.
    one = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert one.decompress(zipped.content) == alone
    assert one.eof and not one.unused_data
    assert gzip.decompress(renderer.body(b"mine 1\n", gzip=True)) == (
        fleet_or_last().encode() + b"mine 1\n"
    )


def test_a_worker_asks_the_renderer_its_server_started(cluster, renderer):
    worker = Renderer()
    worker.attach(renderer.address)
    try:
        assert worker.body() == renderer.body() == fleet_or_last().encode()
    finally:
        worker.stop()
    assert renderer.body() is not None  # a worker that stops asking stops nothing


def test_a_renderer_that_died_is_replaced_and_the_scrape_rendered_here(cluster, renderer):
    renderer._process.kill()
    renderer._process.join()

    assert renderer.body() is None  # this scrape: the caller renders it itself
    assert renderer.body() == fleet_or_last().encode()  # the next: a new renderer


def test_a_renderer_that_died_between_scrapes_is_started_again(cluster, renderer):
    renderer._process.kill()
    renderer._process.join()

    renderer.keep_alive()

    assert renderer.body() == fleet_or_last().encode()


def test_without_a_renderer_the_view_renders_in_its_own_process(cluster, client):
    assert Renderer().body() is None
    assert b'llmgw_node_up{node="gpu-b"} 1' in client.get("/metrics").content
