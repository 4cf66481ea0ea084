"""Power capping against shedding on the sim engines (docs/benchmarks.md, "Capping against
shedding"): a warm rack's 4 replicas (`llmgw sim-engine`, 4 slots, 100 tokens a second
each) under a closed loop of 16 clients, one request of 32 tokens after another, routed
round-robin as the gateway would:

- capped: the rack's GPUs held to 80 % and 60 % of their default power limit, through
  the power file their agent writes for simulated GPUs (`--power-file`); each engine runs
  at share ** 0.6 of its speed from its next request, no restart. The tokens a second
  kept, measured, against the model's figure;
- shed: one replica moved make-before-break, as shedding moves it: its replacement started
  as a new process (`llmgw sim-engine`), routed to once healthy, the old one routed away
  from, drained and stopped. The replacement's start, the tokens a second while it moves,
  the requests that failed and the slowest answer.

The speed under a power limit is a model (share ** BENCH_POWER_EXPONENT), not a
measurement of any card. Prints one JSON line per figure, with the machine's load and
the scale first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPLICAS = int(os.environ.get("BENCH_REPLICAS", 4))
SLOTS = 4
TOKENS_PER_SEC = 100.0
TTFT_MS = 20.0
MAX_TOKENS = 32
PHASE_S = float(os.environ.get("BENCH_PHASE_S", 6))
EXPONENT = float(os.environ.get("BENCH_POWER_EXPONENT", 0.6))
CLIENTS = REPLICAS * SLOTS  # every slot busy: what the rack can give is what is measured


@dataclass
class Tally:
    """What the clients got in a window: tokens, answers, failures, each answer's time."""

    tokens: int = 0
    failed: int = 0
    took: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Tokens a second as the closed loop gives them (Little's law: the clients over
        the mean answer time, times the tokens of one): the window's edges, which cut
        answers in two, do not move it as counting answers in the window does."""
        return CLIENTS * MAX_TOKENS / statistics.fmean(self.took) if self.took else 0.0

    def line(self, figure: str, seconds: float, **extra: object) -> dict:
        took = sorted(self.took)
        return {
            "figure": figure,
            "tokens_per_s": round(self.rate, 1),
            "tokens_per_s_counted": round(self.tokens / seconds, 1),
            "answers": len(took),
            "failed": self.failed,
            "answer_s_p50": round(statistics.median(took), 3) if took else None,
            "answer_s_max": round(took[-1], 3) if took else None,
            **extra,
        }


class Load:
    """CLIENTS closed-loop clients over the routing table `urls`, counting into `tally`."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.tally = Tally()
        self.inflight: dict[str, int] = {}  # per URL, requests sent and not answered
        self._next = 0
        self._stop = False

    def pick(self) -> str:
        self._next = (self._next + 1) % len(self.urls)
        return self.urls[self._next]

    async def client(self, session) -> None:
        body = {"messages": [{"role": "user", "content": "warm rack"}], "max_tokens": MAX_TOKENS}
        while not self._stop:
            url, start = self.pick(), time.perf_counter()
            self.inflight[url] = self.inflight.get(url, 0) + 1
            try:
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    answer = await resp.json()
                    if resp.status != 200:
                        raise RuntimeError(resp.status)
                self.tally.tokens += answer["usage"]["completion_tokens"]
                self.tally.took.append(time.perf_counter() - start)
            except Exception:  # noqa: BLE001 - a refused or cut request is what is counted
                self.tally.failed += 1
                await asyncio.sleep(0.05)
            finally:
                self.inflight[url] -= 1

    async def window(self, seconds: float) -> tuple[Tally, float]:
        """A fresh tally over `seconds` of the running load; what comes after goes to
        another."""
        self.tally = Tally()
        start = time.perf_counter()
        await asyncio.sleep(seconds)
        done, self.tally = self.tally, Tally()
        return done, time.perf_counter() - start


