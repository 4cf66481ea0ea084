"""The gateway's traffic in the console's history: the series its sampler records
(llmgw/gateway/samples.py) and the charts the cluster and model pages draw of them, in
one place so the two agree without the pages importing the gateway.

Group "gateway" is every model together, "model:NAME" one model: requests, completion
tokens and errors a second, and (a model's) time to first token at the 95th percentile.
"""

from __future__ import annotations

from .charts import Chart, Line
from .history import Schema
from .promql import quoted

MODEL = Schema(("requests", "tokens", "ttft_p95", "errors"))
GATEWAY = Schema(("requests", "tokens", "errors"))


def requests_chart() -> Chart:
    return Chart(
        "requests",
        "Requests",
        "/s",
        "gateway",
        (
            Line("requests", "requests", "sum(rate(llmgw_gateway_requests_total[$rate]))"),
            Line("errors", "errors", "sum(rate(llmgw_gateway_errors_total[$rate]))"),
        ),
    )


def model_charts(model: str) -> tuple[Chart, ...]:
    """A model's traffic: requests and errors, tokens, and time to first token."""
    m = f"model={quoted(model)}"
    group = f"model:{model}"
    return (
        Chart(
            "requests",
            "Requests",
            "/s",
            group,
            (
                Line(
                    "requests", "requests", f"sum(rate(llmgw_gateway_requests_total{{{m}}}[$rate]))"
                ),
                Line("errors", "errors", f"sum(rate(llmgw_gateway_errors_total{{{m}}}[$rate]))"),
            ),
        ),
        Chart(
            "tokens",
            "Completion tokens",
            "/s",
            group,
            (
                Line(
                    "tokens",
                    "tokens",
                    f'sum(rate(llmgw_gateway_tokens_total{{{m},kind="completion"}}[$rate]))',
                ),
            ),
        ),
        Chart(
            "ttft",
            "Time to first token, p95",
            "s",
            group,
            (
                Line(
                    "p95",
                    "ttft_p95",
                    "histogram_quantile(0.95, sum by (le) "
                    f"(rate(llmgw_gateway_time_to_first_token_seconds_bucket{{{m}}}[$rate])))",
                ),
            ),
            note="streamed requests",
        ),
    )
