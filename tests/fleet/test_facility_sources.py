"""The facility's sources: the sources file as the design writes it, refused in sentences
when it cannot be used; the Prometheus source against a real Prometheus scraping recorded
series (Debian's prometheus, as the charts' tests use); the simulated replay."""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import threading
import time

import httpx
import pytest
from hypothesis import given, strategies as st

from fleet.domain.conditions import Readings, Sample, fresh
from fleet.domain.power import PDU_LABEL, PHASE_LABEL, metered_fresh, phases_of
from fleet.facility.config import ConfigError, Signal, config_load
from fleet.facility.prometheus import PrometheusSource, domain_of
from fleet.facility.simulated import replay_load

PROMETHEUS = shutil.which("prometheus")

DESIGN = """\
facility:
  source: prometheus
  prometheus: http://127.0.0.1:{port}
  thresholds: {{warm_inlet_c: 26, enter_s: 1m}}
  domains:
    rack/r12-07: {{hot_inlet_c: 30}}
  signals:
    inlet_temp_c:
      query: max by (rack) (dcim_rack_inlet_temperature_celsius)
      domain_label: rack
      stale_after: 2m
    power_watts:
      query: sum by (pdu) (pdu_outlet_power_watts)
      domain_label: pdu
    cooling_alarm:
      query: max by (row) (crac_alarm)
      domain_label: row
"""

PHASES = """\
facility:
  prometheus: http://127.0.0.1:{port}
  signals:
    power_watts:
      query: sum by (pdu, phase) (pdu_phase_power_watts)
      domain_kind: phase
      domain_label: pdu
      phase_label: phase
"""

