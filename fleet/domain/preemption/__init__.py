"""Preemption (domain.md, both Preemption sections): which replicas to stop so a model fits.

- `search.py`: `preempt()`, the search: victim sets built per node (per fabric) and
  tried on a copy of the room.
- `candidates.py`: who may be taken, and in which tier; who is protected, and why.
- `context.py`: what a pass knows that preemption reads (`Context`).
- `reserved.py`: the room kept for a model while its victims free it.
- `not_taken.py`: the sentences for what is not taken.
- `victims.py`: what preemption answers (`Preemption`), its tiers and limits.

It may import `catalog.domain`, `tenancy.quota` and the fleet's other pure rules
(`fleet.domain.placement`, `holdings`, `types`), nothing else: no Django, no clock,
no I/O. The reconciler's step (`starting.py`) and the questions that change nothing
(`capacity.py`) come in through the names below.
"""

from .context import Context, context
from .reserved import live_reservations, place_kept, reserved_amount
from .search import preempt
from .victims import Preemption

__all__ = [
    "Context",
    "Preemption",
    "context",
    "live_reservations",
    "place_kept",
    "preempt",
    "reserved_amount",
]
