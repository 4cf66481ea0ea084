"""What the gateway adds to a request, against the same engine direct, through LiteLLM,
through Portkey and through the Rust routers vllm-router and sglang-router.

Everything is a real process on 127.0.0.1, in a temporary LLMGW_HOME, and is stopped
at the end:

- an embedded `llmgw serve` and one `llmgw agent` with a simulated CPU node; a model
  `bench` is added over REST with a "sim" profile that answers at once (no time to
  first token, a token a millisecond per stream, 1,024 slots, 1 token unless asked),
  and the agent starts its `llmgw sim-engine`;
- a project and a gateway key made over REST;
- LiteLLM's proxy (`litellm[proxy]` from PyPI, in a venv of its own made on the first
  run under var/bench/) with one model pointing at the same engine, no database,
  logging at ERROR, a master key;
- Portkey's open-source gateway (`@portkey-ai/gateway` from npm, installed with
  `npm install --prefix var/bench/portkey` on the first run, run with node, headless and
  on loopback only), sent each request at its OpenAI-compatible path with the headers
  x-portkey-provider: openai and x-portkey-custom-host: the engine's /v1, and the
  engine's key. One chat request through it must come back with the engine's own words,
  and one streamed must end with [DONE], before anything is measured.

So "direct", "llmgw", "litellm" and "portkey" all end at the identical engine process;
direct and Portkey use the engine key the control plane derives for the replica
(LLMGW_SECRET_KEY is set here). vLLM's `vllm-router` and SGLang's `sglang-router`
(`smg launch`), each from PyPI in a venv of its own under ~/.cache/llmgw/peers/, are
started on loopback with the engine as their one worker and their default
`cache_aware` policy; they pass the caller's key on, so they are sent the engine's.
The peers are started in benchmarks/peers.py.

The load comes from this process: a bare asyncio HTTP/1.1 client on keep-alive
connections, each request's bytes made once, the answer read with a minimal parser
(Content-Length or chunked). It costs a few tens of microseconds a request, far less
than aiohttp or httpx would, which matters because the load generator, the gateway,
the engine and the idle agent share the machine's cores (and the peers' processes, each
idle while the others are measured).

Figures, each for llmgw and each peer with its ratio to llmgw (the peer over llmgw;
llmgw over the peer for requests a second):

- added latency one request at a time: SEQUENTIAL non-streamed chat requests
  (max_tokens 1) per target, in blocks taking turns between targets, down the list and
  back up, so drift hits all alike; p50 and p99 of each target, added = through − direct
  at each percentile;
- added p99 at 16 and 64 requests at once: closed loops of that many connections for
  a fixed time, after a warm-up, the targets one after another; added = p99 through −
  p99 direct at the same level;
- throughput: requests a second through each at 64 at once for THROUGHPUT_SECONDS
  (direct for reference), and the proxy's CPU time per request;
- time to first token when streaming: the first byte of the body after the headers,
  p50 (and p99) through − direct, one request at a time;
- CPU per streamed answer of STREAM_TOKENS (100) tokens
  (`<target>_cpu_ms_per_streamed_100_tokens`, issue 41's "≤ 8 ms"): closed loops of
  STREAM_CONCURRENCY (4) connections, each asking for a streamed chat of exactly 100
  tokens (`max_tokens` 100) for STREAM_SECONDS (10) after a warm-up; the CPU seconds the
  target's own processes used (from /proc, as for the requests at 64) over the answers
  completed; the engine's for direct. Before it is measured, one answer through each
  target must carry the 100 words and end with [DONE]. The engine paces its tokens, a
  millisecond apart (BENCH_TOKENS_PER_SEC, 1000), as a real one does, and 4 streams
  offer at most 4,000 events a second, so the events reach each proxy about one a read:
  an engine that sends a whole answer at once, or more streams than a proxy keeps pace
  with, hand it many events a read, and the figure falls to less than half (measured;
  docs/benchmarks.md). `answers_per_second` beside it, against the paced most (40),
  says whether the proxy kept pace. The non-streamed figures ask for 1 token, which the
  pace does not delay; the time to first token (4 tokens asked) read higher with the
  paced engine in short runs on a busy machine (docs/benchmarks.md), so compare it only
  between runs at the same BENCH_TOKENS_PER_SEC (1000000 is the earlier engine's);
- where the machine's cores went while each target took 64 at once
  (`<target>_cores_by_process_at_64`): the load generator, `llmgw serve` or each of its
  workers, the engine, the agent, Celery, PostgreSQL, Redis, the peers, and everything
  else on the machine (other people's work), from /proc; with which of llmgw's
  processes held each of the 64 connections.

BENCH_SEQUENTIAL, BENCH_SECONDS (the 16 level), BENCH_THROUGHPUT_SECONDS,
BENCH_STREAMED, BENCH_STREAM_SECONDS, BENCH_STREAM_CONCURRENCY scale it; BENCH_LITELLM=0 leaves LiteLLM out;
BENCH_LITELLM_SPEC is what pip installs (pinned: the newest [proxy] extra whose dependencies the registry serves).
BENCH_PORTKEY=0 leaves Portkey out; BENCH_PORTKEY_VERSION is the version npm installs,
pinned at 1.15.2: the newest the registry serves (its only other is 1.9.8), and the one
whose start script and custom-host checks (127.0.0.1 is a trusted host) were read; with
@hono/node-server held at 1.14.1, as newer ones break its streaming (benchmarks/peers.py).
Without node and npm, Portkey is left out with a line saying so.
BENCH_VLLM_ROUTER=0 and BENCH_SGLANG_ROUTER=0 leave the routers out;
BENCH_VLLM_ROUTER_VERSION (0.1.17) and BENCH_SGLANG_ROUTER_VERSION (0.3.2) pin what pip
installs; one that cannot be installed is left out with a line saying why.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.peers import (  # noqa: E402
    ROUTERS,
    Peer,
    Procs,
    cores_by_role,
    cpu_seconds,
    free_port,
    machine_cpu,
    start_litellm,
    start_portkey,
    start_router,
    tree,
    wait,
)
from llmgw.core.secrets import engine_key  # noqa: E402
from tests.e2e.harness import listener_pid, serving_pid  # noqa: E402

SEQUENTIAL = int(os.environ.get("BENCH_SEQUENTIAL", 2000))
BLOCK = 200  # sequential requests per turn of a target
STREAMED = int(os.environ.get("BENCH_STREAMED", 1000))
STREAM_TOKENS = 100  # the answer issue 41's aim is set for; the figure's name says it
STREAM_CONCURRENCY = int(os.environ.get("BENCH_STREAM_CONCURRENCY", 4))
STREAM_SECONDS = float(os.environ.get("BENCH_STREAM_SECONDS", 10))
SECONDS = float(os.environ.get("BENCH_SECONDS", 5))
THROUGHPUT_SECONDS = float(os.environ.get("BENCH_THROUGHPUT_SECONDS", 10))
# 0: embedded, one process. N: production (DATABASE_URL's server, a database of its own,
# REDIS_URL), `llmgw serve --workers N`, and Celery's worker and beat for the reconciler.
WORKERS = int(os.environ.get("BENCH_GATEWAY_WORKERS", 0))
WARMUP_SECONDS = 2.0
MODEL = "bench"
# Per stream. Paced, so a streamed answer's events reach a proxy one at a time, as from a
# real engine; a non-streamed answer of 1 token waits for nothing.
TOKENS_PER_SEC = os.environ.get("BENCH_TOKENS_PER_SEC", "1000")
SIM_ARGS = [
    "--ttft-ms",
    "0",
    "--tokens-per-sec",
    TOKENS_PER_SEC,
    "--slots",
    "1024",
    "--max-tokens",
    "1",
]


def _emit(figure: str, value, unit: str, scale: dict, **extra) -> None:
    extra = {k: v for k, v in extra.items() if v is not None}
    line = {
        "bench": "gateway",
        "figure": figure,
        "value": value,
        "unit": unit,
        **extra,
        "scale": scale,
    }
    print(json.dumps(line), flush=True)


# The load: a bare HTTP/1.1 client


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one request at a time. `ask` sends prepared bytes and
    returns (status, seconds to the first body byte, seconds to the end, body)."""

    def __init__(self) -> None:
        self.transport = None
        self.buf = bytearray()
        self.done: asyncio.Future | None = None
        self.head_end = -1
        self.first_body = 0.0
        self.status = 0
        self.length = -1  # Content-Length, or -1 for chunked
        self.pos = 0  # chunked: where the next chunk's size line starts
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"connection closed: {exc}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        buf = self.buf
        if self.head_end < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head_end = self.pos = end + 4
            lines = bytes(buf[:end]).lower().split(b"\r\n")
            self.status = int(lines[0][9:12])
            self.length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name == b"content-length":
                    self.length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value:
                    self.length = -1
        if self.first_body == 0.0 and len(buf) > self.head_end:
            self.first_body = time.perf_counter()
        if self.length >= 0:
            if len(buf) - self.head_end >= self.length:
                self._finish(bytes(buf[self.head_end : self.head_end + self.length]))
            return
        while True:  # chunked: walk the complete chunks
            line_end = buf.find(b"\r\n", self.pos)
            if line_end < 0:
                return
            size = int(bytes(buf[self.pos : line_end]).split(b";")[0], 16)
            if size == 0:
                if len(buf) >= line_end + 4:
                    self._finish(_dechunk(bytes(buf[self.head_end : self.pos])))
                return
            nxt = line_end + 2 + size + 2
            if len(buf) < nxt:
                return
            self.pos = nxt

    def _finish(self, body: bytes) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(body)

    async def ask(self, request: bytes) -> tuple[int, float, float, bytes]:
        if self.closed:  # a write would vanish and the answer never come
            raise ConnectionError("connection closed by the server")
        self.buf.clear()
        self.head_end, self.first_body, self.status, self.pos = -1, 0.0, 0, 0
        self.done = asyncio.get_running_loop().create_future()
        sent = time.perf_counter()
        self.transport.write(request)
        body = await self.done
        end = time.perf_counter()
        return self.status, (self.first_body or end) - sent, end - sent, body


