"""``llmgw ctl``: the operator's command line for the REST API under ``/api/v1/``.

Each command makes one or two HTTP calls and shows the answer as a table or a
few sentences; ``--json`` prints the server's JSON as it came instead. The
server is the only judge of what is valid: this module checks only what it
needs to build a request, and shows the server's own sentence when it refuses.

Exit status: 0 done; 1 the server refused or could not be reached; 2 the
command line was wrong (including no token), so nothing was sent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from llmgw.cli.base import (
    DEFAULT_TIMEOUT_S,
    Api,
    CtlError,
    Handler,
    Output,
    duration,
    positive_number,
    said,
    segment,
    whole_number,
)
from llmgw.cli.tables import DASH, age, cell, joined, key_values, number, render
from mirror.domain.progress import fetched_said

DEFAULT_SERVER = "http://127.0.0.1:8000"


# Formatting shared by several views


def known(value: Any) -> Any:
    """A figure a node reports, or None: zero from an agent means it did not say."""
    if value is None or isinstance(value, bool):
        return None
    return value if value else None


def gb(value: Any) -> str:
    """``16`` → ``16 GB``; absent → ``-``."""
    return DASH if value is None else f"{number(value)} GB"


def names(items: Any) -> str:
    """Comma-joined names of a list of strings or of objects with ``name``."""
    out = []
    for item in items or ():
        out.append(item.get("name") if isinstance(item, dict) else item)
    return joined(out)


def gpus_cell(node: Mapping[str, Any]) -> str:
    """``6/8 h100-80g``: free over total and the class; ``-`` for a node with no GPUs."""
    total = node.get("gpu_total")
    if not total:
        return DASH
    text = f"{cell(node.get('gpu_free'))}/{total}"
    if node.get("gpu_class"):
        text += f" {node['gpu_class']}"
    return text


def node_load(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """The node's latest load, or an empty mapping when it has none."""
    load = node.get("load")
    return load if isinstance(load, dict) else {}


def load_text(load: Mapping[str, Any]) -> str:
    """``cpu 12%, load 0.50 0.40 0.30, memory 20.1 of 512 GB used``; ``-`` when none is known."""
    parts = []
    if load.get("cpu_percent") is not None:
        parts.append(f"cpu {number(load['cpu_percent'])}%")
    averages = [load.get(k) for k in ("load1", "load5", "load15")]
    if any(v is not None for v in averages):
        parts.append("load " + " ".join(DASH if v is None else f"{v:.2f}" for v in averages))
    used, available = load.get("memory_used_bytes"), load.get("memory_available_bytes")
    if used is not None and available is not None and used + available > 0:
        parts.append(
            f"memory {number(used / 2**30)} of {number((used + available) / 2**30)} GB used"
        )
    elif load.get("memory_percent") is not None:
        parts.append(f"memory {number(load['memory_percent'])}% used")
    return ", ".join(parts) or DASH


def sensors_of(load: Mapping[str, Any]) -> Mapping[str, Any]:
    """The node's sensor readings, whether nested under ``sensors`` or beside the load."""
    nested = load.get("sensors")
    return nested if isinstance(nested, dict) else load


def sensors_text(load: Mapping[str, Any]) -> str:
    """``cpu 55 °C, cpu 120 W, inlet 24 °C``: only the sensors the node has."""
    s = sensors_of(load)
    parts = []
    if s.get("cpu_temp_c") is not None:
        parts.append(f"cpu {number(s['cpu_temp_c'])} °C")
    if s.get("cpu_power_w") is not None:
        parts.append(f"cpu {number(s['cpu_power_w'])} W")
    if s.get("inlet_temp_c") is not None:
        parts.append(f"inlet {number(s['inlet_temp_c'])} °C")
    return ", ".join(parts) or DASH


def mapping_text(value: Any, sep: str = "=") -> str:
    """``{"a": "1"}`` → ``a=1``; a list is joined as it is."""
    if isinstance(value, dict):
        return joined(f"{k}{sep}{v}" if v not in (None, "") else str(k) for k, v in value.items())
    return joined(value) if isinstance(value, list) else cell(value)


