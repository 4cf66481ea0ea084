"""An adapter whose source is a Hugging Face repository is loaded from the mirror, as a
model's weights are: the load carries the mirror's files for the agent to fetch; until the
mirror holds them nothing is sent, and a request waits, then gets the on-demand 503 saying
how far the mirror got; a node whose engine of the base is ready may read the adapter's
files, and no other node (docs/adapters.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleet.services import NotMirrored, adapter_load_commands
from llmgw.core import clock
from llmgw.gateway import adapters as gateway_adapters
from mirror.models import WeightFile, Weights
from tests.gateway.test_adapters import answer, keys, served  # noqa: F401 - a fixture
from tests.gateway.test_app import add, client

pytestmark = pytest.mark.django_db(transaction=True)

SOURCE = "hf://acme/ml-tone"
MB = 1_000_000


def mirrored(*, state: str = "ready", done: int = 0, source: str = SOURCE) -> Weights:
    """The adapter's repository in the mirror: its config, and its weights in `state`."""
    weights = Weights.objects.create(source=source, added_by="t", added_at=clock.now())
    WeightFile.objects.create(
        weights=weights,
        path="adapter_config.json",
        fetch_url="x",
        size=2 * MB,
        sha256="c" * 64,
        state="ready",
    )
    WeightFile.objects.create(
        weights=weights,
        path="adapter_model.safetensors",
        fetch_url="x",
        size=10 * MB,
        sha256="d" * 64 if state == "ready" else "",
        state=state,
        bytes_done=done,
        detail="HTTP 404 from the hub" if state == "failed" else "",
    )
    return weights


def said_of(source: str) -> str:
    with pytest.raises(NotMirrored) as caught:
        adapter_load_commands(replica_id="llama-1", name="ml-tone", source=source, format="peft")
    return str(caught.value)


def test_the_load_carries_the_mirrors_files_once_it_holds_them(db):
    from tests.catalog.test_pages import ready_replica
    from tests.fleet.builders import node_add

    node_add("n1", now=clock.now())
    ready_replica("llama-1", "llama", node="n1", gpus=[0])
    assert said_of(SOURCE) == (
        "Adapter ml-tone's weights are not mirrored yet: hf://acme/ml-tone is not in the "
        "mirror (llmgw ctl weights add hf://acme/ml-tone)."
    )
    # One stored before such sources were refused at add: the mirror could never fetch it.
    assert said_of("loras/ml-tone") == (
        "Adapter ml-tone's source loras/ml-tone is neither a path on the nodes nor one the "
        "mirror fetches (hf://ORG/REPO, https://…), so it cannot be loaded: remove the "
        "adapter and add it again from one of those."
    )
    weights = mirrored(state="downloading", done=2_800_000)
    # 2 MB of config and 2.8 of the weights' 10: 40% of 12 MB.
    assert said_of(SOURCE) == "Adapter ml-tone's weights are not mirrored yet: 40% of 12 MB."
    WeightFile.objects.filter(state="downloading").update(state="failed", detail="HTTP 404")
    assert said_of(SOURCE) == (
        "Adapter ml-tone's weights are not mirrored yet: fetching adapter_model.safetensors "
        f"failed: HTTP 404; llmgw ctl weights retry {weights.pk}."
    )
    WeightFile.objects.filter(state="failed").update(state="ready", sha256="d" * 64)

    [load] = adapter_load_commands(
        replica_id="llama-1", name="ml-tone", source=SOURCE, format="peft"
    )

    files = load.payload["weights"]["files"]
    assert [(f["path"], f["sha256"], f["size"]) for f in files] == [
        ("adapter_config.json", "c" * 64, 2 * MB),
        ("adapter_model.safetensors", "d" * 64, 10 * MB),
    ]
    assert load.payload["weights"]["name"] == SOURCE
    assert load.payload["adapter"] == {"name": "ml-tone", "path": SOURCE, "format": "peft"}
    # A path on the nodes is loaded from there, as before: no weights.
    [plain] = adapter_load_commands(
        replica_id="llama-1", name="ml-tone", source="/srv/loras/x", format="peft"
    )
    assert "weights" not in plain.payload


