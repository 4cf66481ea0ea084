"""Priority bands under overload: a key's own, or its project's (llmgw/gateway/bands.py
refuses the lowest band present first). Set by operators, audited."""

from __future__ import annotations

import logging

from django.db import transaction

from llmgw.core.errors import Invalid

from ..models import ApiKey, Project
from ..selectors import scope_tree
from . import audit_record, band_checked
from .budgets import budget_scope

log = logging.getLogger("llmgw.tenancy")


def band_set(*, scope: str, band: object, actor: str) -> str:
    """Set a key's (`key:ID`) or a project's priority band under overload; return its key.
    A key's band set empty is its project's again. Invalid for another kind of scope. The
    gateway reads keys whole every few seconds, so a band needs no fingerprint of its own."""
    with transaction.atomic():
        key = budget_scope(scope, scope_tree())
        kind, _, raw = key.partition(":")
        if kind not in ("key", "project"):
            raise Invalid(f"a band belongs to a key (key:ID) or a project, not {kind}:…")
        value = band_checked(band, blank=kind == "key")
        rows = ApiKey.objects if kind == "key" else Project.objects
        rows.filter(pk=int(raw)).update(band=value)
        audit_record(actor=actor, action="band.set", target=key, detail={"band": value})
    log.info("band of %s set to %s by %s", key, value or "its project's", actor)
    return key
