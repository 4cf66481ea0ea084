"""Priority bands under overload (issue 39, item 6): the top band's time to first token at
twice a model's capacity, against its figure unloaded, while the lowest band absorbs the
refusals.

One process, one event loop: the gateway's ASGI app (`llmgw.gateway.app.Gateway`, as
`llmgw serve` runs it, reading its tables from a SQLite database of its own) in front of
one replica of the sim engine (SLOTS requests at once, more wait in its queue, a fixed
time to first token and a rate of tokens). No agent runs, so its part is played here
(and the runtime's own read of the agents' reports is switched off):
every READ_S seconds the engine's running and waiting counts are handed to the gateway
as its readings (`State.readings_read`), as the gateway reads what agents report. Each
request is a streamed chat sent straight to the ASGI app; its time to first token is
from its start to the first body bytes the app sends, so no HTTP client's buffering is
measured.

The model's capacity is SLOTS over one request's time on the engine (its TTFT plus
MAX_TOKENS at the engine's rate). After a warm-up, the engine is seen full once (a burst
and a reading while it queues: `seen_full`), so the gateway knows its slots as one that
has served a while does; BENCH_BANDS_SEEN_FULL=0 leaves that out. Arrivals are Poisson,
for SECONDS each phase:

- **unloaded**: the `high` key alone at HIGH_SHARE of capacity;
- **bands**: the `high` key at HIGH_SHARE and a `low` key at 2 − HIGH_SHARE of
  capacity: twice the capacity in all;
- **one band**: the same two loads, both keys `normal`: what every request met before
  bands (nothing displaced, every request queues).

Figures per phase and key: requests, refused (429 model_overloaded), TTFT p50 and p95
(ms) of those answered. Aim: the high key's p95 under load within 1.5 × its unloaded
p95, the refusals on the low key. BENCH_BANDS_SECONDS, BENCH_BANDS_SLOTS,
BENCH_BANDS_READ_S scale it. One JSON line per phase, then a summary line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import django_ready, host_loop_ms  # noqa: E402

SECONDS = float(os.environ.get("BENCH_BANDS_SECONDS", "20"))
SLOTS = int(os.environ.get("BENCH_BANDS_SLOTS", "4"))
READ_S = float(os.environ.get("BENCH_BANDS_READ_S", "2"))
SEEN_FULL = os.environ.get("BENCH_BANDS_SEEN_FULL", "1") != "0"
TTFT_MS = 40.0
TOKENS_PER_SEC = 400.0
MAX_TOKENS = 16
HIGH_SHARE = 0.4
CAPACITY = SLOTS / (TTFT_MS / 1000 + MAX_TOKENS / TOKENS_PER_SEC)  # requests a second


async def one(app, secret: str) -> tuple[int, float]:
    """One streamed chat straight to the ASGI app: (status, seconds to its first body)."""
    body = json.dumps(
        {
            "model": "llama",
            "stream": True,
            "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": "hello there"}],
        }
    ).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"gw"),
            (b"authorization", f"Bearer {secret}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    done = asyncio.Event()
    start = time.perf_counter()
    first = None
    status = 0

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal first, status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            if first is None and message.get("body"):
                first = time.perf_counter() - start
            if not message.get("more_body"):
                done.set()

    await app(scope, receive, send)
    done.set()
    return status, first if first is not None else time.perf_counter() - start


async def arrivals(app, secret: str, rate: float, seconds: float, out: list) -> None:
    """Poisson arrivals at `rate` a second for `seconds`, each request on its own."""
    tasks = []
    end = time.perf_counter() + seconds
    rng = random.Random(hash(secret) & 0xFFFF)
    while time.perf_counter() < end:
        await asyncio.sleep(rng.expovariate(rate))
        tasks.append(asyncio.create_task(one(app, secret)))
    out.extend(await asyncio.gather(*tasks))


async def readings_pump(gateway, engine, stop: asyncio.Event) -> None:
    """The agents' part: the engine's counts to the gateway every READ_S seconds."""
    from fleet.domain.readings import Reading

    while not stop.is_set():
        rt = gateway.runtime
        if rt is not None:
            slots = engine.slots
            rt.readings_read({"llama-1": Reading(running=slots.running, waiting=slots.waiting)})
            rt._read_readings = _nothing  # no agent reports here: these are the readings
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), READ_S)


async def seen_full(gateway, engine, secret: str) -> None:
    """The engine seen full once, as a gateway that has served a while has seen it: a burst
    of 3 × SLOTS requests, and a reading handed over while they queue, from which the
    gateway learns the engine's slots (`bands.slots_learnt`). Without it the slots are
    learnt only when a reading happens to find a queue, which the bands keep short."""
    from fleet.domain.readings import Reading

    burst = [asyncio.create_task(one(gateway, secret)) for _ in range(3 * SLOTS)]
    while engine.slots.waiting == 0:
        await asyncio.sleep(0.005)
    slots = engine.slots
    gateway.runtime.readings_read(
        {"llama-1": Reading(running=slots.running, waiting=slots.waiting)}
    )
    await asyncio.gather(*burst)
    await asyncio.sleep(0.5)


async def _nothing() -> None:
    return None


def figures(results: list[tuple[int, float]]) -> dict:
    ok = sorted(t for s, t in results if s == 200)
    refused = sum(1 for s, _ in results if s == 429)
    q = statistics.quantiles(ok, n=20) if len(ok) >= 20 else None
    return {
        "requests": len(results),
        "refused": refused,
        "other": len(results) - len(ok) - refused,
        "ttft_p50_ms": round(statistics.median(ok) * 1000, 1) if ok else None,
        "ttft_p95_ms": round(q[18] * 1000, 1) if q else None,
    }


async def phase(gateway, engine, name: str, loads: dict[str, float]) -> dict:
    stop = asyncio.Event()
    pump = asyncio.create_task(readings_pump(gateway, engine, stop))
    out: dict[str, list] = {k: [] for k in loads}
    await asyncio.gather(
        *(arrivals(gateway, secret, rate, SECONDS, out[secret]) for secret, rate in loads.items())
    )
    stop.set()
    await pump
    await asyncio.sleep(1.0)  # the engine's queue drains before the next phase
    return {"phase": name, "keys": {KEYS[s]: figures(r) for s, r in out.items()}}


KEYS: dict[str, str] = {}


async def main() -> None:
    from asgiref.sync import sync_to_async
    from django.conf import settings

    from llmgw.core.secrets import engine_key
    from llmgw.gateway.app import Gateway
    from llmgw.simengine import ENGINE, SimConfig, start_server
    from tenancy.services import api_key_create
    from tenancy.services.bands import band_set
    from tests.fleet.builders import gpu_model, model_added
    from tests.gateway.world import _replica, _tenancy, django_inner

    runner, port = await start_server(
        SimConfig(
            model="llama",
            ttft_ms=TTFT_MS,
            tokens_per_sec=TOKENS_PER_SEC,
            slots=SLOTS,
            max_tokens=MAX_TOKENS,
            api_key=engine_key(settings.SECRET_KEY, "llama-1"),
        )
    )
    engine = runner.app[ENGINE]

    def rows() -> tuple[str, str, int, int]:
        _tenancy()
        model_added(gpu_model("llama"))
        _replica("llama-1", "llama", f"http://127.0.0.1:{port}")
        high, hs = api_key_create(project="Acme/ml/chat", name="high", band="high", actor="b")
        low, ls = api_key_create(project="Acme/ml/chat", name="low", band="low", actor="b")
        return hs, ls, high.pk, low.pk

    high, low, high_id, low_id = await sync_to_async(rows)()
    KEYS.update({high: "high", low: "low"})
    gateway = Gateway(django_inner)
    try:
        hi_rate, lo_rate = HIGH_SHARE * CAPACITY, (2 - HIGH_SHARE) * CAPACITY
        await phase(gateway, engine, "warm-up", {high: hi_rate})
        if SEEN_FULL:
            await seen_full(gateway, engine, high)
        results = [await phase(gateway, engine, "unloaded", {high: hi_rate})]
        results.append(await phase(gateway, engine, "bands", {high: hi_rate, low: lo_rate}))
        for key_id in (high_id, low_id):
            await sync_to_async(band_set)(scope=f"key:{key_id}", band="normal", actor="b")
        gateway.runtime.loader._count = -1  # keys read whole at the next refresh
        await gateway.runtime._refresh()
        gateway.runtime.bands.clear()  # the bands the first phases saw are gone
        results.append(await phase(gateway, engine, "one band", {high: hi_rate, low: lo_rate}))
    finally:
        if gateway.runtime is not None:
            await gateway.runtime.close()
        await runner.cleanup()
    scale = {
        "seconds": SECONDS,
        "slots": SLOTS,
        "capacity_rps": round(CAPACITY, 1),
        "high_rps": round(hi_rate, 1),
        "low_rps": round(lo_rate, 1),
        "read_s": READ_S,
        "seen_full": SEEN_FULL,
        "host_loop_ms": host_loop_ms(),
    }
    for r in results:
        print(json.dumps({**r, **scale}))
    unloaded = results[0]["keys"]["high"]["ttft_p95_ms"]
    loaded = results[1]["keys"]["high"]["ttft_p95_ms"]
    print(
        json.dumps(
            {
                "high_p95_unloaded_ms": unloaded,
                "high_p95_at_2x_ms": loaded,
                "ratio": round(loaded / unloaded, 2) if unloaded and loaded else None,
                "aim": "<= 1.5",
                "refused_high": results[1]["keys"]["high"]["refused"],
                "refused_low": results[1]["keys"]["low"]["refused"],
                "one_band_high_p95_ms": results[2]["keys"]["high"]["ttft_p95_ms"],
            }
        )
    )


if __name__ == "__main__":
    django_ready()
    asyncio.run(main())
