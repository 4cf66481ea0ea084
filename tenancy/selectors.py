"""Tenancy reads."""

from __future__ import annotations

from llmgw.secrets import digest

from .models import Token


def token_find(*, secret: str, kind: str) -> Token | None:
    """The live token of this kind whose secret this is, else None (never says which part was wrong)."""
    if not secret or len(secret) > 200:
        return None
    return Token.objects.filter(
        secret_hash=digest(secret), kind=kind, revoked_at__isnull=True
    ).first()
