"""`llmgw sim-engine`: an OpenAI-compatible server that answers with made-up tokens.

It stands in for llama-server or vLLM on machines with no GPU and no weights:
demos, tests and benchmarks. Each request waits for one of `slots` in FIFO
order, waits `ttft_ms` (plus, with `prefill_tokens_per_sec`, the prefill of
the prompt's words its prefix cache lacks), then produces a token every
`1 / tokens_per_sec` seconds. The words come from a small vocabulary seeded
by the prompt, so the same prompt always gets the same answer.

With `--power-file PATH` it runs as a GPU held to a power limit would: the file holds the
share of its default limit the GPU is held to (0.8: 80 %; what the agent writes for a
simulated GPU it is told to `power_cap`), and its tokens come at `share ** --power-exponent`
of the speed (0.6 by default), its first token as much later. A model, not a measurement:
docs/benchmarks.md says what it assumes.

With `--max-loras N` it holds up to N LoRA adapters, as vLLM does: given at start
(`--lora NAME=PATH`) or loaded and unloaded at run time (`POST /v1/load_lora_adapter`,
`/v1/unload_lora_adapter`), listed in `/v1/models` with their `parent`; a request that
names one is answered with words seeded by the adapter's name too, so each adapter
answers differently from the base and from the others (docs/adapters.md).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import functools
import hashlib
import hmac
import itertools
import json
import math
import os
import random
import signal
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from llmgw.simcache import PrefixCache, first_token_seconds

API_KEY_ENV = "LLMGW_ENGINE_API_KEY"
MAX_BODY_BYTES = 1024 * 1024
_WORDS = "the a of and to in is it that was for on are with as be at by this from or have an they"
VOCABULARY = tuple(_WORDS.split())


@dataclass(frozen=True)
class SimConfig:
    """What one sim engine serves and how fast."""

    model: str = "sim"
    ttft_ms: float = 50.0
    tokens_per_sec: float = 50.0
    slots: int = 4
    max_tokens: int = 16
    threads: int = 0
    embedding_dim: int = 16
    api_key: str | None = None
    prefill_tokens_per_sec: float = 0.0  # 0: prefill is free, as before the cache was modelled
    prefix_cache_tokens: int = 32768  # 0 turns the cache off
    prefix_block_tokens: int = 16  # vLLM's block size
    kv_cache_tokens: int = 0  # tokens the KV cache holds; 0: its use is the share of slots taken
    weights: str | None = None  # the file or folder it was given as its model, as vLLM's root
    max_loras: int = 0  # LoRA adapters held at once (vLLM's --max-loras); 0: none
    loras: tuple[tuple[str, str], ...] = ()  # (name, path) held from the start
    power_file: str | None = None  # the share of its default power limit its GPU is held to
    power_exponent: float = 0.6  # speed = share ** power_exponent


def power_speed(share: float, exponent: float) -> float:
    """The share of full speed a GPU held to `share` of its default power limit runs at.
    The model: speed follows power sub-linearly (a GPU's clocks fall less than its power
    does, as voltage falls with them); exponent 0 is speed that power does not change."""
    return min(max(share, 0.1), 1.0) ** exponent


class PowerFile:
    """The share of its default power limit the engine's GPU is held to, read from a file
    at most once a second; a file absent, empty or not a number is the default, 1."""

    EVERY_S = 1.0

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._share = 1.0
        self._read_at: float | None = None

    def share(self, now: float) -> float:
        """The share now; `now` is monotonic seconds."""
        if self.path is None:
            return 1.0
        if self._read_at is None or now - self._read_at >= self.EVERY_S:
            self._read_at = now
            try:
                with open(self.path, encoding="utf-8") as f:
                    value = float(f.read().strip() or "1")
            except (OSError, ValueError):
                value = 1.0
            self._share = min(max(value, 0.1), 1.0) if math.isfinite(value) else 1.0
        return self._share


class BadRequest(Exception):
    """A request the OpenAI API would refuse with 400."""


class ModelNotFound(Exception):
    """A request for a model or adapter the engine does not hold: vLLM's 404."""


class Slots:
    """`size` places handed out first come, first served.

    The queue is kept by hand rather than with asyncio.Semaphore, whose
    fairness changed within 3.11 and which does not say how many wait.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Wait for a slot, hold it for the block, and always give it back."""
        if self.running < self.size and not self._waiters:
            self.running += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # handed the slot, then cancelled: pass it on
                elif waiter in self._waiters:  # a release may have dropped it already
                    self._waiters.remove(waiter)
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        # The slot goes straight to the next waiter, so `running` stays put
        # and nobody arriving in between can take it.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1


