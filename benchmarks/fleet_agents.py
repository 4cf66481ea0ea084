"""The simulated agents of benchmarks/fleet.py: one client process's share of the fleet.

Each agent behaves on the wire as `llmgw agent` does (fleet/agent/client.py): it connects
with the join token the first time and with the node's own credential (`registered.
node_token`) after, falling back on the join token when that is refused; it registers
with 8 simulated H100s and the shards it runs, heartbeats on a fixed beat, answers
`start_shard` with `shard_status` starting then ready (an endpoint on its own address;
no engine runs behind it) and `stop_shard` with stopped, and reconnects with the
agent's own backoff after any disconnect. No Django here: the agent has none either.

The process is driven over a pipe by the benchmark: commands in, one reply each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import time
from collections import Counter

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus, WebSocketException

from benchmarks.heartbeats import _heartbeat
from fleet.agent import AGENT_VERSION
from fleet.agent.client import REGISTER_TIMEOUT_S, AgentSettings, Backoff
from fleet.agent.discovery import simulated_gpus

# The agent's own figures, read from where the agent keeps them.
HEARTBEAT_INTERVAL_S = AgentSettings.__dataclass_fields__["heartbeat_interval_s"].default
BACKOFF_BASE_S = AgentSettings.__dataclass_fields__["backoff_base_s"].default
BACKOFF_MAX_S = AgentSettings.__dataclass_fields__["backoff_max_s"].default
GPUS = "8xh100-80g"
ADDR = "127.0.0.1"
# How long a fake engine takes from starting to ready.
START_S = 0.5
PROBE_TIMEOUT_S = 10.0
# heartbeats.py's 8-GPU load, the same every beat: what the server validates and keeps.
_SAMPLE = json.loads(_heartbeat(0))
LOAD = _SAMPLE["load"]
MEMORY_TOTAL_MB = _SAMPLE["memory_total_mb"]
CPU_COUNT = _SAMPLE["cpu_count"]


def node_id(n: int) -> str:
    """The node id of agent number n of the fleet."""
    return f"fleet-{n:05d}"


def raise_nofile() -> tuple[int, int]:
    """Raise this process's open-files limit to its hard limit; (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


_background: set[asyncio.Task] = set()


def _spawn(coro) -> None:
    # Held here: the loop keeps its tasks only weakly.
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


class RegisterRefused(Exception):
    """`register` was answered with an error."""


class Stats:
    """What this process's agents saw, for the benchmark to read."""

    def __init__(self) -> None:
        self.connected = 0
        self.registered = 0  # registered frames received, ever
        self.marked_at = 0.0
        self.since_mark: set[int] = set()  # agents registered since the mark
        self.last_since_mark = 0.0
        # Per agent registered since the mark: when the attempt that did it began, and when
        # it was registered (monotonic seconds, one clock for every process of the machine).
        self.again: list[tuple[float, float]] = []
        self.latencies: list[float] = []
        self.probe_timeouts = 0
        self.late_beats = 0  # sent a second or more after they were due: this client is slow
        self.beats = 0
        self.events: Counter[str] = Counter()  # failures, close codes, errors, commands


