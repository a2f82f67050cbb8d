"""A sensor that watches the row counts of many tables cheaply and opens an incident on an anomaly.

:func:`build_volume_sensor` reads, on every tick, the row count of each watched table
(:class:`VolumeTable`) from its warehouse's catalog, scores each changed count against that
table's own baseline with the volume check's method
(:func:`dw_dagster.checks.volume.score_against_baseline`: z-score or MAD band, sensitivity,
``min_history``, a floor on the band width, never below 0 rows), records counts as
``AssetObservation``\\ s, and opens one :class:`~dw_dagster.models.Incident`
(``source="volume_sensor"``) per anomaly.

Where the counts come from (``row_counts="metadata"``, the default)
---------------------------------------------------------------------

* **Snowflake**: one query per warehouse, ``information_schema.tables.row_count`` (one
  ``UNION ALL`` branch per database named by three-part table names); exact for tables,
  NULL for views (reported per table).
* **BigQuery**: one query per warehouse, ``UNION ALL`` of ``<project>.<dataset>.__TABLES__``
  per dataset (``row_count``; ``type`` 1 = table). ``__TABLES__`` does not count rows still in
  the streaming buffer. The bqemulator used in the tests has no ``__TABLES__`` (404) and a
  broken ``INFORMATION_SCHEMA.TABLES``; there the catalog query fails and the warehouse's whole
  table specs are reported as skipped, while partition counts work (see the tests).
* **DuckDB**: ``duckdb_tables().estimated_size`` is *not* exact: measured on DuckDB 2.0.1, a
  100,000-row table with a third of its rows deleted still reports 100,000, also after
  ``CHECKPOINT`` and reopening; only row groups deleted entirely are dropped (``DELETE`` of
  all rows + checkpoint reports 0). ``pragma_storage_info`` segment counts include deleted rows
  too. No catalog function gives the exact count, but DuckDB answers an unfiltered
  ``COUNT(*)`` from row-group statistics (``EXPLAIN`` shows a constant scan; 0.9 ms on 50 M rows,
  65 ms with a seventh of them deleted). So DuckDB counts are: one catalog query
  (``duckdb_tables()``: which watched tables exist) and then ``COUNT(*)`` in ``UNION ALL``
  statements of at most 100 tables, all on one connection. Measured on 5,000 small tables:
  catalog 22 ms; 5,000 single ``COUNT(*)`` statements 1.56 s; one 5,000-branch ``UNION ALL``
  2.15 s (planning grows faster than linearly); batches of 100: 0.33 s, of 500: 0.50 s.
* **Other dialects** and ``row_counts="count"``: ``COUNT(*)`` in ``UNION ALL`` batches of 100
  tables, without a catalog query (exact everywhere, views included; on BigQuery an unfiltered
  ``COUNT(*)`` of a native table is answered from metadata and bills 0 bytes).

``COUNT(*)`` with a ``WHERE`` is issued only for a spec that names a ``partition_column``:
the rows of one partition (by default yesterday's UTC date, :func:`days_ago`), batched the same
way. A batch that fails is retried table by table, so one bad table never hides the others.

History, cursor and observations
--------------------------------

The history is kept in Dagster: each recorded count is an ``AssetObservation`` on the table's
asset with ``dagster/row_count`` and ``dw/volume_table`` (plus status, band and change keys);
the baseline of a table is its last ``history_length`` recorded counts (for a partitioned spec:
the newest count of each of its last ``history_length`` other partitions).

Observation metadata: ``dagster/row_count`` (rows; of the partition for a partitioned spec),
``dw/volume_table`` (the spec id ``database:table[#partition_column]``), ``dw/volume_status``
(``ok``, ``low``, ``high``, ``no_rows``, ``grew``, ``insufficient_history``),
``dw/volume_source`` (where the count came from), ``dw/volume_partition``, ``dw/volume_change``
(rows since the previous recorded count of the same partition), ``dw/volume_baseline_n``
(baseline size), ``dw/volume_mean`` / ``dw/volume_lower`` / ``dw/volume_upper`` (rows: the
band's centre - the median for ``method="mad"`` - and bounds), ``dw/volume_deviation_pct`` (% from
the centre), ``dw/volume_dead_letter`` and ``dw/volume_open_incident``.

*When a count is recorded.* Only when it changed since the table's last recorded count (or its
partition changed), or when the last one is ``record_unchanged_every_seconds`` old (default one
day), so an unchanged table writes one event per day, not one per tick. Every recorded count is
scored against the counts recorded before it (the tested value is never part of its own
baseline); an unchanged count is not scored again. Measured: the Dagster daemon stores a tick's
asset events one by one (``report_runless_asset_event``), 6 ms per event on a SQLite instance on
disk and 1 ms in memory, so recording 5,000 tables on every tick would cost it 5-30 s per tick;
with this rule the first tick writes one observation per table and later ticks only the tables
that changed.

*Where the rolling history is cached.* Reading 5,000 assets' history from the event log costs
2.6 ms per asset on SQLite (13 s), too slow for every tick; keeping it in the sensor cursor was
measured too: 5,000 tables × 28 counts is 1.3 MB of JSON, 0.44-0.62 MB zlib-compressed, and
Dagster stores the cursor with *every* tick (``TickData.cursor``; skipped ticks are kept 7 days
by default), i.e. about 1.2 GB of tick rows per week at one tick per 5 minutes. So the rolling
history lives in the sensor's process (a code server - ``dagster dev``, ``dagster code-server``,
a container of a deployment - evaluates every tick of a sensor in the same long-lived process), and the cursor is a small token ``{"v": 1, "epoch": ..., "tick": n}``
naming the in-memory snapshot it belongs to. The cache is used only when the cursor names the
snapshot this process holds (the last two are kept, so a tick whose result the daemon failed to
store is simply evaluated again); otherwise - no cursor, an unreadable cursor ("Starting from
scratch" is logged), a restarted code server, another replica - the history is rebuilt from the
observations in the instance, once, in that tick (newest ``history_length`` volume observations
per asset, one event-log query per asset for most assets). That costs about 2 ms per asset
(``volume_tick_5000``: 10.8-15.8 s for 5,000 assets on an in-memory instance on a loaded 2-core
machine; 2.6 ms per asset on a SQLite instance on disk), once per code-server start; with Dagster's default 60 s sensor
evaluation timeout, split much more than 20,000 tables over several sensors.

Failures never fail the tick: a missing table is listed in the skip reason and the log; a warehouse
that cannot be reached, or whose catalog query fails, has its tables skipped for this tick with a
logged error while the others are scored (a DuckDB file whose write lock another process holds
for more than :data:`DUCKDB_LOCK_WAIT_S` seconds too); an unexpected error is logged and the tick
is skipped with the cursor unchanged.

Incidents
---------

A count scored ``low``, ``high`` or ``no_rows`` (0 rows under a baseline band above 0) or, for a
dead-letter spec, any growth against the previous recorded count (``grew``, with the increase in
rows) opens one incident: an ``AssetObservation`` with ``dw/incident`` / ``dw/incident_id`` on the
table's asset, and a ``RunRequest`` of ``diagnosis_job_name`` when given (run key
``dw_volume:<table>:<partition>:<window start>..<window end>``, the window being the time between
the previous recorded count and this one, so it never repeats). While the asset has an open
incident (no receipt closed it, :func:`dw_dagster.remediation.sensors.open_incident`), no other
is opened; the observation names the open one instead. ``insufficient_history`` is an explicit
status of its own: neither a pass nor an incident.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal

import dagster as dg
from sqlglot import exp

from dw_dagster import constants as c
from dw_dagster import sql
from dw_dagster.checks.volume import BaselineScore, score_against_baseline
from dw_dagster.databases import Database, DatabaseError, DuckDBDatabase
from dw_dagster.models import Incident, stable_hash, utcnow
from dw_dagster.remediation.sensors import DIAGNOSE_OP, open_incident, record_incident

ROW_COUNT_KEY = "dagster/row_count"
VOLUME_TABLE_KEY = "dw/volume_table"
VOLUME_STATUS_KEY = "dw/volume_status"
VOLUME_SOURCE_KEY = "dw/volume_source"
VOLUME_PARTITION_KEY = "dw/volume_partition"
VOLUME_CHANGE_KEY = "dw/volume_change"
VOLUME_BASELINE_N_KEY = "dw/volume_baseline_n"
VOLUME_MEAN_KEY = "dw/volume_mean"
VOLUME_LOWER_KEY = "dw/volume_lower"
VOLUME_UPPER_KEY = "dw/volume_upper"
VOLUME_DEVIATION_KEY = "dw/volume_deviation_pct"
VOLUME_DEAD_LETTER_KEY = "dw/volume_dead_letter"
VOLUME_OPEN_INCIDENT_KEY = "dw/volume_open_incident"
VOLUME_TABLE_TAG = "dw/volume_table"

#: statuses that open an incident
ANOMALY_STATUSES = frozenset({"low", "high", "no_rows", "grew"})
#: tables per ``UNION ALL`` count statement (measured: 100 is the fastest on DuckDB, see above)
COUNT_BATCH = 100
#: seconds a tick waits for a DuckDB file another process holds the write lock of (then that
#: warehouse is skipped for the tick; a job step waits ``DuckDBDatabase.lock_wait_s``, 120 s)
DUCKDB_LOCK_WAIT_S = 15.0

_CURSOR_VERSION = 1
# characters refused in watched names even though every name is quoted: none is needed by a real
# table, and each is a sign of a name built from untrusted text
_REFUSED_SEQUENCES = (";", "'", '"', "--", "/*", "*/")

PartitionValue = dt.date | str | int
PartitionSpec = PartitionValue | Callable[[dt.datetime], PartitionValue] | None


def days_ago(days: int) -> Callable[[dt.datetime], dt.date]:
    """A partition selector: the UTC date ``days`` days before the tick (0 = today).

    Example: ``VolumeTable("pos.sales_line", "store_sales_line", partition_column="sale_ts",
    partition=days_ago(0))`` counts today's rows so far.
    """
    if not isinstance(days, int) or days < 0:
        raise ValueError(f"days_ago needs a whole number of days >= 0, got {days!r}")

    def _select(now: dt.datetime) -> dt.date:
        return (now.astimezone(dt.timezone.utc) - dt.timedelta(days=days)).date()

    _select.__name__ = f"days_ago({days})"
    return _select


def _check_name(what: str, name: str, *, table: bool) -> None:
    """Raise :class:`~dw_dagster.sql.UnsafeIdentifierError` for a name the sensor will not use."""
    if not isinstance(name, str):
        raise sql.UnsafeIdentifierError(f"volume sensor: {what} must be a string, got {type(name).__name__}")
    for bad in _REFUSED_SEQUENCES:
        if bad in name:
            raise sql.UnsafeIdentifierError(
                f"volume sensor: {what} {name!r} holds {bad!r}; names with quotes, ';' or comment markers are refused")
    if name != name.strip():
        raise sql.UnsafeIdentifierError(f"volume sensor: {what} {name!r} has leading or trailing blanks")
    try:
        sql.table(name) if table else sql.identifier(name)
    except sql.UnsafeIdentifierError as e:
        raise sql.UnsafeIdentifierError(f"volume sensor: {what}: {e}") from None


@dataclasses.dataclass(frozen=True)
class VolumeTable:
    """One watched table: where it lives, which asset it belongs to, what to count.

    Args:
        table: ``table``, ``schema.table`` or ``catalog.schema.table`` (BigQuery:
            ``dataset.table`` or ``project.dataset.table``); each part is quoted by sqlglot.
        asset_key: the Dagster asset the counts are recorded on (``"a/b"``, ``["a", "b"]`` or an
            ``AssetKey``).
        database: key of the warehouse: a key of ``build_volume_sensor(databases=...)`` or the
            key of a Dagster resource (a :class:`~dw_dagster.databases.DatabaseResource`, a
            ``Database``, a ``dagster_snowflake.SnowflakeResource`` or a
            ``dagster_gcp.BigQueryResource``).
        partition_column: a date or timestamp column (or any column, with a literal
            ``partition``); when given, the rows of one partition are counted with
            ``COUNT(*) ... WHERE`` instead of the table's row count from the catalog.
        partition: which partition: a date (rows with ``partition_column`` in that UTC day), a
            string or integer (rows where ``partition_column`` equals it), or a function of the
            tick time (aware UTC datetime) returning one of those. Default
            ``days_ago(1)``: yesterday, the last complete day, because the baseline is the
            other partitions' counts and a partition still being loaded would read as "low".
        dead_letter: a dead-letter table: every increase against the previous recorded count is
            reported (``grew``), no baseline is used.

    Raises:
        dw_dagster.sql.UnsafeIdentifierError: a table or column name is empty, longer than 255
            characters, has more than 3 parts, or holds a control character, a backslash, a
            backtick, a quote, ``;``, ``--``, ``/*`` or leading/trailing blanks.
        ValueError: ``database`` is not a valid resource key, or ``partition`` is given without
            ``partition_column``.
    """

    table: str
    asset_key: dg.AssetKey | str | Sequence[str]
    database: str = "warehouse"
    partition_column: str | None = None
    partition: PartitionSpec = None
    dead_letter: bool = False

    def __post_init__(self) -> None:
        _check_name("table name", self.table, table=True)
        if self.partition_column is not None:
            _check_name("partition column", self.partition_column, table=False)
        elif self.partition is not None:
            raise ValueError(f"volume sensor: {self.table}: partition given without partition_column")
        if not isinstance(self.database, str) or not self.database.isidentifier():
            raise ValueError(f"volume sensor: database key {self.database!r} is not a valid resource key")
        key = self.asset_key
        if isinstance(key, str):
            key = dg.AssetKey.from_user_string(key)
        elif not isinstance(key, dg.AssetKey):
            key = dg.AssetKey(list(key))
        object.__setattr__(self, "asset_key", key)
        if self.partition_column is not None and self.partition is None:
            object.__setattr__(self, "partition", days_ago(1))
        object.__setattr__(self, "_id", f"{self.database}:{self.table}"
                           + (f"#{self.partition_column}" if self.partition_column else ""))
        object.__setattr__(self, "_parts", tuple(self.table.split(".")))

    @property
    def id(self) -> str:
        """``database:table`` (``#partition_column`` appended for a partitioned spec): the key of
        the table's history, stored as ``dw/volume_table`` on its observations."""
        return self._id  # type: ignore[attr-defined]

    @property
    def parts(self) -> tuple[str, ...]:
        """The dot-separated parts of ``table``."""
        return self._parts  # type: ignore[attr-defined]

    def partition_value(self, now: dt.datetime) -> PartitionValue | None:
        """The partition to count at tick time ``now`` (None for a whole-table spec)."""
        if self.partition_column is None:
            return None
        v = self.partition(now) if callable(self.partition) else self.partition
        if isinstance(v, dt.datetime):
            v = v.date()
        if not isinstance(v, (dt.date, str, int)) or isinstance(v, bool):
            raise TypeError(f"{self.id}: partition must be a date, str or int, got {type(v).__name__}")
        return v


# -- counting ---------------------------------------------------------------------------------


@dataclasses.dataclass
class TableCount:
    """The count of one spec in one tick.

    Attributes:
        rows: rows in the table (or in the partition); None when not counted.
        partition: the partition counted, as text (ISO date for dates); None for a whole table.
        source: where the number came from (``information_schema.tables.row_count``,
            ``__TABLES__.row_count``, ``count(*)``, ``count(*) where partition``).
        missing: the table does not exist (or is not visible to the warehouse's credentials).
        error: why the table was not counted (None when counted).
    """

    rows: int | None = None
    partition: str | None = None
    source: str = ""
    missing: bool = False
    error: str | None = None


@dataclasses.dataclass
class WarehouseCounts:
    """What :func:`fetch_row_counts` found on one warehouse.

    Attributes:
        counts: spec id → :class:`TableCount` for every spec asked for.
        queries: every statement sent, in order (the catalog query first).
        error: the catalog query's error, when it failed (its specs carry it too).
    """

    counts: dict[str, TableCount]
    queries: list[str]
    error: str | None = None


class _Session:
    """Statements on one database; one connection for a DuckDB file (opening one costs ~75 ms for
    a file of 5,000 tables), ``fetch_all`` per statement otherwise. Every statement is recorded."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.queries: list[str] = []
        self._con = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Session:
        if isinstance(self.db, DuckDBDatabase):
            db = copy.copy(self.db)  # a sensor tick waits less for a writer's lock than a job step does
            db.lock_wait_s = min(db.lock_wait_s, DUCKDB_LOCK_WAIT_S)
            try:
                self._con = self._stack.enter_context(db.connect())
            except Exception as e:
                raise DatabaseError(f"{self.db.name}: cannot open: {e}") from e
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def fetch(self, statement: str) -> list[tuple]:
        self.queries.append(statement)
        if self._con is None:
            return self.db.fetch_all(statement)
        try:
            return self._con.execute(statement).fetchall()
        except Exception as e:
            short = " ".join(statement.split())[:300]
            raise DatabaseError(f"{self.db.name}: query failed: {e}\n  SQL: {short}") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:500]


def _looks_missing(message: str) -> bool:
    """A count failed because the table is not there (DuckDB, Snowflake, BigQuery and its emulator's
    wording), not because of a column or the connection."""
    m = message.lower()
    if "column" in m or "unrecognized name" in m or "invalid identifier" in m:
        return False
    return any(s in m for s in ("does not exist", "not found: table", "doesn't exist", "unknown table", "no such table"))


@lru_cache(maxsize=65536)
def _table_sql(parts: tuple[str, ...], dialect: str) -> str:
    return sql.table(list(parts)).sql(dialect=dialect)


def _literal_sql(value: object, dialect: str) -> str:
    return sql.literal(value).sql(dialect=dialect)


@lru_cache(maxsize=65536)
def _where_sql(column: str, value: PartitionValue, dialect: str) -> str:
    col = sql.column(column)
    if isinstance(value, dt.date):
        lo = dt.datetime.combine(value, dt.time())
        cond = exp.and_(exp.GTE(this=col, expression=sql.literal(lo)),
                        exp.LT(this=col.copy(), expression=sql.literal(lo + dt.timedelta(days=1))))
    else:
        cond = exp.EQ(this=col, expression=sql.literal(value))
    return cond.sql(dialect=dialect)


def _partition_text(value: PartitionValue | None) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def _count_branches(
    session: _Session, items: Sequence[tuple[str, str]], batch_size: int
) -> dict[str, tuple[int | None, str | None]]:
    """Run ``SELECT <i> AS i, COUNT(*) AS n FROM <t> [WHERE ...]`` branches in ``UNION ALL``
    batches; a failing batch is retried one branch at a time. Returns id → (rows, error)."""
    out: dict[str, tuple[int | None, str | None]] = {}
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        text = " UNION ALL ".join(f"SELECT {i} AS i, COUNT(*) AS n FROM {body}" for i, (_, body) in enumerate(chunk))
        try:
            for i, n in session.fetch(text):
                out[chunk[int(i)][0]] = (int(n), None)
        except Exception:
            for tid, body in chunk:
                try:
                    ((_, n),) = session.fetch(f"SELECT 0 AS i, COUNT(*) AS n FROM {body}")
                    out[tid] = (int(n), None)
                except Exception as e:
                    out[tid] = (None, _first_line(e))
        for tid, _ in chunk:
            out.setdefault(tid, (None, "no row returned for this table"))
    return out


def _catalog_duckdb(session: _Session, specs: Sequence[VolumeTable]) -> dict[str, tuple[str, ...] | None]:
    """Spec id → the (database, schema, table) the catalog holds for it, or None when missing."""
    rows = session.fetch(
        "SELECT database_name, schema_name, table_name, current_database(), current_schema() "
        "FROM duckdb_tables() WHERE NOT internal")
    exact: dict[tuple[str, str, str], tuple[str, ...]] = {}
    folded: dict[tuple[str, str, str], tuple[str, ...]] = {}
    cur_db = cur_schema = None
    for db_name, schema, name, cur_db, cur_schema in rows:
        exact[(db_name, schema, name)] = (db_name, schema, name)
        folded.setdefault((db_name.lower(), schema.lower(), name.lower()), (db_name, schema, name))
    out: dict[str, tuple[str, ...] | None] = {}
    for s in specs:
        p = s.parts
        full = (p if len(p) == 3 else ((cur_db,) + p if len(p) == 2 else (cur_db, cur_schema) + p))
        if None in full:
            out[s.id] = None
            continue
        out[s.id] = exact.get(full) or folded.get(tuple(x.lower() for x in full))  # DuckDB names are case-insensitive
    return out


def _catalog_snowflake(session: _Session, specs: Sequence[VolumeTable]) -> dict[str, tuple[int | None, str | None]]:
    """Spec id → (row_count, error) from ``information_schema.tables``, one query for all specs.

    Names are matched as given and upper-cased (Snowflake folds unquoted names to upper case)."""
    groups: dict[str | None, list[VolumeTable]] = {}
    for s in specs:
        groups.setdefault(s.parts[0] if len(s.parts) == 3 else None, []).append(s)
    branches = []
    labels = list(groups)
    for k, catalog in enumerate(labels):
        members = groups[catalog]
        schemas = sorted({v for s in members if len(s.parts) >= 2 for v in (s.parts[-2], s.parts[-2].upper())})
        names = sorted({v for s in members for v in (s.parts[-1], s.parts[-1].upper())})
        source = _table_sql((catalog, "information_schema", "tables") if catalog else ("information_schema", "tables"), "snowflake")
        conds = []
        if schemas:
            conds.append("table_schema IN (" + ", ".join(_literal_sql(v, "snowflake") for v in schemas) + ")")
        if any(len(s.parts) == 1 for s in members):
            conds.append("table_schema = CURRENT_SCHEMA()")
        branches.append(
            f"SELECT {k} AS k, table_schema, table_name, row_count, CURRENT_SCHEMA() AS cur FROM {source} "
            f"WHERE ({' OR '.join(conds)}) AND table_name IN ({', '.join(_literal_sql(v, 'snowflake') for v in names)})")
    rows = session.fetch(" UNION ALL ".join(branches))
    exact: dict[tuple, Any] = {}
    folded: dict[tuple, Any] = {}
    cur = None
    for k, schema, name, row_count, cur in rows:
        exact[(int(k), schema, name)] = row_count
        folded.setdefault((int(k), schema.upper(), name.upper()), row_count)
    out: dict[str, tuple[int | None, str | None]] = {}
    for k, catalog in enumerate(labels):
        for s in groups[catalog]:
            schema = s.parts[-2] if len(s.parts) >= 2 else cur
            key = (k, schema, s.parts[-1])
            if schema is None or (key not in exact and (k, schema.upper(), s.parts[-1].upper()) not in folded):
                out[s.id] = (None, "missing")
                continue
            n = exact[key] if key in exact else folded[(k, schema.upper(), s.parts[-1].upper())]
            out[s.id] = (int(n), None) if n is not None else (None, "the catalog has no row count (a view?)")
    return out


def _catalog_bigquery(session: _Session, db: Database, specs: Sequence[VolumeTable]) -> dict[str, tuple[int | None, str | None]]:
    """Spec id → (row_count, error) from ``__TABLES__`` of each dataset, one ``UNION ALL`` query."""
    default_dataset = getattr(db, "dataset", None)
    groups: dict[tuple[str, ...], list[VolumeTable]] = {}
    out: dict[str, tuple[int | None, str | None]] = {}
    for s in specs:
        if len(s.parts) == 1:
            if not default_dataset:
                out[s.id] = (None, "a one-part name needs the database's default dataset")
                continue
            ds: tuple[str, ...] = tuple(str(default_dataset).split("."))
        else:
            ds = s.parts[:-1]
        groups.setdefault(ds, []).append(s)
    if not groups:
        return out
    labels = list(groups)
    branches = []
    for k, ds in enumerate(labels):
        names = sorted({s.parts[-1] for s in groups[ds]})
        branches.append(f"SELECT {k} AS k, table_id, row_count, type FROM {_table_sql(ds + ('__TABLES__',), 'bigquery')} "
                        f"WHERE table_id IN ({', '.join(_literal_sql(v, 'bigquery') for v in names)})")
    found: dict[tuple[int, str], tuple[Any, Any]] = {}
    for k, table_id, row_count, kind in session.fetch(" UNION ALL ".join(branches)):
        found[(int(k), table_id)] = (row_count, kind)
    for k, ds in enumerate(labels):
        for s in groups[ds]:
            hit = found.get((k, s.parts[-1]))
            if hit is None:
                out[s.id] = (None, "missing")
            elif hit[1] is not None and int(hit[1]) != 1:
                out[s.id] = (None, f"not a native table (__TABLES__ type {hit[1]}); use row_counts='count'")
            else:
                out[s.id] = (int(hit[0] or 0), None)
    return out


def fetch_row_counts(
    db: Database,
    tables: Sequence[VolumeTable],
    *,
    now: dt.datetime | None = None,
    row_counts: Literal["metadata", "count"] = "metadata",
    batch_size: int = COUNT_BATCH,
) -> WarehouseCounts:
    """Count the rows of every spec in ``tables`` on one warehouse, with as few statements as possible.

    See the module docstring for the statements per dialect. Never raises for a table or a query:
    a missing table, a failing batch or a failing catalog query end up in the result.

    Args:
        db: the warehouse (its ``dialect`` picks the catalog query).
        tables: specs whose ``database`` is this warehouse.
        now: tick time (aware UTC), for partition selectors; default now.
        row_counts: ``"metadata"`` (catalog row counts where the warehouse has exact ones) or
            ``"count"`` (``COUNT(*)`` batches everywhere).
        batch_size: tables per ``UNION ALL`` count statement.

    Returns:
        A :class:`WarehouseCounts` with a :class:`TableCount` for every spec.

    Raises:
        dw_dagster.databases.DatabaseError: only when a DuckDB file cannot be opened at all.
    """
    if row_counts not in ("metadata", "count"):
        raise ValueError(f"row_counts must be 'metadata' or 'count', got {row_counts!r}")
    now = now or utcnow()
    dialect = db.dialect
    counts: dict[str, TableCount] = {}
    catalog_error = None
    with _Session(db) as session:
        whole = [s for s in tables if s.partition_column is None]
        parted = [s for s in tables if s.partition_column is not None]
        to_count: list[tuple[str, str]] = []  # (spec id, "<table> [WHERE ...]")
        sources: dict[str, str] = {}
        partitions: dict[str, str | None] = {}
        for s in parted:
            try:
                value = s.partition_value(now)
            except Exception as e:
                counts[s.id] = TableCount(source="count(*) where partition", error=f"partition selector failed: {_first_line(e)}")
                continue
            partitions[s.id] = _partition_text(value)
            to_count.append((s.id, f"{_table_sql(s.parts, dialect)} WHERE {_where_sql(s.partition_column, value, dialect)}"))
            sources[s.id] = "count(*) where partition"
        if row_counts == "metadata" and dialect == "duckdb":
            try:
                found = _catalog_duckdb(session, tables)
            except Exception as e:
                catalog_error = _first_line(e)
                found = {}
            if catalog_error is not None:
                for s in whole:
                    counts[s.id] = TableCount(source="count(*)", error=f"catalog query failed: {catalog_error}")
            else:
                for s in tables:
                    if found.get(s.id) is None and s.id not in counts:
                        counts[s.id] = TableCount(partition=partitions.get(s.id), source=sources.get(s.id, "count(*)"),
                                                  missing=True, error="missing")
                to_count = [(tid, body) for tid, body in to_count if tid not in counts]
                for s in whole:
                    if s.id not in counts:
                        to_count.append((s.id, _table_sql(found[s.id], dialect)))
                        sources[s.id] = "count(*)"
        elif row_counts == "metadata" and dialect in ("snowflake", "bigquery"):
            label = "information_schema.tables.row_count" if dialect == "snowflake" else "__TABLES__.row_count"
            try:
                meta = _catalog_snowflake(session, tables) if dialect == "snowflake" else _catalog_bigquery(session, db, tables)
            except Exception as e:
                catalog_error = _first_line(e)
                meta = None
            for s in whole:
                if meta is None:
                    counts[s.id] = TableCount(source=label, error=f"catalog query failed: {catalog_error}")
                else:
                    n, err = meta.get(s.id, (None, "missing"))
                    counts[s.id] = TableCount(rows=n, source=label, missing=err == "missing", error=err)
            if meta is not None:  # a partitioned spec whose table the catalog does not hold is missing
                for s in parted:
                    if s.id not in counts and meta.get(s.id, (None, None))[1] == "missing":
                        counts[s.id] = TableCount(partition=partitions.get(s.id), source=sources[s.id], missing=True, error="missing")
                to_count = [(tid, body) for tid, body in to_count if tid not in counts]
        else:
            for s in whole:
                to_count.append((s.id, _table_sql(s.parts, dialect)))
                sources[s.id] = "count(*)"
        known = catalog_error is None and row_counts == "metadata" and dialect in ("duckdb", "snowflake", "bigquery")
        for tid, (n, err) in _count_branches(session, to_count, batch_size).items():
            # a table the catalog listed is there: its error is about something else (a column, a type)
            counts[tid] = TableCount(rows=n, partition=partitions.get(tid), source=sources[tid],
                                     missing=err is not None and not known and _looks_missing(err), error=err)
    return WarehouseCounts(counts=counts, queries=session.queries, error=catalog_error)


# -- history ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TableHistory:
    """A table's recorded counts, oldest first, as cached between ticks.

    Attributes:
        entries: ``(partition or None, rows)`` per recorded observation; a partitioned spec keeps
            one entry (its newest count) per partition.
        recorded_at: epoch seconds of the newest recorded observation (None: never recorded).
    """

    entries: tuple[tuple[str | None, int], ...] = ()
    recorded_at: float | None = None

    @property
    def last(self) -> tuple[str | None, int] | None:
        return self.entries[-1] if self.entries else None


def _append(h: TableHistory, partition: str | None, rows: int, at: float, keep: int, partitioned: bool) -> TableHistory:
    if partitioned:
        entries = tuple(e for e in h.entries if e[0] != partition) + ((partition, rows),)
        entries = entries[-(keep + 1):]
    else:
        entries = (h.entries + ((None, rows),))[-keep:]
    return TableHistory(entries=entries, recorded_at=at)


def history_from_observations(
    instance: dg.DagsterInstance, tables: Sequence[VolumeTable], history_length: int,
    on_error: Callable[[str], None] | None = None,
) -> dict[str, TableHistory]:
    """Rebuild every spec's :class:`TableHistory` from its volume observations in ``instance``.

    One ``fetch_observations`` query per asset key, newest first, paged when other observations
    (incidents, receipts) sit between the volume ones; at most ``50 × (history_length + 1)``
    records are read per asset. An asset whose records cannot be read starts with no history
    (``on_error`` is told).

    Returns:
        spec id → history (empty history for specs never recorded).
    """
    by_key: dict[dg.AssetKey, list[VolumeTable]] = {}
    for s in tables:
        by_key.setdefault(s.asset_key, []).append(s)
    out = {s.id: TableHistory() for s in tables}
    page = history_length + 4
    cap = 50 * (history_length + 1)
    for key, specs in by_key.items():
        want = {s.id: s for s in specs}
        got: dict[str, list[tuple[str | None, int, float]]] = {tid: [] for tid in want}
        done: set[str] = set()
        cursor, scanned = None, 0
        try:
            while len(done) < len(want) and scanned < cap:
                res = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=key), limit=page, cursor=cursor, ascending=False)
                for rec in res.records:
                    scanned += 1
                    obs = rec.asset_observation
                    md = obs.metadata if obs else {}
                    tid = getattr(md.get(VOLUME_TABLE_KEY), "value", None)
                    if tid not in want or tid in done or ROW_COUNT_KEY not in md:
                        continue
                    part = getattr(md.get(VOLUME_PARTITION_KEY), "value", None)
                    rows = int(md[ROW_COUNT_KEY].value)
                    lst = got[tid]
                    if want[tid].partition_column is None:
                        lst.append((None, rows, rec.timestamp))
                        if len(lst) >= history_length:
                            done.add(tid)
                    else:
                        if all(p != part for p, _, _ in lst):
                            lst.append((None if part is None else str(part), rows, rec.timestamp))
                        if len(lst) >= history_length + 1:
                            done.add(tid)
                if not res.has_more:
                    break
                cursor = res.cursor
                page = min(page * 4, 1000)
        except Exception as e:
            if on_error:
                on_error(f"reading the volume observations of {key.to_user_string()} failed: {_first_line(e)}")
            continue
        for tid, lst in got.items():
            if lst:
                out[tid] = TableHistory(entries=tuple((p, r) for p, r, _ in reversed(lst)), recorded_at=lst[0][2])
    return out


class _HistoryCache:
    """In-process snapshots of every table's history, keyed by the cursor token ``(epoch, tick)``.

    Keeps the snapshot the last cursor named and the one built from it, nothing older."""

    def __init__(self) -> None:
        self._snaps: dict[tuple[str, int], dict[str, TableHistory]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int] | None) -> dict[str, TableHistory] | None:
        with self._lock:
            return self._snaps.get(key) if key else None

    def put(self, previous: tuple[str, int] | None, key: tuple[str, int], tables: dict[str, TableHistory]) -> None:
        with self._lock:
            keep = {k: v for k, v in self._snaps.items() if k == previous}
            keep[key] = tables
            self._snaps = keep


def _parse_cursor(text: str | None) -> tuple[tuple[str, int] | None, str | None]:
    """``((epoch, tick), None)`` for a valid cursor, ``(None, why)`` otherwise (``why`` None: no cursor)."""
    if not text:
        return None, None
    try:
        data = json.loads(text)
        if (isinstance(data, dict) and data.get("v") == _CURSOR_VERSION and isinstance(data.get("epoch"), str)
                and 0 < len(data["epoch"]) <= 64 and isinstance(data.get("tick"), int) and data["tick"] >= 0):
            return (data["epoch"], data["tick"]), None
    except ValueError:
        pass
    return None, f"Failed to interpret cursor {text[:80]!r}. Starting from scratch: rebuilding the history from observations."


def _cursor_text(key: tuple[str, int], tables: int) -> str:
    return json.dumps({"v": _CURSOR_VERSION, "epoch": key[0], "tick": key[1], "tables": tables}, sort_keys=True)


# -- databases --------------------------------------------------------------------------------


def _is_database(v: object) -> bool:
    return hasattr(v, "fetch_all") and isinstance(getattr(v, "dialect", None), str)


def _as_database(key: str, res: object) -> Database:
    if hasattr(res, "get_database"):
        return res.get_database()
    if _is_database(res):
        return res  # type: ignore[return-value]
    kind = type(res).__name__
    if kind == "SnowflakeResource":
        from dw_dagster.warehouses import SnowflakeDatabase

        return SnowflakeDatabase(res)
    if kind == "BigQueryResource":
        from dw_dagster.warehouses import BigQueryDatabase

        return BigQueryDatabase(res)
    raise TypeError(f"resource {key!r} is a {kind}: not a DatabaseResource, Database, SnowflakeResource or BigQueryResource")


def _resource(context: dg.SensorEvaluationContext, key: str, stack: contextlib.ExitStack) -> object:
    """A resource by key: from the context (the daemon builds the sensor's required resources),
    else built from the code location's top-level resources (``build_sensor_context(definitions=...)``
    does not build them)."""
    with contextlib.suppress(Exception):
        return getattr(context.resources, key)
    repo = context.repository_def
    defs = repo.get_top_level_resources() if repo is not None else {}
    if key not in defs:
        raise KeyError(f"no warehouse {key!r}: not in databases= and not a resource of this code location")
    built = stack.enter_context(dg.build_resources({key: defs[key]}, instance=context.instance))
    return getattr(built, key)


# -- the sensor -------------------------------------------------------------------------------


@dataclasses.dataclass
class _Outcome:
    spec: VolumeTable
    status: str
    rows: int | None = None
    detail: str = ""


def _fmt(v: float | None) -> str:
    return "?" if v is None else f"{v:,.0f}"


def _shorten(items: list[str], n: int = 8) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def build_volume_sensor(
    *,
    tables: Sequence[VolumeTable],
    databases: Mapping[str, Database | Callable[[], Database]] | None = None,
    name: str = "dw_volume_sensor",
    method: str = "zscore",
    sensitivity: float = 3.0,
    min_history: int = 7,
    history_length: int = 28,
    min_band_pct: float = 2.0,
    record_unchanged_every_seconds: float = 86_400,
    row_counts: Literal["metadata", "count"] = "metadata",
    minimum_interval_seconds: int = 300,
    diagnosis_job_name: str | None = None,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
    clock: Callable[[], dt.datetime] | None = None,
) -> dg.SensorDefinition:
    """A sensor that watches the row counts of many tables and opens an incident per anomaly.

    Each tick: one catalog query per warehouse (plus ``COUNT(*)`` batches where the module
    docstring says so), each changed count scored against its table's baseline and recorded
    as an ``AssetObservation``, one incident per anomalous table (see the module docstring for
    where counts come from, when they are recorded and how the history is kept).

    Args:
        tables: the watched tables (:class:`VolumeTable`); ids must be unique.
        databases: warehouse key → :class:`~dw_dagster.databases.Database` or a zero-argument
            callable returning one (called every tick). A spec's ``database`` not in this mapping
            is a Dagster resource key (declared as a required resource of the sensor).
        name: sensor name.
        method: ``"zscore"`` (mean and sample stddev, Elementary's) or ``"mad"`` (median and
            1.4826 × median absolute deviation), as in :func:`~dw_dagster.checks.build_volume_check`.
        sensitivity: band half-width in standard deviations (or scaled MADs); default 3.
        min_history: fewest earlier recorded counts (partitions, for a partitioned spec) needed
            to score; fewer gives the status ``insufficient_history``, never a pass or an incident.
        history_length: earlier recorded counts (partitions) in a baseline; default 28.
        min_band_pct: floor on the band half-width in % of the baseline mean (default 2 %), so a
            near-constant count does not alert on noise.
        record_unchanged_every_seconds: an unchanged count is recorded again after this many
            seconds (default 86,400 s: once a day); changed counts are recorded every tick.
        row_counts: ``"metadata"`` (default; catalog row counts where exact) or ``"count"``
            (``COUNT(*)`` batches on every warehouse; counts views too).
        minimum_interval_seconds: seconds between ticks (default 300).
        diagnosis_job_name: a job built by :func:`dw_dagster.diagnosis.build_diagnosis_job`;
            each new incident requests one run of it. None: incidents only.
        default_status: STOPPED unless told otherwise.
        clock: returns the tick time (aware UTC); for tests.

    Returns:
        A ``SensorDefinition``. Its cursor is ``{"v": 1, "epoch", "tick", "tables"}``, a token
        for the in-process history cache; a missing or unreadable cursor rebuilds the history
        from the observations. The skip reason summarises the tick (recorded counts by status,
        unchanged tables, missing tables, warehouse errors).

    Raises:
        ValueError: no tables, duplicate spec ids, an unknown ``method`` or ``row_counts``, or
            ``min_history`` < 1 or > ``history_length``.

    Examples:
        .. code-block:: python

            sensor = build_volume_sensor(
                tables=[VolumeTable("pos.sales_line", "store_sales_line"),
                        VolumeTable("pos.sales_line_dlq", "store_sales_line", dead_letter=True),
                        VolumeTable("pos.sales_line", "store_sales_line", partition_column="sale_ts")],
                diagnosis_job_name="dw_diagnose_incident",
            )
            defs = dg.Definitions(sensors=[sensor], resources={"warehouse": DatabaseResource(url=...)})
    """
    specs = list(tables)
    if not specs:
        raise ValueError("build_volume_sensor needs at least one table")
    if not all(isinstance(s, VolumeTable) for s in specs):
        raise TypeError("tables must be VolumeTable specs")
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"duplicate volume table specs: {', '.join(dup)}")
    if method not in ("zscore", "mad"):
        raise ValueError(f"method must be 'zscore' or 'mad', got {method!r}")
    if row_counts not in ("metadata", "count"):
        raise ValueError(f"row_counts must be 'metadata' or 'count', got {row_counts!r}")
    if not 1 <= min_history <= history_length:
        raise ValueError(f"need 1 <= min_history <= history_length, got {min_history} and {history_length}")
    dbs = dict(databases or {})
    resource_keys = {s.database for s in specs if s.database not in dbs}
    by_db: dict[str, list[VolumeTable]] = {}
    for s in specs:
        by_db.setdefault(s.database, []).append(s)
    cache = _HistoryCache()

    def _score(s: VolumeTable, rows: int, part: str | None, h: TableHistory) -> tuple[str, BaselineScore | None, int | None]:
        """(status, score, change vs the previous recorded count of the same partition)."""
        last = h.last
        if s.partition_column is None:
            previous = last[1] if last else None
        else:
            previous = next((r for p, r in reversed(h.entries) if p == part), None)
        change = None if previous is None else rows - previous
        if s.dead_letter:
            if not h.entries:
                return "insufficient_history", None, None
            change = rows - (previous or 0)
            return ("grew" if change > 0 else "ok"), None, change
        baseline = [r for p, r in h.entries if s.partition_column is None or p != part][-history_length:]
        sc = score_against_baseline(rows, baseline, sensitivity=sensitivity, min_history=min_history,
                                    min_band_pct=min_band_pct, method=method)
        status = sc.status
        if status == "no_rows" and not (sc.lower or 0) > 0:
            status = "ok"  # empty, as its baseline allows
        return status, sc, change

    def _incident(s: VolumeTable, rows: int, part: str | None, status: str, sc: BaselineScore | None,
                  change: int | None, h: TableHistory, now: dt.datetime) -> Incident:
        start = dt.datetime.fromtimestamp(h.recorded_at, dt.timezone.utc) if h.recorded_at else None
        where = f"{s.table} on {s.database}" + (f", partition {s.partition_column} = {part}" if part else "")
        if status == "grew":
            before = rows - (change or 0)
            summary = f"dead-letter table {where} grew by {change:,} rows ({before:,} → {rows:,})"
            gap_rows, gap_pct = int(change or 0), round((change or 0) / before * 100, 3) if before else 0.0
        else:
            mean = sc.mean if sc else None
            centre = "median" if method == "mad" else "mean"
            summary = (f"{where}: {rows:,} rows, {status} against its baseline {_fmt(sc.lower if sc else None)}–"
                       f"{_fmt(sc.upper if sc else None)} rows ({centre} {_fmt(mean)}"
                       + (f", {sc.deviation_pct:+.1f} %" if sc and sc.deviation_pct is not None else "")
                       + f", {sc.baseline_n if sc else 0} observations, {method})")
            gap_rows = int(round(mean - rows)) if mean is not None else 0
            gap_pct = round((mean - rows) / mean * 100, 3) if mean else 0.0
        if start:
            summary += f" since {start.isoformat(timespec='seconds')}"
        window = [start.isoformat() if start else None, now.isoformat()]
        return Incident(
            id="inc-" + stable_hash(["volume_sensor", s.id, part, window, rows], 12),
            asset_key=list(s.asset_key.path), source="volume_sensor", check_name=None, detected_at=now,
            summary=summary, gap_rows=gap_rows, gap_pct=gap_pct, window_start=start, window_end=now)

    def _evaluate(context: dg.SensorEvaluationContext):
        started = time.perf_counter()
        now = (clock or utcnow)()
        now_ts = now.timestamp()
        key, why = _parse_cursor(context.cursor)
        history = cache.get(key)
        notes: list[str] = []
        if why:
            context.log.warning(why)
            notes.append(why)
        if history is None:
            reason = "no cursor" if context.cursor is None or context.cursor == "" else (
                "unreadable cursor" if key is None else "history cache not in this process")
            t0 = time.perf_counter()
            history = history_from_observations(context.instance, specs, history_length, on_error=context.log.warning)
            known = sum(1 for h in history.values() if h.entries)
            msg = (f"{reason}: rebuilt the history of {len(specs)} tables from observations "
                   f"({known} with earlier counts) in {time.perf_counter() - t0:.2f} s")
            context.log.info(f"{name}: {msg}")
            notes.append(msg)
            key, previous_key = (uuid.uuid4().hex[:16], 0), None
        else:
            previous_key = key

        outcomes: list[_Outcome] = []
        wh_errors: list[str] = []
        counts: dict[str, TableCount] = {}
        queries = 0
        with contextlib.ExitStack() as stack:
            for db_key, members in by_db.items():
                try:
                    if db_key in dbs:
                        v = dbs[db_key]
                        db = v if _is_database(v) else v()  # type: ignore[operator]
                    else:
                        db = _as_database(db_key, _resource(context, db_key, stack))
                    found = fetch_row_counts(db, members, now=now, row_counts=row_counts)
                except Exception as e:
                    msg = f"warehouse {db_key!r} skipped this tick: {type(e).__name__}: {_first_line(e)}"
                    context.log.error(msg)
                    wh_errors.append(msg)
                    outcomes.extend(_Outcome(s, "error", detail=msg) for s in members)
                    continue
                queries += len(found.queries)
                if found.error:
                    msg = f"warehouse {db_key!r}: catalog query failed: {found.error}"
                    context.log.error(msg)
                    wh_errors.append(msg)
                counts.update(found.counts)

        events: list[dg.AssetObservation] = []
        requests: list[dg.RunRequest] = []
        new_history = dict(history)
        opened_assets: set[dg.AssetKey] = set()
        for s in specs:
            if s.id not in counts:
                continue
            cnt = counts[s.id]
            if cnt.rows is None:
                outcomes.append(_Outcome(s, "missing" if cnt.missing else "error", detail=cnt.error or ""))
                continue
            h = history.get(s.id) or TableHistory()
            rows, part = cnt.rows, cnt.partition
            last = h.last
            changed = last is None or last != (part, rows)
            due = h.recorded_at is None or now_ts - h.recorded_at >= record_unchanged_every_seconds
            if not (changed or due):
                outcomes.append(_Outcome(s, "unchanged", rows))
                continue
            status, sc, change = _score(s, rows, part, h)
            md: dict[str, Any] = {ROW_COUNT_KEY: rows, VOLUME_TABLE_KEY: s.id, VOLUME_STATUS_KEY: status,
                                  VOLUME_SOURCE_KEY: cnt.source}
            if part is not None:
                md[VOLUME_PARTITION_KEY] = part
            if change is not None:
                md[VOLUME_CHANGE_KEY] = change
            if s.dead_letter:
                md[VOLUME_DEAD_LETTER_KEY] = True
            if sc is not None:
                md[VOLUME_BASELINE_N_KEY] = sc.baseline_n
                if sc.mean is not None:
                    md[VOLUME_MEAN_KEY], md[VOLUME_LOWER_KEY], md[VOLUME_UPPER_KEY] = sc.mean, sc.lower, sc.upper
                    if sc.deviation_pct is not None:
                        md[VOLUME_DEVIATION_KEY] = sc.deviation_pct
            detail = ""
            if status in ANOMALY_STATUSES:
                if s.asset_key in opened_assets:
                    detail = "incident opened this tick for the same asset"
                else:
                    existing = open_incident(context.instance, s.asset_key)
                    if existing is not None:
                        md[VOLUME_OPEN_INCIDENT_KEY] = existing.id
                        detail = f"incident {existing.id} still open"
                        context.log.info(f"{s.id}: {status}; {detail}")
                    else:
                        inc = _incident(s, rows, part, status, sc, change, h, now)
                        record_incident(context.instance, inc)  # the ledger: one open incident per asset
                        opened_assets.add(s.asset_key)
                        detail = f"incident {inc.id}"
                        events.append(dg.AssetObservation(
                            asset_key=s.asset_key, description=f"incident {inc.id}: {inc.summary}"[:1000],
                            metadata={c.INCIDENT_KEY: dg.MetadataValue.json(inc.model_dump(mode="json")),
                                      c.INCIDENT_ID_KEY: inc.id}))
                        context.log.warning(f"{s.id}: {inc.summary} -> incident {inc.id}")
                        if diagnosis_job_name:
                            since = (dt.datetime.fromtimestamp(h.recorded_at, dt.timezone.utc).isoformat()
                                     if h.recorded_at else "first")
                            window = f"{since}..{now.isoformat()}"
                            requests.append(dg.RunRequest(
                                run_key=f"dw_volume:{s.id}:{part or ''}:{window}", job_name=diagnosis_job_name,
                                run_config={"ops": {DIAGNOSE_OP: {"config": {"incident_json": inc.model_dump_json()}}}},
                                tags={c.INCIDENT_TAG: inc.id, VOLUME_TABLE_TAG: s.id}))
            band = f"; band {_fmt(sc.lower)}–{_fmt(sc.upper)}" if sc is not None and sc.mean is not None else ""
            events.append(dg.AssetObservation(
                asset_key=s.asset_key, metadata=md,
                description=f"{s.id}: {rows:,} rows" + (f" in partition {part}" if part else "") + f", {status}{band}"))
            new_history[s.id] = _append(h, part, rows, now_ts, history_length, s.partition_column is not None)
            outcomes.append(_Outcome(s, status, rows, detail))

        recorded = sum(1 for o in outcomes if o.status not in ("unchanged", "missing", "error"))
        new_key = (key[0], key[1] + 1) if recorded or previous_key is None else key
        cache.put(previous_key, new_key, new_history)

        by_status: dict[str, int] = {}
        for o in outcomes:
            by_status[o.status] = by_status.get(o.status, 0) + 1
        recorded_txt = ", ".join(f"{n} {st}" for st, n in sorted(by_status.items()) if st not in ("unchanged", "missing", "error"))
        parts = [f"{len(specs)} tables: {recorded} recorded" + (f" ({recorded_txt})" if recorded_txt else "")
                 + f", {by_status.get('unchanged', 0)} unchanged"]
        anomalies = [f"{o.spec.id} {o.status} ({o.rows:,} rows; {o.detail})" for o in outcomes if o.status in ANOMALY_STATUSES]
        if anomalies:
            parts.append("anomalies: " + _shorten(anomalies))
        missing = [o.spec.id for o in outcomes if o.status == "missing"]
        if missing:
            parts.append("missing tables: " + _shorten(missing))
            context.log.warning(f"{name}: missing tables: {', '.join(missing)}")
        failed = [f"{o.spec.id}: {o.detail}" for o in outcomes
                  if o.status == "error" and not o.detail.startswith(("warehouse ", "catalog query failed"))]
        if failed:
            parts.append("not counted: " + _shorten(failed, 4))
            context.log.error(f"{name}: tables not counted: {'; '.join(failed)}")
        parts.extend(wh_errors)
        parts.extend(notes)
        summary = "; ".join(parts)
        context.log.info(f"{name}: {summary} ({queries} queries, {time.perf_counter() - started:.2f} s)")
        cursor = _cursor_text(new_key, len(specs))
        if requests:
            return dg.SensorResult(run_requests=requests, asset_events=events, cursor=cursor)
        return dg.SensorResult(skip_reason=summary[:4000], asset_events=events, cursor=cursor)

    @dg.sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        job_name=diagnosis_job_name,
        required_resource_keys=resource_keys or None,
        description=f"Row counts of {len(specs)} tables from warehouse metadata, scored against each table's "
        f"baseline ({method}, {sensitivity} σ, {history_length} observations); opens dw_dagster incidents.",
    )
    def _sensor(context: dg.SensorEvaluationContext):
        try:
            return _evaluate(context)
        except Exception as e:  # the tick never raises: log, skip, keep the cursor
            context.log.exception(f"{name}: tick failed")
            return dg.SensorResult(skip_reason=f"tick failed: {type(e).__name__}: {_first_line(e)}"[:1000],
                                   cursor=context.cursor)

    return _sensor


def watched_asset_keys(tables: Iterable[VolumeTable]) -> list[dg.AssetKey]:
    """The distinct asset keys of ``tables``, in order (e.g. to declare them as ``AssetSpec``\\ s)."""
    return list(dict.fromkeys(s.asset_key for s in tables))  # type: ignore[misc]
