"""The tenancy pages: capacity quotas with the tenancy tree beside them, the spend
budgets with what was spent, and the scope search.

One view per page: `quotas` serves /quotas and its fragments and takes the set and
clear forms; `scopes` answers the scope search of every form that names a scope.
"""

from __future__ import annotations

import re

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods

from fleet.selectors.state import holdings_load
from llmgw.core.errors import ServiceError
from llmgw.core.pages import fragment_asked, page, page_actor, staff_required
from llmgw.core.permissions import needs, require

from . import services
from .budgets import PERIODS, UNITS, WARN_AT, figure
from .forms import QuotaForm
from .selectors import ScopeTree, budgets_list, quota_views, scope_named, scope_tree

TEMPLATE = "tenancy/quota_list.html"
FRAGMENTS = ("quotas-main", "quota-table", "budget-table")
# A datalist longer than this is no help; the operator types more of the name.
SCOPE_OPTIONS = 20
RESOURCES = (("gpus", "GPUs"), ("cpu_cores", "Cores"), ("memory_gb", "Memory GB"))


@staff_required
@needs("tenancy.view_capacityquota")
@require_http_methods(["GET", "POST"])
def quotas(request: HttpRequest) -> HttpResponse:
    """Every quota with its holds against guarantee and limit; set and clear them."""
    form = QuotaForm(initial={"scope": request.GET.get("scope", "")})
    clear_error = ""
    notice = ""
    if request.method == "POST":
        if request.POST.get("form") == "clear":
            require(request, "tenancy.delete_capacityquota")
            notice, clear_error = _clear(request)
        else:
            require(request, "tenancy.change_capacityquota")
            form, notice = _set(request)
        if notice and not request.htmx:
            messages.success(request, notice)
            return redirect("quotas")
    if request.method == "POST":
        fragment = "quotas-main" if request.htmx else None
    else:
        fragment = fragment_asked(request, FRAGMENTS, main=FRAGMENTS[0])
    if fragment == "budget-table":
        return page(request, TEMPLATE, {"budgets": _budget_context()}, fragment=fragment)
    return page(
        request,
        TEMPLATE,
        {
            "section": "quotas",
            "form": form,
            "clear_error": clear_error,
            "notice": notice,
            **_quota_context(),
        },
        fragment=fragment,
        status=400 if form.errors or clear_error else 200,
    )


def _set(request: HttpRequest) -> tuple[QuotaForm, str]:
    """Set a quota from the form: a fresh form and what was done, or the form with its errors."""
    form = QuotaForm(request.POST)
    if not form.is_valid():
        return form, ""
    given = form.cleaned_data
    try:
        key = services.quota_set(
            scope=given["scope"],
            guarantee=_side(given, QuotaForm.GUARANTEE),
            limit=_side(given, QuotaForm.LIMIT),
            actor=page_actor(request),
        )
    except ServiceError as exc:
        _place(form, str(exc))
        return form, ""
    return (
        QuotaForm(),
        f"{scope_named(key)}: set; it takes effect at the next reconciler pass",
    )


def _side(given: dict, fields: dict[str, str]) -> dict[str, int]:
    return {resource: given[f] for f, resource in fields.items() if given.get(f) is not None}


def _place(form: QuotaForm, sentence: str) -> None:
    """Show the service's sentence beside the field it is about, else at the top of the form."""
    field_of = {("guarantee", r): f for f, r in QuotaForm.GUARANTEE.items()}
    field_of |= {("limit", r): f for f, r in QuotaForm.LIMIT.items()}
    given = form.cleaned_data
    fields: list[str | None]
    if m := re.match(r"(guarantee|limit): (\w+)", sentence):
        fields = [field_of.get((m[1], m[2]))]
    elif m := re.match(r"the guarantee of (\w+) ", sentence):
        fields = [field_of.get(("guarantee", m[1]))]
    elif "negative" in sentence:
        figures = (*QuotaForm.GUARANTEE, *QuotaForm.LIMIT)
        fields = [f for f in figures if (given.get(f) or 0) < 0] or [None]
    elif sentence.startswith("a quota needs"):
        fields = [None]
    else:
        # What quota_set says once the figures pass is about the scope: none, or several.
        fields = ["scope"]
    for f in fields:
        form.add_error(f, sentence)


def _clear(request: HttpRequest) -> tuple[str, str]:
    """Remove the quota the clear button names: (what was done, "") or ("", why not)."""
    scope = request.POST.get("scope", "")
    try:
        key = services.quota_clear(scope=scope, actor=page_actor(request))
    except ServiceError as exc:
        return "", str(exc)
    return f"{scope_named(key)}: quota removed", ""


