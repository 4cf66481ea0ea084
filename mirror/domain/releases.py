"""What makes a file a release of llmgw: the wheel of the `llmgw` distribution, holding the
`llmgw` package, at the version it is added as.

The mirror checks it when a release is added, and an agent again before it installs one
(fleet/agent/upgrade.py): a wheel without the package installs without complaint, and
the agent that re-executes into it dies with `No module named llmgw`, its node lost until
mended by hand. No Django: the agent imports this.
"""

from __future__ import annotations

import re
import zipfile
from email.parser import HeaderParser
from pathlib import Path

PACKAGE = "llmgw/__init__.py"
# A wheel's name, PEP 427: name-version(-build)?-python-abi-platform.whl; a release is
# pure Python, for any platform.
_NAME = re.compile(r"^llmgw-(?P<version>[^-]+)(?:-\d[^-]*)?-py3-none-any\.whl$")
_METADATA = re.compile(r"^[^/]+\.dist-info/METADATA$")
# llmgw's METADATA is a few kilobytes; a bigger one is read no further.
METADATA_MAX = 1 << 20


def wheel_name(version: str) -> str:
    """The file name pip wants for a pure-Python wheel of llmgw `version`."""
    return f"llmgw-{version.replace('-', '_')}-py3-none-any.whl"


def wheel_refusal(path: Path, *, version: str, filename: str) -> str:
    """ "" when the file at `path`, uploaded as `filename`, is llmgw's wheel of `version`;
    else the sentence saying what it is instead."""
    match = _NAME.match(filename)
    if match is None or match["version"] != version.replace("-", "_"):
        return (
            f"{filename or 'the file'} is not named as a wheel of llmgw {version}: "
            f"a release is its wheel, {wheel_name(version)}"
        )
    try:
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            found = [n for n in names if _METADATA.match(n)]
            metadata = _read(wheel, found[0]) if len(found) == 1 else ""
    # zipfile raises NotImplementedError for a compression method it cannot read.
    except (zipfile.BadZipFile, OSError, ValueError, RuntimeError, NotImplementedError):
        return f"{filename} is not a wheel: it is not a zip archive that can be read"
    if len(found) != 1:
        return f"{filename} has {len(found) or 'no'} *.dist-info/METADATA, not one"
    return contents_refusal(filename=filename, version=version, names=names, metadata=metadata)


def contents_refusal(*, filename: str, version: str, names: list[str], metadata: str) -> str:
    """ "" when a wheel's members `names` hold llmgw's package and its METADATA text says it
    is llmgw `version`; else the sentence."""
    fields = HeaderParser().parsestr(metadata)
    dist = re.sub(r"[-_.]+", "-", fields.get("Name") or "").lower()
    if dist != "llmgw":
        return f"{filename} is a wheel of {fields.get('Name') or 'no name'}, not of llmgw"
    if fields.get("Version") != version:
        return f"{filename} holds llmgw {fields.get('Version') or 'of no version'}, not {version}"
    if PACKAGE not in names:
        return (
            f"{filename} does not hold the llmgw package ({PACKAGE}): an agent upgraded to "
            "it could not start again"
        )
    return ""


def _read(wheel: zipfile.ZipFile, name: str) -> str:
    with wheel.open(name) as member:
        return member.read(METADATA_MAX).decode("utf-8", errors="replace")
