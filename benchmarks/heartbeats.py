"""Heartbeats one `llmgw serve` process handles, over real websockets, with 8-GPU payloads.

Starts an embedded `llmgw serve` in a temporary LLMGW_HOME and registers
AGENTS simulated nodes with 8 GPUs each. Handling is observed with probes: an
agent repeats its last seq, which the server answers with an error frame only
after it has handled everything before it on that connection.

- Saturated: every agent sends back to back for SECONDS. Throughput is
  heartbeats over wall time, and per core is heartbeats over the CPU seconds
  the server process used (the client runs on the same 2 cores).
- Paced: RATE heartbeats a second spread over the agents, each followed by a
  probe; the probe's round trip is the time to handle one, p50 and p99.
- The same saturated run against a bare Channels consumer under daphne
  (benchmarks/bare_consumer.py), for the ratio.

Those two lift the per-connection frame budget (LLMGW_AGENT_FRAMES_PER_SECOND), which
would close agents sending back to back: they measure what handling costs. A third run
keeps the default budget: the agents paced at FLOOD_RATE heartbeats a second in all (well
within it), probed as above, first alone and then while one more connection floods
heartbeats as fast as it can (reconnecting with its own credential when it is closed):
the p99 of the well-behaved, and how much the flood moved it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import websockets

AGENTS = int(os.environ.get("BENCH_AGENTS", 50))
SECONDS = float(os.environ.get("BENCH_SECONDS", 10))
RATE = float(os.environ.get("BENCH_RATE", 1000))
FLOOD_RATE = float(os.environ.get("BENCH_FLOOD_RATE", 250))
PROBE_EVERY = 20
REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _heartbeat(seq: int) -> str:
    gpus = [
        {"index": i, "temp_c": 61.0 + i, "memory_temp_c": 70.0, "power_w": 412.5, "power_limit_w": 700.0,
         "throttle": [], "utilization": 87.0, "memory_used_mb": 71234}
        for i in range(8)
    ]  # fmt: skip
    return json.dumps(
        {"type": "heartbeat", "seq": seq, "memory_total_mb": 2_063_000, "cpu_count": 192,
         "load": {"cpu_percent": 23.5, "load1": 11.2, "load5": 10.9, "load15": 10.1,
                  "memory_used_bytes": 412_000_000_000, "memory_available_bytes": 1_600_000_000_000,
                  "cpu_temp_c": 58.0, "cpu_power_w": 310.0, "inlet_temp_c": 24.0, "gpus": gpus},
         "shards": [{"shard_id": "chat-abc123-0", "state": "ready"}]}
    )  # fmt: skip


def _register(n: int) -> str:
    return json.dumps(
        {"type": "register", "node_id": f"bench-{n:05d}", "hostname": f"bench-{n}", "mgmt_addr": "127.0.0.1",
         "memory_total_mb": 2_063_000, "cpu_count": 192, "engines": {"sim": "1"}, "engines_probed": True,
         "gpus": [{"index": i, "uuid": f"GPU-{n}-{i}", "name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559}
                  for i in range(8)]}
    )  # fmt: skip


async def _connect(url: str, token: str, n: int, credentials: dict | None = None):
    """A registered connection for node n: with the join token the first time, with the node's
    own credential (kept in `credentials`) after."""
    credentials = {} if credentials is None else credentials
    bearer = credentials.get(n, token)
    ws = await websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {bearer}"}, max_queue=None
    )
    await ws.send(_register(n))
    reply = json.loads(await ws.recv())
    assert reply["type"] == "registered", reply
    if "node_token" in reply:
        credentials[n] = reply["node_token"]
    return ws


async def _flood(url: str, token: str, stop: asyncio.Event) -> dict:
    """One connection sending heartbeats back to back until `stop`, reconnecting when the
    server closes it; how many it sent and how often it was closed."""
    credentials: dict = {}
    sent = closed = refused = 0
    seq = 0
    while not stop.is_set():
        try:
            ws = await _connect(url, token, 99_999, credentials)
        except (websockets.ConnectionClosed, OSError, AssertionError):
            refused += 1  # held back after a flood: a hostile client tries again at once
            continue
        try:
            while not stop.is_set():
                seq += 1
                await ws.send(_heartbeat(seq))
                sent += 1
                if sent % 50 == 0:
                    await asyncio.sleep(0)
        except websockets.ConnectionClosed:
            closed += 1
        finally:
            await ws.close()
    return {"sent": sent, "closed": closed, "refused": refused}


async def _flooded(url: str, token: str) -> dict:
    """The paced p99 of AGENTS well-behaved agents, alone and while one connection floods
    from a process of its own (so the flood does not slow this client's own loop)."""
    # Nodes of their own: those of the first run have their credentials in the database.
    conns = [await _connect(url, token, 50_000 + n) for n in range(AGENTS)]
    try:
        quiet = sorted(await _paced(conns, SECONDS, FLOOD_RATE, base=3_000_000))
        flooder = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--flood", url, token, str(SECONDS + 2),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await asyncio.sleep(1)
        loud = sorted(await _paced(conns, SECONDS, FLOOD_RATE, base=4_000_000))
        out, _ = await flooder.communicate()
        return {"quiet": quiet, "loud": loud, **json.loads(out)}
    finally:
        for ws in conns:
            await ws.close()


async def _flood_for(url: str, token: str, seconds: float) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    print(json.dumps(await _flood(url, token, stop)), flush=True)


async def _probe(ws, seq: int) -> float:
    sent = time.perf_counter()
    await ws.send(_heartbeat(seq))
    reply = json.loads(await ws.recv())
    # The shard the heartbeats report is unknown here, so the control plane's backstop asks
    # now and then for it to be stopped: those commands are not the probe's answer.
    while reply["type"] == "stop_shard":
        reply = json.loads(await ws.recv())
    assert reply["type"] == "error", reply
    return time.perf_counter() - sent


async def _saturate(conns, seconds: float) -> int:
    async def one(ws, start_seq: int) -> int:
        seq, handled, stop_at = start_seq, 0, time.monotonic() + seconds
        while time.monotonic() < stop_at:
            for _ in range(PROBE_EVERY):
                seq += 1
                await ws.send(_heartbeat(seq))
            await _probe(ws, seq)
            handled += PROBE_EVERY
        return handled

    return sum(await asyncio.gather(*(one(ws, 1_000_000) for ws in conns)))


async def _paced(conns, seconds: float, rate: float, base: int = 2_000_000) -> list[float]:
    latencies: list[float] = []
    interval = len(conns) / rate

    async def one(ws, offset: float) -> None:
        seq, start = base, time.monotonic() + offset
        k = 0
        while (due := start + k * interval) < start + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            seq += 1
            await ws.send(_heartbeat(seq))
            latencies.append(await _probe(ws, seq))
            k += 1

    await asyncio.gather(*(one(ws, i * interval / len(conns)) for i, ws in enumerate(conns)))
    return latencies


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(url: str, token: str, pid: int, paced: bool) -> dict:
    conns = [await _connect(url, token, n) for n in range(AGENTS)]
    try:
        before, start = _cpu_seconds(pid), time.monotonic()
        handled = await _saturate(conns, SECONDS)
        elapsed, cpu = time.monotonic() - start, _cpu_seconds(pid) - before
        result = {"per_second": handled / elapsed, "per_cpu_second": handled / cpu, "server_cpu_s": cpu,
                  "seconds": elapsed}  # fmt: skip
        if paced:
            result["latencies"] = sorted(await _paced(conns, SECONDS, RATE))
        return result
    finally:
        for ws in conns:
            await ws.close()


def _wait_up(url: str, proc: subprocess.Popen, log: Path) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            sys.exit(f"the server exited; see {log}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    sys.exit(f"the server did not start; see {log}")


def _serve(cmd: list[str], env: dict, log: Path, check_url: str, run) -> dict:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=out)
        try:
            _wait_up(check_url, proc, log)
            return asyncio.run(run(proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="llmgw-bench-hb-"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(LLMGW_HOME=str(home), PYTHONPATH=str(REPO), LLMGW_JOINS_PER_MINUTE="1000000")
    # The saturated and paced runs measure handling: no budget closes their agents.
    unbudgeted = {**env, "LLMGW_AGENT_FRAMES_PER_SECOND": "1000000"}
    llmgw = [sys.executable, "-m", "llmgw"]
    subprocess.run([*llmgw, "migrate"], env=env, check=True, capture_output=True)
    made = subprocess.run(
        [*llmgw, "createtoken", "--agent", "bench"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    token = made.stdout.strip().splitlines()[-1]

    port = _free_port()
    ours = _serve(
        [*llmgw, "serve", "--port", str(port)], unbudgeted, home / "serve.log", f"http://127.0.0.1:{port}/api/v1/openapi.json",
        lambda pid: _run(f"ws://127.0.0.1:{port}/ws/agent/", token, pid, paced=True),
    )  # fmt: skip
    port = _free_port()
    bare = _serve(
        [sys.executable, "-m", "daphne", "-p", str(port), "benchmarks.bare_consumer:application"], env,
        home / "bare.log", f"http://127.0.0.1:{port}/",
        lambda pid: _run(f"ws://127.0.0.1:{port}/", token, pid, paced=False),
    )  # fmt: skip

    port = _free_port()
    flood = _serve(
        [*llmgw, "serve", "--port", str(port)], env, home / "serve-flood.log",
        f"http://127.0.0.1:{port}/api/v1/openapi.json",
        lambda pid: _flooded(f"ws://127.0.0.1:{port}/ws/agent/", token),
    )  # fmt: skip

    lat = ours["latencies"]
    pct = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2)  # noqa: E731
    scale = {"agents": AGENTS, "gpus_per_heartbeat": 8, "seconds": SECONDS, "machine_cores": os.cpu_count(),
             "client_on_same_machine": True, "mode": "embedded"}  # fmt: skip
    print(json.dumps({"figure": "heartbeats_per_second", "value": round(ours["per_second"]),
                      "per_server_core": round(ours["per_cpu_second"]), "aim_per_core": 2500,
                      "bare_channels_per_server_core": round(bare["per_cpu_second"]),
                      "ratio_to_bare_channels": round(ours["per_cpu_second"] / bare["per_cpu_second"], 2),
                      "scale": scale}), flush=True)  # fmt: skip
    print(json.dumps({"figure": "heartbeat_handling_ms", "p50": pct(0.5), "p99": pct(0.99), "aim_p99": 100,
                      "offered_per_second": RATE, "probes": len(lat), "scale": scale}), flush=True)  # fmt: skip
    p99 = lambda xs: round(xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1000, 2)  # noqa: E731
    quiet, loud = p99(flood["quiet"]), p99(flood["loud"])
    print(json.dumps({"figure": "heartbeat_p99_ms_while_one_floods", "quiet_p99": quiet, "flooded_p99": loud,
                      "moved": round(loud / quiet - 1, 2) if quiet else None, "aim_moved": 0.2,
                      "flood_frames_sent": flood["sent"], "flood_closed": flood["closed"],
                      "flood_reconnects_refused": flood["refused"],
                      "offered_per_second": FLOOD_RATE, "probes": len(flood["loud"]),
                      "scale": {**scale, "frame_budget_per_second": 20}}), flush=True)  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--flood"]:
        asyncio.run(_flood_for(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    else:
        main()
