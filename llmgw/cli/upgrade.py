"""`llmgw upgrade VERSION [--service UNIT] [--wheel FILE]`: upgrade this machine's llmgw by
hand, for a host `llmgw ctl upgrade` does not reach (the mirror's host, a `llmgw serve`
host, a Celery worker's); `llmgw upgrade --rollback [--service UNIT]` brings back the
release the last upgrade replaced.

The release's wheel comes from the mirror this host holds (its database and
LLMGW_MIRROR_DIR), or from `--wheel FILE`; its SHA-256 is checked, the release it replaces
is kept as a wheel made from its installed files (in `llmgw-previous/` under the
environment), it is installed into this llmgw's own environment with pip, and `--service`
is restarted with systemctl and watched until it has stayed active, as the seed's
`llmgw upgrade` does. It runs as root (sudo), as the seed's does: it replaces the files of
a service's environment and restarts the service.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from fleet.agent.upgrade import pip_argv, pip_refusal
from mirror.domain.releases import wheel_name

from .engines import sha256_of

# How long a restarted unit has to be seen active three checks in a row.
SERVICE_WAIT_S = 30.0
CHECK_EVERY_S = 2.0
# Where the release an upgrade replaced is kept, under this llmgw's environment (sys.prefix).
PREVIOUS = "llmgw-previous"

# A release as the seed names it (v1.2.3, v1.2.3-rc.4) or as pip does (1.2.3, 1.2.3rc4,
# 1.2.3.dev0, with a local label such as +next): three numbers, then what PEP 440 allows.
_RELEASE = re.compile(
    r"^v?(?P<release>\d+\.\d+\.\d+)"
    r"(?:-rc\.(?P<rc>\d+)|(?P<pep440>(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?))"
    r"(?P<local>\+[a-z0-9]+(?:\.[a-z0-9]+)*)?$"
)


class UpgradeFailed(Exception):
    pass


def release_version(text: str) -> str | None:
    """The release `text` names, as pip spells it (v1.2.3-rc.4 is 1.2.3rc4); None when it is
    not a release version."""
    match = _RELEASE.match(text.strip())
    if match is None:
        return None
    pre = f"rc{int(match['rc'])}" if match["rc"] is not None else match["pep440"]
    return f"{match['release']}{pre}{match['local'] or ''}"


def root_refusal(euid: int) -> str:
    """ "" for root; else the sentence that says to run it with sudo."""
    if euid == 0:
        return ""
    return (
        "llmgw upgrade replaces this machine's llmgw and restarts its service, which needs "
        "root: run it with sudo; nothing was changed"
    )


def main(argv: list[str], *, euid: Callable[[], int] = os.geteuid) -> int:
    """Run `llmgw upgrade`; `euid` says who runs it (tests give another)."""
    parser = argparse.ArgumentParser(
        prog="llmgw upgrade",
        description="Upgrade this machine's llmgw, and restart the service that runs it; the "
        "release it replaces is kept, and --rollback brings it back. Run it with sudo. "
        "The nodes are upgraded with `llmgw ctl upgrade`.",
    )
    parser.add_argument(
        "version", nargs="?", help="the release, such as v0.12.0, v0.12.0-rc.1 or 0.12.0"
    )
    parser.add_argument(
        "--rollback",
        action="store_true",
        help="bring back the release the last upgrade replaced (kept in "
        f"{Path(sys.prefix) / PREVIOUS}), and restart --service",
    )
    parser.add_argument("--service", help="the systemd unit to restart afterwards (llmgw-serve)")
    parser.add_argument("--wheel", type=Path, help="the release's wheel (default: the mirror's)")
    parser.add_argument("--sha256", help="the wheel's digest, checked (with --wheel)")
    args = parser.parse_args(argv)
    try:
        if args.rollback:
            if args.version or args.wheel:
                raise UpgradeFailed(
                    "--rollback takes no version or wheel: it brings back the kept one"
                )
            _must_be_root(euid())
            _rollback()
        else:
            _upgrade(args, euid)
        if args.service:
            _restart(args.service)
            print(f"{args.service} restarted and running")
    except UpgradeFailed as exc:
        print(f"llmgw upgrade: {exc}", file=sys.stderr)
        return 1
    return 0


def _must_be_root(euid: int) -> None:
    refusal = root_refusal(euid)
    if refusal:
        raise UpgradeFailed(refusal)


def _upgrade(args: argparse.Namespace, euid: Callable[[], int]) -> None:
    """Install release args.version, keeping the one it replaces."""
    from llmgw.core.version import installed

    if not args.version:
        raise UpgradeFailed("name the release to upgrade to (llmgw upgrade v1.2.3), or --rollback")
    version = release_version(args.version)
    if version is None:
        raise UpgradeFailed(
            f"{args.version!r} is not a release version (v1.2.3 or v1.2.3-rc.4); nothing was changed"
        )
    before = installed()
    if before == version:
        print(f"this machine already runs llmgw {version}")
        return
    _must_be_root(euid())
    wheel, digest = _wheel(args, version)
    kept = keep_installed(Path(sys.prefix) / PREVIOUS)
    _install(wheel, version, digest)
    print(
        f"llmgw {before} -> {version}: installed into {sys.prefix}, sha256 {digest}; "
        f"llmgw {before} is kept in {kept} (llmgw upgrade --rollback brings it back)"
    )


def _rollback() -> None:
    """Install the kept release, keeping the one it replaces in its place."""
    from llmgw.core.version import installed

    folder = Path(sys.prefix) / PREVIOUS
    kept = sorted(folder.glob("llmgw-*.whl")) if folder.is_dir() else []
    if not kept:
        raise UpgradeFailed(
            f"no earlier release is kept in {folder}: llmgw upgrade keeps the one it replaces, "
            "and none has run here; nothing was changed"
        )
    before = installed()
    with tempfile.TemporaryDirectory(prefix="llmgw-rollback-") as spare:
        # Moved aside first: keeping the running release writes into the same folder.
        wheel = Path(shutil.move(kept[-1], spare))
        version = _wheel_version(wheel)
        try:
            keep_installed(folder)
            _install(wheel, version, sha256_of(wheel))
        except UpgradeFailed:
            shutil.copy2(wheel, folder / wheel.name)
            raise
    print(
        f"llmgw {before} -> {version}: rolled back, into {sys.prefix}; "
        f"llmgw {before} is kept in {folder} in its place"
    )


def _wheel_version(wheel: Path) -> str:
    """The version a kept wheel holds, from its METADATA."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(name).decode("utf-8").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    raise UpgradeFailed(f"{wheel} names no version")


