"""Who may call the API: an admin token (tenancy's tokens), or a staff session holding the
Django permissions an operation names (llmgw/core/permissions.py)."""

from __future__ import annotations

from django.http import HttpRequest
from ninja.errors import HttpError
from ninja.security import HttpBearer, SessionAuthIsStaff

from llmgw.core.api import ACTOR_HEADER, Actor, claimed_actor
from llmgw.core.permissions import refusal

from .models import Token
from .selectors import token_find


class AdminToken(HttpBearer):
    """`Authorization: Bearer <admin token>`; the actor is X-Llmgw-Actor, else the token's name."""

    def authenticate(self, request: HttpRequest, token: str):
        found = token_find(secret=token, kind=Token.ADMIN)
        if found is None:
            return None
        name = claimed_actor(request.META.get(ACTOR_HEADER, "")) or found.name
        request.actor = Actor(name, token=f"{found.name} ({found.prefix}…)")
        return found


class StaffSession(SessionAuthIsStaff):
    """A logged-in staff user of the pages (CSRF checked on writes), holding the Django
    permissions the operation names (llmgw/core/permissions.py); refused with a 403 and the
    sentence saying which it lacks. An operation naming none is for superusers alone."""

    def __init__(self, *perms: str):
        super().__init__()
        self.perms = perms

    def _get_key(self, request: HttpRequest):
        # CSRF protects a session's cookie; a call with no staff session has none to
        # protect, and is told it needs a token (401), not that a CSRF check failed.
        user = request.user
        if not (user.is_authenticated and user.is_active and user.is_staff):
            return None
        return super()._get_key(request)

    def authenticate(self, request: HttpRequest, key):
        user = super().authenticate(request, key)
        if user is None:
            return None
        if self.perms:
            sentence = refusal(user, *self.perms)
        elif not user.is_superuser:
            sentence = f"{user.get_username()} may not make this call: it is for superusers."
        else:
            sentence = ""
        if sentence:
            raise HttpError(403, sentence)
        request.actor = user.get_username()
        return user


def can(*perms: str) -> list:
    """An operation's auth: an admin token, or a staff session holding `perms`."""
    return [AdminToken(), StaffSession(*perms)]
