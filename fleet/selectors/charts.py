"""The fleet's series as other apps' pages chart them: a model's replicas over time, drawn
on the catalog's model page from the history the fleet's samples fill
(fleet/console/samples.py)."""

from __future__ import annotations

from llmgw.core.charts import Line
from llmgw.core.promql import quoted


def replica_lines(model: str) -> tuple[Line, ...]:
    """A model's replicas over time, for its page's chart."""
    m = f"model={quoted(model)}"
    return (
        Line("ready", "ready", f"llmgw_model_replicas_ready{{{m}}}"),
        Line(
            "holding room",
            "holding",
            f'sum(llmgw_replicas{{{m},state=~"pending|starting|ready|draining|stopping"}})',
        ),
    )
