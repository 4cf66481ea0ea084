"""The facility domains' series: each domain's condition, its readings' age, its hold, and
whether conditions are enforced. Two small queries (fleet/selectors/conditions.py)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from ..domain.conditions import CONDITIONS
from ..selectors.conditions import conditions_list


def condition_series(scrape, now: datetime) -> None:
    domains = conditions_list(now)
    if not domains:  # nothing read and nothing held: nothing to say
        return
    enforced = 1 if settings.LLMGW.facility_enforce else 0
    scrape.add("llmgw_facility_conditions_enforced", (), enforced)
    for d in domains:
        for c in CONDITIONS:
            scrape.add("llmgw_domain_condition", (c, d.kind, d.name), 1 if c == d.condition else 0)
        if d.age_s is not None:
            scrape.add("llmgw_domain_reading_age_seconds", (d.kind, d.name), max(d.age_s, 0.0))
        if d.held:
            scrape.add("llmgw_domain_held", (d.kind, d.name), 1)
