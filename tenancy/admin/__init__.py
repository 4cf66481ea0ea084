"""Tenancy in Django admin: one line per record, with the columns an operator looks for.

Writes go through the tenancy services where there is one (adding an
organization, team or project; setting and clearing a quota or a scope's
limits), so admin keeps their rules and leaves the same audit trail as the API,
the CLI and the pages. An API key's secret is made here and shown once, in the
message after it is added; only its hash and first characters are kept.

Each part registers its models as it is imported here, so Django's autodiscovery
of `tenancy.admin` finds them all: the tree (tree.py), API keys and tokens
(keys.py), quotas and scope limits (limits.py), and the audit trail (audit.py).
"""

from .audit import AuditEventAdmin
from .keys import (
    KEY_PREFIX_LENGTH,
    KEY_SECRET_PREFIX,
    ApiKeyAdmin,
    ApiKeyForm,
    KeyState,
    TokenAdmin,
)
from .limits import (
    LARGEST,
    RESOURCE_WORDS,
    CapacityQuotaAdmin,
    QuotaForm,
    ScopedAdmin,
    ScopeLimitAdmin,
    ScopeLimitForm,
)
from .tree import (
    NamedForm,
    OrganizationAdmin,
    OrganizationForm,
    ProjectAdmin,
    ProjectForm,
    TeamAdmin,
    TeamForm,
    TenancyAdmin,
)

__all__ = [
    "KEY_PREFIX_LENGTH",
    "KEY_SECRET_PREFIX",
    "LARGEST",
    "RESOURCE_WORDS",
    "ApiKeyAdmin",
    "ApiKeyForm",
    "AuditEventAdmin",
    "CapacityQuotaAdmin",
    "KeyState",
    "NamedForm",
    "OrganizationAdmin",
    "OrganizationForm",
    "ProjectAdmin",
    "ProjectForm",
    "QuotaForm",
    "ScopeLimitAdmin",
    "ScopeLimitForm",
    "ScopedAdmin",
    "TeamAdmin",
    "TeamForm",
    "TenancyAdmin",
    "TokenAdmin",
]
