"""An operator adds weights on the mirror page, watches them arrive and serves them.

A cluster of its own (the console's in conftest.py may not read weights from a
folder): `llmgw serve` with LLMGW_MIRROR_SOURCES naming a folder holding a small
GGUF file, its embedded mirror worker fetching what is added, and one simulated
node. Set LLMGW_SCREENSHOTS to a folder to keep a screenshot of the page.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.harness import Cluster, wait_for
from tests.mirror.ggufs import write_gguf
from tests.mirror.hf_configs import QWEN25_7B, dense_tensors, write_safetensors

from .conftest import CHROMIUM, NO_CHROMIUM, _staff_user_made, browsing, log_in


@pytest.fixture(scope="module")
def mirror_console(tmp_path_factory) -> Iterator[tuple[Cluster, Path]]:
    """A running control plane that may add weights from a folder, with a GGUF file in it."""
    if not CHROMIUM.exists():
        pytest.skip(NO_CHROMIUM)
    sources = tmp_path_factory.mktemp("sources")
    gguf = write_gguf(sources / "tiny.Q8_0.gguf", name="Tiny", context_length=8192)
    cluster = Cluster(tmp_path_factory.mktemp("mirror"), production=False, mirror_sources=sources)
    try:
        _staff_user_made(cluster)
        cluster.start_server()
        cluster.start_agent("gpu-a", "--simulate-gpus", "1xh100-80g", port_range="33000-33099")
        wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
        yield cluster, gguf
    finally:
        cluster.close()


@pytest.fixture
def mirror_page(mirror_console, browser):
    cluster, _ = mirror_console
    with browsing(browser, cluster.url, viewport={"width": 1400, "height": 1000}) as tab:
        log_in(tab, cluster.url)
        yield tab


def test_weights_added_on_the_page_arrive_and_are_served_as_a_model(mirror_console, mirror_page):
    cluster, gguf = mirror_console
    page = mirror_page
    page.click("header nav >> text=Mirror")
    expect(page).to_have_url(re.compile(r"/mirror$"))
    page.wait_for_load_state()  # htmx is loaded deferred: forms post through it from then on
    expect(page.locator("#no-weights")).to_have_text("No weights are ready.")

    form = page.locator("#weights-add-form")
    form.locator("[name=source]").fill(str(gguf))
    form.locator("button[type=submit]").click()

    expect(page.locator("#notice")).to_contain_text("queued for the mirror's worker")
    # The tab the new weights are in as the answer was read: the worker may be quick.
    expect(page).to_have_url(re.compile(r"/mirror\?state=(queued|downloading|ready)$"))
    expect(page.locator("article[data-weights] h2")).to_have_text(str(gguf))
    # The worker in llmgw serve fetches it; the list refreshes itself until it is done.
    expect(page.locator('#weights-tabs a[data-tab="ready"] .count')).to_have_text("1")
    page.click('#weights-tabs a[data-tab="ready"]')
    expect(page).to_have_url(re.compile(r"/mirror\?state=ready$"))
    card = page.locator("article[data-state=ready]")
    expect(card).to_contain_text(str(gguf))
    expect(card.locator("[data-memory]")).to_have_text("3 GB memory")
    expect(card.locator("details.blocked")).to_contain_text("gpu-a")
    if folder := os.environ.get("LLMGW_SCREENSHOTS"):
        # caret="initial": hiding the caret injects a style the CSP refuses.
        page.screenshot(path=str(Path(folder) / "mirror.png"), full_page=True, caret="initial")

    serve = card.locator("form.serve")
    serve.locator("[name=name]").fill("Tiny")  # not a name the catalog takes
    serve.locator("button[type=submit]").click()
    expect(page.locator("form.serve [data-field=name] .errorlist")).to_contain_text(
        "A model's name must be lowercase"
    )
    assert [m["name"] for m in cluster.get("/models")] == []

    page.locator("form.serve [name=name]").fill("tiny")
    page.locator("form.serve button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/models/tiny$"))
    assert [m["name"] for m in cluster.get("/models")] == ["tiny"]

    page.goto("/mirror?state=ready")
    expect(page.locator("article [data-models]")).to_have_text("tiny")
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("article button[data-remove]").click()
    expect(page.locator("article [data-refused]")).to_contain_text("are used by tiny")


def test_a_safetensors_folder_is_planned_on_gpus_and_served_as_vllm(mirror_console, mirror_page):
    cluster, gguf = mirror_console
    folder = gguf.parent / "qwen2.5-7b"
    (folder).mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN25_7B))
    write_safetensors(folder / "model.safetensors", dense_tensors(QWEN25_7B))
    page = mirror_page
    page.goto("/mirror")
    page.wait_for_load_state()

    form = page.locator("#weights-add-form")
    form.locator("[name=source]").fill(str(folder))
    form.locator("button[type=submit]").click()
    expect(page.locator("#notice")).to_contain_text("queued for the mirror's worker")
    wait_for(
        "the folder fetched",
        lambda: any(
            w["source"] == str(folder) and w["state"] == "ready" for w in cluster.get("/weights")
        ),
    )
    page.goto("/mirror?state=ready")
    card = page.locator("article[data-state=ready]").filter(has_text=str(folder))
    plan = card.locator("[data-model-plan]")
    expect(plan).to_contain_text("Qwen2ForCausalLM")
    # 14.2 GiB of BF16 weights and a sequence of 32,768 fit one simulated H100.
    expect(plan.locator("[data-gpu-class=h100-80g]")).to_contain_text("h100-80g: tp 1")
    if shots := os.environ.get("LLMGW_SCREENSHOTS"):
        page.screenshot(
            path=str(Path(shots) / "mirror-safetensors.png"), full_page=True, caret="initial"
        )

    serve = plan.locator("form.serve")
    serve.locator("[name=name]").fill("qwen")
    serve.locator("[name=cores]").fill("4")
    serve.locator("[name=selector]").fill("zone")
    serve.locator("button[type=submit]").click()
    expect(
        page.locator("[data-model-plan] form.serve [data-field=selector] .errorlist")
    ).to_contain_text("A node selector is key=value")
    page.locator("[data-model-plan] form.serve [name=selector]").fill("zone=a")
    page.locator("[data-model-plan] form.serve button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/models/qwen$"))
    (model,) = [m for m in cluster.get("/models") if m["name"] == "qwen"]
    assert model["source"] == str(folder)