class Engine:
    """The state the handlers share: config, slots, the prefix cache and counters."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.slots = Slots(config.slots)
        self.cache = PrefixCache(config.prefix_cache_tokens, config.prefix_block_tokens)
        self.requests_total = 0
        self.prompt_tokens_total = 0
        self.prompt_tokens_cached_total = 0
        self.prefix_cache_hits_total = 0
        self.kv_tokens = 0  # prompt and answer tokens of the requests holding a slot
        self.created = int(time.time())
        # The adapters held, by name, with the path each came from, in the order loaded.
        self.adapters: dict[str, str] = dict(config.loras)
        self.power = PowerFile(config.power_file)

    def speed(self) -> float:
        """The share of full speed it runs at now, as its GPU's power limit allows."""
        share = self.power.share(time.monotonic())
        return power_speed(share, self.config.power_exponent)

    def seed(self, model: object) -> str:
        """What the answer's words are seeded by besides the prompt: the adapter's name when
        the request names a held one (the base's words otherwise). BadRequest naming a model
        it does not serve, once it serves adapters (vLLM answers 404)."""
        if not self.config.max_loras or model in (None, self.config.model):
            return ""
        if isinstance(model, str) and model in self.adapters:
            return f"lora:{model}\n"
        raise ModelNotFound(f"The model `{model}` does not exist.")

    def prefill(self, tokens: list[str], prompt_tokens: int) -> int:
        """Look the prompt up in the prefix cache and count it; returns the cached tokens.

        The last prompt token is always computed, as vLLM and llama-server do
        (its logits give the first answer token), so an exact repeat is cached
        up to the last whole block before it.
        """
        cached = self.cache.lookup(tokens[:-1])
        self.prompt_tokens_total += prompt_tokens
        self.prompt_tokens_cached_total += cached
        if cached:
            self.prefix_cache_hits_total += 1
        return cached

    @property
    def kv_cache_usage(self) -> float:
        """The share of the KV cache in use: the running requests' tokens over its size, or,
        with no size given, the share of slots taken."""
        size = self.config.kv_cache_tokens
        if size:
            return min(self.kv_tokens / size, 1.0)
        return self.slots.running / self.slots.size


ENGINE = web.AppKey("engine", Engine)


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    """An error in the OpenAI shape, which clients turn into typed exceptions."""
    error = {"message": message, "type": kind, "param": None, "code": None}
    return web.json_response({"error": error}, status=status)


def count_words(text: str) -> int:
    """The sim's token count: whitespace-separated words, at least 1."""
    return max(len(text.split()), 1)


def _rng(text: str) -> random.Random:
    # surrogatepass: JSON may carry lone surrogates, which must not become a 500.
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def generate_words(prompt: str) -> Iterator[str]:
    """Endless words from the vocabulary, the same ones for the same prompt.

    Lazy, so a huge `max_tokens` costs time, not memory, when streamed.
    """
    rng = _rng(prompt)
    while True:
        yield rng.choice(VOCABULARY)


def embed(text: str, dim: int) -> list[float]:
    """A unit-length vector of `dim` floats that depends only on `text`."""
    rng = _rng(text)
    vector = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def chat_prompt(body: dict[str, Any]) -> str:
    """The text of all messages; BadRequest when `messages` is not usable."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    texts = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("each message must be an object with a 'role'")
        content = message.get("content")
        if isinstance(content, list):  # multimodal parts: only the text counts
            content = " ".join(p["text"] for p in content if isinstance(p.get("text"), str))
        if content is not None and not isinstance(content, str):
            raise BadRequest("message content must be a string, a list of parts or null")
        texts.append(content or "")
    return "\n".join(texts)


def completion_prompt(body: dict[str, Any]) -> tuple[str, int]:
    """The prompt text and its token count; token ids count one each."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, count_words(prompt)
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return " ".join(map(str, prompt)), len(prompt)
    raise BadRequest("'prompt' must be a string, one string in a list, or a list of token ids")


def requested_tokens(body: dict[str, Any], keys: tuple[str, ...], default: int) -> tuple[int, bool]:
    """How many tokens to produce, and whether the client set that limit."""
    for key in keys:
        value = body.get(key)
        if value is not None:
            if not _is_int(value) or value < 0:
                raise BadRequest(f"'{key}' must be a non-negative integer")
            return value, True
    return default, False


async def read_body(request: web.Request) -> dict[str, Any]:
    """The JSON object in the body; BadRequest when it is not one."""
    raw = await request.read()  # past client_max_size this raises 413, shaped by guard()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


