"""Tenancy writes: tokens and the audit trail."""

from __future__ import annotations

from django.utils import timezone

from llmgw.secrets import digest, new_secret

from .models import AuditEvent, Token


def token_create(*, name: str, kind: str = Token.ADMIN) -> tuple[Token, str]:
    """Store a new token's hash and return it with the secret, which is not kept anywhere."""
    if not name.strip():
        raise ValueError("A token needs a name.")
    if len(name.strip()) > Token._meta.get_field("name").max_length:
        raise ValueError("A token's name is at most 100 characters long.")
    secret = new_secret("llmgw_agt_" if kind == Token.AGENT else "llmgw_adm_")
    token = Token.objects.create(
        name=name.strip(), kind=kind, prefix=secret[:14], secret_hash=digest(secret)
    )
    return token, secret


def token_revoke(*, token: Token) -> None:
    Token.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def audit_record(*, actor: str, action: str, target: str, detail: dict | None = None) -> None:
    """Write who changed what, inside the caller's transaction when there is one."""
    AuditEvent.objects.create(
        actor=actor[:150], action=action, target=target[:200], detail=detail or {}
    )
