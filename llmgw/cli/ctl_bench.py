"""``llmgw ctl bench MODEL [--save]``: how many requests at once a model serves within its SLO.

A load ramp through the OpenAI-compatible gateway: at each level N workers send
streaming chat completions back to back for ``--seconds``, N doubling from 1.
Each level is judged against the model's SLO (``GET /api/v1/models/{name}``);
the ramp stops after the first level that misses it, and the capacity is the
last level that met it. ``--save`` stores that per replica with
``PUT /api/v1/models/{name}/capacity``, where the reconciler sizes the model
from it.

The judging is pure (:func:`judge` and what it calls: samples in, summaries
out) and kept apart from the load, which is :func:`run_ramp` on httpx's
AsyncClient.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import httpx

from llmgw import __version__
from llmgw.cli.base import Api, CtlError, Output, positive_number, segment
from llmgw.cli.tables import DASH, number, render

DEFAULT_MAX_CONCURRENCY = 64
DEFAULT_SECONDS = 10.0
DEFAULT_MAX_TOKENS = 64
DEFAULT_REQUEST_TIMEOUT_S = 60.0
# One client process opens a connection per worker; past this it measures
# itself more than the model.
MOST_CONCURRENCY = 1024
PERCENTILE = 95
PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "Describe the coast, the weather and what the message says."
)
KEY_ENV = "LLMGW_API_KEY"
INTERRUPTED = 130  # what a shell reports for a command ended by Ctrl-C


# What was measured, and how it is judged (pure: no I/O, no clock)


@dataclass(frozen=True)
class RequestResult:
    """One request of the ramp: how fast its tokens came, or why it failed.

    ``ttft_ms`` is None when no token came; ``tpot_ms`` when fewer than two did.
    """

    ok: bool
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    completion_tokens: int = 0
    error: str = ""


@dataclass(frozen=True)
class LevelSample:
    """The requests that finished at one level of concurrency, and how long the level ran."""

    concurrency: int
    wall_s: float
    results: tuple[RequestResult, ...]


@dataclass(frozen=True)
class Slo:
    """A model's promise at the 95th percentile; None is no promise on that figure."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None

    @classmethod
    def from_view(cls, view: Any) -> Slo:
        """The ``slo`` of a ModelView; a missing, zero or non-numeric figure is not set."""

        def figure(value: Any) -> float | None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            return float(value) if value > 0 and math.isfinite(value) else None

        slo = view.get("slo") if isinstance(view, Mapping) else None
        if not isinstance(slo, Mapping):
            return cls()
        return cls(figure(slo.get("ttft_p95_ms")), figure(slo.get("tpot_p95_ms")))

    @property
    def is_set(self) -> bool:
        return self.ttft_p95_ms is not None or self.tpot_p95_ms is not None


@dataclass(frozen=True)
class LevelSummary:
    """One level as the table shows it.

    ``meets_slo`` is None when there is no SLO to judge by; ``misses`` says why
    a level did not meet it (or, with no SLO, that requests failed).
    """

    concurrency: int
    requests: int
    errors: int
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    tok_per_sec: float
    meets_slo: bool | None
    misses: tuple[str, ...] = ()
    first_error: str = ""


@dataclass(frozen=True)
class Judgement:
    """Every level's summary, the capacity (the last level of the run that met the SLO
    with every level below it) and the first level that missed, if one did."""

    levels: tuple[LevelSummary, ...]
    capacity: LevelSummary | None
    missed: LevelSummary | None
    slo: Slo