def _dechunk(data: bytes) -> bytes:
    out, pos = [], 0
    while pos < len(data):
        line_end = data.find(b"\r\n", pos)
        size = int(data[pos:line_end].split(b";")[0], 16)
        out.append(data[line_end + 2 : line_end + 2 + size])
        pos = line_end + 2 + size + 2
    return b"".join(out)


async def _connect(port: int) -> _Conn:
    _, conn = await asyncio.get_running_loop().create_connection(_Conn, "127.0.0.1", port)
    return conn


def _request(port: int, key: str, *, stream: bool, headers: tuple = (), tokens: int = 4) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "say hi"}], "max_tokens": 1}
    if stream:
        body.update(stream=True, max_tokens=tokens)
    raw = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers)
        + "\r\n"
    )
    return head.encode() + raw


class Target:
    """Where a request goes: the engine direct, llmgw's gateway, or a peer's proxy; the
    headers a peer needs (Portkey's provider and host) are in every request's bytes."""

    def __init__(self, name: str, port: int, key: str, pids: Callable[[], list[int]],
                 headers: tuple = ()) -> None:  # fmt: skip
        self.name, self.port, self.key, self.pids = name, port, key, pids
        self.plain = _request(port, key, stream=False, headers=headers)
        self.streamed = _request(port, key, stream=True, headers=headers)
        self.streamed_long = _request(port, key, stream=True, headers=headers, tokens=STREAM_TOKENS)

    @classmethod
    def of(cls, peer: Peer) -> Target:
        """The target that sends the benchmark's requests to `peer`."""
        return cls(peer.name, peer.port, peer.key, peer.pids, peer.headers)


