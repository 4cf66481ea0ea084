"""An `upgrade` the control plane asks of this agent: fetch the release's wheel from the
mirror, check its SHA-256 and that it is llmgw's wheel of that version, install it beside
the running release and have a child process run `llmgw version` with it, and only then
install it into this agent's own environment and re-execute the agent with the same
arguments. Engines are not touched: they run in sessions of their own, are written in the
ledger, and the new agent adopts them (same pids).

The child is the point: a release that installs but does not start (no llmgw package in
it, a dependency it needs missing here) would otherwise be re-executed into, and the agent
would die with its node lost until mended by hand. Anything that fails leaves the
installed release as it was and says why in a sentence; the agent goes on running.
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

from mirror.domain.releases import wheel_name, wheel_refusal
from mirror.transfer import TransferError, fetch_from_mirror

log = logging.getLogger("llmgw.agent")

PIP_TIMEOUT_S = 300.0
# How long `llmgw version` may take with the new release: importing llmgw, no more.
TRY_TIMEOUT_S = 60.0
# Of what that child wrote to stderr, the last lines said (a traceback's are the why).
STDERR_LINES = 3
_VERSION = re.compile(r"^[0-9A-Za-z.+!_-]{1,40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class UpgradeError(Exception):
    """Why an upgrade did not happen, in a sentence; nothing changed."""


def pip_argv(wheel: Path, *, python: str = sys.executable, target: Path | None = None) -> list[str]:
    """Install `wheel` over `python`'s environment's llmgw, its dependencies left as they
    are; or, with `target`, into that folder alone, beside it."""
    where = ["--target", str(target)] if target else ["--force-reinstall"]
    argv = [python, "-m", "pip", "install", "--no-deps", *where]
    return [*argv, "--disable-pip-version-check", "--no-input", "--quiet", str(wheel)]


def pip_refusal(output: str, code: int) -> str:
    """Why pip did not install, from what it printed: its last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else f"pip exited with code {code}"


def start_refusal(*, version: str, code: int, out: str, err: str) -> str:
    """ "" when `llmgw version` run with a release exited 0 saying `version`; else why, with
    the last lines it wrote to stderr."""
    said = (out.strip().splitlines() or [""])[-1].strip()
    if code == 0 and said == version:
        return ""
    why = f"exited with code {code}" if code else f"said {said[:100] or 'nothing'}, not {version}"
    lines = [ln.strip()[:300] for ln in err.splitlines() if ln.strip()][-STDERR_LINES:]
    return f"`llmgw version` with it {why}" + (f": {' / '.join(lines)}" if lines else "")


def restart_argv() -> list[str]:
    """This agent's command line again, for os.execv (`python -m llmgw agent …`)."""
    return [sys.executable, "-m", "llmgw", *sys.argv[1:]]


class Upgrader:
    """Installs llmgw releases from the mirror into this agent's Python environment (that
    of `python`), each tried beside the running one first."""

    def __init__(
        self,
        state_dir: Path,
        *,
        server: str,
        bearer: Callable[[], str],
        pip_timeout_s: float = PIP_TIMEOUT_S,
        python: str = sys.executable,
    ) -> None:
        self.folder = state_dir / "releases"
        self.server = server
        self.bearer = bearer
        self.pip_timeout_s = pip_timeout_s
        self.python = python
        self.running = False

    async def install(self, msg: dict[str, Any]) -> str:
        """Fetch, check, try and install the release `msg` names; its version. UpgradeError
        for a bad message, a fetch or digest that failed, a file that is not the release,
        pip refusing, or a release that does not start: this environment is unchanged."""
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
        beside = self.folder / f"llmgw-{version}"
        try:
            wheel = await asyncio.to_thread(self._fetch, version, sha256, size)
            if why := wheel_refusal(wheel, version=version, filename=wheel.name):
                raise UpgradeError(f"llmgw {version} in the mirror is not its release: {why}")
            await self._try_beside(wheel, version, beside)
            await self._pip(wheel)
            await self._check_switched(version)
        finally:
            self.running = False
            shutil.rmtree(beside, ignore_errors=True)
            (self.folder / wheel_name(version)).unlink(missing_ok=True)
            shutil.rmtree(self.folder / "partial", ignore_errors=True)
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

    async def _try_beside(self, wheel: Path, version: str, beside: Path) -> None:
        """Install the release into `beside` alone and run `llmgw version` with it first on
        the path, this environment's dependencies behind it; UpgradeError unless it says
        `version`."""
        shutil.rmtree(beside, ignore_errors=True)
        await self._pip(wheel, target=beside)
        path = os.pathsep.join(p for p in (str(beside), os.environ.get("PYTHONPATH")) if p)
        # Run in `beside`: `python -m` puts its folder first on the path, and the agent's
        # own may hold another llmgw.
        if why := await self._start(version, cwd=beside, env={**os.environ, "PYTHONPATH": path}):
            raise UpgradeError(
                f"llmgw {version} does not start, tried beside this one: {why}; nothing was "
                "switched and this agent goes on running its release"
            )

    async def _check_switched(self, version: str) -> None:
        """This environment, now on the release, answers `llmgw version` with it: the last
        look before re-executing, which cannot be taken back."""
        if why := await self._start(version, cwd=self.folder):
            raise UpgradeError(
                f"llmgw {version} was installed into {sys.prefix} but does not start there: "
                f"{why}; this agent goes on running its release until it is restarted, and "
                "would not start again: install a release by hand (docs/upgrading.md)"
            )

    async def _start(self, version: str, **where: Any) -> str:
        """Why `llmgw version` run by `python` (in `where`: cwd, env) does not say
        `version`; "" when it does."""
        code, out, err = await self._run(
            [self.python, "-m", "llmgw", "version"],
            f"running llmgw {version}'s `llmgw version`",
            TRY_TIMEOUT_S,
            **where,
        )
        return start_refusal(version=version, code=code, out=out, err=err)

    async def _pip(self, wheel: Path, *, target: Path | None = None) -> None:
        where = f"beside this one in {target}" if target else f"into {sys.prefix}"
        code, out, err = await self._run(
            pip_argv(wheel, python=self.python, target=target),
            f"installing {wheel.name}",
            self.pip_timeout_s,
        )
        if code != 0:
            why = pip_refusal(f"{out}\n{err}", code)
            raise UpgradeError(f"installing {wheel.name} {where} failed: {why}")

    async def _run(
        self, argv: list[str], what: str, timeout_s: float, **where: Any
    ) -> tuple[int, str, str]:
        """Run `argv` to its end: its exit code, stdout and stderr. UpgradeError, the child
        killed, past `timeout_s`."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            **where,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise UpgradeError(f"{what} took more than {timeout_s:g} s") from None
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
