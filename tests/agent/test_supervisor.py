"""Engine processes: ports, readiness, failures and stops."""

import asyncio
import os
import socket
from pathlib import Path

import pytest

from fleet.agent.ports import can_bind, choose_port
from fleet.agent.supervisor import Supervisor
from fleet.domain.causes import summary

from .helpers import FAKE_ENGINE, PATIENCE_S, free_port


def listening_socket():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def start_msg(shard_id="s1", *, args=(), engine="sim", port=None, timeout=PATIENCE_S, key="k1"):
    return {
        "type": "start_shard",
        "shard_id": shard_id,
        "replica_id": "r1",
        "rank": 0,
        "model": "tiny",
        "profile": {"name": "cpu", "engine": engine, "args": list(args)},
        "profile_fp": "fp1",
        "source": None,
        "gpu_indices": [],
        "http_port": port,
        "api_key": key,
        "threads": 1,
        "startup_timeout_s": timeout,
    }


class Recorder:
    """A supervisor with its shard_status messages kept in order."""

    def __init__(self, tmp_path, port_range=(24000, 24999)):
        self.sup = Supervisor(
            tmp_path,
            advertise_addr="127.0.0.1",
            port_range=port_range,
            cpu_count=4,
            sim_command=FAKE_ENGINE,
        )
        self.statuses = []
        self.sup.on_change = self.statuses.append

    def states(self, shard_id="s1"):
        return [m["state"] for m in self.statuses if m["shard_id"] == shard_id]

    async def until(self, state, shard_id="s1"):
        async with asyncio.timeout(PATIENCE_S):
            while state not in self.states(shard_id):
                await asyncio.sleep(0.02)
        return [m for m in self.statuses if m["shard_id"] == shard_id and m["state"] == state][-1]

    async def close(self):
        await self.sup.stop_all(grace_s=2)
        await self.sup.close()


def test_the_port_asked_for_is_used_when_free_and_in_the_range():
    port = free_port()
    assert choose_port(port, (port - 10, port + 10), set()) == port


def test_a_port_outside_the_range_is_not_used_even_when_free():
    # Agents sharing a machine get disjoint ranges; the control plane's choice knows none of them.
    port = free_port()
    chosen = choose_port(port, (24000, 24999), set())
    assert chosen != port and 24000 <= chosen <= 24999


def test_a_taken_port_falls_back_to_one_in_the_range():
    with listening_socket() as s:
        taken = s.getsockname()[1]
        assert not can_bind(taken)
        port = choose_port(taken, (24000, 24999), set())
    assert port != taken and 24000 <= port <= 24999


def test_ports_given_to_this_agents_shards_are_not_given_twice():
    assert choose_port(None, (24100, 24101), {24100}) == 24101
    with pytest.raises(OSError):
        choose_port(None, (24100, 24100), {24100})


