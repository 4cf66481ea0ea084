"""`llmgw engines build llamacpp --add` on the control plane's host: the cached build goes
into the mirror, from where nodes lacking llama.cpp install it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from llmgw.cli import engines, main as llmgw
from mirror import store
from mirror.models import EngineBuild

pytestmark = pytest.mark.django_db

BINARY = b"#!/bin/sh\necho 'version: 7001 (fake01)'\n"


@pytest.fixture
def cached(tmp_path, monkeypatch, settings):
    """A build already in the cache, as a first run of `engines build` leaves it."""
    mirror = replace(settings.LLMGW.mirror, dir=tmp_path / "mirror")
    settings.LLMGW = replace(settings.LLMGW, mirror=mirror)
    monkeypatch.setenv(engines.CACHE_ENV, str(tmp_path / "cache"))
    entry = engines.llamacpp_dir()
    (entry / "bin").mkdir(parents=True)
    binary = entry / "bin" / "llama-server"
    binary.write_bytes(BINARY)
    binary.chmod(0o755)
    build = engines.Build(
        engine="llamacpp",
        path=str(binary),
        version="7001 (fake01)",
        sha256=hashlib.sha256(BINARY).hexdigest(),
        size=len(BINARY),
        source="test",
        cmake_flags=[],
        built_at="2026-03-02T09:00:00+00:00",
    )
    (entry / "build.json").write_text(json.dumps(build.__dict__))
    return build


def test_add_puts_the_build_in_the_mirror_once(cached, capsys):
    assert llmgw(["engines", "build", "llamacpp", "--add"]) == 0
    added = EngineBuild.objects.get()
    assert (added.engine, added.version, added.sha256) == (
        "llamacpp",
        cached.version,
        cached.sha256,
    )
    assert store.blob(cached.sha256).read_bytes() == BINARY
    assert f"Added to the mirror as engine build {added.pk}" in capsys.readouterr().out

    assert llmgw(["engines", "build", "llamacpp", "--add", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["mirror_id"] == added.pk
    assert f"Already in the mirror as engine build {added.pk}" in captured.err
    assert EngineBuild.objects.count() == 1


def test_without_add_the_mirror_is_left_alone(cached, capsys):
    assert llmgw(["engines", "build", "llamacpp"]) == 0
    assert not EngineBuild.objects.exists()
