"""The console's charts end to end: a real `llmgw serve` keeping its own history while a
real agent reports and the gateway answers; and the same pages reading a real Prometheus
that scrapes that server (Debian's prometheus, which .ci/run installs for promtool)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from .harness import Cluster, free_port, gateway_key, gateway_project, staff_cookie, wait_for

PROMETHEUS = shutil.which("prometheus")
CHAT = {
    "name": "chat",
    "source": "org/chat-model",
    "profiles": [
        {
            "name": "cpu",
            "engine": "sim",
            "cpu_cores": 1,
            "min_memory_gb": 1,
            "args": ["--ttft-ms", "20", "--tokens-per-sec", "500"],
            "startup_timeout": 60,
        }
    ],
    "scaling": {"min": 1},
}


def _chart(body: str, key: str) -> str:
    found = re.search(rf'<figure class="chart-box" data-chart="{key}".*?</figure>', body, re.S)
    assert found, f"no chart {key} on the page"
    return found.group(0)


def _page(cluster: Cluster, cookie: str, path: str) -> str:
    answer = httpx.get(f"{cluster.url}{path}", cookies={"sessionid": cookie}, timeout=10)
    assert answer.status_code == 200, answer.text[:500]
    return answer.text


def _until_drawn(cluster: Cluster, cookie: str, path: str, key: str, what: str) -> None:
    """Wait until chart `key` on page `path` draws something measured."""
    wait_for(
        what,
        lambda: 'data-measured="yes"' in _chart(_page(cluster, cookie, path), key),
        timeout=30,
    )


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path, production=False)
    yield made
    made.close()


def _serving(cluster: Cluster) -> None:
    cluster.start_server()
    cluster.start_agent("cpu-a", "--cpus", "4", "--memory-gb", "8", port_range="33000-33499")
    wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
    cluster.post("/models", CHAT)
    wait_for("a ready replica", lambda: cluster.ready_replicas("chat"), timeout=60)


def test_the_servers_own_history_draws_what_the_agent_and_the_gateway_measured(cluster):
    cluster.env["LLMGW_HISTORY_STEP_SECONDS"] = "1"
    _serving(cluster)
    cookie = staff_cookie(cluster)
    key = gateway_key(cluster, gateway_project(cluster, "Acme"), "charts")
    client = OpenAI(base_url=f"{cluster.url}/v1", api_key=key["secret"])
    # One-second slots: the first window is a minute of them. The node's chart drawn says the
    # samples have begun: the gateway's rates are the change since the last one, so requests
    # answered before the first sample are in no step's time to first token (a busy machine
    # can start the samples late).
    _until_drawn(cluster, cookie, "/nodes/cpu-a?window=1m", "host", "the node's CPU")
    for _ in range(5):
        for _ in client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=8
        ):
            pass

    _until_drawn(cluster, cookie, "/models/chat?window=1m", "ttft", "the model's first tokens")
    model = _page(cluster, cookie, "/models/chat?window=1m")
    assert 'data-measured="yes"' in _chart(model, "requests")
    assert "ready <b>1</b>" in _chart(model, "replicas")
    cluster_page = _page(cluster, cookie, "/?window=1m")
    assert 'data-measured="yes"' in _chart(cluster_page, "requests")
    # A fleet with no GPU has no GPU use to draw: said as no data, never a zero.
    gpu_use = _chart(cluster_page, "gpu-use")
    assert 'data-measured="no"' in gpu_use and ">no data</text>" in gpu_use


@pytest.mark.skipif(
    PROMETHEUS is None, reason="needs Debian's prometheus (apt-get install prometheus)"
)
def test_with_prometheus_named_the_pages_draw_what_it_scraped_and_say_when_it_is_gone(
    cluster, tmp_path: Path
):
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: llmgw\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{cluster.port}']}}]\n"
    )
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        cluster.env["LLMGW_PROMETHEUS_URL"] = f"http://127.0.0.1:{port}"
        _serving(cluster)
        cookie = staff_cookie(cluster)
        wait_for(
            "Prometheus to have scraped the node",
            lambda: httpx.get(
                f"http://127.0.0.1:{port}/api/v1/query",
                params={"query": 'llmgw_node_cpu_percent{node="cpu-a"}'},
            ).json()["data"]["result"],
            timeout=60,
        )
        _until_drawn(cluster, cookie, "/nodes/cpu-a?window=15m", "host", "the CPU, from Prometheus")
        node = _page(cluster, cookie, "/nodes/cpu-a?window=15m")
        # Prometheus' windows, not the server's rings.
        assert re.search(r'data-window="15m"[^>]*aria-current="true"', node)
        wait_for(
            "the model's replicas on its page, from Prometheus",
            lambda: "ready <b>1</b>" in _chart(_page(cluster, cookie, "/models/chat"), "replicas"),
            timeout=30,
        )
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
    time.sleep(0.5)
    gone = _chart(_page(cluster, cookie, "/nodes/cpu-a"), "host")
    assert 'data-measured="no"' in gone
    assert f"Prometheus at http://127.0.0.1:{port} could not be reached" in gone
