"""The catalog file (LLMGW_CATALOG): read at start, and the declared models made exactly its own."""

from __future__ import annotations

import pytest

from catalog.declared import read_catalog_file
from catalog.domain import CatalogError
from catalog.models import Model
from catalog.selectors import catalog_load
from catalog.services import declared_sync
from fleet.models import ModelState
from llmgw.core import clock
from llmgw.core.errors import Invalid
from tests.fleet.builders import gpu_model, model_added

CATALOG = """
models:
  - name: llama
    source: hf://meta/llama-3-8b
    aliases: [chat]
    class: critical
    scaling: {min: 2, max: 4}
    profiles:
      - name: h100
        engine: vllm
        gpu_class: h100-80g
        tp: 2
      - name: cpu
        engine: llamacpp
        cpu_cores: 8
        min_memory_gb: 12
  - name: embed
    routing_profile: embedding
    profiles:
      - {name: cpu, engine: sim, cpu_cores: 1, min_memory_gb: 1}
"""


def catalog_file(tmp_path, text: str):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def test_a_catalog_file_is_read_into_declared_models(tmp_path):
    llama, embed = read_catalog_file(catalog_file(tmp_path, CATALOG))

    assert (llama.name, llama.declared, llama.capacity_class) == ("llama", True, "critical")
    assert (llama.min_replicas, llama.max_replicas, llama.aliases) == (2, 4, ("chat",))
    assert [(p.name, p.engine, p.tp) for p in llama.profiles] == [
        ("h100", "vllm", 2),
        ("cpu", "llamacpp", 1),
    ]
    assert llama.profile("cpu").reserved_cores == 8
    assert (embed.routing_profile, embed.min_replicas, embed.declared) == ("embedding", 1, True)


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "models: []\n"])
def test_an_empty_catalog_file_declares_nothing(tmp_path, text):
    assert read_catalog_file(catalog_file(tmp_path, text)) == []


BAD_FILES = {
    "YAML that does not parse": ("models: [\n  - name: llama\n", "cannot be read"),
    "a list at the top": ("- name: llama\n", "mapping"),
    "models that are not a list": ("models: {name: llama}\n", "list"),
    "a model with a bad name": (
        "models:\n  - name: Llama\n    profiles: [{name: p, engine: sim}]\n",
        "name",
    ),
    "a profile with an unknown engine": (
        "models:\n  - name: llama\n    profiles: [{name: p, engine: magic, gpu_class: a}]\n",
        "engine",
    ),
    "a field nobody knows": (
        "models:\n  - name: llama\n    replicas: 3\n    profiles: [{name: p, engine: sim}]\n",
        "replicas",
    ),
    "a tab where YAML wants spaces": ("models:\n\t- name: llama\n", "cannot be read"),
    "half of a character in an engine's arguments": (
        'models:\n  - name: llama\n    profiles: [{name: p, engine: sim, args: ["\\ud800"]}]\n',
        "profiles[0].args[0]: holds a lone UTF-16 surrogate",
    ),
}


