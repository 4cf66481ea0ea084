"""``llmgw ctl bench MODEL [--save]``: how many requests at once a model serves within its SLO.

A load ramp through the OpenAI-compatible gateway: at each level N workers send
streaming chat completions back to back for ``--seconds``, N doubling from 1.
Each level is judged against the model's SLO (``GET /api/v1/models/{name}``);
the ramp stops after the first level that misses it, and the capacity is the
last level that met it. ``--save`` stores that per replica with
``PUT /api/v1/models/{name}/capacity``, where the reconciler sizes the model
from it, with the replicas' mean draw over that level as ``watts`` where their
agents reported it (``GET /api/v1/models/{name}/power``, :mod:`llmgw.cli.bench_power`),
and the share of their default power limit their GPUs were held to as ``power_share``
where it was known and below 1, so that a capped replica is not scaled down twice.

The judging is pure and in :mod:`llmgw.cli.bench_judge` (samples in,
summaries out), kept apart from the load, :mod:`llmgw.cli.bench_load` on
httpx's AsyncClient; this module is the command, its arguments and the
report it prints.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from fleet.domain.capped import pct
from llmgw.cli.base import Api, CtlError, Output, positive_number, segment
from llmgw.cli.bench_judge import (
    EngineLook,
    Judgement,
    LevelSample,
    LevelSummary,
    Slo,
    at_once,
    engine_look,
    judge,
    ladder,
    miss_text,
    ms_text,
    per_replica,
    replica_basis,
    verdict,
)
from llmgw.cli.bench_load import Plan, Progress, run_ramp
from llmgw.cli.bench_power import PowerSample, ShareSample, per_watt, power_sample, share_sample
from llmgw.cli.tables import number, render

DEFAULT_MAX_CONCURRENCY = 64
DEFAULT_SECONDS = 10.0
DEFAULT_MAX_TOKENS = 64
DEFAULT_REQUEST_TIMEOUT_S = 60.0
# One client process opens a connection per worker; past this it measures
# itself more than the model.
MOST_CONCURRENCY = 1024
KEY_ENV = "LLMGW_API_KEY"
INTERRUPTED = 130  # what a shell reports for a command ended by Ctrl-C


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
        "engines_waiting_max": level.waiting_max,
        "engines_kv_cache_max": level.kv_cache_max,
        **power_doc(level),
    }


def power_doc(level: LevelSummary) -> dict[str, Any]:
    """What the replicas drew at a level, and the tokens per watt; null where unknown, with
    whose readings were absent. The share of their default power limit their GPUs were held
    to; null where unknown (with why) or no GPU was sampled."""
    rate = per_watt(level.tok_per_sec, level.watts)
    return {
        "watts": None if level.watts is None else round(level.watts, 1),
        "tok_per_watt": None if rate is None else round(rate, 4),
        "power_not_measured": list(level.power_silent),
        "power_share": None if level.power_share is None else round(level.power_share, 4),
        "power_share_unknown": list(level.power_share_silent),
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
            "engines_waiting_max": c.waiting_max,
            "engines_kv_cache_max": c.kv_cache_max,
            **power_doc(c),
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
    "WATTS",
    "TOK/W",
    "QUEUED",
    "KV",
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
            None if level["watts"] is None else f"{level['watts']:,.0f}",
            None if level["tok_per_watt"] is None else f"{level['tok_per_watt']:.3g}",
            level["engines_waiting_max"],
            _share(level["engines_kv_cache_max"]),
            level["meets_slo"],
        ]
        for level in doc["levels"]
    ]
    blocks = [render(BENCH_HEADERS, rows)] if rows else []
    blocks.append("\n".join(doc["verdict"]))
    return "\n\n".join(blocks)


def _share(value: float | None) -> str | None:
    return None if value is None else f"{value:.0%}"


def saved_sentence(model: str, save: Mapping[str, Any], replicas: int) -> str:
    line = f"saved for {model} on profile {save['profile']}"
    line += ", per replica" if replicas > 1 else ""
    line += f": {at_once(save['max_concurrency'])}, {save['tok_per_sec']:.0f} tok/s"
    if save.get("watts") is not None:
        line += f", {save['watts']:,.0f} W"
    if replicas > 1:
        line += (
            f" ({replicas} ready replicas shared the load; the figures are divided by {replicas})"
        )
    if save.get("power_share") is not None:
        line += f", its GPUs held to {pct(save['power_share'])} of their default power limit"
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

    def drawn() -> tuple[PowerSample | None, ShareSample | None]:
        try:
            view = api.get(f"/models/{segment(model)}/power")
        except CtlError:  # a server without it, or a failed read: no sample, not unknown
            return None, None
        return power_sample(view), share_sample(view)

    async def look() -> EngineLook:
        seen = engine_look(await asyncio.to_thread(api.get, "/replicas", model=model))
        power, held = await asyncio.to_thread(drawn)
        return replace(seen, power=power, held=held)

    try:
        asyncio.run(run_ramp(plan, slo, progress, samples, look))
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
    if j.capacity is not None and j.capacity.power_share_silent:
        # Saved as at the default, as before: a capped replica may then count less twice.
        out.say("power share not recorded: " + "; ".join(j.capacity.power_share_silent))


def at_once_list(levels: Sequence[int]) -> str:
    """``1, 2, 4, 8 at once``; a long ladder as ``1, 2, 4 … 64 at once``."""
    shown = list(map(str, levels))
    if len(shown) > 5:
        shown = [*shown[:3], f"… {shown[-1]}"]
    return f"{', '.join(shown).replace(', …', ' …')} at once"


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

QUEUED and KV are the most requests the model's engines queued and the most of their KV
caches in use on average while the level ran, as its agents reported them (GET /replicas, every
second): at the capacity, the figures for scaling's target_waiting and kv_ceiling.

WATTS is what the model's ready replicas drew while the level ran, on average: their GPUs'
power_w, or for replicas on CPUs their nodes' CPU packages' (RAPL), as their agents reported
it (GET /models/NAME/power, every second); TOK/W is TOK/S over it. One GPU not reporting its
draw leaves it unknown, and the sentences say whose. The agents read their sensors every
10 s: levels of 30 s or more (--seconds) give each level its own draw.

Where their GPUs were held below their default power limit throughout the level (their
power_limit_w and power_default_w, same source), the summary says to what share: "its GPUs
were held to 80 % of their default power limit there". A replica's share is its most held
GPU's. A GPU not reporting both, a limit that changed while the level ran, or replicas held
to different shares leave it unknown.

--save stores the capacity per replica (divided by the model's ready
replicas), and the draw with it where it was measured, where the reconciler
scales the model by it and placement orders profiles by tokens per watt; and
the share as power_share where it was known and below 1, so that a replica
held to it counts all of it rather than being scaled down again. Unknown, the
capacity is saved as at the default and the bench says why ("power share not
recorded: ...")."""


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


__all__ = ["INTERRUPTED", "register"]
