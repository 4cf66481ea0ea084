"""The agent against a fake control plane on a loopback websocket."""

import asyncio
import json
import os
import signal
import socket
import sys
from http import HTTPStatus
from pathlib import Path

import pytest
from websockets.asyncio.server import serve

from fleet.agent.client import Agent, AgentSettings
from fleet.agent.credentials import Credentials
from fleet.agent.discovery import LoadSampler, Machine, simulated_gpus
from fleet.agent.ports import can_bind
from fleet.agent.sensors import SensorSampler
from fleet.agent.supervisor import Supervisor
from fleet.protocol import Heartbeat, parse

from .helpers import FAKE_ENGINE, PATIENCE_S, FakeNVML, free_port, put

REPO = Path(__file__).resolve().parents[2]
TOKEN = "join-s3cret"


def engine_port():
    """A free port inside the agents' port range: the agent keeps engines to its range."""
    for port in range(25000, 26000):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise OSError("no free port in 25000-25999")


class FakeControlPlane:
    """Accepts agents with the right token, answers register, records the rest."""

    def __init__(self, token):
        self.token = token
        self.refused = 0
        self.messages = []  # (connection number, message)
        self.connections = []
        self.port = free_port()
        self.server = None

    @property
    def url(self):
        return f"ws://127.0.0.1:{self.port}/ws/agent/"

    def _check_token(self, connection, request):
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.refused += 1
            return connection.respond(HTTPStatus.FORBIDDEN, "no\n")
        return None

    async def _serve(self, ws):
        self.connections.append(ws)
        n = len(self.connections) - 1
        async for raw in ws:
            msg = json.loads(raw)
            self.messages.append((n, msg))
            if msg["type"] == "register":
                await ws.send(json.dumps({"type": "registered", "node_id": msg["node_id"]}))

    async def start(self):
        self.server = await serve(
            self._serve, "127.0.0.1", self.port, process_request=self._check_token
        )

    async def crash(self):
        """Drop every connection without a goodbye, as a killed server would."""
        self.server.close(close_connections=False)
        for ws in self.connections:
            ws.transport.abort()
        await self.server.wait_closed()

    async def close(self):
        self.server.close()
        await self.server.wait_closed()

    async def send(self, msg):
        await self.connections[-1].send(json.dumps(msg))

    def of(self, kind, conn=None, **match):
        return [
            m
            for n, m in self.messages
            if m["type"] == kind
            and (conn is None or n == conn)
            and all(m.get(k) == v for k, v in match.items())
        ]

    async def until(self, kind, conn=None, count=1, **match):
        async with asyncio.timeout(PATIENCE_S):
            while len(self.of(kind, conn, **match)) < count:
                await asyncio.sleep(0.02)
        return self.of(kind, conn, **match)


def make_agent(tmp_path, url, load_sampler=None):
    machine = Machine(
        tmp_path,
        gpus=simulated_gpus("2xl40s-48g", "node-1"),
        engines={"sim": "1"},
        memory_gb=64,
        cpus=8,
        disk_gb=500,
    )
    sup = Supervisor(
        tmp_path,
        advertise_addr="127.0.0.1",
        port_range=(25000, 25999),
        cpu_count=8,
        sim_command=FAKE_ENGINE,
    )
    settings = AgentSettings(
        ws_url=url,
        credentials=Credentials(tmp_path, TOKEN),
        node_id="node-1",
        advertise_addr="127.0.0.1",
        labels={"rack": "r1"},
        heartbeat_interval_s=0.2,
    )
    return Agent(settings, machine, sup, load_sampler or LoadSampler(include_memory=False))


