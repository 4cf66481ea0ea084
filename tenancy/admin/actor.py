"""Who a write from Django admin is recorded as: the signed-in user's name."""

from __future__ import annotations


def who(request) -> str:
    """The name admin's writes are recorded under; "admin" for a user without one."""
    return request.user.get_username() or "admin"
