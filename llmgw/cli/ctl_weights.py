"""``llmgw ctl weights``: weights in the mirror, added, listed, shown, planned, retried,
removed; and ``llmgw ctl model serve``: a llama.cpp model (GGUF) or a vLLM model
(safetensors) sized from them."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, CtlError, Output, whole_number
from llmgw.cli.tables import DASH, render, size

WEIGHTS_HEADERS = ["ID", "STATE", "PROGRESS", "SOURCE", "MODELS", "ADDED"]
WAIT_POLL_S = 1.0


def progress(w: Mapping[str, Any]) -> str:
    done, total = w.get("bytes_done") or 0, w.get("bytes_total")
    if w.get("state") == "ready":
        return size(total)
    if not total:
        return f"{size(done)} of {DASH}"
    return f"{size(done)} of {size(total)} ({100 * done / total:.0f}%)"


def render_weights(weights: list[Mapping[str, Any]]) -> str:
    if not weights:
        return "No weights yet: llmgw ctl weights add hf://ORG/REPO[/FILE]"
    rows = [
        [
            w["id"],
            w["state"],
            progress(w),
            w["source"],
            ", ".join(w.get("models") or ()) or DASH,
            f"{str(w.get('added_at', ''))[:16].replace('T', ' ')} by {w.get('added_by') or DASH}",
        ]
        for w in weights
    ]
    failed = [f"weights {w['id']}: {w['detail']}" for w in weights if w["state"] == "failed"]
    return "\n".join([render(WEIGHTS_HEADERS, rows), *failed])


def render_one(w: Mapping[str, Any]) -> str:
    lines = [
        f"weights {w['id']}: {w['source']}",
        f"  state:     {w['state']}{': ' + w['detail'] if w.get('detail') else ''}",
        f"  progress:  {progress(w)}",
    ]
    if w.get("revision"):
        lines.append(f"  revision:  {w['revision']}")
    lines.append(f"  added:     {w.get('added_at')} by {w.get('added_by')}")
    lines.append(f"  last used: {w.get('last_used_at') or 'never'}")
    lines.append(f"  models:    {', '.join(w.get('models') or ()) or 'none'}")
    rows = [
        [f["path"], f["state"], size(f.get("size")), f.get("sha256") or DASH] for f in w["files"]
    ]
    lines += ["", render(["FILE", "STATE", "SIZE", "SHA256"], rows)]
    lines += [f"{f['path']}: {f['detail']}" for f in w["files"] if f.get("detail")]
    return "\n".join(lines)


def render_gpus(plan: Mapping[str, Any]) -> list[str]:
    """A line per GPU class present: its tp and what it holds, or why nothing fits."""
    lines = []
    for g in plan.get("gpus") or ():
        if g.get("tp") is None:
            lines.append(f"{g['gpu_class']}: does not fit. {g['said']}")
            continue
        where = ", ".join(g["fits"]) or "no node now"
        lines.append(
            f"{g['gpu_class']}: tp {g['tp']}"
            + (f" over {g['nodes']} nodes" if (g.get("nodes") or 1) > 1 else "")
            + f", {g['sequences']:,} {'sequence' if g['sequences'] == 1 else 'sequences'} "
            f"of {plan['ctx']:,}; fits on: {where}. {g['said']}"
        )
        lines += [f"  {b}" for b in g["blocked"]]
        if g.get("quota"):
            lines.append(f"  {g['quota']}")
    return lines


def render_plan(plan: Mapping[str, Any]) -> str:
    head = (
        f"{plan['architecture']}, {plan['parameters']:,} parameters, {plan['quantization']}, "
        f"trained on {plan['context_length']:,} tokens"
    )
    if plan.get("format") == "safetensors":
        lines = [head, plan["basis"], f"on GPUs (vLLM, a sequence of {plan['ctx']:,}):"]
        gpus = render_gpus(plan)
        return "\n".join(lines + ([f"  {g}" for g in gpus] or ["  no node has GPUs"]))
    fits = ", ".join(plan["fits"]) or "no node now"
    lines = [
        head,
        f"needs {plan['memory_gb']} GB and {plan['cpu_cores'] or DASH} cores at a context pool "
        f"of {plan['ctx']:,}: {plan['basis']}",
        f"fits on: {fits}",
    ]
    lines += [f"  {b}" for b in plan["blocked"]]
    if plan.get("quota"):
        lines.append(f"  {plan['quota']}")
    gpus = render_gpus(plan)
    if gpus:
        lines += ["on GPUs (llama.cpp -ngl 999):", *(f"  {g}" for g in gpus)]
    return "\n".join(lines)


def _plan_query(args: argparse.Namespace) -> dict[str, Any]:
    pairs = (
        ("ctx", args.ctx),
        ("file", args.file),
        ("gpu_memory_utilization", args.gpu_memory_utilization),
        ("selector", ",".join(args.selector) if args.selector else None),
        ("owner", args.owner),
        ("kv_cache_dtype", args.kv_cache_dtype),
    )
    return {k: v for k, v in pairs if v is not None}


def cmd_weights_plan(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/weights/{args.id}/plan", **_plan_query(args)), render_plan)


def _wait(api: Api, weights_id: int, out: Output) -> Mapping[str, Any]:
    last = ""
    while True:
        w = api.get(f"/weights/{weights_id}")
        if w["state"] in ("ready", "failed"):
            return w
        line = f"weights {weights_id}: {w['state']}, {progress(w)}"
        if line != last:
            out.say(line)
            last = line
        time.sleep(WAIT_POLL_S)


def cmd_weights_add(api: Api, args: argparse.Namespace, out: Output) -> None:
    body = {"source": args.source}
    if args.sha256:
        body["sha256"] = args.sha256
    w = api.post("/weights", body)
    if args.wait:
        w = _wait(api, w["id"], out)
        if w["state"] == "failed":
            raise CtlError(f"weights {w['id']} failed: {w['detail']}")
    out.show(w, render_one)


def cmd_weights_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/weights"), render_weights)


def cmd_weights_show(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/weights/{args.id}"), render_one)


def cmd_weights_retry(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.post(f"/weights/{args.id}/retry", {}), render_one)


def cmd_weights_rm(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.delete(f"/weights/{args.id}")
    out.say(f"weights {args.id} removed, with the files nothing else holds")


def _selector(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        for part in item.split(","):
            key, eq, value = part.partition("=")
            if not eq or not key or not value:
                raise CtlError(f"--selector takes KEY=VALUE, not {part!r}.")
            out[key] = value
    return out


def cmd_model_serve(api: Api, args: argparse.Namespace, out: Output) -> None:
    query = _plan_query(args)
    selector = _selector(args.selector)
    plan = api.get(f"/weights/{args.weights}/plan", **query)
    if not args.apply:
        out.show(
            plan,
            lambda p: (
                render_plan(p)
                + f"\nadd it with: llmgw ctl model serve {args.weights} --name {args.name} --apply"
            ),
        )
        return
    query.pop("selector", None)
    body: dict[str, Any] = {"weights": args.weights, "name": args.name, **query}
    extra = (
        ("gpu_class", args.gpu_class),
        ("cores", args.cores),
        ("memory_gb", args.memory),
        ("node_selector", selector or None),
    )
    body.update({k: v for k, v in extra if v is not None})
    if args.max is not None:
        body["scaling"] = {"min": args.min if args.min is not None else 1, "max": args.max}
    elif args.min is not None:
        body["scaling"] = {"min": args.min, "max": max(args.min, 1)}
    model = api.post("/models/serve", body)
    out.show(
        model,
        lambda m: (
            render_plan(plan)
            + f"\nmodel {m['name']} added: llmgw ctl models, llmgw ctl replicas --model {m['name']}"
        ),
    )


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``weights add|list|show|plan|retry|rm`` and ``model serve``."""
    model_actions = groups["model"]
    weights = add(commands, "weights", "weights in the mirror: add, list, show, plan, retry, rm")
    actions = weights.add_subparsers(dest="action", required=True, metavar="ACTION")
    added = add(actions, "add", "add weights by source; the mirror fetches them", cmd_weights_add)
    added.add_argument("source", help="hf://ORG/REPO[@REV][/PATH-OR-GLOB], https://…, or a path")
    added.add_argument("--sha256", help="the file's digest, for an https:// or a local file")
    added.add_argument("--wait", action="store_true", help="wait until fetched, showing progress")
    add(actions, "list", "every weights, with its state and progress", cmd_weights_list)
    for name, help, handler in (
        ("show", "one weights with its files and digests", cmd_weights_show),
        ("retry", "fetch failed files again from their first try", cmd_weights_retry),
        ("rm", "delete weights no model uses", cmd_weights_rm),
    ):
        add(actions, name, help, handler).add_argument("id", type=whole_number)
    planned = add(
        actions,
        "plan",
        "what the weights need, on CPU and on each GPU class, and where they fit now",
        cmd_weights_plan,
    )
    planned.add_argument("id", type=whole_number)
    _plan_flags(planned)
    serve = add(
        model_actions,
        "serve",
        "size a model from mirror weights (llama.cpp for GGUF, vLLM for safetensors); "
        "--apply adds it",
        cmd_model_serve,
    )
    serve.add_argument(
        "weights", type=whole_number, help="the weights' id (llmgw ctl weights list)"
    )
    serve.add_argument("--name", required=True, help="the model's name in the catalog")
    _plan_flags(serve)
    serve.add_argument(
        "--gpu-class", help="serve on this GPU class only (default: each class that fits)"
    )
    serve.add_argument("--cores", type=whole_number, help="CPU cores a replica reserves")
    serve.add_argument("--memory", type=float, help="GB of memory a replica reserves")
    serve.add_argument("--min", type=whole_number, help="replicas it always runs (default 1)")
    serve.add_argument("--max", type=whole_number, help="the most under load")
    serve.add_argument("--apply", action="store_true", help="add the model, not only show the plan")


def _plan_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ctx", type=whole_number, help="tokens: the context pool (GGUF), a sequence (vLLM)"
    )
    parser.add_argument("--file", help="which GGUF file, when the weights hold several")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="the share of each GPU's memory vLLM may take (default 0.9)",
    )
    parser.add_argument(
        "--selector",
        action="append",
        metavar="KEY=VALUE",
        help="only nodes with this label (repeat for several)",
    )
    parser.add_argument(
        "--owner", help="the owner (org, team or project) whose capacity limit applies"
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
        help="vLLM's KV cache dtype (default auto: the model's 16-bit one; fp8 halves it)",
    )
