"""What the gateway used, written: per-minute usage rows and the per-day spend budgets read,
in one upsert and transaction; each request's record for a lookup by its id, kept
LLMGW_REQUESTS_KEEP_HOURS; and the usage journals' settlement."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction

from ..models import (
    ApiKey,
    RequestRecord,
    UsageJournal,
)

_USAGE_ADD = """
INSERT INTO tenancy_usage (bucket, api_key_id, project_id, model, requests, errors,
                           prompt_tokens, completion_tokens, latency_ms_total,
                           estimated_tokens)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (bucket, api_key_id, model) DO UPDATE SET
    requests = tenancy_usage.requests + excluded.requests,
    errors = tenancy_usage.errors + excluded.errors,
    prompt_tokens = tenancy_usage.prompt_tokens + excluded.prompt_tokens,
    completion_tokens = tenancy_usage.completion_tokens + excluded.completion_tokens,
    latency_ms_total = tenancy_usage.latency_ms_total + excluded.latency_ms_total,
    estimated_tokens = tenancy_usage.estimated_tokens + excluded.estimated_tokens
"""


def usage_add(
    *,
    tallies: Mapping[tuple[int, int, int, str], Sequence[int]],
    journal: str | None = None,
    batch: int = 0,
    records: Sequence[tuple] = (),
) -> None:
    """Add the gateway's tallies, keyed (minute since the epoch, key id, project id, model)
    to [requests, errors, prompt, completion, latency ms, estimated], to their one-minute
    `Usage` rows in one statement: an upsert that adds, so several gateway processes can
    write the same bucket. Rows for keys deleted meanwhile are dropped rather than failing
    the batch. For a process keeping a usage `journal`, the number of this `batch` is
    recorded in the same transaction, so the journal's settlement knows what is here; the
    batch's request `records` too (`request_records_add`), so a batch given back to be
    written again leaves none twice."""
    with transaction.atomic():
        _usage_rows_add(tallies)
        request_records_add(records)
        if journal is not None:
            UsageJournal.objects.update_or_create(name=journal, defaults={"batch": batch})


def _usage_rows_add(tallies: Mapping[tuple[int, int, int, str], Sequence[int]]) -> None:
    keys = set(ApiKey.objects.filter(pk__in={k[1] for k in tallies}).values_list("pk", flat=True))
    bucket = connection.ops.adapt_datetimefield_value
    rows = [
        (bucket(datetime.fromtimestamp(minute * 60, UTC)), key, project, model, *figures)
        for (minute, key, project, model), figures in sorted(tallies.items())
        if key in keys
    ]
    if rows:
        with connection.cursor() as cursor:
            cursor.executemany(_USAGE_ADD, rows)
        _daily_spend_add(tallies, keys)


_DAILY_SPEND_ADD = """
INSERT INTO tenancy_dailyspend (day, api_key_id, project_id, model, prompt_tokens,
                                completion_tokens)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (day, api_key_id, model) DO UPDATE SET
    prompt_tokens = tenancy_dailyspend.prompt_tokens + excluded.prompt_tokens,
    completion_tokens = tenancy_dailyspend.completion_tokens + excluded.completion_tokens
"""


def _daily_spend_add(
    tallies: Mapping[tuple[int, int, int, str], Sequence[int]], keys: set[int]
) -> None:
    """Add the tallies' tokens to their UTC day's DailySpend rows, in the caller's
    transaction with the Usage rows they are also added to: the budgets' spend."""
    days: dict[tuple, list[int]] = {}
    for (minute, key, project, model), figures in tallies.items():
        if key in keys:
            day = datetime.fromtimestamp(minute * 60, UTC).date()
            summed = days.setdefault((day, key, project, model), [0, 0])
            summed[0] += figures[2]
            summed[1] += figures[3]
    adapt = connection.ops.adapt_datefield_value
    rows = [(adapt(day), *rest, *summed) for (day, *rest), summed in sorted(days.items())]
    with connection.cursor() as cursor:
        cursor.executemany(_DAILY_SPEND_ADD, rows)


# How often a process deletes records kept too long, and when it last did.
EXPIRE_EVERY_S = 3600.0  # request records past their keeping are deleted at most this often
# When this process last deleted records kept too long (at most hourly).
_expired_at = float("-inf")

_REQUEST_RECORD_ADD = """
INSERT INTO tenancy_requestrecord (request_id, at, key_id, project_id, model, endpoint, status,
                                   prompt_tokens, completion_tokens, duration_ms, replica, error)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""


def request_records_add(records: Sequence[tuple]) -> None:
    """The gateway's records of requests, each (request id, arrival as seconds since the
    epoch, key id, project id, model, endpoint, status, prompt tokens, completion tokens,
    duration ms, replica, error; llmgw/gateway/accounting.py `_note`), in one statement:
    on PostgreSQL a third of the CPU of `bulk_create`'s model instances (about 16 µs a
    row against 50), which the gateway's process spends on every request."""
    if not records:
        return
    at = connection.ops.adapt_datetimefield_value
    rows = [
        (rid[:128], at(datetime.fromtimestamp(arrived, UTC)), key, project, model[:64],
         endpoint[:100], status, prompt, completion, ms, replica[:100], error[:64])
        for rid, arrived, key, project, model, endpoint, status, prompt, completion, ms,
        replica, error in records
    ]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.executemany(_REQUEST_RECORD_ADD, rows)


def request_records_expire(*, now: datetime, keep_hours: float) -> int:
    """Delete the request records that arrived more than `keep_hours` ago (all of them for
    0), at most once an hour a process, as fleet's event log does; how many went."""
    global _expired_at
    if time.monotonic() - _expired_at < EXPIRE_EVERY_S:
        return 0
    _expired_at = time.monotonic()
    gone, _ = RequestRecord.objects.filter(at__lte=now - timedelta(hours=keep_hours)).delete()
    return gone


def usage_journal_settle(
    *, name: str, tallies: Mapping[tuple[int, int, int, str], Sequence[int]]
) -> bool:
    """Add what the journal `name` of a process that died holds beyond the Usage rows, and
    mark it settled, in one transaction; False, adding nothing, when it was settled
    already (a start that died before it removed the file)."""
    with transaction.atomic():
        if UsageJournal.objects.filter(name=name, settled=True).exists():
            return False
        _usage_rows_add(tallies)
        UsageJournal.objects.update_or_create(name=name, defaults={"settled": True})
    return True


def usage_journal_forget(*, name: str) -> None:
    """The journal `name` is gone from disk: its record goes too."""
    UsageJournal.objects.filter(name=name).delete()
