"""`llmgw upgrade VERSION [--service UNIT] [--wheel FILE]`: upgrade this machine's llmgw by
hand, for a host `llmgw ctl upgrade` does not reach (the mirror's host, a `llmgw serve`
host, a Celery worker's).

The release's wheel comes from the mirror this host holds (its database and
LLMGW_MIRROR_DIR), or from `--wheel FILE`; its SHA-256 is checked, it is installed into
this llmgw's own environment with pip, and `--service` is restarted with systemctl and
watched until it has stayed active, as the seed's `llmgw upgrade` does.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet.agent.upgrade import pip_argv, pip_refusal
from mirror.domain.releases import wheel_name

from .engines import sha256_of

# How long a restarted unit has to be seen active three checks in a row.
SERVICE_WAIT_S = 30.0
CHECK_EVERY_S = 2.0


class UpgradeFailed(Exception):
    pass


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="llmgw upgrade",
        description="Upgrade this machine's llmgw, and restart the service that runs it. "
        "The nodes are upgraded with `llmgw ctl upgrade`.",
    )
    parser.add_argument("version", help="the release, such as 0.12.0")
    parser.add_argument("--service", help="the systemd unit to restart afterwards (llmgw-serve)")
    parser.add_argument("--wheel", type=Path, help="the release's wheel (default: the mirror's)")
    parser.add_argument("--sha256", help="the wheel's digest, checked (with --wheel)")
    args = parser.parse_args(argv)
    from llmgw.core.version import installed

    try:
        if installed() == args.version:
            print(f"this machine already runs llmgw {args.version}")
        else:
            before = installed()
            wheel, digest = _wheel(args)
            _install(wheel, args.version, digest)
            print(f"llmgw {before} -> {args.version}: installed into {sys.prefix}, sha256 {digest}")
        if args.service:
            _restart(args.service)
            print(f"{args.service} restarted and running")
    except UpgradeFailed as exc:
        print(f"llmgw upgrade: {exc}", file=sys.stderr)
        return 1
    return 0


def _wheel(args) -> tuple[Path, str]:
    """The wheel's path and the digest it must have."""
    if args.wheel is not None:
        if not args.wheel.is_file():
            raise UpgradeFailed(f"{args.wheel} is not a file")
        return args.wheel, (args.sha256 or "").strip().lower() or sha256_of(args.wheel)
    from .django_setup import setup_django

    setup_django()
    from llmgw.core.errors import NotFound
    from mirror import store
    from mirror.releases import release_get

    try:
        build = release_get(args.version)
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
        f"{unit} is not running after the upgrade; see journalctl -u {unit}, and upgrade back "
        "with llmgw upgrade OLD_VERSION --wheel FILE"
    )
