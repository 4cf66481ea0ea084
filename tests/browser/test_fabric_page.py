"""The NVLink page (`/fabric`) in a real browser, upon a small rack of its own.

Two real agents simulate trays of clique 1 of the NVLink domain nvl72-a
(`--simulate-fabric nvl72-a:1`, IMEX up); a scripted agent reports a third tray of it
with IMEX down and GPU 1 with uncorrected ECC errors. A model over two trays is placed
inside the domain, on the trays with IMEX up. The page must draw the rack as such: its
three trays, each GPU filled by what holds it and marked by its health, IMEX per tray,
and the replica spanning two trays. The screenshot is kept in LLMGW_SCREENSHOTS
(`fabric.png`) when it names a folder.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.harness import Cluster, wait_for

from .conftest import CHROMIUM, NO_CHROMIUM, _staff_user_made, browsing, log_in
from .scripted_agent import ScriptedAgent

TRAY = ["--simulate-gpus", "4xh100-80g", "--simulate-fabric", "nvl72-a:1"]
# The cluster UUID an agent derives from the domain's name (fleet/agent/fabric.py).
CLUSTER = str(uuid.uuid5(uuid.NAMESPACE_DNS, "nvl72-a.fabric.llmgw"))
SIM = ["--ttft-ms", "2", "--tokens-per-sec", "2000"]
WIDE = {
    "name": "wide",
    "source": "org/wide",
    "scaling": {"min": 1},
    "profiles": [
        {"name": "tp4x2", "engine": "sim", "gpu_class": "h100-80g", "tp": 4, "nodes": 2,
         "args": SIM, "startup_timeout": 60}
    ],
}  # fmt: skip
VIEWPORT = {"width": 1440, "height": 900}


class BrokenTray(ScriptedAgent):
    """tray-3: in the same clique, IMEX down, GPU 1 with two uncorrected ECC errors."""

    def _register(self) -> dict:
        fabric = {"cluster_uuid": CLUSTER, "clique_id": 1, "state": "completed", "status": 0}
        gpus = [{"index": i, "fabric": fabric} for i in range(4)]
        gpus[1]["ecc"] = {"enabled": True, "uncorrected_volatile": 2}
        return {
            "type": "register",
            "node_id": "tray-3",
            "hostname": "tray-3",
            "mgmt_addr": "127.0.0.1",
            "memory_total_mb": 65536,
            "cpu_count": 16,
            "gpus": [
                {"index": i, "uuid": f"GPU-tray-3-{i}", "name": "NVIDIA H100 80GB HBM3",
                 "memory_total_mb": 81559}
                for i in range(4)
            ],
            "engines": {"sim": "scripted"},
            "engines_probed": True,
            "fabric": {"gpus": gpus, "imex": {"state": "down", "domain": "nvl72-a"}},
        }  # fmt: skip

    def _heartbeat(self, seq: int) -> dict:
        return {"type": "heartbeat", "seq": seq}


@pytest.fixture(scope="module")
def rack(tmp_path_factory) -> Iterator[Cluster]:
    if not CHROMIUM.exists():
        pytest.skip(NO_CHROMIUM)
    cluster = Cluster(tmp_path_factory.mktemp("fabric"), production=False)
    broken = None
    try:
        _staff_user_made(cluster)
        cluster.start_server()
        cluster.start_agent("tray-1", *TRAY, port_range="36000-36499")
        cluster.start_agent("tray-2", *TRAY, port_range="36500-36999")
        broken = BrokenTray(cluster.url, cluster.agent_token)
        broken.start()
        wait_for(
            "three ready trays",
            lambda: (
                sorted(n["id"] for n in cluster.get("/nodes") if n["state"] == "ready")
                == ["tray-1", "tray-2", "tray-3"]
            ),
        )
        cluster.post("/models", WIDE)
        wait_for(
            "wide's replica placed over two trays",
            lambda: any(len(r["shards"]) == 2 for r in cluster.get("/replicas", model="wide")),
        )
        yield cluster
    finally:
        if broken is not None:
            broken.stop()
        cluster.close()


def test_the_nvlink_page_draws_each_domain_as_a_rack(rack, browser, tmp_path):
    """The seed's TestTheNVLinkPageDrawsEachDomainAsARack."""
    with browsing(browser, rack.url, viewport=VIEWPORT) as tab:
        log_in(tab, rack.url)
        link = tab.locator("#fabric-link a")
        expect(link).to_be_visible()
        link.click()
        tab.wait_for_url(f"{rack.url}/fabric")
        domain = tab.locator(f'section.domain[data-domain="{CLUSTER}"][data-clique="1"]')
        expect(domain.locator(".tray")).to_have_count(3)
        expect(domain.locator(".gpu")).to_have_count(12)
        # The replica over two trays: two GPUs on each of the trays with IMEX up.
        held = domain.locator(".gpu[data-use=replica]")
        expect(held).to_have_count(4)
        for tray in ("tray-1", "tray-2"):
            expect(domain.locator(f'[data-tray="{tray}"] .gpu[data-use=replica]')).to_have_count(2)
            expect(domain.locator(f'[data-tray="{tray}"] [data-imex]')).to_have_text("IMEX up")
        expect(domain.locator('[data-tray="tray-3"] [data-imex]')).to_have_text("IMEX down")
        expect(domain.locator('[data-tray="tray-3"] .gpu[data-use=replica]')).to_have_count(0)
        # The broken GPU is marked, and says why on hover.
        bad = domain.locator('[data-tray="tray-3"] .gpu[data-health=bad]')
        expect(bad).to_have_count(1)
        expect(bad).to_have_attribute("data-gpu", "1")
        assert "has 2 uncorrected ECC errors" in (bad.get_attribute("title") or "")
        # Replica GPUs are filled with a colour; a free one is not.
        fills = tab.evaluate(
            """() => [".gpu[data-use=replica]", ".gpu[data-use=free]"].map(
                s => getComputedStyle(document.querySelector(s)).backgroundColor)"""
        )
        assert fills[0] not in ("rgba(0, 0, 0, 0)", "transparent") and fills[0] != fills[1]
        row = domain.locator("table.domain-replicas tbody tr")
        expect(row).to_have_count(1)
        expect(row).to_contain_text("wide")
        expect(row.locator("[data-spans]")).to_have_text("spans 2 trays")
        expect(domain.locator("[data-imex-up]")).to_have_text("IMEX up on 2 of 3")
        folder = Path(os.environ.get("LLMGW_SCREENSHOTS") or os.environ.get("TMPDIR") or tmp_path)
        folder.mkdir(parents=True, exist_ok=True)
        shot = folder / "fabric.png"
        # caret="initial": hiding the caret injects a style the CSP refuses.
        tab.screenshot(path=str(shot), full_page=True, caret="initial")
        assert shot.stat().st_size > 10_000, f"{shot} is blank"


