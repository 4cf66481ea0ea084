"""``llmgw ctl models`` and ``model show|add|update|rm|explain``: the catalog's models,
one in full, the runtime ones changed from a file, and why one was not placed.

``register`` leaves the ``model`` actions in ``groups["model"]``, where the
modules registered after it add theirs (owner, class, resources, serve, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from llmgw.cli.base import Api, CtlError, Output, said, segment
from llmgw.cli.tables import DASH, cell, gb, joined, key_values, number, render


def names(items: Any) -> str:
    """Comma-joined names of a list of strings or of objects with ``name``."""
    out = []
    for item in items or ():
        out.append(item.get("name") if isinstance(item, dict) else item)
    return joined(out)


def model_status(m: Mapping[str, Any]) -> str:
    """The server's status; for a server that sends none, what the flags say."""
    if m.get("status"):
        return m["status"]
    if m.get("parked"):
        return "parked"
    if m.get("held_for"):
        return f"gave room to {m['held_for']}"
    if m.get("unplaceable"):
        return "cannot place"
    return DASH


def model_class(m: Mapping[str, Any]) -> str:
    """Its effective class, and while it is held back, whom it gave room to."""
    klass = m.get("class") or DASH
    return f"{klass}, gave room to {m['held_for']}" if m.get("held_for") else klass


def reserves(m: Mapping[str, Any]) -> str:
    """What one replica reserves, with the most one was measured using: ``16 GB, 4 cores (5.1 GB used)``."""
    parts = []
    if m.get("memory_gb"):
        parts.append(gb(m["memory_gb"]))
    cores = m.get("cpu_cores")
    if cores:
        parts.append(f"{number(cores)} core{'' if cores == 1 else 's'}")
    text = ", ".join(parts) or DASH
    if m.get("measured_memory_gb"):
        text += f" ({number(m['measured_memory_gb'])} GB used)"
    return text


def replicas_cell(m: Mapping[str, Any]) -> str:
    """``2/3``: ready over desired, and ``2/3 +1 retiring`` while one serves on its way out
    (counted as headroom counts: a retiring replica is not one of the model's)."""
    text = f"{cell(m.get('ready'))}/{cell(m.get('desired'))}"
    return f"{text} +{m['retiring']} retiring" if m.get("retiring") else text


def serving(m: Mapping[str, Any]) -> str:
    """``yes`` when at least one replica is ready, retiring ones included."""
    ready = m.get("ready")
    if ready is None:
        return DASH
    return "yes" if ready + (m.get("retiring") or 0) > 0 else "no"


def warning_lines(models: Sequence[Mapping[str, Any]]) -> list[str]:
    """``warning: <model>: <warning>`` for each warning of each model."""
    return [f"warning: {m.get('name')}: {w}" for m in models for w in m.get("warnings") or ()]


def failure_where(f: Mapping[str, Any]) -> str:
    """``replica chat-1a2b3c on node n1, exit code 1``: where a failure happened."""
    where = f"replica {f.get('replica')}"
    if f.get("node"):
        where += f" on node {f['node']}"
    if f.get("exit"):
        where += f", {f['exit']}"
    elif f.get("exit_code") is not None:
        where += f", exit code {f['exit_code']}"
    return where


def failure_lines(models: Sequence[Mapping[str, Any]]) -> list[str]:
    """``failing: <model>: <the line that says why> (<where>)`` for each model backing off
    or parked: the cause the table's status cannot hold (the server's ``said``; from an
    older server, the detail's last line)."""
    out = []
    for m in models:
        f = m.get("last_failure")
        if not isinstance(f, dict):
            continue
        lines = [line.strip() for line in str(f.get("detail") or "").splitlines() if line.strip()]
        said = f.get("said") or (lines[-1] if lines else "no detail")
        out.append(f"failing: {m.get('name')}: {said} ({failure_where(f)})")
    return out


def render_models(models: list[dict[str, Any]]) -> str:
    """``ctl models``: a row per model, then its warnings under the table."""
    if not models:
        return "No models in the catalog."
    headers = [
        "MODEL",
        "SERVING",
        "REPLICAS",
        "STATUS",
        "CLASS",
        "RESERVES",
        "ALIASES",
        "PROFILES",
        "FALLBACKS",
    ]
    rows = [
        [
            m.get("name"),
            serving(m),
            replicas_cell(m),
            model_status(m),
            model_class(m),
            reserves(m),
            joined(m.get("aliases")),
            names(m.get("profiles")),
            joined(m.get("fallbacks")),
        ]
        for m in models
    ]
    return "\n".join([render(headers, rows), *warning_lines(models), *failure_lines(models)])


def render_model(m: dict[str, Any]) -> str:
    """``ctl model show``: its fields, a row per profile, and its warnings."""
    scaling = f"{cell(m.get('ready'))} ready of {cell(m.get('desired'))} wanted"
    if m.get("retiring"):
        scaling += f", {m['retiring']} retiring"
    scaling += f" (min {cell(m.get('min'))}, max {cell(m.get('max'))})"
    owner = m.get("owner")
    pairs: list[tuple[str, Any]] = [
        ("model", m.get("name")),
        ("aliases", joined(m.get("aliases"))),
        ("status", model_status(m)),
        ("replicas", scaling),
        ("class", m.get("class")),
        # An empty owner is a statement (shared); a missing one is not.
        ("owner", "shared" if owner == "" else owner),
        ("reserves", reserves(m)),
        ("fallbacks", joined(m.get("fallbacks"))),
        ("declared", _declared(m.get("declared"))),
    ]
    if m.get("parked"):
        pairs.append(("parked", m.get("reason") or "yes"))
    elif m.get("unplaceable"):
        pairs.append(("cannot place", m.get("reason") or "yes"))
    if m.get("held_for"):
        pairs.append(("gave room to", m["held_for"]))
    if m.get("preempted"):
        pairs.append(("preempted", f"{m['preempted']} replica(s) stopped to make room for others"))
    blocks = [key_values(pairs)]
    profiles = [p for p in m.get("profiles") or () if isinstance(p, dict)]
    if profiles:
        rows = [
            [
                p.get("name"),
                p.get("engine"),
                p.get("gpu_class") or ("cpu only" if "gpu_class" in p else None),
                p.get("tp"),
                gb(p.get("min_memory_gb", p.get("memory_gb"))),
                p.get("cpu_cores"),
            ]
            for p in profiles
        ]
        blocks.append(render(["PROFILE", "ENGINE", "GPU CLASS", "TP", "MEMORY", "CORES"], rows))
    warnings = warning_lines([m])
    if warnings:
        blocks.append("\n".join(warnings))
    return "\n\n".join(blocks)


