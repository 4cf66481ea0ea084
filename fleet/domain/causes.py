"""The line of an engine's log that says why it failed, and how a failure reads in one line.

An engine that fails says why a few lines before its last words: llama-server names the
file it could not read three lines above "exiting due to model loading error", and vLLM
prints a traceback whose last line is the error, then the API server's own traceback
"See root cause above". The one-line forms of a failure (``ctl models``, the cluster
page's "Needs attention", the models list, events) show that line, cleaned of the
engine's timestamps and prefixes; the whole tail stays in ``explain`` and the model page.

Pure: lines in, a line out.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

# A cause longer than this is cut: a line of a list of every supported architecture.
MOST_CHARS = 300

# The agent's own sentences that only say an engine ended: the log lines after them say why.
ENDED = (
    "The engine exited",
    "The engine was stopped by",
    "The engine did not answer /health",
    "Stopped before the engine answered /health",
)

# The reconciler's own sentence for a replica it gave up on at its startup timeout, to which
# the agent's stop adds the engine's log (fleet/nodes/failures.py).
_GAVE_UP = re.compile(r"^replica \S+ did not become ready within ")

# What engines put before what they say, removed one after another from a line's start.
_PREFIXES = (
    # vLLM's process tags: "(APIServer pid=1) ", "(EngineCore_0 pid=104) ",
    # "(VllmWorker rank=1 pid=2445156) ".
    re.compile(r"^\((?:[A-Za-z_][\w]*)(?: [a-z_]+=\d+)+\)\s*"),
    # vLLM's level, date and place: "ERROR 05-05 12:36:59 [serving.py:1173] ", and the
    # older "ERROR 12-16 21:40:15 engine.py:135] ".
    re.compile(
        r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+"
        r"\[?[\w./<>-]+(?::\d+)?\]\s*"
    ),
    # llama.cpp's timestamps and level: "0.00.007.248 E ".
    re.compile(r"^\d+\.\d\d\.\d{3}\.\d{3}\s+(?:[DIWE]\s+)?"),
    # ISO dates, bracketed or not: "2026-06-09 14:01:54.604 ", "[2024-01-02T03:04:05Z] ".
    re.compile(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s*"),
    # A level in brackets or alone: "[Info] ", "E ", "ERROR: ", "ERROR ".
    re.compile(r"^(?:\[(?:Info|Error|Warning|INFO|ERROR|WARNING)\]\s*)"),
    re.compile(r"^(?:ERROR|CRITICAL|FATAL)(?::\s*|\s+)"),
    # llama-server's source tags and its C functions: "srv    load_model: ",
    # "gguf_init_from_file_impl: ", "llama_model_load: ".
    re.compile(r"^(?:srv|slot|que|main|common|cmn)\s+(?=\S)"),
    re.compile(r"^[a-z][a-z0-9]*_[a-z0-9_]*(?:\(\))?:\s+"),
)

_OUT_OF_MEMORY = re.compile(
    r"CUDA out of memory|OutOfMemoryError|cudaMalloc failed|CUDA error: out of memory"
    r"|out of memory|failed to allocate",
    re.I,
)
# Causes said in so many words: a file not there or not a model, an architecture not
# known, a port taken.
_KNOWN = re.compile(
    r"invalid magic|No such file or directory|failed to open|FileNotFoundError|not found"
    r"|unknown model architecture|architectures? .* not supported|not supported for now"
    r"|address already in use|couldn't bind|could not bind|Errno 98|EADDRINUSE",
    re.I,
)
# An error line in the words of llama.cpp, vLLM, Python or a shell.
_ERROR = re.compile(
    r"\berror\b|\bfailed\b|\bfailure\b|\binvalid\b|\bcannot\b|\bcan't\b|could not|unable to"
    r"|\bfatal\b|\baborted\b|\bexception\b",
    re.I,
)
# The line a Python traceback ends with: "ValueError: …", "torch.OutOfMemoryError: …".
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault)\b:?")
# An exception that only points back at another: vLLM's API server after its engine died.
_POINTS_BACK = re.compile(r"root cause above|stack trace \(above\)|see above", re.I)
_TRACEBACK = "Traceback (most recent call last):"


def clean(line: str) -> str:
    """``line`` without the engine's timestamps, levels, process tags and function names."""
    text = line.strip()
    changed = True
    while changed and text:
        changed = False
        for prefix in _PREFIXES:
            stripped = prefix.sub("", text, count=1)
            if stripped != text:
                text, changed = stripped.strip(), True
    return text