@pytest.mark.asyncio
async def test_an_engine_becomes_ready_then_stops_with_its_grace(tmp_path):
    rec = Recorder(tmp_path)
    try:
        await rec.sup.start(start_msg(port=free_port()))
        ready = await rec.until("ready")
        shard = rec.sup.get("s1")
        assert ready["endpoint"] == f"http://127.0.0.1:{shard.port}"
        assert rec.states() == ["starting", "ready"]
        assert (tmp_path / "logs" / "s1.log").read_text().startswith("fake engine for tiny")
        pid = shard.pid
        await rec.sup.stop("s1", grace_s=5)
        stopped = await rec.until("stopped")
        assert stopped["exit_code"] == -15  # it went at SIGTERM, within the grace
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert rec.sup.get("s1") is None
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_an_engine_that_exits_fails_with_its_code_and_last_words(tmp_path):
    rec = Recorder(tmp_path)
    try:
        await rec.sup.start(start_msg(args=["--exit-with", "3"]))
        failed = await rec.until("failed")
        assert failed["exit_code"] == 3
        assert "exited with code 3" in failed["detail"]
        assert "not a GGUF file" in failed["detail"]
        assert rec.sup.shards() == []
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_an_engine_ended_by_a_signal_names_it(tmp_path):
    rec = Recorder(tmp_path)
    try:
        await rec.sup.start(start_msg(args=["--kill-self", "9"]))
        failed = await rec.until("failed")
        assert failed["exit_code"] == -9
        assert failed["detail"].startswith("The engine was stopped by SIGKILL.\n"), failed
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_the_line_that_says_why_comes_along_when_it_is_further_up_than_the_tail(tmp_path):
    rec = Recorder(tmp_path)
    try:
        await rec.sup.start(start_msg(args=["--traceback"]))
        failed = await rec.until("failed")
        lines = failed["detail"].splitlines()
        assert lines[0] == "The engine exited with code 1."
        # The traceback's last line, then the engine's last lines.
        assert lines[1:3] == [
            "ValueError: the model's max seq len is larger than the KV cache",
            "…",
        ]
        assert lines[-1] == "INFO shutting down worker 39"
        assert summary(failed["detail"]) == lines[1]
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_an_engine_never_ready_fails_at_its_startup_timeout_and_is_killed(tmp_path):
    rec = Recorder(tmp_path)
    try:
        await rec.sup.start(start_msg(args=["--never-ready"], timeout=1))
        process = rec.sup.get("s1").process
        failed = await rec.until("failed")
        assert "did not answer /health within 1 s" in failed["detail"]
        # What it said before it went quiet comes along, as for an engine that exits.
        assert "fake engine for tiny" in failed["detail"]
        assert process.returncode is not None
        assert rec.states() == ["starting", "failed"]
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_an_engine_stopped_before_it_answered_says_what_it_said(tmp_path):
    rec = Recorder(tmp_path)
    try:
        await rec.sup.start(start_msg(args=["--never-ready"]))
        await rec.until("starting")
        async with asyncio.timeout(PATIENCE_S):
            while "fake engine" not in (tmp_path / "logs" / "s1.log").read_text():
                await asyncio.sleep(0.02)
        await rec.sup.stop("s1", grace_s=5)
        stopped = await rec.until("stopped")
        assert stopped["detail"].startswith("Stopped before the engine answered /health.\n")
        assert "fake engine for tiny" in stopped["detail"]
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_an_engines_log_is_read_back_after_it_exited(tmp_path):
    rec = Recorder(tmp_path)
    try:
        await rec.sup.start(start_msg(args=["--exit-with", "3"]))
        await rec.until("failed")
        assert rec.sup.log_lines("s1", 1) == ["fatal: the model file is not a GGUF file"]
        assert rec.sup.log_lines("s1", 1000)[0].startswith("fake engine for tiny")
        assert rec.sup.log_lines("never-ran", 10) is None
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_a_taken_port_still_gets_a_ready_engine_on_another(tmp_path):
    rec = Recorder(tmp_path)
    try:
        with listening_socket() as s:
            taken = s.getsockname()[1]
            await rec.sup.start(start_msg(port=taken))
            ready = await rec.until("ready")
        port = int(ready["endpoint"].rsplit(":", 1)[1])
        assert port != taken and 24000 <= port <= 24999
    finally:
        await rec.close()


@pytest.mark.asyncio
async def test_an_unknown_engine_fails_with_a_sentence_and_nothing_runs(tmp_path):
    rec = Recorder(tmp_path)
    await rec.sup.start(start_msg(engine="tgi"))
    assert rec.statuses == [
        {
            "type": "shard_status",
            "shard_id": "s1",
            "state": "failed",
            "detail": "The engine 'tgi' of profile cpu is not one this agent runs (llamacpp, sim, vllm).",
        }
    ]
    assert rec.sup.shards() == []
    await rec.close()


@pytest.mark.asyncio
async def test_an_engine_not_installed_fails_with_a_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    rec = Recorder(tmp_path)
    await rec.sup.start(start_msg(engine="llamacpp"))
    failed = await rec.until("failed")
    assert failed["detail"].startswith("The llamacpp engine is not installed on this node")
    await rec.close()


@pytest.mark.asyncio
async def test_stopping_a_shard_not_here_reports_it_stopped(tmp_path):
    rec = Recorder(tmp_path)
    await rec.sup.stop("ghost", grace_s=1)
    assert rec.statuses == [
        {
            "type": "shard_status",
            "shard_id": "ghost",
            "state": "stopped",
            "detail": "Not running on this node.",
        }
    ]
    await rec.close()


@pytest.mark.asyncio
async def test_the_engine_does_not_inherit_the_agents_token(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMGW_TOKEN", "join-secret")
    rec = Recorder(tmp_path)
    try:
        await rec.sup.start(start_msg())
        await rec.until("ready")
        environ = Path(f"/proc/{rec.sup.get('s1').pid}/environ").read_bytes().split(b"\0")
        assert b"LLMGW_TOKEN=join-secret" not in environ
        assert b"LLMGW_ENGINE_API_KEY=k1" in environ
    finally:
        await rec.close()
