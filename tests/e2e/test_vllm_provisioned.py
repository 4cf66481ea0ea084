"""vLLM provisioned with pip, with real processes and nothing from the internet: the control
plane pins the fake vllm 0.0.1 (tests/agent/fake_vllm.py) from an index on loopback; an
agent with a simulated GPU and no vLLM of its own is placed a vLLM model anyway, makes an
environment under its engines folder, pip installs the pin into it, probes it, and the
replica it starts with that `vllm serve` answers through the gateway."""

from __future__ import annotations

import os
import shutil

import openai
import pytest

from tests.agent.fake_vllm import PIP_ENV, PIP_ENV_REMOVED, serve_fake_vllm

from .conftest import MODES
from .harness import Cluster, gateway_key, gateway_project, wait_for

MODEL = "tiny-vllm"
# Making an environment and running pip in it takes seconds, more on a loaded machine.
READY_S = 180.0


@pytest.fixture(scope="module", params=MODES)
def provisioned(request, tmp_path_factory):
    home = tmp_path_factory.mktemp(f"vllm-{request.param}")
    index = serve_fake_vllm(home / "index")
    cluster = Cluster(home / "cluster", production=request.param == "production")
    cluster.env.update(LLMGW_VLLM_VERSION="0.0.1", LLMGW_VLLM_INDEX_URL=index.url, **PIP_ENV)
    for name in PIP_ENV_REMOVED:
        cluster.env.pop(name, None)
    # No vllm to be found on the agent's PATH: it must be installed.
    dirs = cluster.env["PATH"].split(os.pathsep)
    cluster.env["PATH"] = os.pathsep.join(d for d in dirs if not shutil.which("vllm", path=d))
    try:
        cluster.start_server()
        cluster.start_agent("gpu-bare", "--simulate-gpus", "1xh100-80g", port_range="33200-33299")
        node = wait_for(
            "the node to be ready",
            lambda: next((n for n in cluster.get("/nodes") if n["state"] == "ready"), None),
        )
        assert "vllm" not in node["engines"], node["engines"]
        cluster.post(
            "/models",
            {
                "name": MODEL,
                "source": "acme/tiny",
                "profiles": [{"name": "tp1", "engine": "vllm", "gpu_class": "h100-80g", "tp": 1}],
            },
        )
        try:
            [replica] = wait_for(
                "the vLLM replica to be ready on a vllm pip installed",
                lambda: cluster.ready_replicas(MODEL),
                timeout=READY_S,
                every=0.5,
            )
        except AssertionError:
            raise AssertionError(cluster.log("agent-gpu-bare")[-4000:]) from None
        yield cluster, replica, index
    finally:
        cluster.close()
        index.stop()


def test_a_gpu_node_without_vllm_pip_installs_the_pinned_one_and_serves(provisioned):
    cluster, replica, index = provisioned
    program = cluster.home / "gpu-bare" / "engines" / "vllm" / "0.0.1" / "venv" / "bin" / "vllm"
    assert program.is_file()
    assert index.gets == {"vllm-0.0.1-py3-none-any.whl": 1}
    [node] = cluster.get("/nodes")
    assert node["engines"]["vllm"] == "0.0.1"
    assert "installing vllm 0.0.1 with pip (vllm==0.0.1)" in cluster.log("agent-gpu-bare")
    assert replica["shards"][0]["gpu_indices"] == [0]

    key = gateway_key(cluster, gateway_project(cluster, "bare"), "bare")
    client = openai.OpenAI(
        base_url=f"{cluster.url}/v1", api_key=key["secret"], max_retries=0, timeout=60
    )
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert answer.model == MODEL
    assert answer.usage.completion_tokens == 5
