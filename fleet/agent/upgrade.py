"""An `upgrade` the control plane asks of this agent: fetch the release's wheel from the
mirror, check its SHA-256, install it into this agent's own environment, and re-execute
the agent with the same arguments. Engines are not touched: they run in sessions of
their own, are written in the ledger, and the new agent adopts them (same pids).

Anything that fails leaves the installed release as it was and says why in a sentence;
the agent goes on running.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mirror.transfer import TransferError, fetch_from_mirror

log = logging.getLogger("llmgw.agent")

PIP_TIMEOUT_S = 300.0
_VERSION = re.compile(r"^[0-9A-Za-z.+!_-]{1,40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class UpgradeError(Exception):
    """Why an upgrade did not happen, in a sentence; nothing changed."""


def wheel_name(version: str) -> str:
    """The file name pip wants for a pure-Python wheel of llmgw `version`."""
    return f"llmgw-{version.replace('-', '_')}-py3-none-any.whl"


def pip_argv(wheel: Path) -> list[str]:
    """Install `wheel` over this environment's llmgw, its dependencies left as they are."""
    argv = [sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall"]
    return [*argv, "--disable-pip-version-check", "--no-input", "--quiet", str(wheel)]


def pip_refusal(output: str, code: int) -> str:
    """Why pip did not install, from what it printed: its last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else f"pip exited with code {code}"


def restart_argv() -> list[str]:
    """This agent's command line again, for os.execv (`python -m llmgw agent …`)."""
    return [sys.executable, "-m", "llmgw", *sys.argv[1:]]


class Upgrader:
    """Installs llmgw releases from the mirror into this agent's Python environment."""

    def __init__(
        self,
        state_dir: Path,
        *,
        server: str,
        bearer: Callable[[], str],
        pip_timeout_s: float = PIP_TIMEOUT_S,
    ) -> None:
        self.folder = state_dir / "releases"
        self.server = server
        self.bearer = bearer
        self.pip_timeout_s = pip_timeout_s
        self.running = False

    async def install(self, msg: dict[str, Any]) -> str:
        """Fetch, check and install the release `msg` names; its version. UpgradeError for
        a bad message, a fetch or digest that failed, or pip refusing."""
        version, sha256, size = msg.get("version"), msg.get("sha256"), msg.get("size")
        if not (isinstance(version, str) and _VERSION.match(version)):
            raise UpgradeError(f"{version!r} is not a release version")
        if not (isinstance(sha256, str) and _HEX64.match(sha256)):
            raise UpgradeError("the release's sha256 is not 64 lowercase hexadecimal digits")
        if not (isinstance(size, int) and not isinstance(size, bool) and size > 0):
            raise UpgradeError("the release's size is not a number of bytes")
        if self.running:
            raise UpgradeError("an upgrade is already under way")
        self.running = True
        try:
            wheel = await asyncio.to_thread(self._fetch, version, sha256, size)
            await self._pip(wheel)
        finally:
            self.running = False
        return version

    def _fetch(self, version: str, sha256: str, size: int) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        wheel = self.folder / wheel_name(version)
        part = self.folder / f"{sha256}.part"
        dest = self.folder / sha256
        try:
            fetch_from_mirror(
                self.server,
                self.bearer(),
                f"/api/v1/mirror/files/{sha256}",
                dest=dest,
                part=part,
                sha256=sha256,
                size=size,
                what=f"llmgw {version}",
            )
        except TransferError as exc:
            raise UpgradeError(
                f"llmgw {version} could not be fetched from the mirror: {exc}"
            ) from None
        os.replace(dest, wheel)
        return wheel

    async def _pip(self, wheel: Path) -> None:
        proc = await asyncio.create_subprocess_exec(
            *pip_argv(wheel),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.pip_timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise UpgradeError(
                f"installing {wheel.name} took more than {self.pip_timeout_s:g} s"
            ) from None
        if proc.returncode != 0:
            why = pip_refusal(out.decode(errors="replace"), proc.returncode)
            raise UpgradeError(f"installing {wheel.name} into {sys.prefix} failed: {why}")
        wheel.unlink(missing_ok=True)
        shutil.rmtree(self.folder / "partial", ignore_errors=True)
