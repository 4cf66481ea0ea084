"""Priority bands under overload (issue 39, item 6): the names a key or a project may carry,
lowest first, and the one a project has until an operator sets another. The one place
they are named: the models' choices, the services' check, the gateway's rules
(llmgw/gateway/bands.py) and `ctl key` read them here. Pure: no Django.
"""

from __future__ import annotations

BANDS = ("low", "normal", "high")  # lowest first
DEFAULT = "normal"