def streamed_words(body: bytes) -> int:
    """How many words the content of a streamed chat answer carries, whichever way a proxy
    cut it into events (the sim engine's tokens are words)."""
    text = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
    return len("".join(text).split())


def _check(status: int, body: bytes, target: Target, *, stream: bool) -> None:
    ok = status == 200 and (b"[DONE]" in body if stream else b'"choices"' in body)
    if not ok:
        raise RuntimeError(f"{target.name} answered {status}: {body[:300]!r}")


async def _sequential(targets: list[Target], total: int, stream: bool) -> dict[str, list[float]]:
    """`total` requests one at a time per target, BLOCK at a turn; the time to the whole
    answer, or to the first body byte when streaming. The turns go down the targets and
    back up, so each is as often early in a round as late, and none always follows the
    same one."""
    conns = {t.name: await _connect(t.port) for t in targets}
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    for t in targets:  # warm: connections, caches, the proxies' first-request work
        for _ in range(50):
            status, _, _, body = await conns[t.name].ask(t.streamed if stream else t.plain)
            _check(status, body, t, stream=stream)
    done, order = 0, list(targets)
    while done < total:
        n = min(BLOCK, total - done)
        for t in order:
            if conns[t.name].closed:  # idle past its keep-alive while the others took turns
                conns[t.name] = await _connect(t.port)
            conn, req, got = conns[t.name], (t.streamed if stream else t.plain), out[t.name]
            for _ in range(n):
                status, first, whole, body = await conn.ask(req)
                _check(status, body, t, stream=stream)
                got.append(first if stream else whole)
        done += n
        order.reverse()
    for c in conns.values():
        c.transport.close()
    return out