async def start_replacement(power: Path) -> tuple[asyncio.subprocess.Process, str, float]:
    """A new `llmgw sim-engine` process, as an agent elsewhere starts it; its URL once
    healthy, and how long that took."""
    import aiohttp

    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmgw", "sim-engine", "--port", "0",
        "--slots", str(SLOTS), "--tokens-per-sec", str(TOKENS_PER_SEC),
        "--ttft-ms", str(TTFT_MS), "--power-file", str(power),
        "--power-exponent", str(EXPONENT),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    line = (await proc.stderr.readline()).decode()
    found = re.search(r"http://[\d.]+:\d+", line)
    if found is None:
        raise RuntimeError(f"the replacement did not say where it listens: {line!r}")
    url = found.group(0)
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.02)
    return proc, url, time.perf_counter() - start


async def main() -> None:
    import aiohttp

    from benchmarks.common import host_loop_ms
    from llmgw.simengine import SimConfig, power_speed, start_server

    folder = Path(tempfile.mkdtemp(prefix="llmgw-capping-"))
    rack = folder / "rack-power"  # the warm rack's nodes' power file, as their agents keep it
    cool = folder / "cool-power"  # the cool rack a shed replica goes to
    runners = []
    for _ in range(REPLICAS):
        config = SimConfig(
            ttft_ms=TTFT_MS,
            tokens_per_sec=TOKENS_PER_SEC,
            slots=SLOTS,
            max_tokens=MAX_TOKENS,
            power_file=str(rack),
            power_exponent=EXPONENT,
        )
        runners.append(await start_server(config))
    urls = [f"http://127.0.0.1:{port}" for _, port in runners]
    print(json.dumps({"load_average": os.getloadavg()[0], "host_loop_ms": host_loop_ms(),
                      "replicas": REPLICAS, "slots": SLOTS,
                      "tokens_per_s_each": TOKENS_PER_SEC, "clients": CLIENTS,
                      "max_tokens": MAX_TOKENS, "power_exponent": EXPONENT,
                      "phase_s": PHASE_S}))  # fmt: skip
    load = Load(urls)
    connector = aiohttp.TCPConnector(limit=CLIENTS * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        clients = [asyncio.create_task(load.client(session)) for _ in range(CLIENTS)]
        await load.window(1.0)  # warm-up
        tally, took = await load.window(PHASE_S)
        base = tally.rate
        print(json.dumps(tally.line("uncapped", took)))
        for share in (0.8, 0.6):
            rack.write_text(f"{share}\n")
            await load.window(1.5)  # the engines read the file within a second
            tally, took = await load.window(PHASE_S)
            print(json.dumps(tally.line(
                f"capped to {share:.0%}, no restart", took,
                kept=round(tally.rate / base, 3),
                model_kept=round(power_speed(share, EXPONENT), 3),
            )))  # fmt: skip
        rack.write_text("1\n")
        await load.window(1.5)
        print(json.dumps(await shed_one(load, runners, urls, cool, base)))
        load._stop = True
        await asyncio.gather(*clients, return_exceptions=True)
    for runner, _ in runners:
        with contextlib.suppress(Exception):
            await runner.cleanup()


async def shed_one(load: Load, runners: list, urls: list[str], cool: Path, base: float) -> dict:
    """One replica moved make-before-break: replacement first, then the old one routed
    away from, drained and stopped; the load measured over the whole move."""
    from llmgw.simengine import ENGINE

    load.tally = Tally()
    start = time.perf_counter()
    proc, url, ready_s = await start_replacement(cool)
    old_runner, _ = runners[0]
    old, urls[0] = urls[0], url  # routed to the replacement; the old one takes nothing new
    engine = old_runner.app[ENGINE]
    # Drained: what it was sent is answered (the gateway's in-flight count, its grace).
    while load.inflight.get(old) or engine.slots.running:
        await asyncio.sleep(0.01)
    drain_s = time.perf_counter() - start - ready_s
    await old_runner.cleanup()
    runners.pop(0)
    took = time.perf_counter() - start
    during, load.tally = load.tally, Tally()
    after, took_after = await load.window(PHASE_S)  # the replacement serving
    proc.terminate()
    await proc.wait()
    return after.line(
        "shed one replica, make-before-break (after the move)",
        took_after,
        kept=round(after.rate / base, 3),
        replacement_ready_s=round(ready_s, 2),
        drain_s=round(drain_s, 2),
        move_s=round(took, 2),
        failed_during_move=during.failed,
        answers_during_move=len(during.took),
    )


if __name__ == "__main__":
    asyncio.run(main())
