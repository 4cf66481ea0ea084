"""Each serving process's usage journal: what its requests use, on local disk as it happens,
so that usage survives the process being killed (docs/gateway.md, Usage).

The gateway tallies usage in memory and writes it to the database every two seconds
(`usage`), which keeps the database off the request path; a process killed with `kill -9`
lost what it had tallied and every request in flight. So each `llmgw serve` process (each
worker of `--workers N`) also appends, to a file of its own under LLMGW_HOME/usage, a line
when a request begins (its prompt estimate and reservation), one when it ends (what it
used, as tallied), for streams the events passed on so far once a second, and a boundary
each time a batch is taken for the database. The batch's number is written in the
batch's own transaction (tenancy's `UsageJournal`), so what of a journal is in the Usage
rows is known exactly. The file is locked (flock) for the process's life; the kernel lets
go of the lock however the process ends.

At its start, `llmgw serve` settles every journal whose lock it can take, which is to
say whose process died: what ended after the last batch written is added as it was
tallied, and each request begun and never ended as what it streamed, or, when nothing is
known, its reservation, marked estimated (`fold`). A process that stops cleanly writes
its last batch and removes its journal.

The lines of one turn of the event loop (at 64 requests at once, several requests'
beginnings and ends) are one `write` at the turn's end, to a file opened for appending, not
synced: a killed process's lines are in the kernel's cache and reach the disk, but for
those of the turn it was killed in (microseconds of work: a request begun then is not
known to have begun, though its engine may have it, and one answered then is settled as
cut, by its estimate, as a kill between an answer and its line always could); a machine
losing power may lose its last seconds, as the usage in memory would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("llmgw.gateway")

# (minute since the epoch, key id, project id, model) -> [requests, errors, prompt, completion,
# latency ms, estimated: of prompt and completion, the tokens no engine counted]: what the
# gateway tallies (`usage`), and what a journal's lines add up to.
Tallies = dict[tuple[int, int, int, str], list[int]]
FIGURES = 6

FOLDER = "usage"  # under LLMGW_HOME
SUFFIX = ".journal"
COMPACT_BYTES = 4 * 1024 * 1024  # past this, a journal is rewritten once its batch is written


class Journal:
    """One process's journal, open for appending and locked while it lives."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        self._fd: int | None = _locked(path)
        self.size = 0  # bytes written since it was opened or rewritten
        self._failed_at = float("-inf")
        self._pending: list[str] | None = None  # lines of the loop's turn, not yet written

    @classmethod
    def open(cls, home: Path) -> Journal:
        """A new journal for this process under `home`'s usage folder."""
        folder = home / FOLDER
        folder.mkdir(mode=0o700, exist_ok=True)
        host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())
        return cls(folder / f"{host}-{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}")

    def write(self, text: str) -> None:
        """Append `text` (whole lines): on the event loop, with the other lines of the loop's
        turn in one write at its end; elsewhere at once."""
        if self._fd is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # after the loop stopped too: what it held first, in order
            self.flush()
            self._put(text)
            return
        if self._pending is not None:
            self._pending.append(text)
            return
        self._pending = [text]
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write the lines held for the loop's turn."""
        pending, self._pending = self._pending, None
        if pending and self._fd is not None:
            self._put("".join(pending))

    def _put(self, text: str) -> None:
        """One write. A disk that refuses it is logged once a minute and costs the journal
        those lines; the request goes on."""
        assert self._fd is not None
        data = text.encode()
        try:
            os.write(self._fd, data)
        except OSError as exc:
            self._failed(exc)
        else:
            self.size += len(data)

    def rewrite(self, text: str) -> None:
        """Replace the whole journal with `text`, which must say all the old one held that
        the database does not: written beside it, locked, and renamed over it, so the
        name always holds one whole journal or the other."""
        if self._fd is None:
            return
        self.flush()
        spare = self.path.with_name(f".{self.name}.new")
        try:
            fd = _locked(spare)
            try:
                os.write(fd, text.encode())
                os.rename(spare, self.path)
            except OSError:
                os.close(fd)
                spare.unlink(missing_ok=True)
                raise
        except OSError as exc:
            self._failed(exc)
            return
        os.close(self._fd)
        self._fd, self.size = fd, len(text)

    def close(self, *, remove: bool) -> None:
        """Let go of it; `remove` when all it holds is in the database."""
        if self._fd is None:
            return
        self.flush()
        if remove:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def _failed(self, exc: OSError) -> None:
        if time.monotonic() - self._failed_at > 60:
            self._failed_at = time.monotonic()
            log.warning("could not write the usage journal %s: %s", self.path, exc)


