"""What the mirror takes as a release of llmgw, and an agent installs: a wheel holding the
`llmgw` package at the version it is declared as; anything else a sentence (issue 35)."""

from __future__ import annotations

import pytest

from mirror.domain.releases import wheel_name, wheel_refusal
from tests.mirror.wheels import wheel

GOOD = {"llmgw/__init__.py": "", "llmgw/__main__.py": "", "fleet/__init__.py": ""}


def test_a_wheel_of_llmgw_at_its_version_is_a_release(tmp_path):
    path = wheel(tmp_path, "0.12.0+local-1", files=GOOD)
    assert path.name == wheel_name("0.12.0+local-1")
    assert wheel_refusal(path, version="0.12.0+local-1", filename=path.name) == ""


@pytest.mark.parametrize(
    ("made", "filename", "said"),
    [
        ({"files": {"evil/__init__.py": ""}}, None, "does not hold the llmgw package"),
        ({"files": {"llmgw.py": ""}}, None, "does not hold the llmgw package"),
        ({"files": GOOD, "declared": "0.12.1"}, None, "holds llmgw 0.12.1, not 0.12.0"),
        ({"files": GOOD, "dist": "requests"}, None, "is a wheel of requests, not of llmgw"),
        ({"files": GOOD}, "llmgw-0.12.0.zip", "is not named as a wheel of llmgw 0.12.0"),
        ({"files": GOOD}, "llmgw-0.11.0-py3-none-any.whl", "is not named as a wheel"),
        ({"files": GOOD}, "llmgw-0.12.0-cp311-cp311-linux_x86_64.whl", "is not named as"),
        ({"files": GOOD}, "", "is not named as a wheel of llmgw 0.12.0"),
    ],
)
def test_anything_else_is_refused_with_a_sentence(tmp_path, made, filename, said):
    path = wheel(tmp_path, "0.12.0", **made)
    why = wheel_refusal(
        path, version="0.12.0", filename=path.name if filename is None else filename
    )
    assert said in why


def test_a_file_that_is_no_zip_is_not_a_wheel(tmp_path):
    path = tmp_path / wheel_name("0.12.0")
    path.write_bytes(b"#!/bin/sh\nid\n")
    assert wheel_refusal(path, version="0.12.0", filename=path.name) == (
        "llmgw-0.12.0-py3-none-any.whl is not a wheel: it is not a zip archive that can be read"
    )


def test_a_wheel_with_no_metadata_or_two_is_refused(tmp_path):
    import zipfile

    path = tmp_path / wheel_name("0.12.0")
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("llmgw/__init__.py", "")
    assert "has no *.dist-info/METADATA" in wheel_refusal(
        path, version="0.12.0", filename=path.name
    )
    with zipfile.ZipFile(path, "a") as out:
        out.writestr("llmgw-0.12.0.dist-info/METADATA", "Name: llmgw\nVersion: 0.12.0\n")
        out.writestr("other-1.dist-info/METADATA", "Name: other\nVersion: 1\n")
    assert "has 2 *.dist-info/METADATA" in wheel_refusal(path, version="0.12.0", filename=path.name)
