"""LoRA adapters on the gateway's path (docs/adapters.md): a request for an adapter goes to a
ready replica of its base whose engine holds it; when none does, one replica (the least
loaded with a slot free, else the least loaded, unloading its least recently used adapter)
is asked to load it, and the request waits for it as for an on-demand model, with the same
503 and Retry-After when it cannot.

Which replicas hold which adapters is the engines' word (`Reading.adapters`, read every few
seconds); when each was last used is this gateway's (`USED`). Pure where it can be:
`load_choice` picks the replica and what it unloads, `spread_choice` one more replica for an
adapter queuing everywhere it is, and adapter_demand.py the replica one leaves when its
demand falls (`shrink`, every BUCKET_S), summed over every gateway process in the cache
(Redis in production) and judged again by the control plane before anything is unloaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from django.core.cache import cache

from catalog.domain import AdapterSpec
from fleet.domain.readings import Reading
from llmgw.gateway.adapter_demand import (
    BUCKET_S,
    WINDOW_S,
    Window,
    bucket_of,
    demand_peak,
    shared_buckets,
    shrink_choice,
)
from llmgw.gateway.answers import Refused, unplaceable
from llmgw.gateway.load import BOARD
from llmgw.gateway.scoring import replica_load
from llmgw.gateway.state import Request, State, in_a_thread
from llmgw.gateway.tables import Upstream
from mirror.domain.progress import fetched_said

log = logging.getLogger("llmgw.gateway")

ASK_EVERY_S = 10.0  # an adapter is asked for at most this often while it is on its way
POLL_S = 0.25  # how often a waiting request looks at the engines' readings
SAID_EVERY_S = 0.5  # how often it looks for the agent's word on the load (one query)
# The agent's word that a replica loaded an adapter is taken until the engines' readings,
# every few seconds, say the same; this long at most.
LOADED_FOR_S = 15.0
# (replica, adapter) -> when this gateway last sent it a request for the adapter.
USED: dict[tuple[str, str], float] = {}
# (replica, adapter) -> when its agent said it loaded it (adapter_status), by this clock.
LOADED: dict[tuple[str, str], float] = {}
# adapter -> (when asked, the replica asked)
_asked: dict[str, tuple[float, str]] = {}
# adapter -> (when found, how far the mirror got with its weights): not asked meanwhile.
_unmirrored: dict[str, tuple[float, str]] = {}
# adapter -> its demand over the window under way (adapter_demand.py), looked at every
# BUCKET_S.
WINDOWS: dict[str, Window] = {}
# adapter -> the most of its requests this process had in flight at once since it last added
# to the sums every gateway process shares.
PEAKS: dict[str, int] = {}
# (adapter, bucket) -> the most of its requests in flight at once over that bucket, summed
# over the gateway processes, in the cache; kept a little past a window.
DEMAND_KEY = "llmgw:adapters:demand:{}:{}"
KEEP_S = WINDOW_S + 4 * BUCKET_S
# (replica, adapter) -> when this gateway asked its agent to unload it: not routed to it
# until the engines' readings say it holds it no more (LOADED_FOR_S at most).
UNLOADING: dict[tuple[str, str], float] = {}
# The runtime whose adapters' demand is watched, and the task watching it.
_watcher: tuple[State, asyncio.Task] | None = None


def forget_gone(rt: State) -> None:
    """Drop what is kept of replicas and adapters the tables no longer hold (a replica's id
    changes with each start): without it these grow for the process's life."""
    adapters = rt.tables.adapters
    replicas = {u.replica_id for ups in rt.tables.upstreams.values() for u in ups}
    for book in (USED, LOADED, UNLOADING):
        for key in [k for k in book if k[0] not in replicas or k[1] not in adapters]:
            del book[key]
    for book in (WINDOWS, PEAKS):
        for name in [n for n in book if n not in adapters]:
            del book[name]
    for name in [n for n, (_, r) in _asked.items() if n not in adapters or r not in replicas]:
        del _asked[name]
    for name in [n for n in _unmirrored if n not in adapters]:
        del _unmirrored[name]


