"""The console, page by page, on a cluster shaped like `llmgw demo`'s, at 1440×900.

A cluster of its own: two simulated 8 × h100-80g nodes in racks r1 and r2 and a 16-CPU
node in r1 labelled kind=cpu, as the demo starts them; chat (two replicas of four GPUs),
embed (one core on the CPU node) and code, whose a100 GPUs no node has, so its requests
go to its fallback chat; then gpu-b is drained. Each test looks at one page as an
operator first sees it, checks what issue 37 found wrong there, and keeps a screenshot
in LLMGW_SCREENSHOTS (`demo-*.png`) when it names a folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.harness import Cluster, wait_for

from .conftest import CHROMIUM, NO_CHROMIUM, _staff_user_made, browsing, log_in

GPU_NODE = "--simulate-gpus 8xh100-80g --memory-gb 1024 --cpus 96"
NODES = {
    "gpu-a": f"{GPU_NODE} --zone a --rack r1",
    "gpu-b": f"{GPU_NODE} --zone b --rack r2",
    "cpu-1": "--memory-gb 64 --cpus 16 --zone a --rack r1 --labels kind=cpu",
}
SIM = ["--ttft-ms", "2", "--tokens-per-sec", "2000"]
MODELS = (
    {
        "name": "chat",
        "source": "org/chat",
        "description": "General chat for every team; two replicas on four GPUs each",
        "scaling": {"min": 2, "max": 3},
        "profiles": [
            {"name": "tp4", "engine": "sim", "gpu_class": "h100-80g", "tp": 4, "args": SIM}
        ],
    },
    {
        "name": "embed",
        "source": "org/embed",
        "description": "Embeddings on CPU",
        "scaling": {"min": 1},
        "profiles": [
            {"name": "cpu", "engine": "sim", "min_memory_gb": 8, "cpu_cores": 1, "args": SIM}
        ],
    },
    {
        "name": "code",
        "source": "org/code",
        "description": "Code completion on GPUs this fleet does not have",
        "scaling": {"min": 1},
        "fallbacks": ["chat"],
        "profiles": [
            {"name": "a100", "engine": "sim", "gpu_class": "a100-40g", "tp": 1, "args": SIM}
        ],
    },
)
VIEWPORT = {"width": 1440, "height": 900}

# The cells of every table on a page that do not show their whole text at this width.
CUT_CELLS = """() => Array.from(document.querySelectorAll("td, th"))
    .filter(c => c.scrollWidth > c.clientWidth + 1)
    .map(c => c.textContent.replace(/\\s+/g, " ").trim())"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[Cluster]:
    if not CHROMIUM.exists():
        pytest.skip(NO_CHROMIUM)
    cluster = Cluster(tmp_path_factory.mktemp("demo-pages"), production=False)
    cluster.env["LLMGW_HISTORY_STEP_SECONDS"] = "1"
    try:
        _staff_user_made(cluster)
        cluster.start_server()
        for i, (node, flags) in enumerate(NODES.items()):
            ports = f"{34000 + 500 * i}-{34499 + 500 * i}"
            cluster.start_agent(node, *flags.split(), port_range=ports)
        wait_for(
            "three ready nodes",
            lambda: (
                sorted(n["id"] for n in cluster.get("/nodes") if n["state"] == "ready")
                == sorted(NODES)
            ),
        )
        for model in MODELS:
            cluster.post("/models", model)
        wait_for("chat's two replicas", lambda: len(cluster.ready_replicas("chat")) == 2)
        wait_for("embed's replica", lambda: cluster.ready_replicas("embed"))
        held = {s["node"] for r in cluster.ready_replicas("chat") for s in r["shards"]}
        # Drain a GPU node chat does not run on, if there is one, so nothing has to move.
        drained = "gpu-b" if "gpu-b" not in held else "gpu-a" if "gpu-a" not in held else "gpu-b"
        cluster.post(f"/nodes/{drained}/drain")
        cluster.drained = drained  # type: ignore[attr-defined]
        wait_for("chat's two replicas again", lambda: len(cluster.ready_replicas("chat")) == 2)
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def tab(demo, browser):
    with browsing(browser, demo.url, viewport=VIEWPORT) as page:
        log_in(page, demo.url)
        yield page


