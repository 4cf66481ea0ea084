"""Finding a replica for a request and trying it: the model, then its fallbacks; another
replica when one cannot be reached; the wait for an on-demand model when none is ready,
and the 503s that say why."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from llmgw.core import tracing
from llmgw.gateway import metrics
from llmgw.gateway.answers import ClientGone, Receive, Refused, Send, unplaceable
from llmgw.gateway.load import BOARD
from llmgw.gateway.scoring import reading_words
from llmgw.gateway.state import Picked, Request, State, in_a_thread
from llmgw.gateway.upstream import Unreachable, proxy

log = logging.getLogger("llmgw.gateway")

SUSPECT_S = 10.0  # a replica that refused a connection is avoided this long


async def route(rt: State, req: Request, receive: Receive, send: Send) -> int:
    """Find a replica (waiting for an on-demand one), send the request, pass the answer
    back; a replica that cannot be reached is tried once more elsewhere. The HTTP status
    answered."""
    key_models = req.key.models
    chain = [m for m in rt.chain(req.model) if key_models is None or m in key_models]
    main = asyncio.current_task()
    gone = False  # the caller hung up (no Event: nothing waits on it)

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        main.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        while True:
            with tracing.span("llmgw.routing") as span:
                picked = up = None
                for i, model in enumerate(chain):
                    picked = rt.pick(model, req.tried, req)
                    if picked is not None:
                        up = picked.up
                        # Served by a fallback for now; an on-demand model before it is started.
                        for m in chain[:i]:
                            spec = rt.tables.models.get(m)
                            if spec is not None and spec.on_demand:
                                rt.start_soon(m)
                        break
                if span is not None:
                    _routing_said(span, rt, req, picked)
            if up is None:
                if req.tried:
                    raise Refused(
                        502,
                        f"No replica of {req.model} could be reached.",
                        "api_error",
                        "upstream_unreachable",
                        reason="upstream",
                        retry_after=5,
                    )
                await _wait_for_replica(rt, req, chain)
                continue
            req.model = up.model
            metrics.series(up.model).routed(picked.how)
            try:
                status = await proxy(rt, req, up, send)
            except Unreachable as exc:
                log.warning("replica %s of %s unreachable: %s", up.replica_id, up.model, exc)
                req.tried.add(up.replica_id)
                if exc.broken and rt.suspect.get(up.replica_id, 0) <= time.monotonic():
                    rt.report_unreachable(up.replica_id, f"{exc} (request {req.request_id})")
                rt.suspect[up.replica_id] = time.monotonic() + SUSPECT_S
                if len(req.tried) >= 2:
                    req.tried.update(
                        u.replica_id for m in chain for u in rt.tables.upstreams.get(m, ())
                    )
                continue
            return status
    except asyncio.CancelledError:
        if gone:
            main.uncancel()  # ours, not the server's: nothing else should see it
            raise ClientGone from None
        raise
    finally:
        watcher.cancel()


def _routing_said(span, rt: State, req: Request, picked: Picked | None) -> None:
    """The replica chosen, and why (`routing_why`), a fallback's, or none."""
    if picked is None:
        why = "no replica ready" + (f" untried ({len(req.tried)} tried)" if req.tried else "")
    else:
        up = picked.up
        why = routing_why(picked, len(rt.tables.upstreams.get(up.model, ())))
        if up.model != req.model:
            why = f"a fallback of {req.model}: {why}"
        if req.tried:
            why += f"; {len(req.tried)} tried already"
    tracing.said(
        span,
        **{
            "llmgw.replica": picked.up.replica_id if picked else None,
            "llmgw.model": picked.up.model if picked else req.model,
            "llmgw.routing": picked.how if picked else None,
            "llmgw.why": why,
        },
    )


def routing_why(picked: Picked, ready: int) -> str:
    """Why a replica was chosen, in words, with the figures (what its engine said too)."""
    engine = reading_words(picked.reading)
    of = f"{picked.inflight} in flight, of {ready} ready" + (f"; {engine}" if engine else "")
    if picked.how == "prefix":
        return (
            f"first in the order of this prompt's prefix ({picked.depth} of its "
            f"{picked.blocks} leading blocks) ({of})"
        )
    if picked.how == "imbalance":
        return (
            f"number {picked.place + 1} in the order of this prompt's prefix ({of}): "
            "those before it were busier than the bound allows"
        )
    if picked.how == "round_robin":
        return f"next in turn ({of})"
    if picked.how == "suspect":
        return f"only replicas refusing connections lately were left ({of})"
    if engine:
        return f"least loaded ({of})"
    return f"fewest requests in flight ({picked.inflight}) of {ready} ready"


async def _wait_for_replica(rt: State, req: Request, chain: list[str]) -> None:
    """Nothing in the chain is ready. An on-demand model in it is asked for and waited on,
    up to the bound; otherwise, or past the bound, a 503 that says why."""
    target = next(
        (m for m in chain if (spec := rt.tables.models.get(m)) is not None and spec.on_demand),
        None,
    )
    if target is None:
        starting = sum(rt.tables.starting.get(m, 0) for m in chain)
        trouble = await _trouble(req.model)
        why = (
            f"it is loading ({starting} replica{'s' if starting != 1 else ''} starting)"
            if starting and trouble is None
            else trouble or "it has no replica running"
        )
        if starting and trouble is None:
            raise Refused(
                503,
                f"Model {req.model} has no ready replica: {why}.",
                "server_error",
                "model_not_ready",
                reason="no_replica",
                retry_after=10,
            )
        raise unplaceable(f"Model {req.model} has no ready replica: {why}.")
    bound = rt.cfg.on_demand_wait
    deadline = req.started + bound
    BOARD.waiting[target] = BOARD.waiting.get(target, 0) + 1
    try:
        while True:
            await rt.start_model(target)
            trouble = await _trouble(target)
            if trouble is not None:
                raise unplaceable(f"Model {target} cannot be started now: {trouble}.")
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise Refused(
                    503,
                    f"Model {target} is loading: no replica was ready within {bound:g} s. "
                    "Try again shortly.",
                    "server_error",
                    "model_loading",
                    reason="loading",
                    retry_after=10,
                )
            changed = rt.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(remaining, 2.0))
            if any(rt.tables.upstreams.get(m) for m in chain):
                return
    finally:
        BOARD.waiting[target] -= 1


_troubles: dict[str, tuple[float, str | None]] = {}


async def _trouble(model: str) -> str | None:
    """The reconciler's reason a model is not coming, read at most every 2 s per model."""
    from fleet.selectors.routing import on_demand_trouble

    now = time.monotonic()
    cached = _troubles.get(model)
    if cached is not None and now - cached[0] < 2:
        return cached[1]
    _troubles[model] = (now, cached[1] if cached else None)  # one query at a time per model
    try:
        found = await asyncio.wait_for(in_a_thread(on_demand_trouble)(model), 2)
    except Exception:  # noqa: BLE001 - the database being away is not a reason to refuse
        found = None
    _troubles[model] = (time.monotonic(), found)
    return found