@pytest.mark.parametrize("text, says", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_bad_catalog_file_is_refused_naming_the_file_and_the_reason(tmp_path, text, says):
    path = catalog_file(tmp_path, text)

    with pytest.raises(CatalogError) as refused:
        read_catalog_file(path)

    assert str(path) in str(refused.value)
    assert says in str(refused.value)


def test_a_catalog_file_that_cannot_be_read_is_refused(tmp_path):
    with pytest.raises(CatalogError, match="cannot be read"):
        read_catalog_file(tmp_path / "missing.yaml")


@pytest.mark.django_db
def test_declared_sync_adds_updates_and_removes_declared_models(tmp_path):
    first = read_catalog_file(catalog_file(tmp_path, CATALOG))

    added = declared_sync(specs=first)

    assert added == [
        "model llama added from the catalog file",
        "model embed added from the catalog file",
    ]
    assert {n: s.declared for n, s in catalog_load().items()} == {"embed": True, "llama": True}

    edited = CATALOG.replace("{min: 2, max: 4}", "{min: 3, max: 4}").split("  - name: embed")[0]
    changes = declared_sync(specs=read_catalog_file(catalog_file(tmp_path, edited)))

    assert changes == [
        "model llama updated from the catalog file",
        "model embed removed: it is no longer in the catalog file",
    ]
    catalog = catalog_load()
    assert list(catalog) == ["llama"]
    assert catalog["llama"].min_replicas == 3
    assert Model.objects.get().updated_by == "catalog file"


@pytest.mark.django_db
def test_a_declared_model_taken_out_of_the_file_takes_its_parking_with_it(tmp_path):
    declared_sync(specs=read_catalog_file(catalog_file(tmp_path, CATALOG)))
    ModelState.objects.create(model="embed", failures=5, parked_since=clock.now())
    ModelState.objects.create(model="llama", failures=1)

    without_embed = CATALOG.split("  - name: embed")[0]
    declared_sync(specs=read_catalog_file(catalog_file(tmp_path, without_embed)))

    assert list(ModelState.objects.values_list("model", flat=True)) == ["llama"]


@pytest.mark.django_db
def test_slo_context_length_and_max_output_come_from_the_file_and_stay_unchanged(tmp_path):
    text = CATALOG.replace(
        "    routing_profile: embedding\n",
        "    routing_profile: embedding\n    slo: {ttft_p95_ms: 200}\n"
        "    context_length: 512\n    max_output: 1\n",
    )
    specs = read_catalog_file(catalog_file(tmp_path, text))
    declared_sync(specs=specs)

    embed = catalog_load()["embed"]
    assert (embed.slo.ttft_p95_ms, embed.context_length, embed.max_output) == (200.0, 512, 1)
    # Read back equal to the file, so the next start finds nothing to change.
    assert declared_sync(specs=specs) == []
    edited = text.replace("ttft_p95_ms: 200", "ttft_p95_ms: 150")
    changes = declared_sync(specs=read_catalog_file(catalog_file(tmp_path, edited)))
    assert changes == ["model embed updated from the catalog file"]


@pytest.mark.django_db
def test_declared_sync_of_the_same_file_changes_nothing(tmp_path):
    specs = read_catalog_file(catalog_file(tmp_path, CATALOG))
    declared_sync(specs=specs)

    assert declared_sync(specs=specs) == []


@pytest.mark.django_db
def test_declared_sync_leaves_runtime_models_alone(tmp_path):
    model_added(gpu_model("scratch"))

    declared_sync(specs=read_catalog_file(catalog_file(tmp_path, CATALOG)))
    declared_sync(specs=[])

    catalog = catalog_load()
    assert list(catalog) == ["scratch"]
    assert catalog["scratch"].declared is False


@pytest.mark.django_db
def test_declared_sync_refuses_a_file_that_breaks_the_catalog_and_writes_nothing(tmp_path):
    text = CATALOG.replace("aliases: [chat]", "aliases: [chat]\n    fallbacks: [ghost]")

    with pytest.raises(Invalid, match="ghost"):
        declared_sync(specs=read_catalog_file(catalog_file(tmp_path, text)))

    assert Model.objects.count() == 0


@pytest.mark.django_db
def test_declared_sync_refuses_an_alias_that_is_a_runtime_models_name(tmp_path):
    model_added(gpu_model("chat"))

    with pytest.raises(Invalid, match="chat"):
        declared_sync(specs=read_catalog_file(catalog_file(tmp_path, CATALOG)))

    assert list(catalog_load()) == ["chat"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "field, says",
    [("tp: 99999999999", "tp is too large"), ("min_memory_gb: .inf", "finite")],
)
def test_declared_sync_refuses_figures_no_column_can_hold(tmp_path, field, says):
    text = CATALOG.replace("tp: 2", field)

    with pytest.raises(Invalid, match=says):
        declared_sync(specs=read_catalog_file(catalog_file(tmp_path, text)))

    assert Model.objects.count() == 0
