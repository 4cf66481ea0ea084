"""What an agent is told to fetch from the mirror (``start_shard``'s ``weights``): shared by
the control plane, which says it, and the agent, which reads it. Nothing here knows Django.

Two shapes. A single file (a GGUF): ``{"sha256", "size", "url", "file"}``, as it always was.
A model that is a folder (a Hugging Face repository: config.json, tokenizer files,
*.safetensors): ``{"files": [{"sha256", "size", "url", "path"}, ...], "name": SOURCE}``, every
file of it, each named by its path in the folder. An agent that knows only the first shape
reads the second as weights with no digest and fails the shard with that sentence, rather
than starting an engine on one file of a folder.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass
from typing import Any

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# A folder's file names: more would be a message no control plane sends.
MOST_FILES = 10_000
_LONGEST_PATH = 500


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

    @property
    def digests(self) -> tuple[str, ...]:
        return (self.sha256,)

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


@dataclass(frozen=True)
class FolderRef:
    """A model that is a folder of mirror files, each named by its path inside it (``file``
    of each WeightsRef), sorted by path; ``name`` is what it is called in sentences."""

    files: tuple[WeightsRef, ...]
    name: str

    @property
    def digests(self) -> tuple[str, ...]:
        """Each file's digest, once."""
        return tuple(dict.fromkeys(f.sha256 for f in self.files))

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def key(self) -> str:
        """The folder's own name in a cache: the digest of its paths and their digests, so
        one folder is assembled once and two that differ in any file never share it."""
        text = "".join(f"{f.file}\0{f.sha256}\n" for f in self.files)
        return hashlib.sha256(text.encode()).hexdigest()

    def message(self) -> dict[str, Any]:
        return {
            "files": [
                {"sha256": f.sha256, "size": f.size, "url": f.url, "path": f.file}
                for f in self.files
            ],
            "name": self.name,
        }

    @classmethod
    def from_message(cls, raw: Any) -> FolderRef:
        """Read a folder's ``weights``; raises RefError with a sentence when it is unusable:
        a file without digest, size or url, a path that would leave the folder, two files
        at one path, or one file's path a folder of another's."""
        if not isinstance(raw, dict) or not isinstance(raw.get("files"), list):
            raise RefError("start_shard's weights carry no list of files.")
        items = raw["files"]
        if not items or len(items) > MOST_FILES:
            raise RefError(
                f"start_shard's weights list {len(items)} files; a folder has 1 to {MOST_FILES}."
            )
        files = []
        for item in items:
            if not isinstance(item, dict):
                raise RefError("A file of start_shard's weights is not an object.")
            path = item.get("path")
            ref = WeightsRef.from_message({**item, "file": path})
            files.append(WeightsRef(ref.sha256, ref.size, ref.url, safe_path(path)))
        files.sort(key=lambda f: f.file)
        _no_clash([f.file for f in files])
        name = raw.get("name")
        return cls(tuple(files), name if isinstance(name, str) and name else "the weights")


def weights_from_message(raw: Any) -> WeightsRef | FolderRef:
    """``start_shard``'s ``weights`` in either shape; raises RefError when it is unusable."""
    if isinstance(raw, dict) and "files" in raw:
        return FolderRef.from_message(raw)
    return WeightsRef.from_message(raw)


def safe_path(path: Any) -> str:
    """``path`` when it names a file inside a folder (relative, plain, no ``..``); else
    RefError with a sentence. It is checked wherever a name becomes a file on a disk."""
    if not isinstance(path, str) or not path:
        raise RefError("A file of the weights has no path.")
    shown = path[:80]
    if len(path) > _LONGEST_PATH or not path.isprintable():
        raise RefError(f"The path {shown!r} of a weights file is not a plain file name.")
    if path.startswith("/") or "\\" in path:
        raise RefError(f"The path {shown!r} of a weights file is absolute; it must be relative.")
    parts = path.split("/")
    if posixpath.normpath(path) != path or any(p in ("", ".", "..") for p in parts):
        raise RefError(f"The path {shown!r} of a weights file leaves its folder or is not plain.")
    return path


def _no_clash(paths: list[str]) -> None:
    """Refuse two files at one path, or a file where another's folder is (sorted paths)."""
    seen = set(paths)
    if len(seen) != len(paths):
        dup = next(p for i, p in enumerate(paths) if p in paths[:i])
        raise RefError(f"Two files of the weights are at one path, {dup!r}.")
    for p in paths:
        parent = p.rpartition("/")[0]
        while parent:
            if parent in seen:
                raise RefError(f"The weights hold a file {parent!r} and a file inside it, {p!r}.")
            parent = parent.rpartition("/")[0]
