"""Reading an engine's log back: its last lines, cut at a line, made safe to show.

An engine writes what it likes to ``<state-dir>/logs/<shard>.log``: colour
codes, progress bars redrawn with carriage returns, bytes that are not UTF-8.
What leaves the agent (a failure's detail, an answer to ``engine_log``) is
whole lines of printable text, newlines and tabs only, within a bound, so the
control plane can store it and a terminal or a page can show it as it is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fleet.domain.causes import cause_index

# What a failure's detail carries: enough to show the engine's own error, small enough
# to keep beside every model that backs off.
FAILURE_LINES = 20
FAILURE_BYTES = 4096
# How far up the log the line that says why is looked for (fleet/domain/causes.py).
CAUSE_LINES = 400
# What one answer to `engine_log` may carry: the control plane's frames are at most 256 KiB.
MAX_LINES = 1000
MAX_BYTES = 128 * 1024
# A line longer than this is cut (its start is where engines say what went wrong).
MAX_LINE_CHARS = 1000

# ANSI escape sequences (colours, cursor moves), removed whole rather than leaving "[31m".
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# Every other control character but tab and newline (C0, DEL and C1).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """``text`` with escape sequences and control characters removed; a carriage return
    ends a line (a progress bar's redraws become lines), tabs and newlines stay."""
    text = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 1] + "…"


def tail_lines(path: Path, lines: int, max_bytes: int = MAX_BYTES) -> list[str] | None:
    """The last ``lines`` lines of the file at ``path``, cleaned, whole, at most ``max_bytes``
    of UTF-8 together (the oldest are dropped to fit); None when there is no such file.

    Only the end of the file is read, so a log of gigabytes costs what its tail does.
    """
    lines = max(1, min(lines, MAX_LINES))
    window = min(max_bytes, MAX_BYTES) + MAX_LINE_CHARS * 4
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(f.tell() - window, 0)
            f.seek(start)
            data = f.read()
    except OSError:
        return None
    if start > 0:
        # The window began inside a line: that part of it is not a line.
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    out = [_cut(line.rstrip()) for line in clean(data.decode(errors="replace")).split("\n")]
    while out and not out[-1]:
        out.pop()
    out = out[-lines:]
    size = sum(len(line.encode()) + 1 for line in out)
    while out and size > max_bytes:
        size -= len(out.pop(0).encode()) + 1
    return out


def failure_tail(path: Path | None) -> str:
    """The engine's last words for a failure's detail: at most FAILURE_LINES lines and
    FAILURE_BYTES, whole lines; "" when it wrote nothing.

    The line that says why (causes.cause_index, searched in the last CAUSE_LINES) comes
    first with "…" after it when it is further up than the last lines: a traceback is
    longer than they are.
    """
    if path is None:
        return ""
    searched = tail_lines(path, CAUSE_LINES, MAX_BYTES) or []
    found = searched[-FAILURE_LINES:]
    at = cause_index(searched)
    if at is not None and at < len(searched) - len(found):
        found = [_cut_cause(searched[at]), "…", *found]
    size = sum(len(line.encode()) + 1 for line in found)
    # Over the bound: the oldest of the last lines go, the line that says why stays.
    keep = 2 if len(found) > 2 and found[1] == "…" else 0
    while len(found) > keep and size > FAILURE_BYTES:
        size -= len(found.pop(keep).encode()) + 1
    while found and not found[0].strip():
        found.pop(0)
    return "\n".join(found)


def _cut_cause(line: str) -> str:
    return line if len(line) <= FAILURE_BYTES // 4 else line[: FAILURE_BYTES // 4 - 1] + "…"
