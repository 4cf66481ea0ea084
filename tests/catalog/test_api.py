"""Models over the REST API: one validated path for every change, sentences for every refusal."""

from __future__ import annotations

import json

import pytest

from catalog.domain import Slo, parse_model
from catalog.models import Model
from catalog.schemas import ModelOut
from catalog.selectors import catalog_load
from catalog.services import DECLARED, declared_sync
from fleet.models import ModelState
from llmgw.core import clock
from tenancy.models import AuditEvent
from tests.fleet.builders import cpu_model, gpu_model, node_add
from tests.helpers import detail

pytestmark = pytest.mark.django_db


def test_adding_a_model_answers_201_with_its_view(api):
    response = api.call("POST", "/models", gpu_model("llama", scaling={"min": 2, "max": 3}))

    assert response.status_code == 201
    view = response.json()
    assert (view["name"], view["min"], view["max"], view["desired"]) == ("llama", 2, 3, 2)
    assert (view["class"], view["declared"], view["status"]) == ("standard", False, "waiting")
    assert view["profiles"][0]["gpu_class"] == "h100-80g"
    assert Model.objects.get().updated_by == "ops"
    assert AuditEvent.objects.get().action == "model.add"


def test_adding_a_model_that_exists_is_a_conflict(api):
    api.call("POST", "/models", gpu_model("llama"))

    response = api.call("POST", "/models", cpu_model("llama"))

    assert response.status_code == 409
    assert "llama" in detail(response)
    assert Model.objects.get().profiles.get().name == "gpu"


def test_an_alias_may_not_take_another_models_name(api):
    api.call("POST", "/models", gpu_model("llama"))

    response = api.call("POST", "/models", gpu_model("mistral", aliases=["llama"]))

    assert response.status_code == 400
    assert "llama" in detail(response)
    assert Model.objects.count() == 1


INVALID_MODELS = {
    "a name with capitals and a space": (gpu_model("Llama 3"), "name"),
    "no name": ({"profiles": [{"name": "p", "engine": "sim"}]}, "name"),
    "an unknown field": (gpu_model("llama", gpus=2), "unknown field 'gpus'"),
    "no profiles": ({"name": "llama", "profiles": []}, "profile"),
    "an unknown engine": (
        {"name": "llama", "profiles": [{"name": "p", "engine": "tensorrt", "gpu_class": "a"}]},
        "engine",
    ),
    "max below min": (gpu_model("llama", scaling={"min": 3, "max": 1}), "max (1) is below min (3)"),
    "a negative min": (gpu_model("llama", scaling={"min": -1}), "min"),
    "a min that is text": (gpu_model("llama", scaling={"min": "a"}), "min"),
    "a CPU profile without memory": (
        {"name": "tiny", "profiles": [{"name": "cpu", "engine": "sim", "cpu_cores": 2}]},
        "min_memory_gb",
    ),
    "an unknown class": (gpu_model("llama", **{"class": "urgent"}), "class"),
    "an owner that is not a scope": (gpu_model("llama", owner="acme"), "owner"),
    "a fallback that is not a model": (gpu_model("llama", fallbacks=["ghost"]), "ghost"),
    "tp on a CPU profile": (
        {
            "name": "tiny",
            "profiles": [{"name": "cpu", "engine": "sim", "tp": 2, "min_memory_gb": 2}],
        },
        "gpu_class",
    ),
    "a list": ([gpu_model("llama")], "object"),
}


@pytest.mark.parametrize("body, says", INVALID_MODELS.values(), ids=INVALID_MODELS.keys())
def test_an_invalid_model_is_refused_with_a_sentence_and_nothing_is_written(api, body, says):
    response = api.call("POST", "/models", body)

    assert response.status_code == 400
    assert says in detail(response)
    assert Model.objects.count() == 0
    assert AuditEvent.objects.count() == 0


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "llama", ',
        "\xff\xfe",
        '{"name": NaN}',
        '{"name": "x", "scaling": {"min": Infinity}}',
    ],
)
def test_a_body_that_is_not_json_is_400(api, body):
    response = api.call("POST", "/models", body)

    assert response.status_code == 400
    assert "JSON" in detail(response)
    assert Model.objects.count() == 0


