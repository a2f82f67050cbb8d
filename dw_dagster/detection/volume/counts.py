"""Row counts of many tables, read in as few queries per warehouse as each engine allows.

Where the counts come from (``row_counts="metadata"``, the default)
-----------------------------------------------------------------------

* **Snowflake**: one query per warehouse, ``information_schema.tables.row_count`` (one
  ``UNION ALL`` branch per database named by three-part table names); exact for tables,
  NULL for views (reported per table). A branch names its tables (``table_name IN (...)``) only
  when it watches at most :data:`SNOWFLAKE_NAME_FILTER_MAX` of them; above that it reads every
  table of the watched schemas and the names are matched here. Measured on fakesnow 0.12.1 (the
  emulator used in the tests, ``information_schema.tables`` a view over DuckDB's catalog) with
  5,000 tables in the schema: naming 10 tables 0.44 s, 100 tables 4.2 s, 300 tables 16.4 s, 5,000
  tables not answered before the connector's retry (the query is sent again and refused as
  "connection is busy"); the schema alone, 5,000 rows back, 0.10 s. On Snowflake a long ``IN``
  list costs compilation time and the result holds about the watched tables anyway.
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
  statements of at most 100 tables, on :data:`DUCKDB_COUNT_THREADS` (2) cursors of one connection
  at once, with DuckDB's join-order optimizer off for them and the instance opened with only as
  many worker threads as the cursors leave cores free (none on two cores, where its workers beside
  the two cursors contended: 40 µs per table counted with them, 33 µs without, at 5,000 and at
  50,000 tables). Measured on 5,000 small tables:
  catalog 22 ms; 5,000 single ``COUNT(*)`` statements 1.56 s; one 5,000-branch ``UNION ALL``
  2.15 s (planning grows faster than linearly); batches of 100: 0.33 s, of 500: 0.50 s. Measured
  on 50,000 tables (DuckDB 2.0.1, a 1.7 GB file, the 2-core machine at load average 12-16): a
  100-table statement spends its time binding and planning, not counting (``SELECT 1 FROM t``
  branches cost 80 % of ``COUNT(*)`` ones); the join-order optimizer took 21 of its 39 ms (it has
  no join to order), binding grows with the square of the branches (2 ms at 100, 89 ms at 500);
  two cursors counted 5,000 tables in 3.4-3.7 s against 3.8-4.4 s on one. Opening the file
  (DuckDB reads its whole catalog) took 6-10 s and closing it 2-3 s at that load: a per-tick
  cost of the file's size that no statement can avoid, reported as the tick's ``catalog`` time.
* **PostgreSQL**: ``pg_class.reltuples`` and ``pg_stat_user_tables.n_live_tup`` are estimates, so
  ``COUNT(*)`` in ``UNION ALL`` batches, without a catalog query, of
  :data:`POSTGRES_COUNT_BATCH` (25) tables: measured on PostgreSQL 15 over loopback with 5,000
  small tables, batches of 10-50 took 0.31-0.69 s in all, of 100 2.5-3.7 s (``EXPLAIN ANALYZE``
  of one: 15 ms planning, 57 ms execution for 100 scans of 0.005 ms each; not JIT, the same
  with ``jit = off``), 5,000 single statements on one connection 1.1-1.8 s.
* **Other dialects** and ``row_counts="count"``: ``COUNT(*)`` in ``UNION ALL`` batches of 100
  tables (25 on PostgreSQL), without a catalog query (exact everywhere, views included; on BigQuery an unfiltered
  ``COUNT(*)`` of a native table is answered from metadata and bills 0 bytes).

``COUNT(*)`` with a ``WHERE`` is issued only for a spec that names a ``partition_column``:
the rows of one partition (by default yesterday's UTC date, :func:`days_ago`), batched the same
way. A batch that fails is retried table by table, so one bad table never hides the others.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import datetime as dt
import inspect
import os
import threading
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Literal

import dagster as dg
from sqlglot import exp

from dw_dagster.core.models import utcnow
from dw_dagster.databases import Database, DatabaseError, DuckDBDatabase, sql
from dw_dagster.dagster_private import public

ROW_COUNT_KEY = "dagster/row_count"


#: tables per ``UNION ALL`` count statement (measured: 100 is the fastest on DuckDB, see above)
COUNT_BATCH = 100


#: tables per ``UNION ALL`` count statement on PostgreSQL (measured: batches of 100 cost 5-8 times
#: batches of 10-50 there, see above)
POSTGRES_COUNT_BATCH = 25


#: most distinct table names a Snowflake catalog branch names in ``table_name IN (...)``; with more,
#: the branch filters on the schemas only (see the module docstring for the measurements)
SNOWFLAKE_NAME_FILTER_MAX = 50


#: cursors of one DuckDB connection counting at once (the reference machine has 2 cores)
DUCKDB_COUNT_THREADS = 2

# the counting connection's setting: no join-order optimization (a UNION ALL of counts has no join)
_DUCKDB_NO_JOIN_ORDER = "SET disabled_optimizers = 'join_order'"


#: seconds a tick waits for a DuckDB file another process holds the write lock of (then that
#: warehouse is skipped for the tick; a job step waits ``DuckDBDatabase.lock_wait_s``, 120 s)
DUCKDB_LOCK_WAIT_S = 15.0


# characters refused in watched names even though every name is quoted: none is needed by a real
# table, and each is a sign of a name built from untrusted text
_REFUSED_SEQUENCES = (";", "'", '"', "--", "/*", "*/")


PartitionValue = dt.date | str | int


PartitionSpec = PartitionValue | Callable[[dt.datetime], PartitionValue] | None


@public
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
    """Raise :class:`~dw_dagster.databases.sql.UnsafeIdentifierError` for a name the sensor will not use."""
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


#: longest spec id (``database:table[#partition_column]``): the row-count history store's key column
MAX_SPEC_ID_CHARS = 1024


@public
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
        dw_dagster.databases.sql.UnsafeIdentifierError: a table or column name is empty, longer than 255
            characters, has more than 3 parts, or holds a control character, a backslash, a
            backtick, a quote, ``;``, ``--``, ``/*`` or leading/trailing blanks.
        ValueError: ``database`` is not a valid resource key, ``partition`` is given without
            ``partition_column``, or the spec id (``database:table[#partition_column]``) is longer
            than :data:`MAX_SPEC_ID_CHARS` (the history store's key).
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
        if len(self._id) > MAX_SPEC_ID_CHARS:  # type: ignore[attr-defined]
            raise ValueError(f"volume sensor: spec id {self._id[:60]}... is {len(self._id)} characters: the row-count "  # type: ignore[attr-defined]
                             f"history store keys tables by spec id, at most {MAX_SPEC_ID_CHARS}")
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
        catalog_s: seconds spent opening the warehouse and in its catalog query (the rest of the
            call is counting).
    """

    counts: dict[str, TableCount]
    queries: list[str]
    error: str | None = None
    catalog_s: float = 0.0


