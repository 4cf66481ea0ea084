"""Adapters over the REST API: added on a base that can serve them, refused with a sentence
and nothing stored otherwise, listed on their base's page, removed (docs/adapters.md)."""

from __future__ import annotations

import json

import pytest

from catalog.models import Adapter
from fleet.models import Node
from llmgw.core import clock
from mirror.models import Weights
from tenancy.models import AuditEvent
from tenancy.services import org_create, project_create, team_create
from tests.catalog.test_pages import ready_replica
from tests.fleet.builders import gpu_model, node_add
from tests.helpers import detail
from tests.lora_files import PEFT_CONFIG, PEFT_WEIGHTS, BaseDims, peft_adapter
from tests.mirror.hub import Hub, HubFile

pytestmark = pytest.mark.django_db

DIMS = BaseDims(architecture="llama", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16)


def slotted(name="llama", engine="vllm", slots=4, **profile):
    data = gpu_model(name)
    data["profiles"][0].update(engine=engine, adapter_slots=slots, **profile)
    return data


@pytest.fixture(autouse=True)
def hub(monkeypatch, tmp_path):
    """A hub on loopback holding the adapters' repositories (a POST /adapters of an hf://
    source adds its weights to the mirror): acme/support-lora, and acme/loras with one
    under red/."""
    from huggingface_hub import constants

    folder = peft_adapter(tmp_path / "written", dims=DIMS, seed=3)
    files = {
        name: HubFile((folder / name).read_bytes(), lfs=name.endswith(".safetensors"))
        for name in (PEFT_CONFIG, PEFT_WEIGHTS)
    }
    red = {f"red/{name}": f for name, f in files.items()}
    h = Hub(repos={"acme/support-lora": files, "acme/loras": red})
    h.start()
    monkeypatch.setattr(constants, "ENDPOINT", h.url)
    yield h
    h.stop()


@pytest.fixture
def teams(db):
    org_create(name="Acme", actor="t")
    ml = team_create(org="Acme", name="ml", actor="t")
    ops = team_create(org="Acme", name="ops", actor="t")
    project_create(team=ml.pk, name="chat", actor="t")
    return ml, ops


def an_adapter(**kw):
    return {
        "name": "acme-support",
        "base": "llama",
        "source": "hf://acme/support-lora",
        "format": "peft",
        "rank": 8,
        "owner": "team:Acme/ml",
        **kw,
    }


def test_an_adapter_is_added_on_its_base_and_listed_on_its_page(api, teams):
    api.call("POST", "/models", slotted())

    response = api.call("POST", "/adapters", an_adapter(aliases=["support"]))

    assert response.status_code == 201, response.content
    view = response.json()
    assert (view["name"], view["base"], view["owner"], view["held_by"]) == (
        "acme-support",
        "llama",
        f"team:{teams[0].pk}",
        [],
    )
    assert api.call("GET", "/models/llama").json()["adapters"] == ["acme-support"]
    assert [a["name"] for a in api.call("GET", "/adapters?base=llama").json()] == ["acme-support"]
    assert api.call("GET", "/adapters/acme-support").json()["aliases"] == ["support"]
    assert AuditEvent.objects.filter(action="adapter.add").count() == 1