def test_a_declared_power_watts_is_stored_read_back_and_shown(api):
    body = gpu_model("llama")
    body["profiles"][0]["power_watts"] = 1100

    assert api.call("POST", "/models", body).status_code == 201

    assert catalog_load()["llama"].profiles[0].power_watts == 1100.0
    view = api.call("GET", "/models/llama").json()
    assert view["profiles"][0]["power_watts"] == 1100.0


def test_slo_context_length_and_max_output_are_stored_and_read_back(api):
    body = gpu_model(
        "llama", slo={"ttft_p95_ms": 800, "tpot_p95_ms": 45.5}, context_length=8192, max_output=2048
    )

    assert api.call("POST", "/models", body).status_code == 201

    row = Model.objects.get()
    assert (row.slo, row.context_length, row.max_output) == (
        {"ttft_p95_ms": 800.0, "tpot_p95_ms": 45.5},
        8192,
        2048,
    )
    spec = catalog_load()["llama"]
    assert (spec.slo, spec.context_length, spec.max_output) == (Slo(800.0, 45.5), 8192, 2048)


def test_scaling_keeps_the_slo_context_length_and_max_output(api):
    api.call("POST", "/models", gpu_model("llama", slo={"ttft_p95_ms": 800}, context_length=8192))

    api.call("POST", "/models/llama/scale", {"min": 2})

    row = Model.objects.get()
    assert (row.min_replicas, row.slo, row.context_length) == (2, {"ttft_p95_ms": 800.0}, 8192)


def test_the_model_view_shows_the_slo_context_length_and_max_output(api):
    body = gpu_model("llama", slo={"ttft_p95_ms": 800}, context_length=8192, max_output=2048)
    api.call("POST", "/models", body)

    view = api.call("GET", "/models/llama").json()

    assert view["slo"] == {"ttft_p95_ms": 800.0, "tpot_p95_ms": None}
    assert (view["context_length"], view["max_output"]) == (8192, 2048)


def test_the_model_view_schema_shows_the_slo_and_defaults_it_when_the_view_has_none():
    view = {
        "name": "m",
        "aliases": [],
        "description": "",
        "source": "",
        "ready": 0,
        "desired": 1,
        "min": 1,
        "max": 1,
        "idle_timeout": 600,
        "on_demand": False,
        "status": "waiting",
        "reason": "",
        "class": "standard",
        "owner": "",
        "memory_gb": None,
        "cpu_cores": None,
        "measured_memory_gb": None,
        "warnings": [],
        "preempted": 0,
        "held_for": "",
        "unplaceable": False,
        "parked": False,
        "failures": 0,
        "profiles": [],
        "fallbacks": [],
        "routing_profile": "chat",
        "declared": False,
    }
    empty = ModelOut.model_validate(view).model_dump(by_alias=True)
    assert (empty["slo"], empty["context_length"], empty["max_output"]) == (
        {"ttft_p95_ms": None, "tpot_p95_ms": None},
        None,
        None,
    )
    given = {**view, "slo": {"ttft_p95_ms": 800.0, "tpot_p95_ms": None}, "context_length": 8192}
    out = ModelOut.model_validate(given).model_dump(by_alias=True)
    assert (out["slo"]["ttft_p95_ms"], out["context_length"]) == (800.0, 8192)


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"slo": {"ttft_p95_ms": 800, "p99": 1}}, "slo has an unknown field 'p99'"),
        ({"slo": {"tpot_p95_ms": 0}}, "tpot_p95_ms must be more than 0"),
        ({"context_length": 0}, "context_length must be at least 1"),
        ({"context_length": 10**12}, "context_length is too large"),
        ({"context_length": 4096, "max_output": 8192}, "is more than context_length"),
    ],
)
def test_a_bad_slo_context_length_or_max_output_is_400(api, fields, says):
    response = api.call("POST", "/models", gpu_model("llama", **fields))

    assert response.status_code == 400
    assert says in detail(response)
    assert Model.objects.count() == 0


def test_scaling_a_model_changes_min_and_max(api):
    api.call("POST", "/models", gpu_model("llama"))

    response = api.call(
        "POST", "/models/llama/scale", {"min": 2, "max": 4}, HTTP_X_LLMGW_ACTOR="dan"
    )

    assert response.status_code == 200
    assert (response.json()["min"], response.json()["max"]) == (2, 4)
    row = Model.objects.get()
    assert (row.min_replicas, row.max_replicas, row.updated_by) == (2, 4, "dan")
    assert AuditEvent.objects.filter(action="model.scale", actor="dan").exists()


