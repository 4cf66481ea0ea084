"""What a node's drain waits for, in a sentence (issue 37): a drain whose replicas find no
room for their replacements is stuck, and says why (placement's one line) and when its
replicas stop without one.

The reconciler runs the drain (stopping.py: `retire`, and `_drain_ended` when the node
is uncordoned); this only says how it stands, for `ctl nodes`, the node page, "Needs
attention" and a restart asked meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime


def drain_stuck(
    retiring: Sequence[tuple[str, str, datetime | None]], why: Mapping[str, str]
) -> str:
    """ "stuck: no room for chat's replacement (<why>); chat-1 stops at 12:05:00 UTC", or ""
    while nothing is stuck. `retiring` is the drain's replicas (id, model, deadline); `why`
    the one line of each model that cannot be placed now."""
    stuck = [(rid, m, d) for rid, m, d in retiring if m in why]
    if not stuck:
        return ""
    per_model: dict[str, int] = {}
    for _, m, _ in stuck:
        per_model[m] = per_model.get(m, 0) + 1
    parts = [
        f"no room for {m}'s replacement{'' if n == 1 else 's'} ({why[m]})"
        for m, n in per_model.items()
    ]
    deadlines = [d for _, _, d in stuck if d is not None]
    if deadlines:
        first = min(deadlines)
        who = stuck[0][0] if len(stuck) == 1 else "the first of them"
        parts.append(f"{who} stops at {first:%H:%M:%S} UTC")
    return "stuck: " + "; ".join(parts)
