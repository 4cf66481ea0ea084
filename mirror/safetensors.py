"""What safetensors files and a config.json say about a model, read without its tensors.

A safetensors file starts with 8 bytes, the header's length (little-endian), then that
many bytes of JSON: per tensor its dtype, shape and offsets, and `__metadata__`. Only the
header is read, so a 10 GB shard costs a few hundred KB. A sharded model's
`model.safetensors.index.json` names each tensor's shard; every shard's header is read
for the dtypes and shapes, which the index does not hold.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

from .domain.hf import HfError, HfModel, Tensor, hf_model

# The format's own bound (safetensors' MAX_HEADER_SIZE): a larger length is a damaged file.
MAX_HEADER = 100_000_000
CONFIG = "config.json"
INDEX = "model.safetensors.index.json"


def read_header(path: str | os.PathLike[str], label: str = "") -> list[Tensor]:
    """The tensors a safetensors file's header lists; HfError with a sentence when the file
    is missing, short, or its header is not what the format says."""
    label = label or Path(path).name
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise HfError(f"{label} is not a safetensors file: it has {len(head)} bytes.")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER:
                raise HfError(
                    f"{label} is not a safetensors file: its header would be {length:,} bytes."
                )
            raw = f.read(length)
    except OSError as exc:
        raise HfError(f"{label} cannot be read: {exc.strerror or exc}.") from None
    if len(raw) < length:
        raise HfError(f"{label} ends inside its header ({len(raw):,} of {length:,} bytes).")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise HfError(f"{label} is not a safetensors file: its header is not JSON.") from None
    if not isinstance(header, dict):
        raise HfError(f"{label} is not a safetensors file: its header is not a JSON object.")
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if (
            not isinstance(dtype, str)
            or not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise HfError(f"{label}: tensor {name} has no dtype and shape the format allows.")
        tensors.append(Tensor(name, dtype, tuple(shape)))
    return tensors


def read_config(path: str | os.PathLike[str]) -> Mapping:
    """config.json as a mapping; HfError when it cannot be read or is not a JSON object."""
    try:
        data = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise HfError(f"config.json cannot be read: {exc.strerror or exc}.") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise HfError("config.json is not JSON.") from None
    if not isinstance(data, dict):
        raise HfError("config.json is not a JSON object.")
    return data


def shards(files: Mapping[str, str | os.PathLike[str]]) -> list[str]:
    """The safetensors files of a model among `files` (path in the repository → local file):
    those its index names when there is one, else every `*.safetensors`."""
    index = files.get(INDEX)
    if index is not None:
        try:
            data = json.loads(Path(index).read_bytes())
            named = sorted(set(data["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise HfError(f"{INDEX} has no weight_map naming the shards.") from None
        missing = [n for n in named if n not in files]
        if missing:
            raise HfError(f"{INDEX} names {', '.join(missing[:3])}, which the weights lack.")
        return named
    return sorted(p for p in files if p.endswith(".safetensors"))


def read_hf(files: Mapping[str, str | os.PathLike[str]]) -> HfModel:
    """Size the model in `files` (path in the repository → local file): config.json and every
    shard's header. HfError with a sentence when something sizing needs is missing."""
    if CONFIG not in files:
        raise HfError("The weights hold no config.json, which sizing a safetensors model needs.")
    found = shards(files)
    if not found:
        raise HfError("The weights hold no *.safetensors files.")
    tensors = [t for name in found for t in read_header(files[name], name)]
    return hf_model(read_config(files[CONFIG]), tensors)


def is_hf(paths: list[str]) -> bool:
    """Whether weights of these files are a safetensors model (rather than a GGUF)."""
    return CONFIG in paths and any(p.endswith(".safetensors") for p in paths)