def _declared(value: Any) -> str:
    """Whether the model comes from the catalog file, which is where it must be changed."""
    if value is None:
        return DASH
    return "yes, in the catalog file (change it there)" if value else "no, added at runtime"


def cmd_models(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/models"), render_models)
    # The table is what the reconciler last did: say so when it has stopped doing anything.
    try:
        status = api.get("/reconciler")
    except CtlError:
        return  # a server from before GET /reconciler, or one that cannot say
    if isinstance(status, dict) and status.get("warning"):
        out.say(f"warning: {status['warning']}")


def cmd_model_show(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/models/{segment(args.name)}"), render_model)


def read_model_file(path: str) -> dict[str, Any]:
    """One model object from a YAML or JSON file (``-`` reads stdin); CtlError(2) otherwise."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CtlError(f"cannot read {path}: {exc}", 2) from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        kind = "JSON" if path.endswith(".json") else "YAML"
        raise CtlError(f"{path} is not valid {kind}: {exc}", 2) from None
    if not isinstance(data, dict):
        raise CtlError(f"{path} must hold one model object (name, source, profiles, ...)", 2)
    return data


def cmd_model_add(api: Api, args: argparse.Namespace, out: Output) -> None:
    model = read_model_file(args.file)
    answer = api.post("/models", model)
    name = answer.get("name") if isinstance(answer, dict) else None
    out.show(answer, lambda a: said(a, f"model {name or model.get('name')} added"))


def cmd_model_update(api: Api, args: argparse.Namespace, out: Output) -> None:
    model = read_model_file(args.file)
    name = args.name or (model.get("name") if isinstance(model, dict) else None)
    if not isinstance(name, str) or not name:
        raise CtlError(
            "the file names no model: give its name, llmgw ctl model update NAME --file F"
        )
    answer = api.put(f"/models/{segment(name)}", model)
    out.show(answer, lambda a: f"model {a['name']} updated: {a.get('reason') or a.get('status')}")


def cmd_model_rm(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/models/{segment(args.name)}")
    out.show(answer, lambda a: said(a, f"model {args.name} removed"))


def render_explain(e: dict[str, Any]) -> str:
    """``ctl model explain``: each profile with the reasons it was not placed."""
    model = e.get("model")
    explanation = e.get("explanation") or []
    if e.get("unplaceable"):
        head = f"{model} cannot be placed"
    elif e.get("status") == "failing":
        head = f"{model} is failing"
    elif explanation:
        head = f"{model}: its last placement failed"
    else:
        head = f"{model}: no failed placement to explain"
    if e.get("reason"):
        head += f": {e['reason']}"
    lines = [head, *(e.get("installing") or [])]
    for item in explanation:
        reasons = item.get("reasons") or []
        if item.get("profile"):
            lines.append(f"profile {item['profile']}:")
        elif not reasons:
            continue
        # A reason of no profile is the model's as a whole: said under its head line.
        lines += [f"  - {r}" for r in reasons] or ["  - (no reason given)"]
    f = e.get("last_failure")
    if isinstance(f, dict):
        lines.append(f"last failure: {failure_where(f)}{' at ' + f['at'] if f.get('at') else ''}:")
        detail = [line.rstrip() for line in str(f.get("detail") or "").splitlines()]
        lines += [f"  {line}" for line in detail if line.strip()] or ["  (no detail given)"]
        lines.append(f"its engine's log: llmgw ctl logs {f.get('replica')}")
    return "\n".join(lines)


def cmd_model_explain(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/models/{segment(args.name)}/explain"), render_explain)


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``models`` and ``model`` with its actions, and leave those in ``groups["model"]``."""
    add(commands, "models", "list models: replicas, status, class, reservations", cmd_models)
    model = add(commands, "model", "show, add, remove, explain, size or change one model")
    actions = model.add_subparsers(dest="action", required=True, metavar="ACTION")

    add(actions, "show", "one model in full", cmd_model_show).add_argument("name")
    adding = add(actions, "add", "add a runtime model from a YAML or JSON file", cmd_model_add)
    adding.add_argument("--file", required=True, help="one model object; - reads stdin")
    updating = add(
        actions,
        "update",
        "replace a runtime model from a file; its replicas roll when a profile or the source changed",
        cmd_model_update,
    )
    updating.add_argument("name", nargs="?", help="default: the name in the file")
    updating.add_argument("--file", required=True, help="the whole model object; - reads stdin")
    # `rm`, as `weights rm` is; `remove` kept for what already calls it so.
    removing = add(actions, "rm", "remove a runtime model", cmd_model_rm, aliases=("remove",))
    removing.add_argument("name")
    add(actions, "explain", "why its last placement failed", cmd_model_explain).add_argument("name")
    groups["model"] = actions
