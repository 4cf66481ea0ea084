"""An operator runs the cluster from the console in a real browser.

The tests share one cluster (conftest.py) and run in this order: the drain
comes last, since it moves what runs on the drained node.
"""

from __future__ import annotations

import re

from playwright.sync_api import expect

from .conftest import NODES, PATIENCE_MS, STAFF_NAME, log_in


def test_a_stranger_is_sent_to_log_in_and_staff_see_the_simulated_nodes(console, page):
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))

    log_in(page, console.url)

    expect(page.locator("header .who")).to_contain_text(STAFF_NAME)
    for node in NODES:
        row = page.locator(f"#nodes-table tr[data-node={node}]")
        expect(row).to_be_visible()
        expect(row.locator("td.state")).to_have_text("ready")
        expect(row).to_contain_text("h100-80g")
    expect(page.locator("#nodes-table tbody tr[data-node]")).to_have_count(len(NODES))
    expect(page.locator("#models-table tr[data-model=chat]")).to_contain_text("chat")


def test_a_class_set_on_the_model_page_shows_in_the_cluster_table_when_it_refreshes(staff_page):
    cluster = staff_page
    chat_class = cluster.locator("#models-table tr[data-model=chat] td.class")
    expect(chat_class).to_contain_text("standard")

    # The model page in a second tab of the same session; the first keeps refreshing.
    model = cluster.context.new_page()
    model.goto("/models/chat")
    model.select_option("#class-form select[name=capacity_class]", "critical")
    model.click("#class-form button[type=submit]")
    expect(model.locator("#model-class")).to_have_attribute("data-class", "critical")

    # No reload: the models table refreshes itself every few seconds.
    expect(chat_class).to_contain_text("critical", timeout=PATIENCE_MS)


def test_a_quota_with_a_bad_figure_is_refused_beside_that_figure_and_nothing_is_set(
    console, staff_page
):
    console.post("/orgs", {"name": "Acme"})
    page = staff_page
    page.goto("/quotas")
    form = page.locator("#quota-form")

    form.locator("[name=scope]").fill("org:Acme")
    form.locator("[name=gpus]").fill("9")
    form.locator("[name=limit_gpus]").fill("4")
    form.locator("button[type=submit]").click()

    error = form.locator("[data-field=gpus] .errorlist")
    expect(error).to_contain_text("above its limit")
    expect(form.locator("[data-field=limit_gpus] .errorlist")).to_have_count(0)
    # The figures stay where they were typed, to be mended.
    expect(form.locator("[name=gpus]")).to_have_value("9")
    assert console.get("/quotas") == []

    form.locator("[name=gpus]").fill("2")
    form.locator("button[type=submit]").click()

    expect(page.locator("#quota-table")).to_contain_text("Acme")
    expect(form.locator(".errorlist")).to_have_count(0)
    assert [q["limit"]["gpus"] for q in console.get("/quotas")] == [4]
    # The guarantee's marker is placed by static/console.js: no style attribute is
    # allowed under the Content-Security-Policy.
    marker = page.locator("#quota-table i.guarantee").first
    expect(marker).to_have_attribute("style", re.compile(r"left: 50(\.0)?%"))


def _api_state(console, node: str) -> str:
    return next(n["state"] for n in console.get("/nodes") if n["id"] == node)


def test_a_node_is_drained_only_after_the_operator_confirms(console, staff_page):
    page = staff_page
    node = NODES[1]
    page.goto(f"/nodes/{node}")
    state = page.locator("#node-state")
    expect(state).to_have_text("ready")

    asked: list[str] = []

    def dismiss(dialog):
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.click("#drain-button")
    page.wait_for_timeout(500)
    assert asked and f"Drain {node}?" in asked[0]
    expect(state).to_have_text("ready")
    assert _api_state(console, node) == "ready"

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#drain-button")

    expect(state).to_have_text("draining")
    assert _api_state(console, node) == "draining"
    page.goto("/")
    expect(page.locator(f"#nodes-table tr[data-node={node}] td.state")).to_have_text("draining")
