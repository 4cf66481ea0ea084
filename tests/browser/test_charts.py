"""The console's charts, its playground and every page at a glance, in a real browser.

A scripted agent (scripted_agent.py) reports GPU 0's readings stepping through known
values and nothing for GPU 1; the server keeps its history in one-second slots
(conftest.py), so the first window is a minute. Screenshots of every page at 1440×900,
light and dark, are kept in LLMGW_SCREENSHOTS when it names a folder (.ci/run sets it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.harness import wait_for

from .conftest import PATIENCE_MS, browsing, log_in
from .scripted_agent import CACHED, LLAMACPP, NODE, ScriptedAgent


@pytest.fixture(scope="module")
def scripted(console):
    agent = ScriptedAgent(console.url, console.agent_token)
    agent.start()
    # A few seconds of history before the first page: a line, not a dot.
    wait_for("five scripted heartbeats", lambda: agent.beats >= 5, timeout=30)
    try:
        yield agent
    finally:
        agent.stop()


def _chart(page, key: str):
    return page.locator(f'#charts figure[data-chart="{key}"]')


def test_a_nodes_scripted_gpu_readings_are_drawn_and_what_it_never_measured_says_no_data(
    scripted, staff_page
):
    page = staff_page
    page.goto(f"/nodes/{NODE}?window=1m")
    util = _chart(page, "gpu-util")
    # The page refreshes its charts itself as the history grows.
    expect(util).to_have_attribute("data-measured", "yes", timeout=PATIENCE_MS)
    expect(util.locator("path.series.c0")).to_have_count(1)
    expect(util.locator(".legend")).to_contain_text(re.compile(r"GPU 0 (20|40|60|80) %"))
    expect(util.locator(".legend")).not_to_contain_text("GPU 1")
    expect(_chart(page, "gpu-power").locator(".legend")).to_contain_text(re.compile(r"GPU 0 \d+ W"))
    # A simulated node's GPUs measure nothing: no GPU chart fills its page with "no data"
    # (nor draws a zero); a line says why there are none.
    page.goto("/nodes/gpu-a?window=1m")
    expect(page.locator("#charts figure[data-chart^=gpu]")).to_have_count(0)
    expect(page.locator("#charts-said")).to_contain_text("none of its 8 GPUs reports")


def test_a_nodes_engines_and_weights_are_said_once_whole_and_in_the_mirrors_units(
    scripted, staff_page
):
    page = staff_page
    page.goto(f"/nodes/{NODE}")
    # llama.cpp, installed from the mirror and reported as an engine: one chip, not two.
    chips = page.locator("#node-engines .badge")
    expect(chips).to_have_count(2)
    expect(page.locator('#node-engines [data-engine="llamacpp"]')).to_have_text(
        f"llamacpp {LLAMACPP}"
    )
    row = page.locator(f'#node-weights tr[data-weights="{CACHED["sha256"]}"]')
    # 241.4 MiB is 253 MB, as the mirror's card says it (llmgw/core/sizes.py).
    expect(row.locator("td.num")).to_have_text("253 MB")
    source = row.locator("td").first
    expect(source).to_have_text(CACHED["source"])
    assert source.evaluate("c => c.scrollWidth <= c.clientWidth + 1"), "the source is cut"


def test_the_cpu_tile_says_what_the_cpu_charts_legend_says_in_any_window(scripted, staff_page):
    page = staff_page
    # The scripted CPU steps every second; the 4m window's last slot is a mean of four.
    said = []
    for window in ("4m", "1m", "4m"):
        page.goto(f"/nodes/{NODE}?window={window}")
        tile = page.locator('[data-tile="cpu"] .value').inner_text().strip()
        legend = page.locator('#charts figure[data-chart="host"] .legend li').first
        said.append((window, tile, legend.inner_text()))
    # A page read as the history takes a step may see the step after: once in three, not
    # every time.
    agreed = [w for w, tile, legend in said if legend == f"CPU {tile.rstrip('%')} %"]
    assert len(agreed) >= 2, f"the CPU tile and its chart's legend disagree: {said}"


def test_the_window_chosen_stays_through_the_charts_refresh_and_a_reload(scripted, staff_page):
    page = staff_page
    page.goto(f"/nodes/{NODE}")
    expect(page.locator('.windows a[aria-current="true"]')).to_have_text("4m")  # the default
    page.click('.windows a[data-window="1m"]')
    expect(page).to_have_url(re.compile(r"\?window=1m$"))
    expect(page.locator('.windows a[aria-current="true"]')).to_have_text("1m")
    # The charts' own refresh, every 15 s.
    page.wait_for_event("response", lambda r: "fragment=charts" in r.url, timeout=PATIENCE_MS)
    expect(page.locator('.windows a[aria-current="true"]')).to_have_text("1m")
    page.reload()
    expect(page.locator('.windows a[aria-current="true"]')).to_have_text("1m")


def test_the_playground_streams_an_answer_from_the_sim_engine_with_its_figures(console, staff_page):
    page = staff_page
    page.goto("/playground?model=chat")
    page.fill("#chat-message", "What does a control plane do?")
    page.click("#chat-send")
    turn = page.locator("#chat-turns li.turn").first
    expect(turn).to_have_attribute("data-done", "")
    expect(turn.locator(".answer")).not_to_be_empty()
    expect(turn.locator('[data-figure="ttft"]')).to_contain_text(re.compile(r"first token \d+ ms"))
    expect(turn.locator('[data-figure="tps"]')).to_contain_text("tokens/s")
    replica = turn.locator('[data-figure="replica"]').inner_text().removeprefix("replica ")
    assert replica in {r["id"] for r in console.ready_replicas("chat")}

    # A second turn carries the conversation on.
    page.fill("#chat-message", "And then?")
    page.click("#chat-send")
    expect(page.locator("#chat-turns li.turn[data-done]")).to_have_count(2)


def test_a_cell_cut_short_has_its_whole_text_on_hover(console, browser):
    with browsing(browser, console.url, viewport={"width": 700, "height": 900}) as page:
        log_in(page, console.url)
        page.goto("/models/chat")
        expect(page.locator("#replicas tr[data-replica]").first).to_be_visible()
        cells = page.evaluate(
            """() => Array.from(document.querySelectorAll("td, th"))
                 .filter(c => c.scrollWidth > c.clientWidth + 1)
                 .map(c => [c.textContent.replace(/\\s+/g, " ").trim(), c.title])"""
        )
        assert cells, "at 700 px wide some cell is cut short"
        for text, title in cells:
            assert title, f"the cell {text!r} is cut with nothing on hover"


PAGES = ("/", f"/nodes/{NODE}", "/models/chat", "/models", "/playground", "/quotas", "/mirror")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_page_at_1440_by_900_in_light_and_dark(console, browser, scripted, scheme, tmp_path):
    folder = Path(os.environ.get("LLMGW_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    viewport = {"width": 1440, "height": 900}
    with browsing(browser, console.url, viewport=viewport, color_scheme=scheme) as page:
        log_in(page, console.url)
        for path in PAGES:
            page.goto(path)
            expect(page.locator("main h1").first).to_be_visible()
            if path == "/models/chat":
                # What comes after the page: its analysis, its events and measurements.
                expect(page.locator("div#analysis #headroom")).to_be_visible()
                expect(page.locator("div#record #measurements")).to_be_visible()
            name = path.strip("/").replace("/", "-") or "cluster"
            shot = folder / f"{name}-{scheme}.png"
            page.screenshot(path=str(shot), full_page=True, caret="initial")
            assert shot.stat().st_size > 10_000, f"{shot} is blank"
        page.goto("/admin/fleet/node/")
        expect(page).to_have_title("Select node to view | Django site admin")
        expect(page.locator("#view-only")).to_contain_text("View only: nodes are what their agents")
        page.screenshot(
            path=str(folder / f"admin-nodes-{scheme}.png"), full_page=True, caret="initial"
        )