@pytest.mark.parametrize(
    "scaling, says",
    [
        ({"min": 5, "max": 2}, "below min"),
        ({"max": 0, "min": 1}, "below min"),
        ({}, "min, max, idle_timeout, target_waiting or kv_ceiling"),
        ({"min": -1}, "min"),
        ({"replicas": 3}, "replicas"),
        ({"idle_timeout": 0}, "idle_timeout"),
        ({"min": "a"}, "min"),
        ({"max": 10_001}, "max must be at most 10000 replicas, not 10001"),
        ({"min": 10**30}, "min must be at most 10000 replicas"),
        ({"idle_timeout": 10**9}, "idle_timeout must be at most 2592000 seconds"),
        ({"kv_ceiling": 1.2}, "kv_ceiling must be a share of the KV cache above 0 and at most 1"),
        ({"target_waiting": 0}, "target_waiting must be more than 0"),
    ],
)
def test_a_bad_scale_is_400_and_changes_nothing(api, scaling, says):
    api.call("POST", "/models", gpu_model("llama", scaling={"min": 1, "max": 2}))

    response = api.call("POST", "/models/llama/scale", scaling)

    assert response.status_code == 400
    assert says in detail(response)
    row = Model.objects.get()
    assert (row.min_replicas, row.max_replicas) == (1, 2)


@pytest.mark.parametrize("key", ["min", "max"])
def test_adding_and_scaling_refuse_the_same_replica_bound_in_the_same_words(api, key):
    added = api.call("POST", "/models", gpu_model("llama", scaling={"min": 0, key: 10_001}))
    api.call("POST", "/models", gpu_model("llama"))
    scaled = api.call("POST", "/models/llama/scale", {"min": 0, key: 10_001})

    assert (added.status_code, scaled.status_code) == (400, 400)
    says = f"model llama: {key} must be at most 10000 replicas, not 10001."
    assert detail(added) == detail(scaled) == says


def test_scaling_sets_the_autoscalers_thresholds_and_keeps_those_left_out(api):
    api.call("POST", "/models", gpu_model("llama", scaling={"min": 1, "max": 3}))

    response = api.call("POST", "/models/llama/scale", {"kv_ceiling": 0.85, "target_waiting": 2})
    assert response.status_code == 200, response.content
    assert (response.json()["kv_ceiling"], response.json()["target_waiting"]) == (0.85, 2.0)
    api.call("POST", "/models/llama/scale", {"max": 4})
    row = Model.objects.get()
    assert (row.max_replicas, row.kv_ceiling, row.target_waiting) == (4, 0.85, 2.0)


def test_scaling_to_ten_thousand_replicas_is_allowed(api):
    api.call("POST", "/models", gpu_model("llama"))

    response = api.call("POST", "/models/llama/scale", {"min": 0, "max": 10_000})

    assert response.status_code == 200
    assert Model.objects.get().max_replicas == 10_000


