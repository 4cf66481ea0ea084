"""An adapter on a Hugging Face repository, end to end: a real `llmgw serve` and agent, a hub
on loopback holding a PEFT adapter written by tests/lora_files.py, a sim engine with two
adapter slots. Adding the adapter adds its repository to the mirror; before the mirror
holds it a request waits, then is told how far the mirror got; once it does the agent
fetches its files into its cache and the engine loads that folder, answering in the
adapter's words (docs/adapters.md)."""

from __future__ import annotations

import hashlib
import threading

import openai
import pytest

from tests.lora_files import PEFT_CONFIG, PEFT_WEIGHTS, BaseDims, peft_adapter
from tests.mirror.hub import Hub, HubFile

from .conftest import MODES
from .harness import Cluster, gateway_key, wait_for
from .test_adapters import ASK, BASE

SOURCE = "hf://acme/tone-lora"
DIMS = BaseDims(architecture="llama", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16)


@pytest.fixture
def files(tmp_path) -> dict[str, bytes]:
    folder = peft_adapter(tmp_path / "written", dims=DIMS, seed=11, rank=4)
    return {name: (folder / name).read_bytes() for name in (PEFT_CONFIG, PEFT_WEIGHTS)}


@pytest.fixture
def hub(files):
    repo = {path: HubFile(data, lfs=path.endswith(".safetensors")) for path, data in files.items()}
    h = Hub(repos={"acme/tone-lora": repo}).start()
    yield h
    h.stop()


@pytest.fixture(params=MODES)
def site(request, tmp_path, hub):
    cluster = Cluster(tmp_path, production=request.param == "production")
    cluster.env["HF_ENDPOINT"] = hub.url
    cluster.env["LLMGW_ON_DEMAND_WAIT_SECONDS"] = "2"
    try:
        cluster.start_server()
        yield cluster
    finally:
        cluster.close()


def _answer(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=ASK, max_tokens=6, temperature=0)
    return reply.choices[0].message.content


def test_an_adapter_is_fetched_from_the_mirror_and_its_engine_loads_the_cached_copy(
    site, hub, files
):
    cluster = site
    cluster.start_agent("cpu-a", "--cpus", "4", "--memory-gb", "8", port_range="33000-33499")
    wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
    cluster.post("/models", BASE)
    org = cluster.post("/orgs", {"name": "Acme"})["id"]
    team = cluster.post("/teams", {"org": org, "name": "red"})
    project = cluster.post("/projects", {"team": team["id"], "name": "app"})
    wait_for("a ready replica of the base", lambda: cluster.ready_replicas("base"), timeout=60)
    key = gateway_key(cluster, project["id"], "red")["secret"]
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key, max_retries=0)
    base_said = _answer(client, "base")

    # Adding the adapter adds its repository to the mirror; the hub holds its files back
    # until let go, so a request meanwhile is told how far the mirror got.
    hub.hold = threading.Event()
    adapter = {"name": "red-tone", "base": "base", "source": SOURCE, "format": "peft"}
    added = cluster.post("/adapters", {**adapter, "rank": 4, "owner": f"team:{team['id']}"})
    assert added["mirror"].startswith("0% of "), added
    [weights] = cluster.get("/weights")
    assert weights["source"] == SOURCE
    wait_for(
        "the gateway to know the adapter",
        lambda: "red-tone" in {m.id for m in client.models.list()},
        timeout=20,
    )

    with pytest.raises(openai.APIStatusError) as refused:
        _answer(client, "red-tone")
    assert refused.value.status_code == 503
    assert refused.value.response.headers["retry-after"] == "10"
    assert "Adapter red-tone's weights are not mirrored yet: 0% of " in refused.value.message

    hub.hold.set()
    wait_for(
        "the adapter's weights in the mirror",
        lambda: cluster.get(f"/weights/{weights['id']}")["state"] == "ready",
        timeout=30,
    )
    red_said = _answer(client, "red-tone")
    assert red_said != base_said
    assert _answer(client, "red-tone") == red_said

    # The agent's cache holds the mirror's files, assembled as the folder the engine loaded.
    [folder] = [p for p in (cluster.home / "cpu-a" / "weights" / "folders").iterdir() if p.is_dir()]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    for data in files.values():
        cached = cluster.home / "cpu-a" / "weights" / "sha256" / hashlib.sha256(data).hexdigest()
        assert cached.read_bytes() == data
    held = wait_for(
        "the adapter held by the replica",
        lambda: (a := cluster.get("/adapters")) and a[0]["held_by"] and a,
        timeout=20,
    )
    assert held[0]["held_by"] == [cluster.ready_replicas("base")[0]["id"]]