def _quota_context() -> dict:
    """The quota rows with their bars, and the tenancy tree: a fixed number of queries."""
    tree = scope_tree()
    views = quota_views(holdings=holdings_load())
    return {
        "quotas": [
            {
                "scope": q["scope"],
                "name": tree.names.get(q["scope"], q["scope"]),
                "display": q["name"],
                "updated_by": q["updated_by"],
                "updated_at": q["updated_at"],
                "resources": [
                    _bar(label, q["holds"].get(r, 0), q["guarantee"].get(r), q["limit"].get(r))
                    for r, label in RESOURCES
                ],
            }
            for q in views
        ],
        "tree": _tree(tree, {q["scope"] for q in views}),
    }


def _budget_context() -> dict:
    """Every spend budget with what its scope spent this UTC day and month, as the gateway
    judges by (`budgets_list`): asked for by the page after it loads, so the quotas' own
    part keeps its few queries."""
    from django.utils import timezone

    listed = budgets_list(now=timezone.now())
    rows = []
    for b in listed["budgets"]:
        cells = []
        for unit in UNITS:
            for period in PERIODS:
                amount = b[f"{unit}_per_{period}"]
                spent = b["spent"][period][unit]
                cells.append(
                    {
                        "label": f"{unit} / {period}",
                        "text": "-"
                        if amount is None
                        else f"{figure(unit, spent)} / {figure(unit, amount)}",
                        "over": amount is not None and spent >= amount,
                        "warned": amount is not None and spent >= amount * WARN_AT,
                    }
                )
        rows.append({"scope": b["scope"], "name": b["name"], "cells": cells})
    return {"rows": rows, "unpriced": listed["unpriced"]}


def _figure(value: float) -> str:
    return f"{value:g}"


def _bar(label: str, holds: float, guarantee: int | None, limit: int | None) -> dict:
    """One resource's cell: "holds / guaranteed (≤ limit)" as `ctl quota list` writes it, and
    the bar drawing holds against the larger of the two, with a mark at the guarantee."""
    governed = guarantee is not None or limit is not None
    text = "-"
    if governed:
        text = f"{_figure(holds)} / {'-' if guarantee is None else guarantee}"
        if limit is not None:
            text += f" (≤ {limit})"
    scale = max(holds, guarantee or 0, limit or 0)

    def pct(value: float) -> str:
        return f"{min(value / scale, 1) * 100:.1f}" if scale else "0"

    return {
        "label": label,
        "text": text,
        "governed": governed,
        "holds": _figure(holds),
        "guarantee": guarantee,
        "limit": limit,
        "width": pct(holds),
        "guarantee_at": None if guarantee is None else pct(guarantee),
        "limit_at": None if limit is None or limit >= scale else pct(limit),
        "at_limit": limit is not None and holds >= limit,
        "borrowing": guarantee is not None and holds > guarantee,
    }


def _tree(tree: ScopeTree, governed: set[str]) -> list[dict]:
    """Organizations, their teams and those teams' projects, each by name and scope name."""
    children: dict[str, list[str]] = {}
    for key, parents in tree.parents.items():
        if parents:
            children.setdefault(parents[0], []).append(key)

    def node(key: str) -> dict:
        return {
            "key": key,
            "name": tree.names[key],
            "label": tree.path(key).rsplit("/", 1)[-1],
            "quota": key in governed,
            "children": [node(k) for k in _by_path(tree, children.get(key, []))],
        }

    return [node(k) for k in _by_path(tree, [k for k, p in tree.parents.items() if not p])]


def _by_path(tree: ScopeTree, keys: list[str]) -> list[str]:
    return sorted(keys, key=lambda k: (tree.path(k).casefold(), k))


@staff_required
@needs("tenancy.view_organization")
@require_GET
def scopes(request: HttpRequest) -> HttpResponse:
    """Scope names matching `q` (or the asking field's own value) as <option>s for a datalist."""
    text = next((request.GET[k] for k in ("q", "scope", "owner") if request.GET.get(k)), "").strip()
    wanted = text.casefold()
    tree = scope_tree()
    found = sorted(
        (
            (name, key, tree.display(key))
            for key, name in tree.names.items()
            if wanted in name.casefold() or wanted == key
        ),
        key=lambda row: (row[0].casefold(), row[1]),
    )
    return page(request, "tenancy/partials/scope_options.html", {"scopes": found[:SCOPE_OPTIONS]})
