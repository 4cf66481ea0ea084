"""Small GGUF files with chosen figures, written with the gguf package's own writer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import gguf
import numpy as np


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    name: str | None = None,
    block_count: int | None = 32,
    context_length: int | None = 8192,
    embedding_length: int | None = 4096,
    head_count: int | Sequence[int] | None = 32,
    head_count_kv: int | Sequence[int] | None = 8,
    key_length: int | None = None,
    value_length: int | None = None,
    file_type: gguf.LlamaFileType | None = None,
    tokens: int = 0,
    tensors: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """A GGUF whose header says what is given (None leaves a key out), with `tokens`
    tokenizer strings written before the model's figures, and these tensors (by default
    a 4096-element f16 one and a 64-element f32 one: 4,160 parameters, mostly F16)."""
    w = gguf.GGUFWriter(path, arch)
    if name is not None:
        w.add_name(name)
    if tokens:
        w.add_tokenizer_model("llama")
        w.add_token_list([f"token-{i}" for i in range(tokens)])
        w.add_token_types([1] * tokens)
    for value, add in (
        (block_count, w.add_block_count),
        (context_length, w.add_context_length),
        (embedding_length, w.add_embedding_length),
        (head_count, w.add_head_count),
        (head_count_kv, w.add_head_count_kv),
        (key_length, w.add_key_length),
        (value_length, w.add_value_length),
        (file_type, w.add_file_type),
    ):
        if value is not None:
            add(value)
    if tensors is None:
        tensors = {
            "token_embd.weight": np.ones((64, 64), dtype=np.float16),
            "output_norm.weight": np.ones(64, dtype=np.float32),
        }
    for tensor_name, data in tensors.items():
        w.add_tensor(tensor_name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
