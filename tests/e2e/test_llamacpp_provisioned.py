"""The engine provisioned through the mirror, with real processes: the llama-server that
`llmgw engines build llamacpp` made is uploaded to the mirror; an agent that has no
llama.cpp of its own is placed a llama.cpp model anyway, fetches the build and the weights
from the mirror, installs the one, caches the other, and serves SmolLM2-135M-Instruct
through the gateway."""

from __future__ import annotations

import hashlib
import os
import shutil

import httpx
import openai
import pytest

from .conftest import MODES
from .harness import Cluster, gateway_key, gateway_project, wait_for
from .test_llamacpp import (  # noqa: F401 (fixtures, shared)
    HELLO,
    MODEL,
    READY_S,
    llamacpp_model,
    weights,
)


@pytest.fixture(scope="module", params=MODES)
def provisioned(request, tmp_path_factory, llama_server_binary, llamacpp_model, weights):  # noqa: F811
    cluster = Cluster(
        tmp_path_factory.mktemp(f"provisioned-{request.param}"),
        production=request.param == "production",
        mirror_sources=weights.parent,
    )
    # No llama-server to be found on the agent's PATH: it must come from the mirror.
    dirs = cluster.env["PATH"].split(os.pathsep)
    cluster.env["PATH"] = os.pathsep.join(
        d for d in dirs if not shutil.which("llama-server", path=d)
    )
    try:
        cluster.start_server()
        with open(llama_server_binary, "rb") as binary:
            build = cluster.client.post(
                "/engines",
                files={"file": ("llama-server", binary)},
                data={"engine": "llamacpp", "version": "b1-0c1e570"},
                timeout=60,
            )
        assert build.status_code == 201, build.text
        added = cluster.post("/weights", {"source": llamacpp_model["source"]})
        wait_for(
            "the mirror to hold the weights",
            lambda: cluster.get(f"/weights/{added['id']}")["state"] == "ready",
            timeout=120,
        )
        cluster.start_agent("cpu-bare", "--memory-gb", "8", "--cpus", "2", port_range="33100-33199")
        node = wait_for(
            "the node to be ready",
            lambda: next((n for n in cluster.get("/nodes") if n["state"] == "ready"), None),
        )
        assert "llamacpp" not in node["engines"], node["engines"]
        cluster.post("/models", llamacpp_model)
        try:
            [replica] = wait_for(
                "the llama.cpp replica to be ready on an engine from the mirror",
                lambda: cluster.ready_replicas(MODEL),
                timeout=READY_S,
                every=0.5,
            )
        except AssertionError:
            raise AssertionError(cluster.log("agent-cpu-bare")[-4000:]) from None
        yield cluster, replica, build.json()
    finally:
        cluster.close()


def test_a_node_without_llamacpp_installs_it_from_the_mirror_and_serves(provisioned):
    cluster, _, build = provisioned
    installed = list((cluster.home / "cpu-bare" / "engines").rglob("llama-server"))
    assert installed, "no llama-server installed under the agent's engines folder"
    assert hashlib.sha256(installed[0].read_bytes()).hexdigest() == build["sha256"]
    [node] = cluster.get("/nodes")
    assert "llamacpp" in node["engines"]

    key = gateway_key(cluster, gateway_project(cluster, "bare"), "bare")
    client = openai.OpenAI(
        base_url=f"{cluster.url}/v1", api_key=key["secret"], max_retries=0, timeout=120
    )
    answer = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8)
    assert answer.model == MODEL and answer.choices[0].message.content.strip()
    assert httpx.get(f"{cluster.url}/api/v1/openapi.json").status_code == 200
