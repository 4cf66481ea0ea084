"""Engines outlive a killed agent: the next run adopts them or stops them (issue 12, item 7).

Real processes throughout: the agent (`llmgw agent`'s main) against the fake control
plane, the fake engine, and plain processes standing for an engine that is gone, a pid
given to someone else, and the workers a dead engine left in its process group.
"""

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from fleet.agent.engines import ShardSpec
from fleet.agent.ledger import Entry, Ledger, boot_id, proc_stat
from fleet.agent.supervisor import Supervisor

from .helpers import FAKE_ENGINE, PATIENCE_S, free_port
from .test_client import REPO, TOKEN, FakeControlPlane, alive, engine_port, start_shard


def _agent(cp, state_dir):
    env = {**os.environ, "LLMGW_TOKEN": TOKEN, "LLMGW_AGENT_SIM_COMMAND": " ".join(FAKE_ENGINE)}
    return subprocess.Popen(
        [
            sys.executable, "-c", "from fleet.agent.main import main; raise SystemExit(main())",
            "--server", f"http://127.0.0.1:{cp.port}", "--state-dir", str(state_dir),
            "--node-id", "node-1", "--heartbeat-interval", "0.2", "--cpus", "4",
            "--port-range", "25000-25999",
        ],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def _gone(pid):
    async with asyncio.timeout(PATIENCE_S):
        while (s := proc_stat(pid)) is not None and s.state != "Z":
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_an_engine_outlives_a_killed_agent_and_the_next_run_adopts_it_with_its_key(tmp_path):
    cp = FakeControlPlane(token=TOKEN)
    await cp.start()
    first = _agent(cp, tmp_path)
    second = None
    try:
        await cp.until("register")
        port = engine_port()
        await cp.send(start_shard(port))
        [ready] = await cp.until("shard_status", state="ready")
        ledger = tmp_path / "shards" / "s1.json"
        assert stat.S_IMODE(ledger.stat().st_mode) == 0o600
        written = json.loads(ledger.read_text())
        assert written["spec"]["api_key"] == "engine-key" and written["state"] == "ready"
        pid = written["pid"]
        assert proc_stat(pid).start_time == written["start_time"]

        first.send_signal(signal.SIGKILL)
        first.wait(timeout=PATIENCE_S)
        assert alive(pid), "the engine went with the agent"

        second = _agent(cp, tmp_path)
        [register] = await cp.until("register", conn=1)
        [shard] = register["shards"]
        assert shard["shard_id"] == "s1" and shard["state"] == "ready"
        assert shard["endpoint"] == ready["endpoint"] == f"http://127.0.0.1:{port}"
        assert json.loads(ledger.read_text())["pid"] == pid
        # Watched as its own: its load read with its key, its log, its stop with grace.
        [load] = (await cp.until("engine_load", conn=1))[:1]
        assert load["shards"][0] == {"shard_id": "s1", "running": 3, "waiting": 1, "kv_cache": 0.25}
        await cp.send({"type": "engine_log", "request_id": "q1", "shard_id": "s1", "lines": 5})
        [lines] = await cp.until("engine_log_lines", conn=1)
        assert lines["found"] and lines["lines"][0].startswith("fake engine for tiny")
        await cp.send({"type": "stop_shard", "shard_id": "s1", "grace_s": 5})
        [stopped] = await cp.until("shard_status", conn=1, state="stopped")
        assert "exit_code" not in stopped  # not its child: how it ended is not known
        await _gone(pid)
        assert not ledger.exists()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=PATIENCE_S)
        await cp.close()


def _spec(shard_id="s1", *, timeout=PATIENCE_S, key="k1"):
    return ShardSpec(
        shard_id=shard_id,
        model="tiny",
        profile={"name": "cpu", "engine": "sim"},
        replica_id="r1",
        profile_fp="fp1",
        api_key=key,
        startup_timeout_s=timeout,
    )


def _entry(pid, *, start_time=None, port=1, state="ready", started_at=None, **spec):
    return Entry(
        spec=_spec(**spec),
        pid=pid,
        start_time=proc_stat(pid).start_time if start_time is None else start_time,
        boot=boot_id(),
        port=port,
        log_path="",
        state=state,
        started_at=time.time() if started_at is None else started_at,
    )