async def _closed_loop(target: Target, concurrency: int, seconds: float,
                       roles: Callable[[], dict[str, list[int]]] | None = None,
                       request: bytes | None = None) -> dict:  # fmt: skip
    """`concurrency` connections each sending the next request (`request`, else the
    target's plain one) as soon as the last is answered, for `seconds` after a warm-up:
    latencies, errors, requests a second, and the CPU seconds the target's processes used;
    with `roles`, the cores each role's processes used meanwhile, and which of the
    target's processes holds each connection."""
    conns = [await _connect(target.port) for _ in range(concurrency)]
    latencies: list[float] = []
    errors = 0
    measuring = False
    stop_at = 0.0

    async def worker(conn: _Conn) -> None:
        nonlocal errors
        req = request or target.plain
        while True:
            status, _, whole, body = await conn.ask(req)
            if time.perf_counter() >= stop_at:
                return
            if measuring:
                if status == 200:
                    latencies.append(whole)
                else:
                    errors += 1

    stop_at = time.perf_counter() + WARMUP_SECONDS
    await asyncio.gather(*(worker(c) for c in conns))
    machine_before = machine_cpu() if roles else None
    cpu_before, own_before = cpu_seconds(target.pids()), time.process_time()
    measuring, start = True, time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(target.pids()) - cpu_before
    out = {"latencies": latencies, "errors": errors, "per_second": len(latencies) / elapsed,
           "cpu_s": cpu, "load_cpu_s": time.process_time() - own_before, "seconds": elapsed}  # fmt: skip
    if roles and machine_before:
        now = roles()
        out["cores"] = cores_by_role(machine_before, machine_cpu(), now, elapsed)
        out["connections"] = _holders(target, conns, now)
    for c in conns:
        c.transport.close()
    return out


def _holders(target: Target, conns: list[_Conn], roles: dict[str, list[int]]) -> dict[str, int]:
    """How many of `conns` each of the target's processes holds the server's end of, by
    the role of the process."""
    pids, role = target.pids(), {}
    for name, ps in roles.items():  # a process in two roles is the first's, as in the split
        for pid in ps:
            role.setdefault(pid, name)
    held: dict[str, int] = {}
    for c in conns:
        pid = serving_pid(target.port, c.transport.get_extra_info("sockname")[1], pids)
        name = role.get(pid, str(pid)) if pid is not None else "none found"
        held[name] = held.get(name, 0) + 1
    return held


