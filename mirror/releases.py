"""llmgw's own releases in the mirror: the wheels `llmgw ctl upgrade` has agents install.

A release is kept as an engine build is (engine `llmgw`, platform `python-any`), by its
SHA-256, and any node's credential may read it. The release this control plane runs is
offered without anyone adding it: its wheel is built once from the source it was
installed from (`pip wheel`) and kept. Another release is placed by the operator:
`llmgw ctl engines add --engine llmgw --version V --file llmgw-V-py3-none-any.whl`.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from llmgw.core.errors import Invalid, NotFound
from llmgw.core.version import installed

from .builds import engine_build_add_file
from .domain.platforms import RELEASE, RELEASE_PLATFORM
from .models import EngineBuild

# How long building this control plane's own wheel may take.
BUILD_TIMEOUT_S = 300


def release_view(build: EngineBuild) -> dict:
    return {"version": build.version, "sha256": build.sha256, "size": build.size}


def release_get(version: str) -> EngineBuild:
    """The release `version` in the mirror; NotFound saying how to add it."""
    build = EngineBuild.objects.filter(
        engine=RELEASE, platform=RELEASE_PLATFORM, version=version
    ).first()
    if build is None:
        raise NotFound(
            f"The mirror holds no llmgw {version}: add its wheel with llmgw ctl engines add "
            f"--engine llmgw --version {version} --file llmgw-{version}-py3-none-any.whl."
        )
    return build


def release_offer(*, version: str | None, actor: str, now: datetime) -> EngineBuild:
    """The release to upgrade to: `version` as the mirror holds it, or, without one, the
    release this control plane runs, its wheel built and kept on first asking."""
    own = installed()
    wanted = (version or "").strip() or own
    try:
        return release_get(wanted)
    except NotFound:
        if wanted != own:
            raise
    with tempfile.TemporaryDirectory(prefix="llmgw-release-") as folder:
        wheel = _own_wheel(Path(folder), own)
        build, _ = engine_build_add_file(
            path=wheel, engine=RELEASE, version=own, actor=actor, now=now
        )
    return build


def _own_wheel(folder: Path, version: str) -> Path:
    """This llmgw's wheel (release `version`), built from the source it runs from."""
    import llmgw

    source = Path(llmgw.__file__).resolve().parents[1]
    if not (source / "pyproject.toml").is_file():
        raise Invalid(
            f"This control plane runs llmgw {version} from an installed wheel, not from its "
            f"source, and cannot build that wheel: add it with llmgw ctl engines add --engine "
            f"llmgw --version {version} --file llmgw-{version}-py3-none-any.whl."
        )
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps"]
    try:
        done = subprocess.run(
            [*argv, "--quiet", "-w", str(folder), str(source)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise Invalid(
            f"Building llmgw {version}'s wheel took more than {BUILD_TIMEOUT_S} s."
        ) from None
    wheels = sorted(folder.glob("llmgw-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel was made"]
        raise Invalid(f"Building llmgw {version}'s wheel failed: {last[0][:300]}")
    return wheels[0]
