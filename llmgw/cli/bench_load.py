"""The load of ``llmgw ctl bench``: streaming chat completions through the gateway, timed,
at each level of concurrency in turn, with the progress on stderr.

This is the I/O (the network and the clock), on httpx's AsyncClient; what a
level's results mean is :mod:`llmgw.cli.bench_judge`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import httpx

from llmgw import __version__
from llmgw.cli.base import CtlError
from llmgw.cli.bench_judge import (
    EngineLook,
    LevelSample,
    LevelSummary,
    RequestResult,
    Slo,
    at_once,
    goes_on,
    miss_text,
    ms_text,
    summarize,
)
from llmgw.cli.tables import number

# Asks what the model's engines say now (the command's: `GET /replicas` of the model).
Look = Callable[[], Awaitable[EngineLook]]
PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "Describe the coast, the weather and what the message says."
)


@dataclass(frozen=True)
class Plan:
    """What the ramp sends, where, and for how long."""

    model: str
    url: str  # the gateway's chat completions URL
    key: str
    levels: tuple[int, ...]
    seconds: float
    max_tokens: int
    request_timeout_s: float

    def body(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.key}",
            "User-Agent": f"llmgw-ctl-bench/{__version__}",
            "Accept": "text/event-stream",
        }


def gateway_message(response: httpx.Response) -> str:
    """The gateway's sentence: OpenAI's ``{"error": {"message"}}``, ``{"detail"}``, or the text."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        if isinstance(body.get("detail"), str) and body["detail"]:
            return body["detail"]
    text = response.text.strip().splitlines()
    return text[0][:200] if text else response.reason_phrase


def _token_text(choice: Mapping[str, Any]) -> str:
    """The text a stream chunk's choice adds; reasoning counts, as it is generated too."""
    delta = choice.get("delta")
    if isinstance(delta, Mapping):
        for key in ("content", "reasoning_content"):
            if isinstance(delta.get(key), str) and delta[key]:
                return delta[key]
        return ""
    text = choice.get("text")  # /v1/completions' shape, from a gateway that answers it here
    return text if isinstance(text, str) else ""


async def _stream(client: httpx.AsyncClient, plan: Plan, start: float) -> RequestResult:
    async with client.stream("POST", plan.url, json=plan.body(), headers=plan.headers()) as resp:
        if not resp.is_success:
            await resp.aread()
            return RequestResult(ok=False, error=f"{resp.status_code}: {gateway_message(resp)}")
        first: float | None = None
        last: float | None = None
        chunks = 0
        usage_tokens: int | None = None
        finished = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                finished = True
                break
            try:
                event = json.loads(data)
            except ValueError:
                return RequestResult(ok=False, error="the stream sent an event that is not JSON")
            if not isinstance(event, Mapping):
                continue
            if event.get("error"):
                error = event["error"]
                message = error.get("message") if isinstance(error, Mapping) else error
                return RequestResult(ok=False, error=f"stream error: {message}")
            now = time.perf_counter()
            for choice in event.get("choices") or ():
                if not isinstance(choice, Mapping):
                    continue
                if _token_text(choice):
                    first = now if first is None else first
                    last = now
                    chunks += 1
                if choice.get("finish_reason"):
                    finished = True
            usage = event.get("usage")
            if isinstance(usage, Mapping) and isinstance(usage.get("completion_tokens"), int):
                usage_tokens = usage["completion_tokens"]
    if not finished:
        return RequestResult(ok=False, error="the stream ended before the answer did")
    # A chunk may carry several tokens, so the engine's count is preferred.
    tokens = usage_tokens if usage_tokens is not None else chunks
    ttft = (first - start) * 1000 if first is not None else None
    tpot = None
    if first is not None and last is not None and tokens >= 2:
        tpot = (last - first) * 1000 / (tokens - 1)
    return RequestResult(ok=True, ttft_ms=ttft, tpot_ms=tpot, completion_tokens=tokens)


