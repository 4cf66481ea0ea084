"""``llmgw ctl key``: gateway API keys for projects, made, listed, revoked, and their
priority bands under overload set."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, Output, whole_number
from llmgw.cli.tables import DASH, render
from tenancy.bands import BANDS

KEY_HEADERS = ["ID", "NAME", "PREFIX", "PROJECT", "MODELS", "LIMITS", "BAND", "STATE"]


def limits_cell(key: Mapping[str, Any]) -> str:
    parts = []
    if key.get("requests_per_minute") is not None:
        parts.append(f"{key['requests_per_minute']:,} req/min")
    if key.get("tokens_per_minute") is not None:
        parts.append(f"{key['tokens_per_minute']:,} tok/min")
    if key.get("max_tokens") is not None:
        parts.append(f"≤ {key['max_tokens']:,} tok/request")
    return ", ".join(parts) or DASH


def render_keys(keys: list[Mapping[str, Any]]) -> str:
    """``ctl key list``: a row per key, by its prefix; never a secret."""
    if not keys:
        return "No API keys yet: llmgw ctl key create --project ORG/TEAM/PROJECT NAME"
    rows = [
        [
            k.get("id"),
            k.get("name"),
            f"{k.get('prefix')}…",
            k.get("project"),
            ", ".join(k.get("models") or ()) or "all",
            limits_cell(k),
            k.get("band") or DASH,
            "revoked" if k.get("revoked_at") else "live",
        ]
        for k in keys
    ]
    return render(KEY_HEADERS, rows)


def key_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"project": args.project, "name": args.name}
    if args.models:
        body["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    limits = {
        k: v
        for k, v in (
            ("requests_per_minute", args.rpm),
            ("tokens_per_minute", args.tpm),
            ("max_tokens", args.max_tokens),
        )
        if v is not None
    }
    if limits:
        body["limits"] = limits
    if args.band:
        body["band"] = args.band
    return body


def cmd_key_create(api: Api, args: argparse.Namespace, out: Output) -> None:
    made = api.post("/keys", key_body(args))
    # The secret alone on the last line, as createtoken prints its own: easy to capture.
    out.show(
        made,
        lambda m: (
            f"API key {m['name']} ({m['prefix']}…) made; its secret, shown only now:\n{m['secret']}"
        ),
    )


def cmd_key_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/keys"), render_keys)


def cmd_key_revoke(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/keys/{args.id}")
    out.show(answer, lambda a: f"API key {a['revoked']} revoked: the gateway refuses it now")


def cmd_key_band(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.put("/bands", {"scope": args.scope, "band": args.band})
    out.show(
        answer,
        lambda a: f"{a['scope']} is in band {a['band'] or 'of its project'} from the next refresh",
    )


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``key create|list|revoke|band`` to the commands."""
    key = add(commands, "key", "gateway API keys for projects: create, list, revoke")
    actions = key.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = add(
        actions, "create", "make a key for a project; its secret is shown once", cmd_key_create
    )
    create.add_argument("name")
    create.add_argument("--project", required=True, help="ORG/TEAM/PROJECT, or the project's ID")
    create.add_argument("--models", help="the models it may use, comma-separated (default: all)")
    create.add_argument("--rpm", type=whole_number, help="requests per minute, at most")
    create.add_argument("--tpm", type=whole_number, help="tokens per minute, at most")
    create.add_argument(
        "--max-tokens", type=whole_number, help="the most max_tokens one request may ask for"
    )
    create.add_argument(
        "--band", choices=BANDS, help="its priority under overload (default: its project's)"
    )
    band = add(
        actions, "band", "set a key's (key:ID) or a project's band under overload", cmd_key_band
    )
    band.add_argument("scope", help="key:ID, or project:ORG/TEAM/PROJECT")
    band.add_argument("band", help="low, normal or high; for a key, '' for its project's")
    add(actions, "list", "every key, by its prefix", cmd_key_list)
    add(actions, "revoke", "refuse a key from now on", cmd_key_revoke).add_argument(
        "id", type=whole_number
    )