def _shot(page, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("LLMGW_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    shot = folder / f"demo-{name}.png"
    # caret="initial": hiding the caret injects a style the CSP refuses.
    page.screenshot(path=str(shot), full_page=True, caret="initial")
    assert shot.stat().st_size > 10_000, f"{shot} is blank"


def _ready_node(demo) -> str:
    return "gpu-a" if demo.drained == "gpu-b" else "gpu-b"


def test_a_simulated_gpu_node_page_says_each_thing_once_and_draws_what_it_measures(
    demo, tab, tmp_path
):
    node = _ready_node(demo)
    tab.goto(f"/nodes/{node}")
    expect(tab.locator("#node-state")).to_have_text("ready")
    # Its location once, as badges; its labels only where they say something else.
    expect(tab.locator("#location .badge")).to_have_count(2)
    expect(tab.locator("#node-labels")).to_have_count(0)
    expect(tab.locator("#node-engines .badge")).to_have_count(1)
    # Only what applies to a ready node.
    expect(tab.locator("#cordon-button")).to_be_visible()
    expect(tab.locator("#drain-button")).to_be_visible()
    expect(tab.locator("#uncordon-button")).to_have_count(0)
    # Its GPUs measure nothing: no four "no data" charts, a line saying why.
    expect(tab.locator("#charts figure[data-chart^=gpu]")).to_have_count(0)
    expect(tab.locator("#charts-said")).to_contain_text("none of its 8 GPUs reports")
    # Its memory use is not reported: the chart says what it draws.
    host = tab.locator('#charts figure[data-chart="host"]')
    expect(host.locator("figcaption")).to_have_text("CPU (its memory use is not reported)")
    expect(host.locator(".legend li")).to_have_count(1)
    # The load tile's label is one line.
    label = tab.locator('[data-tile="load"] .label')
    expect(label).to_have_text("load, 1 min")
    assert label.bounding_box()["height"] < 24, "the load tile's label wraps"
    expect(tab.locator('[data-tile="cpu"] .label')).to_have_text("CPU · 96 cores")
    assert tab.evaluate(CUT_CELLS) == [], "a cell is cut at 1440 px"
    _shot(tab, f"node-{node}", tmp_path)


def test_a_draining_node_offers_only_uncordon_and_the_cluster_says_its_gpus_are_not_free(
    demo, tab, tmp_path
):
    drained = demo.drained
    tab.goto(f"/nodes/{drained}")
    expect(tab.locator("#node-state")).to_have_text("draining")
    expect(tab.locator("#uncordon-button")).to_have_text("Uncordon, ending the drain")
    expect(tab.locator("#cordon-button")).to_have_count(0)
    expect(tab.locator("#drain-button")).to_have_count(0)
    _shot(tab, f"node-{drained}", tmp_path)

    tab.goto("/")
    gpus = tab.locator('#counters [data-counter="gpus"]')
    expect(gpus.locator("[data-not-free]")).to_have_text(
        re.compile(r"^not free: \d idle on draining nodes$")
    )
    row = tab.locator(f"#nodes-table tr[data-node={drained}]")
    expect(row).to_contain_text(re.compile(r"0 / 8 \(\d idle\)"))


def test_the_cluster_page_fills_its_row_of_charts_and_counts_every_silent_gpu(demo, tab, tmp_path):
    tab.goto("/")
    grid = tab.locator("#charts .chart-grid").bounding_box()
    boxes = [b.bounding_box() for b in tab.locator("#charts figure.chart-box").all()]
    assert len(boxes) == 2
    right = max(b["x"] + b["width"] for b in boxes)
    assert right >= grid["x"] + grid["width"] - 2, "the charts leave the row's right part empty"
    # Every GPU in a rack that says nothing of its power, held or not: r2's too.
    for rack in ("r1", "r2"):
        expect(tab.locator(f'#racks tr[data-rack="{rack}"] [data-silent-gpus]')).to_contain_text(
            "8 of its 8 GPUs not reporting power"
        )
    assert tab.evaluate(CUT_CELLS) == [], "a cell is cut at 1440 px"
    _shot(tab, "cluster", tmp_path)


def test_the_models_page_says_a_model_its_fallback_answers_is_answered(tab, tmp_path):
    tab.goto("/models")
    code = tab.locator("tr[data-model=code]")
    expect(code.locator(".state")).to_have_text("fallback")
    expect(code.locator("[data-fallback]")).to_have_text("answered by chat")
    expect(code.locator(".state")).to_have_attribute(
        "title", re.compile(r"^its requests are answered by chat while it is unplaceable")
    )
    expect(tab.locator("tr[data-model=chat] .state")).to_have_text("ready")
    _shot(tab, "models", tmp_path)


def test_a_model_page_names_itself_and_its_figures_read_as_counts(tab, tmp_path):
    tab.goto("/models/chat?window=4m")
    expect(tab.locator("#breadcrumb")).to_have_text("Models / chat")
    headroom = tab.locator("#headroom")
    expect(headroom).not_to_contain_text("more more")
    expect(headroom).not_to_contain_text("or more")
    # Replicas are counted whole, whatever the window's slots average.
    legend = tab.locator('#charts figure[data-chart="replicas"] .legend')
    expect(legend).to_contain_text(re.compile(r"holding room \d+(?![.\d])"))
    expect(tab.locator("#replicas tr[data-replica]")).to_have_count(2)
    assert tab.evaluate(CUT_CELLS) == [], "a cell is cut at 1440 px"
    _shot(tab, "model-chat", tmp_path)

    tab.goto("/models/embed")
    expect(tab.locator("#model-reserves")).to_contain_text("8 GB, 1 core")
    expect(tab.locator("#model-reserves")).not_to_contain_text("cores")


def test_a_cpu_nodes_page_says_one_core_and_no_gpu_charts(tab, tmp_path):
    tab.goto("/nodes/cpu-1")
    expect(tab.locator("#breadcrumb")).to_have_text("Cluster / cpu-1")
    expect(tab.locator("#node-labels")).to_have_text("kind=cpu")
    expect(tab.locator("#charts-said")).to_have_text("It has no GPUs: no GPU charts.")
    expect(tab.locator("#node-replicas tr[data-replica]")).to_contain_text("8 GB · 1 core")
    assert tab.evaluate(CUT_CELLS) == [], "a cell is cut at 1440 px"
    _shot(tab, "node-cpu-1", tmp_path)


def test_the_playground_keeps_its_input_below_the_conversation(tab, tmp_path):
    tab.goto("/playground?model=chat")
    for message in ("What does a control plane do?", "And then?"):
        tab.fill("#chat-message", message)
        tab.click("#chat-send")
    expect(tab.locator("#chat-turns li.turn[data-done]")).to_have_count(2)
    turns = tab.locator("#chat-turns").bounding_box()
    form = tab.locator("#chat-form").bounding_box()
    assert turns["y"] + turns["height"] <= form["y"], "the conversation is drawn below its input"
    # The input stays in sight as the conversation grows.
    assert tab.locator("#chat-message").is_visible()
    _shot(tab, "playground", tmp_path)