def test_the_openapi_document_describes_the_body_of_a_new_model(api):
    document = api.call("GET", "/openapi.json").json()

    body = document["paths"]["/api/v1/models"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert body["required"] is True
    assert {"name", "source", "profiles", "scaling", "class", "owner", "slo"} <= set(
        schema["properties"]
    )
    profile = schema["properties"]["profiles"]["items"]
    assert profile["properties"]["engine"]["enum"] == ["llamacpp", "vllm", "sim"]
    scaling = schema["properties"]["scaling"]["anyOf"][0]
    assert scaling["properties"]["max"]["anyOf"][0]["maximum"] == 10_000
    # Every reference resolves inside the document: pydantic's "#/$defs/..." would not.
    assert "$defs" not in json.dumps(document)


def test_the_documented_body_is_not_what_parses_it(api):
    # A schema would read "2" as 2; the catalog's rules refuse it, as the catalog file does.
    body = gpu_model("llama")
    body["profiles"][0]["tp"] = "2"

    response = api.call("POST", "/models", body)

    assert response.status_code == 400
    assert detail(response) == "model llama, profile gpu: tp must be a whole number, not '2'."


def test_removing_a_model_forgets_it(api):
    api.call("POST", "/models", gpu_model("llama"))

    response = api.call("DELETE", "/models/llama")

    assert response.status_code == 200
    assert "llama" in detail(response)
    assert api.call("GET", "/models/llama").status_code == 404
    assert AuditEvent.objects.filter(action="model.remove", target="llama").exists()


def test_a_model_removed_and_added_again_is_not_parked(api):
    api.call("POST", "/models", gpu_model("llama"))
    ModelState.objects.create(
        model="llama", failures=5, parked_since=clock.now(), parked_reason="engine crashed"
    )

    api.call("DELETE", "/models/llama")
    api.call("POST", "/models", gpu_model("llama"))

    assert not ModelState.objects.filter(pk="llama").exists()
    view = api.call("GET", "/models/llama").json()
    assert (view["parked"], view["failures"], view["status"]) == (False, 0, "waiting")


def test_a_model_another_falls_back_to_cannot_be_removed(api):
    api.call("POST", "/models", gpu_model("small"))
    api.call("POST", "/models", gpu_model("large", fallbacks=["small"]))

    response = api.call("DELETE", "/models/small")

    assert response.status_code == 409
    assert "large" in detail(response)
    assert Model.objects.filter(name="small").exists()


def test_restart_asks_for_every_replica_to_be_replaced(api):
    api.call("POST", "/models", gpu_model("llama"))

    response = api.call("POST", "/models/llama/restart")

    assert response.status_code == 200
    assert "llama" in detail(response)
    assert ModelState.objects.get(pk="llama").restart_requested_at is not None


def test_retry_unparks_a_parked_model(api):
    api.call("POST", "/models", gpu_model("llama"))
    ModelState.objects.create(
        model="llama", failures=5, parked_since=clock.now(), parked_reason="engine crashed"
    )
    assert api.call("GET", "/models/llama").json()["status"] == "parked"

    response = api.call("POST", "/models/llama/retry")

    assert response.status_code == 200
    assert "unparked" in detail(response)
    view = api.call("GET", "/models/llama").json()
    assert (view["parked"], view["failures"]) == (False, 0)


def test_explain_says_why_a_model_cannot_be_placed(api, no_settle):
    api.call("POST", "/models", gpu_model("big", gpu_class="b200-192g"))
    node_add("gpu-a", now=clock.now())
    api.call("POST", "/reconcile")

    response = api.call("GET", "/models/big/explain")

    assert response.status_code == 200
    body = response.json()
    assert (body["model"], body["unplaceable"]) == ("big", True)
    reasons = [r for e in body["explanation"] for r in e["reasons"]]
    assert "node gpu-a has no b200-192g GPUs" in reasons
    # The one line names the binding reasons in placement's words (refusals.py).
    assert body["reason"] == "gpu-a has no b200-192g GPUs"
    assert api.call("GET", "/models/big").json()["status"] == "unplaceable"


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/models/ghost", None),
        ("DELETE", "/models/ghost", None),
        ("POST", "/models/ghost/scale", {"min": 1}),
        ("POST", "/models/ghost/restart", None),
        ("POST", "/models/ghost/retry", None),
        ("GET", "/models/ghost/explain", None),
    ],
)
def test_an_unknown_model_is_404(api, method, path, body):
    response = api.call(method, path, body)

    assert response.status_code == 404
    assert "ghost" in detail(response)
    assert AuditEvent.objects.count() == 0


@pytest.fixture
def declared(db):
    declared_sync(specs=[parse_model(gpu_model("llama"), declared=True)])


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/models/llama/scale", {"min": 3}),
        ("POST", "/models/llama/class", {"class": "critical"}),
        ("POST", "/models/llama/owner", {"owner": ""}),
        ("POST", "/models/llama/resources", {"memory_gb": 8}),
        ("DELETE", "/models/llama", None),
    ],
)
def test_a_declared_model_refuses_changes_and_points_at_the_file(api, declared, method, path, body):
    response = api.call(method, path, body)

    assert response.status_code == 400
    assert detail(response) == DECLARED.format(name="llama")
    assert AuditEvent.objects.count() == 0
    row = Model.objects.get()
    assert (row.min_replicas, row.declared) == (1, True)
    assert api.call("GET", "/models/llama").json()["declared"] is True


def test_a_declared_model_cannot_be_added_again_over_the_api(api, declared):
    response = api.call("POST", "/models", gpu_model("llama", scaling={"min": 4}))

    assert response.status_code == 409
    assert Model.objects.get().min_replicas == 1


class Raw(str):
    """A body sent as it is, not as JSON."""