class _Session:
    """Statements on one database; one connection for a DuckDB file (opening one costs ~75 ms for
    a file of 5,000 tables), ``fetch_all`` per statement otherwise. Every statement is recorded.

    On a DuckDB file the count statements run on :data:`DUCKDB_COUNT_THREADS` cursors of that
    connection at once (DuckDB binds and plans a statement on the calling thread, which is where a
    ``COUNT(*)`` batch spends its time), with DuckDB's join-order optimizer off (a ``UNION ALL`` of
    counts has no join; measured on 50,000 tables, that optimizer took 21 of a 100-table
    statement's 39 ms)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.queries: list[str] = []
        self._con = None
        self._stack = contextlib.ExitStack()
        self._lock = threading.Lock()

    def __enter__(self) -> _Session:
        if isinstance(self.db, DuckDBDatabase):
            db = copy.copy(self.db)  # a sensor tick waits less for a writer's lock than a job step does
            db.lock_wait_s = min(db.lock_wait_s, DUCKDB_LOCK_WAIT_S)
            try:
                # the count lanes are the parallelism: DuckDB's worker threads beside them contend for the same
                # cores (measured on two cores, 5,000 and 50,000 tables: 33 against 40 us per table counted)
                # (a subclass's own connect may not take it)
                kw = {"threads": _duckdb_threads()} if "threads" in inspect.signature(db.connect).parameters else {}
                self._con = self._stack.enter_context(db.connect(**kw))
            except Exception as e:
                raise DatabaseError(f"{self.db.name}: cannot open: {e}") from e
            with contextlib.suppress(Exception):  # an older DuckDB without the setting counts all the same
                self._con.execute(_DUCKDB_NO_JOIN_ORDER)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def fetch(self, statement: str, con: Any = None) -> list[tuple]:
        with self._lock:
            self.queries.append(statement)
        if self._con is None:
            return self.db.fetch_all(statement)
        try:
            return (con or self._con).execute(statement).fetchall()
        except Exception as e:
            short = " ".join(statement.split())[:300]
            raise DatabaseError(f"{self.db.name}: query failed: {e}\n  SQL: {short}") from e

    def fetch_many(self, statements: Sequence[str]) -> list[list[tuple] | Exception]:
        """Each statement's rows, or the exception it raised, in order; on DuckDB several at once."""
        def one(statement: str, con: Any = None) -> list[tuple] | Exception:
            try:
                return self.fetch(statement, con)
            except Exception as e:  # noqa: BLE001 - the caller retries that batch table by table
                return e

        if self._con is None or len(statements) < 2 or DUCKDB_COUNT_THREADS < 2:
            return [one(q) for q in statements]
        out: list[list[tuple] | Exception] = [[] for _ in statements]
        lanes = min(DUCKDB_COUNT_THREADS, len(statements))

        def lane(k: int) -> None:
            cur = self._con.cursor()  # type: ignore[union-attr]
            try:
                cur.execute("SET TimeZone = 'UTC'")  # as DuckDBDatabase.connect sets it (a partition's bounds)
                with contextlib.suppress(Exception):
                    cur.execute(_DUCKDB_NO_JOIN_ORDER)
                for i in range(k, len(statements), lanes):
                    out[i] = one(statements[i], cur)
            finally:
                cur.close()

        with concurrent.futures.ThreadPoolExecutor(lanes, thread_name_prefix="dw-volume-count") as pool:
            for f in [pool.submit(lane, k) for k in range(lanes)]:
                f.result()
        return out


