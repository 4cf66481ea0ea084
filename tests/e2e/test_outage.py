"""A PostgreSQL outage, seen, survived and said once (issue 12, item 9): a real `llmgw serve`
(reconciler in process) reaching PostgreSQL through a TCP balancer the test cuts for a
while, a real agent and engine, the official openai client."""

from __future__ import annotations

import os
import re
import time

import httpx
import pytest

from .balancer import Balancer
from .harness import Cluster, wait_for

pytestmark = pytest.mark.skipif(
    not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
    reason="the outage is PostgreSQL's; DATABASE_URL and REDIS_URL are not set",
)

OUTAGE_S = 12


def test_a_database_outage_is_a_503_a_stale_scrape_and_two_log_lines(tmp_path):
    cluster = Cluster(tmp_path, production=True)  # its own database, migrated, with tokens
    url = httpx.URL(cluster.env["DATABASE_URL"])
    proxy = Balancer([url.port or 5432])
    try:
        # Embedded on PostgreSQL, through the proxy: the reconciler and mirror in serve.
        cluster.production = False
        cluster.env.pop("REDIS_URL")
        cluster.env["DATABASE_URL"] = str(url.copy_with(port=proxy.port))
        cluster.start_server()
        cluster.start_agent("cpu-a", "--memory-gb", "8", "--cpus", "4", port_range="38000-38099")
        wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
        assert "llmgw_node_up" in httpx.get(f"{cluster.url}/metrics").text
        before = cluster.log("serve").count("Traceback")

        proxy.cut()
        down = time.monotonic()
        wait_for(
            "the API to say the database is away",
            lambda: cluster.client.get("/nodes").status_code == 503,
            timeout=30,
        )
        answer = cluster.client.get("/nodes")
        assert answer.json()["detail"].startswith("The control plane's database is not answering")
        assert answer.headers["retry-after"] == "5"
        scrape = httpx.get(f"{cluster.url}/metrics", timeout=10)
        assert scrape.status_code == 200
        assert "llmgw_database_up 0.0" in scrape.text and "llmgw_node_up" in scrape.text
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
        proxy.restore()

        wait_for(
            "the API back", lambda: cluster.client.get("/nodes").status_code == 200, timeout=60
        )
        wait_for(
            "the node ready again",
            lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"],
            timeout=60,
        )
        log = cluster.log("serve")
        # Each failing loop says so once with its traceback and once when it works again; a
        # traceback per attempt was thousands of lines a minute.
        said = [line[:160] for line in log.splitlines() if " ERROR " in line or " WARNING " in line]
        failed = [line.split(" failed: ")[0] for line in said if " failed: " in line]
        assert failed and len(failed) == len(set(failed)), "\n".join(said)
        # A traceback (two, chained) per loop that failed, not per attempt.
        assert log.count("Traceback") - before <= 2 * len(failed), "\n".join(said)
        assert "Service Unavailable" not in log
        assert "works again after" in log
        # Records, not the lines their tracebacks span: a few per loop, not one per attempt.
        records = [line for line in log.splitlines() if re.match(r"\d{4}-\d\d-\d\d ", line)]
        assert len(records) < 120, "\n".join(said)
    finally:
        cluster.close()
        proxy.close()
