"""Each engine's CPU and memory, from a fake /proc and from the real one."""

import subprocess
import sys
import time

import pytest

from fleet.agent.discovery import LoadSampler
from fleet.agent.shard_use import ShardUseSampler, parse_stat

from .helpers import put

HZ, PAGE = 100, 4096


class Clock:
    def __init__(self, t=500.0):
        self.t = t

    def __call__(self):
        return self.t


def proc(root, pid, *, pgrp, session, utime, stime, start=1000, rss_pages=0, comm="python3"):
    """One process in a fake /proc: its stat and statm."""
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime stime cutime cstime priority nice threads itreal starttime ...
    stat = (
        f"{pid} ({comm}) S 1 {pgrp} {session} 0 -1 4194560 100 0 0 0 "
        f"{utime} {stime} 0 0 20 0 4 0 {start} 123456 789 18446744073709551615"
    )
    put(root, f"{pid}/stat", stat)
    put(root, f"{pid}/statm", f"9999 {rss_pages} 10 1 0 20 0")


def sampler(root, clock):
    return ShardUseSampler(proc_root=root, clock=clock, ticks_per_s=HZ, page_size=PAGE)


def test_a_stat_line_is_read_past_a_command_name_with_spaces_and_parens():
    text = "4242 (vllm (worker) 1) R 1 4200 4200 0 -1 0 0 0 0 0 150 50 7 3 20 0 1 0 9876 0 0"
    st = parse_stat(4242, text)
    assert (st.pgrp, st.session, st.ticks, st.start) == (4200, 4200, 200, 9876)
    assert parse_stat(1, "garbage") is None


def test_an_engines_cores_and_memory_are_its_whole_groups(tmp_path):
    clock = Clock()
    # Shard a: a server (pid 100) and a worker it forked into its group, and
    # one that made a group of its own inside the engine's session.
    proc(tmp_path, 100, pgrp=100, session=100, utime=1000, stime=200, rss_pages=1000)
    proc(tmp_path, 101, pgrp=100, session=100, utime=5000, stime=0, rss_pages=3000)
    proc(tmp_path, 102, pgrp=102, session=100, utime=10, stime=0, rss_pages=10)
    # Shard b, and the agent itself, which belongs to neither.
    proc(tmp_path, 200, pgrp=200, session=200, utime=50, stime=50, rss_pages=500)
    proc(tmp_path, 7, pgrp=7, session=7, utime=99999, stime=0, rss_pages=77777)
    put(tmp_path, "self/stat", "not a pid directory")
    s = sampler(tmp_path, clock)

    first = s.sample({"a": 100, "b": 200})
    # Memory at once; cores need a second sample.
    assert first == {"a": {"rss_bytes": 4010 * PAGE}, "b": {"rss_bytes": 500 * PAGE}}

    clock.t += 10
    proc(tmp_path, 100, pgrp=100, session=100, utime=1500, stime=300, rss_pages=1000)
    proc(tmp_path, 101, pgrp=100, session=100, utime=7400, stime=0, rss_pages=3500)
    proc(tmp_path, 102, pgrp=102, session=100, utime=10, stime=0, rss_pages=10)
    proc(tmp_path, 200, pgrp=200, session=200, utime=100, stime=100, rss_pages=500)
    second = s.sample({"a": 100, "b": 200})
    # a: 600 + 2400 ticks = 30 s of CPU in 10 s; b: 100 ticks = 1 s.
    assert second["a"] == {"cpu_cores": 3.0, "rss_bytes": 4510 * PAGE}
    assert second["b"] == {"cpu_cores": 0.1, "rss_bytes": 500 * PAGE}


def test_a_process_started_between_samples_counts_all_it_used(tmp_path):
    clock = Clock()
    proc(tmp_path, 100, pgrp=100, session=100, utime=100, stime=0)
    proc(tmp_path, 150, pgrp=100, session=100, utime=9000, stime=0, start=1)
    s = sampler(tmp_path, clock)
    s.sample({"a": 100})
    clock.t += 10
    # Pid 150 was given to a new process (a later start) after the first exited.
    proc(tmp_path, 150, pgrp=100, session=100, utime=300, stime=0, start=5000)
    proc(tmp_path, 160, pgrp=100, session=100, utime=200, stime=0, start=5001)
    assert s.sample({"a": 100})["a"]["cpu_cores"] == 0.5


def test_a_shard_whose_processes_are_gone_is_left_out(tmp_path):
    s = sampler(tmp_path, Clock())
    proc(tmp_path, 100, pgrp=100, session=100, utime=1, stime=1, rss_pages=1)
    assert s.sample({"a": 100, "gone": 300}) == {"a": {"rss_bytes": PAGE}}
    assert s.sample({}) == {}


def test_a_restarted_engine_starts_its_cpu_figure_afresh(tmp_path):
    clock = Clock()
    proc(tmp_path, 100, pgrp=100, session=100, utime=100, stime=0, rss_pages=1)
    s = sampler(tmp_path, clock)
    s.sample({"a": 100})
    clock.t += 10
    proc(tmp_path, 400, pgrp=400, session=400, utime=100, stime=0, rss_pages=1)
    assert s.sample({"a": 400}) == {"a": {"rss_bytes": PAGE}}


def test_an_unreadable_proc_says_nothing(tmp_path):
    assert sampler(tmp_path / "missing", Clock()).sample({"a": 100}) == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the real /proc")
def test_a_real_process_groups_use_is_read_from_proc():
    busy = "import time\nend = time.time() + 5\nprint(flush=True)\nwhile time.time() < end: pass\n"
    child = subprocess.Popen(
        [sys.executable, "-c", busy], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        child.stdout.readline()  # running Python, not still being exec'd
        sampler_ = LoadSampler(include_memory=False)
        first = sampler_.sample_load({"s1": child.pid})
        assert first["shards"]["s1"]["rss_bytes"] > 1 << 20
        time.sleep(0.3)
        use = sampler_.sample_load({"s1": child.pid})["shards"]["s1"]
        # It spins on one core; a busy test machine may give it less.
        assert 0.05 < use["cpu_cores"] <= 1.5
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
