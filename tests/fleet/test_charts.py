"""The console's charts: the fleet's sampler, the pages drawing this process's history,
the windows, "no data" where nothing was measured, and what is said when Prometheus
does not answer."""

from __future__ import annotations

import re
import socket
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client import CollectorRegistry, Counter

from fleet.console.samples import REPLICAS, fleet_sample
from fleet.models import Node
from llmgw.core import charts, clock, history, promql
from llmgw.core.charts import Chart, Line
from llmgw.gateway import samples as gateway_samples
from llmgw.gateway.samples import Rates, Totals, quantile

from .builders import gpu_model, model_added, node_add

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def now():
    return clock.now()


@pytest.fixture(autouse=True)
def fresh_history():
    samplers = dict(history._samplers)
    history.HISTORY.clear(15)
    yield
    history.HISTORY.clear(15)
    history._samplers.update(samplers)


def loaded(node_id: str, **load) -> None:
    Node.objects.filter(pk=node_id).update(load=load)


def sampled(now, steps: int = 3) -> float:
    """Sample the fleet `steps` times a step apart, ending at `now`; its Unix time."""
    end = now.timestamp()
    for i in range(steps, 0, -1):
        history.sample(end - (i - 1) * history.HISTORY.step)
    return end


def figures(body: str, chart: str) -> str:
    return re.search(
        rf'<figure class="chart-box" data-chart="{chart}".*?</figure>', body, re.S
    ).group(0)


def test_a_heard_node_gives_what_it_measured_and_a_silent_one_nothing(now):
    node_add("gpu-a", now=now, memory_total_mb=1024)
    node_add("gpu-b", now=now - timedelta(minutes=5))
    loaded(
        "gpu-a",
        cpu_percent=40.0,
        memory_used_bytes=256 << 20,
        gpus=[
            {"index": 0, "utilization": 90.0, "memory_used_mb": 40960, "temp_c": 71, "power_w": 612}
        ],
    )
    readings = fleet_sample(now.timestamp())
    schema, values = readings["node:gpu-a"]
    got = dict(zip(schema.names, values, strict=True))
    assert got["cpu"] == 40.0 and got["memory"] == 25.0
    assert (got["gpu0.util"], got["gpu0.temp"], got["gpu0.power"]) == (90.0, 71, 612)
    assert got["gpu0.memory"] == pytest.approx(100 * 40960 / 81559)
    # GPU 1 reported nothing: nothing, not zeros.
    assert [got[f"gpu1.{k}"] for k in ("util", "memory", "temp", "power")] == [None] * 4
    assert "node:gpu-b" not in readings  # not heard from since it registered
    fleet_schema, fleet_values = readings["fleet"]
    fleet = dict(zip(fleet_schema.names, fleet_values, strict=True))
    assert fleet["gpu_util"] == 90.0  # the mean of the GPUs that report one
    assert fleet["gpus"] == 2 + 2 and fleet["gpus_held"] == 0.0


def test_the_node_page_draws_what_its_node_measured_and_says_no_data_for_the_rest(staff, now):
    node_add("gpu-a", now=now)
    loaded("gpu-a", cpu_percent=40.0, gpus=[{"index": 0, "utilization": 90.0}, {"index": 1}])
    sampled(now)
    body = staff.get("/nodes/gpu-a?window=15m").content.decode()
    util = figures(body, "gpu-util")
    assert 'data-measured="yes"' in util
    assert re.search(r'<path class="series c0" d="M[^"]+L', util), "a line for GPU 0"
    assert "GPU 0 <b>90 %</b>" in util and "GPU 1" not in util
    # Nothing measured in the window: said, never a line at zero.
    for chart in ("gpu-temp", "gpu-power", "gpu-memory"):
        empty = figures(body, chart)
        assert 'data-measured="no"' in empty and ">no data</text>" in empty and "<path" not in empty
    host = figures(body, "host")
    assert "CPU <b>40 %</b>" in host and "memory" not in host.split("legend")[1]


def test_gpus_that_never_reported_anything_get_a_line_not_four_empty_charts(staff, now):
    node_add("gpu-a", now=now)
    loaded("gpu-a", cpu_percent=40.0, gpus=[{"index": 0}, {"index": 1}])
    sampled(now)
    body = staff.get("/nodes/gpu-a").content.decode()
    assert 'data-chart="gpu-' not in body
    assert re.search(r'<p class="muted" id="charts-said">No GPU charts: none of its 2 GPUs', body)
    # It does not report its memory use: the chart is of its CPU, and says so.
    assert 'CPU <span class="muted">(its memory use is not reported)</span>' in body