async def one_request(client: httpx.AsyncClient, plan: Plan) -> RequestResult:
    """Send one streaming chat completion and time it; every failure is a result, not a raise."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(plan.request_timeout_s):
            return await _stream(client, plan, start)
    except TimeoutError:
        return RequestResult(ok=False, error=f"no answer within {number(plan.request_timeout_s)} s")
    except httpx.TimeoutException:
        return RequestResult(ok=False, error="timed out")
    except httpx.HTTPError as exc:
        return RequestResult(ok=False, error=str(exc) or type(exc).__name__)


def _client(plan: Plan, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(plan.request_timeout_s))


class Progress:
    """How the ramp is going, on stderr: a bar redrawn in place on a terminal, and a
    line per finished level (the only output when stderr is not a terminal)."""

    def __init__(self, stream: TextIO, *, seconds: float) -> None:
        self.stream = stream
        self.seconds = seconds
        self.live = stream.isatty()
        self._drawn = False

    def say(self, line: str) -> None:
        self._clear()
        print(line, file=self.stream, flush=True)

    def draw(self, concurrency: int, elapsed: float, results: Sequence[RequestResult]) -> None:
        if not self.live:
            return
        width = 20
        filled = min(int(width * elapsed / self.seconds), width)
        failed = sum(1 for r in results if not r.ok)
        bar = "#" * filled + "-" * (width - filled)
        shown = min(elapsed, self.seconds)
        text = (
            f"{concurrency:>4} at once [{bar}] {shown:.1f}/{number(self.seconds)} s, "
            f"{len(results)} done, {failed} failed"
        )
        self.stream.write(f"\r{text}\x1b[K")
        self.stream.flush()
        self._drawn = True

    def level_done(self, level: LevelSummary) -> None:
        parts = [
            f"{at_once(level.concurrency)}: {level.requests} requests, {level.errors} errors",
            f"ttft p95 {ms_text(level.ttft_p95_ms)}",
            f"tpot p95 {ms_text(level.tpot_p95_ms)}",
            f"{level.tok_per_sec:.0f} tok/s",
        ]
        if level.watts is not None:
            parts.append(f"{level.watts:,.0f} W")
        if level.meets_slo is True:
            parts.append("meets the SLO")
        elif level.meets_slo is False:
            parts.append(f"misses the SLO: {miss_text(level)}")
        self.say(", ".join(parts))

    def close(self) -> None:
        self._clear()

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False


LOOK_EVERY_S = 1.0  # how often the engines' readings are asked for during a level


async def run_level(
    plan: Plan, concurrency: int, progress: Progress, look: Look | None = None
) -> LevelSample:
    """``concurrency`` workers sending requests back to back for ``plan.seconds``, and
    ``look`` asked every second meanwhile what the engines say (a failed look is none).

    Requests in flight at the end are waited for and counted; the level's wall
    time runs until the last of them finishes.
    """
    results: list[RequestResult] = []
    looks: list[EngineLook] = []
    async with _client(plan, concurrency) as client:
        start = time.perf_counter()
        deadline = start + plan.seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                results.append(await one_request(client, plan))

        async def ticker() -> None:
            while True:
                progress.draw(concurrency, time.perf_counter() - start, results)
                await asyncio.sleep(0.1)

        async def looker() -> None:
            while look is not None and time.perf_counter() < deadline:
                await asyncio.sleep(LOOK_EVERY_S)
                try:
                    looks.append(await look())
                except Exception:  # noqa: BLE001 - a figure missed, not a level failed
                    continue

        tick = asyncio.create_task(ticker()) if progress.live else None
        watch = asyncio.create_task(looker())
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(concurrency):
                    group.create_task(worker())
        finally:
            if tick is not None:
                tick.cancel()
            watch.cancel()
        wall = time.perf_counter() - start
    return LevelSample(
        concurrency=concurrency, wall_s=wall, results=tuple(results), looks=tuple(looks)
    )


async def run_ramp(
    plan: Plan,
    slo: Slo,
    progress: Progress,
    samples: list[LevelSample],
    look: Look | None = None,
) -> None:
    """A warm-up request, then each level in turn until one misses (see :func:`goes_on`).

    Finished levels are appended to ``samples`` as they end, so a caller
    interrupted mid-ramp keeps what was measured. CtlError when the warm-up
    fails: a wrong key or model is not worth a ramp of refusals.
    """
    try:
        async with _client(plan, 1) as client:
            warm = await one_request(client, plan)
        if not warm.ok:
            raise CtlError(f"the first request through {plan.url} failed: {warm.error}")
        for concurrency in plan.levels:
            sample = await run_level(plan, concurrency, progress, look)
            samples.append(sample)
            level = summarize(sample, slo)
            progress.level_done(level)
            if not goes_on(level):
                break
    finally:
        progress.close()


__all__ = ["Plan", "Progress", "one_request", "run_level", "run_ramp"]
