"""How far a set of weights has got, from its files, and when a failed fetch is tried again."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

QUEUED, DOWNLOADING, READY, FAILED = "queued", "downloading", "ready", "failed"
STATES = (QUEUED, DOWNLOADING, READY, FAILED)

# A fetch that fails is tried again after 5 s, 10 s, 20 s … up to ten minutes apart,
# and given up after this many tries with the last sentence kept.
ATTEMPTS = 6
RETRY_BASE_S = 5.0
RETRY_MAX_S = 600.0


@dataclass(frozen=True)
class FileProgress:
    """One file's state as the weights' view needs it."""

    path: str
    state: str
    done: int
    size: int | None
    detail: str = ""


@dataclass(frozen=True)
class Progress:
    """The weights' state: ``failed`` if any file failed, ``ready`` when all are,
    ``downloading`` while any is under way or partly fetched, else ``queued``."""

    state: str
    detail: str
    done: int
    total: int | None


def progress(files: Iterable[FileProgress]) -> Progress:
    """The state, detail and bytes of weights made of ``files``."""
    files = list(files)
    failed = [f for f in files if f.state == FAILED]
    done = sum(f.done for f in files)
    sizes = [f.size for f in files]
    total = None if not files or any(s is None for s in sizes) else sum(s or 0 for s in sizes)
    if failed:
        first = failed[0]
        more = f" ({len(failed) - 1} more files failed too)" if len(failed) > 1 else ""
        return Progress(FAILED, f"{first.path}: {first.detail}{more}", done, total)
    if files and all(f.state == READY for f in files):
        return Progress(READY, "", done, total)
    if any(f.state == DOWNLOADING or (f.state == QUEUED and f.done) for f in files):
        left = sum(1 for f in files if f.state != READY)
        return Progress(DOWNLOADING, f"{left} of {len(files)} files still to fetch", done, total)
    return Progress(QUEUED, "waiting for the mirror's worker", done, total)


def fetched_said(done: object, total: object) -> str:
    """How far a fetch got, for people: "40% of 253 MB"; without a total, the bytes so far."""
    done = done if isinstance(done, int) else 0
    if isinstance(total, int) and total > 0:
        return f"{100 * done // total}% of {total / 1e6:,.0f} MB"
    return f"{done / 1e6:,.0f} MB"


def retry_delay(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones."""
    return min(RETRY_BASE_S * 2 ** max(attempts - 1, 0), RETRY_MAX_S)