def test_gpus_silent_now_that_reported_before_keep_their_charts(staff, now):
    node_add("gpu-a", now=now)
    loaded("gpu-a", cpu_percent=40.0, gpus=[{"index": 0, "temp_c": 60}])
    end = sampled(now - timedelta(seconds=60))
    loaded("gpu-a", cpu_percent=40.0, gpus=[{"index": 0}])
    history.sample(end + 60)
    body = staff.get("/nodes/gpu-a?window=15m").content.decode()
    assert 'id="charts-said"' not in body
    assert 'data-measured="yes"' in figures(body, "gpu-temp")


def test_a_longer_windows_legend_and_the_cpu_tile_say_the_newest_reading(staff, now):
    node_add("gpu-a", now=now)
    step = history.HISTORY.step
    t = now.timestamp()
    # Four steps in one slot of the hour's ring: its mean is 25 %, the newest 40 %.
    for i, cpu in enumerate((10.0, 20.0, 30.0, 40.0)):
        loaded("gpu-a", cpu_percent=cpu)
        history.sample(t - (3 - i) * step)
    loaded("gpu-a", cpu_percent=55.0)  # a heartbeat since the last sample
    body = staff.get("/nodes/gpu-a?window=1h").content.decode()
    assert "CPU <b>40 %</b>" in figures(body, "host")
    tile = re.search(r'<div class="tile" data-tile="cpu">.*?<div class="value">([^<]+)</div>', body)
    assert tile.group(1) == "40%"


def test_a_count_of_replicas_reads_whole_in_any_window(staff, now):
    model_added(gpu_model("llama"))
    step = history.HISTORY.step
    t = now.timestamp()
    for i, holding in enumerate((1.0, 2.0, 2.0, 1.0)):
        history.HISTORY.record(t - (3 - i) * step, {"replicas:llama": (REPLICAS, [0.0, holding])})
    body = staff.get("/models/llama?window=1h").content.decode()
    assert "holding room <b>1</b>" in figures(body, "replicas")


def test_a_gap_in_what_was_measured_is_a_gap_in_the_line(staff, now):
    node_add("gpu-a", now=now)
    t = now.timestamp()
    step = history.HISTORY.step
    for i, util in enumerate((50.0, 60.0, None, 70.0, 80.0)):
        gpus = [{"index": 0, "utilization": util}] if util is not None else []
        loaded("gpu-a", gpus=gpus)
        history.sample(t - (4 - i) * step)
    util = figures(staff.get("/nodes/gpu-a?window=15m").content.decode(), "gpu-util")
    path = re.search(r'<path class="series c0" d="([^"]+)"', util).group(1)
    assert path.count("M") == 2, f"two runs either side of the gap: {path}"


def test_the_window_is_chosen_kept_in_the_links_and_a_bad_one_is_refused_in_a_sentence(staff, now):
    node_add("gpu-a", now=now)
    body = staff.get("/nodes/gpu-a?window=6h").content.decode()
    assert re.search(r'<a href="\?window=6h"[^>]*aria-current="true"', body)
    assert 'hx-get="?window=6h&amp;fragment=charts" hx-trigger="every 15s"' in body
    bad = staff.get("/nodes/gpu-a?window=2d").content.decode()
    assert "window must be one of 15m, 1h, 6h, 24h, not &#x27;2d&#x27;; showing 1h." in bad
    assert re.search(r'<a href="\?window=1h"[^>]*aria-current="true"', bad)


def test_the_charts_fragment_is_the_charts_alone_with_no_query_for_them(staff, now):
    node_add("gpu-a", now=now)
    loaded("gpu-a", gpus=[{"index": 0, "utilization": 50.0}])
    staff.get("/")  # the session, read once
    with CaptureQueriesContext(connection) as cluster:
        body = staff.get("/?fragment=charts&window=15m", **HX).content.decode()
    assert body.lstrip().startswith('<section id="charts"') and "<html" not in body
    assert [c["sql"] for c in cluster.captured_queries if "fleet_" in c["sql"]] == []
    node = staff.get("/nodes/gpu-a?fragment=charts", **HX).content.decode()
    assert node.lstrip().startswith('<section id="charts"')
    assert 'data-chart="gpu-util"' in node and 'id="gpus-table"' not in node


def test_the_cluster_page_draws_the_fleets_gpu_use_and_the_gateways_requests(staff, now):
    node_add("gpu-a", now=now)
    loaded("gpu-a", gpus=[{"index": i, "utilization": 50.0} for i in range(8)])
    sampled(now)
    body = staff.get("/").content.decode()
    use = figures(body, "gpu-use")
    assert "utilisation (mean) <b>50 %</b>" in use and "held by replicas <b>0 %</b>" in use
    assert 'data-chart="requests"' in body


