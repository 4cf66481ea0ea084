"""What the gateway knows, in memory: in the process (`State`: the tables, the counters,
the upstream pool, requests in flight per replica) and of one request as it goes through
(`Request`); and what a request asks of the process: its key looked up, a replica picked,
an on-demand model asked for, a replica reported unreachable. `app.Runtime` adds the
process's life: its start, the background loop, drain and close."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async

from llmgw.gateway.answers import bad_key, no_key, unknown_model
from llmgw.gateway.bands import PRESENT_S, slots_learnt
from llmgw.gateway.client import Pool
from llmgw.gateway.journal import Journal
from llmgw.gateway.limits import Held, Limiter, LocalCounters, RedisCounters
from llmgw.gateway.prefixes import Prefix, choose, order, prefix_for
from llmgw.gateway.scoring import replica_load
from llmgw.gateway.tables import Key, Tables, Upstream
from llmgw.gateway.usage import UsageBook

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from fleet.domain.readings import Reading

log = logging.getLogger("llmgw.gateway")

MAX_SECRET_CHARS = 256


def in_a_thread(fn):
    """`fn` to await, run off the loop in a worker thread, with Django's stale connections
    closed around it as Channels does for consumers."""
    return database_sync_to_async(fn, thread_sensitive=False)


@dataclass
class Request:
    """What is known of one request as it goes through."""

    key: Key
    endpoint: str
    path: str
    body: dict
    raw: bytes
    stream: bool
    wants_usage: bool
    started: float
    model: str = ""  # the catalog name it was served as
    tried: set[str] = field(default_factory=set)
    usage: dict | None = None  # the engine's figures, once they have passed
    done: bool = False  # the answer has reached its end (a stream, its [DONE])
    # Once its answer is known: "" for one that passed whole and good, else why it failed
    # (upstream_status, stream_cut). None before: accounting.account reads it.
    verdict: str | None = None
    events: int = 0  # server-sent events passed on: tokens, about, when no usage came
    estimate: int = 0  # its prompt's tokens, about, before an engine counts them
    reserved: int = 0  # the tokens it may use (prompt estimate and completion asked for)
    abandoned: bool = False  # cut while an engine worked on it (caller gone, server stopping)
    body_changed: bool = False  # the gateway added to it (a cap on max_tokens): sent re-encoded
    # The model its answer names where the engine names another (an adapter on llama-server
    # answers with its base's name: adapters._lora_named); None: as the engine says.
    answer_model: str | None = None
    held: Held = field(default_factory=list)  # what it holds of each token limit meanwhile
    admitted: float = 0.0  # when (time.time()) it was let in, and its reservation counted
    rid: int = 0  # its id in the process's usage book and journal, once let in
    request_id: str = ""  # its id told to the caller (x-request-id, answers.request_id)
    replica: str = ""  # the replica answering it, told to the caller (X-Llmgw-Replica)
    warning: str = ""  # a budget's spent past its warning share (X-Llmgw-Budget-Warning)
    # A body in another API (dialect_serve.Dialect.native_body): the path and body to send
    # an engine that serves that API itself, or None to send it the chat request.
    native: Callable[[Upstream, dict], tuple[str, bytes] | None] | None = None
    _prefix: Prefix | None | bool = False

    @property
    def prefix(self) -> Prefix | None:
        """What names its prompt's prefix (`prefixes.prefix_for`), worked out once; None
        for a request with no prompt to cache."""
        if self._prefix is False:
            self._prefix = prefix_for(self.endpoint, self.body)
        return self._prefix

    def replica_header(self) -> list[tuple[bytes, bytes]]:
        """The gateway's own headers on an engine's answer: the replica, and a budget's
        warning (in ASCII, as headers are: a key's `…` written `...`)."""
        out = [(b"x-llmgw-replica", self.replica.encode())] if self.replica else []
        if self.warning:
            said = self.warning.replace("…", "...").encode("ascii", "replace")
            out.append((b"x-llmgw-budget-warning", said))
        return out


@dataclass(frozen=True, slots=True)
class Picked:
    """A replica chosen for a request, and how: `prefix` (the first in the order of its
    prompt's prefix, named by `depth` of the prompt's `blocks` leading blocks),
    `imbalance` (the `place`th in that order: those before it were too loaded),
    `least_loaded`, `round_robin`, or `suspect` (only replicas recently refusing were
    left)."""

    up: Upstream
    how: str
    depth: int = 0
    blocks: int = 0
    inflight: int = 0  # requests it had in flight before this one
    reading: Reading | None = None  # what its engine last said, when it said anything
    place: int = 0


def _secret(headers: list[tuple[bytes, bytes]]) -> str:
    """The caller's secret: `Authorization: Bearer` (OpenAI's clients), else `x-api-key`
    (Anthropic's); no_key for neither."""
    auth = api_key = None
    for name, value in headers:
        if name == b"authorization" and auth is None:
            auth = value
        elif name == b"x-api-key" and api_key is None:
            api_key = value
    if not auth and api_key and api_key.strip():
        return api_key.decode("latin-1").strip()
    if not auth:
        raise no_key()
    scheme, _, secret = auth.decode("latin-1").partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise no_key()
    return secret


class State:
    """What the request path reads and asks of the process: tables, counters, the upstream
    pool, in-flight counts and suspect replicas."""

    def __init__(self, journal: Journal | None = None) -> None:
        from django.conf import settings

        self.secret = settings.SECRET_KEY
        self.cfg = settings.LLMGW
        self.tables = Tables()
        self.changed = asyncio.Event()  # set, and replaced, whenever the tables change
        counters = RedisCounters(self.cfg.redis_url) if self.cfg.redis_url else LocalCounters()
        self.limiter = Limiter(counters)
        self.usage = UsageBook(journal)
        self.inflight: dict[str, int] = {}
        # What each ready replica's engine last said (`scoring`), read every few seconds.
        self.readings: dict[str, Reading] = {}
        self.inflight_read: dict[str, int] = {}  # our in-flight counts when they were read
        self.slots: dict[str, int] = {}  # replica -> its engine's slots, as seen (bands.py)
        self.suspect: dict[str, float] = {}
        self.turn = 0
        self.asked: dict[str, float] = {}  # on-demand model -> when the reconciler was last told
        self.session: Pool | None = None  # the connections to the engines (client.py)
        self._digests: dict[str, str] = {}
        self._models_json: dict[object, bytes] = {}
        self._tasks: set[asyncio.Task] = set()
        self.stopping = False  # this server is stopping (`Runtime.drain`): no new requests
        # model -> band -> when (time.monotonic()) a request of it was last let in (bands.py)
        self.bands: dict[str, dict[str, float]] = {}

    def band_seen(self, model: str, band: str) -> None:
        self.bands.setdefault(model, {})[band] = time.monotonic()

    def bands_present(self, model: str) -> dict[str, float]:
        """The bands let in for `model` within the last PRESENT_S seconds."""
        seen = self.bands.get(model)
        if not seen:
            return {}
        since = time.monotonic() - PRESENT_S
        return {b: t for b, t in seen.items() if t >= since}

    def authenticate(self, headers: list[tuple[bytes, bytes]]) -> Key:
        """The key of the `Authorization: Bearer` header; Refused (401) for none, or for one
        that is not a key these tables hold."""
        key = self._key(headers)
        if key is None:
            raise bad_key()
        return key

    async def key_of(self, headers: list[tuple[bytes, bytes]]) -> Key:
        """As `authenticate`, but a secret these tables do not hold is looked for again
        after a refresh (`refreshed`): a key made a moment ago through another server or
        worker is accepted at once, not a refresh later."""
        key = self._key(headers)
        if key is None:
            await self.refreshed()
            key = self._key(headers)
            if key is None:
                raise bad_key()
        return key

    async def refreshed(self) -> None:
        """Read the tables again now (the runtime does; these tables are given)."""

    def _key(self, headers: list[tuple[bytes, bytes]]) -> Key | None:
        """The header's key; None for a secret the tables do not hold; Refused for no key."""
        secret = _secret(headers)
        if len(secret) > MAX_SECRET_CHARS:
            raise bad_key()
        digest = self._digests.get(secret)
        if digest is None:
            from llmgw.core.secrets import keyed_digest

            digest = keyed_digest(self.secret, secret)
            key = self.tables.keys.get(digest)
            if key is None:
                return None  # not remembered: callers must not fill the cache
            if len(self._digests) > 10_000:
                self._digests.clear()
            self._digests[secret] = digest
            return key
        return self.tables.keys.get(digest)

    def pick(self, model: str, tried: set[str], req: Request | None = None) -> Picked | None:
        """A ready replica of `model` for `req`, by its profiles' routing: the first in the
        order of its prompt's prefix whose load is within the bound (`prefixes.choose`: the
        same in every gateway process, nothing remembered), the least loaded (by what this
        gateway has in flight and what the engines say they run and queue:
        `scoring.replica_load`), or the next in turn. Replicas tried already, or recently
        refusing connections, only when nothing else is left."""
        ups = self.tables.upstreams.get(model)
        if not ups:
            return None
        now = time.monotonic()
        n = len(ups)
        self.turn += 1
        start = self.turn % n  # ties go round, so one request at a time spreads too
        rotated = [ups[(start + i) % n] for i in range(n)]
        candidates = [u for u in rotated if u.replica_id not in tried]
        fresh = [u for u in candidates if self.suspect.get(u.replica_id, 0) <= now]
        if not fresh:
            return Picked(candidates[0], "suspect") if candidates else None
        inflight, readings, then = self.inflight, self.readings, self.inflight_read
        full = self.cfg.routing.kv_full
        loads = [
            replica_load(
                inflight.get(u.replica_id, 0),
                u.weight,
                readings.get(u.replica_id),
                then.get(u.replica_id, 0),
                full,
            )
            for u in fresh
        ]
        routings = {u.routing for u in fresh}
        if routings == {"round_robin"}:
            return Picked(fresh[0], "round_robin", inflight=inflight.get(fresh[0].replica_id, 0))
        prefix = req.prefix if req is not None and "prefix" in routings else None
        ordered: list[int] = []
        if prefix is not None:
            routed = [i for i, u in enumerate(fresh) if u.routing == "prefix"]
            ranked = order(prefix.key, [(fresh[i].replica_id, fresh[i].weight) for i in routed])
            ordered = [routed[i] for i in ranked]
        choice = choose(loads, ordered, self.cfg.routing.imbalance)
        up = fresh[choice.index]
        held = inflight.get(up.replica_id, 0)
        return Picked(
            up,
            choice.how,
            prefix.blocks if prefix else 0,
            prefix.of if prefix else 0,
            held,
            readings.get(up.replica_id),
            choice.place,
        )

    def readings_read(self, readings: dict[str, Reading]) -> None:
        """The engines' readings, just read: kept with this gateway's in-flight counts now,
        which the engines' counts include (`scoring.replica_load` takes them out again)."""
        self.readings = readings
        self.inflight_read = {r: self.inflight.get(r, 0) for r in readings}
        self.slots = slots_learnt(self.slots, readings)

    def chain(self, model: str) -> list[str]:
        """The model, then its fallbacks in order, then theirs: each once."""
        out, queue = [], [model]
        while queue:
            name = queue.pop(0)
            spec = self.tables.resolve(name)
            if spec is None or spec.name in out:
                continue
            out.append(spec.name)
            queue.extend(spec.fallbacks)
        return out

    async def start_model(self, model: str) -> None:
        """Tell the reconciler an on-demand model is wanted, at most every few seconds."""
        now = time.monotonic()
        if now - self.asked.get(model, 0) < 5:
            return
        self.asked[model] = now
        try:
            await in_a_thread(_model_requested)(model)
        except Exception:  # noqa: BLE001
            log.warning("could not ask for %s to be started", model, exc_info=True)

    def report_unreachable(self, replica_id: str, why: str) -> None:
        """Tell every gateway and the reconciler at once that a replica could not be reached
        (fleet/services.py `replica_unhealthy_mark`), without waiting for it."""

        async def report() -> None:
            try:
                await in_a_thread(_replica_unreachable)(replica_id, why)
            except Exception:  # noqa: BLE001 - the database being away: suspect it here only
                log.warning("could not mark replica %s unhealthy", replica_id, exc_info=True)

        task = asyncio.get_running_loop().create_task(report())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def beside(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task:
        """Run `work` beside the requests, cancelled when the runtime closes."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def start_soon(self, model: str) -> None:
        """`start_model` without waiting for it."""
        if time.monotonic() - self.asked.get(model, 0) >= 5:
            task = asyncio.get_running_loop().create_task(self.start_model(model))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def models_json(self, key: Key) -> bytes:
        """The `/v1/models` answer for `key`: the models it may use, kept until keys change."""
        cached = self._models_json.get((key.models, key.adapters))
        if cached is None:
            tables = self.tables
            names = sorted(n for n in tables.models if tables.allows(key, n))
            specs = (tables.models.get(n) for n in names)
            data = [_model_entry(spec, tables) for spec in specs if spec is not None]
            cached = json.dumps({"object": "list", "data": data}).encode()
            self._models_json[(key.models, key.adapters)] = cached
        return cached

    def model_json(self, key: Key, name: str) -> bytes:
        """The `/v1/models/{name}` answer for `key`: the model `name` names (by its name or
        an alias); Refused (404) for one that does not exist or the key may not use."""
        spec = self.tables.resolve(name)
        if spec is None or not self.tables.allows(key, spec.name):
            raise unknown_model(name)
        return json.dumps(_model_entry(spec, self.tables)).encode()


def _model_entry(spec, tables) -> dict:
    """A model as OpenAI's schema has it (`created`: when it joined the catalog), with its
    aliases beside; an adapter with its base as `parent`, as vLLM lists its adapters."""
    entry = {
        "id": spec.name,
        "object": "model",
        "created": tables.created.get(spec.name, 0),
        "owned_by": "llmgw",
    }
    if spec.aliases:
        entry["aliases"] = list(spec.aliases)
    adapter = tables.adapters.get(spec.name)
    if adapter is not None:
        entry["parent"] = adapter.base
    return entry


def _replica_unreachable(replica_id: str, why: str) -> None:
    from fleet.reconciler.wake import wake
    from fleet.services import replica_unhealthy_mark
    from llmgw.core import clock

    if replica_unhealthy_mark(
        replica_id=replica_id, reason=f"the gateway could not reach it: {why}", now=clock.now()
    ):
        wake()


def _model_requested(model: str) -> None:
    from fleet.reconciler.wake import wake
    from fleet.services import model_requested
    from llmgw.core import clock

    model_requested(name=model, now=clock.now())
    wake()
