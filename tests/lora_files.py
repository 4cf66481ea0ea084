"""LoRA adapters the tests write for a base model: a llama.cpp LoRA GGUF (`lora_gguf`) and a
PEFT folder for vLLM (`peft_adapter`), each with seeded random weights.

Both take their shapes from the base itself, a GGUF's metadata and tensors or a Hugging
Face folder's config.json, so an adapter written here loads on that base and no other. The
weights are small random F32 values, large enough to move a 135M model's greedy answer
(measured against SmolLM2-135M-Instruct: see tests/e2e/test_adapters_engines.py), and the
same seed writes the same bytes.

The safetensors file is written by hand (an 8-byte header length, the JSON header, the raw
little-endian tensors): the test environment has numpy and not the safetensors package.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# PEFT's own file names, which vLLM looks for.
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class BaseDims:
    """What an adapter's shapes depend on: the base's layers and attention widths."""

    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int

    def out_features(self, target: str) -> int:
        """The output width of a projection (PEFT's q_proj/k_proj/v_proj/o_proj names)."""
        kv = self.kv_heads * self.head_dim
        return {
            "q_proj": self.heads * self.head_dim,
            "k_proj": kv,
            "v_proj": kv,
            "o_proj": self.hidden,
        }[target]

    def in_features(self, target: str) -> int:
        """The input width of a projection."""
        return self.heads * self.head_dim if target == "o_proj" else self.hidden


@functools.lru_cache(maxsize=8)
def _read_base(path: Path) -> tuple[str, dict[str, int], dict[str, tuple[int, int]]]:
    """A GGUF's architecture, its integer metadata under that architecture, and its 2-D
    tensors' shapes ([in, out]: GGUF orders dimensions innermost first); read once per
    file, since reading a model's vocabulary takes seconds."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = str(reader.fields["general.architecture"].contents())
    ints = {}
    for key, f in reader.fields.items():
        if key.startswith(f"{arch}."):
            value = f.contents()
            if isinstance(value, int):
                ints[key.removeprefix(f"{arch}.")] = value
    shapes = {
        t.name: (int(t.shape[0]), int(t.shape[1])) for t in reader.tensors if len(t.shape) == 2
    }
    return arch, ints, shapes


def gguf_dims(path: Path) -> BaseDims:
    """A llama.cpp model's dimensions, from its GGUF's metadata."""
    arch, ints, _ = _read_base(Path(path))
    hidden, heads = ints["embedding_length"], ints["attention.head_count"]
    return BaseDims(
        architecture=arch,
        layers=ints["block_count"],
        hidden=hidden,
        heads=heads,
        kv_heads=ints.get("attention.head_count_kv", heads),
        head_dim=hidden // heads,
    )


def hf_dims(folder: Path) -> BaseDims:
    """A Hugging Face model's dimensions, from its folder's config.json."""
    config = json.loads((folder / "config.json").read_text())
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    return BaseDims(
        architecture=str(config.get("model_type", "")),
        layers=int(config["num_hidden_layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
    )


def lora_gguf(
    base: Path,
    out: Path,
    *,
    seed: int,
    rank: int = 8,
    alpha: float = 16.0,
    std: float = 0.05,
    targets: tuple[str, ...] = ("attn_q",),
) -> Path:
    """Write a LoRA adapter GGUF for the llama.cpp model ``base`` to ``out`` and return it.

    For each layer N and target T (llama.cpp's tensor names: attn_q, attn_k, attn_v,
    attn_output) it holds ``blk.N.T.weight.lora_a`` (rank x in) and ``.lora_b`` (out x
    rank), shaped after the base's own ``blk.N.T.weight``; ``general.type`` is "adapter",
    ``adapter.type`` "lora", and ``adapter.lora.alpha`` ``alpha`` (llama.cpp scales by
    alpha / rank).
    """
    import gguf

    arch, _, shapes = _read_base(Path(base))
    wanted = sorted((name for name in shapes if _is_target(name, targets)), key=_layer_order)
    if not wanted:
        raise ValueError(f"{base} has no {', '.join(targets)} tensors to adapt")
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(_partial(out)), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    for name in wanted:
        n_in, n_out = shapes[name]
        writer.add_tensor(f"{name}.lora_a", _random(rng, (rank, n_in), std))
        writer.add_tensor(f"{name}.lora_b", _random(rng, (n_out, rank), std))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(_partial(out), out)
    return out


def peft_adapter(
    out: Path,
    *,
    dims: BaseDims,
    seed: int,
    base_name: str = "",
    rank: int = 8,
    alpha: float = 16.0,
    std: float = 0.05,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
) -> Path:
    """Write a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) for
    a llama-shaped model of ``dims`` to ``out`` and return it.

    Tensors are named as PEFT saves them for a causal LM
    (``base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight``, rank x in;
    ``lora_B``, out x rank).
    """
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(dims.layers):
        for target in targets:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            n_in, n_out = dims.in_features(target), dims.out_features(target)
            tensors[f"{prefix}.lora_A.weight"] = _random(rng, (rank, n_in), std)
            tensors[f"{prefix}.lora_B.weight"] = _random(rng, (n_out, rank), std)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / PEFT_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(out / PEFT_WEIGHTS, tensors)
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """Write F32 ``tensors`` in the safetensors format: a little-endian u64 header length,
    the JSON header (each tensor's dtype, shape and byte offsets; padded with spaces to 8
    bytes), then the tensors' bytes in the header's order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    partial = _partial(path)
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
    os.replace(partial, path)
    return path


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """The JSON header of a safetensors file: each tensor's dtype, shape and offsets."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))


def _random(rng: np.random.Generator, shape: tuple[int, int], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _is_target(name: str, targets: tuple[str, ...]) -> bool:
    # blk.N.attn_q.weight
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "blk" and parts[2] in targets and parts[3] == "weight"


def _layer_order(name: str) -> tuple[int, str]:
    parts = name.split(".")
    return int(parts[1]), name


def _partial(path: Path) -> Path:
    # Written beside its name and renamed, so a run cut short leaves no half a file.
    return path.with_name(f".{path.name}.{os.getpid()}.partial")