def test_a_models_page_draws_its_requests_tokens_and_latency_from_the_gateways_counters(staff, now):
    model_added(gpu_model("hist-chat"))
    counted = {"hist-chat": Totals()}
    history.sampler("gateway", Rates(lambda: counted))
    t = now.timestamp()
    step = history.HISTORY.step
    history.sample(t - step)
    counted = {"hist-chat": Totals()}
    c = counted["hist-chat"]
    c.requests, c.tokens = 30.0, 300.0
    c.buckets.update({0.1: 0.0, 0.25: 30.0, float("inf"): 30.0})
    history.sample(t)
    body = staff.get("/models/hist-chat").content.decode()
    assert "requests <b>2 /s</b>" in figures(body, "requests")
    assert "tokens <b>20 /s</b>" in figures(body, "tokens")
    ttft = figures(body, "ttft")
    # 95 % of 30 in the bucket (0.1, 0.25]: 0.1 + 0.15 × 0.95 s.
    assert re.search(r"p95 <b>24[23] ms</b>", ttft) and "(streamed requests)" in ttft
    # The fleet's sampler counted its replicas: none ready is a reading of none.
    assert "ready <b>0</b>" in figures(body, "replicas")


def test_the_gateways_counters_are_read_by_model(monkeypatch):
    registry = CollectorRegistry()
    requests = Counter("llmgw_gateway_requests", "", ["model", "code"], registry=registry)
    tokens = Counter("llmgw_gateway_tokens", "", ["model", "kind"], registry=registry)
    requests.labels("a", "200").inc(3)
    requests.labels("a", "429").inc(1)
    tokens.labels("a", "completion").inc(40)
    tokens.labels("a", "prompt").inc(400)
    monkeypatch.setattr(gateway_samples, "REGISTRY", registry)
    got = gateway_samples.totals()
    assert (got["a"].requests, got["a"].tokens) == (4.0, 40.0)


def test_a_percentile_comes_from_what_the_histogram_counted_between_two_readings():
    before = {0.1: 10.0, 0.25: 10.0, 0.5: 10.0, float("inf"): 10.0}
    after = {0.1: 10.0, 0.25: 20.0, 0.5: 30.0, float("inf"): 30.0}
    # Twenty new: ten in (0.1, 0.25], ten in (0.25, 0.5]; the 95th is 90 % into the second.
    assert quantile(0.95, before, after) == pytest.approx(0.25 + 0.25 * 0.9)
    assert quantile(0.95, after, after) is None  # nothing counted: no reading
    assert quantile(0.5, {}, {float("inf"): 4.0}) == 0.0


def test_a_rate_needs_two_readings_and_none_when_a_counter_went_back():
    rates = Rates()
    assert rates(100.0) == {}
    assert "gateway" in rates(115.0)


def test_figures_as_a_chart_says_them():
    assert charts.figure(None, "%") == "–"
    assert charts.figure(83.0, "%") == "83 %"
    assert charts.figure(0.423, "s") == "423 ms"
    assert charts.figure(0.0052, "s") == "5.20 ms"
    assert charts.figure(2.5, "s") == "2.50 s"
    assert charts.figure(0.004, "/s") == "0.004 /s"
    assert charts.figure(1234.0, "/s") == "1.2k /s"
    assert charts.figure(12.5, "") == "12.5"


def test_a_prometheus_that_does_not_answer_is_said_on_each_chart(settings, now):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.LLMGW = type(settings.LLMGW)(
        **{**settings.LLMGW.__dict__, "prometheus_url": f"http://127.0.0.1:{port}"}
    )
    chart = Chart("c", "C", "%", "g", (Line("a", "a", "up"),))
    (drawn,) = charts.drawn([chart], "1h", now.timestamp())
    assert not drawn.measured
    assert drawn.said.startswith(f"Prometheus at http://127.0.0.1:{port} could not be reached")
    assert "Prometheus did not answer" in drawn.svg


def test_a_prometheus_series_is_aligned_to_the_charts_slots_and_names_are_quoted():
    times = (0.0, 60.0, 120.0)
    series = {"values": [[0, "1.5"], [61, "NaN"], [119.0, "+Inf"], [999, "3"], ["x", "1"]]}
    assert promql.aligned(series, times, 60.0) == (1.5, None, None)
    assert promql.quoted('a"b\\c') == '"a\\"b\\\\c"'