def test_a_trays_page_lists_its_links_and_ecc_counters(rack, browser, tmp_path):
    with browsing(browser, rack.url, viewport=VIEWPORT) as tab:
        log_in(tab, rack.url)
        tab.goto("/nodes/tray-3")
        broken = tab.locator('#gpu-fabric tr[data-gpu="1"]')
        expect(broken.locator('[data-ecc="uncorrected"]')).to_have_text("2")
        expect(broken).to_contain_text("GPU 1 of node tray-3 has 2 uncorrected ECC errors")
        expect(tab.locator("#node-fabric [data-imex]")).to_have_text("IMEX down")
        tab.goto("/nodes/tray-1")
        expect(tab.locator("#node-fabric-said")).to_contain_text(f"{CLUSTER} clique 1")
        # Simulated neighbours are paired by one NVLink each: 0-1 and 2-3.
        tab.locator("#node-fabric summary").click()
        expect(tab.locator("#node-nvlinks tbody tr")).to_have_count(4)
        expect(tab.locator('#node-nvlinks tr[data-link="2-0"]')).to_contain_text("GPU 3")
        folder = Path(os.environ.get("LLMGW_SCREENSHOTS") or os.environ.get("TMPDIR") or tmp_path)
        folder.mkdir(parents=True, exist_ok=True)
        shot = folder / "fabric-node.png"
        tab.locator("#node-fabric").screenshot(path=str(shot), caret="initial")
        assert shot.stat().st_size > 5_000, f"{shot} is blank"
