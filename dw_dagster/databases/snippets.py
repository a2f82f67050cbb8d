"""Small helpers shared by the cause modules: quoting, transpiling, UTC times.

Queries are written in DuckDB's dialect with identifiers built by :mod:`dw_dagster.databases.sql` (sqlglot
nodes, quoted when needed, hostile names refused) and transpiled to the dialect that runs them.
"""

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlglot

from dw_dagster.databases import sql
from dw_dagster.databases import Database

#: what :class:`~dw_dagster.core.models.Evidence` names as its "database" when the query is a call
#: on the Dagster instance rather than SQL
DAGSTER_EVENT_LOG = "dagster:event_log"


def q(name: str) -> str:
    """A quoted column identifier (DuckDB dialect text)."""
    return sql.identifier(name).sql("duckdb")


def t(name: str) -> str:
    """A quoted table reference (DuckDB dialect text)."""
    return sql.table(name).sql("duckdb")


def lit(value: object) -> str:
    """A typed SQL literal (DuckDB dialect text)."""
    return sql.literal(value).sql("duckdb")


def to_dialect(duck_sql: str, dialect: str) -> str:
    """Transpile DuckDB-dialect SQL to ``dialect`` (unchanged for DuckDB)."""
    return duck_sql if dialect == "duckdb" else sqlglot.transpile(duck_sql, read="duckdb", write=dialect)[0]


def naive_utc(value: dt.datetime | str | None) -> dt.datetime | None:
    """An aware or ISO-8601 time as a naive UTC datetime (the databases' TIMESTAMP); None stays None."""
    if value is None:
        return None
    v = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    return v.astimezone(dt.timezone.utc).replace(tzinfo=None) if v.tzinfo else v


def aware_utc(value: dt.datetime | float) -> dt.datetime:
    """A POSIX timestamp or a (naive = UTC) datetime as an aware UTC datetime."""
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc)
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def iso(value: Any) -> Any:
    """Dates and datetimes as ISO strings (JSON-friendly), anything else unchanged."""
    return value.isoformat() if isinstance(value, (dt.date, dt.datetime)) else value


def same_database(a: Database, b: Database) -> bool:
    """True when ``a`` and ``b`` reach the same database, so one query can join their tables.

    The same object; two DuckDB handles on the same file path; two SQLAlchemy handles with the
    same URL (password included in the comparison, never printed).
    """
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    pa_, pb = getattr(a, "path", None), getattr(b, "path", None)
    if pa_ is not None and pb is not None:
        return pa_ == pb and pa_ != ":memory:"
    ea, eb = getattr(a, "_engine", None), getattr(b, "_engine", None)
    if ea is not None and eb is not None:
        return ea.url == eb.url
    return False


def window_predicate(column: str, window: tuple[dt.datetime, dt.datetime] | None, alias: str | None = None) -> str:
    """``col >= start AND col < end`` (DuckDB dialect) for a half-open UTC window, or ``1 = 1``."""
    if window is None:
        return "1 = 1"
    ref = f"{alias}.{q(column)}" if alias else q(column)
    return f"{ref} >= {lit(naive_utc(window[0]))} AND {ref} < {lit(naive_utc(window[1]))}"


def key_text(columns: Sequence[str], alias: str | None = None) -> list[str]:
    """Per key column, ``COALESCE(CAST(k AS VARCHAR), '') AS dw_kc{i}`` and ``(k IS NULL) AS dw_kn{i}``.

    Matching keys on (text, is-NULL flag) is NULL-safe, works when one side stores the key as text
    (a dead-letter table) and the other as a number, and is a plain equality every engine can
    hash-join (PostgreSQL cannot hash ``IS NOT DISTINCT FROM``).
    """
    out = []
    for i, c in enumerate(columns):
        ref = f"{alias}.{q(c)}" if alias else q(c)
        out += [f"COALESCE(CAST({ref} AS VARCHAR), '') AS dw_kc{i}", f"CASE WHEN {ref} IS NULL THEN 1 ELSE 0 END AS dw_kn{i}"]
    return out


def key_match(n: int, a: str, b: str) -> str:
    """The NULL-safe equality of ``n`` keys projected by :func:`key_text` under aliases ``a`` and ``b``."""
    return " AND ".join(f"{a}.dw_kc{i} = {b}.dw_kc{i} AND {a}.dw_kn{i} = {b}.dw_kn{i}" for i in range(n))