def _locked(path: Path) -> int:
    """`path` made anew, open for appending, and locked (never waits: nobody else has it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def begun(
    rid: int, at: float, key: int, project: int, model: str, estimate: int, reserved: int
) -> str:
    """The line of a request that began: its id in this journal, when, whose, its model, its
    prompt estimate and what it reserved."""
    return f"s\t{rid}\t{int(at)}\t{key}\t{project}\t{model}\t{estimate}\t{reserved}\n"


def ended(rid: int, where: tuple[int, int, int, str], figures: Iterable[int]) -> str:
    """The line of what requests used (`rid` 0 for several, or for one that never began):
    its tally's key and figures, as `usage.Tallies` holds them, requests first."""
    minute, key, project, model = where
    numbers = "\t".join(map(str, figures))
    return f"e\t{rid}\t{minute}\t{key}\t{project}\t{model}\t{numbers}\n"


def fold(lines: Iterable[str], written: int) -> tuple[Tallies, int]:
    """What a dead process's journal holds that the Usage rows do not, as tallies: what
    ended after the boundary of batch `written` (the last in the database; 0 for none),
    as it was tallied; and each request that began and never ended, as cut: the events it
    streamed as its completion or, when none are known, what it reserved, and its prompt
    by the estimate, those no engine counted marked estimated. Answers the tallies and how
    many requests were cut. Lines a full disk cut short are passed over."""
    starts: dict[int, tuple[tuple[int, int, int, str], int, int]] = {}
    streamed: dict[int, int] = {}
    done: set[int] = set()
    tallies: Tallies = {}
    counting = written == 0
    for line in lines:
        f = line.split("\t")
        try:
            if f[0] == "s" and len(f) == 8:
                where = (int(f[2]) // 60, int(f[3]), int(f[4]), f[5])
                starts[int(f[1])] = (where, int(f[6]), int(f[7]))
            elif f[0] == "p" and len(f) == 3:
                streamed[int(f[1])] = int(f[2])
            elif f[0] == "e" and len(f) == 6 + FIGURES:
                rid, figures = int(f[1]), [int(x) for x in f[6:]]
                where = (int(f[2]), int(f[3]), int(f[4]), f[5])
                done.add(rid)
                if counting:
                    _add(tallies, where, figures)
            elif f[0] == "b" and len(f) == 2 and int(f[1]) == written:
                counting = True
        except ValueError:
            continue
    cut = [(rid, start) for rid, start in starts.items() if rid not in done]
    for rid, (where, estimate, reserved) in cut:
        events = streamed.get(rid, 0)
        completion = events or reserved - estimate
        estimated = estimate + (0 if events else completion)
        _add(tallies, where, (1, 1, estimate, completion, 0, estimated))
    return tallies, len(cut)


def _add(tallies: Tallies, where: tuple[int, int, int, str], figures: Iterable[int]) -> None:
    t = tallies.setdefault(where, [0] * FIGURES)
    for i, x in enumerate(figures):
        t[i] += x


def journals_settle(home: Path) -> int:
    """Settle the journal of every process that died (`fold`), each once: its lock taken
    (a live process holds its own), the additions and the mark that it is settled in one
    transaction, then the file removed. A journal the database cannot take now is left
    for the next start. Answers how many were settled."""
    folder = home / FOLDER
    if not folder.is_dir():
        return 0
    for spare in folder.glob(f".*{SUFFIX}.new"):
        # A rewrite its process died in: the journal it was to replace holds it all.
        _remove_if_dead(spare)
    done = 0
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        try:
            done += _settle(path)
        except Exception:  # noqa: BLE001 - the database away: the next start tries again
            log.warning(
                "could not settle the usage journal %s; kept for the next start",
                path,
                exc_info=True,
            )
    return done


def _remove_if_dead(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    # Locked: being written by a live process, and left to it.
    try:
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _settle(path: Path) -> bool:
    from tenancy.selectors import usage_journal_state
    from tenancy.services.usage import usage_journal_forget, usage_journal_settle

    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its process lives, or another is settling it
        try:
            if os.stat(path).st_ino != os.fstat(fd).st_ino:
                return False
        except FileNotFoundError:
            return False  # settled and removed by another while this one waited
        with os.fdopen(os.dup(fd), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        written, settled = usage_journal_state(name=path.name)
        if not settled:
            tallies, cut = fold(lines, written)
            usage_journal_settle(name=path.name, tallies=tallies)
            if tallies:
                log.warning(
                    "usage of a gateway process that died settled from its journal %s: "
                    "%d requests it cut, %d tallies",
                    path.name,
                    cut,
                    len(tallies),
                )
        path.unlink()
        usage_journal_forget(name=path.name)
        return True
    finally:
        os.close(fd)
