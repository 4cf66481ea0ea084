"""Fixtures for the mirror's tests: Gemma 3 270M's real GGUF, assembled once per machine."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """Gemma 3 270M Q4_K_M (253 MB), assembled once outside the clone, where the
    end-to-end tests and benchmarks have it too."""
    from tests.e2e.real_engines import gemma_gguf as assembled

    return assembled()
