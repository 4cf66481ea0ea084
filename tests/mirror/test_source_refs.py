"""What a model's source names among mirror weights: a GGUF, one file, the folder of all
of them, or a folder inside them, named from it down; a sentence while any is not ready."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mirror.domain.refs import FolderRef, WeightsRef
from mirror.models import WeightFile, Weights
from mirror.selectors import weights_for_source

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def weights(source: str, *paths: str, state: str = "ready") -> Weights:
    w = Weights.objects.create(source=source, added_by="t", added_at=T0)
    for i, path in enumerate(paths):
        WeightFile.objects.create(
            weights=w, path=path, fetch_url="x", size=10 + i, sha256=f"{i:x}" * 64, state=state
        )
    return w


def test_a_repository_without_a_gguf_is_the_folder_of_every_file():
    weights("hf://acme/llama", "config.json", "tokenizer.json", "model.safetensors")

    ref = weights_for_source("hf://acme/llama")

    assert isinstance(ref, FolderRef)
    assert [f.file for f in ref.files] == ["config.json", "model.safetensors", "tokenizer.json"]
    assert ref.name == "hf://acme/llama" and ref.size == 33


def test_a_repository_with_a_gguf_or_a_path_to_a_file_is_that_file():
    weights("hf://acme/quant", "README.md", "q4.gguf", "q8.gguf")

    assert weights_for_source("hf://acme/quant") == WeightsRef(
        "1" * 64, 11, "/api/v1/mirror/files/" + "1" * 64, "q4.gguf"
    )
    assert weights_for_source("hf://acme/quant/q8.gguf").file == "q8.gguf"


def test_a_path_to_a_folder_inside_the_weights_is_that_folder_named_from_it_down():
    weights("hf://acme/multi", "README.md", "onnx/config.json", "onnx/sub/model.onnx")

    ref = weights_for_source("hf://acme/multi/onnx")

    assert isinstance(ref, FolderRef)
    assert [f.file for f in ref.files] == ["config.json", "sub/model.onnx"]
    assert weights_for_source("hf://acme/multi/nothing") == (
        f"weights {Weights.objects.get().pk} (hf://acme/multi) hold no file nothing"
    )


def test_a_folder_waits_while_any_file_is_not_ready_naming_a_failed_one_first():
    w = weights("hf://acme/llama", "config.json", "model.safetensors")
    WeightFile.objects.filter(path="config.json").update(state="downloading", size=0)
    WeightFile.objects.filter(path="model.safetensors").update(state="failed", detail="cut.")

    assert weights_for_source("hf://acme/llama") == (
        f"waiting for weights {w.pk} (model.safetensors): failed: cut.; "
        f"llmgw ctl weights retry {w.pk}"
    )
