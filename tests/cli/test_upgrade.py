"""`llmgw upgrade` by hand (issue 37, item 6): the versions it takes, root, and the release
it keeps for --rollback, made from a real pip install's files."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib import metadata

import pytest

from llmgw.cli import upgrade
from llmgw.cli.upgrade import keep_installed, release_version, root_refusal
from tests.mirror.wheels import wheel


@pytest.mark.parametrize(
    ("typed", "release"),
    [
        ("v1.2.3", "1.2.3"),
        ("v1.2.3-rc.4", "1.2.3rc4"),
        ("1.2.3", "1.2.3"),
        ("1.2.3rc4", "1.2.3rc4"),
        ("0.11.0.dev0+next", "0.11.0.dev0+next"),
        (" v0.12.0 ", "0.12.0"),
        ("not-a-version", None),
        ("1.2", None),
        ("v1.2.3-rc", None),
        ("v1.2.3-beta.1", None),
        ("latest", None),
        ("", None),
    ],
)
def test_a_release_is_three_numbers_and_what_may_follow_them(typed, release):
    assert release_version(typed) == release


def test_only_root_may_upgrade():
    assert root_refusal(0) == ""
    assert "run it with sudo" in root_refusal(1000)


def test_a_version_not_of_a_release_is_refused_before_anything_is_read(capsys, tmp_path):
    code = upgrade.main(["not-a-version", "--wheel", str(tmp_path / "nonexistent")])
    err = capsys.readouterr().err
    assert code == 1
    assert "'not-a-version' is not a release version (v1.2.3 or v1.2.3-rc.4)" in err
    assert "is not a file" not in err


def test_not_root_is_told_to_use_sudo_and_nothing_is_installed(capsys, tmp_path):
    given = wheel(tmp_path, "9.9.9")
    code = upgrade.main(["v9.9.9", "--wheel", str(given)], euid=lambda: 1000)
    assert code == 1
    assert "needs root: run it with sudo; nothing was changed" in capsys.readouterr().err


def test_rollback_with_nothing_kept_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert upgrade.main(["--rollback"], euid=lambda: 0) == 1
    err = capsys.readouterr().err
    assert f"no earlier release is kept in {tmp_path / 'llmgw-previous'}" in err
    assert upgrade.main(["--rollback"], euid=lambda: 1000) == 1
    assert "run it with sudo" in capsys.readouterr().err


def test_the_kept_release_is_a_wheel_pip_installs_again_as_it_was(tmp_path):
    # Installed by pip as a release is, then kept from its installed files alone.
    site = tmp_path / "site"
    given = wheel(tmp_path / "given", "1.4.2", files={
        "llmgw/__init__.py": '__version__ = "1.4.2"\n',
        "llmgw/data/page.html": "<p>kept</p>\n",
        "catalog/__init__.py": "",
    })  # fmt: skip
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--no-input"]
    subprocess.run([*pip, "--target", str(site), str(given)], check=True, timeout=120)
    dist = metadata.Distribution.at(site / "llmgw-1.4.2.dist-info")

    kept = keep_installed(tmp_path / "previous", dist)

    assert kept.name == "llmgw-1.4.2-py3-none-any.whl"
    with zipfile.ZipFile(kept) as z:
        names = set(z.namelist())
        record = z.read("llmgw-1.4.2.dist-info/RECORD").decode()
    assert {"llmgw/__init__.py", "llmgw/data/page.html", "catalog/__init__.py"} <= names
    assert not any("__pycache__" in n or n.endswith("INSTALLER") for n in names)
    assert "llmgw/data/page.html,sha256=" in record
    again = tmp_path / "again"
    subprocess.run([*pip, "--target", str(again), str(kept)], check=True, timeout=120)
    assert (again / "llmgw" / "data" / "page.html").read_text() == "<p>kept</p>\n"
    assert metadata.Distribution.at(again / "llmgw-1.4.2.dist-info").version == "1.4.2"


def test_a_source_checkout_has_nothing_to_keep(tmp_path):
    dist = metadata.distribution("llmgw")  # this checkout, installed with pip install -e
    with pytest.raises(upgrade.UpgradeFailed, match="runs from a source checkout"):
        keep_installed(tmp_path / "previous", dist)
    assert not (tmp_path / "previous").exists()
