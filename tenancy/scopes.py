"""Scope names (domain.md, Tenancy): `org:Acme`, `team:Acme/ml`, `project:Acme/ml/training`.

Pure: the caller hands in every scope's path, read at one moment. A name that
could mean two scopes is refused rather than guessed, since a quota or an
owner set on the wrong team is worse than a question.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

KINDS = ("org", "team", "project")
# How a scope is stored and how owners are written: `org:9`, `team:7`, `project:12`.
KEY_RE = re.compile(r"^(org|team|project):[0-9]+$")
PLURALS = {"org": "organizations", "team": "teams", "project": "projects"}
# Far longer than any path of three 100-character names; refused before any comparison.
LONGEST = 400


class ScopeError(ValueError):
    """A scope name that names no scope, or several; the message says which, in a sentence."""


def _normal(path: str) -> str:
    """A path compared without case and without spaces around each segment."""
    return "/".join(part.strip().casefold() for part in path.split("/"))


def scope_resolve(text: str, paths: Mapping[str, str]) -> str:
    """The scope key (`team:7`) that `text` names, or raise ScopeError saying why not.

    `paths` maps every scope key to its path (`team:7` → `Acme/ml`). `text` is
    `KIND:ID` or `KIND:PATH`. An exact ID wins; then the full path, compared
    without case and surrounding spaces per segment; then the last segment
    alone when exactly one scope of that kind has it.
    """
    if not isinstance(text, str) or len(text) > LONGEST:
        raise ScopeError(f"a scope name is text of at most {LONGEST} characters")
    kind, colon, what = text.strip().partition(":")
    kind, what = kind.strip().lower(), what.strip()
    if not colon or kind not in KINDS or not what.replace("/", "").strip():
        raise ScopeError(f'"{text}" is not org:NAME, team:ORG/TEAM or project:ORG/TEAM/PROJECT')
    key = f"{kind}:{what}"
    if key in paths:
        return key
    mine = {k: _normal(p) for k, p in paths.items() if k.startswith(f"{kind}:")}
    wanted = _normal(what)
    found = sorted(k for k, p in mine.items() if p == wanted)
    if not found:
        # Its own name alone (ml rather than Acme/ml), when that is unique.
        found = sorted(k for k, p in mine.items() if p.rsplit("/", 1)[-1] == wanted)
    if not found:
        raise ScopeError(f'there is no {kind} "{what}"')
    if len(found) > 1:
        raise ScopeError(f'"{what}" could be any of {len(found)} {PLURALS[kind]}; give its ID')
    return found[0]
