"""Where the mirror keeps its files on disk: verified blobs by digest, downloads in progress by id."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def root() -> Path:
    return settings.LLMGW.mirror.dir


def blob(sha256: str) -> Path:
    """The verified file with this digest (which may not exist)."""
    if not _HEX64.match(sha256):
        raise ValueError(f"{sha256!r} is not a sha256 digest")
    return root() / "blobs" / "sha256" / sha256


def part(file_id: int) -> Path:
    """A download in progress, kept across restarts so it resumes."""
    return root() / "partial" / f"{int(file_id)}.part"
