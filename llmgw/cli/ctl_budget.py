"""``llmgw ctl budget list|set|clear`` and ``llmgw ctl price list|set|clear``: what a key or
scope may spend per UTC day and month, in tokens or in cost, and what each model's tokens
cost.

Scopes are written key:ID, org:Acme, team:Acme/ml or project:Acme/ml/training, or with IDs;
the server resolves them and judges every figure.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from llmgw.cli.base import Api, Output, segment, whole_number
from llmgw.cli.ctl_usage import count, when
from llmgw.cli.tables import DASH, render

# (field, header, unit, period)
FIGURES = (
    ("tokens_per_day", "TOKENS TODAY", "tokens", "day"),
    ("tokens_per_month", "TOKENS THIS MONTH", "tokens", "month"),
    ("cost_per_day", "COST TODAY", "cost", "day"),
    ("cost_per_month", "COST THIS MONTH", "cost", "month"),
)
NO_BUDGETS = "No budgets: keys and scopes may spend without end."
NO_PRICES = "No prices: every model's tokens cost nothing to cost budgets."
PRICE_HEADERS = ["MODEL", "PROMPT / 1M", "COMPLETION / 1M", "SET BY"]
BUDGET_HELP = """\
A budget counts every prompt and completion token (or their cost, by each
model's price: `llmgw ctl price set`) of the requests of the keys beneath
its scope, per UTC day and per UTC month. Spent whole, the gateway refuses
the scope's requests with 429 budget_exceeded until the window turns; past
80 % it warns. A figure left out is not budgeted.

Scopes are written key:ID, org:Acme, team:Acme/ml or project:Acme/ml/training,
or with IDs."""


def money(value: Any) -> str:
    """A cost to the cent, ``1,250.50``; absent → ``-``."""
    if value is None or isinstance(value, bool):
        return DASH
    try:
        return f"{Decimal(str(value)):,.2f}"
    except InvalidOperation:
        return str(value)


def budget_cell(spent: Any, budget: Any, unit: str) -> str:
    """``812,000 / 1,000,000 (81 %)``: spent, the budget, and the share; ``-`` unbudgeted."""
    if budget is None:
        return DASH
    shown = count if unit == "tokens" else money
    share = f" ({int(float(spent or 0) * 100 // float(budget))} %)" if budget else ""
    return f"{shown(spent or 0)} / {shown(budget)}{share}"


def render_budgets(answer: Mapping[str, Any]) -> str:
    """``ctl budget list``: a row per key or scope, a cell per figure, and how to read them."""
    budgets = answer.get("budgets") or []
    if not budgets:
        return NO_BUDGETS
    rows = []
    for b in budgets:
        spent = b.get("spent") or {}
        cells = [
            budget_cell((spent.get(period) or {}).get(unit), b.get(field), unit)
            for field, _, unit, period in FIGURES
        ]
        rows.append([b.get("scope"), b.get("name"), *cells, b.get("updated_by")])
    headers = ["SCOPE", "NAME", *(h for _, h, _, _ in FIGURES), "SET BY"]
    resets = budgets[0].get("resets_at") or {}
    text = (
        f"{render(headers, rows)}\n\nEach cell: spent / budget. The day resets at "
        f"{when(resets.get('day'))}, the month at {when(resets.get('month'))}. "
        "- is not budgeted."
    )
    if answer.get("unpriced"):
        text += (
            f"\nUsed this month without a price, so free to cost budgets: "
            f"{', '.join(answer['unpriced'])} (llmgw ctl price set)."
        )
    return text


def cmd_budget_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/budgets"), render_budgets)


def cost(text: str) -> str:
    """argparse type: a number, kept as written so no decimal is rounded on its way."""
    try:
        Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    return text


def budget_body(args: argparse.Namespace) -> dict[str, Any]:
    """The PUT body: the scope and only the figures whose flags were given."""
    body: dict[str, Any] = {"scope": args.scope}
    for field, _, _, _ in FIGURES:
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    return body


def cmd_budget_set(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.put("/budgets", budget_body(args))
    # Named as typed (team:Acme/ml), not by the key the server keeps (team:7).
    out.show(answer, lambda a: f"{args.scope}: budget set")


def cmd_budget_clear(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/budgets/{segment(args.scope)}")
    out.show(answer, lambda a: f"{args.scope}: budget removed")


def render_prices(prices: list[Mapping[str, Any]]) -> str:
    if not prices:
        return NO_PRICES
    rows = [
        [
            p.get("model"),
            money(p.get("prompt_per_million")),
            money(p.get("completion_per_million")),
            p.get("updated_by"),
        ]
        for p in prices
    ]
    return f"{render(PRICE_HEADERS, rows)}\n\nPer million tokens; a model without a price is free."


def cmd_price_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/prices"), render_prices)


def cmd_price_set(api: Api, args: argparse.Namespace, out: Output) -> None:
    body = {
        "model": args.model,
        "prompt_per_million": args.prompt,
        "completion_per_million": args.completion,
    }
    answer = api.put("/prices", body)
    out.show(answer, lambda a: f"{a['model']}: price set")


def cmd_price_clear(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/prices/{segment(args.model)}")
    out.show(answer, lambda a: f"{args.model}: price removed; its tokens cost nothing")


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``budget list|set|clear`` and ``price list|set|clear`` to the commands."""
    budget = add(commands, "budget", "tokens and cost a key or scope may spend per day and month")
    budget.epilog = BUDGET_HELP
    budget.formatter_class = argparse.RawDescriptionHelpFormatter
    actions = budget.add_subparsers(dest="action", required=True, metavar="ACTION")
    add(actions, "list", "every budget, with what was spent today and this month", cmd_budget_list)
    setting = add(actions, "set", "set a budget, replacing what it had", cmd_budget_set)
    setting.add_argument(
        "scope", help="key:ID, org:Acme, team:Acme/ml, project:Acme/ml/training, or IDs"
    )
    for field, _, unit, period in FIGURES:
        setting.add_argument(
            "--" + field.replace("_", "-"),
            dest=field,
            type=whole_number if unit == "tokens" else cost,
            metavar="N" if unit == "tokens" else "COST",
            help=f"{'prompt and completion tokens' if unit == 'tokens' else 'cost'} per UTC "
            f"{period}, at most (left out: not budgeted)",
        )
    add(actions, "clear", "remove a key's or scope's budget", cmd_budget_clear).add_argument(
        "scope"
    )

    price = add(commands, "price", "what a model's tokens cost, for cost budgets")
    actions = price.add_subparsers(dest="action", required=True, metavar="ACTION")
    add(actions, "list", "every model's price", cmd_price_list)
    setting = add(actions, "set", "set a model's price, replacing what it had", cmd_price_set)
    setting.add_argument("model", help="the model's name as the catalog has it (not an alias)")
    setting.add_argument("prompt", type=cost, help="per million prompt tokens")
    setting.add_argument("completion", type=cost, help="per million completion tokens")
    add(actions, "clear", "remove a model's price", cmd_price_clear).add_argument("model")
