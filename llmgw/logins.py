"""The console's login throttle: too many failed logins refuse further attempts for a while.

After LLMGW_LOGIN_FAILURES failed logins as one user name (any case), or
LLMGW_LOGIN_ADDRESS_FAILURES from one address, within one window of
LLMGW_LOGIN_WINDOW_SECONDS, logins as that name (or from that address) are refused for
LLMGW_LOGIN_LOCKOUT_SECONDS, the right password too, with a sentence saying until when.
A good login clears its name's failures. The counts are in Django's cache: Redis when
REDIS_URL is set, so every `llmgw serve` shares them; the process's memory otherwise.
Both /login/ and the admin's login are throttled.
"""

from __future__ import annotations

import hashlib
import logging
import math

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.core.exceptions import ValidationError

from llmgw.core import clock

log = logging.getLogger("llmgw.logins")


def _key(kind: str, value: str, suffix: str) -> str:
    # Hashed: a name may hold any character, and cache keys may not.
    return f"llmgw:login:{kind}:{hashlib.sha256(value.encode()).hexdigest()}:{suffix}"


def _subjects(name: str, address: str) -> list[tuple[str, str, int, str]]:
    """(kind, value, allowance, what the sentence calls it) for each thing counted."""
    figures = settings.LLMGW.login
    subjects = [("name", name.casefold(), figures.failures, f"as {name}")]
    if address:
        subjects.append(("address", address, figures.address_failures, "from this address"))
    return subjects


def login_refusal(*, name: str, address: str) -> str:
    """ "" when a login as `name` from `address` may be tried; else the sentence refusing it."""
    now = clock.now().timestamp()
    for kind, value, _, said in _subjects(name, address):
        until = cache.get(_key(kind, value, "locked"))
        if until is not None and until > now:
            minutes = max(math.ceil((until - now) / 60), 1)
            return (
                f"Too many failed logins {said}: try again in {minutes} "
                f"minute{'s' if minutes != 1 else ''}."
            )
    return ""


def login_failed(*, name: str, address: str) -> None:
    """Count a failed login against its name and its address; lock either one that has
    reached its allowance in the current window."""
    figures = settings.LLMGW.login
    now = clock.now().timestamp()
    window = int(now // figures.window)
    for kind, value, allowance, said in _subjects(name, address):
        counter = _key(kind, value, str(window))
        cache.add(counter, 0, timeout=math.ceil(figures.window))
        try:
            failures = cache.incr(counter)
        except ValueError:  # expired between add and incr: this failure starts a new count
            cache.set(counter, 1, timeout=math.ceil(figures.window))
            failures = 1
        if failures >= allowance:
            cache.set(_key(kind, value, "locked"), now + figures.lockout, figures.lockout)
            log.warning(
                "logins %s refused for %g s: %d failed within %g s",
                said if kind == "name" else f"from {address}",
                figures.lockout,
                failures,
                figures.window,
            )


def login_succeeded(*, name: str) -> None:
    """A good login: its name's failures so far no longer count."""
    now = clock.now().timestamp()
    window = int(now // settings.LLMGW.login.window)
    cache.delete(_key("name", name.casefold(), str(window)))


class Throttled:
    """An authentication form that refuses a login while its name or address is locked,
    and counts each failed one."""

    throttled = False

    def clean(self):
        name = self.data.get("username", "")
        address = self.request.META.get("REMOTE_ADDR", "") if self.request else ""
        sentence = login_refusal(name=name, address=address)
        if sentence:
            self.throttled = True
            raise ValidationError(sentence, code="throttled")
        try:
            cleaned = super().clean()
        except ValidationError:
            login_failed(name=name, address=address)
            raise
        login_succeeded(name=name)
        return cleaned


class LoginForm(Throttled, AuthenticationForm):
    pass


class AdminLoginForm(Throttled, AdminAuthenticationForm):
    pass


class ThrottledLoginView(LoginView):
    """/login/: a refused attempt while locked answers 429 with the form and the sentence."""

    authentication_form = LoginForm

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.throttled:
            response.status_code = 429
        return response
