"""An engine that exits, end to end: real server, real agent, a sim engine given a bad argument.
Its own error reaches `ctl model explain`, `ctl logs` and the cluster page's "Needs attention"."""

from __future__ import annotations

import re

import httpx

from .harness import staff_cookie, wait_for

BAD = {
    "name": "broken",
    "source": "org/broken-model",
    "profiles": [
        {
            "name": "cpu",
            "engine": "sim",
            "cpu_cores": 1,
            "min_memory_gb": 1,
            "args": ["--no-such-flag"],
            "startup_timeout": 60,
        }
    ],
}
# What the engine itself says (argparse's own words), not what llmgw makes of it.
ENGINE_SAYS = "llmgw sim-engine: error: unrecognized arguments: --no-such-flag"


def test_an_engine_that_exits_shows_its_own_error_in_explain_logs_and_the_cluster_page(cluster):
    cluster.start_agent("cpu-a", "--cpus", "4", "--memory-gb", "8", port_range="32000-32499")
    wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
    cluster.post("/models", BAD)

    failing = wait_for(
        "the model to back off with its failure",
        lambda: (m := cluster.get("/models/broken"))["last_failure"] and m,
    )
    failure = failing["last_failure"]
    assert failure["node"] == "cpu-a"
    assert failure["exit_code"] == 2
    assert failure["detail"].startswith("The engine exited with code 2.\n")
    assert ENGINE_SAYS in failure["detail"]

    explain = cluster.ctl("model", "explain", "broken")
    assert explain.returncode == 0, explain.stderr
    assert "backing off after" in explain.stdout or "parked after" in explain.stdout
    assert f"  {ENGINE_SAYS}" in explain.stdout.splitlines()

    models = cluster.ctl("models")
    assert f"failing: broken: {ENGINE_SAYS}" in models.stdout

    # The replica is forgotten once its failure is counted; its log is still on its node.
    logs = cluster.ctl("logs", failure["replica"], "--lines", "5")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines()[-1] == ENGINE_SAYS

    cookie = staff_cookie(cluster)
    page = httpx.get(f"{cluster.url}/", cookies={"sessionid": cookie}, timeout=10)
    assert page.status_code == 200
    strip = re.search(r'<section id="attention".*?</section>', page.text, re.S).group(0)
    assert " hidden>" not in strip.split("\n")[0]
    assert re.search(
        r'broken</a> is (<span class="state state-failing">failing</span>|parked) '
        r"after \d+ failures?: ",
        strip,
    )
    assert "unrecognized arguments: --no-such-flag" in strip
    detail = httpx.get(
        f"{cluster.url}/replicas/{failure['replica']}/log",
        cookies={"sessionid": cookie},
        headers={"HX-Request": "true"},
        timeout=10,
    )
    assert detail.status_code == 200
    assert ENGINE_SAYS in detail.text