REFUSED = {
    "a base not in the catalog": (an_adapter(base="nope"), "base model nope is not in the catalog"),
    "a format its engine cannot serve": (
        an_adapter(format="gguf", source="/lora/support.gguf"),
        "base llama runs on vllm, which cannot serve a gguf adapter",
    ),
    "a rank above --max-lora-rank": (
        an_adapter(rank=32),
        "rank 32 is above base llama's max LoRA rank 16",
    ),
    "an owner that is no scope": (an_adapter(owner="team:Nobody/x"), "owner:"),
    "an organization as owner": (an_adapter(owner="org:Acme"), "owner must be a team or a project"),
    "the name of a model": (an_adapter(name="llama"), "llama is already a name of model llama"),
    # A peft source neither a path on the nodes nor one the mirror fetches could never load.
    "a relative path": (
        an_adapter(source="loras/acme"),
        "adapter acme-support: The source 'loras/acme' is neither hf://ORG/REPO, https://… nor "
        "an absolute path. A peft adapter loads from hf://ORG/REPO[@REVISION][/PATH], "
        "https://… or an absolute path on the nodes, from no other source.",
    ),
    "a scheme the mirror does not fetch": (
        an_adapter(source="s3://acme/loras/support"),
        "has the scheme s3://, which the mirror does not fetch",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_bad_input_is_a_400_with_a_sentence_and_nothing_stored(api, teams, case):
    api.call("POST", "/models", slotted())
    body, said = REFUSED[case]

    response = api.call("POST", "/adapters", body)

    assert response.status_code == 400, response.content
    assert said in detail(response)
    assert not Adapter.objects.exists()
    assert not Weights.objects.exists()


def test_a_base_without_slots_is_refused(api, teams):
    api.call("POST", "/models", slotted(slots=0))
    response = api.call("POST", "/adapters", an_adapter())
    assert response.status_code == 400
    assert "holds no adapters: give it adapter_slots" in detail(response)


def test_the_adapters_own_files_say_its_architecture(api, teams, tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    lora = tmp_path / "lora"
    lora.mkdir()
    (lora / "adapter_config.json").write_text(
        json.dumps({"r": 8, "auto_mapping": {"base_model_class": "Qwen2ForCausalLM"}})
    )
    api.call("POST", "/models", {**slotted(), "source": str(base)})

    response = api.call("POST", "/adapters", an_adapter(source=str(lora)))

    assert response.status_code == 400
    assert detail(response) == (
        "adapter acme-support: it was trained for Qwen2ForCausalLM, but base llama is "
        "LlamaForCausalLM."
    )
    (lora / "adapter_config.json").write_text(json.dumps({"r": 4}))
    response = api.call("POST", "/adapters", an_adapter(source=str(lora)))
    assert "rank is given as 8 but its adapter files say 4" in detail(response)
    (lora / "adapter_config.json").write_text(json.dumps({"r": 8}))
    assert api.call("POST", "/adapters", an_adapter(source=str(lora))).status_code == 201


def test_a_name_taken_is_a_conflict(api, teams):
    api.call("POST", "/models", slotted())
    api.call("POST", "/adapters", an_adapter())
    assert api.call("POST", "/adapters", an_adapter()).status_code == 409


def test_a_base_with_adapters_is_not_removed_until_they_are(api, teams):
    api.call("POST", "/models", slotted())
    api.call("POST", "/adapters", an_adapter())

    response = api.call("DELETE", "/models/llama")
    assert response.status_code == 409
    assert detail(response) == "model llama is the base of adapter acme-support; remove it first."

    assert api.call("DELETE", "/adapters/acme-support").status_code == 200
    assert api.call("DELETE", "/models/llama").status_code == 200
    assert api.call("GET", "/adapters/acme-support").status_code == 404


def test_a_key_may_be_limited_to_an_adapter(api, teams):
    api.call("POST", "/models", slotted())
    api.call("POST", "/adapters", an_adapter(aliases=["support"]))
    response = api.call(
        "POST", "/keys", {"project": "Acme/ml/chat", "name": "k", "models": ["support"]}
    )
    assert response.status_code == 201, response.content


def test_the_replicas_holding_it_are_those_whose_engines_say_so(api, teams):
    api.call("POST", "/models", slotted())
    api.call("POST", "/adapters", an_adapter())
    node_add("n1", now=clock.now())
    Node.objects.filter(pk="n1").update(state=Node.READY)
    ready_replica("llama-1", "llama", node="n1", gpus=[0])
    ready_replica("llama-2", "llama", node="n1", gpus=[1])
    ready_replica("llama-3", "llama", node="n1", gpus=[2])
    Node.objects.filter(pk="n1").update(
        load={
            "engines": {
                "llama-1-0": {"adapters": [{"name": "acme-support"}]},
                "llama-2-0": {"adapters": []},
                "llama-3-0": {"running": 1},  # says nothing of adapters: unknown
            }
        }
    )

    assert api.call("GET", "/adapters/acme-support").json()["held_by"] == ["llama-1"]


def test_admin_shows_adapters_and_cannot_add_one(admin_client, api, teams):
    api.call("POST", "/models", slotted())
    api.call("POST", "/adapters", an_adapter())

    page = admin_client.get("/admin/catalog/adapter/").content.decode()
    assert "acme-support" in page and "llmgw ctl adapter" in page
    assert admin_client.post("/admin/catalog/adapter/add/", {"name": "x"}).status_code == 403
    assert Adapter.objects.count() == 1


def test_the_base_models_page_lists_its_adapters(admin_client, api, teams):
    api.call("POST", "/models", slotted())
    page = admin_client.get("/models/llama").content.decode()
    assert 'id="adapters"' not in page
    api.call("POST", "/adapters", an_adapter(aliases=["support"]))

    page = admin_client.get("/models/llama").content.decode()
    assert 'data-adapter="acme-support"' in page and "(support)" in page


def test_a_declared_base_left_out_of_the_catalog_file_is_kept_while_it_has_adapters(teams):
    from catalog.domain import parse_model
    from catalog.services import adapter_add, declared_sync
    from llmgw.core.errors import Invalid

    declared_sync(specs=[parse_model(slotted(), declared=True)])
    adapter_add(data=an_adapter(), actor="t")

    with pytest.raises(Invalid) as refused:
        declared_sync(specs=[])
    assert str(refused.value) == (
        "The catalog file cannot be loaded: model llama is the base of adapter acme-support; "
        "remove it first."
    )
    assert Adapter.objects.count() == 1


def test_adapters_declared_in_the_catalog_file_follow_it(teams, tmp_path):
    from catalog.declared import read_catalog_adapters, read_catalog_file
    from catalog.services import (
        adapter_remove,
        declared_adapters_prune,
        declared_adapters_sync,
        declared_sync,
    )
    from llmgw.core.errors import Invalid

    ml = teams[0].pk

    def load(text: str) -> None:
        path = tmp_path / "catalog.yaml"
        path.write_text(text)
        adapters = read_catalog_adapters(path)
        declared_adapters_prune(keep={a.name for a in adapters})
        declared_sync(specs=read_catalog_file(path))
        declared_adapters_sync(specs=adapters)

    model = json.dumps(slotted())
    load(
        f"models: [{model}]\n"
        f"adapters: [{{name: tone, base: llama, source: /srv/tone, format: peft, rank: 8, "
        f"owner: 'team:{ml}'}}]\n"
    )
    row = Adapter.objects.get()
    assert (row.name, row.declared, row.owner) == ("tone", True, f"team:{ml}")
    with pytest.raises(Invalid, match="declared in the catalog file"):
        adapter_remove(name="tone", actor="t")
    with pytest.raises(Invalid, match="rank 64 is above base llama's max LoRA rank 16"):
        load(
            f"models: [{model}]\n"
            f"adapters: [{{name: tone, base: llama, source: /srv/tone, format: peft, rank: 64, "
            f"owner: 'team:{ml}'}}]\n"
        )
    assert Adapter.objects.get().rank == 8
    # Left out of the file with its base: both go, the adapter first.
    load("models: []\n")
    assert not Adapter.objects.exists()