def disk_text(disk: Any) -> str:
    """``800 of 1000 GB free``; ``-`` when the node did not say."""
    if not isinstance(disk, dict) or disk.get("total_gb") in (None, 0):
        return DASH
    return f"{number(disk.get('free_gb'))} of {number(disk['total_gb'])} GB free"


# Nodes


def render_nodes(nodes: list[dict[str, Any]]) -> str:
    """``ctl nodes``: a row per node."""
    if not nodes:
        return "No nodes have registered."
    rows = []
    for n in nodes:
        load1 = node_load(n).get("load1")
        rows.append(
            [
                n.get("id"),
                n.get("state"),
                gpus_cell(n),
                gb(known(n.get("memory_gb"))),
                known(n.get("cpu_count")),
                DASH if load1 is None else f"{load1:.2f}",
                len(n["replicas"]) if isinstance(n.get("replicas"), list) else None,
                age(n.get("last_seen")),
            ]
        )
    headers = ["NODE", "STATE", "GPUS", "MEMORY", "CPUS", "LOAD", "REPLICAS", "LAST SEEN"]
    return render(headers, rows)


def render_node(n: dict[str, Any]) -> str:
    """``ctl node show``: its fields as ``key: value`` lines, then its GPUs."""
    load = node_load(n)
    seen = age(n.get("last_seen"))
    pairs: list[tuple[str, Any]] = [
        ("node", n.get("id")),
        ("hostname", n.get("hostname")),
        ("state", n.get("state")),
    ]
    # Not in the interface table, but worth showing when a server sends them.
    for key, label in (("mgmt_addr", "address"), ("agent_version", "agent")):
        if n.get(key):
            pairs.append((label, n[key]))
    pairs += [
        ("labels", mapping_text(n.get("labels"))),
        ("gpus", gpus_cell(n)),
        ("memory", gb(known(n.get("memory_gb")))),
        ("cpus", known(n.get("cpu_count"))),
        ("engines", mapping_text(n.get("engines"), sep=" ")),
        ("disk", disk_text(n.get("disk"))),
        ("replicas", joined(n.get("replicas"))),
        ("load", load_text(load)),
        ("sensors", sensors_text(load)),
        ("last seen", DASH if seen == DASH else f"{seen} ago ({n['last_seen']})"),
    ]
    text = key_values(pairs)
    gpus = render_node_gpus(n)
    return f"{text}\n\n{gpus}" if gpus else text


def render_node_gpus(n: dict[str, Any]) -> str:
    """A row per GPU: what the node registered, with its latest sensor readings beside it."""
    cards = [g for g in n.get("gpus") or () if isinstance(g, dict)]
    sensors = {
        s.get("index"): s
        for s in sensors_of(node_load(n)).get("gpu_sensors") or ()
        if isinstance(s, dict)
    }
    indices = [g.get("index") for g in cards] or sorted(sensors, key=lambda i: (i is None, i))
    if not indices:
        return ""
    by_index = {g.get("index"): g for g in cards}
    rows = []
    for index in indices:
        g, s = by_index.get(index, {}), sensors.get(index, {})
        memory_mb = g.get("memory_total_mb", g.get("memory_mb"))
        power, limit = s.get("power_w"), s.get("power_limit_w")
        if power is None:
            power_text = DASH
        else:
            power_text = f"{number(power)}/{number(limit)} W" if limit else f"{number(power)} W"
        # An empty throttle list is a reading ("nothing holds it back"); a missing one is not.
        throttle = s.get("throttle")
        rows.append(
            [
                index,
                g.get("name"),
                g.get("gpu_class", g.get("class")),
                DASH if not memory_mb else gb(memory_mb / 1024),
                g.get("health") or {True: "ok", False: "unhealthy"}.get(g.get("healthy")),
                _unit(s.get("temp_c"), " °C"),
                _unit(s.get("memory_temp_c"), " °C"),
                power_text,
                "none" if throttle == [] else joined(throttle),
                _unit(s.get("utilization"), "%"),
            ]
        )
    headers = [
        "GPU",
        "NAME",
        "CLASS",
        "MEMORY",
        "HEALTH",
        "TEMP",
        "MEM TEMP",
        "POWER",
        "THROTTLE",
        "UTIL",
    ]
    return render(headers, rows)