def start_shard(port, shard_id="s1"):
    return {
        "type": "start_shard",
        "shard_id": shard_id,
        "replica_id": "r1",
        "rank": 0,
        "model": "tiny",
        "profile": {
            "name": "cpu",
            "engine": "sim",
            "args": ["--running", "3"],
            "env": {"LLMGW_ENGINE_API_KEY": "the-profile-cannot-set-this"},
        },
        "profile_fp": "fp1",
        "source": None,
        "gpu_indices": [],
        "http_port": port,
        "api_key": "engine-key",
        "threads": 2,
        "startup_timeout_s": PATIENCE_S,
    }


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.asyncio
async def test_the_agent_registers_runs_a_shard_and_survives_a_control_plane_restart(tmp_path):
    cp = FakeControlPlane(token="not-this-agents")
    await cp.start()
    agent = make_agent(tmp_path, cp.url)
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        # Refused for its token, the agent keeps trying until it is let in.
        async with asyncio.timeout(PATIENCE_S):
            while cp.refused < 2:
                await asyncio.sleep(0.02)
        cp.token = TOKEN
        [register] = await cp.until("register")
        assert register["node_id"] == "node-1"
        assert register["mgmt_addr"] == "127.0.0.1"
        assert register["labels"] == {"rack": "r1"}
        assert register["gpus"][1] == {
            "index": 1,
            "uuid": "SIM-node-1-1",
            "name": "NVIDIA L40S",
            "memory_total_mb": 46068,
        }
        assert (register["memory_total_mb"], register["cpu_count"]) == (64 * 1024, 8)
        assert register["disk"] == {"free_gb": 500.0, "total_gb": 500.0}
        assert (register["engines"], register["engines_probed"]) == ({"sim": "1"}, True)
        assert (register["weights"], register["shards"]) == ([], [])
        assert cp.messages[0][1]["type"] == "register"

        port = engine_port()
        await cp.send(start_shard(port))
        await cp.until("shard_status", state="ready")
        statuses = cp.of("shard_status", shard_id="s1")
        assert [s["state"] for s in statuses] == ["starting", "ready"]
        assert statuses[1]["endpoint"] == f"http://127.0.0.1:{port}"

        beats = await cp.until("heartbeat", conn=0, count=3)
        assert [b["seq"] for b in beats] == list(range(1, len(beats) + 1))
        assert beats[-1]["cpu_count"] == 8
        # The engine's /metrics wants its key: these figures prove it got it.
        [load] = (await cp.until("engine_load"))[:1]
        assert load == {
            "type": "engine_load",
            "shards": [{"shard_id": "s1", "running": 3, "waiting": 1, "kv_cache": 0.25}],
        }
        # From the second read on, the prefix cache's hit rate over the reads: 30 of 100.
        later = (await cp.until("engine_load", count=2))[1]
        assert later["shards"][0]["prefix_hit_rate"] == 0.3

        pid = agent.supervisor.get("s1").pid
        await cp.send(start_shard(port))  # again: re-reported, not started twice
        await cp.until("shard_status", shard_id="s1", count=3)
        assert cp.of("shard_status")[-1]["state"] == "ready"
        assert agent.supervisor.get("s1").pid == pid

        await cp.crash()
        await cp.start()
        [again] = await cp.until("register", conn=1)
        assert again["shards"] == [
            {
                "shard_id": "s1",
                "replica_id": "r1",
                "model": "tiny",
                "profile": "cpu",
                "profile_fp": "fp1",
                "gpu_indices": [],
                "endpoint": f"http://127.0.0.1:{port}",
                "state": "ready",
            }
        ]
        assert agent.supervisor.get("s1").pid == pid and alive(pid)
        beats = await cp.until("heartbeat", conn=1, count=2)
        assert [b["seq"] for b in beats[:2]] == [1, 2]
        assert beats[0]["shards"] == [{"shard_id": "s1", "state": "ready"}]

        await cp.send({"type": "stop_shard", "shard_id": "s1", "grace_s": 5})
        [stopped] = await cp.until("shard_status", conn=1, state="stopped")
        assert stopped["shard_id"] == "s1"
        assert not alive(pid)
    finally:
        stop.set()
        await running
        await cp.close()


@pytest.mark.asyncio
async def test_a_heartbeat_carries_the_nodes_sensors_and_each_engines_use(tmp_path):
    sys_root = tmp_path / "sys"
    put(sys_root, "class/hwmon/hwmon0/name", "coretemp")
    put(sys_root, "class/hwmon/hwmon0/temp1_input", "58000")
    put(sys_root, "class/hwmon/hwmon0/temp1_label", "Package id 0")
    put(sys_root, "class/hwmon/hwmon1/name", "nct6775")
    put(sys_root, "class/hwmon/hwmon1/temp1_input", "24500")
    put(sys_root, "class/hwmon/hwmon1/temp1_label", "SYSTIN")
    card = {"temp": 71, "power_mw": 612450, "limit_mw": 700000, "reasons": 0x4, "used": 1 << 30}
    nvml = FakeNVML([card, {"temp": 40}])
    sensors = SensorSampler(sys_root=sys_root, nvml=nvml)
    cp = FakeControlPlane(token=TOKEN)
    await cp.start()
    agent = make_agent(tmp_path, cp.url, LoadSampler(include_memory=False, sensors=sensors))
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        await cp.until("register")
        await cp.send(start_shard(engine_port()))
        await cp.until("shard_status", state="ready")
        # The engine's CPU needs two samples of it.
        async with asyncio.timeout(PATIENCE_S):
            while not [
                b
                for b in cp.of("heartbeat")
                if "cpu_cores" in b["load"].get("shards", {}).get("s1", {})
            ]:
                await asyncio.sleep(0.02)
        beat = cp.of("heartbeat")[-1]
        load = beat["load"]
        assert (load["cpu_temp_c"], load["inlet_temp_c"]) == (58.0, 24.5)
        assert "cpu_power_w" not in load  # no RAPL here: absent, not zero
        assert load["gpus"] == [
            {
                "index": 0,
                "temp_c": 71.0,
                "power_w": 612.45,
                "power_limit_w": 700.0,
                "memory_used_mb": 1024,
                "throttle": ["sw_power_cap"],
            },
            {"index": 1, "temp_c": 40.0},
        ]
        use = load["shards"]["s1"]
        assert use["rss_bytes"] > 1 << 20 and use["cpu_cores"] >= 0
        # The control plane takes it as it is.
        hb = parse(json.dumps(beat))
        assert isinstance(hb, Heartbeat) and hb.load.shards["s1"].rss_bytes == use["rss_bytes"]
    finally:
        stop.set()
        await running
        await cp.close()
    assert nvml.shutdowns == 1, "NVML is released when the agent stops"