HOSTILE = [
    Raw("[" * 100_000 + "]" * 100_000),
    Raw('{"min": NaN, "max": Infinity}'),
    [],
    "x",
    None,
    {"min": -1},
    {"min": "a"},
    {"min": 10**30, "max": 10**30},
    {"min": 1e308},
    {"name": "x" * 10_000, "profiles": [{"name": "p", "engine": "sim"}]},
    {"name": "huge", "profiles": [{"name": "p", "engine": "sim", "tp": 10**30, "gpu_class": "a"}]},
    {
        "name": "huge",
        "profiles": [{"name": "p", "engine": "sim", "cpu_cores": 10**20, "min_memory_gb": 10**300}],
    },
    {"name": "huge", "profiles": [{"name": "p", "engine": "sim", "min_memory_gb": 1}]}
    | {"scaling": {"min": 10**12, "max": 10**12, "idle_timeout": 10**15}},
    {
        "name": "huge",
        "profiles": [
            {"name": "p", "engine": "sim", "min_memory_gb": 1, "startup_timeout_s": 10**12}
        ],
    },
    {"name": "huge", "profiles": [{"name": "p", "engine": "sim", "min_memory_gb": 10**400}]},
    gpu_model("huge", slo={"ttft_p95_ms": 10**400}),
    Raw(
        '{"name": "huge", "profiles": [{"name": "p", "engine": "sim"}], "slo": {"ttft_p95_ms": 1e999}}'
    ),
    gpu_model("huge", context_length=10**30, max_output=10**20),
    gpu_model("slo", slo={"ttft_p95_ms": {"a": 1}}),
    {"name": "deep", "profiles": [{"name": "p", "engine": "sim", "env": {"a": {"b": []}}}]},
    {"name": "nul\x00", "profiles": [{"name": "p", "engine": "sim"}]},
    gpu_model("nul", description="a\x00b"),
    gpu_model("nul", source="hf://x\x00"),
    gpu_model("long", source="hf://" + "x" * 5000),
    gpu_model("long", gpu_class="a" * 500),
    gpu_model("long", owner="org:" + "1" * 500),
    {
        "name": "env",
        "profiles": [{"name": "p", "engine": "sim", "gpu_class": "a", "env": {"A": "\x00"}}],
    },
]


def test_no_hostile_body_makes_any_post_endpoint_fail_with_a_500(api):
    api.call("POST", "/models", gpu_model("llama"))
    node_add("gpu-a", now=clock.now())
    paths = [
        "/models",
        "/models/llama/scale",
        "/models/llama/class",
        "/models/llama/owner",
        "/models/llama/resources",
        "/models/llama/restart",
        "/models/llama/retry",
        "/nodes/gpu-a/cordon",
        "/nodes/gpu-a/uncordon",
        "/nodes/gpu-a/drain",
        "/reconcile",
    ]
    seen = {}
    for path in paths:
        for body in HOSTILE:
            response = api.call("POST", path, body if isinstance(body, Raw) else json.dumps(body))
            seen[(path, json.dumps(body)[:60])] = response.status_code
            assert response.status_code < 500, (path, body)
            if response.status_code >= 400:
                detail(response)
    assert seen[("/models", "[]")] == 400
    assert Model.objects.count() == 1


@pytest.mark.parametrize(
    "name", ["%00", "a%00b", "x" * 5000, "..%2F..%2Fetc", "%F0%9F%A6%99", "%ff"]
)
def test_no_hostile_name_in_a_path_makes_an_endpoint_fail_with_a_500(api, name):
    for method, path in [
        ("GET", f"/models/{name}"),
        ("GET", f"/models/{name}/explain"),
        ("DELETE", f"/models/{name}"),
        ("POST", f"/models/{name}/restart"),
        ("POST", f"/models/{name}/retry"),
        ("POST", f"/models/{name}/scale"),
        ("POST", f"/models/{name}/class"),
        ("POST", f"/models/{name}/owner"),
        ("POST", f"/models/{name}/resources"),
        ("PUT", f"/models/{name}/capacity"),
        ("GET", f"/nodes/{name}"),
        ("POST", f"/nodes/{name}/drain"),
        ("GET", f"/replicas?model={name}"),
    ]:
        response = api.call(method, path, {"min": 1} if path.endswith("scale") else None)
        assert response.status_code < 500, (method, path)