async def test_a_request_waits_for_the_mirror_then_is_told_how_far_it_got(
    served,  # noqa: F811 - the fixture
    gateway,
    monkeypatch,
    settings,
):
    """The ask goes through the real adapter_load_commands: nothing is sent while the mirror
    does not hold the weights; once it does, the agent (played by `served`) loads it."""
    agent = gateway_adapters._send

    async def send(replica, adapter, evict):
        await add(
            adapter_load_commands,
            replica_id=replica,
            name=adapter.name,
            source=adapter.source,
            format=adapter.format,
            unload=evict,
        )
        await agent(replica, adapter, evict)

    monkeypatch.setattr(gateway_adapters, "_send", send)
    monkeypatch.setattr(gateway_adapters, "_unmirrored", {})
    settings.LLMGW = replace(settings.LLMGW, on_demand_wait=0.3)
    await add(mirrored, state="downloading", done=2_800_000)
    ml, _ = await keys()
    async with client(gateway, ml) as c:
        r = await answer(c, "ml-tone")
        assert r.status_code == 503
        assert r.headers["retry-after"] == "10"
        error = r.json()["error"]
        assert error["code"] == "model_loading"
        assert error["message"].startswith(
            "Adapter ml-tone's weights are not mirrored yet: 40% of 12 MB. Try again shortly."
        )
        assert served == []  # nothing asked of an agent
        assert "ml-tone" not in gateway_adapters._asked  # the next request asks again

        await add(
            lambda: WeightFile.objects.filter(state="downloading").update(
                state="ready", sha256="d" * 64
            )
        )
        gateway_adapters._unmirrored.clear()  # what was found is said again for 0.5 s only
        gateway.runtime.cfg = replace(gateway.runtime.cfg, on_demand_wait=15)
        r = await answer(c, "ml-tone")
    assert r.status_code == 200, r.text
    assert served == [("llama-1", "ml-tone", None)]


def test_a_node_whose_engine_of_the_base_is_ready_reads_its_adapters_files(db):
    from catalog.services import adapter_add
    from fleet.models import Node
    from fleet.nodes.identity import mirror_refusal
    from llmgw.core.secrets import digest
    from tenancy.services import org_create, team_create
    from tests.catalog.test_pages import ready_replica
    from tests.fleet.builders import gpu_model, model_added, node_add

    data = gpu_model("llama")
    data["profiles"][0]["adapter_slots"] = 2
    model_added(data)
    model_added(gpu_model("qwen"))
    org_create(name="Acme", actor="t")
    team_create(org="Acme", name="ml", actor="t")
    adapter = {"base": "llama", "format": "peft", "rank": 8, "owner": "team:Acme/ml"}
    adapter_add(data={**adapter, "name": "ml-tone", "source": SOURCE}, actor="t")
    mirrored()
    for node_id, model in (("gpu-a", "llama"), ("gpu-b", "qwen")):
        node_add(node_id, now=clock.now())
        Node.objects.filter(pk=node_id).update(credential_hash=digest(f"llmgw_node_{node_id}"))
        ready_replica(f"{model}-1", model, node=node_id, gpus=[0])

    assert mirror_refusal(secret="llmgw_node_gpu-a", sha256="d" * 64) is None
    assert mirror_refusal(secret="llmgw_node_gpu-b", sha256="d" * 64) == (
        403,
        f"Node gpu-b was given no shard that needs the file {'d' * 64} now.",
    )


def test_a_request_past_the_wait_is_told_how_far_the_nodes_fetch_got(monkeypatch):
    from fleet.domain.readings import Reading

    monkeypatch.setattr(gateway_adapters, "_asked", {"ml-tone": (0.0, "llama-1")})
    fetching = {"llama-1": Reading(fetching=(("ml-tone", 4_800_000, 12 * MB),))}

    assert gateway_adapters.loading_said("ml-tone", 120, fetching) == (
        "Adapter ml-tone is loading on replica llama-1: its node is fetching its weights "
        "from the mirror, 40% of 12 MB so far."
    )
    # Another adapter's fetch, another replica's, or none said: no figure to give.
    for readings in (
        {"llama-1": Reading(fetching=(("ops-tone", 1, 2),))},
        {"llama-2": fetching["llama-1"]},
        {},
    ):
        assert gateway_adapters.loading_said("ml-tone", 120, readings) == (
            "Adapter ml-tone is loading: no replica held it within 120 s."
        )
