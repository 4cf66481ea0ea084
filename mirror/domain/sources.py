"""What an operator may name as a source of weights, read without touching anything.

Three kinds (interfaces.md, Weights):

- ``hf://ORG/REPO[@REVISION][/PATH-OR-GLOB]``: a repository on the hub (or on
  ``HF_ENDPOINT``), every file of it, one file, or the files a glob matches;
- ``https://…``: one file over HTTPS;
- an absolute path: a file or a folder on the mirror's host, which must lie
  inside one of the folders ``LLMGW_MIRROR_SOURCES`` names (checked by the
  shell, which can see the disk).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

HF, HTTPS, LOCAL = "hf", "https", "local"

# The hub's own rule for names: letters, digits, and - _ . (not leading . or -).
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_REPO = re.compile(
    rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<rev>[A-Za-z0-9._-]{{1,100}}))?(?:/(?P<path>.+))?$"
)
_GLOB_CHARS = set("*?[")
_LONGEST = 500


class SourceError(ValueError):
    """A source that cannot be used; the message is a sentence for the operator."""


@dataclass(frozen=True)
class Source:
    """A source read into its parts. ``text`` is how it is stored and shown."""

    kind: str
    text: str
    repo: str | None = None
    revision: str | None = None
    pattern: str | None = None
    url: str | None = None
    path: str | None = None

    @property
    def is_glob(self) -> bool:
        """Whether ``pattern`` selects files by a glob rather than naming one."""
        return bool(self.pattern) and any(c in _GLOB_CHARS for c in self.pattern or "")

    def selects(self, filename: str) -> bool:
        """Whether a repository file (a path relative to its root) is part of these weights."""
        if not self.pattern:
            return True
        if self.is_glob:
            return fnmatch.fnmatchcase(filename, self.pattern)
        return filename == self.pattern or filename.startswith(self.pattern.rstrip("/") + "/")


def fetched_remotely(text: str) -> bool:
    """Whether weights of this source come from the hub or an https server (what adding an
    adapter of it adds to the mirror), not a path: a model's or adapter's path is the
    nodes' own."""
    try:
        return parse_source(text).kind in (HF, HTTPS)
    except SourceError:
        return False


def parse_source(text: object) -> Source:
    """Read a source; raises SourceError with a sentence saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise SourceError(
            "A source is needed: hf://ORG/REPO[@REVISION][/PATH], https://… or a path."
        )
    raw = text.strip()
    if len(raw) > _LONGEST:
        raise SourceError(f"The source is {len(raw)} characters long; at most {_LONGEST} are kept.")
    if not raw.isprintable():
        raise SourceError("The source holds a control character.")
    if raw.startswith("hf://"):
        return _hub(raw)
    if raw.startswith("/"):
        return _local(raw)
    scheme = urlsplit(raw).scheme.lower()
    if scheme == "https":
        return _https(raw)
    if scheme:
        raise SourceError(
            f"The source {raw!r} has the scheme {scheme}://, which the mirror does not fetch; "
            "use hf://, https:// or an absolute path on the mirror's host."
        )
    raise SourceError(
        f"The source {raw!r} is neither hf://ORG/REPO, https://… nor an absolute path."
    )


def _hub(raw: str) -> Source:
    m = _REPO.match(raw[len("hf://") :])
    if not m:
        raise SourceError(
            f"The source {raw!r} is not hf://ORG/REPO[@REVISION][/PATH-OR-GLOB]: "
            "names are letters, digits, '-', '_' and '.'."
        )
    path = m["path"]
    if path is not None:
        path = _clean_relative(path, raw)
    return Source(kind=HF, text=raw, repo=m["repo"], revision=m["rev"], pattern=path)


def _https(raw: str) -> Source:
    parts = urlsplit(raw)
    if not parts.hostname:
        raise SourceError(f"The source {raw!r} names no host.")
    if parts.username or parts.password:
        raise SourceError(
            "The source carries a user name or password; it would be shown to everyone "
            "who lists weights. Give the file a URL without credentials."
        )
    name = posixpath.basename(parts.path)
    if not name:
        raise SourceError(f"The source {raw!r} does not end in a file name.")
    return Source(kind=HTTPS, text=raw, url=raw, pattern=name)


def _local(raw: str) -> Source:
    norm = posixpath.normpath(raw)
    if norm != raw.rstrip("/") and norm != raw:
        raise SourceError(f"The path {raw!r} is not in its plain form; give it as {norm!r}.")
    return Source(kind=LOCAL, text=norm, path=norm)


def _clean_relative(path: str, raw: str) -> str:
    norm = posixpath.normpath(path)
    if path.startswith("/") or norm.startswith("..") or norm == ".":
        raise SourceError(f"The path inside the repository in {raw!r} leaves the repository.")
    return norm


def inside(path: str, roots: tuple[str, ...]) -> bool:
    """Whether ``path`` (resolved, absolute) lies in one of ``roots`` (resolved, absolute)."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)