def not_holding(rt: State, model: str, tried: set[str]) -> set[str]:
    """`tried`, and, when `model` is an adapter, its base's replicas that do not hold it
    now: passed to `State.pick` as tried, so it chooses among the holders only (by the
    prompt's prefix too, which keeps a conversation on a replica holding both)."""
    if model not in rt.tables.adapters:
        return tried
    readings, now = rt.readings, time.monotonic()
    return tried | {
        u.replica_id
        for u in rt.tables.upstreams.get(model, ())
        if now - UNLOADING.get((u.replica_id, model), -1e9) < LOADED_FOR_S
        or (
            not ((reading := readings.get(u.replica_id)) and reading.holds(model))
            # llama-server is asked for an adapter by its index, which only its reading says.
            and (
                u.engine == "llamacpp"
                or now - LOADED.get((u.replica_id, model), -1e9) >= LOADED_FOR_S
            )
        )
    }


def sent(rt: State, req: Request, up: Upstream) -> None:
    """Note that `up` serves its adapter now (its use, for the LRU), and tell a llama-server
    holding adapters which to apply (`_lora_named`). A caller's own `lora` is never passed
    on: on a llama-server holding several teams' adapters it would pick any of them."""
    if req.body.pop("lora", None) is not None:
        req.body_changed = True
    if up.engine == "llamacpp":
        _lora_named(rt, req, up)
    if up.model in rt.tables.adapters:
        now = time.monotonic()
        USED[(up.replica_id, up.model)] = now
        window = WINDOWS.setdefault(up.model, Window(time.time()))
        in_flight = BOARD.running.get(up.model, 0) + 1  # itself, not yet sent
        window.send(up.replica_id, in_flight)
        _peaked(up.model, in_flight)


def _peaked(adapter: str, in_flight: int) -> None:
    PEAKS[adapter] = max(PEAKS.get(adapter, 0), in_flight)


def _lora_named(rt: State, req: Request, up: Upstream) -> None:
    """A llama-server holding adapters applies those a request's `lora` lists, the others at
    0: an adapter's request names its index at 1; its base's names one at 0, said outright,
    because a request naming none reuses the prompt cache an adapter's request left and
    answers in that adapter's words (docs/engines.md, "LoRA adapters"). An adapter's answer
    names the adapter, where llama-server names its base (`upstream.model_named`)."""
    reading = rt.readings.get(up.replica_id)
    if reading is None or not reading.adapters:
        return
    if up.model in rt.tables.adapters:
        lora = [{"id": reading.engine_id(up.model), "scale": 1.0}]
        req.answer_model = up.model  # llama-server names its base in the answer
    else:
        lora = [{"id": reading.adapters[0][1], "scale": 0.0}]
    if lora[0]["id"] is not None:
        req.body["lora"] = lora
        req.body_changed = True


def spread_choice(
    adapter: str,
    ups: Sequence[Upstream],
    readings: Mapping[str, Reading],
    inflight: Mapping[str, int],
    used: Mapping[tuple[str, str], float],
) -> tuple[str, str | None] | None:
    """One more replica to load `adapter` on when its demand is high on every replica that
    holds it: each holder's engine queues requests (a waiting count above 0, as it last
    said). The replica and what it unloads, as `load_choice` picks among those that do not
    hold it; None when a holder has room, an engine said nothing, or every replica holds it."""
    holders, others = [], []
    for u in ups:
        reading = readings.get(u.replica_id)
        (holders if reading is not None and reading.holds(adapter) else others).append(u)
    if not holders or not others:
        return None
    for u in holders:
        waiting = readings[u.replica_id].waiting
        if waiting is None or waiting <= 0:
            return None
    return load_choice(others, readings, inflight, used)


def spread(rt: State, adapter: str) -> None:
    """After a request for `adapter` is sent: when every replica holding it queues, ask one
    more to load it (at most every ASK_EVERY_S), without waiting for it."""
    spec = rt.tables.adapters.get(adapter)
    if spec is None:
        return
    _watch(rt)
    asked = _asked.get(adapter)
    if asked is not None and time.monotonic() - asked[0] < ASK_EVERY_S:
        return
    ups = rt.tables.upstreams.get(adapter, ())
    choice = spread_choice(adapter, ups, rt.readings, rt.inflight, USED)
    if choice is None:
        return
    _asked[adapter] = (time.monotonic(), choice[0])
    _loading(choice[0], adapter)
    log.info("adapter %s queues on every replica holding it: loading it on %s", adapter, choice[0])
    task = asyncio.get_running_loop().create_task(_send_logged(choice[0], spec, choice[1]))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


