"""Engine builds in the mirror: added from a file with its digest checked, listed, removed.
What placement and ``start_shard`` read of them is in mirror/selectors.py.

A build's bytes are a blob of the same store weights use (``store.blob``), so the mirror's
file server hands them to agents as it does weights. A node that lacks an engine the mirror
holds a build of for its platform installs it from there (fleet/agent/install.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from django.db import IntegrityError, transaction

from llmgw.core.errors import Conflict, Invalid, NotFound

from . import store
from .domain.platforms import BINARY_ENGINES, PLATFORM, RELEASE, RELEASE_PLATFORM, this_platform
from .domain.releases import wheel_refusal
from .models import EngineBuild, WeightFile

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# A version is shown and kept as the engine says it; a folder name is made of it on nodes.
_VERSION = re.compile(r"^[^\x00-\x1f\x7f/\\]{1,100}$")
CHUNK = 1 << 20


def _checked(engine: str, version: str, platform: str, sha256: str) -> tuple[str, str, str, str]:
    engine = (engine or "").strip()
    if engine not in BINARY_ENGINES and engine != RELEASE:
        known = ", ".join(sorted(BINARY_ENGINES))
        raise Invalid(
            f"The mirror holds builds of {known} (and {RELEASE}'s own releases) only, not "
            f"{engine or '(no engine)'!r}; "
            "vLLM is installed with pip by each GPU node, the version LLMGW_VLLM_VERSION pins."
        )
    version = (version or "").strip()
    if not _VERSION.match(version):
        raise Invalid(
            "version must be 1 to 100 characters with no slash or control character "
            "(what the engine's --version says)."
        )
    platform = (
        RELEASE_PLATFORM if engine == RELEASE else (platform or "").strip() or this_platform()
    )
    if not PLATFORM.match(platform):
        raise Invalid(f"platform {platform!r} is not <os>-<machine>, such as linux-x86_64.")
    digest = (sha256 or "").strip().lower()
    if digest and not _HEX64.match(digest):
        raise Invalid("sha256 must be 64 hexadecimal digits.")
    return engine, version, platform, digest


def engine_build_add(
    *,
    data: BinaryIO,
    engine: str,
    version: str,
    platform: str = "",
    sha256: str = "",
    filename: str = "",
    actor: str,
    now: datetime,
) -> tuple[EngineBuild, bool]:
    """Keep the binary read from ``data`` as a build of ``engine``; returns (build, created).

    The bytes are hashed as they are copied into the store; when ``sha256`` is given and
    does not match, nothing is kept. A release of llmgw must be its wheel, ``filename``,
    holding the llmgw package at ``version``: agents install it and restart into it. The
    same build added again is the same build. An empty platform is the control plane's
    own. Raises Invalid for a bad field, an empty file, a digest that does not match or a
    release that is not llmgw's; Conflict when another binary holds that name.
    """
    engine, version, platform, expected = _checked(engine, version, platform, sha256)
    existing = EngineBuild.objects.filter(engine=engine, version=version, platform=platform).first()
    part = store.root() / "partial" / f"engine-{uuid.uuid4().hex}.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    try:
        digest, size = _copy(data, part)
        if size == 0:
            raise Invalid("The file is empty: an engine build is its binary; nothing was kept.")
        if expected and digest != expected:
            raise Invalid(
                f"The file does not match its digest: expected sha256 {expected}, got {digest} "
                f"over {size:,} bytes; nothing was kept."
            )
        if engine == RELEASE and (why := wheel_refusal(part, version=version, filename=filename)):
            raise Invalid(f"{why}; nothing was kept.")
        if existing is not None:
            if existing.sha256 == digest:
                return existing, False
            raise Conflict(
                f"The mirror already holds {engine} {version} for {platform} as another binary "
                f"(sha256 {existing.sha256}); remove it first: llmgw ctl engines rm {existing.pk}."
            )
        blob = store.blob(digest)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            os.replace(part, blob)
    finally:
        part.unlink(missing_ok=True)
    try:
        with transaction.atomic():
            build = EngineBuild.objects.create(
                engine=engine,
                version=version,
                platform=platform,
                sha256=digest,
                size=size,
                added_by=actor[:64],
                added_at=now,
            )
    except IntegrityError:
        # Added by another request between the look and the write.
        return EngineBuild.objects.get(engine=engine, version=version, platform=platform), False
    return build, True


def engine_build_add_file(*, path: Path, **fields) -> tuple[EngineBuild, bool]:
    """``engine_build_add`` from a file on this host (``llmgw engines build``)."""
    try:
        with open(path, "rb") as data:
            return engine_build_add(data=data, filename=path.name, **fields)
    except OSError as exc:
        raise Invalid(f"{path} cannot be read: {exc.strerror or exc}.") from None


def _copy(data: BinaryIO, part: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(part, "wb") as out:
        while block := data.read(CHUNK):
            h.update(block)
            out.write(block)
            size += len(block)
        out.flush()
        os.fsync(out.fileno())
    return h.hexdigest(), size


def engine_build_remove(*, build_id: int) -> None:
    """Forget a build, and its blob when no other build or weights file has those bytes.

    Nodes that installed it keep their copy. Raises NotFound for an unknown id.
    """
    build = EngineBuild.objects.filter(pk=build_id).first()
    if build is None:
        raise NotFound(f"There is no engine build {build_id}.")
    digest = build.sha256
    build.delete()
    shared = (
        EngineBuild.objects.filter(sha256=digest).exists()
        or WeightFile.objects.filter(sha256=digest).exists()
    )
    if not shared:
        store.blob(digest).unlink(missing_ok=True)


def engine_builds_list() -> list[dict]:
    """Every build, by engine and platform, the newest first within each."""
    return [
        {
            "id": b.pk,
            "engine": b.engine,
            "version": b.version,
            "platform": b.platform,
            "sha256": b.sha256,
            "size": b.size,
            "added_by": b.added_by,
            "added_at": b.added_at,
        }
        for b in EngineBuild.objects.all()
    ]