def _engine(port, *args):
    """The fake engine as an earlier agent would have left it: in a session of its own."""
    env = {**os.environ, "LLMGW_ENGINE_API_KEY": "k1"}
    return subprocess.Popen(
        [*FAKE_ENGINE, "--port", str(port), "--model", "tiny", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def _supervisor(tmp_path):
    sup = Supervisor(tmp_path, advertise_addr="127.0.0.1", port_range=(25000, 25999))
    statuses = []
    sup.on_change = statuses.append
    return sup, statuses


async def _listening(port):
    async with asyncio.timeout(PATIENCE_S):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return


@pytest.mark.asyncio
async def test_an_adopted_engine_that_exits_fails_like_one_started_here(tmp_path):
    port = free_port()
    engine = _engine(port)
    sup, statuses = _supervisor(tmp_path)
    try:
        await _listening(port)
        Ledger(tmp_path / "shards").record(_entry(engine.pid, port=port))
        assert await sup.adopt() == ["s1"]
        assert sup.get("s1").state == "ready" and sup.get("s1").pid == engine.pid
        engine.kill()
        async with asyncio.timeout(PATIENCE_S):
            while not statuses:
                await asyncio.sleep(0.02)
        assert statuses[0]["state"] == "failed"
        assert statuses[0]["detail"].startswith("The engine exited.")
        assert sup.shards() == [] and not (tmp_path / "shards" / "s1.json").exists()
    finally:
        engine.kill()
        engine.wait()
        await sup.stop_all(grace_s=2)
        await sup.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("state", "started_s_ago", "adopted"),
    [("starting", 0, True), ("starting", 2 * PATIENCE_S, False), ("ready", 0, False)],
)
async def test_an_engine_not_answering_is_adopted_only_while_still_within_its_startup(
    tmp_path, state, started_s_ago, adopted
):
    port = free_port()
    engine = _engine(port, "--never-ready")
    sup, statuses = _supervisor(tmp_path)
    try:
        await _listening(port)
        entry = _entry(engine.pid, port=port, state=state, started_at=time.time() - started_s_ago)
        Ledger(tmp_path / "shards").record(entry)
        assert await sup.adopt(grace_s=5) == (["s1"] if adopted else [])
        if adopted:
            assert sup.get("s1").state == "starting" and engine.poll() is None
        else:
            # Ours (same start time) and silent: stopped, at SIGTERM within its grace.
            assert engine.wait(timeout=PATIENCE_S) == -signal.SIGTERM
            assert not (tmp_path / "shards" / "s1.json").exists()
        assert statuses == []  # nothing to say yet: register lists what was adopted
    finally:
        engine.kill()
        engine.wait()
        await sup.stop_all(grace_s=2)
        await sup.close()


@pytest.mark.asyncio
async def test_an_entry_whose_engine_is_gone_is_dropped(tmp_path):
    done = subprocess.Popen(["sleep", "300"])
    entry = _entry(done.pid)
    done.kill()
    done.wait()
    Ledger(tmp_path / "shards").record(entry)
    sup, statuses = _supervisor(tmp_path)
    assert await sup.adopt() == []
    assert list((tmp_path / "shards").iterdir()) == [] and statuses == []


@pytest.mark.asyncio
async def test_a_pid_now_another_process_is_dropped_and_that_process_left_alone(tmp_path):
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        # Its pid, but not its start: the engine written down was an earlier process.
        before = proc_stat(other.pid).start_time - 1
        Ledger(tmp_path / "shards").record(_entry(other.pid, start_time=before))
        sup, _ = _supervisor(tmp_path)
        assert await sup.adopt() == []
        assert not (tmp_path / "shards" / "s1.json").exists()
        assert other.poll() is None, "a process that was not ours was stopped"
    finally:
        other.kill()
        other.wait()


@pytest.mark.asyncio
async def test_what_a_dead_engine_left_in_its_process_group_is_killed(tmp_path):
    # A leader that forks a worker into its group and dies, as a vLLM engine would leave it.
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!; read x"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    worker = int(leader.stdout.readline())
    entry = _entry(leader.pid)
    leader.stdin.close()
    leader.wait(timeout=PATIENCE_S)
    assert proc_stat(worker).pgrp == leader.pid
    Ledger(tmp_path / "shards").record(entry)
    sup, _ = _supervisor(tmp_path)
    try:
        assert await sup.adopt() == []
        await _gone(worker)
        assert not (tmp_path / "shards" / "s1.json").exists()
    finally:
        if proc_stat(worker) is not None:
            os.kill(worker, signal.SIGKILL)


def test_a_ledger_file_that_cannot_be_read_is_dropped(tmp_path):
    ledger = Ledger(tmp_path / "shards")
    ledger.record(_entry(os.getpid()))
    (tmp_path / "shards" / "junk.json").write_text('{"spec": 3}')
    (tmp_path / "shards" / "bad.json").write_text("not json")
    [entry] = ledger.entries()
    assert entry.spec == _spec() and entry.pid == os.getpid()
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == ["s1.json"]
    assert stat.S_IMODE((tmp_path / "shards").stat().st_mode) == 0o700
