"""``llmgw ctl org|team|project create|list|rename``: the tenancy tree keys, quotas and
limits hang on, each named by its path (`Acme`, `Acme/ml`, `Acme/ml/training`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, CtlError, Output, segment
from llmgw.cli.tables import render

# kind: (the API's collection, the path's parts, what holds it, an example path)
KINDS = {
    "org": ("orgs", 1, None, "Acme"),
    "team": ("teams", 2, "org", "Acme/ml"),
    "project": ("projects", 3, "team", "Acme/ml/training"),
}
NOUNS = {"org": "organization", "team": "team", "project": "project"}


def split(kind: str, path: str) -> tuple[str, str]:
    """(parent, name) of `Acme/ml/training` for its kind; CtlError (exit 2) for a path of
    the wrong length."""
    _, parts, _, example = KINDS[kind]
    names = [p.strip() for p in path.split("/")]
    if len(names) != parts or not all(names):
        raise CtlError(f"give the {NOUNS[kind]} as {'/'.join(['NAME'] * parts)}, e.g. {example}", 2)
    return "/".join(names[:-1]), names[-1]


def render_tree(kind: str, rows: list[Mapping[str, Any]]) -> str:
    if not rows:
        example = KINDS[kind][3]
        return f"No {NOUNS[kind]}s yet: llmgw ctl {kind} create {example}"
    return render(["ID", "PATH"], [[r.get("id"), r.get("path") or r.get("name")] for r in rows])


def _create(kind: str) -> Callable[[Api, argparse.Namespace, Output], None]:
    collection, _, parent_field, _ = KINDS[kind]

    def run(api: Api, args: argparse.Namespace, out: Output) -> None:
        parent, name = split(kind, args.path)
        body = {"name": name} if parent_field is None else {parent_field: parent, "name": name}
        made = api.post(f"/{collection}", body)
        out.show(
            made, lambda m: f"{NOUNS[kind]} {m.get('path') or m['name']} added ({kind}:{m['id']})"
        )

    return run


def _list(kind: str) -> Callable[[Api, argparse.Namespace, Output], None]:
    def run(api: Api, args: argparse.Namespace, out: Output) -> None:
        out.show(api.get(f"/{KINDS[kind][0]}"), lambda rows: render_tree(kind, rows))

    return run


def _rename(kind: str) -> Callable[[Api, argparse.Namespace, Output], None]:
    def run(api: Api, args: argparse.Namespace, out: Output) -> None:
        ref = args.path.strip()
        if not ref.isdigit():
            split(kind, ref)
        path = "/".join(segment(p.strip()) for p in ref.split("/"))
        answer = api.request("PATCH", f"/{KINDS[kind][0]}/{path}", body={"name": args.name})
        out.show(
            answer,
            lambda a: f"{NOUNS[kind]} {ref} is now {a.get('path') or a['name']} ({kind}:{a['id']})",
        )

    return run


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``org|team|project create|list|rename`` to the commands."""
    for kind, (_, _, _, example) in KINDS.items():
        noun = NOUNS[kind]
        parser = add(commands, kind, f"{noun}s of the tenancy tree: create, list, rename")
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        add(actions, "create", f"add a {noun}", _create(kind)).add_argument(
            "path", metavar="PATH", help=f"its path, e.g. {example}"
        )
        add(actions, "list", f"every {noun}, by its path", _list(kind))
        rename = add(actions, "rename", f"give a {noun} another name", _rename(kind))
        rename.add_argument("path", metavar="PATH", help=f"its path ({example}) or ID")
        rename.add_argument("name", metavar="NEW_NAME")