_tasks: set[asyncio.Task] = set()


def _loading(replica: str, adapter: str) -> None:
    """`adapter` is asked of `replica`: an unload asked before is overtaken, and its demand
    is counted afresh, over holders that now include that replica."""
    UNLOADING.pop((replica, adapter), None)
    WINDOWS.pop(adapter, None)


async def shrink(rt: State, now: float | None = None) -> None:
    """Note each adapter's requests in flight now and add the most this process had at once
    over the bucket just ended to the sums every process shares; where a window is whole,
    ask the rule (adapter_demand.shrink_choice) with the demand summed over them all, and
    ask the control plane to unload the adapter from the replica it names, without waiting.
    The window starts again either way: one replica at a time. `now`: wall-clock seconds."""
    now = time.time() if now is None else now
    due = []
    for name in rt.tables.adapters:
        running = BOARD.running.get(name, 0)
        window = WINDOWS.setdefault(name, Window(now))
        window.saw(running)
        _peaked(name, running)
        if window.done(now):
            due.append(name)
    peaks = {n: p for n, p in PEAKS.items() if p > 0}
    PEAKS.clear()
    if peaks:
        await asyncio.to_thread(demand_add, peaks, bucket_of(now) - 1)
    for name in due:
        window = WINDOWS.get(name)
        if window is None or not window.done(now):
            continue  # a load asked meanwhile started it again
        del WINDOWS[name]
        sums = await asyncio.to_thread(demand_sums, name, shared_buckets(window.since, now))
        window.peak = max(window.peak, demand_peak(sums))
        choice = shrink_choice(name, rt.tables.upstreams.get(name, ()), rt.readings, window)
        if choice is None:
            continue
        UNLOADING[(choice.replica, name)] = time.monotonic()
        LOADED.pop((choice.replica, name), None)
        log.info("%s", choice.why)
        rt.beside(_unload_logged(choice.replica, name), f"unload-{name}")


def demand_add(peaks: Mapping[str, int], bucket: int) -> None:
    """Add this process's peaks over `bucket` to the sums every gateway process shares
    (add and incr are atomic on Redis)."""
    for name, peak in peaks.items():
        key = DEMAND_KEY.format(name, bucket)
        if cache.add(key, peak, timeout=KEEP_S):
            continue
        try:
            cache.incr(key, peak)
        except ValueError:  # it timed out meanwhile: this peak starts it again
            cache.add(key, peak, timeout=KEEP_S)


def demand_sums(name: str, buckets: range) -> list[int]:
    """The shared sums of adapter `name` over `buckets`, those any process added to."""
    got = cache.get_many([DEMAND_KEY.format(name, b) for b in buckets])
    return [v for v in got.values() if isinstance(v, int)]


def _watch(rt: State) -> None:
    """Look at the adapters' demand every BUCKET_S while `rt` runs (started by the
    first request for an adapter)."""
    global _watcher
    if _watcher is not None and _watcher[0] is rt and not _watcher[1].done():
        return

    async def watch() -> None:
        while True:
            # Just past a bucket's end, as every process: each adds to the bucket just ended.
            await asyncio.sleep(BUCKET_S - time.time() % BUCKET_S + 0.05)
            try:
                await shrink(rt)
            except Exception:  # noqa: BLE001 - looked at again next time
                log.warning("could not look at the adapters' demand", exc_info=True)

    _watcher = (rt, rt.beside(watch(), "adapter-demand"))


async def _unload_logged(replica: str, adapter: str) -> None:
    """Ask the control plane for the unload, which judges it again over every process: when
    it refuses, the replica is routed to again."""
    from fleet.nodes.dispatch import send_commands
    from fleet.services import UnloadRefused, adapter_unload_commands

    try:
        commands = await in_a_thread(adapter_unload_commands)(
            replica_id=replica, name=adapter, window_s=WINDOW_S
        )
        await send_commands(commands)
    except UnloadRefused as exc:
        UNLOADING.pop((replica, adapter), None)
        log.info("%s", exc)
    except Exception:  # noqa: BLE001 - the database or channel layer away: asked again later
        UNLOADING.pop((replica, adapter), None)
        log.warning("could not ask for adapter %s to be unloaded", adapter, exc_info=True)