def _roles(procs: Procs, engine_pid: int | None) -> Callable[[], dict[str, list[int]]]:
    """What each process this benchmark started is, for the split of the machine's cores;
    a process in two counts in the first (the engine is the agent's child)."""

    def roles() -> dict[str, list[int]]:
        serve = procs.named["serve"].pid
        workers = sorted(p for p in _children(serve) if b"--worker-fd" in _cmdline(p))
        out = {"load generator": [os.getpid()]}
        out.update({f"llmgw worker {i + 1}": tree(w) for i, w in enumerate(workers)})
        out["llmgw serve's supervisor and renderer" if workers else "llmgw serve"] = tree(serve)
        out["sim engine"] = [engine_pid] if engine_pid else []
        out["llmgw agent"] = tree(procs.named["agent"].pid)
        celery = [n for n in ("worker", "beat") if n in procs.named]
        out["celery worker and beat"] = [p for n in celery for p in tree(procs.named[n].pid)]
        rest = [n for n in procs.named if n not in ("serve", "agent", "worker", "beat")]
        out["the peers (idle unless measured)"] = [
            p for n in rest for p in tree(procs.named[n].pid)
        ]
        return out

    return roles


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def _streamed_cpu(targets: list[Target]) -> dict[str, dict]:
    """Each target's closed loop of streamed answers of STREAM_TOKENS tokens, after one
    answer through it is checked to carry them all."""
    out = {}
    for t in targets:
        conn = await _connect(t.port)
        status, _, _, body = await conn.ask(t.streamed_long)
        conn.transport.close()
        _check(status, body, t, stream=True)
        if (words := streamed_words(body)) != STREAM_TOKENS:
            raise RuntimeError(
                f"{t.name} streamed {words} words, not {STREAM_TOKENS}: {body[:300]!r}"
            )
        out[t.name] = await _closed_loop(
            t, STREAM_CONCURRENCY, STREAM_SECONDS, request=t.streamed_long
        )
    return out


def streamed_cpu_figures(
    loops: dict[str, dict],
) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """From each target's loop of streamed answers (its `cpu_s`, and `latencies`, one per
    answer completed): the CPU milliseconds per answer of each target, and each peer's
    (not direct's) over llmgw's. No answers, or no CPU read (below /proc's tick), is
    unknown: None, never a zero; and so is a ratio to an unknown."""
    per: dict[str, float | None] = {}
    for name, loop in loops.items():
        answers, cpu = len(loop["latencies"]), loop["cpu_s"]
        per[name] = round(cpu / answers * 1000, 3) if answers and cpu > 0 else None
    ours, over = per.get("llmgw"), {}
    for name, ms in per.items():
        if name not in ("direct", "llmgw"):
            over[name] = round(ms / ours, 2) if ms is not None and ours is not None else None
    return per, over


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _cluster(procs: Procs, home: Path) -> tuple[Target, Target, str, str]:
    """serve, an agent, the bench model's replica and a gateway key: the direct and the
    llmgw targets, the engine's URL and key."""
    secret = "bench-" + secrets.token_hex(24)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(LLMGW_HOME=str(home), LLMGW_SECRET_KEY=secret, PYTHONPATH=str(REPO),
               LLMGW_SETTLE_SECONDS="1", PYTHONUNBUFFERED="1")  # fmt: skip
    llmgw = [sys.executable, "-m", "llmgw"]
    if WORKERS:
        _production(env)

    def run(*args: str) -> str:
        done = subprocess.run([*llmgw, *args], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"llmgw {' '.join(args)} failed: {done.stderr}")
        return done.stdout.strip().splitlines()[-1]

    run("migrate")
    admin, agent_token = run("createtoken", "bench"), run("createtoken", "--agent", "bench-agents")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    workers = ["--workers", str(WORKERS)] if WORKERS else []
    serve = procs.spawn("serve", [*llmgw, "serve", "--port", str(port), *workers], env)
    wait("llmgw serve to answer", lambda: httpx.get(f"{url}/api/v1/openapi.json"), proc=serve)
    if WORKERS:
        celery = [sys.executable, "-m", "celery", "-A", "llmgw"]
        procs.spawn("worker", [*celery, "worker", "--pool", "solo", "-n", "reconciler@%h"], env)
        procs.spawn("beat", [*celery, "beat", "--schedule", str(home / "beat-schedule")], env)
    api = httpx.Client(
        base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {admin}"}, timeout=10
    )

    def post(path: str, body: dict) -> dict:
        r = api.post(path, json=body)
        if r.status_code >= 300:
            raise RuntimeError(f"POST {path}: {r.status_code} {r.text}")
        return r.json()

    low = 30000 + secrets.randbelow(20000)
    agent = procs.spawn("agent", [*llmgw, "agent", "--server", url, "--token", agent_token, "--node-id", "bench-cpu",
                          "--state-dir", str(home / "agent"), "--memory-gb", "64", "--cpus", "16",
                          "--port-range", f"{low}-{low + 99}"], env)  # fmt: skip
    wait(
        "the node to be ready",
        lambda: [n["state"] for n in api.get("/nodes").json()] == ["ready"],
        proc=agent,
    )
    post("/models", {"name": MODEL, "source": "org/bench", "scaling": {"min": 1},
                     "profiles": [{"name": "cpu", "engine": "sim", "cpu_cores": 1, "min_memory_gb": 1,
                                   "args": SIM_ARGS, "startup_timeout": 60}]})  # fmt: skip
    replica = wait(
        "the replica to be ready",
        lambda: next((r for r in api.get("/replicas", params={"model": MODEL}).json() if r["state"] == "ready"), None),
    )  # fmt: skip
    post("/orgs", {"name": "Bench"})
    post("/teams", {"org": "Bench", "name": "perf"})
    post("/projects", {"team": "Bench/perf", "name": "gateway"})
    api_key = post("/keys", {"project": "Bench/perf/gateway", "name": "bench"})["secret"]
    api.close()

    engine_url, ekey = replica["endpoint"], engine_key(secret, replica["id"])
    engine_port = int(engine_url.rsplit(":", 1)[1])
    engine_pid = listener_pid(engine_port)
    direct = Target("direct", engine_port, ekey, lambda: [engine_pid])
    through = Target("llmgw", port, api_key, lambda: [serve.pid, *_children(serve.pid)])
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    wait("the gateway to route to the replica", lambda: httpx.post(
        f"{url}/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {api_key}"}, timeout=5,
    ).status_code == 200)  # fmt: skip
    return direct, through, engine_url, ekey


