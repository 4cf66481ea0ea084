"""What an adapter's own files and its base's weights say, when they are on this machine:
the adapter's rank and the architecture it was trained for, and the base's architecture,
for `catalog.domain.adapter_refusal`. A source fetched through the mirror is not read here
(its files may not be fetched yet): nothing is said of it, and its agent refuses a mismatch
when it loads it."""

from __future__ import annotations

import json
from pathlib import Path

from mirror.selectors import weights_gguf_architecture

from .domain import AdapterFacts


def adapter_facts(source: str, fmt: str) -> AdapterFacts | None:
    """The adapter's rank and architecture from its files at a local path; None when the
    source is not a local path or its files cannot be read."""
    path = _local(source)
    if path is None:
        return None
    if fmt == "gguf":
        arch = _gguf_architecture(path)
        return AdapterFacts(architecture=arch) if arch else None
    config = _json(path / "adapter_config.json") if path.is_dir() else None
    if config is None:
        return None
    rank = config.get("r")
    mapping = config.get("auto_mapping")
    arch = mapping.get("base_model_class") if isinstance(mapping, dict) else None
    return AdapterFacts(
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else None,
        architecture=arch if isinstance(arch, str) and arch else None,
    )


def weights_architecture(source: str) -> str | None:
    """The architecture a model's weights at a local path say they are: a GGUF's
    general.architecture, a folder's config.json `architectures` (else `model_type`)."""
    path = _local(source)
    if path is None:
        return None
    if path.is_dir():
        config = _json(path / "config.json")
        if config is None:
            return None
        archs = config.get("architectures")
        if isinstance(archs, list) and archs and isinstance(archs[0], str):
            return archs[0]
        kind = config.get("model_type")
        return kind if isinstance(kind, str) and kind else None
    return _gguf_architecture(path)


def _local(source: str) -> Path | None:
    if not source.startswith("/"):
        return None
    path = Path(source)
    return path if path.exists() else None


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _gguf_architecture(path: Path) -> str | None:
    # Through the mirror's header reader: the stock one took 8 s over SmolLM2's tokenizer,
    # past a client's timeout on POST /adapters.
    return weights_gguf_architecture(path) if path.is_file() else None
