"""Spend budgets and model prices (tenancy/budgets.py): set and cleared by operators,
audited as every tenancy write is; and the gateway's warning, once a window, of a budget
spent past its warning share."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal

from django.db import transaction

from llmgw.core.errors import Invalid, NotFound

from ..models import ApiKey, AuditEvent, Budget, ModelPrice
from ..selectors import ScopeTree, scope_find, scope_tree
from . import _scoped_clear, _stored_scope, _written, audit_record

log = logging.getLogger("llmgw.tenancy")

_BUDGET_FIGURES = ("tokens_per_day", "tokens_per_month", "cost_per_day", "cost_per_month")
# What the columns hold: big integers of tokens; costs of 12 digits and 4 decimal places.
_TOKENS_MOST = 10**15
_COST_MOST = Decimal(10**11)
_PRICE_MOST = Decimal(10**7)
_PLACES = 4


def cost_figure(value: object, *, name: str, most: Decimal, zero: bool = False) -> Decimal:
    """A cost or price, given as a number or its text: above zero (or zero, when `zero`), at
    most `most`, to at most four decimal places; Invalid with the reason otherwise."""
    wrong = Invalid(
        f"{name} must be a number from {'0' if zero else 'above 0'} to {most:,}, with at most "
        f"{_PLACES} decimal places, not {str(value)[:40]!r}."
    )
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise wrong
    try:
        figure = Decimal(str(value).strip())
    except ArithmeticError:
        raise wrong from None
    if not figure.is_finite() or not (figure >= 0 if zero else figure > 0) or figure > most:
        raise wrong
    if figure.as_tuple().exponent < -_PLACES:
        raise wrong
    return figure


def budget_figures(given: Mapping[str, object]) -> dict[str, int | Decimal | None]:
    """Tokens per day and per month (whole numbers from 1) and cost per day and per month
    (numbers above 0), each left out (None) when not budgeted; Invalid with the reason."""
    unknown = sorted(set(given) - set(_BUDGET_FIGURES), key=str)
    if unknown:
        raise Invalid(
            f"a budget has no field {unknown[0]!r}; it takes {', '.join(_BUDGET_FIGURES)}."
        )
    out: dict[str, int | Decimal | None] = {}
    for name in _BUDGET_FIGURES:
        value = given.get(name)
        if value is None:
            out[name] = None
        elif name.startswith("tokens"):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 1 <= value <= _TOKENS_MOST
            ):
                raise Invalid(
                    f"{name} must be a whole number from 1 to {_TOKENS_MOST:,}, not {value!r}."
                )
            out[name] = value
        else:
            out[name] = cost_figure(value, name=name, most=_COST_MOST)
    if all(v is None for v in out.values()):
        raise Invalid(
            f"a budget needs one of {', '.join(_BUDGET_FIGURES)}; to remove one, DELETE it"
        )
    return out


def budget_scope(scope: object, tree: ScopeTree, *, stored: bool = False) -> str:
    """The key of a budget's scope: `key:ID` for an API key, else the scope `scope` names;
    with `stored`, also a key a budget is kept under whose key or scope was since deleted."""
    text = scope.strip() if isinstance(scope, str) else ""
    kind, _, raw = text.partition(":")
    if kind.strip().lower() == "key":
        key = f"key:{raw.strip()}"
        found = raw.strip().isdigit() and ApiKey.objects.filter(pk=int(raw)).exists()
        if found or (
            stored and raw.strip().isdigit() and Budget.objects.filter(scope=key).exists()
        ):
            return key
        raise Invalid(f"there is no API key {raw.strip()[:40]!r}; a key's budget is key:ID.")
    return _stored_scope(scope, tree, Budget) if stored else scope_find(scope, tree=tree)


def _budget_detail(figures: Mapping[str, object]) -> dict[str, object]:
    """Figures as JSON keeps them: costs as text, so none is rounded."""
    return {k: str(v) if isinstance(v, Decimal) else v for k, v in figures.items()}


def budget_set(*, scope: str, actor: str, **figures: object) -> str:
    """Set a key's or scope's budgets (tokens_per_day, tokens_per_month, cost_per_day,
    cost_per_month), replacing what it had; return its key (`team:7`, `key:3`). A figure
    left out (None) is not budgeted. Invalid for no figure, a bad one, or a scope that
    names none or several."""
    wanted = budget_figures(figures)
    with transaction.atomic():
        tree = scope_tree()
        key = budget_scope(scope, tree)
        Budget.objects.update_or_create(scope=key, defaults={**wanted, "updated_by": actor[:150]})
        audit_record(actor=actor, action="budget.set", target=key, detail=_budget_detail(wanted))
    log.info(
        "budgets of %s (%s) set by %s: %s",
        _written(tree, key),
        key,
        actor,
        ", ".join(f"{k} {v}" for k, v in wanted.items() if v is not None),
        extra={"event": "budget", "scope": key, **_budget_detail(wanted), "actor": actor},
    )
    return key


def budget_clear(*, scope: str, actor: str) -> str:
    """Remove a key's or scope's budgets; return its key. NotFound when it has none. A
    budget whose key or scope was since deleted can still be removed by its key."""
    return _scoped_clear(
        Budget,
        find=lambda tree: budget_scope(scope, tree, stored=True),
        actor=actor,
        event="budget",
        lacks="budget",
        noun="budgets",
    )


def _price_model(model: object) -> str:
    name = model.strip() if isinstance(model, str) else ""
    if not name or len(name) > ModelPrice._meta.get_field("model").max_length:
        raise Invalid("a price needs the model's name, at most 64 characters.")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise Invalid("a model's name may not contain control characters such as NUL.")
    return name


def price_set(
    *, model: object, prompt_per_million: object, completion_per_million: object, actor: str
) -> str:
    """Set what a model's tokens cost per million prompt and per million completion tokens,
    replacing what it had, and return the model's name: the name usage rows hold (the
    catalog's name, not an alias). Zero is free; Invalid for a figure that is no number."""
    name = _price_model(model)
    figures = {
        "prompt_per_million": cost_figure(
            prompt_per_million, name="prompt_per_million", most=_PRICE_MOST, zero=True
        ),
        "completion_per_million": cost_figure(
            completion_per_million, name="completion_per_million", most=_PRICE_MOST, zero=True
        ),
    }
    with transaction.atomic():
        ModelPrice.objects.update_or_create(
            model=name, defaults={**figures, "updated_by": actor[:150]}
        )
        audit_record(
            actor=actor, action="price.set", target=f"model:{name}", detail=_budget_detail(figures)
        )
    log.info("price of %s set by %s: %s", name, actor, _budget_detail(figures))
    return name


def price_clear(*, model: object, actor: str) -> str:
    """Remove a model's price (its tokens then cost nothing); NotFound when it has none."""
    name = _price_model(model)
    with transaction.atomic():
        if not ModelPrice.objects.filter(model=name).delete()[0]:
            raise NotFound(f"{name} has no price.")
        audit_record(actor=actor, action="price.clear", target=f"model:{name}")
    log.info("price of %s removed by %s", name, actor)
    return name


def budget_warnings_record(*, warnings: Sequence[tuple[str, str, str, datetime, str]]) -> None:
    """Tell, once a window, each budget spent past its warning share (budgets.Book.warned:
    scope, period, unit, the window's start, the sentence): an audit row by `gateway`
    (`budget.warning`), which `ctl events` shows. A budget already told of in this window,
    by any gateway process, is not told again."""
    for scope, period, unit, start, said in warnings:
        told = AuditEvent.objects.filter(
            action="budget.warning",
            target=scope,
            at__gte=start,
            detail__period=period,
            detail__unit=unit,
        )
        if not told.exists():
            audit_record(
                actor="gateway",
                action="budget.warning",
                target=scope,
                detail={"period": period, "unit": unit, "message": said},
            )
            log.info("budget warning: %s", said)
