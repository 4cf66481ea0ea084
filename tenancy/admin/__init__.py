"""Tenancy in Django admin: one line per record, with the columns an operator looks for.

Writes go through the tenancy services where there is one (adding an
organization, team or project; setting and clearing a quota or a scope's
limits), so admin keeps their rules and leaves the same audit trail as the API,
the CLI and the pages. An API key's secret is made here and shown once, in the
message after it is added; only its hash and first characters are kept.

Each part registers its models as it is imported here, so Django's autodiscovery
of `tenancy.admin` finds them all: the tree (tree.py), API keys and tokens
(keys.py), quotas and scope limits (limits.py), spend budgets and model prices
(budgets.py), and the audit trail (audit.py).
"""

from . import audit, budgets, keys, limits, tree  # noqa: F401 (imported to register)