def _unit(value: Any, unit: str) -> str:
    """``54 °C``; ``-`` when not measured."""
    return DASH if value is None else f"{number(value)}{unit}"


def cmd_nodes(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/nodes"), render_nodes)


def cmd_node_show(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/nodes/{segment(args.node)}"), render_node)


NODE_ACTIONS = {
    "cordon": "cordoned",
    "uncordon": "uncordoned",
    "drain": "draining",
    "approve": "approved",
}


def cmd_node_action(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.post(f"/nodes/{segment(args.node)}/{args.action}")
    out.show(answer, lambda a: said(a, f"node {args.node} {NODE_ACTIONS[args.action]}"))


def cmd_node_forget(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/nodes/{segment(args.node)}")
    out.show(answer, lambda a: said(a, f"node {args.node} forgotten"))


# Models


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
    """``2/2``: ready over desired."""
    return f"{cell(m.get('ready'))}/{cell(m.get('desired'))}"


def serving(m: Mapping[str, Any]) -> str:
    """``yes`` when at least one replica is ready."""
    ready = m.get("ready")
    if ready is None:
        return DASH
    return "yes" if ready > 0 else "no"


def warning_lines(models: Sequence[Mapping[str, Any]]) -> list[str]:
    """``warning: <model>: <warning>`` for each warning of each model."""
    return [f"warning: {m.get('name')}: {w}" for m in models for w in m.get("warnings") or ()]


def failure_where(f: Mapping[str, Any]) -> str:
    """``replica chat-1a2b3c on node n1, exit code 1``: where a failure happened."""
    where = f"replica {f.get('replica')}"
    if f.get("node"):
        where += f" on node {f['node']}"
    if f.get("exit_code") is not None:
        where += f", exit code {f['exit_code']}"
    return where


def failure_lines(models: Sequence[Mapping[str, Any]]) -> list[str]:
    """``failing: <model>: <the engine's last words> (<where>)`` for each model backing off
    or parked: the cause the table's status cannot hold."""
    out = []
    for m in models:
        f = m.get("last_failure")
        if not isinstance(f, dict):
            continue
        lines = [line.strip() for line in str(f.get("detail") or "").splitlines() if line.strip()]
        last = lines[-1] if lines else "no detail"
        out.append(f"failing: {m.get('name')}: {last} ({failure_where(f)})")
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


def cmd_model_remove(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/models/{segment(args.name)}")
    out.show(answer, lambda a: said(a, f"model {args.name} removed"))


def render_explain(e: dict[str, Any]) -> str:
    """``ctl model explain``: each profile with the reasons it was not placed."""
    model = e.get("model")
    explanation = e.get("explanation") or []
    if e.get("unplaceable"):
        head = f"{model} cannot be placed"
    elif explanation:
        head = f"{model}: its last placement failed"
    else:
        head = f"{model}: no failed placement to explain"
    if e.get("reason"):
        head += f": {e['reason']}"
    lines = [head, *(e.get("installing") or [])]
    for item in explanation:
        lines.append(f"profile {item.get('profile')}:")
        reasons = item.get("reasons") or []
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


# Scaling and lifecycle


def cmd_scale(api: Api, args: argparse.Namespace, out: Output) -> None:
    body: dict[str, Any] = {"min": args.min}
    if args.max is not None:
        body["max"] = args.max
    if args.idle_timeout is not None:
        body["idle_timeout"] = args.idle_timeout
    answer = api.post(f"/models/{segment(args.name)}/scale", body)

    def sentence(a: Any) -> str:
        got = a if isinstance(a, dict) else {}
        lo, hi = got.get("min", args.min), got.get("max", args.max)
        return said(a, f"{args.name}: min {lo}, max {cell(hi)}")

    out.show(answer, sentence)


def cmd_restart(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.post(f"/models/{segment(args.model)}/restart")
    default = f"restarting {args.model}: each replica is replaced in turn, a new one first"
    out.show(answer, lambda a: said(a, default))


def cmd_retry(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.post(f"/models/{segment(args.name)}/retry")
    out.show(answer, lambda a: said(a, f"{args.name}: failures cleared; it will be placed again"))


# Replicas and the reconciler


def shard_gpus(shards: Sequence[Mapping[str, Any]]) -> str:
    """``n1:0,1,2,3 n2:0,1,2,3``: each shard's node and GPU indices; ``-`` for CPU replicas."""
    parts = [
        f"{s.get('node')}:{','.join(str(i) for i in s['gpu_indices'])}"
        for s in shards
        if s.get("gpu_indices")
    ]
    return " ".join(parts) or DASH


def render_replicas(replicas: list[dict[str, Any]]) -> str:
    """``ctl replicas``: a row per replica with its shards' nodes and GPUs."""
    if not replicas:
        return "No replicas."
    rows = []
    for r in replicas:
        shards = sorted(
            (s for s in r.get("shards") or () if isinstance(s, dict)),
            key=lambda s: (s.get("rank") is None, s.get("rank") or 0),
        )
        nodes = list(dict.fromkeys(s.get("node") for s in shards if s.get("node")))
        state = cell(r.get("state"))
        fetching = r.get("fetching")
        if isinstance(fetching, dict):
            state = f"fetching {fetched_said(fetching.get('done'), fetching.get('total'))}"
        if r.get("outdated"):
            state += " (outdated)"
        rows.append(
            [
                r.get("id"),
                r.get("model"),
                r.get("profile"),
                state,
                joined(nodes),
                shard_gpus(shards),
                r.get("endpoint"),
                age(r.get("created_at")),
            ]
        )
    headers = ["REPLICA", "MODEL", "PROFILE", "STATE", "NODES", "GPUS", "ENDPOINT", "AGE"]
    return render(headers, rows)


def cmd_replicas(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/replicas", model=args.model), render_replicas)


def event_line(event: Any) -> str:
    """One reconciler event as a line, whether the server sent a sentence or an object."""
    if isinstance(event, dict):
        for key in ("message", "detail", "event"):
            if isinstance(event.get(key), str):
                return event[key]
        return " ".join(f"{k}={v}" for k, v in event.items())
    return str(event)


def render_reconcile(answer: Any) -> str:
    """``ctl reconcile``: what the pass did, or that there was nothing to do."""
    events = answer.get("events") if isinstance(answer, dict) else None
    if not events:
        return said(answer, "nothing to do")
    return "\n".join(event_line(e) for e in events)


def cmd_reconcile(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.post("/reconcile"), render_reconcile)


# The command line


def _global_options() -> argparse.ArgumentParser:
    """The options every command takes, before or after its name.

    Their defaults are SUPPRESS so a subcommand's parser does not overwrite a
    value given before the subcommand; :func:`settings` fills in the defaults.
    """
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("global options")
    g.add_argument(
        "--server",
        default=argparse.SUPPRESS,
        help=f"the control plane's URL (env LLMGW_SERVER, else {DEFAULT_SERVER})",
    )
    g.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="an admin token from `llmgw createtoken NAME` (env LLMGW_TOKEN)",
    )
    g.add_argument(
        "--actor",
        default=argparse.SUPPRESS,
        help="who is acting, recorded beside each change (default: the token's name)",
    )
    g.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the server's JSON as it came instead of a table",
    )
    g.add_argument(
        "--timeout",
        type=positive_number,
        default=argparse.SUPPRESS,
        help=f"seconds to wait for the server (default {number(DEFAULT_TIMEOUT_S)})",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    """The ``llmgw ctl`` argument parser, every command with its handler."""
    common = _global_options()
    parser = argparse.ArgumentParser(
        prog="llmgw ctl",
        description="Operate an llmgw control plane through its REST API.",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(group: Any, name: str, help: str, handler: Handler | None = None) -> Any:
        sub = group.add_parser(name, help=help, description=help, parents=[common])
        if handler:
            sub.set_defaults(handler=handler)
        return sub

    add(commands, "nodes", "list nodes: state, GPUs, memory, CPUs, load", cmd_nodes)
    node = add(commands, "node", "show, cordon, uncordon, drain, approve or forget one node")
    node_actions = node.add_subparsers(dest="action", required=True, metavar="ACTION")
    add(node_actions, "show", "one node in full, with its GPUs", cmd_node_show).add_argument("node")
    for action, help in (
        ("cordon", "place nothing new on a node"),
        ("uncordon", "let placement use a node again"),
        ("drain", "cordon a node and move its replicas elsewhere"),
        ("approve", "let a node held by LLMGW_NODE_APPROVAL=manual into placement"),
    ):
        add(node_actions, action, help, cmd_node_action).add_argument("node")
    add(
        node_actions,
        "forget",
        "remove a node and revoke its credential; it can join again only with a join token",
        cmd_node_forget,
    ).add_argument("node")

    add(commands, "models", "list models: replicas, status, class, reservations", cmd_models)
    model_actions = _add_model_commands(add, commands)
    # Imported here: those modules build on this one's client and output.
    from llmgw.cli import (
        ctl_bench,
        ctl_capacity,
        ctl_engines,
        ctl_keys,
        ctl_logs,
        ctl_quota,
        ctl_usage,
        ctl_weights,
    )

    ctl_quota.register(add, commands, model_actions)
    ctl_capacity.register(add, commands, model_actions)
    ctl_keys.register(add, commands)
    ctl_usage.register(add, commands)
    ctl_bench.register(add, commands)
    ctl_logs.register(add, commands)
    ctl_weights.register(add, commands, model_actions)
    ctl_engines.register(add, commands)

    scale = add(commands, "scale", "set how many replicas a model runs", cmd_scale)
    scale.add_argument("name")
    scale.add_argument("--min", type=whole_number, required=True, help="replicas it always runs")
    scale.add_argument(
        "--max", type=whole_number, help="the most under load (left out: follows --min)"
    )
    scale.add_argument(
        "--idle-timeout",
        type=duration,
        help="how long an on-demand model stays up unused: seconds, or 90s, 10m, 1h",
    )
    restart = add(commands, "restart", "replace a model's replicas one at a time", cmd_restart)
    restart.add_argument("--model", required=True)
    retry = add(commands, "retry", "clear a parked model's failures and place it again", cmd_retry)
    retry.add_argument("name")

    replicas = add(commands, "replicas", "list replicas and where they run", cmd_replicas)
    replicas.add_argument("--model", help="only this model's")
    add(commands, "reconcile", "run one reconciler pass now and show what it did", cmd_reconcile)
    return parser


def _add_model_commands(add: Callable[..., Any], commands: Any) -> Any:
    """The ``model`` subcommands; returns their group, which other modules add to."""
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
    add(actions, "remove", "remove a runtime model", cmd_model_remove).add_argument("name")
    add(actions, "explain", "why its last placement failed", cmd_model_explain).add_argument("name")
    return actions


def settings(args: argparse.Namespace) -> tuple[str, str, str | None, float, bool]:
    """Server, token, actor, timeout and --json, from the options, else the environment."""
    server = getattr(args, "server", None) or os.environ.get("LLMGW_SERVER") or DEFAULT_SERVER
    if "://" not in server:
        server = f"http://{server}"
    token = getattr(args, "token", None) or os.environ.get("LLMGW_TOKEN") or ""
    return (
        server.rstrip("/"),
        token.strip(),
        getattr(args, "actor", None) or None,
        getattr(args, "timeout", DEFAULT_TIMEOUT_S),
        getattr(args, "json", False),
    )


def main(argv: list[str] | None = None, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run ``llmgw ctl`` with ``argv`` (the arguments after ``ctl``) and return the exit status.

    ``transport`` replaces httpx's network transport, so tests can answer with
    ``httpx.MockTransport``.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has already printed
        return exc.code if isinstance(exc.code, int) else 2
    server, token, actor, timeout, as_json = settings(args)
    if not token:
        print(
            "error: no token: set LLMGW_TOKEN or pass --token "
            "(an admin token, made with `llmgw createtoken NAME`)",
            file=sys.stderr,
        )
        return 2
    try:
        with Api(
            server=server, token=token, actor=actor, timeout=timeout, transport=transport
        ) as api:
            args.handler(api, args, Output(as_json=as_json))
    except CtlError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        # Ctrl-C while a call is in flight: what the server did with it is unknown.
        print("stopped by Ctrl-C; a change already sent may have been made", file=sys.stderr)
        return 130
    return 0


__all__ = ["Api", "CtlError", "build_parser", "main"]