def _cut(text: str) -> str:
    return text if len(text) <= MOST_CHARS else text[: MOST_CHARS - 1] + "…"


def _raised(lines: Sequence[str]) -> list[int]:
    """The index of each traceback's last line (the exception raised), in order."""
    found = []
    in_traceback = False
    for i, text in enumerate(lines):
        if text == _TRACEBACK:
            in_traceback = True
        elif in_traceback and not text.startswith((" ", "\t")) and _EXCEPTION.match(text):
            found.append(i)
            in_traceback = False
    return found


def cause_index(lines: Sequence[str]) -> int | None:
    """Which of an engine's log ``lines`` says why it failed; None when none does.

    In order: running out of (GPU) memory; the error a Python traceback ends with (the
    last one that does not only point back at another); a cause said in so many words
    (a file not there or not a model, an unknown architecture, a port taken); else the
    first error line.
    """
    cleaned = [clean(line) for line in lines]
    for i, text in enumerate(cleaned):
        if _OUT_OF_MEMORY.search(text) and _EXCEPTION.match(text):
            return i
    for i, text in enumerate(cleaned):
        if _OUT_OF_MEMORY.search(text) and _ERROR.search(text):
            return i
    raised = [i for i in _raised(_indented(lines)) if not _POINTS_BACK.search(cleaned[i])]
    if raised:
        return raised[-1]
    for i, text in enumerate(cleaned):
        if _KNOWN.search(text):
            return i
    for i, text in enumerate(cleaned):
        if _ERROR.search(text) or _EXCEPTION.match(text):
            return i
    return None


def _indented(lines: Sequence[str]) -> list[str]:
    """Each line without its prefixes but with the indentation that follows them, so a
    traceback's frames (indented) are told from its last line (not)."""
    out = []
    for line in lines:
        text = clean(line)
        if not text:
            out.append("")
            continue
        # Where the cleaned text starts in the line, and the spaces before it there.
        at = line.rfind(text)
        before = line[:at] if at >= 0 else ""
        pad = len(before) - len(before.rstrip(" \t"))
        if at >= 0 and pad and before.strip():
            # Spaces after a prefix: vLLM writes a frame as "[core.py:390]   File ...".
            pad = max(pad - 1, 0)
        out.append(" " * pad + text if pad else text)
    return out


def cause(lines: Sequence[str]) -> str | None:
    """The line of ``lines`` that says why the engine failed, cleaned; None when none does."""
    i = cause_index(lines)
    return _cut(clean(lines[i])) if i is not None else None


def summary(detail: str) -> str:
    """A failure in one line, from its detail (the agent's sentence, then the engine's last
    log lines): the line of the log that says why when the sentence only says the engine
    ended, else the sentence; "" for no detail."""
    lines = [line for line in detail.splitlines() if line.strip()]
    if not lines:
        return ""
    sentence = lines[0].strip()
    if sentence.startswith(ENDED) or _GAVE_UP.match(sentence):
        found = cause(lines[1:])
        if found:
            return found
    return _cut(sentence)


def signal_name(code: int | None) -> str | None:
    """The signal a negative exit code says ended a process (-15: SIGTERM), as Python
    reports a child killed by one; None for any other code."""
    if code is None:
        return None
    if code >= 0:
        return None
    number = -code
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def ended_said(code: int | None) -> str:
    """How an engine ended, as the agent says it: "The engine exited with code 1.", "The
    engine was stopped by SIGKILL.", or "The engine exited." when the code is not known."""
    if code is None:
        return "The engine exited."
    if name := signal_name(code):
        return f"The engine was stopped by {name}."
    return f"The engine exited with code {code}."


def exit_said(code: int | None) -> str:
    """An exit code in a few words for a failure's place: "exit code 1", "stopped by
    SIGKILL"; "" when it is not known."""
    if code is None:
        return ""
    if name := signal_name(code):
        return f"stopped by {name}"
    return f"exit code {code}"
