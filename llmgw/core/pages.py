"""What every page shares: staff only, and one view serving a page and its fragments.

A view renders `app/page.html` for a browser and `app/page.html#fragment` when
htmx asks for a part of it that it has (template partials); either way the response varies
on HX-Request, so a cache never serves a fragment for a page or the reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers


def staff_required(view: Callable) -> Callable:
    """Send anyone not logged in to the login page; refuse a logged-in user who is not staff.

    An htmx request from a session that expired is told to load the login page whole
    (HX-Redirect), not given a login form to swap into a table.
    """

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user
        if not user.is_authenticated:
            login = redirect_to_login(request.get_full_path())
            if getattr(request, "htmx", False):
                return HttpResponse(status=204, headers={"HX-Redirect": login.url})
            return login
        if not (user.is_active and user.is_staff):
            raise PermissionDenied("These pages are for staff.")
        return view(request, *args, **kwargs)

    return wrapped


def page(
    request: HttpRequest,
    template: str,
    context: dict,
    *,
    fragment: str | None = None,
    status: int = 200,
) -> HttpResponse:
    """Render the whole page, or only `fragment` of it.

    The view names the fragment, having checked what was asked against the fragments
    it has (fragment_asked); a `?fragment=` no view knows is never looked up as a
    template, which was a 500.
    """
    name = f"{template}#{fragment}" if fragment else template
    response = render(request, name, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


def fragment_asked(
    request: HttpRequest, known: Mapping[str, str] | Sequence[str], *, main: str | None = None
) -> str | None:
    """The partial an htmx request asks for by `?fragment=NAME`: `known` maps each name the
    page answers to its partial (a list: each name is its own partial). A browser gets the
    whole page (None). htmx naming none gets `main`, the page's main part, or the whole page
    when it has none; naming one the page lacks gets `main` too, or, on a page with no main
    part to give, a 404 saying so."""
    if not getattr(request, "htmx", False):
        return None
    parts = known if isinstance(known, Mapping) else {name: name for name in known}
    wanted = request.GET.get("fragment")
    if wanted is None:
        return main
    if wanted in parts:
        return parts[wanted]
    if main is None:
        raise Http404(f"There is no fragment {wanted!r} of this page.")
    return main


def page_actor(request: HttpRequest) -> str:
    """Who acts on a page, as recorded beside each change: the staff user's name."""
    return request.user.get_username()
