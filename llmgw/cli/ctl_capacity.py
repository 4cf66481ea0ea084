"""``llmgw ctl`` for what a model is worth and needs: its class and reservations, what was
measured of it, and the dry runs that size it (target, headroom, preemption)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, CtlError, Output, positive_number, segment, whole_number
from llmgw.cli.tables import DASH, age, number, render

CLASS_HELP = """\
When a model cannot be placed, replicas of a lower class are stopped to make
room for it:

  critical       never gives up the replicas of its minimum
  standard       gives way to critical
  opportunistic  gives way to both; the default for an on-demand model

"default" goes back to what the model's scaling implies: opportunistic when on
demand, standard otherwise."""

RESOURCES_HELP = """\
--memory is the host memory a replica needs: for a model with no GPU, its
weights, KV cache and engine together. --cores is the CPU cores a replica with
no GPU computes on (0 reserves none; left out, each profile keeps its own).
Running replicas keep what they were started with until restarted."""


# Class and reservations


def cmd_model_class(api: Api, args: argparse.Namespace, out: Output) -> None:
    wanted = "" if args.klass == "default" else args.klass
    answer = api.post(f"/models/{segment(args.name)}/class", {"class": wanted})
    out.show(answer, lambda a: f"{a['model']} is {a['class']}")


def gb_figure(value: Any) -> str:
    return DASH if value is None else f"{number(value)} GB"


def render_resources(model: Mapping[str, Any], profile: str | None) -> str:
    """A line per profile set, then how running replicas come to the new figures."""
    name = model["name"]
    lines = [
        f"{name}/{p['name']}: {gb_figure(p.get('min_memory_gb'))} memory, "
        f"{p.get('cpu_cores') or 0} cores"
        for p in model.get("profiles") or ()
        if profile is None or p.get("name") == profile
    ]
    lines.append(
        f"Running replicas keep their old figures until restarted: llmgw ctl restart --model {name}"
    )
    return "\n".join(lines)


def resources_body(args: argparse.Namespace) -> dict[str, Any]:
    memory = args.memory
    body: dict[str, Any] = {"memory_gb": int(memory) if memory == int(memory) else memory}
    if args.cores is not None:
        body["cpu_cores"] = args.cores
    if args.profile is not None:
        body["profile"] = args.profile
    return body


def cmd_model_resources(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.post(f"/models/{segment(args.name)}/resources", resources_body(args))
    out.show(answer, lambda m: render_resources(m, args.profile))


# Measurements

CAPACITY_HEADERS = [
    "MODEL",
    "PROFILE",
    "MAX CONCURRENCY",
    "TOK/S",
    "TTFT P95",
    "TPOT P95",
    "MEASURED",
    "BY",
]


def ms(value: Any) -> str:
    return DASH if value is None else f"{number(value)} ms"


def render_capacity(measurements: list[Mapping[str, Any]]) -> str:
    """``ctl capacity``: a row per model and profile measured."""
    if not measurements:
        return "Nothing measured yet: llmgw ctl bench MODEL --save"
    rows = [
        [
            m.get("model"),
            m.get("profile"),
            m.get("max_concurrency"),
            number(m.get("tok_per_sec")),
            ms(m.get("ttft_p95_ms")),
            ms(m.get("tpot_p95_ms")),
            age(m.get("measured_at")),
            m.get("measured_by"),
        ]
        for m in measurements
    ]
    return render(CAPACITY_HEADERS, rows)


def cmd_capacity(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/capacity"), render_capacity)


# Sizing: target, headroom, preemption (dry runs: nothing changes)


def blocked_lines(blocked: Any, indent: str = "  ") -> list[str]:
    return [f"{indent}{line}" for line in blocked or ()]


def render_target(t: Mapping[str, Any]) -> str:
    """What a throughput needs, what runs, and whether the rest fits (the seed's newTargetCmd)."""
    lines = [
        f"{t['model']}: {t['tok_per_sec']:.0f} tokens/s needs {t['needed']} replicas "
        f"at {t['per_replica_tok_per_sec']:.1f} each (measured on {t['profile']}); "
        f"{t['current']} running"
    ]
    if t.get("capped"):
        lines.append("Running replicas count less than measured:")
        lines += blocked_lines(t["capped"])
    if t["more"] == 0:
        lines.append("It already has them.")
    elif t["fits"]:
        lines.append(f"{t['more']} more, and there is room for them.")
    else:
        lines.append(f"{t['more']} more, and there is room for {t['room']}:")
        lines += blocked_lines(t.get("blocked"))
    return "\n".join(lines)


def exact(x: float) -> str:
    """A number as sent to the server: whole numbers bare, the rest to full precision."""
    return str(int(x)) if x == int(x) else repr(x)


def cmd_model_target(api: Api, args: argparse.Namespace, out: Output) -> None:
    name = segment(args.name)
    target = api.get(f"/models/{name}/target", tokens_per_sec=exact(args.tokens_per_sec))
    out.show(target, render_target)
    if not args.apply or not target.get("more"):
        return
    if not target.get("fits"):
        raise CtlError("not applied: the cluster has no room for them")
    needed = target["needed"]
    model = api.get(f"/models/{name}")
    top = max(needed, model.get("max") or 0)
    api.post(f"/models/{name}/scale", {"min": needed, "max": top})
    out.say(f"Applied: {target['model']} runs {needed} (up to {top} under load).")


def render_headroom(h: Mapping[str, Any], asked: int | None) -> str:
    """How many more replicas fit now, what one more serves, and why not more."""
    retiring = f", {h['retiring']} retiring" if h.get("retiring") else ""
    head = f"{h['model']}: {h['current']} running{retiring}; room for {h['more']} more"
    if h.get("limited"):
        head += f" (at least; asked up to {asked if asked is not None else h['more']})"
    lines = [head]
    if h.get("tok_per_sec"):
        lines.append(f"one more serves {number(h['tok_per_sec'])} tokens/s")
    lines += blocked_lines(h.get("capped"))
    if h.get("blocked"):
        lines.append("Not more because:")
        lines += blocked_lines(h["blocked"])
    return "\n".join(lines)


def cmd_model_headroom(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.get(f"/models/{segment(args.name)}/headroom", limit=args.limit)
    out.show(answer, lambda h: render_headroom(h, args.limit))


def render_preemption(p: Mapping[str, Any]) -> str:
    """What would be stopped for a model now, what is protected, and why; a dry run."""
    blocks = [p["summary"]]
    victims = p.get("victims") or []
    if victims:
        rows = [
            [v.get("replica"), v.get("model"), v.get("class"), v.get("node"), v.get("why")]
            for v in victims
        ]
        blocks.append("Would stop:\n" + render(["REPLICA", "MODEL", "CLASS", "NODE", "WHY"], rows))
    protected = p.get("protected") or []
    if protected:
        rows = [[v.get("replica"), v.get("model"), v.get("why")] for v in protected]
        blocks.append("Protected:\n" + render(["REPLICA", "MODEL", "WHY"], rows))
    if p.get("blocked"):
        blocks.append("\n".join(p["blocked"]))
    return "\n\n".join(blocks)


def cmd_model_preemption(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/models/{segment(args.name)}/preemption"), render_preemption)


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``capacity`` to the commands and the sizing actions to ``model``."""
    model_actions = groups["model"]
    klass = add(
        model_actions,
        "class",
        "set what a model's capacity is worth against another's",
        cmd_model_class,
    )
    klass.epilog = CLASS_HELP
    klass.formatter_class = argparse.RawDescriptionHelpFormatter
    klass.add_argument("name")
    klass.add_argument(
        "klass", metavar="CLASS", choices=["critical", "standard", "opportunistic", "default"]
    )

    resources = add(
        model_actions,
        "resources",
        "set the memory and cores a model reserves of a node",
        cmd_model_resources,
    )
    resources.epilog = RESOURCES_HELP
    resources.formatter_class = argparse.RawDescriptionHelpFormatter
    resources.add_argument("name")
    resources.add_argument("--memory", type=positive_number, required=True, metavar="GB")
    resources.add_argument("--cores", type=whole_number, metavar="N")
    resources.add_argument("--profile", help="one profile; every profile when left out")

    target = add(
        model_actions,
        "target",
        "how many replicas a model needs for a throughput, and whether they fit",
        cmd_model_target,
    )
    target.add_argument("name")
    target.add_argument("--tokens-per-sec", type=positive_number, required=True, metavar="N")
    target.add_argument(
        "--apply", action="store_true", help="make that the number it always runs, if they fit"
    )

    headroom = add(
        model_actions, "headroom", "how many more replicas of a model fit now", cmd_model_headroom
    )
    headroom.add_argument("name")
    headroom.add_argument("--limit", type=whole_number, metavar="N", help="stop counting at N")

    preemption = add(
        model_actions,
        "preemption",
        "what would be stopped to make room for a model now, and why (changes nothing)",
        cmd_model_preemption,
    )
    preemption.add_argument("name")

    add(commands, "capacity", "what was measured of each model on each profile", cmd_capacity)
