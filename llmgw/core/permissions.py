"""Who may do what on the console and through the REST API: Django's permissions, per model.

Reading needs `view_<model>` of the model an action shows; changing needs `add_`,
`change_` or `delete_<model>` of the model it touches, and pushing code to nodes one of
PUSH (docs/console.md, Permissions, has the table). A superuser may do everything, and so
may an admin token: it is the operator's own key, made on the server (`llmgw
createtoken`). Staff sessions are checked per action, and refused with a sentence naming
the permission they lack.

Three groups come built in: "viewers" hold every view permission of llmgw's apps and
"operators" every permission of them but those that push code to nodes, which "release
managers" hold alone: an engine build or an llmgw release runs as the agent's user, often
root, on every node. None sees or makes admin tokens. After each migrate they are made, or
given back any of those permissions they lack; a permission added to them by hand is kept.
A narrower group is a group of one's own.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.apps import apps as global_apps
from django.core.exceptions import PermissionDenied
from django.db import DEFAULT_DB_ALIAS
from django.http import HttpRequest, HttpResponse

APPS = ("tenancy", "catalog", "fleet", "mirror")
VIEWERS = "viewers"
OPERATORS = "operators"
RELEASE_MANAGERS = "release managers"
# Admin tokens may do everything: only a superuser lists or makes them.
WITHHELD = (("tenancy", "token"),)
# What runs on the nodes as the agent's user: adding an engine build or a release, and
# upgrading the agents to one (mirror's EngineBuild and fleet's Node, Meta.permissions).
PUSH = (("mirror", "push_enginebuild"), ("fleet", "upgrade_node"))
VERBS = {"view": "see", "add": "add", "change": "change", "delete": "remove"}


def refusal(user: Any, *perms: str) -> str:
    """ "" when `user` holds every one of `perms` (a superuser holds all); else the sentence
    saying what they may not do, the permission it needs and the group that has it."""
    for perm in perms:
        if user.has_perm(perm):
            continue
        label, codename = perm.split(".", 1)
        action, model_name = codename.split("_", 1)
        what = global_apps.get_model(label, model_name)._meta.verbose_name_plural
        return (
            f"{user.get_username()} may not {VERBS.get(action, action)} {what}: that needs "
            f"the {perm} permission ({_holders(label, codename)})."
        )
    return ""


def _holders(label: str, codename: str) -> str:
    """Which built-in groups hold a permission, as a refusal says it."""
    if codename.startswith("view_"):
        return "the viewers and operators groups have it"
    if (label, codename) in PUSH:
        return "the release managers group has it"
    return "the operators group has it"


def require(request: HttpRequest, *perms: str) -> None:
    """Refuse a page's request (403, with the sentence) unless its user holds `perms`."""
    sentence = refusal(request.user, *perms)
    if sentence:
        raise PermissionDenied(sentence)


def needs(*perms: str) -> Callable:
    """A page view that only users holding `perms` may open (under staff_required)."""

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            require(request, *perms)
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def groups_ensure(*, using: str = DEFAULT_DB_ALIAS) -> None:
    """Make the viewers, operators and release managers groups, or give them back any of
    their permissions they lack; never take one away. Permissions must exist (after
    create_permissions)."""
    from django.contrib.auth.models import Group, Permission

    every = list(
        Permission.objects.using(using)
        .select_related("content_type")
        .filter(content_type__app_label__in=APPS)
        .exclude(
            content_type__app_label__in=[a for a, _ in WITHHELD],
            content_type__model__in=[m for _, m in WITHHELD],
        )
    )
    pushing = [p for p in every if (p.content_type.app_label, p.codename) in PUSH]
    for name, perms in (
        (VIEWERS, [p for p in every if p.codename.startswith("view_")]),
        (OPERATORS, [p for p in every if p not in pushing]),
        (RELEASE_MANAGERS, pushing),
    ):
        group, _ = Group.objects.using(using).get_or_create(name=name)
        group.permissions.add(*perms)


def groups_after_migrate(
    sender: object, *, using: str = DEFAULT_DB_ALIAS, apps: Any = None, **kwargs: Any
) -> None:
    """post_migrate (sent for tenancy): the built-in groups, with every app's permissions.

    Django makes an app's permissions when post_migrate is sent for that app, and catalog,
    fleet and mirror come after tenancy: their permissions are made here first (as Django
    would a moment later; it then finds them made).
    """
    from django.contrib.auth.management import create_permissions

    try:
        (apps or global_apps).get_model("auth", "Permission")
    except LookupError:  # migrated to a state without auth's tables: nothing to give
        return
    for label in APPS:
        create_permissions(global_apps.get_app_config(label), verbosity=0, using=using)
    groups_ensure(using=using)
