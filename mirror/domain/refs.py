"""What an agent is told to fetch from the mirror (``start_shard``'s ``weights``): shared by
the control plane, which says it, and the agent, which reads it. Nothing here knows Django."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class RefError(ValueError):
    """A reference an agent cannot fetch by; the message is a sentence."""


@dataclass(frozen=True)
class WeightsRef:
    """A mirror file: its digest, size, where it is served, and its name in the weights."""

    sha256: str
    size: int
    url: str
    file: str

    def message(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "url": self.url, "file": self.file}

    @classmethod
    def from_message(cls, raw: Any) -> WeightsRef:
        """Read ``weights`` as an agent gets it; raises RefError when it is unusable."""
        if not isinstance(raw, dict):
            raise RefError("start_shard's weights is not an object.")
        digest, size, url = raw.get("sha256"), raw.get("size"), raw.get("url")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise RefError("start_shard's weights carry no sha256 digest.")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RefError("start_shard's weights carry no size.")
        if not isinstance(url, str) or not url:
            raise RefError("start_shard's weights carry no url.")
        name = raw.get("file")
        return cls(digest, size, url, name if isinstance(name, str) and name else digest)
