"""Reading safetensors headers and config.json: only the header, a sentence for a damaged file."""

from __future__ import annotations

import json
import struct

import pytest

from mirror.domain.hf import HfError, Tensor
from mirror.safetensors import read_header, read_hf

from .hf_configs import QWEN25_7B, dense_tensors, write_safetensors


def test_a_header_is_read_without_the_tensors(tmp_path):
    tensors = [Tensor("a", "BF16", (4, 2)), Tensor("b", "F8_E4M3", (3,))]
    path = write_safetensors(tmp_path / "m.safetensors", tensors, data=True)

    assert read_header(path) == tensors


def test_a_sharded_model_is_read_through_its_index(tmp_path):
    tensors = dense_tensors(QWEN25_7B)
    half = len(tensors) // 2
    files = {
        "config.json": tmp_path / "config.json",
        "model-00001-of-00002.safetensors": write_safetensors(tmp_path / "1", tensors[:half]),
        "model-00002-of-00002.safetensors": write_safetensors(tmp_path / "2", tensors[half:]),
        # A stray file the index does not name is not counted.
        "consolidated.safetensors": write_safetensors(tmp_path / "3", tensors[:5]),
        "model.safetensors.index.json": tmp_path / "index.json",
    }
    files["config.json"].write_text(json.dumps(QWEN25_7B))
    weight_map = {t.name: "model-00001-of-00002.safetensors" for t in tensors[:half]}
    weight_map |= {t.name: "model-00002-of-00002.safetensors" for t in tensors[half:]}
    files["model.safetensors.index.json"].write_text(json.dumps({"weight_map": weight_map}))

    m = read_hf(files)

    assert m.parameters == 7_615_616_512
    assert m.kv_per_token == 28 * 4 * 128 * 2 * 2


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"\x01\x02", "it has 2 bytes"),
        (struct.pack("<Q", 10**12), "its header would be 1,000,000,000,000 bytes"),
        (struct.pack("<Q", 100) + b"{}", "ends inside its header (2 of 100 bytes)"),
        (struct.pack("<Q", 4) + b"GGUF", "its header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "its header is not a JSON object"),
        (struct.pack("<Q", 17) + b'{"a": {"dtype":1}}'[:17], "not JSON"),
        (struct.pack("<Q", 18) + b'{"a": {"dtype":1}}', "tensor a has no dtype and shape"),
    ],
)
def test_a_damaged_file_is_a_sentence(tmp_path, raw, said):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)

    with pytest.raises(HfError, match=said.replace("(", r"\(").replace(")", r"\)")):
        read_header(path)


def test_weights_without_config_or_shards_are_a_sentence(tmp_path):
    with pytest.raises(HfError, match="no config.json"):
        read_hf({"model.safetensors": tmp_path / "x"})
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(HfError, match="no \\*.safetensors files"):
        read_hf({"config.json": tmp_path / "config.json"})
