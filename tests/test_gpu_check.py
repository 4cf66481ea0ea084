"""benchmarks/gpu_check.py where there is no NVIDIA GPU (as on every CI machine so far): it
says so in a sentence and starts nothing; with a driver that answers, it reads the cards."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_smi(tmp_path: Path, body: str) -> Path:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)
    return smi


def test_without_nvidia_smi_it_exits_with_a_sentence_and_starts_nothing(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "LLMGW_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "No NVIDIA GPU here: nvidia-smi is not on PATH, so there is no NVIDIA driver. "
        "benchmarks/gpu_check.py needs a machine with an NVIDIA GPU and its driver.\n"
    )
    assert not (tmp_path / "home").exists()


def test_a_driver_that_does_not_answer_is_said_with_its_own_words(tmp_path, gpu_check):
    smi = fake_smi(
        tmp_path,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."'
        "\nexit 9",
    )
    with pytest.raises(gpu_check.NoGpu) as said:
        gpu_check.gpus_here(str(smi))
    assert str(said.value) == (
        "No NVIDIA GPU usable here: nvidia-smi exited 9 listing none: NVIDIA-SMI has failed "
        "because it couldn't communicate with the NVIDIA driver."
    )


def test_the_cards_nvidia_smi_lists_are_read(tmp_path, gpu_check):
    smi = fake_smi(tmp_path, 'echo "0, NVIDIA H100 80GB HBM3, 81559"')
    assert gpu_check.gpus_here(str(smi)) == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
    ]
