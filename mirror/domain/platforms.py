"""Engine builds the mirror holds: which engines come as a binary, and the platform one runs on.

Pure: the agent, the CLI and the control plane all name a platform the same way,
``<os>-<machine>`` as Python sees it (``linux-x86_64``, ``linux-aarch64``).
"""

from __future__ import annotations

import platform
import re
import sys

# Engines whose build is one binary an agent can install. vLLM is a pip install into an
# environment of its own, of the version the control plane pins (fleet/agent/install_pip.py).
BINARY_ENGINES = frozenset({"llamacpp"})
# llmgw's own release, a wheel for any platform, kept as a build is: what `llmgw ctl
# upgrade` has agents install (fleet/nodes/upgrades.py). Never an engine a node installs.
RELEASE = "llmgw"
RELEASE_PLATFORM = "python-any"
# The program each of them is, in its install folder.
PROGRAMS = {"llamacpp": "llama-server"}

PLATFORM = re.compile(r"^[a-z0-9_]+-[a-z0-9_]+$")
_MACHINES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def this_platform() -> str:
    """This machine's platform: ``linux-x86_64`` and the like."""
    machine = platform.machine().lower() or "unknown"
    return f"{sys.platform}-{_MACHINES.get(machine, machine)}"


def version_folder(version: str) -> str:
    """A version as a folder name: what is not a letter, digit, dot, dash or underscore
    becomes a dash (llama.cpp says ``0.5.0-dev (build 1, commit 0c1e570)``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", version).strip("-.") or "unknown"
