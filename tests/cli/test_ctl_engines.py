"""``llmgw ctl engines`` against the real REST API: a binary uploaded with the version it
says, listed, refused with the server's sentence, removed."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import httpx
import pytest

from llmgw.cli import ctl
from mirror import store
from mirror.domain.platforms import this_platform
from mirror.models import EngineBuild
from tests.cli.helpers import table

pytestmark = pytest.mark.django_db

SCRIPT = b"#!/bin/sh\necho 'version: 6000 (abc1234)'\n"


@pytest.fixture(autouse=True)
def mirror_dir(settings, tmp_path):
    mirror = replace(settings.LLMGW.mirror, dir=tmp_path / "mirror")
    settings.LLMGW = replace(settings.LLMGW, mirror=mirror)


@pytest.fixture
def uploads(server):
    """The API server, reading an upload's streamed body before handing it on."""

    def handle(request: httpx.Request) -> httpx.Response:
        request.read()
        return server.handler(request)

    return httpx.MockTransport(handle)


@pytest.fixture
def binary(tmp_path):
    path = tmp_path / "llama-server"
    path.write_bytes(SCRIPT)
    path.chmod(0o755)
    return path


def run(capsys, transport, *argv):
    code = ctl.main(list(argv), transport=transport)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_binary_is_added_with_the_version_it_says_listed_and_removed(capsys, uploads, binary):
    digest = hashlib.sha256(SCRIPT).hexdigest()
    code, out, err = run(capsys, uploads, "engines", "add", "--file", str(binary))
    assert (code, err) == (0, "")
    build = EngineBuild.objects.get()
    assert out == (
        f"engine build {build.pk}: llamacpp 6000 (abc1234) for {this_platform()}, "
        f"{len(SCRIPT)} B, sha256 {digest}\n"
    )
    assert store.blob(digest).read_bytes() == SCRIPT

    _, out, _ = run(capsys, uploads, "engines", "list")
    rows = table(out)
    assert rows[0][:5] == ["ID", "ENGINE", "VERSION", "PLATFORM", "SIZE"]
    assert rows[1][:3] == [str(build.pk), "llamacpp", "6000 (abc1234)"]

    code, out, _ = run(capsys, uploads, "engines", "rm", str(build.pk))
    assert code == 0 and out.startswith(f"engine build {build.pk} removed")
    assert not EngineBuild.objects.exists()


def test_a_digest_that_does_not_match_is_the_servers_sentence(capsys, uploads, binary):
    code, _, err = run(
        capsys,
        uploads,
        "engines",
        "add",
        "--file",
        str(binary),
        "--version",
        "b1",
        "--sha256",
        "0" * 64,
    )
    assert code == 1
    assert "does not match its digest" in err
    assert not EngineBuild.objects.exists()


def test_a_binary_that_says_no_version_must_be_given_one(capsys, uploads, tmp_path):
    mute = tmp_path / "mute"
    mute.write_bytes(b"#!/bin/sh\nexit 0\n")
    mute.chmod(0o755)
    code, _, err = run(capsys, uploads, "engines", "add", "--file", str(mute))
    assert code == 1
    assert "Give its version with --version." in err


def test_no_builds_says_how_to_add_one(capsys, uploads):
    _, out, _ = run(capsys, uploads, "engines", "list")
    assert out.startswith("No engine builds yet: llmgw engines build llamacpp")
