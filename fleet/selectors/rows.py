"""Reading many rows cheaply: as the driver hands them over, compared with what was read
last time, and decoded only where a row changed (the fleet's views in
fleet/selectors/state.py, which the reconciler's snapshot reads, the `/metrics` scrape,
the console's history). The tricks of reading rows live here; what they rely on in the
schema is migrations fleet.0014 and fleet.0015, and the views built from the rows, kept
while their rows are the same, are fleet/selectors/state.py's.

- **Raw values** (`raw_values`, `decoded`, `json_loads`): Django's per-value converters
  decode every timestamp in Python (on SQLite twice), which was most of a reconciler
  pass at 10,000 replicas; here the rows stay undecoded until a view has to be built of
  one (`views_of`, `memoized`). JSON columns (a node's load, read whole by every scrape
  and history sample) are decoded by orjson, three times as fast as the standard
  library. benchmarks/metrics.py (104,566 series from 1,270 nodes, 2026-12-06): a
  scrape in process went from 129.0 to 103.3 ms median on SQLite and 157.6 to 138.8 ms
  on PostgreSQL, the loads' decoding from 26 to 8 ms.
- **Row revisions** (`RowsByRevision`, `revisions_kept`, `_fingerprint`): the database
  numbers a replica, shard and model-state row anew on every insert and update
  (fleet.0014's triggers), a node's only when what its view is built from changes
  (fleet.0015), so a pass reads one fingerprint of each table, then, only if it moved,
  every row's id and number, and in full only the rows whose number moved.
  benchmarks/reconcile_pass.py (an idle pass at 5,000 nodes, 10,000 replicas and
  10,000 shards, SQLite, 2026-12-02): the snapshot went from 107 ms to 36–57 ms median
  and the pass from 155 to 108 ms; the fingerprint costs 1.2 ms at 10,000 rows against
  9.3 ms for every id and number; nodes by a number of their own took the pass from
  101.8 to 64.3 ms (docs/benchmarks.md, "A reconciler pass with nothing to do").
  tests/fleet/test_row_revisions.py says when a migration loses the triggers.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime

import orjson
from django.db import connection
from django.db.models import TextField
from django.db.models.functions import Cast

# Ids a statement names at most (SQLite's variables, PostgreSQL's plan size).
CHUNK = 500


def chunks(ids: list):
    """`ids` in runs of at most CHUNK, each for one `pk__in` query."""
    for i in range(0, len(ids), CHUNK):
        yield ids[i : i + CHUNK]


def raw_values(qs, fields: tuple[str, ...]) -> list[tuple]:
    """`qs.values_list(*fields)` as cheaply as the driver hands it over, to be compared with
    what was read last time and decoded (`decoded`) only where a row changed. On SQLite
    timestamps are selected as text (cast, so the driver's converter does not parse them
    either); on PostgreSQL psycopg's own C loader makes them aware datetimes
    (`postgres_rows`)."""
    if connection.vendor == "sqlite":
        dates = {f for f in fields if _kind(qs.model, f) == "DateTimeField"}
        if dates:
            qs = qs.annotate(**{f"_text_{f}": Cast(f, TextField()) for f in dates})
            fields = tuple(f"_text_{f}" if f in dates else f for f in fields)
    sql, params = qs.values_list(*fields).query.sql_with_params()
    if connection.vendor == "postgresql":
        return postgres_rows(sql, params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _kind(model, field: str) -> str:
    """The internal type of `field`, across relations (`replica__model`)."""
    *path, last = field.split("__")
    for name in path:
        model = model._meta.get_field(name).related_model
    return model._meta.get_field(last.removesuffix("_id")).get_internal_type()


def date_columns(model, fields: tuple[str, ...]) -> tuple[int, ...]:
    """Where the timestamps are in a row of `fields`: what `decoded` makes aware."""
    return tuple(i for i, f in enumerate(fields) if _kind(model, f) == "DateTimeField")


def decoded(row: tuple, dates: tuple[int, ...]) -> tuple:
    """A row from `raw_values` with its timestamps aware datetimes, as the ORM gives them."""
    if not dates:
        return row
    out = list(row)
    for i in dates:
        out[i] = aware(out[i])
    return tuple(out)


def aware(value: datetime | str | None) -> datetime | None:
    """A timestamp as a driver hands it over (SQLite: text or naive UTC), made an aware
    datetime; one already aware is left as it is."""
    if isinstance(value, str):
        # SQLite's text is naive UTC: read with its offset, one call rather than two.
        try:
            return datetime.fromisoformat(value + "+00:00")
        except ValueError:
            value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def json_loads(text: str | bytes):
    """JSON text decoded by orjson; by the standard library where orjson refuses what
    Python's own encoder may have written (NaN, Infinity, integers past 64 bits)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def raw_json(value):
    """A JSON column as the driver hands it over: SQLite gives its text, PostgreSQL the
    value itself (`postgres_rows` decodes it with `json_loads`)."""
    return json_loads(value) if isinstance(value, str | bytes) else value


def postgres_rows(sql: str, params) -> list[tuple]:
    """Rows through psycopg's own C timestamp loader, and JSON through `json_loads`.

    Django registers a pure-Python loader for timestamptz on its connections;
    at 10,000 replicas it was most of a pass. The connection's time zone is
    UTC (Django sets it), so the datetimes come back aware, as Django's would.
    """
    import psycopg
    import psycopg.types.json

    connection.ensure_connection()
    loader = psycopg.adapters.get_loader(
        psycopg.postgres.types["timestamptz"].oid, psycopg.pq.Format.TEXT
    )
    # Django's error wrapper, so a bad value raises django.db.DataError as through the ORM.
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:
        cursor.adapters.register_loader("timestamptz", loader)
        psycopg.types.json.set_json_loads(json_loads, cursor)
        cursor.execute(sql, params)
        return cursor.fetchall()