def _duckdb_threads() -> int:
    """DuckDB's ``threads`` for the count session: the calling thread plus a worker for each core the count
    lanes leave free (1 on two cores, where DuckDB's workers beside the two lanes only contended)."""
    return max(1, (os.cpu_count() or 1) - DUCKDB_COUNT_THREADS + 1)


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


def _day_bound(at: dt.datetime, dialect: str) -> exp.Expression:
    """A UTC day bound. On PostgreSQL and DuckDB an untyped ``'... +00:00'`` literal, which the engine
    reads as the column's own type: the instant for a ``TIMESTAMPTZ`` column (a naive
    ``CAST(... AS TIMESTAMP)`` would be read in the session's time zone, moving rows across the
    day), the wall-clock time for a ``TIMESTAMP`` column (the offset dropped), the day for a ``DATE``."""
    if dialect in ("postgres", "duckdb"):
        return exp.Literal.string(f"{at.isoformat(sep=' ')}+00:00")
    return sql.literal(at)


@lru_cache(maxsize=65536)
def _where_sql(column: str, value: PartitionValue, dialect: str) -> str:
    col = sql.column(column)
    if isinstance(value, dt.date):
        lo = dt.datetime.combine(value, dt.time())
        cond = exp.and_(exp.GTE(this=col, expression=_day_bound(lo, dialect)),
                        exp.LT(this=col.copy(), expression=_day_bound(lo + dt.timedelta(days=1), dialect)))
    else:
        cond = exp.EQ(this=col, expression=sql.literal(value))
    # "safe" quotes every name whose quoting cannot change how the engine resolves it: a column
    # named like a keyword (at, order) is never sent bare
    return cond.sql(dialect=dialect, identify="safe")


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
    chunks = [items[start:start + batch_size] for start in range(0, len(items), batch_size)]
    texts = [" UNION ALL ".join(f"SELECT {i} AS i, COUNT(*) AS n FROM {body}" for i, (_, body) in enumerate(chunk))
             for chunk in chunks]
    for chunk, rows in zip(chunks, session.fetch_many(texts)):
        try:
            if isinstance(rows, Exception):
                raise rows
            for i, n in rows:
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

    Names are matched as given and upper-cased (Snowflake folds unquoted names to upper case); a
    branch watching more than :data:`SNOWFLAKE_NAME_FILTER_MAX` tables reads its whole schemas."""
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
        named = ""
        if len({s.parts[-1].upper() for s in members}) <= SNOWFLAKE_NAME_FILTER_MAX:
            named = f" AND table_name IN ({', '.join(_literal_sql(v, 'snowflake') for v in names)})"
        branches.append(
            f"SELECT {k} AS k, table_schema, table_name, row_count, CURRENT_SCHEMA() AS cur FROM {source} "
            f"WHERE ({' OR '.join(conds)}){named}")
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
    batch_size: int | None = None,
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
        batch_size: tables per ``UNION ALL`` count statement; default :data:`POSTGRES_COUNT_BATCH`
            (25) on PostgreSQL, :data:`COUNT_BATCH` (100) elsewhere.

    Returns:
        A :class:`WarehouseCounts` with a :class:`TableCount` for every spec.

    Raises:
        dw_dagster.databases.DatabaseError: only when a DuckDB file cannot be opened at all.
    """
    if row_counts not in ("metadata", "count"):
        raise ValueError(f"row_counts must be 'metadata' or 'count', got {row_counts!r}")
    now = now or utcnow()
    dialect = db.dialect
    if batch_size is None:
        batch_size = POSTGRES_COUNT_BATCH if dialect == "postgres" else COUNT_BATCH
    counts: dict[str, TableCount] = {}
    catalog_error = None
    started = time.perf_counter()
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
        catalog_s = time.perf_counter() - started  # opening the warehouse and its catalog query
        for tid, (n, err) in _count_branches(session, to_count, batch_size).items():
            # a table the catalog listed is there: its error is about something else (a column, a type)
            counts[tid] = TableCount(rows=n, partition=partitions.get(tid), source=sources[tid],
                                     missing=err is not None and not known and _looks_missing(err), error=err)
    return WarehouseCounts(counts=counts, queries=session.queries, error=catalog_error, catalog_s=catalog_s)
