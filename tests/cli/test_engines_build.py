"""`llmgw engines build llamacpp`: a real cmake build of a small stand-in for llama.cpp's tree,
into a cache that a second run finds at once."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from llmgw.cli import engines, main as llmgw

pytestmark = pytest.mark.skipif(
    not (shutil.which("cmake") and shutil.which("cc")),
    reason="needs cmake and a C compiler (apt-get install cmake g++)",
)

# A tree that builds the target `llama-server` into build/bin, as llama.cpp's does.
CMAKE = """cmake_minimum_required(VERSION 3.14)
project(fake_llama C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server server.c)
"""
SERVER = """#include <stdio.h>
int main(int argc, char **argv) {
    fprintf(stderr, "load_backend: loaded CPU backend\\nversion: 7001 (fake01)\\n");
    return 0;
}
"""


def tree(root: Path, server: str = SERVER) -> Path:
    root.mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(CMAKE)
    (root / "server.c").write_text(server)
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(engines.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "llamacpp" / engines.LLAMA_CPP_PYTHON_VERSION


def test_the_cache_is_outside_the_clone_and_keyed_by_the_pinned_version(monkeypatch, tmp_path):
    monkeypatch.delenv(engines.CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert engines.llamacpp_dir() == tmp_path / ".cache/llmgw/engines/llamacpp/0.3.36"
    monkeypatch.setenv(engines.CACHE_ENV, "/srv/builds")
    assert engines.llamacpp_dir() == Path("/srv/builds/llamacpp/0.3.36")


def test_a_build_makes_the_binary_and_says_where_it_is_its_version_and_digest(
    cache, tmp_path, capsys
):
    source = tree(tmp_path / "llama.cpp")
    assert llmgw(["engines", "build", "llamacpp", "--source", str(source), "-j", "2"]) == 0
    out = capsys.readouterr().out
    binary = cache / "bin" / "llama-server"
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    assert "Configuring llama.cpp with cmake" in out
    assert "Building llama-server with 2 job(s)" in out
    assert f"path:    {binary}\n" in out
    assert "version: 7001 (fake01)\n" in out
    assert f"sha256:  {digest}\n" in out
    # The source tree is left as it was: the build is made elsewhere.
    assert sorted(p.name for p in source.iterdir()) == ["CMakeLists.txt", "server.c"]
    # What was made, for whoever hands it on (the mirror, later).
    recorded = json.loads((cache / "build.json").read_text())
    assert recorded["path"] == str(binary)
    assert recorded["sha256"] == digest
    assert recorded["cmake_flags"] == list(engines.CMAKE_FLAGS)
    assert "-DBUILD_SHARED_LIBS=OFF" in recorded["cmake_flags"]
    # The work tree is gone; the binary, its record and the log stay.
    assert sorted(p.name for p in cache.iterdir()) == ["bin", "build.json", "build.log", "lock"]


def test_a_second_run_finds_the_cached_binary_without_building(
    cache, tmp_path, capsys, monkeypatch
):
    source = tree(tmp_path / "llama.cpp")
    assert llmgw(["engines", "build", "llamacpp", "--source", str(source)]) == 0
    capsys.readouterr()
    # No cmake, no compiler, no source: only the cache can answer.
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert llmgw(["engines", "build", "llamacpp", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["cached"] is True
    assert answer["path"] == str(cache / "bin" / "llama-server")
    assert llmgw(["engines", "build", "llamacpp"]) == 0
    assert capsys.readouterr().out.startswith(f"llama-server is already built, in {cache}:")


def test_a_cached_binary_that_is_not_the_one_recorded_is_built_again(cache, tmp_path, capsys):
    source = tree(tmp_path / "llama.cpp")
    assert llmgw(["engines", "build", "llamacpp", "--source", str(source)]) == 0
    binary = cache / "bin" / "llama-server"
    binary.write_bytes(b"#!/bin/sh\necho version: 1 (tampered)\n")
    capsys.readouterr()
    assert llmgw(["engines", "build", "llamacpp", "--source", str(source)]) == 0
    assert "Built llama-server" in capsys.readouterr().out
    assert b"tampered" not in binary.read_bytes()


def test_an_sdist_is_unpacked_and_its_vendored_llama_cpp_built(cache, tmp_path, capsys):
    top = tmp_path / "sdist" / "llama_cpp_python-0.3.36"
    tree(top / "vendor" / "llama.cpp")
    (top / "setup.py").write_text("")
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    assert llmgw(["engines", "build", "llamacpp", "--source", str(sdist)]) == 0
    assert "Unpacking llama_cpp_python-0.3.36.tar.gz" in capsys.readouterr().out
    assert (cache / "bin" / "llama-server").is_file()


def test_an_archive_without_llama_cpp_in_it_is_refused_with_a_sentence(cache, tmp_path, capsys):
    sdist = tmp_path / "other-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        info = tarfile.TarInfo("other-1.0/setup.py")
        tar.addfile(info, io.BytesIO(b""))
    assert llmgw(["engines", "build", "llamacpp", "--source", str(sdist)]) == 1
    err = capsys.readouterr().err
    assert "other-1.0.tar.gz holds no vendor/llama.cpp with a CMakeLists.txt." in err
    assert not (cache / "build.json").exists()


def test_without_cmake_it_says_which_packages_to_install(cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert llmgw(["engines", "build", "llamacpp"]) == 1
    err = capsys.readouterr().err
    assert "this machine has no cmake, no c++, no cc." in err
    assert "apt-get install cmake g++" in err


def test_a_failed_compile_shows_the_end_of_its_log_and_caches_nothing(cache, tmp_path, capsys):
    source = tree(tmp_path / "llama.cpp", server="int main(void) { return nope; }\n")
    assert llmgw(["engines", "build", "llamacpp", "--source", str(source)]) == 1
    err = capsys.readouterr().err
    assert "`cmake --build " in err and "failed (exit" in err
    assert f"the end of {cache / 'build.log'}:" in err
    assert "nope" in err  # the compiler's own words
    assert not (cache / "build.json").exists()
    assert not (cache / "bin" / "llama-server").exists()


def test_unknown_engines_and_commands_are_refused(cache, capsys):
    with pytest.raises(SystemExit) as exc:
        llmgw(["engines", "build", "tensorrt"])
    assert exc.value.code == 2
    assert llmgw(["engines", "frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