class FakeAgent:
    """One node's agent: a session at a time, reconnecting forever."""

    def __init__(self, n: int, url: str, join_token: str, stats: Stats) -> None:
        self.n, self.url, self.join_token, self.stats = n, url, join_token, stats
        self.node_id = node_id(n)
        self.token: str | None = None  # the node's own credential, once issued
        self.gpus = [g.to_message() for g in simulated_gpus(GPUS, self.node_id)]
        self.shards: dict[str, dict] = {}  # shard_id -> its register entry
        self.ws = None
        self.registered = False  # in a session now
        self.send_lock = asyncio.Lock()
        self.allowed = asyncio.Event()  # cleared: do not connect (silenced with its socket)
        self.allowed.set()
        self.quiet = False  # no heartbeats, the connection kept open
        self.last_beat = 0.0
        self.probe: asyncio.Future | None = None
        self.probe_fraction = 0.0
        self.tail = ""  # the heartbeat after its seq, made again when the shards change
        self.attempt_at = 0.0  # when this session's connect began

    async def run(self) -> None:
        """Connect, serve the session, reconnect with the agent's backoff, until cancelled."""
        backoff = Backoff(BACKOFF_BASE_S, BACKOFF_MAX_S)
        while True:
            await self.allowed.wait()
            registered = False
            headers = {"Authorization": f"Bearer {self.token or self.join_token}"}
            self.attempt_at = time.monotonic()
            try:
                async with connect(self.url, additional_headers=headers) as ws:
                    registered = await self._session(ws)
            except RegisterRefused as exc:
                self.stats.events[f"register refused: {str(exc)[:70]}"] += 1
            except InvalidStatus as exc:
                status = exc.response.status_code
                self.stats.events[f"http {status}"] += 1
                if status in (401, 403) and self.token is not None:
                    self.token = None  # refused: join again with the join token, at once
                    backoff.reset()
            except (OSError, WebSocketException, TimeoutError) as exc:
                self.stats.events[type(exc).__name__] += 1
            finally:
                self.ws = None
            if registered:
                backoff.reset()
            await asyncio.sleep(backoff.delay())

    def register_message(self) -> dict:
        """The `register` the real agent sends for a simulated 8-GPU node."""
        return {
            "type": "register", "node_id": self.node_id, "hostname": self.node_id,
            "mgmt_addr": ADDR, "labels": {}, "agent_version": AGENT_VERSION, "gpus": self.gpus,
            "engines": {"sim": AGENT_VERSION}, "engines_probed": True, "weights": [],
            "shards": list(self.shards.values()), "memory_total_mb": MEMORY_TOTAL_MB,
            "cpu_count": CPU_COUNT,
        }  # fmt: skip

    def _make_tail(self) -> None:
        shards = [{"shard_id": s, "state": e["state"]} for s, e in self.shards.items()]
        body = json.dumps(
            {"load": LOAD, "shards": shards, "memory_total_mb": MEMORY_TOTAL_MB,
             "cpu_count": CPU_COUNT}
        )  # fmt: skip
        self.tail = ", " + body[1:]

    def heartbeat(self, seq: int) -> str:
        """Heartbeat number `seq`, its body made once per change of the shards."""
        return f'{{"type": "heartbeat", "seq": {seq}{self.tail}'

    async def send(self, msg: dict | str) -> None:
        ws = self.ws
        if ws is None:
            return  # lost with the connection; the next register lists the shard
        async with self.send_lock:
            await ws.send(msg if isinstance(msg, str) else json.dumps(msg))

    async def _session(self, ws) -> bool:
        self.ws = ws
        await self.send(self.register_message())
        async with asyncio.timeout(REGISTER_TIMEOUT_S):
            while True:
                msg = json.loads(await ws.recv())
                if msg.get("type") == "registered":
                    if "node_token" in msg:
                        self.token = msg["node_token"]
                    break
                if msg.get("type") == "error":
                    await ws.close()
                    raise RegisterRefused(msg.get("detail") or "")
        stats = self.stats
        stats.registered += 1
        stats.connected += 1
        self.registered = True
        if stats.marked_at and self.n not in stats.since_mark:
            stats.since_mark.add(self.n)
            stats.last_since_mark = time.monotonic()
            stats.again.append((self.attempt_at, stats.last_since_mark))
        self._make_tail()
        beats = asyncio.create_task(self._heartbeats(ws))
        try:
            async for raw in ws:
                self._dispatch(json.loads(raw))
            stats.events[f"closed {ws.close_code}"] += 1
        finally:
            stats.connected -= 1
            self.registered = False
            beats.cancel()
            if self.probe is not None and not self.probe.done():
                self.probe.cancel()
        return True

    async def _heartbeats(self, ws) -> None:
        loop = asyncio.get_running_loop()
        # The first beat at a random point of the interval, as the agent's (client.py).
        next_at, seq = loop.time() + random.uniform(0, HEARTBEAT_INTERVAL_S), 0
        await asyncio.sleep(next_at - loop.time())
        # A connection that ends stops the beats; the session's reader sees it end.
        with contextlib.suppress(WebSocketException, OSError):
            while True:
                if not self.quiet:
                    seq += 1
                    if loop.time() - next_at >= 1.0:
                        self.stats.late_beats += 1
                    sent = time.monotonic()
                    await self.send(self.heartbeat(seq))
                    self.last_beat = sent
                    self.stats.beats += 1
                    ready = [s for s, e in self.shards.items() if e["state"] == "ready"]
                    if ready:
                        loads = [{"shard_id": s, "running": 0, "waiting": 0, "kv_cache": 0.0}
                                 for s in ready]  # fmt: skip
                        await self.send({"type": "engine_load", "shards": loads})
                    if self.probe_fraction and random.random() < self.probe_fraction:
                        await self._probe(seq, sent)
                next_at = max(next_at + HEARTBEAT_INTERVAL_S, loop.time())
                await asyncio.sleep(next_at - loop.time())

    async def _probe(self, seq: int, sent: float) -> None:
        """The same seq again: answered with an error only once the server has handled the
        heartbeat before it, so from that heartbeat's send to the answer is its handling."""
        self.probe = asyncio.get_running_loop().create_future()
        await self.send(self.heartbeat(seq))
        try:
            answered = await asyncio.wait_for(self.probe, PROBE_TIMEOUT_S)
        except TimeoutError:
            self.stats.probe_timeouts += 1
        except asyncio.CancelledError:
            if self.ws is not None and not self.ws.close_code:
                raise
        else:
            self.stats.latencies.append(answered - sent)
        finally:
            self.probe = None

    def _dispatch(self, msg: dict) -> None:
        kind = msg.get("type")
        if kind == "error":
            detail = msg.get("detail") or ""
            if self.probe is not None and "is not after" in detail and not self.probe.done():
                self.probe.set_result(time.monotonic())
            else:
                self.stats.events[f"error: {detail[:70]}"] += 1
            return
        self.stats.events[f"got {kind}"] += 1
        if kind == "start_shard":
            _spawn(self._start(msg))
        elif kind == "stop_shard":
            _spawn(self._stop(msg.get("shard_id") or ""))
        elif kind == "engine_log":
            frame = {k: msg.get(k) for k in ("request_id", "shard_id")}
            _spawn(self.send({"type": "engine_log_lines", **frame, "found": False}))

    async def _start(self, msg: dict) -> None:
        shard_id = msg["shard_id"]
        endpoint = f"http://{ADDR}:{msg.get('http_port') or 20000}"
        if shard_id in self.shards:  # start_shard is idempotent: say where it is
            entry = self.shards[shard_id]
            status = {"state": entry["state"], "endpoint": entry["endpoint"]}
            await self.send({"type": "shard_status", "shard_id": shard_id, **status})
            return
        self.shards[shard_id] = {
            "shard_id": shard_id, "replica_id": msg["replica_id"], "model": msg["model"],
            "profile": (msg.get("profile") or {}).get("name", ""),
            "profile_fp": msg.get("profile_fp") or "", "gpu_indices": msg.get("gpu_indices") or [],
            "endpoint": endpoint, "state": "starting",
        }  # fmt: skip
        self._make_tail()
        starting = {"type": "shard_status", "shard_id": shard_id, "endpoint": endpoint}
        await self.send({**starting, "state": "starting"})
        await asyncio.sleep(START_S)
        if shard_id in self.shards:
            self.shards[shard_id]["state"] = "ready"
            self._make_tail()
            await self.send({**starting, "state": "ready"})

    async def _stop(self, shard_id: str) -> None:
        stopped = {"type": "shard_status", "shard_id": shard_id, "state": "stopped"}
        if self.shards.pop(shard_id, None) is None:
            stopped["detail"] = "Not running on this node."
        self._make_tail()
        await self.send(stopped)

    def silence(self, mode: str) -> float:
        """Go silent: "open" stops heartbeating and keeps the connection (pings are still
        answered, as a hung agent's kernel and library would); "abort" drops the socket with
        no close frame and does not reconnect. The moment it did."""
        if mode == "open":
            self.quiet = True
        else:
            self.allowed.clear()
            if self.ws is not None:
                self.ws.transport.abort()
        return time.monotonic()

    def resume(self) -> None:
        """Heartbeat and reconnect again."""
        self.quiet = False
        self.allowed.set()