def percentile(values: Sequence[float], p: int = PERCENTILE) -> float | None:
    """The nearest-rank percentile: the smallest value with at least p% of them at or below it.

    Always one of the values, never interpolated; None for no values.
    """
    if not 0 < p <= 100:
        raise ValueError(f"a percentile is above 0 and at most 100, not {p}")
    if not values:
        return None
    ordered = sorted(values)
    rank = -(-p * len(ordered) // 100)  # ceil(p * n / 100) without floating point
    return ordered[rank - 1]


def ms_text(value: float | None) -> str:
    """``180 ms``; below 10 ms with one decimal, so a fast engine does not read ``0 ms``."""
    if value is None:
        return DASH
    return f"{value:.0f} ms" if value >= 10 else f"{number(value)} ms"


def summarize(sample: LevelSample, slo: Slo) -> LevelSummary:
    """A level's requests, errors, p95s and throughput, and whether it met the SLO."""
    results = sample.results
    good = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    ttft = percentile([r.ttft_ms for r in good if r.ttft_ms is not None])
    tpot = percentile([r.tpot_ms for r in good if r.tpot_ms is not None])
    tokens = sum(r.completion_tokens for r in good)
    tok_per_sec = tokens / sample.wall_s if sample.wall_s > 0 else 0.0
    misses: list[str] = []
    if not results:
        misses.append("no request finished")
    if failed:
        misses.append(f"{len(failed)} of {len(results)} requests failed")
    if slo.is_set:
        for label, got, limit in (
            ("ttft", ttft, slo.ttft_p95_ms),
            ("tpot", tpot, slo.tpot_p95_ms),
        ):
            if limit is None:
                continue
            if got is None:
                if good:
                    misses.append(f"no {label} measured")
            elif got > limit:
                misses.append(f"{label} p95 {ms_text(got)} > {number(limit)}")
    return LevelSummary(
        concurrency=sample.concurrency,
        requests=len(results),
        errors=len(failed),
        ttft_p95_ms=ttft,
        tpot_p95_ms=tpot,
        tok_per_sec=tok_per_sec,
        meets_slo=(not misses) if slo.is_set else None,
        misses=tuple(misses),
        first_error=failed[0].error if failed else "",
    )


def goes_on(level: LevelSummary) -> bool:
    """Whether the ramp tries the next level: not after a miss, nor (with no SLO) errors."""
    return not level.misses


def judge(samples: Sequence[LevelSample], slo: Slo) -> Judgement:
    """Summaries of the levels in the order run, and the capacity among them.

    The capacity is the last level of the unbroken run of levels, from the
    first, that met the SLO: a level that met it above one that missed does not
    count, as latency that came back at more load is luck. With no SLO there is
    none.
    """
    levels = tuple(summarize(sample, slo) for sample in samples)
    capacity = missed = None
    if slo.is_set:
        for level in levels:
            if not level.meets_slo:
                missed = level
                break
            capacity = level
    return Judgement(levels=levels, capacity=capacity, missed=missed, slo=slo)


def ladder(max_concurrency: int) -> tuple[int, ...]:
    """1, 2, 4, … up to ``max_concurrency``, which ends it even when not a power of two."""
    levels = []
    n = 1
    while n < max_concurrency:
        levels.append(n)
        n *= 2
    levels.append(max_concurrency)
    return tuple(levels)


def at_once(n: int) -> str:
    return f"{n} request{'' if n == 1 else 's'} at once"


def slo_text(level: LevelSummary, slo: Slo) -> str:
    """``ttft p95 180 ms ≤ 500, tpot p95 31 ms ≤ 50``: each set figure against its limit."""
    parts = []
    for label, got, limit in (
        ("ttft", level.ttft_p95_ms, slo.ttft_p95_ms),
        ("tpot", level.tpot_p95_ms, slo.tpot_p95_ms),
    ):
        if limit is not None:
            sign = "≤" if got is not None and got <= limit else ">"
            parts.append(f"{label} p95 {ms_text(got)} {sign} {number(limit)}")
    return ", ".join(parts)


def miss_text(level: LevelSummary) -> str:
    """Why a level missed: ``3 of 40 requests failed (503 …), ttft p95 620 ms > 500``."""
    parts = list(level.misses)
    for i, part in enumerate(parts):
        if part.endswith("requests failed") and level.first_error:
            parts[i] = f"{part} ({level.first_error})"
    return ", ".join(parts)


def verdict(j: Judgement, *, model: str, last_tried: int | None, interrupted: bool) -> list[str]:
    """The sentences under the table: the capacity, or why there is none."""
    if not j.levels:
        return ["nothing was measured"]
    if not j.slo.is_set:
        return [
            f"no capacity judged: {model} has no SLO (slo.ttft_p95_ms or slo.tpot_p95_ms) "
            "to measure against"
        ]
    if j.capacity is None:
        first = j.missed or j.levels[0]
        return [f"no capacity: at {at_once(first.concurrency)}, {miss_text(first)}"]
    c = j.capacity
    line = f"capacity: {at_once(c.concurrency)}, {c.tok_per_sec:.0f} tok/s ({slo_text(c, j.slo)})"
    lines = [line]
    if j.missed is not None:
        lines.append(f"at {at_once(j.missed.concurrency)}: {miss_text(j.missed)}")
    elif interrupted:
        lines.append("stopped by Ctrl-C before any level missed: it may serve more")
    elif c.concurrency == last_tried:
        lines.append("no level tried missed: it may serve more (raise --max-concurrency)")
    return lines


# Replicas: the figures saved are per replica


@dataclass(frozen=True)
class ReplicaBasis:
    """How many ready replicas shared the load, and the profile the measurement is stored for."""

    ready: int
    profile: str


def replica_basis(replicas: Any, *, model: str, profile: str | None) -> ReplicaBasis:
    """The ready replicas of ``GET /replicas?model=`` and their profile.

    CtlError when none is ready; CtlError(2) when they run several profiles and
    no ``--profile`` names one of them.
    """
    ready = [
        r
        for r in replicas or ()
        if isinstance(r, Mapping) and r.get("state") == "ready" and r.get("model", model) == model
    ]
    if not ready:
        raise CtlError(
            f"{model} has no ready replica, so a measurement could not be stored per replica; "
            f"start one (llmgw ctl scale {model} --min 1) and run again"
        )
    profiles = sorted({str(r.get("profile") or "") for r in ready} - {""})
    if profile is not None:
        if profile not in profiles:
            running = ", ".join(profiles) or "no named profile"
            raise CtlError(
                f"no ready replica of {model} runs profile {profile} (they run {running})", 2
            )
        return ReplicaBasis(len(ready), profile)
    if len(profiles) == 1:
        return ReplicaBasis(len(ready), profiles[0])
    if not profiles:
        raise CtlError(f"{model}'s ready replicas name no profile; give it with --profile", 2)
    raise CtlError(
        f"{model}'s ready replicas run profiles {', '.join(profiles)}; "
        "name the one to store the measurement for with --profile",
        2,
    )


def per_replica(capacity: LevelSummary, basis: ReplicaBasis) -> dict[str, Any]:
    """The body of ``PUT /models/{name}/capacity``: the capacity divided among the replicas.

    Concurrency is rounded down (a replica promised more than it took is a
    replica overloaded) but never below 1.
    """
    return {
        "profile": basis.profile,
        "max_concurrency": max(capacity.concurrency // basis.ready, 1),
        "tok_per_sec": round(capacity.tok_per_sec / basis.ready, 1),
        "ttft_p95_ms": _tenth(capacity.ttft_p95_ms),
        "tpot_p95_ms": _tenth(capacity.tpot_p95_ms),
    }


def _tenth(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# The load (I/O: the network and the clock)


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


async def run_level(plan: Plan, concurrency: int, progress: Progress) -> LevelSample:
    """``concurrency`` workers sending requests back to back for ``plan.seconds``.

    Requests in flight at the end are waited for and counted; the level's wall
    time runs until the last of them finishes.
    """
    results: list[RequestResult] = []
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

        tick = asyncio.create_task(ticker()) if progress.live else None
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(concurrency):
                    group.create_task(worker())
        finally:
            if tick is not None:
                tick.cancel()
        wall = time.perf_counter() - start
    return LevelSample(concurrency=concurrency, wall_s=wall, results=tuple(results))


async def run_ramp(plan: Plan, slo: Slo, progress: Progress, samples: list[LevelSample]) -> None:
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
            sample = await run_level(plan, concurrency, progress)
            samples.append(sample)
            level = summarize(sample, slo)
            progress.level_done(level)
            if not goes_on(level):
                break
    finally:
        progress.close()


# The command


def level_doc(level: LevelSummary, wall_s: float) -> dict[str, Any]:
    return {
        "concurrency": level.concurrency,
        "requests": level.requests,
        "errors": level.errors,
        "ttft_p95_ms": _hundredth(level.ttft_p95_ms),
        "tpot_p95_ms": _hundredth(level.tpot_p95_ms),
        "tok_per_sec": round(level.tok_per_sec, 2),
        "wall_s": round(wall_s, 3),
        "meets_slo": level.meets_slo,
        "misses": miss_text(level),
    }


def _hundredth(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def bench_doc(
    j: Judgement,
    samples: Sequence[LevelSample],
    *,
    model: str,
    plan: Plan,
    interrupted: bool,
    save: dict[str, Any] | None,
) -> dict[str, Any]:
    """What ``--json`` prints, and what the table is drawn from."""
    tried = plan.levels[len(j.levels) - 1] if j.levels else None
    c = j.capacity
    return {
        "model": model,
        "slo": {"ttft_p95_ms": j.slo.ttft_p95_ms, "tpot_p95_ms": j.slo.tpot_p95_ms},
        "seconds": plan.seconds,
        "max_tokens": plan.max_tokens,
        "levels": [
            level_doc(level, sample.wall_s) for level, sample in zip(j.levels, samples, strict=True)
        ],
        "capacity": None
        if c is None
        else {
            "max_concurrency": c.concurrency,
            "tok_per_sec": round(c.tok_per_sec, 2),
            "ttft_p95_ms": _hundredth(c.ttft_p95_ms),
            "tpot_p95_ms": _hundredth(c.tpot_p95_ms),
        },
        "verdict": verdict(j, model=model, last_tried=tried, interrupted=interrupted),
        "interrupted": interrupted,
        "save": save,
    }


BENCH_HEADERS = [
    "CONCURRENCY",
    "REQUESTS",
    "ERRORS",
    "TTFT_P95",
    "TPOT_P95",
    "TOK/S",
    "MEETS_SLO",
]


def render_bench(doc: Mapping[str, Any]) -> str:
    """The table of levels, then the capacity sentence and what would be stored."""
    rows = [
        [
            level["concurrency"],
            level["requests"],
            level["errors"],
            ms_text(level["ttft_p95_ms"]),
            ms_text(level["tpot_p95_ms"]),
            number(level["tok_per_sec"]),
            level["meets_slo"],
        ]
        for level in doc["levels"]
    ]
    blocks = [render(BENCH_HEADERS, rows)] if rows else []
    blocks.append("\n".join(doc["verdict"]))
    return "\n\n".join(blocks)


def saved_sentence(model: str, save: Mapping[str, Any], replicas: int) -> str:
    line = f"saved for {model} on profile {save['profile']}"
    line += ", per replica" if replicas > 1 else ""
    line += f": {at_once(save['max_concurrency'])}, {save['tok_per_sec']:.0f} tok/s"
    if replicas > 1:
        line += (
            f" ({replicas} ready replicas shared the load; the figures are divided by {replicas})"
        )
    return line


def gateway_url(args: argparse.Namespace, server: str) -> str:
    """The chat completions URL under ``--gateway`` (default ``<server>/v1``)."""
    base = (args.gateway or f"{server}/v1").rstrip("/")
    if "://" not in base:
        base = f"http://{base}"
    return f"{base}/chat/completions"


def cmd_bench(api: Api, args: argparse.Namespace, out: Output) -> None:
    key = (args.key or os.environ.get(KEY_ENV) or "").strip()
    if not key:
        raise CtlError(
            f"no gateway API key: set {KEY_ENV} or pass --key "
            "(one made with `llmgw ctl key create`)",
            2,
        )
    levels = args.levels or ladder(args.max_concurrency)
    view = api.get(f"/models/{segment(args.model)}")
    model = str(view.get("name") or args.model) if isinstance(view, Mapping) else args.model
    slo = Slo.from_view(view)
    basis = None
    if args.save and not slo.is_set:
        raise CtlError(
            f"--save stores the capacity within an SLO, and {model} has none "
            "(slo.ttft_p95_ms or slo.tpot_p95_ms); run without --save to measure it anyway",
            2,
        )
    if args.save:
        replicas = api.get("/replicas", model=model)
        basis = replica_basis(replicas, model=model, profile=args.profile)

    plan = Plan(
        model=model,
        url=gateway_url(args, api.server),
        key=key,
        levels=tuple(levels),
        seconds=args.seconds,
        max_tokens=args.max_tokens,
        request_timeout_s=args.request_timeout,
    )
    progress = Progress(sys.stderr, seconds=plan.seconds)
    progress.say(
        f"bench {model} through {plan.url}: {at_once_list(plan.levels)}, "
        f"{number(plan.seconds)} s each"
        + ("" if slo.is_set else "; it has no SLO, so no capacity will be judged")
    )
    samples: list[LevelSample] = []
    interrupted = False
    try:
        asyncio.run(run_ramp(plan, slo, progress, samples))
    except KeyboardInterrupt:
        interrupted = True

    j = judge(samples, slo)
    save = None
    if args.save and j.capacity is not None and basis is not None and not interrupted:
        save = per_replica(j.capacity, basis) | {"replicas": basis.ready}
    doc = bench_doc(j, samples, model=model, plan=plan, interrupted=interrupted, save=save)
    out.show(doc, render_bench)

    if interrupted:
        raise CtlError(
            "stopped by Ctrl-C; the levels that finished are shown"
            + ("; nothing saved" if args.save else ""),
            INTERRUPTED,
        )
    if not args.save:
        return
    if save is None:
        raise CtlError("not saved: no level met the SLO, so there is no capacity to store")
    body = {k: v for k, v in save.items() if k != "replicas"}
    api.put(f"/models/{segment(model)}/capacity", body)
    out.say(saved_sentence(model, save, save["replicas"]))


def at_once_list(levels: Sequence[int]) -> str:
    """``1, 2, 4, 8 at once``; a long ladder as ``1, 2, 4 … 64 at once``."""
    shown = list(map(str, levels))
    if len(shown) > 5:
        shown = [*shown[:3], f"… {shown[-1]}"]
    return f"{', '.join(shown).replace(', …', ' …')} at once"


# The command line


def concurrency(text: str) -> int:
    """argparse type: requests at once, 1 to MOST_CONCURRENCY."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MOST_CONCURRENCY:
        raise argparse.ArgumentTypeError(f"{text!r} is not between 1 and {MOST_CONCURRENCY}")
    return value


def level_list(text: str) -> tuple[int, ...]:
    """argparse type: ``1,2,4``: levels of concurrency, run in rising order."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give levels as whole numbers: 1,2,4")
    return tuple(sorted({concurrency(p) for p in parts}))


def tokens(text: str) -> int:
    """argparse type: output tokens a request asks for, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


BENCH_HELP = """\
At each level of concurrency (1, 2, 4, … up to --max-concurrency) that many
workers send streaming chat completions through the gateway back to back for
--seconds. A level meets the model's SLO when no request failed and the 95th
percentiles of time to first token (TTFT) and time per output token (TPOT)
are within it. The ramp stops after the first level that misses; the capacity
is the last level that met it.

--save stores the capacity per replica (divided by the model's ready
replicas), where the reconciler scales the model by it."""


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``bench`` to the commands."""
    bench = add(
        commands,
        "bench",
        "measure how many requests at once a model serves within its SLO",
        cmd_bench,
    )
    bench.epilog = BENCH_HELP
    bench.formatter_class = argparse.RawDescriptionHelpFormatter
    bench.add_argument("model", metavar="MODEL")
    bench.add_argument("--save", action="store_true", help="store the capacity found, per replica")
    bench.add_argument(
        "--profile", help="the profile to store it for, when the replicas run several"
    )
    bench.add_argument(
        "--key", help=f"a gateway API key, sent as the gateway's Bearer (env {KEY_ENV})"
    )
    bench.add_argument(
        "--gateway", metavar="URL", help="the OpenAI-compatible base URL (default <server>/v1)"
    )
    bench.add_argument(
        "--max-concurrency",
        type=concurrency,
        default=DEFAULT_MAX_CONCURRENCY,
        metavar="N",
        help=f"the last level of 1, 2, 4, … (default {DEFAULT_MAX_CONCURRENCY})",
    )
    bench.add_argument(
        "--levels",
        type=level_list,
        metavar="N,N,…",
        help="the levels to run instead, e.g. 1,2,4",
    )
    bench.add_argument(
        "--seconds",
        type=positive_number,
        default=DEFAULT_SECONDS,
        help=f"how long each level runs (default {number(DEFAULT_SECONDS)})",
    )
    bench.add_argument(
        "--max-tokens",
        type=tokens,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help=f"output tokens each request asks for (default {DEFAULT_MAX_TOKENS})",
    )
    bench.add_argument(
        "--request-timeout",
        type=positive_number,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        metavar="S",
        help="a request taking longer counts as failed "
        f"(default {number(DEFAULT_REQUEST_TIMEOUT_S)})",
    )


__all__ = [
    "Judgement",
    "LevelSample",
    "LevelSummary",
    "RequestResult",
    "Slo",
    "judge",
    "percentile",
    "register",
    "summarize",
]
