"""From a source to the files it is made of, asked of the hub, an https server or the disk.

This runs when weights are added, so a repository that does not exist, a glob
that matches nothing or a path the mirror may not read is refused at once with
a sentence, and nothing is stored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx

from llmgw.core.errors import Invalid, Upstream, cause

from .domain.sources import HF, HTTPS, LOCAL, Source, inside

HUB_TIMEOUT_S = 20.0
# Folders a hub repository keeps beside its files that are never weights.
_SKIPPED = (".gitattributes",)


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch: its path within the weights, where from, and what it should be."""

    path: str
    url: str
    size: int | None
    sha256: str = ""


@dataclass(frozen=True)
class Resolved:
    revision: str
    files: tuple[RemoteFile, ...]


def hub_endpoint() -> str:
    """The hub asked: ``HF_ENDPOINT`` when set, as huggingface_hub itself reads it."""
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def hub_headers() -> dict[str, str]:
    """The hub's credential (``HF_TOKEN``), for the hub's own host only."""
    from huggingface_hub.utils import get_token

    token = get_token()
    return {"authorization": f"Bearer {token}"} if token else {}


# What the mirror's rows keep of a file (WeightFile.path and fetch_url).
LONGEST_PATH, LONGEST_URL = 500, 1000


def resolve(source: Source, *, sha256: str, roots: tuple[str, ...]) -> Resolved:
    """The files of ``source``; raises Invalid (bad input) or Upstream (a source unreachable)."""
    found = _resolve(source, sha256=sha256, roots=roots)
    for f in found.files:
        if len(f.path) > LONGEST_PATH or len(f.url) > LONGEST_URL:
            raise Invalid(
                f"{source.text} holds a file whose path is longer than the mirror keeps "
                f"({LONGEST_PATH} characters): {f.path[:80]}…"
            )
    return found


def _resolve(source: Source, *, sha256: str, roots: tuple[str, ...]) -> Resolved:
    if sha256 and source.kind == HF:
        raise Invalid(
            "A digest is taken for an https:// or a single local file; the hub gives its own."
        )
    if source.kind == HF:
        return _hub(source)
    if source.kind == HTTPS:
        return Resolved("", (_https(source, sha256),))
    if source.kind == LOCAL:
        found = _local(source, roots)
        if sha256 and len(found) != 1:
            raise Invalid(
                f"{source.text} is a folder of {len(found)} files; a digest names one file."
            )
        if sha256:
            found = (RemoteFile(found[0].path, found[0].url, found[0].size, sha256),)
        return Resolved("", found)
    raise Invalid(f"The source kind {source.kind} is not one the mirror fetches.")


def _hub(source: Source) -> Resolved:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = hub_endpoint()
    try:
        info = HfApi(endpoint=endpoint).model_info(
            source.repo, revision=source.revision, files_metadata=True, timeout=HUB_TIMEOUT_S
        )
    except GatedRepoError:
        raise Invalid(
            f"{source.repo} on {endpoint} is gated: accept its terms on the hub and set HF_TOKEN."
        ) from None
    except RepositoryNotFoundError:
        raise Invalid(
            f"There is no repository {source.repo} on {endpoint}, or HF_TOKEN may not read it."
        ) from None
    except RevisionNotFoundError:
        raise Invalid(f"{source.repo} on {endpoint} has no revision {source.revision!r}.") from None
    except (HfHubHTTPError, OSError, Exception) as exc:
        # huggingface_hub brings its own HTTP client, whose errors are no class of ours:
        # whatever stopped the hub answering is said, not raised as a 500.
        raise Upstream(
            f"The hub at {endpoint} could not be asked about {source.repo}: {cause(exc)}."
        ) from None
    revision = info.sha or source.revision or "main"
    files = []
    names = []
    for sib in info.siblings or []:
        name = sib.rfilename
        names.append(name)
        if name in _SKIPPED or not source.selects(name):
            continue
        lfs = sib.lfs
        digest = (lfs.sha256 if lfs else "") or ""
        size = sib.size if sib.size is not None else (lfs.size if lfs else None)
        url = f"{endpoint}/{source.repo}/resolve/{quote(revision, safe='')}/{quote(name)}"
        files.append(RemoteFile(path=name, url=url, size=size, sha256=digest))
    if not files:
        shown = ", ".join(sorted(names)[:10]) or "no files"
        raise Invalid(
            f"Nothing in {source.repo}@{revision[:12]} matches {source.pattern!r}; it has {shown}."
        )
    return Resolved(revision, tuple(files))


def _https(source: Source, sha256: str) -> RemoteFile:
    url = source.url or ""
    try:
        with httpx.Client(timeout=HUB_TIMEOUT_S, follow_redirects=True) as client:
            r = client.head(url)
            if r.status_code in (405, 501):
                with client.stream("GET", url) as g:
                    r = g
    except httpx.HTTPError as exc:
        raise Upstream(f"{url} could not be reached: {cause(exc)}.") from None
    if r.status_code == 404 or r.status_code == 410:
        raise Invalid(f"{url} answered HTTP {r.status_code}: there is no such file.")
    if r.status_code >= 400:
        raise Upstream(f"{url} answered HTTP {r.status_code}.")
    length = r.headers.get("content-length")
    size = (
        int(length) if length and length.isdigit() and "content-encoding" not in r.headers else None
    )
    return RemoteFile(path=source.pattern or "file", url=url, size=size, sha256=sha256)


def _local(source: Source, roots: tuple[str, ...]) -> tuple[RemoteFile, ...]:
    if not roots:
        raise Invalid(
            "The mirror reads no folder of its host: set LLMGW_MIRROR_SOURCES to the folders "
            "it may add weights from."
        )
    real = os.path.realpath(source.path or "")
    if not inside(real, roots):
        raise Invalid(
            f"{source.text} is outside the folders the mirror may read "
            f"(LLMGW_MIRROR_SOURCES: {os.pathsep.join(roots)})."
        )
    path = Path(real)
    if path.is_file():
        return (RemoteFile(path=path.name, url=path.as_uri(), size=path.stat().st_size),)
    if not path.is_dir():
        raise Invalid(f"{source.text} is neither a file nor a folder on the mirror's host.")
    found = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            full = Path(dirpath) / name
            if not full.is_file() or not inside(os.path.realpath(full), roots):
                continue
            rel = full.relative_to(path).as_posix()
            # The file a link points at, as checked: what the worker reads, checked again.
            real = Path(os.path.realpath(full))
            found.append(RemoteFile(path=rel, url=real.as_uri(), size=real.stat().st_size))
    if not found:
        raise Invalid(f"The folder {source.text} holds no files.")
    return tuple(found)
