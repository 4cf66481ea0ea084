"""The models' and the reconciler's series of a scrape.

Replicas by model and state; what each model in the catalog wants, its failures and
whether it is parked, unplaceable or preempted; what each part of the tenancy tree
holds, is guaranteed and may hold of the capacity quotas' resources; and the
reconciler's lease: who leads, when the last pass began, whether it settles or is
stale.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection
from django.db.models import Count

from catalog.domain import ModelSpec
from tenancy.quota import RESOURCES, ZERO, Amount, Holding
from tenancy.selectors import quota_policy_load

from ..domain.passes import stale_warning
from ..domain.reconcile import desired_replicas
from ..domain.types import ModelState as ModelStateView
from ..models import Lease, ModelState, Replica
from ..reconciler.run import ADVISORY_KEY, LEASE
from ..selectors.routing import replica_readings
from ..selectors.rows import raw_values
from .series import Scrape

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def model_series(scrape: Scrape, now: datetime, catalog: dict[str, ModelSpec]) -> None:
    """Add the replicas of each model by state, and what each model of `catalog` wants and
    how its starts went."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for model, state, n in (
        Replica.objects.order_by().values_list("model", "state").annotate(n=Count("id"))
    ):
        counts[model][state] = n
    for model in sorted(counts):
        for state, n in sorted(counts[model].items()):
            scrape.add("llmgw_replicas", (model, state), n)
    states = {
        row[0]: row
        for row in raw_values(
            ModelState.objects.order_by(),
            ("model", "desired", "failures", "parked_since", "unplaceable", "preempted"),
        )
    }
    for name in sorted(catalog):
        spec = catalog[name]
        row = states.get(name)
        if row is None:
            # Before its first pass a model wants what its scaling says, not nothing.
            desired = desired_replicas(spec, ModelStateView(model=name), now)
            failures, parked, unplaceable, preempted = 0, False, False, 0
        else:
            _, desired, failures, parked_since, unplaceable, preempted = row
            parked = parked_since is not None
        model = (name,)
        scrape.add("llmgw_model_replicas_ready", model, counts[name].get("ready", 0))
        scrape.add("llmgw_model_desired", model, desired)
        scrape.add("llmgw_model_failures", model, failures)
        scrape.add("llmgw_model_parked", model, 1 if parked else 0)
        scrape.add("llmgw_model_unplaceable", model, 1 if unplaceable else 0)
        scrape.add("llmgw_model_preempted", (spec.effective_class, name), preempted)
    replica_series(scrape)


def replica_series(scrape: Scrape) -> None:
    """Add what each ready replica's engine last said of itself: requests running and
    waiting, the KV cache's use and the prefix cache's hit rate; each figure its engine
    did not report has no series (absent, never 0)."""
    model_of = dict(Replica.objects.filter(state="ready").order_by().values_list("id", "model"))
    for replica_id, reading in sorted(replica_readings().items()):
        labels = (model_of.get(replica_id, ""), replica_id)
        for name, value in (
            ("llmgw_replica_running", reading.running),
            ("llmgw_replica_waiting", reading.waiting),
            ("llmgw_replica_kv_cache_usage_ratio", reading.kv_cache),
            ("llmgw_replica_prefix_cache_hit_ratio", reading.prefix_hit_rate),
        ):
            if value is not None:
                scrape.add(name, labels, value)
        for adapter, _ in reading.adapters or ():
            scrape.add("llmgw_adapter_loaded", (adapter, *labels), 1)


def quota_series(scrape: Scrape, catalog: dict[str, ModelSpec], held: dict[str, Amount]) -> None:
    """Add what each part of the tenancy tree holds of the resources its quota governs, and
    its guarantee and limit; `held`: what each model's replicas hold."""
    policy = quota_policy_load()
    if not policy.quotas:
        return
    # One holding per model is enough for the sums: usage adds each along its owner's chain.
    usage = policy.usage(
        Holding(replica=model, owner=spec.owner, amount=held[model], since=_EPOCH)
        for model, spec in catalog.items()
        if model in held
    )
    for scope in sorted(policy.quotas, key=policy.name):
        q = policy.quotas[scope]
        holds = usage.get(scope, ZERO)
        for r in RESOURCES:
            guarantee, limit = getattr(q.guarantee, r), getattr(q.limit, r)
            if guarantee is None and limit is None:
                continue
            labels = (r, policy.name(scope))
            scrape.add("llmgw_capacity_holds", labels, getattr(holds, r))
            if guarantee is not None:
                scrape.add("llmgw_capacity_guarantee", labels, guarantee)
            if limit is not None:
                scrape.add("llmgw_capacity_limit", labels, limit)


def reconciler_series(scrape: Scrape, now: datetime) -> None:
    """Add who leads the reconciler, when its last pass began, and whether it settles or is
    stale."""
    row = (
        Lease.objects.filter(pk=LEASE)
        .values_list("holder", "expires_at", "last_pass_at", "settle_until", "served_since")
        .first()
    )
    if row is None:
        return
    holder, expires_at, last_pass_at, settle_until, served_since = row
    if holder and expires_at > now and (connection.vendor != "postgresql" or _pass_locked()):
        scrape.add("llmgw_leader", (holder,), 1)
    if last_pass_at is not None:
        settling = settle_until is not None and now < settle_until
        scrape.add("llmgw_reconciler_last_pass_timestamp_seconds", (), last_pass_at.timestamp())
        scrape.add("llmgw_reconciler_settling", (), 1 if settling else 0)
    if last_pass_at is not None or served_since is not None:
        stale = stale_warning(
            now=now,
            last_pass_at=last_pass_at,
            served_since=served_since,
            embedded=settings.LLMGW.embedded,
            t=settings.LLMGW.timings,
        )
        scrape.add("llmgw_reconciler_stale", (), 0 if stale is None else 1)


def _pass_locked() -> bool:
    """Whether some session holds the pass's advisory lock: the row names a holder that a
    SIGKILL left there until it expires, the lock went with its session."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND ((classid::bigint << 32) | objid::bigint) = %s",
            [ADVISORY_KEY],
        )
        return cursor.fetchone() is not None
