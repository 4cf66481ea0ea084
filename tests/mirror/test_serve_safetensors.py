"""A safetensors repository from a hub on loopback, through the API: added, fetched, planned
on the fleet's GPUs from its headers, served as a vLLM model, and placed with the tp the
plan chose (issue 36, item 2); the owner's capacity limit said where it stops a replica
(issue 37, item 5)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from catalog.models import Model
from catalog.selectors import catalog_load
from fleet.agent.engines import NodeContext, ShardSpec, build_command
from fleet.models import Replica
from fleet.reconciler.run import reconcile_once
from fleet.services import start_command
from mirror.domain.refs import FolderRef
from mirror.worker import work_until_idle
from tests.fleet.builders import L4, node_add
from tests.helpers import detail
from tests.mirror.hub import Hub, HubFile
from tests.mirror.test_weights import mirror_dir  # noqa: F401 (a fixture)

from .hf_configs import LLAMA_31_8B, dense_tensors, write_safetensors

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def profile_dict(row) -> dict:
    return {
        "name": row.name, "engine": row.engine, "gpu_class": row.gpu_class, "tp": row.tp,
        "pp": row.pp, "args": list(row.args), "env": dict(row.env),
    }  # fmt: skip


def llama_repo(tmp_path) -> dict[str, HubFile]:
    """Llama 3.1 8B as its repository holds it: config.json, two shards and their index;
    the shards are headers only, which is all sizing reads."""
    tensors = dense_tensors(LLAMA_31_8B)
    half = len(tensors) // 2
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    files = {
        names[0]: write_safetensors(tmp_path / names[0], tensors[:half]).read_bytes(),
        names[1]: write_safetensors(tmp_path / names[1], tensors[half:]).read_bytes(),
    }
    weight_map = {t.name: names[0] for t in tensors[:half]} | {
        t.name: names[1] for t in tensors[half:]
    }
    return {
        "config.json": HubFile(json.dumps(LLAMA_31_8B).encode(), lfs=False),
        "model.safetensors.index.json": HubFile(
            json.dumps({"metadata": {}, "weight_map": weight_map}).encode(), lfs=False
        ),
        **{n: HubFile(b) for n, b in files.items()},
    }


@pytest.fixture
def hub(monkeypatch, mirror_dir, tmp_path):  # noqa: F811
    from huggingface_hub import constants

    h = Hub(repos={"meta-llama/Llama-3.1-8B-Instruct": llama_repo(tmp_path)})
    h.start()
    monkeypatch.setattr(constants, "ENDPOINT", h.url)
    yield h
    h.stop()


@pytest.fixture
def weights(api, hub):
    view = api.call("POST", "/weights", {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"})
    assert view.status_code == 201, view.content
    work_until_idle()
    return api.call("GET", f"/weights/{view.json()['id']}").json()


def test_a_safetensors_repository_is_planned_on_each_gpu_class(api, weights):
    assert weights["state"] == "ready"
    node_add("l4-node", now=T0, gpus=(L4, L4))
    node_add("one-l4", now=T0, gpus=(L4,))

    response = api.call("GET", f"/weights/{weights['id']}/plan?ctx=131072")

    assert response.status_code == 200, response.content
    plan = response.json()
    assert plan["format"] == "safetensors"
    assert (plan["parameters"], plan["context_length"]) == (8_030_261_248, 131_072)
    assert plan["bytes_by_dtype"] == {"BF16": 16_060_522_496}
    assert plan["kv_bytes_per_token"] == 131_072
    assert (plan["memory_gb"], plan["cpu_cores"]) == (None, None)
    (l4,) = plan["gpus"]
    # L4s report 23,034 MiB: 0.9 of it less 14.96 GiB of weights leaves 5.3 GiB, some
    # 43,000 tokens at 131,072 bytes each, below 131,072; tp 2 leaves 12.76 GiB a GPU at
    # 65,536 bytes a token there: one sequence.
    assert (l4["gpu_class"], l4["tp"], l4["sequences"]) == ("l4-24g", 2, 1)
    assert l4["fits"] == ["l4-node"]
    assert "tp 1 leaves about 5.3 GiB a GPU, some 43,312 tokens" in l4["said"]
    assert "tp 2 leaves about 12.8 GiB a GPU, 1 sequence of 131,072." in l4["said"]
    assert plan["fits"] == ["l4-node"]


def test_serving_it_makes_a_vllm_model_placed_with_the_plans_tp(api, weights, no_settle):
    node_add("l4-node", now=T0, gpus=(L4, L4))

    response = api.call(
        "POST",
        "/models/serve",
        {"weights": weights["id"], "name": "llama-8b", "ctx": 131072, "cores": 4},
    )

    assert response.status_code == 201, response.content
    model = Model.objects.get(name="llama-8b")
    # The mirror's weights, not the hub id: nodes get the folder from the mirror.
    assert model.source == "hf://meta-llama/Llama-3.1-8B-Instruct"
    (profile,) = model.profiles.all()
    assert (profile.engine, profile.gpu_class, profile.tp, profile.cpu_cores) == (
        "vllm",
        "l4-24g",
        2,
        4,
    )
    assert profile.args == [
        "--max-model-len", "131072",
        "--gpu-memory-utilization", "0.9",
    ]  # fmt: skip
    assert model.context_length == 131072

    reconcile_once(now=T0)

    (replica,) = Replica.objects.filter(model="llama-8b")
    (shard,) = replica.shards.all()
    assert (shard.node_id, sorted(shard.gpu_indices)) == ("l4-node", [0, 1])
    # The agent is told every file of the repository, each by its digest and path.
    sent = start_command(shard, replica, catalog_load().get("llama-8b")).payload["weights"]
    assert "sha256" not in sent and sent["name"] == "hf://meta-llama/Llama-3.1-8B-Instruct"
    assert {f["path"]: f["sha256"] for f in sent["files"]} == {
        f["path"]: f["sha256"] for f in weights["files"]
    }
    assert len(sent["files"]) == 4
    assert all(f["url"].endswith(f"/api/v1/mirror/files/{f['sha256']}") for f in sent["files"])
    assert sum(f["size"] for f in sent["files"]) == weights["bytes_total"]
    folder = FolderRef.from_message(sent)
    # What the agent runs for it: vLLM with the plan's tp, its context and utilisation, on
    # the folder it assembled in its cache.
    argv = build_command(
        ShardSpec(
            shard_id=shard.pk,
            model="llama-8b",
            source=f"/var/cache/llmgw/folders/{folder.key}",
            profile=profile_dict(profile),
            gpu_indices=tuple(shard.gpu_indices),
            api_key="k",
        ),
        NodeContext(port=20001, cpu_count=16),
    ).argv
    assert argv[argv.index("serve") + 1] == f"/var/cache/llmgw/folders/{folder.key}"
    for flag, value in (
        ("--tensor-parallel-size", "2"),
        ("--max-model-len", "131072"),
        ("--gpu-memory-utilization", "0.9"),
        ("--served-model-name", "llama-8b"),
    ):
        assert argv[argv.index(flag) + 1] == value


def test_nothing_that_fits_is_a_sentence_with_the_figures_and_adds_nothing(api, weights):
    node_add("one-l4", now=T0, gpus=(L4,))

    response = api.call(
        "POST", "/models/serve", {"weights": weights["id"], "name": "x", "ctx": 131072}
    )

    assert response.status_code == 400
    assert detail(response) == (
        "Llama-3.1-8B-Instruct needs 15.0 GiB of weights; on l4-24g (22.5 GiB a GPU) at 0.9 "
        "utilisation, tp 1 leaves about 5.3 GiB a GPU, some 43,312 tokens of KV cache, below "
        "the 131,072 asked; a node has at most 1 l4-24g GPUs and no fabric (llmgw.io/fabric) "
        "joins such nodes for tp 2."
    )
    assert not Model.objects.exists()


def test_the_owners_limit_is_said_where_it_stops_a_replica_that_fits(api, weights):
    node_add("l4-node", now=T0, gpus=(L4, L4))
    api.call("POST", "/orgs", {"name": "Acme"})
    api.call("POST", "/teams", {"org": "Acme", "name": "ml"})
    got = api.call("PUT", "/quotas", {"scope": "team:Acme/ml", "limit": {"gpus": 1}})
    assert got.status_code == 200, got.content

    plan = api.call("GET", f"/weights/{weights['id']}/plan?ctx=131072&owner=team:Acme/ml").json()

    assert plan["gpus"][0]["quota"].startswith("fits on l4-node, but team:Acme/ml")
    assert "(2 GPUs of 1)" in plan["quota"]


def test_a_bad_utilisation_or_selector_is_a_sentence(api, weights):
    bad = api.call("GET", f"/weights/{weights['id']}/plan?gpu_memory_utilization=2")
    assert bad.status_code == 400 and "a fraction above 0 and at most 1" in detail(bad)
    bad = api.call("GET", f"/weights/{weights['id']}/plan?selector=zone")
    assert bad.status_code == 400 and "key=value" in detail(bad)


def test_the_mirror_page_plans_it_on_gpus_and_its_form_serves_it_with_overrides(
    staff,  # noqa: F811
    weights,
):
    node_add("l4-node", now=T0, gpus=(L4, L4), labels={"zone": "a"})

    page = staff.get("/mirror").content.decode()

    assert "data-model-plan" in page and "Serve as a vLLM model" in page
    assert "l4-24g: tp 1</strong>" in page  # 32,768 by default: one L4 holds it
    assert "15.0 GiB" in page  # its weights, in the plan's units
    assert "131,072 bytes a token" in page

    response = staff.post(
        "/mirror",
        {
            "form": "serve", "weights": weights["id"], "file": "", "name": "llama",
            "ctx": "131072", "cores": "6", "memory_gb": "24", "selector": "zone=a",
        },
    )  # fmt: skip

    assert response.status_code == 302, response.content.decode()[-2000:]
    profile = Model.objects.get(name="llama").profiles.get()
    assert (profile.engine, profile.tp, profile.cpu_cores, profile.min_memory_gb) == (
        "vllm", 2, 6, 24.0,
    )  # fmt: skip
    assert profile.node_selector == {"zone": "a"}


def test_the_forms_bad_selector_is_said_beside_it(staff, weights):  # noqa: F811
    node_add("l4-node", now=T0, gpus=(L4, L4))

    response = staff.post(
        "/mirror",
        {"form": "serve", "weights": weights["id"], "file": "", "name": "x", "selector": "zone"},
    )

    assert "A node selector is key=value" in response.content.decode()
    assert not Model.objects.exists()


def test_a_safetensors_card_costs_no_query_beyond_the_one_read_of_the_fleet(staff, weights):  # noqa: F811
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.selectors.dry_runs import node_rooms
    from tests.mirror.test_pages import PAGE_QUERIES

    node_add("l4-node", now=T0, gpus=(L4, L4))
    staff.get("/mirror")  # the fleet's registrations are read once, then kept

    with CaptureQueriesContext(connection) as fleet:
        node_rooms()
    with CaptureQueriesContext(connection) as page:
        body = staff.get("/mirror").content.decode()

    assert "data-model-plan" in body
    assert len(page) == PAGE_QUERIES + len(fleet)


def test_the_form_serves_for_an_owner_at_its_limit_and_says_so_on_the_model(staff, api, weights):  # noqa: F811
    node_add("l4-node", now=T0, gpus=(L4, L4))
    api.call("POST", "/orgs", {"name": "Acme"})
    api.call("POST", "/teams", {"org": "Acme", "name": "ml"})
    api.call("PUT", "/quotas", {"scope": "team:Acme/ml", "limit": {"gpus": 0}})

    response = staff.post(
        "/mirror",
        {"form": "serve", "weights": weights["id"], "name": "llama", "owner": "team:Acme/ml"},
        follow=True,
    )

    page = response.content.decode()
    assert Model.objects.get(name="llama").owner.startswith("team:")
    assert (
        "Model llama: fits on l4-node, but team:Acme/ml is at its capacity limit (1 GPUs of 0)"
        in page
    )


def test_an_fp8_cache_is_planned_and_served_through_the_api(api, weights):
    node_add("one-l4", now=T0, gpus=(L4,))

    plan = api.call("GET", f"/weights/{weights['id']}/plan?ctx=65536&kv_cache_dtype=fp8").json()
    made = api.call(
        "POST",
        "/models/serve",
        {"weights": weights["id"], "name": "llama", "ctx": 65536, "kv_cache_dtype": "fp8"},
    )
    bad = api.call("GET", f"/weights/{weights['id']}/plan?kv_cache_dtype=int4")

    # 65,536 BF16 tokens (8 GiB) are past one L4's 5.3 GiB; in FP8 (4 GiB) they fit.
    assert plan["kv_bytes_per_token"] == 65_536
    assert (plan["gpus"][0]["tp"], plan["gpus"][0]["sequences"]) == (1, 1)
    assert made.status_code == 201, made.content
    args = Model.objects.get(name="llama").profiles.get().args
    assert args[-2:] == ["--kv-cache-dtype", "fp8"]
    assert bad.status_code == 400 and "kv_cache_dtype must be one of" in detail(bad)