def memoized(cache: dict, name: str, rows, build):
    """`build(rows)`, or last time's result when the rows are the same (compared in C)."""
    hit = cache.get(name)
    if hit is not None and hit[0] == rows:
        return hit[1]
    result = build(rows)
    cache[name] = (rows, result)
    return result


def views_of(cache: dict, rows, key, build):
    """Views of rows, reusing the view built last time for a row (and extra) that is unchanged."""
    out = []
    for row in rows:
        k = key(row)
        hit = cache.get(k[0])
        if hit is None or hit[0] != k:
            hit = (k, build(row))
            cache[k[0]] = hit
        out.append(hit[1])
    if len(cache) > 2 * len(out) + 1000:
        live = {key(r)[0] for r in rows}
        for gone in cache.keys() - live:
            del cache[gone]
    return out


def revisions_kept(table: str) -> bool:
    """Whether the database numbers `table`'s rows on every write (migration
    fleet.0014's triggers): one small query, once a process per database. A later
    migration that rebuilds the table on SQLite drops its triggers (tests/fleet/
    test_row_revisions.py would say so); the rows are then read in full, not trusted."""
    key = (connection.vendor, str(connection.settings_dict["NAME"]), table)
    kept = _kept.get(key)
    if kept is None:
        kept = _kept[key] = _triggers_there(table)
    return kept


_kept: dict[tuple[str, str, str], bool] = {}


def _triggers_there(table: str) -> bool:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass "
                "AND tgname = 'llmgw_rev' AND tgenabled <> 'D'",
                [table],
            )
            return cursor.fetchone()[0] == 1
        cursor.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s "
            "AND name IN (%s, %s)",
            [table, f"llmgw_rev_insert_{table}", f"llmgw_rev_update_{table}"],
        )
        return cursor.fetchone()[0] == 2


class RowsByRevision:
    """Every row of a table as `raw_values` gives it, reading in full only the rows whose
    `rev` the database moved since the last read (or that are new); the others are last
    read's tuples. When the table's fingerprint (`_fingerprint`) is last read's, nothing
    moved and not even the numbers are read; when only the rows' order moved, the rows are
    the same but come in a new list. `fields[0]` is the primary key; `order` sorts the rows
    (in Python, so the database sorts nothing). One read at a time (a pass and a dry run
    may overlap).

    Read inside a transaction it is one consistent picture (the caller's snapshot); a row
    written between its number and its fields is kept with the fields and number read."""

    def __init__(self, model, fields: tuple[str, ...], order=None) -> None:
        if fields[0] != model._meta.pk.attname:
            raise ValueError(f"{model.__name__}: the first field must be the primary key")
        self.model, self.fields, self.order = model, fields, order
        self._rows: dict = {}
        # The table's fingerprint, its ids and numbers, and the rows, as last read.
        self._last: tuple[str | None, list, list] | None = None
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self._last = None

    def read(self, revs: list[tuple] | None = None) -> list[tuple]:
        """The rows; `revs`: every row's id and number, when the caller read them already
        (with what else it reads of every row each time)."""
        with self._lock:
            return self._read(revs)

    def _read(self, revs: list[tuple] | None) -> list[tuple]:
        qs = self.model.objects.order_by()
        if not revisions_kept(self.model._meta.db_table):
            self._rows.clear()
            self._last = None
            return self._sorted(raw_values(qs, self.fields))
        mark = None
        if revs is None:
            mark = _fingerprint(self.model._meta.db_table)
            if self._last is not None and mark is not None and self._last[0] == mark:
                return self._last[2]
            revs = raw_values(qs, (self.fields[0], "rev"))
        if self._last is not None and self._last[1] == revs:
            self._last = (mark, revs, self._last[2])
            return self._last[2]
        rows = self._rows
        stale = [key for key, rev in revs if (hit := rows.get(key)) is None or hit[0] != rev]
        for chunk in chunks(stale):
            for row in raw_values(qs.filter(pk__in=chunk), (*self.fields, "rev")):
                rows[row[0]] = (row[-1], row[:-1])
        if len(rows) > len(revs):
            live = {key for key, _ in revs}
            for gone in rows.keys() - live:
                del rows[gone]
        out = self._sorted([hit[1] for key, _ in revs if (hit := rows.get(key)) is not None])
        self._last = (mark, revs, out)
        return out

    def _sorted(self, rows: list[tuple]) -> list[tuple]:
        if self.order is not None:
            rows.sort(key=self.order)
        return rows


def _fingerprint(table: str) -> str | None:
    """What every row's number comes to, in one value: the same only when no row was written,
    inserted or deleted since, but for a chance of 1 in 2^64. On PostgreSQL, where numbers
    are never handed out twice and an update moves a row on disk, the count and the sum of
    the numbers' 64-bit hashes, whatever the order; on SQLite, whose rows stay where they
    are, every (random) number in the order they are stored. Either costs a tenth of
    reading every row's id and number at 10,000 rows."""
    if connection.vendor == "postgresql":
        sql = f"SELECT count(*) || ':' || coalesce(sum(hashint8extended(rev, 0)), 0) FROM {table}"
    else:
        sql = f"SELECT group_concat(rev) FROM {table}"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]
