"""The console in a real browser: Playwright from PyPI driving Debian's chromium.

One cluster serves the whole module: a real `llmgw serve` on embedded SQLite in a
temporary LLMGW_HOME, two simulated 8-GPU agents, a staff user made in that home
and a model added over REST, as the end-to-end tests do. Each test gets a fresh
browser context (no cookies) and logs in through /login/ itself.

Playwright is told to drive /usr/bin/chromium, headless and without the sandbox
(these tests run as root in CI); `playwright install` is never needed. Without
that chromium the tests are skipped, saying how to get it; `.ci/run` installs it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.harness import REPO, Cluster, wait_for

CHROMIUM = Path("/usr/bin/chromium")
NO_CHROMIUM = (
    f"needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium; .ci/run installs it)"
)

STAFF_NAME = "operator"
STAFF_PASSWORD = "browser-test-pw-1"

# Waits in the browser: long enough for a table's refresh every few seconds and a
# reconciler pass, short enough that a broken page fails the test in good time.
PATIENCE_MS = 20_000

# A small model on the simulated H100s: one replica of four GPUs, answering at once.
CHAT = {
    "name": "chat",
    "source": "org/chat-model",
    "description": "answers the operators' questions",
    "profiles": [
        {
            "name": "tp4",
            "engine": "sim",
            "gpu_class": "h100-80g",
            "tp": 4,
            "args": ["--ttft-ms", "2", "--tokens-per-sec", "2000"],
            "startup_timeout": 60,
        }
    ],
    "scaling": {"min": 1},
}
NODES = ("gpu-a", "gpu-b")


def pytest_collection_modifyitems(items):
    for item in items:
        if "/browser/" in str(item.fspath):
            item.add_marker(pytest.mark.browser)
            if not CHROMIUM.exists():
                item.add_marker(pytest.mark.skip(reason=NO_CHROMIUM))


def _staff_user_made(cluster: Cluster) -> None:
    """A staff user in the cluster's own home, made through manage.py as an operator would."""
    code = (
        "from django.contrib.auth import get_user_model; "
        f"get_user_model().objects.create_user({STAFF_NAME!r}, password={STAFF_PASSWORD!r}, "
        "is_staff=True, is_superuser=True)"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        env=cluster.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"making the staff user failed: {done.stderr}"


@pytest.fixture(scope="module")
def console(tmp_path_factory) -> Iterator[Cluster]:
    """A running control plane with two ready simulated nodes, the chat model ready on one,
    and a staff user to log in as."""
    if not CHROMIUM.exists():
        pytest.skip(NO_CHROMIUM)
    cluster = Cluster(tmp_path_factory.mktemp("console"), production=False)
    # One-second slots, so a chart has a history within the test.
    cluster.env["LLMGW_HISTORY_STEP_SECONDS"] = "1"
    try:
        _staff_user_made(cluster)
        cluster.start_server()
        cluster.start_agent(NODES[0], "--simulate-gpus", "8xh100-80g", port_range="32000-32499")
        cluster.start_agent(NODES[1], "--simulate-gpus", "8xh100-80g", port_range="32500-32999")
        wait_for(
            "two ready nodes",
            lambda: (
                sorted((n["id"], n["state"]) for n in cluster.get("/nodes"))
                == [(n, "ready") for n in NODES]
            ),
        )
        cluster.post("/models", CHAT)
        wait_for("the chat model's replica to be ready", lambda: cluster.ready_replicas("chat"))
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def browser():
    """Chromium from Debian, headless, without the sandbox (root in CI), through Playwright."""
    if not CHROMIUM.exists():
        pytest.skip(NO_CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            yield chromium
        finally:
            chromium.close()


def log_in(page, url: str) -> None:
    """Log in at /login/ as the staff user and land on the cluster page."""
    page.goto(f"{url}/login/")
    page.fill('input[name="username"]', STAFF_NAME)
    page.fill('input[name="password"]', STAFF_PASSWORD)
    page.click('button[type="submit"]')
    page.wait_for_url(f"{url}/")


@contextmanager
def browsing(browser, base_url: str, **options) -> Iterator:
    """A fresh browser context (no cookies, `options` as Playwright takes them) with one
    tab; on leaving, the tab's scripts must not have failed nor the Content-Security-Policy
    have refused anything."""
    context = browser.new_context(base_url=base_url, **options)
    context.set_default_timeout(PATIENCE_MS)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    # Chromium tells of what the Content-Security-Policy refused (an inline style or
    # script, an eval) as an error on the console.
    refused: list[str] = []
    tab.on(
        "console",
        lambda m: (
            refused.append(f"{tab.url}: {m.text[:100]} ({m.location})")
            if "Content Security Policy" in m.text
            else None
        ),
    )
    try:
        yield tab
    finally:
        context.close()
    assert not errors, f"the page's scripts failed: {errors}"
    assert not refused, f"the Content-Security-Policy refused: {refused}"


@pytest.fixture
def page(console, browser):
    """A fresh browser context (no cookies) with one page, not logged in yet."""
    with browsing(browser, console.url) as tab:
        yield tab


@pytest.fixture
def staff_page(console, page):
    """The page, logged in as staff, on the cluster page."""
    log_in(page, console.url)
    return page