@web.middleware
async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """The key check on /v1/*, and 400 and 413 errors in the OpenAI shape."""
    key = request.app[ENGINE].config.api_key
    if key and request.path.startswith("/v1/"):
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, f"Bearer {key}".encode()):
            return error_response(401, "invalid or missing API key", "authentication_error")
    try:
        return await handler(request)
    except BadRequest as exc:
        return error_response(400, str(exc))
    except ModelNotFound as exc:
        return error_response(404, str(exc), "NotFoundError")
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"the body is over {MAX_BODY_BYTES} bytes")


async def health(request: web.Request) -> web.Response:
    """GET /health: liveness and load, polled by the agent."""
    engine = request.app[ENGINE]
    slots, config = engine.slots, engine.config
    return web.json_response(
        {
            "status": "ok",
            "model": config.model,
            "running": slots.running,
            "waiting": slots.waiting,
            "slots": slots.size,
            "threads": config.threads,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text: vLLM's series under vLLM's names (the load gauges and
    the prefix cache's counters, in tokens), and the sim's own under `llmgw_sim:`."""
    engine = request.app[ENGINE]
    slots = engine.slots
    model = engine.config.model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    vllm = [
        ("num_requests_running", "gauge", "Requests holding a slot.", slots.running),
        ("num_requests_waiting", "gauge", "Requests queued for a slot.", slots.waiting),
        ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         engine.kv_cache_usage),
        ("prefix_cache_queries_total", "counter", "Prefix cache queries, in prompt tokens.",
         engine.prompt_tokens_total),
        ("prefix_cache_hits_total", "counter", "Prefix cache hits, in cached prompt tokens.",
         engine.prompt_tokens_cached_total),
    ]  # fmt: skip
    lines = []
    for name, kind, help_text, value in vllm:
        lines.append(f"# HELP vllm:{name} {help_text}\n# TYPE vllm:{name} {kind}\n")
        lines.append(f'vllm:{name}{{model_name="{model}"}} {value}\n')
    series = [
        ("requests_total", "counter", "Inference requests accepted.", engine.requests_total),
        (
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of chat and completion requests prefilled.",
            engine.prompt_tokens_total,
        ),
        (
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            engine.prompt_tokens_cached_total,
        ),
        (
            "prefix_cache_hits_total",
            "counter",
            "Requests with at least one cached prefix block.",
            engine.prefix_cache_hits_total,
        ),
        (
            "prefix_cache_tokens",
            "gauge",
            "Tokens the prefix cache holds.",
            engine.cache.held_tokens,
        ),
    ]
    for name, kind, help_text, value in series:
        lines.append(f"# HELP llmgw_sim:{name} {help_text}\n# TYPE llmgw_sim:{name} {kind}\n")
        lines.append(f'llmgw_sim:{name}{{model_name="{model}"}} {value}\n')
    content_type = {"Content-Type": "text/plain; version=0.0.4"}
    return web.Response(body="".join(lines).encode(), headers=content_type)


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the one model this engine serves."""
    engine = request.app[ENGINE]
    model = {"id": engine.config.model, "object": "model", "created": engine.created}
    if engine.config.weights:
        model["root"] = engine.config.weights  # what vLLM says here: the path it loaded
    data = [model | {"owned_by": "llmgw-sim"}]
    # As vLLM lists its LoRA adapters: each with the path it came from and its base.
    data += [
        {"id": name, "object": "model", "created": engine.created, "owned_by": "llmgw-sim"}
        | {"root": path, "parent": engine.config.model}
        for name, path in engine.adapters.items()
    ]
    return web.json_response({"object": "list", "data": data})


async def load_lora_adapter(request: web.Request) -> web.Response:
    """POST /v1/load_lora_adapter {"lora_name", "lora_path"}, as vLLM takes it: 400 when it
    serves no adapters, holds that one already or has no slot free; 404 for a path that
    is not there."""
    engine = request.app[ENGINE]
    body = await read_body(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise BadRequest("'lora_name' and 'lora_path' are required")
    if not engine.config.max_loras:
        raise BadRequest("LoRA is not enabled: start the engine with --max-loras")
    if name in engine.adapters:
        raise BadRequest(f"The lora adapter '{name}' has already been loaded.")
    if len(engine.adapters) >= engine.config.max_loras:
        raise BadRequest(
            f"No free LoRA slot: {len(engine.adapters)} of {engine.config.max_loras} held."
        )
    if path.startswith("/") and not os.path.exists(path):
        raise ModelNotFound(f"No adapter found at {path}.")
    engine.adapters[name] = path
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """POST /v1/unload_lora_adapter {"lora_name"}: 404 for one it does not hold."""
    engine = request.app[ENGINE]
    body = await read_body(request)
    name = body.get("lora_name")
    if name not in engine.adapters:
        raise ModelNotFound(f"The lora adapter '{name}' cannot be found.")
    del engine.adapters[name]
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


async def _sleep_until(deadline: float) -> None:
    # Sleeping to an absolute time keeps the rate even when the loop is busy;
    # summed relative sleeps would let every late wake-up push the rest back.
    await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))


async def complete(request: web.Request, *, chat: bool) -> web.StreamResponse:
    """POST /v1/chat/completions or /v1/completions: wait for a slot, then answer.

    The answer is streamed as server-sent events or sent whole at the time the
    last token would have been streamed. The prompt's words are looked up in
    the prefix cache once the slot is held, and the prompt and the answer are
    cached when the answer is done: vLLM and llama-server keep what they
    generated too, so a next turn that repeats the answer hits.
    """
    body = await read_body(request)
    engine = request.app[ENGINE]
    if chat:
        prompt = chat_prompt(body)
        prompt_tokens = count_words(prompt)
        keys: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
    else:
        prompt, prompt_tokens = completion_prompt(body)
        keys = ("max_tokens",)
    count, limited = requested_tokens(body, keys, engine.config.max_tokens)
    # An adapter's answer is its own: the words are seeded by its name too.
    seeded = engine.seed(body.get("model")) + prompt
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise BadRequest("only n=1 is supported")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    engine.requests_total += 1
    words = itertools.islice(generate_words(seeded), count)
    tokens = (w if i == 0 else " " + w for i, w in enumerate(words))
    # A limit the client chose was reached; under the default the "model" chose to stop.
    finish = "length" if limited else "stop"
    prompt_words = prompt.split()
    model = body.get("model")
    meta = {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model if isinstance(model, str) else engine.config.model,
    }

    def chunk(content: str | None, reason: str | None = None, **delta: Any) -> dict[str, Any]:
        if chat:
            if content is not None:
                delta["content"] = content
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": reason}
        return meta | {"choices": [choice]}

    def remember() -> None:
        # The cache reads only what it can hold, so even a huge answer costs little.
        answer_words = itertools.islice(generate_words(seeded), count)
        engine.cache.insert(itertools.chain(prompt_words, answer_words))

    async with engine.slots.hold(), _holding_kv(engine, prompt_tokens + count):
        start = asyncio.get_running_loop().time()
        speed = engine.speed()  # a request keeps the speed its slot was taken at
        step = 1.0 / (engine.config.tokens_per_sec * speed)
        cached = engine.prefill(prompt_words, prompt_tokens)
        first = (
            first_token_seconds(
                ttft_ms=engine.config.ttft_ms,
                uncached_tokens=prompt_tokens - cached,
                prefill_tokens_per_sec=engine.config.prefill_tokens_per_sec,
            )
            / speed
        )
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": count,
            "total_tokens": prompt_tokens + count,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if not stream:
            await _sleep_until(start + first + step * max(count - 1, 0))
            remember()
            text = "".join(tokens)
            if chat:
                message = {"role": "assistant", "content": text}
                choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
                answer = meta | {"object": "chat.completion", "choices": [choice]}
            else:
                answer = chunk(text, finish)
            return web.json_response(answer | {"usage": usage})

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        # With include_usage, OpenAI marks every chunk but the last "usage": null.
        extra = {"usage": None} if include_usage else {}

        async def send(event: dict[str, Any]) -> None:
            event = event if "usage" in event else event | extra
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())

        try:
            await _sleep_until(start + first)
            if chat:
                await send(chunk("", role="assistant"))
            for k, token in enumerate(tokens):
                await _sleep_until(start + first + k * step)
                await send(chunk(token))
            remember()
            await send(chunk(None if chat else "", finish))
            if include_usage:
                await send(meta | {"choices": [], "usage": usage})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client went away; leaving the block frees the slot
        return resp


@asynccontextmanager
async def _holding_kv(engine: Engine, tokens: int) -> AsyncIterator[None]:
    """A running request's prompt and answer held in the KV cache, as a paged engine
    reserves them, until it ends."""
    engine.kv_tokens += tokens
    try:
        yield
    finally:
        engine.kv_tokens -= tokens


async def embeddings(request: web.Request) -> web.Response:
    """POST /v1/embeddings: one deterministic unit vector per input."""
    body = await read_body(request)
    engine = request.app[ENGINE]
    inputs = body.get("input")
    inputs = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
        raise BadRequest("'input' must be a string or a non-empty list of strings")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be 'float' or 'base64'")
    engine.requests_total += 1
    data = []
    for index, text in enumerate(inputs):
        vector: Any = embed(text, engine.config.embedding_dim)
        if encoding == "base64":  # the openai client's default: little-endian float32
            vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = sum(count_words(text) for text in inputs)
    model = body.get("model") if isinstance(body.get("model"), str) else engine.config.model
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return web.json_response({"object": "list", "data": data, "model": model, "usage": usage})


def build_app(config: SimConfig) -> web.Application:
    """The aiohttp application for one engine."""
    app = web.Application(middlewares=[guard], client_max_size=MAX_BODY_BYTES)
    app[ENGINE] = Engine(config)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", functools.partial(complete, chat=True))
    app.router.add_post("/v1/completions", functools.partial(complete, chat=False))
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
    app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    return app


async def start_server(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, int]:
    """Serve on host:port (0: any free port); returns the runner and the bound port.

    `await runner.cleanup()` stops it, cutting requests still in flight.
    """
    # handler_cancellation: a client that hangs up while queued or while a
    # whole answer is "generating" gives its slot back at once.
    app = build_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, runner.addresses[0][1]


async def _serve(config: SimConfig, host: str, port: int) -> None:
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    runner, bound = await start_server(config, host, port)
    print(f"llmgw sim-engine: {config.model} on http://{host}:{bound}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _at_least(low: float, kind: type = int, strict: bool = False) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    """Run `llmgw sim-engine` until SIGTERM or SIGINT; returns the exit code, 0."""
    parser = argparse.ArgumentParser(prog="llmgw sim-engine", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=_at_least(0), required=True, help="0 picks a free port")
    add("--model", default="sim", help="the model name it serves")
    add("--ttft-ms", type=_at_least(0, float), default=50.0, help="time to first token")
    add("--tokens-per-sec", type=_at_least(0, float, strict=True), default=50.0, help="per request")
    add("--slots", type=_at_least(1), default=4, help="requests served at once; more wait, FIFO")
    add("--max-tokens", type=_at_least(0), default=16, help="when a request sets none")
    add("--threads", type=_at_least(0), default=0, help="reserved CPU cores (0: unknown)")
    add("--embedding-dim", type=_at_least(1), default=16)
    add(
        "--prefill-tokens-per-sec",
        type=_at_least(0, float),
        default=0.0,
        help="prefill rate of prompt tokens not in the prefix cache (0: prefill is free)",
    )
    add("--prefix-cache-tokens", type=_at_least(0), default=32768, help="0 turns the cache off")
    add("--prefix-block-tokens", type=_at_least(1), default=16, help="tokens per cached block")
    add(
        "--kv-cache-tokens",
        type=_at_least(0),
        default=0,
        help="tokens the KV cache holds, for its use (0: the share of slots taken)",
    )
    add(
        "--power-file",
        help="a file holding the share of its default power limit its GPU is held to",
    )
    add(
        "--power-exponent",
        type=_at_least(0, float),
        default=0.6,
        help="speed = the power file's share ** this (0: power does not change speed)",
    )
    add("--api-key", help=f"for manual use; the agent passes the key in ${API_KEY_ENV}")
    add("--weights", help="the file or folder of the model's weights; it must exist")
    add("--max-loras", type=_at_least(0), default=0, help="LoRA adapters held at once (0: none)")
    add(
        "--lora",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a LoRA adapter held from the start (repeat for several)",
    )
    args = vars(parser.parse_args(argv))
    loras = []
    for item in args.pop("lora"):
        name, _, path = item.partition("=")
        if not name or not path:
            parser.error(f"--lora takes NAME=PATH, not {item!r}")
        loras.append((name, path))
    if len(loras) > args["max_loras"]:
        parser.error(f"{len(loras)} --lora given, more than --max-loras {args['max_loras']}")
    args["loras"] = tuple(loras)
    if args["weights"] and not os.path.exists(args["weights"]):
        # As a real engine does: a model it cannot find is a failed start, said.
        print(f"llmgw sim-engine: no such file or folder: {args['weights']}", file=sys.stderr)
        return 1
    host, port = args.pop("host"), args.pop("port")
    args["api_key"] = args["api_key"] or os.environ.get(API_KEY_ENV) or None
    asyncio.run(_serve(SimConfig(**args), host, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