async def _send_logged(replica: str, adapter: AdapterSpec, evict: str | None) -> None:
    try:
        await _send(replica, adapter, evict)
    except Exception:  # noqa: BLE001 - the database or channel layer away: asked again later
        log.warning("could not ask for adapter %s to be loaded", adapter.name, exc_info=True)


def load_choice(
    ups: Sequence[Upstream],
    readings: Mapping[str, Reading],
    inflight: Mapping[str, int],
    used: Mapping[tuple[str, str], float],
) -> tuple[str, str | None] | None:
    """The replica to load an adapter on and the adapter it unloads first (None: a slot is
    free): the least loaded (this gateway's requests in flight, and what its engine said
    it runs and queues) with a slot free, else the least loaded, unloading the adapter it
    holds that was used longest ago. None when there is no replica with slots."""
    free, full = [], []
    for u in ups:
        if u.adapter_slots <= 0:
            continue
        reading = readings.get(u.replica_id)
        held = [n for n, _ in reading.adapters or ()] if reading is not None else []
        load = replica_load(inflight.get(u.replica_id, 0), u.weight, reading)
        (free if len(held) < u.adapter_slots else full).append((load, u.replica_id, held))
    if free:
        return min(free)[1], None
    if not full:
        return None
    _, replica, held = min(full, key=lambda f: (f[0], f[1]))
    return replica, min(held, key=lambda n: (used.get((replica, n), 0.0), n))


async def wait_for_adapter(rt: State, req: Request, adapter: AdapterSpec) -> None:
    """No ready replica holds `adapter`: ask one to load it (at most every ASK_EVERY_S) and
    wait until an engine says it holds it, up to the on-demand bound. A 503 that says why
    when its base has no replica that can hold it, when the load failed (the engine's
    words), or, past the bound, `model_loading` with a Retry-After."""
    name = adapter.name
    ups = rt.tables.upstreams.get(name, ())
    if not ups:
        coming = rt.tables.starting.get(adapter.base, 0)
        if coming:
            raise Refused(
                503,
                f"Adapter {name} waits for its base {adapter.base}, which is loading "
                f"({coming} replica{'s' if coming != 1 else ''} starting).",
                "server_error",
                "model_not_ready",
                reason="no_replica",
                retry_after=10,
            )
        raise unplaceable(
            f"Adapter {name} has no replica of its base {adapter.base} that can hold it ready: "
            "none runs a profile with adapter slots on an engine that loads "
            f"{adapter.format} adapters."
        )
    # Counted as waiting, as for an on-demand model: its base's autoscaler's demand.
    BOARD.waiting[name] = BOARD.waiting.get(name, 0) + 1
    try:
        await _held(rt, req, adapter, ups)
    finally:
        BOARD.waiting[name] -= 1


async def _held(rt: State, req: Request, adapter: AdapterSpec, ups: Sequence[Upstream]) -> None:
    """Ask for `adapter` to be loaded and return once an engine says it holds it; Refused
    when its load failed or the on-demand bound passed first. While the mirror does not hold
    its weights it is asked again (every SAID_EVERY_S), and past the bound the 503 says how
    far the mirror got."""
    name, bound = adapter.name, rt.cfg.on_demand_wait
    deadline = req.started + bound
    looked = float("-inf")
    asked_at: datetime | None = None
    unmirrored = ""  # the sentence saying how far the mirror got with its weights
    while True:
        routes = {u.replica_id for u in rt.tables.upstreams.get(name, ())}
        if not_holding(rt, name, set()) != routes:
            return  # one holds it now (judged on the routes as they are now)
        if time.monotonic() - looked >= SAID_EVERY_S:
            looked = time.monotonic()
            if asked_at is None or name not in _asked:  # never asked, or its ask was dropped
                asked_at, unmirrored = await _ask_mirrored(rt, adapter, ups)
            said = await _said(name, asked_at) if asked_at is not None else None
            if said is not None and said[0] == "loaded":
                # Its agent said so: routed to at once, before the readings say it too.
                LOADED[(said[1], name)] = time.monotonic()
                UNLOADING.pop((said[1], name), None)
                continue
            if said is not None:
                _asked.pop(name, None)  # asked again by the next request
                raise unplaceable(f"Adapter {name} could not be loaded: {said[2]}.")
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            why = unmirrored or loading_said(name, bound, rt.readings)
            raise Refused(
                503,
                f"{why} Try again shortly.",
                "server_error",
                "model_loading",
                reason="loading",
                retry_after=10,
            )
        await asyncio.sleep(min(POLL_S, remaining))


