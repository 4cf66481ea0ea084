"""Where a replica can run: filters that refuse nodes in sentences, scorers that order the
rest, and the inventory of free room that a pass places into.

- `room.py`: one node's free room (`NodeRoom`) and what one placement asks (`Ask`).
- `filters.py`: each refusal a named filter with its sentence, in `FILTERS` order;
  `refuse` asks them in turn.
- `scorers.py`: each preference a named scorer, in `SCORERS` order; `score` is the key
  eligible nodes are sorted by.
- `fabric.py`: the nodes a profile over several nodes takes together: one NVLink
  domain with IMEX up, else one `llmgw.io/fabric` label.
- `inventory.py`: `Inventory`, the room on every node updated as a pass places, and
  `place`, which composes the three above.
- `outcome.py`: what placing answers: a `Placement` or a `Refusal`.

It may import `catalog.domain` and the fleet's other pure rules (`fleet.domain.types`,
`power`, `spread`, `refusals`), nothing else: no Django, no clock, no I/O.
"""

from .filters import could_ever_run, engine_refusal, refuse
from .inventory import INDEX_FROM, Inventory
from .outcome import MAX_REASONS_PER_PROFILE, Placement, Refusal, ShardPlan
from .room import NodeRoom

__all__ = [
    "INDEX_FROM",
    "MAX_REASONS_PER_PROFILE",
    "Inventory",
    "NodeRoom",
    "Placement",
    "Refusal",
    "ShardPlan",
    "could_ever_run",
    "engine_refusal",
    "refuse",
]