def keep_installed(folder: Path, dist: metadata.Distribution | None = None) -> Path:
    """Make a wheel of the installed llmgw (or of `dist`) from its files, as pip's RECORD
    lists them, in `folder`, replacing what was kept there; its path. UpgradeFailed when
    llmgw was not installed from a wheel (a source checkout, `pip install -e`), which has
    nothing to keep."""
    if dist is None:
        try:
            dist = metadata.distribution("llmgw")
        except metadata.PackageNotFoundError:
            raise UpgradeFailed("llmgw is not installed here; nothing was changed") from None
    site = Path(str(dist.locate_file("")))
    files = [f for f in dist.files or () if _kept(f, site)]
    record = next((str(f) for f in files if str(f).endswith(".dist-info/RECORD")), None)
    if record is None or not any(f.parts[0] == "llmgw" for f in files):
        raise UpgradeFailed(
            f"llmgw {dist.version} runs from a source checkout, not an installed release, so "
            "there is nothing to keep for --rollback; nothing was changed"
        )
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    target = folder / wheel_name(dist.version)
    partial = target.with_suffix(".partial")
    lines = []
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            name = str(f)
            if name == record:
                continue
            data = (site / name).read_bytes()
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            lines.append(f"{name},sha256={digest.decode()},{len(data)}")
        z.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
    for old in folder.glob("llmgw-*.whl"):
        old.unlink()
    partial.rename(target)
    return target


def _kept(f: metadata.PackagePath, site: Path) -> bool:
    """Whether an installed file belongs in the wheel: inside site-packages, not compiled,
    not what pip writes about the install itself (scripts it makes again from the entry
    points)."""
    name = str(f)
    if name.startswith("..") or "__pycache__" in f.parts or name.endswith(".pyc"):
        return False
    if f.parts[0].endswith(".dist-info") and f.name in (
        "INSTALLER",
        "REQUESTED",
        "direct_url.json",
    ):
        return False
    if f.parts[0] == "bin":
        return False
    return (site / name).is_file()


def _wheel(args: argparse.Namespace, version: str) -> tuple[Path, str]:
    """The wheel's path and the digest it must have."""
    if args.wheel is not None:
        if not args.wheel.is_file():
            raise UpgradeFailed(f"{args.wheel} is not a file")
        return args.wheel, (args.sha256 or "").strip().lower() or sha256_of(args.wheel)
    from .django_setup import setup_django

    setup_django()
    from llmgw.core.errors import NotFound
    from mirror import store
    from mirror.selectors import release_get

    try:
        build = release_get(version)
    except NotFound as exc:
        raise UpgradeFailed(f"{exc} Or give it with --wheel FILE.") from None
    return store.blob(build.sha256), build.sha256


def _install(wheel: Path, version: str, digest: str) -> None:
    got = sha256_of(wheel)
    if got != digest:
        raise UpgradeFailed(f"{wheel} has sha256 {got}, not {digest}: nothing was installed")
    with tempfile.TemporaryDirectory(prefix="llmgw-upgrade-") as folder:
        # pip takes a wheel by its file name: the mirror keeps it by digest.
        named = Path(folder) / wheel_name(version)
        shutil.copyfile(wheel, named)
        done = subprocess.run(pip_argv(named), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        why = pip_refusal(done.stderr or done.stdout, done.returncode)
        raise UpgradeFailed(f"installing llmgw {version} failed: {why}")


def _restart(unit: str) -> None:
    done = subprocess.run(["systemctl", "restart", unit], capture_output=True, text=True)
    if done.returncode != 0:
        raise UpgradeFailed(f"restarting {unit}: {(done.stderr or done.stdout).strip()}")
    # Active, and still active a few checks on: a unit that starts and dies on a bad
    # setting is "active" for a moment first.
    deadline = time.monotonic() + SERVICE_WAIT_S
    steady = 0
    while time.monotonic() < deadline:
        state = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True)
        steady = steady + 1 if state.stdout.strip() == "active" else 0
        if steady >= 3:
            return
        time.sleep(CHECK_EVERY_S)
    raise UpgradeFailed(
        f"{unit} is not running after the upgrade; see journalctl -u {unit}, and bring the "
        f"release it replaced back with: sudo llmgw upgrade --rollback --service {unit}"
    )