def _admin_sql(sql: str) -> None:
    from urllib.parse import urlparse

    import psycopg

    url = urlparse(os.environ["DATABASE_URL"])._replace(path="/postgres").geturl()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


_DATABASE: list[str] = []  # the database _production made, dropped at the end


def _production(env: dict) -> None:
    """Point `env` at a new database on DATABASE_URL's server and an emptied Redis
    database (6), as the end-to-end tests' clusters are."""
    from urllib.parse import urlparse

    import redis

    base = urlparse(os.environ["DATABASE_URL"])
    name = f"llmgw_bench_{secrets.token_hex(4)}"
    _admin_sql(f'CREATE DATABASE "{name}"')
    _DATABASE.append(name)
    env["DATABASE_URL"] = base._replace(path=f"/{name}").geturl()
    env["REDIS_URL"] = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/6"
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()


def _children(pid: int) -> list[int]:
    """The processes `pid` started (the workers of `llmgw serve --workers N`)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


async def _measure(targets: list[Target], scale: dict,
                   roles: Callable[[], dict[str, list[int]]] | None = None) -> None:  # fmt: skip
    names = [t.name for t in targets]
    through = [t for t in targets if t.name != "direct"]
    peers = [t.name for t in through if t.name != "llmgw"]  # each figure's ratio to llmgw

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b > 0 else None

    # One at a time, whole answers.
    seq = await _sequential(targets, SEQUENTIAL, stream=False)
    s = {
        **scale,
        "requests_per_target": SEQUENTIAL,
        "concurrency": 1,
        "stream": False,
        "max_tokens": 1,
    }
    base = {q: _pct(seq["direct"], q) for q in (0.5, 0.99)}
    _emit("direct_ms", {"p50": _ms(base[0.5]), "p99": _ms(base[0.99])}, "ms", s)
    added = {}
    for t in through:
        p = {q: _pct(seq[t.name], q) for q in (0.5, 0.99)}
        added[t.name] = {q: p[q] - base[q] for q in p}
        _emit(f"{t.name}_ms", {"p50": _ms(p[0.5]), "p99": _ms(p[0.99])}, "ms", s)
        _emit(f"{t.name}_added_ms", {"p50": _ms(added[t.name][0.5]), "p99": _ms(added[t.name][0.99])}, "ms", s,
              aim={"p50": 1, "p99": 3} if t.name == "llmgw" else None)  # fmt: skip
    for peer in peers:
        _emit(f"{peer}_over_llmgw_added", {q: ratio(added[peer][k], added["llmgw"][k])
                                           for q, k in (("p50", 0.5), ("p99", 0.99))}, "ratio", s)  # fmt: skip

    # Many at once.
    loops: dict[int, dict[str, dict]] = {}
    for concurrency, seconds in ((16, SECONDS), (64, THROUGHPUT_SECONDS)):
        split = roles if concurrency == 64 else None
        loops[concurrency] = {
            t.name: await _closed_loop(t, concurrency, seconds, split) for t in targets
        }
        s = {**scale, "concurrency": concurrency, "seconds": seconds, "warmup_seconds": WARMUP_SECONDS,
             "stream": False, "max_tokens": 1, "load1": _load1()}  # fmt: skip
        r = loops[concurrency]
        d99 = _pct(r["direct"]["latencies"], 0.99)
        a99 = {}
        for n in names:
            _emit(f"{n}_ms_at_{concurrency}", {"p50": _ms(_pct(r[n]["latencies"], 0.5)),
                                               "p99": _ms(_pct(r[n]["latencies"], 0.99))}, "ms", s,
                  requests=len(r[n]["latencies"]), errors=r[n]["errors"])  # fmt: skip
        for t in through:
            a99[t.name] = _pct(r[t.name]["latencies"], 0.99) - d99
            _emit(f"{t.name}_added_p99_ms_at_{concurrency}", _ms(a99[t.name]), "ms", s,
                  aim={16: 10, 64: 25}[concurrency] if t.name == "llmgw" else None)  # fmt: skip
        for peer in peers:
            _emit(f"{peer}_over_llmgw_added_p99_at_{concurrency}", ratio(a99[peer], a99["llmgw"]),
                  "ratio", s)  # fmt: skip

    # Throughput at 64.
    r = loops[64]
    s = {
        **scale,
        "concurrency": 64,
        "seconds": THROUGHPUT_SECONDS,
        "stream": False,
        "max_tokens": 1,
    }
    for n in names:
        per_request_cpu = r[n]["cpu_s"] / max(1, len(r[n]["latencies"]))
        _emit(f"{n}_requests_per_second", round(r[n]["per_second"]), "requests/s", s,
              aim=(6000 if WORKERS > 1 else 2500) if n == "llmgw" else None, errors=r[n]["errors"],
              process_cpu_ms_per_request=round(per_request_cpu * 1000, 3),
              process_cpu_s=round(r[n]["cpu_s"], 2), load_generator_cpu_s=round(r[n]["load_cpu_s"], 2),
              process=("the engine" if n == "direct" else f"{n}'s proxy, not the engine"))  # fmt: skip
    for peer in peers:
        _emit(f"llmgw_over_{peer}_requests_per_second", ratio(r["llmgw"]["per_second"], r[peer]["per_second"]),
              "ratio", s)  # fmt: skip
    # Where the machine's cores went while each was measured (issue 41: why --workers 2 did
    # not beat one), and which of llmgw's processes held the 64 connections.
    for n in names:
        if "cores" in r[n]:
            _emit(f"{n}_cores_by_process_at_64", r[n]["cores"], "cores", s,
                  connections_held=r[n]["connections"] if n == "llmgw" else None)  # fmt: skip

    # Time to first token, streamed, one at a time.
    ttft = await _sequential(targets, STREAMED, stream=True)
    s = {
        **scale,
        "requests_per_target": STREAMED,
        "concurrency": 1,
        "stream": True,
        "max_tokens": 4,
    }
    d = {q: _pct(ttft["direct"], q) for q in (0.5, 0.99)}
    _emit("direct_ttft_ms", {"p50": _ms(d[0.5]), "p99": _ms(d[0.99])}, "ms", s)
    added = {}
    for t in through:
        p = {q: _pct(ttft[t.name], q) for q in (0.5, 0.99)}
        added[t.name] = p[0.5] - d[0.5]
        _emit(f"{t.name}_ttft_ms", {"p50": _ms(p[0.5]), "p99": _ms(p[0.99])}, "ms", s)
        _emit(f"{t.name}_ttft_added_ms", {"p50": _ms(p[0.5] - d[0.5]), "p99": _ms(p[0.99] - d[0.99])}, "ms", s,
              aim={"p50": 2} if t.name == "llmgw" else None)  # fmt: skip
    for peer in peers:
        _emit(f"{peer}_over_llmgw_ttft_added_p50", ratio(added[peer], added["llmgw"]), "ratio", s)

    # CPU per streamed answer of 100 tokens, at STREAM_CONCURRENCY at once.
    loops_streamed = await _streamed_cpu(targets)
    s = {**scale, "concurrency": STREAM_CONCURRENCY, "seconds": STREAM_SECONDS,
         "warmup_seconds": WARMUP_SECONDS, "stream": True, "max_tokens": STREAM_TOKENS,
         "engine_tokens_per_second_per_stream": float(TOKENS_PER_SEC),
         "answers_per_second_paced_most": round(STREAM_CONCURRENCY * float(TOKENS_PER_SEC) / STREAM_TOKENS, 1),
         "load1": _load1()}  # fmt: skip
    per_answer, over = streamed_cpu_figures(loops_streamed)
    for n, ms in per_answer.items():
        loop = loops_streamed[n]
        _emit(f"{n}_cpu_ms_per_streamed_{STREAM_TOKENS}_tokens", ms, "ms", s,
              aim=8 if n == "llmgw" else None, answers=len(loop["latencies"]), errors=loop["errors"],
              answers_per_second=round(loop["per_second"], 1), process_cpu_s=round(loop["cpu_s"], 2),
              process=("the engine" if n == "direct" else f"{n}'s proxy, not the engine"))  # fmt: skip
    for peer, value in over.items():
        _emit(f"{peer}_over_llmgw_cpu_per_streamed_{STREAM_TOKENS}_tokens", value, "ratio", s)


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="llmgw-bench-gw-"))
    procs = Procs(home)
    try:
        direct, through, engine_url, ekey = _cluster(procs, home)
        targets = [direct, through]
        versions = {}
        for start in (start_litellm, start_portkey):
            peer = start(procs, home, engine_url, ekey, MODEL)
            if peer is not None:
                targets.append(Target.of(peer))
                versions[peer.name] = peer.version
        for router in ROUTERS:
            peer, why = start_router(procs.spawn, home, router, [engine_url], ekey, MODEL)
            if peer is None:
                print(json.dumps({"bench": "gateway", "figure": router.name, "value": None,
                                  "note": why}), flush=True)  # fmt: skip
                continue
            targets.append(Target.of(peer))
            versions[peer.name] = peer.version
        scale = {
            "machine_cores": os.cpu_count(), "load1_at_start": _load1(),
            "sharing_the_cores": "load generator (this process, one asyncio loop, bare HTTP/1.1 client), "
                                 + ("llmgw serve (embedded, SQLite, reconciler in-process), " if not WORKERS else
                                    f"llmgw serve --workers {WORKERS} (PostgreSQL, Redis), Celery worker and beat, ")
                                 + "llmgw agent (idle), "
                                 "the sim engine, LiteLLM's proxy (idle while the others run), "
                                 "Portkey's gateway on node (idle while the others run), "
                                 "vllm-router and sglang-router (idle while the others run), other work",
            "engine": "llmgw sim-engine " + " ".join(SIM_ARGS), "litellm": versions.get("litellm"),
            "portkey": versions.get("portkey"), "vllm-router": versions.get("vllm-router"),
            "sglang-router": versions.get("sglang-router"), "routers_policy": "cache_aware",
            "mode": "production" if WORKERS else "embedded",
            "workers": WORKERS or 1,
        }  # fmt: skip
        gc.collect()
        gc.freeze()
        asyncio.run(_measure(targets, scale, _roles(procs, direct.pids()[0])))
    finally:
        procs.stop()
        for name in _DATABASE:
            _admin_sql(f'DROP DATABASE IF EXISTS "{name}"')
        if os.environ.get("BENCH_KEEP_HOME"):
            print(f"logs kept in {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