@pytest.mark.asyncio
async def test_a_shard_that_ends_while_disconnected_is_reported_after_register(tmp_path):
    cp = FakeControlPlane(token=TOKEN)
    await cp.start()
    agent = make_agent(tmp_path, cp.url)
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        await cp.until("register")
        await cp.send(start_shard(engine_port()))
        await cp.until("shard_status", state="ready")
        await cp.crash()
        os.killpg(agent.supervisor.get("s1").pid, signal.SIGKILL)
        async with asyncio.timeout(PATIENCE_S):
            while agent.supervisor.shards():
                await asyncio.sleep(0.02)
        await cp.start()
        [register] = await cp.until("register", conn=1)
        assert register["shards"] == []
        [failed] = await cp.until("shard_status", conn=1)
        assert (failed["shard_id"], failed["state"], failed["exit_code"]) == ("s1", "failed", -9)
        # Sent after the register was answered, never before it.
        kinds = [m["type"] for n, m in cp.messages if n == 1]
        assert kinds.index("register") < kinds.index("shard_status")
    finally:
        stop.set()
        await running
        await cp.close()


@pytest.mark.asyncio
async def test_engine_log_is_answered_with_the_engines_last_lines(tmp_path):
    cp = FakeControlPlane(token=TOKEN)
    await cp.start()
    agent = make_agent(tmp_path, cp.url)
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        await cp.until("register")
        await cp.send(start_shard(engine_port()))
        await cp.until("shard_status", state="ready")
        await cp.send({"type": "engine_log", "request_id": "q1", "shard_id": "s1", "lines": 5})
        await cp.send({"type": "engine_log", "request_id": "q2", "shard_id": "s9", "lines": 5})
        [found] = await cp.until("engine_log_lines", request_id="q1")
        [missing] = await cp.until("engine_log_lines", request_id="q2")
        assert found["shard_id"] == "s1" and found["found"] is True
        assert found["lines"][0].startswith("fake engine for tiny")
        assert (missing["found"], missing["lines"]) == (False, [])
        # What the agent answers is a message the control plane accepts.
        assert parse(json.dumps(found)).lines == found["lines"]
    finally:
        stop.set()
        await running
        await cp.close()


@pytest.mark.asyncio
async def test_an_error_answer_to_register_is_retried(tmp_path):
    answers = iter(["error", "registered"])
    seen = []

    async def serve_once(ws):
        async for raw in ws:
            msg = json.loads(raw)
            seen.append(msg["type"])
            if msg["type"] == "register":
                kind = next(answers)
                await ws.send(
                    json.dumps({"type": kind, "detail": "node_id is taken", "node_id": "node-1"})
                )

    port = free_port()
    async with serve(serve_once, "127.0.0.1", port):
        agent = make_agent(tmp_path, f"ws://127.0.0.1:{port}/ws/agent/")
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        async with asyncio.timeout(PATIENCE_S):
            await agent.connected.wait()
        stop.set()
        await running
    assert seen[:2] == ["register", "register"]


@pytest.mark.asyncio
async def test_sigterm_stops_the_engines_and_the_agent_exits_0(tmp_path):
    cp = FakeControlPlane(token=TOKEN)
    await cp.start()
    env = {**os.environ, "LLMGW_TOKEN": TOKEN, "LLMGW_AGENT_SIM_COMMAND": " ".join(FAKE_ENGINE)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from fleet.agent.main import main; raise SystemExit(main())",
        "--server",
        f"http://127.0.0.1:{cp.port}",
        "--state-dir",
        str(tmp_path),
        "--heartbeat-interval",
        "0.2",
        "--cpus",
        "4",
        "--labels",
        "zone=a,rack=r2",
        cwd=REPO,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        [register] = await cp.until("register")
        assert register["node_id"] == (tmp_path / "node-id").read_text().strip()
        assert register["labels"] == {"zone": "a", "rack": "r2"}
        port = engine_port()
        await cp.send(start_shard(port))
        await cp.until("shard_status", state="ready")
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(PATIENCE_S):
            assert await proc.wait() == 0
        # It said so before going, and the engine's port is free again.
        assert cp.of("shard_status")[-1]["state"] == "stopped"
        assert can_bind(port)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await cp.close()
