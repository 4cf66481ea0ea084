"""Sizing weights the mirror holds and serving them as a llama.cpp model, through the API."""

from __future__ import annotations

import pytest

from catalog.models import Model
from fleet.nodes.registration import node_register
from fleet.protocol import Register
from llmgw.core import clock
from mirror.worker import work_until_idle
from tests.fleet.builders import agent_credential, register_frame
from tests.helpers import detail
from tests.mirror.ggufs import write_gguf
from tests.mirror.test_weights import mirror_dir  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def _cpu_node(node_id: str, *, memory_gb: int, cpus: int) -> None:
    frame = register_frame(node_id, gpus=(), memory_total_mb=memory_gb * 1024, cpu_count=cpus)
    frame["engines"] = {"llamacpp": "b6000"}
    node_register(
        msg=Register.model_validate(frame),
        session=f"s-{node_id}",
        now=clock.now(),
        credential=agent_credential(node_id),
        seen_addr="10.0.0.7",
    )


@pytest.fixture
def weights(api, mirror_dir):  # noqa: F811
    # 32 layers, 8 KV heads of 128 (4096 / 32): 32 × ctx × 8 × 256 × 2 bytes of KV cache.
    path = write_gguf(mirror_dir / "allowed" / "model.gguf", name="Tiny", context_length=8192)
    view = api.call("POST", "/weights", {"source": str(path)}).json()
    work_until_idle()
    return view


def test_the_plan_says_what_a_replica_needs_and_where_it_fits(api, weights):
    _cpu_node("big", memory_gb=64, cpus=16)
    _cpu_node("small", memory_gb=1, cpus=4)

    response = api.call("GET", f"/weights/{weights['id']}/plan?ctx=4096")

    assert response.status_code == 200, response.content
    plan = response.json()
    # KV: 32 × 4096 × 8 × (128 + 128) × 2 = 512 MiB; weights a few KB; + 1 GiB → 2 GB.
    assert (plan["architecture"], plan["ctx"], plan["memory_gb"]) == ("llama", 4096, 2)
    assert plan["context_length"] == 8192
    assert plan["fits"] == ["big"]
    assert any(b.startswith("small has 1 GB free of 1 GB") for b in plan["blocked"]), plan[
        "blocked"
    ]
    assert plan["cpu_cores"] == 8  # half the smallest node it fits on


def test_a_context_past_the_trained_one_is_a_sentence(api, weights):
    response = api.call("GET", f"/weights/{weights['id']}/plan?ctx=100000")

    assert response.status_code == 400
    assert "8,192" in detail(response) or "8192" in detail(response)


def test_a_file_that_is_not_gguf_cannot_be_planned(api, mirror_dir):  # noqa: F811
    path = mirror_dir / "allowed" / "model.bin"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    view = api.call("POST", "/weights", {"source": str(path)}).json()
    work_until_idle()

    response = api.call("GET", f"/weights/{view['id']}/plan")

    assert response.status_code == 400
    assert "is not a GGUF file" in detail(response)


def test_weights_not_yet_fetched_cannot_be_planned(api, mirror_dir):  # noqa: F811
    path = write_gguf(mirror_dir / "allowed" / "model.gguf")
    view = api.call("POST", "/weights", {"source": str(path)}).json()

    response = api.call("GET", f"/weights/{view['id']}/plan")

    assert response.status_code == 409
    assert "is queued" in detail(response)


def test_serving_weights_adds_a_sized_llamacpp_model(api, weights):
    _cpu_node("big", memory_gb=64, cpus=16)

    response = api.call(
        "POST",
        "/models/serve",
        {"weights": weights["id"], "name": "tiny", "ctx": 4096, "scaling": {"min": 1, "max": 2}},
    )

    assert response.status_code == 201, response.content
    view = response.json()
    assert (view["name"], view["max"], view["memory_gb"], view["cpu_cores"]) == ("tiny", 2, 2, 8)
    model = Model.objects.get(name="tiny")
    assert model.source == weights["source"]
    profile = model.profiles.get()
    assert (profile.engine, profile.args) == ("llamacpp", ["--ctx-size", "4096"])
    assert api.call("GET", f"/weights/{weights['id']}").json()["models"] == ["tiny"]


@pytest.mark.parametrize(
    ("body", "status", "said"),
    [
        ({"name": "x"}, 400, "weights must be the id"),
        ({"weights": 999, "name": "x"}, 404, "There are no weights 999"),
        ({"weights": "1", "name": "x"}, 400, "weights must be the id"),
        ({"weights": 0, "name": ""}, 400, "name is needed"),
        ({"weights": 0, "name": "x", "ctx": "big"}, 400, "ctx must be a whole number"),
        ({"weights": 0, "name": "x", "file": "other.gguf"}, 400, "hold no file 'other.gguf'"),
    ],
)
def test_a_serve_that_cannot_be_made_is_a_sentence_and_adds_nothing(
    api, weights, body, status, said
):
    body = {**body, "weights": weights["id"]} if body.get("weights") == 0 else body

    response = api.call("POST", "/models/serve", body)

    assert response.status_code == status, response.content
    assert said in detail(response)
    assert not Model.objects.exists()


def test_a_serve_body_that_is_not_json_is_a_400(api, weights):
    assert api.call("POST", "/models/serve", "{nope").status_code == 400
    assert api.call("POST", "/models/serve", "[1]").status_code == 400


def test_no_model_may_be_called_serve_which_is_the_action(api, mirror_dir):  # noqa: F811
    from tests.fleet.builders import cpu_model

    response = api.call("POST", "/models", cpu_model("serve"))

    assert response.status_code == 400
    assert "names an action of the API" in detail(response)


def test_the_plan_says_where_the_owners_limit_stops_a_replica_that_fits(api, weights):
    _cpu_node("big", memory_gb=64, cpus=16)
    api.call("POST", "/orgs", {"name": "Acme"})
    api.call("POST", "/teams", {"org": "Acme", "name": "ml"})
    api.call("PUT", "/quotas", {"scope": "team:Acme/ml", "limit": {"memory_gb": 1}})

    plan = api.call("GET", f"/weights/{weights['id']}/plan?ctx=4096&owner=team:Acme/ml").json()
    free = api.call("GET", f"/weights/{weights['id']}/plan?ctx=4096").json()

    # 2 GB a replica, against a limit of 1.
    assert plan["quota"] == (
        "fits on big, but team:Acme/ml is at its capacity limit (2 GB of memory of 1)"
    )
    assert free["quota"] is None