async def _serve(conn, first: int, count: int, url: str, join_token: str) -> None:
    stats = Stats()
    agents = [FakeAgent(n, url, join_token, stats) for n in range(first, first + count)]
    tasks: list[asyncio.Task] = []
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()
    loop.add_reader(conn.fileno(), lambda: inbox.put_nowait(conn.recv()))
    parent = os.getppid()

    async def orphaned() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(1)
        os._exit(1)  # the benchmark died without stopping us: stop too

    watchdog = loop.create_task(orphaned())  # noqa: F841 - kept for its life
    while True:
        cmd, arg = await inbox.get()
        reply: object = None
        if cmd == "start":  # (how many more agents, over how many seconds)
            more, spread = arg
            for agent in agents[len(tasks) : len(tasks) + more]:
                tasks.append(loop.create_task(_started(agent, random.uniform(0, spread))))
            reply = len(tasks)
        elif cmd == "stats":
            reply = {
                "connected": stats.connected, "registered": stats.registered,
                "since_mark": len(stats.since_mark), "last_since_mark": stats.last_since_mark,
                "again": list(stats.again),
                "beats": stats.beats, "late_beats": stats.late_beats,
                "probe_timeouts": stats.probe_timeouts, "latencies": list(stats.latencies),
                "events": dict(stats.events), "shards": sum(len(a.shards) for a in agents),
            }  # fmt: skip
        elif cmd == "mark":
            stats.marked_at, stats.since_mark, stats.last_since_mark = time.monotonic(), set(), 0.0
            stats.again = []
        elif cmd == "probe":  # a fraction of heartbeats to probe from now on; 0 stops
            if arg:
                stats.latencies, stats.probe_timeouts = [], 0
            for agent in agents:
                agent.probe_fraction = arg
        elif cmd == "silence":  # (global numbers, mode) -> {number: (silenced, last beat)}
            numbers, mode = arg
            reply = {}
            for n in numbers:
                agent = agents[n - first]
                reply[n] = (agent.silence(mode), agent.last_beat)
        elif cmd == "resume":
            for n in arg:
                agents[n - first].resume()
        elif cmd == "idle":  # the numbers of the agents registered and running no shard
            reply = [a.n for a in agents if a.registered and not a.shards]
        elif cmd == "stop":
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            conn.send("stopped")
            return
        conn.send(reply)


async def _started(agent: FakeAgent, delay: float) -> None:
    await asyncio.sleep(delay)
    await agent.run()


def client_main(conn, first: int, count: int, url: str, join_token: str) -> None:
    """A client process: agents first … first+count-1, driven over `conn` until "stop"."""
    # Ctrl-C reaches the whole process group: the benchmark stops us itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_nofile()
    asyncio.run(_serve(conn, first, count, url, join_token))
