"""Small hand-made wheels of llmgw, good and bad, for the release checks: the mirror's at
upload and the agent's before it switches to a release (tests/fleet/test_upgrades.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path

# Enough of llmgw for `python -m llmgw version` to answer as the real one does.
MAIN = (
    'import sys\n\nimport llmgw\n\nif sys.argv[1:] == ["version"]:\n    print(llmgw.__version__)\n'
)


def wheel(
    folder: Path,
    version: str,
    *,
    name: str | None = None,
    files: dict[str, str] | None = None,
    dist: str = "llmgw",
    declared: str | None = None,
) -> Path:
    """A wheel at `folder`/`name` (llmgw's own file name by default) whose METADATA says
    Name `dist` and Version `declared` (else `version`), holding `files` (by default a
    llmgw package of `version` that answers `llmgw version`)."""
    files = (
        {"llmgw/__init__.py": f'__version__ = "{version}"\n', "llmgw/__main__.py": MAIN}
        if files is None
        else files
    )
    info = f"{dist}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {declared or version}\n\nA test.\n"
    path = folder / (name or f"llmgw-{version.replace('-', '_')}-py3-none-any.whl")
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as out:
        for member, text in files.items():
            out.writestr(member, text)
        out.writestr(f"{info}/METADATA", meta)
        out.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        out.writestr(f"{info}/RECORD", "")
    return path