def loading_said(name: str, bound: float, readings: Mapping[str, Reading]) -> str:
    """Why a request for adapter `name` is still waiting after `bound` seconds: how far the
    node of the replica asked to load it got fetching its files from the mirror, where its
    engine_load says so; else that no replica held it in time."""
    asked = _asked.get(name)
    reading = readings.get(asked[1]) if asked is not None else None
    fetched = reading.fetched(name) if reading is not None else None
    if asked is None or fetched is None:
        return f"Adapter {name} is loading: no replica held it within {bound:g} s."
    return (
        f"Adapter {name} is loading on replica {asked[1]}: its node is fetching its weights "
        f"from the mirror, {fetched_said(*fetched)} so far."
    )


async def _ask_mirrored(
    rt: State, adapter: AdapterSpec, ups: Sequence[Upstream]
) -> tuple[datetime | None, str]:
    """`_ask`'s answer: when it was asked for and "", or None and the sentence saying how far
    the mirror got with its weights, when there is nothing yet to load."""
    from fleet.services import NotMirrored

    try:
        return await _ask(rt, adapter, ups), ""
    except NotMirrored as exc:
        return None, str(exc)


async def _ask(rt: State, adapter: AdapterSpec, ups: Sequence[Upstream]) -> datetime:
    """Send the load (and the unload it makes room with) to the chosen replica's agent,
    unless this adapter was asked for lately; when it was asked for. NotMirrored, and the
    ask dropped, while the mirror does not hold its weights (said again for SAID_EVERY_S
    without asking the database)."""
    from fleet.services import NotMirrored

    now = time.monotonic()
    unmirrored = _unmirrored.get(adapter.name)
    if unmirrored is not None and now - unmirrored[0] < SAID_EVERY_S:
        raise NotMirrored(unmirrored[1])
    asked = _asked.get(adapter.name)
    if asked is not None and now - asked[0] < ASK_EVERY_S:
        return datetime.now(UTC) - timedelta(seconds=now - asked[0])
    choice = load_choice(ups, rt.readings, rt.inflight, USED)
    if choice is None:
        raise unplaceable(f"Adapter {adapter.name}: no replica of {adapter.base} has slots.")
    replica, evict = choice
    _asked[adapter.name] = (now, replica)
    asked_at = datetime.now(UTC)  # before: its agent may answer before the send returns
    log.info(
        "asking replica %s to load adapter %s%s",
        replica,
        adapter.name,
        f", unloading {evict} (used longest ago)" if evict else "",
    )
    try:
        await _send(replica, adapter, evict)
    except NotMirrored as exc:
        _asked.pop(adapter.name, None)
        _unmirrored[adapter.name] = (time.monotonic(), str(exc))
        raise
    except Exception:  # noqa: BLE001 - the database or channel layer away: said, and waited on
        log.warning("could not ask for adapter %s to be loaded", adapter.name, exc_info=True)
    _loading(replica, adapter.name)
    return asked_at


async def _send(replica: str, adapter: AdapterSpec, evict: str | None) -> None:
    from fleet.nodes.dispatch import send_commands
    from fleet.services import adapter_load_commands

    commands = await in_a_thread(adapter_load_commands)(
        replica_id=replica,
        name=adapter.name,
        source=adapter.source,
        format=adapter.format,
        unload=evict,
        window_s=WINDOW_S,
    )
    await send_commands(commands)


async def _said(adapter: str, since: datetime) -> tuple[str, str, str] | None:
    from fleet.selectors.routing import adapter_said

    try:
        return await asyncio.wait_for(in_a_thread(adapter_said)(adapter=adapter, since=since), 2)
    except Exception:  # noqa: BLE001 - the database being away is not a reason to refuse
        return None
