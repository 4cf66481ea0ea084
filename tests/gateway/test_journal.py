"""The usage journal: what a process killed at any moment had used is in the Usage rows once
the next start settles its journal, exactly once (llmgw/gateway/journal.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from llmgw.gateway import journal as journal_module
from llmgw.gateway.journal import FIGURES, Journal, fold, journals_settle
from llmgw.gateway.usage import UsageBook


@dataclass
class Key:
    id: int = 7
    project_id: int = 3


@dataclass
class Req:
    """What the book reads of a request."""

    key: Key = field(default_factory=Key)
    model: str = "chat"
    estimate: int = 10
    reserved: int = 110
    admitted: float = 6_000_000.0
    events: int = 0
    rid: int = 0


def lines(j: Journal) -> list[str]:
    return j.path.read_text().splitlines()


def test_what_ended_after_the_last_batch_written_is_added_as_it_was_tallied():
    text = [
        "e\t0\t100000\t7\t3\tchat\t1\t0\t5\t6\t90\t0",  # in batch 1, which is written
        "b\t1",
        "e\t0\t100000\t7\t3\tchat\t1\t1\t4\t2\t30\t0",  # in batch 2, which is not
        "b\t2",
        "e\t0\t100001\t7\t3\tchat\t2\t0\t8\t8\t20\t3",
    ]
    tallies, cut = fold(text, written=1)
    assert cut == 0
    assert tallies == {
        (100000, 7, 3, "chat"): [1, 1, 4, 2, 30, 0],
        (100001, 7, 3, "chat"): [2, 0, 8, 8, 20, 3],
    }
    assert fold(text, written=0)[0][(100000, 7, 3, "chat")] == [2, 1, 9, 8, 120, 0]
    assert fold(text, written=2)[0] == {(100001, 7, 3, "chat"): [2, 0, 8, 8, 20, 3]}


@pytest.mark.parametrize(
    ("progress", "tally"),
    [
        # What it streamed is its completion; its prompt is the estimate, marked.
        (["p\t4\t3", "p\t4\t12"], [1, 1, 10, 12, 0, 10]),
        # Nothing known: what it reserved, all estimated.
        ([], [1, 1, 10, 100, 0, 110]),
    ],
)
def test_a_request_cut_by_the_crash_counts_what_it_streamed_or_else_its_reservation(
    progress, tally
):
    text = ["s\t4\t6000030\t7\t3\tchat\t10\t110", *progress]
    assert fold(text, written=0) == ({(100000, 7, 3, "chat"): tally}, 1)


def test_a_request_that_ended_is_not_cut_though_its_end_is_in_the_database():
    text = [
        "s\t4\t6000030\t7\t3\tchat\t10\t110",
        "e\t4\t100000\t7\t3\tchat\t1\t0\t5\t6\t90\t0",
        "b\t1",
    ]
    assert fold(text, written=1) == ({}, 0)


def test_lines_a_full_disk_cut_short_are_passed_over():
    text = ["e\t0\t100000\t7\t3\tchat\t1\t0\t5", "s\t4\t60000", "p\t4\tx", "garbage", ""]
    assert fold(text, written=0) == ({}, 0)


class Crashes(RuleBasedStateMachine):
    """A process's usage book and journal through any order of requests beginning, streaming,
    ending, batches written or failing and journals rewritten, killed at any moment: the
    database's rows and the journal's settlement together hold what every request used,
    once: as it was tallied for those that ended, as the streamed events last written (or
    the reservation) for those cut."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile
        from pathlib import Path

        self.home = Path(tempfile.mkdtemp())
        self.book = UsageBook(Journal.open(self.home))
        self.database: dict = {}
        self.written = 0  # the batch the database holds
        self.expected: dict = {}  # every figure ended so far, by tally
        self.running: dict[int, Req] = {}
        self.told: dict[int, int] = {}  # events the journal last heard, per stream
        self.pending = None  # a batch taken, being written
        self.now = 6_000_000.0

    @rule(estimate=st.integers(1, 50), completion=st.integers(0, 100))
    def begin(self, estimate, completion):
        req = Req(estimate=estimate, reserved=estimate + completion, admitted=self.now)
        self.book.begin(req, self.now)
        self.running[req.rid] = req

    @precondition(lambda self: self.running)
    @rule(data=st.data(), events=st.integers(1, 20))
    def stream(self, data, events):
        rid = data.draw(st.sampled_from(sorted(self.running)))
        self.running[rid].events += events

    @rule()
    def a_second_passes(self):
        self.now += 1
        self.book.progress()
        self.told.update({rid: r.events for rid, r in self.running.items() if r.events})

    @precondition(lambda self: self.running)
    @rule(data=st.data(), prompt=st.integers(0, 50), error=st.booleans())
    def end(self, data, prompt, error):
        rid = data.draw(st.sampled_from(sorted(self.running)))
        req = self.running.pop(rid)
        self.told.pop(rid, None)
        completion = req.events
        self.book.record(
            key_id=7, project_id=3, model="chat", prompt=prompt, completion=completion,
            error=error, latency_ms=12, now=self.now, estimated=0, request=rid,
        )  # fmt: skip
        self._add(
            self.expected,
            (int(self.now // 60), 7, 3, "chat"),
            [1, int(error), prompt, completion, 12, 0],
        )

    @precondition(lambda self: self.pending is None)
    @rule()
    def take(self):
        tallies, _ = self.book.take()
        if tallies:
            self.pending = (tallies, self.book.batch)

    # Requests go on beginning and ending while a batch is being written.
    @precondition(lambda self: self.pending is not None)
    @rule(fails=st.booleans(), large=st.booleans())
    def batch_written_or_not(self, fails, large):
        (tallies, batch), self.pending = self.pending, None
        if fails:
            self.book.give_back(tallies, set())
            return
        for k, v in tallies.items():
            self._add(self.database, k, v)
        self.written = batch
        if large:  # as if it had grown past COMPACT_BYTES: rewritten, it says the events now
            self.book.journal.size = journal_module.COMPACT_BYTES
            self.told.update({rid: r.events for rid, r in self.running.items() if r.events})
        self.book.written(batch)

    def teardown(self):
        import shutil

        journal = self.book.journal
        settled, cut = fold(journal.path.read_text().splitlines(), self.written)
        journal.close(remove=True)
        shutil.rmtree(self.home, ignore_errors=True)  # each example's folder, not left in /tmp
        total: dict = {}
        for source in (self.database, settled):
            for k, v in source.items():
                self._add(total, k, v)
        expected = dict(self.expected)
        for req in self.running.values():
            events = self.told.get(req.rid, 0)
            completion = events or req.reserved - req.estimate
            estimated = req.estimate + (0 if events else completion)
            where = (int(req.admitted // 60), 7, 3, "chat")
            self._add(expected, where, [1, 1, req.estimate, completion, 0, estimated])
        assert cut == len(self.running)
        assert total == expected

    @staticmethod
    def _add(tallies: dict, k, figures) -> None:
        t = tallies.setdefault(k, [0] * FIGURES)
        for i, x in enumerate(figures):
            t[i] += x


TestCrashes = Crashes.TestCase
TestCrashes.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)


def test_a_rewritten_journal_stays_locked_and_holds_only_what_the_database_does_not(tmp_path):
    book = UsageBook(Journal.open(tmp_path))
    done, running = Req(), Req(estimate=20, reserved=60)
    book.begin(done, 6_000_000.0)
    book.begin(running, 6_000_000.0)
    book.record(key_id=7, project_id=3, model="chat", prompt=5, completion=6, error=False,
                latency_ms=90, now=6_000_010.0, request=done.rid)  # fmt: skip
    book.take()
    book.record(key_id=7, project_id=3, model="chat", prompt=1, completion=1, error=True,
                latency_ms=3, now=6_000_011.0)  # fmt: skip
    running.events = 4
    book.journal.size = journal_module.COMPACT_BYTES
    book.written(1)

    assert lines(book.journal) == [
        "b\t1",
        "e\t0\t100000\t7\t3\tchat\t1\t1\t1\t1\t3\t0",
        f"s\t{running.rid}\t6000000\t7\t3\tchat\t20\t60",
        f"p\t{running.rid}\t4",
    ]
    assert book.journal.size == len(book.journal.path.read_bytes())
    assert not _lockable(book.journal.path)
    assert list(tmp_path.joinpath("usage").iterdir()) == [book.journal.path]


def _lockable(path) -> bool:
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


# A serving process, as far as its journal goes: it opens one, begins a request of key KEY
# and waits to be killed.
LIVE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from llmgw.gateway.journal import Journal, begun
    j = Journal.open(Path(sys.argv[1]))
    j.write(begun(1, 6_000_030, int(sys.argv[2]), int(sys.argv[3]), "chat", 10, 110))
    j.write("p\\t1\\t7\\n")
    print(j.name, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.django_db(transaction=True)
def test_the_next_start_settles_only_the_journals_of_processes_that_died(tmp_path):
    from tenancy.models import Usage, UsageJournal
    from tenancy.services import api_key_create, org_create, project_create, team_create

    org_create(name="Acme", actor="t")
    team_create(org="Acme", name="ml", actor="t")
    project_create(team="Acme/ml", name="chat", actor="t")
    key, _ = api_key_create(project="Acme/ml/chat", name="k", actor="t")
    # Two workers, each with its journal.
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", LIVE, str(tmp_path), str(key.pk), str(key.project_id)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        names = [w.stdout.readline().strip() for w in workers]
        assert len(set(names)) == 2
        assert journals_settle(tmp_path) == 0  # both alive: neither is taken
        assert not Usage.objects.exists()

        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        assert journals_settle(tmp_path) == 1
        row = Usage.objects.get()
        # Cut after 7 events: what it streamed, its prompt estimated.
        assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (1, 1, 10, 7)
        assert row.estimated_tokens == 10
        assert sorted(p.name for p in (tmp_path / "usage").iterdir()) == [names[1]]
        assert not UsageJournal.objects.exists()
        assert journals_settle(tmp_path) == 0  # the live one still is not taken
    finally:
        for w in workers:
            w.kill()
            w.wait()


@pytest.mark.django_db(transaction=True)
def test_a_journal_settled_by_a_start_that_died_before_removing_it_is_not_counted_again(tmp_path):
    from tenancy.models import Usage
    from tenancy.services.usage import usage_journal_settle

    book = UsageBook(Journal.open(tmp_path))
    req = Req()
    book.begin(req, 6_000_000.0)
    name = book.journal_name
    book.journal.close(remove=False)  # the process died
    assert usage_journal_settle(name=name, tallies={})  # and a start settled it, then died
    assert journals_settle(tmp_path) == 1
    assert not Usage.objects.exists()
    assert not (tmp_path / "usage" / name).exists()


def test_a_rewrite_its_process_died_in_is_removed_and_a_live_ones_is_not(tmp_path):
    folder = tmp_path / "usage"
    folder.mkdir()
    dead = folder / ".host-1-ab.journal.new"
    dead.write_text("b\t1\n")
    live = Journal(folder / ".host-2-cd.journal.new")  # made and locked, as a rewrite does
    assert journals_settle(tmp_path) == 0
    assert sorted(p.name for p in folder.iterdir()) == [live.name]
    live.close(remove=True)


def test_on_the_loop_the_lines_of_one_turn_are_one_write_made_by_its_end(tmp_path, monkeypatch):
    import asyncio

    writes: list[bytes] = []
    real = os.write
    monkeypatch.setattr(journal_module.os, "write", lambda fd, b: writes.append(b) or real(fd, b))
    book = UsageBook(Journal.open(tmp_path))

    async def turns() -> list[str]:
        first, second = Req(), Req()
        book.begin(first, 6_000_000.0)
        book.begin(second, 6_000_000.0)
        held = lines(book.journal)
        await asyncio.sleep(0)
        book.record(key_id=7, project_id=3, model="chat", prompt=5, completion=6, error=False,
                    latency_ms=90, now=6_000_010.0, request=first.rid)  # fmt: skip
        return held

    assert asyncio.run(turns()) == []  # nothing written while the turn runs
    assert [w.count(b"\n") for w in writes] == [2, 1]
    assert [line[0] for line in lines(book.journal)] == ["s", "s", "e"]


def test_lines_held_for_the_turn_are_written_before_the_journal_is_closed(tmp_path):
    import asyncio

    book = UsageBook(Journal.open(tmp_path))
    path = book.journal.path

    async def stop() -> str | None:
        book.begin(Req(), 6_000_000.0)
        return book.close(written=True)  # the request is still open: the journal is kept

    assert asyncio.run(stop()) is None
    assert path.read_text().startswith("s\t1\t6000000")


def test_a_line_written_after_the_loop_stopped_follows_what_its_last_turn_held(tmp_path):
    import asyncio

    book = UsageBook(Journal.open(tmp_path))

    async def last_turn() -> None:
        book.record(key_id=7, project_id=3, model="chat", prompt=5, completion=6, error=False,
                    latency_ms=90, now=6_000_010.0)  # fmt: skip
        asyncio.get_running_loop().stop()  # the turn's end never comes: the server went down

    loop = asyncio.new_event_loop()
    loop.create_task(last_turn())
    loop.run_forever()
    loop.close()
    book.take()  # the last batch, taken as the server stops (Runtime.flush_now)

    assert [line[0] for line in lines(book.journal)] == ["e", "b"]