RECORDED = """\
# TYPE dcim_rack_inlet_temperature_celsius gauge
dcim_rack_inlet_temperature_celsius{rack="r12-07",sensor="top"} 31.5
dcim_rack_inlet_temperature_celsius{rack="r12-07",sensor="bottom"} 27
dcim_rack_inlet_temperature_celsius{rack="r12-08",sensor="top"} 22
# TYPE crac_alarm gauge
crac_alarm{row="12",unit="crac-3"} 1
crac_alarm{row="13",unit="crac-4"} 0
# TYPE pdu_outlet_power_watts gauge
pdu_outlet_power_watts{pdu="r12-07-a",outlet="1"} 700
pdu_outlet_power_watts{pdu="r12-07-a",outlet="2"} 1500
# TYPE pdu_phase_power_watts gauge
pdu_phase_power_watts{pdu="r12-07-a",phase="L1",outlet="1"} 2400
pdu_phase_power_watts{pdu="r12-07-a",phase="L2",outlet="2"} 3100
pdu_phase_power_watts{pdu="r12-07-a",phase="L2",outlet="3"} 3000
pdu_phase_power_watts{pdu="r12-07-a",phase="L 3",outlet="4"} 900
pdu_phase_power_watts{pdu="r12-07-b",outlet="1"} 500
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_designs_file_is_read_with_its_thresholds_and_signals(tmp_path):
    path = tmp_path / "sources.yml"
    path.write_text(DESIGN.format(port=9090))

    config = config_load(path)

    assert config.prometheus == "http://127.0.0.1:9090"
    assert (config.thresholds.warm_inlet_c, config.thresholds.enter_s) == (26.0, 60.0)
    assert config.thresholds_of(("rack", "r12-07")).hot_inlet_c == 30.0
    assert config.thresholds_of(("rack", "r12-07")).warm_inlet_c == 26.0  # the defaults'
    assert [(s.name, s.kind, s.stale_after) for s in config.signals] == [
        ("inlet_temp_c", "rack", 120.0),
        ("power_watts", "pdu", 120.0),
        ("cooling_alarm", "row", 120.0),
    ]


def test_a_power_signal_may_name_a_pdus_phases_by_two_labels(tmp_path):
    path = tmp_path / "sources.yml"
    path.write_text(PHASES.format(port=9090))

    (signal,) = config_load(path).signals

    assert (signal.name, signal.kind, signal.domain_label, signal.phase_label) == (
        "power_watts",
        "phase",
        "pdu",
        "phase",
    )


@pytest.mark.parametrize(
    ("labels", "domain"),
    [
        ({"pdu": "r12-07-a", "phase": "L2"}, ("phase", "r12-07-a/L2")),
        ({"pdu": "r12-07-a"}, None),  # no phase: no domain
        ({"phase": "L2"}, None),
        ({"pdu": "r12-07-a", "phase": "L 2"}, None),  # no label could name it
        ({"pdu": "r 12", "phase": "L2"}, None),
    ],
)
def test_a_phase_signals_series_names_its_pdu_and_phase_or_nothing(labels, domain):
    signal = Signal("power_watts", "q", "pdu", "phase", phase_label="phase")
    assert domain_of(signal, labels) == domain


@given(
    pdu=st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,20}[A-Za-z0-9])?", fullmatch=True),
    phase=st.text(alphabet="AL123_-x ", min_size=0, max_size=10),
)
def test_a_phase_signal_names_a_phase_exactly_when_a_nodes_labels_would(pdu, phase):
    signal = Signal("power_watts", "q", "pdu", "phase", phase_label="phase")
    labels = {PDU_LABEL: pdu, PHASE_LABEL: phase}

    metered = domain_of(signal, {"pdu": pdu, "phase": phase})

    # The meter's phase is the one the node's labels put it on, or none when they put it on
    # none (a blank label, or no token): a reading never lands beside its budget. (A comma
    # lists a node's phases, one per PDU; a series names one.)
    if "," not in phase:
        assert metered == next((("phase", p) for p in phases_of(labels)), None)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("facility: 3", "has no facility: mapping"),
        ("facility: {colour: red}", "colour is not a setting"),
        ("facility: {thresholds: {warm_inlet_c: 35}}", "must be below the hot one"),
        ("facility: {thresholds: {hot: 3}}", "hot is not a threshold"),
        ("facility: {thresholds: {enter_s: soon}}", "must be a duration such as 90s"),
        ("facility: {signals: {inlet_temp_c: {query: up, domain_label: rack}}}", "name it in facility.prometheus"),
        ("facility: {prometheus: 'ftp://x', signals: {}}", "must be an http(s) URL"),
        ("facility: {prometheus: 'http://p', signals: {humidity: {query: up, domain_label: rack}}}", "not a signal llmgw reads"),
        ("facility: {prometheus: 'http://p', signals: {inlet_temp_c: {query: up, domain_label: dc}}}", "needs a domain_label naming a rack"),
        ("facility: {domains: {'aisle/a1': {}}}", "is not a domain: KIND/NAME"),
        ("facility: [", "is not YAML"),
        # A phase is read by its meter alone: it has no temperature or alarm of its own.
        ("facility: {prometheus: 'http://p', signals: {inlet_temp_c: {query: up, domain_kind: phase, domain_label: pdu, phase_label: phase}}}", "facility.signals.inlet_temp_c: a phase has no temperature or alarm of its own (it takes its PDU's condition): only power_watts reads one."),
        ("facility: {prometheus: 'http://p', signals: {power_watts: {query: up, domain_kind: phase, domain_label: pdu}}}", "facility.signals.power_watts reads phases: it needs a phase_label, the label naming each phase (domain_label names its PDU)."),
        ("facility: {prometheus: 'http://p', signals: {power_watts: {query: up, domain_kind: phase, domain_label: pdu, phase_label: 3}}}", "it needs a phase_label"),
        ("facility: {prometheus: 'http://p', signals: {power_watts: {query: up, domain_kind: phase, domain_label: pdu, phase_label: pdu}}}", "facility.signals.power_watts: its phase_label and domain_label are one label (pdu): the phase's is another."),
        ("facility: {prometheus: 'http://p', signals: {power_watts: {query: up, domain_label: pdu, phase_label: phase}}}", "facility.signals.power_watts: phase_label names a phase's label, for domain_kind: phase alone."),
    ],
)  # fmt: skip
def test_a_sources_file_that_cannot_be_used_is_refused_in_a_sentence(tmp_path, text, said):
    path = tmp_path / "sources.yml"
    path.write_text(text)

    with pytest.raises(ConfigError) as refused:
        config_load(path)

    assert said in str(refused.value)


def test_the_replay_holds_each_entry_until_the_next_and_null_is_no_reading(tmp_path):
    path = tmp_path / "event.yml"
    path.write_text(
        "start: 2026-12-07T10:00:00+00:00\nreadings:\n"
        "  - {at: 0s, rack/r1: {inlet_c: 24}}\n"
        "  - {at: 2m, rack/r1: {inlet_c: 29, gpus: 8, throttled: 1}}\n"
        "  - {at: 5m, rack/r1: null}\n"
    )
    replay = replay_load(path)
    start = replay.start

    assert replay.samples(start - 1) == []
    assert [s.readings for s in replay.samples(start + 60)] == [Readings(inlet_c=24)]
    assert [s.readings for s in replay.samples(start + 200)] == [
        Readings(inlet_c=29, gpus=8, throttled=1)
    ]
    assert replay.samples(start + 400) == []
    bad = tmp_path / "bad.yml"
    bad.write_text("readings:\n  - {at: 0s, rack/r1: {inlet: 24}}\n")
    with pytest.raises(ConfigError, match="inlet is not a reading"):
        replay_load(bad)


@pytest.fixture
def recorded(tmp_path):
    """A server answering the recorded series, as an exporter would."""
    body = RECORDED.encode()

    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def prometheus_start(tmp_path, recorded: int) -> tuple[int, subprocess.Popen]:
    """A real Prometheus scraping the recorded series every second: its port and process."""
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: dcim\n    static_configs: [{{targets: ['127.0.0.1:{recorded}']}}]\n"
    )
    prometheus = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    return port, prometheus


@pytest.mark.skipif(
    PROMETHEUS is None, reason="needs Debian's prometheus (apt-get install prometheus)"
)
def test_the_prometheus_source_maps_each_series_to_its_domain_and_ages_when_prometheus_goes(
    tmp_path, recorded
):
    port, prometheus = prometheus_start(tmp_path, recorded)
    try:
        url = f"http://127.0.0.1:{port}"
        config_path = tmp_path / "sources.yml"
        config_path.write_text(DESIGN.format(port=port))
        config = config_load(config_path)
        source = PrometheusSource(config.prometheus, config.signals)
        deadline = time.monotonic() + 60
        samples: list[Sample] = []
        while time.monotonic() < deadline:
            samples = source.samples()
            if {s.domain for s in samples} >= {("rack", "r12-07"), ("row", "12")} and source.power:
                break
            time.sleep(0.5)
        by = {s.domain: s for s in samples}

        assert by[("rack", "r12-07")].readings == Readings(inlet_c=31.5)  # the hotter sensor
        assert by[("rack", "r12-08")].readings == Readings(inlet_c=22)
        assert by[("row", "12")].readings == Readings(cooling_alarm=True)
        assert by[("row", "13")].readings == Readings(cooling_alarm=False)
        assert ("pdu", "r12-07-a") not in by  # power is not a condition's signal
        # but the PDU's metered draw, its outlets summed by the query, for budgets
        assert metered_fresh(source.power, time.time()) == {("pdu", "r12-07-a"): 2200.0}
        assert source.failed == {}
        asked = by[("rack", "r12-07")].at
        assert abs(asked - time.time()) < 30

        prometheus.terminate()
        prometheus.wait(timeout=30)
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, timeout=1)
        kept = source.samples()

        assert {s.domain for s in kept} == set(by)  # the last answer, ageing
        assert source.failed["inlet_temp_c"].startswith(f"Prometheus at {url} could not be reached")
        readings, newest = fresh(kept, asked + 121)
        assert readings == {}  # past stale_after: absent, so unknown
        assert newest[("rack", "r12-07")] == asked
        assert metered_fresh(source.power, time.time()) == {("pdu", "r12-07-a"): 2200.0}
        assert metered_fresh(source.power, asked + 121) == {}  # past stale_after: no draw
    finally:
        if prometheus.poll() is None:
            prometheus.terminate()
            prometheus.wait(timeout=30)


@pytest.fixture
def prometheus_port(tmp_path, recorded):
    """A real Prometheus scraping the recorded series every second; its port."""
    if PROMETHEUS is None:
        pytest.skip("needs Debian's prometheus (apt-get install prometheus)")
    port, prometheus = prometheus_start(tmp_path, recorded)
    yield port
    prometheus.terminate()
    prometheus.wait(timeout=30)


def test_the_prometheus_source_reads_each_phases_metered_draw(tmp_path, prometheus_port):
    config_path = tmp_path / "sources.yml"
    config_path.write_text(PHASES.format(port=prometheus_port))
    config = config_load(config_path)
    source = PrometheusSource(config.prometheus, config.signals)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not source.power:
        source.samples()
        time.sleep(0.5)

    # Each phase's outlets summed by the query, named <pdu>/<phase>; a series whose labels
    # name no phase a node could be on is left out.
    assert metered_fresh(source.power, time.time()) == {
        ("phase", "r12-07-a/L1"): 2400.0,
        ("phase", "r12-07-a/L2"): 6100.0,
    }
    assert source.failed == {}


def test_a_signal_whose_prometheus_is_not_there_reads_nothing_and_says_why():
    url = f"http://127.0.0.1:{free_port()}"
    source = PrometheusSource(url, (Signal("inlet_temp_c", "up", "rack", "rack"),))

    assert source.samples() == []
    assert source.failed["inlet_temp_c"].startswith(f"Prometheus at {url} could not be reached")


def test_a_prometheus_that_does_not_answer_is_asked_once_for_all_its_signals(monkeypatch):
    from fleet.facility import prometheus

    asked = []

    def gone(url, query):
        asked.append(query)
        raise prometheus.Unanswered(f"Prometheus at {url} did not answer within 2 s.", True)

    monkeypatch.setattr(prometheus, "instant", gone)
    signals = tuple(Signal(n, f"q_{n}", "rack", "rack") for n in ("inlet_temp_c", "gpu_temp_c"))
    source = PrometheusSource("http://p:9090", signals)

    assert source.samples() == []
    assert asked == ["q_inlet_temp_c"]
    assert set(source.failed) == {"inlet_temp_c", "gpu_temp_c"}


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        ({"status": "success", "data": ["not", "an", "object"]}, None),
        ({"status": "success", "data": None}, None),
        # A series whose labels are not an object, or whose value is not a pair, is skipped;
        # the others are kept.
        (
            {
                "status": "success",
                "data": {
                    "resultType": "vector",
                    "result": [
                        {"metric": ["rack", "r1"], "value": [1, "30"]},
                        {"metric": {"rack": "r2"}, "value": "31"},
                        {"metric": {"rack": "r3"}, "value": [1, "32"]},
                    ],
                },
            },
            [({"rack": "r3"}, 1.0, 32.0)],
        ),
    ],
)
def test_an_odd_answer_from_prometheus_is_refused_or_skipped_never_raised(monkeypatch, body, kept):
    from fleet.facility import prometheus
    from llmgw.core import promql

    answer = httpx.Response(200, json=body)
    monkeypatch.setattr(promql.httpx, "get", lambda *a, **k: answer)
    if kept is None:
        with pytest.raises(prometheus.Unanswered, match="no instant vector"):
            prometheus.instant("http://p:9090", "q")
    else:
        assert prometheus.instant("http://p:9090", "q") == kept
