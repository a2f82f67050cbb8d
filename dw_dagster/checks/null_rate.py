"""Null rate per column, against the column's own baseline with an absolute floor.

For each column the check counts NULLs in the *current* window (the latest ``current_days``
days of ``timestamp_column``, UTC) and in the *baseline* window (the ``baseline_days`` days
before it), in one query. A column fails when

    current % > baseline % + max(tolerance_pct, baseline % × relative_tolerance)

so with the defaults (1 percentage point, 50 % relative) a column that was never NULL may reach
1 % before it fails: 0 % → 0.5 % passes, 0 % → 5 % fails; a column that is normally 10 % NULL
fails above 15 %. Without a timestamp column the whole table is the current window and the
baseline is 0 %. A current window with no rows fails with "no rows".
"""

import datetime as dt
from collections.abc import Callable, Sequence

import dagster as dg
from pydantic import BaseModel
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.checks.metadata import at_least, column_list, metadata_table
from dw_dagster.checks.utc import utc_timestamp
from dw_dagster.databases import Database, DatabaseError
from dw_dagster.core import keys as _keys
from dw_dagster.dagster_private import public

NULL_RATE_KIND = "null_rate"


class ColumnNullRate(BaseModel):
    """One column's NULL counts (rows) and rates (%) in the current and the baseline window."""

    column: str
    current_rows: int
    current_nulls: int
    current_pct: float | None
    baseline_rows: int
    baseline_nulls: int
    baseline_pct: float | None
    allowed_pct: float | None
    status: str  # ok, too_many_nulls, no_rows

    @property
    def passed(self) -> bool:
        return self.status == "ok"


def _pct(n: int, d: int) -> float | None:
    return round(n / d * 100, 4) if d else None


def null_rate_sql(table: str, columns: Sequence[str], timestamp_column: str | exp.Expression | None,
                  current_start: dt.datetime | None, baseline_start: dt.datetime | None,
                  end: dt.datetime | None, dialect: str, quote: bool = False) -> str:
    """One query: per column, rows and NULLs in the current and the baseline window (``quote``:
    every column name quoted as given, names already resolved against the catalog).

    ``timestamp_column`` is a column name or the UTC expression of
    :func:`dw_dagster.checks.utc.utc_timestamp`; ``None`` measures the whole table."""
    t = sql.table(table).sql("duckdb")
    if timestamp_column is None:
        parts = ["COUNT(*) AS cur_rows", "0 AS base_rows"]
        for i, c in enumerate(columns):
            q = _ident(c, quote)
            parts += [f"COUNT(*) - COUNT({q}) AS cur_nulls_{i}", f"0 AS base_nulls_{i}"]
        return sql.render(f"SELECT {', '.join(parts)} FROM {t}", dialect)
    ts = (sql.column(timestamp_column) if isinstance(timestamp_column, str) else timestamp_column).sql("duckdb")
    cur = f"{ts} >= :cur AND {ts} < :end"
    base = f"{ts} >= :base AND {ts} < :cur"
    parts = [f"COUNT(CASE WHEN {cur} THEN 1 END) AS cur_rows", f"COUNT(CASE WHEN {base} THEN 1 END) AS base_rows"]
    for i, c in enumerate(columns):
        q = _ident(c, quote)
        parts += [f"COUNT(CASE WHEN {cur} AND {q} IS NULL THEN 1 END) AS cur_nulls_{i}",
                  f"COUNT(CASE WHEN {base} AND {q} IS NULL THEN 1 END) AS base_nulls_{i}"]
    return sql.render(f"SELECT {', '.join(parts)} FROM {t} WHERE {ts} >= :base AND {ts} < :end", dialect,
                      cur=current_start, base=baseline_start, end=end)


def score_null_rates(row: Sequence[int], columns: Sequence[str], tolerance_pct: float,
                     relative_tolerance: float) -> list[ColumnNullRate]:
    """Judge each column from the query's single row (see the module docstring)."""
    cur_rows, base_rows = int(row[0]), int(row[1])
    out = []
    for i, c in enumerate(columns):
        cn, bn = int(row[2 + 2 * i]), int(row[3 + 2 * i])
        cp, bp = _pct(cn, cur_rows), _pct(bn, base_rows)
        b = bp or 0.0
        allowed = round(b + max(tolerance_pct, b * relative_tolerance), 4)
        status = "no_rows" if not cur_rows else ("ok" if cp <= allowed else "too_many_nulls")
        out.append(ColumnNullRate(column=c, current_rows=cur_rows, current_nulls=cn, current_pct=cp, baseline_rows=base_rows,
                                  baseline_nulls=bn, baseline_pct=bp, allowed_pct=allowed, status=status))
    return out


def _ident(name: str, quote: bool) -> str:
    if not quote:
        return sql.identifier(name).sql("duckdb")
    from dw_dagster.databases.catalog import quoted

    return quoted(name).sql("duckdb")


def null_rates(db: Database, table: str, columns: Sequence[str], *, timestamp_column: str | None = None,
               as_of: dt.date | None = None, current_days: int = 1, baseline_days: int = 28,
               tolerance_pct: float = 1.0, relative_tolerance: float = 0.5) -> tuple[list[ColumnNullRate], str]:
    """Measure and judge the NULL rate of ``columns``; returns (per-column results, the SQL run).

    ``as_of`` is the last day of the current window (UTC); by default the latest day with rows.
    """
    from dw_dagster.databases.catalog import resolve_columns

    names = resolve_columns(db, table, columns)
    if timestamp_column is None:
        q = null_rate_sql(table, names, None, None, None, None, db.dialect, quote=True)
    else:
        ts = utc_timestamp(db, table, timestamp_column)
        if as_of is None:
            latest = db.fetch_all(sql.render("SELECT CAST(max(:ts) AS DATE) FROM :t", db.dialect,
                                             ts=ts, t=sql.table(table)))[0][0]
            as_of = latest if latest is not None else dt.datetime.now(dt.timezone.utc).date()
            as_of = as_of.date() if isinstance(as_of, dt.datetime) else as_of
        end = dt.datetime.combine(as_of + dt.timedelta(days=1), dt.time())
        cur = end - dt.timedelta(days=current_days)
        q = null_rate_sql(table, names, ts, cur, cur - dt.timedelta(days=baseline_days), end, db.dialect, quote=True)
    (row,) = db.fetch_all(q)
    return score_null_rates(row, columns, tolerance_pct, relative_tolerance), q


@public
def build_null_rate_check(
    *,
    asset: dg.AssetKey | str | Sequence[str],
    table: str,
    columns: Sequence[str],
    timestamp_column: str | None = None,
    resource_key: str = "warehouse",
    name: str = _keys.NULL_RATE_CHECK,
    current_days: int = 1,
    baseline_days: int = 28,
    tolerance_pct: float = 1.0,
    relative_tolerance: float = 0.5,
    as_of: Callable[[], dt.date] | None = None,
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
) -> dg.AssetChecksDefinition:
    """An asset check on the NULL rate of ``columns`` (see the module docstring for the rule).

    Args:
        asset: the asset whose table is checked.
        table: ``schema.table`` in the warehouse.
        columns: the columns to check.
        timestamp_column: splits current and baseline windows (UTC days); None checks the whole
            table against ``tolerance_pct`` alone.
        current_days, baseline_days: window lengths in days.
        tolerance_pct: the absolute floor of the allowed increase, in percentage points (default 1).
        relative_tolerance: the allowed increase as a fraction of the baseline rate (default 0.5).
        as_of: returns the last day of the current window; default the latest day with rows.

    Returns:
        An ``AssetChecksDefinition``; metadata ``dw/columns`` (table) and ``dw/columns_json``.

    Raises:
        UnsafeIdentifierError: a table or column name cannot be an identifier.
        ValueError: ``columns`` is a bare string or empty, a window below 1 day, or a negative tolerance.
        (When the check runs, a missing table or column fails it with a ``DatabaseError`` naming them.)
    """
    sql.table(table)
    columns = column_list("columns", columns, allow_empty=False)
    at_least("current_days", current_days, 1, whole=True)
    at_least("baseline_days", baseline_days, 1, whole=True)
    at_least("tolerance_pct", tolerance_pct, 0)
    at_least("relative_tolerance", relative_tolerance, 0)
    for c in [*columns, *([timestamp_column] if timestamp_column else [])]:
        sql.identifier(c)

    @dg.asset_check(asset=asset, name=name, blocking=blocking, required_resource_keys={resource_key},
                    metadata={_keys.CHECK_KIND_KEY: NULL_RATE_KIND, _keys.TABLE_KEY: table, _keys.PARITY_COLUMNS_KEY: ",".join(columns)},
                    description=f"NULL rate of {', '.join(columns)} in {table} within max({tolerance_pct} pp, "
                    f"{relative_tolerance:.0%} of baseline) above its {baseline_days}-day baseline.")
    def _null_rate(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        db = getattr(context.resources, resource_key).get_database()
        results, q = null_rates(db, table, columns, timestamp_column=timestamp_column, as_of=as_of() if as_of else None,
                                current_days=current_days, baseline_days=baseline_days, tolerance_pct=tolerance_pct,
                                relative_tolerance=relative_tolerance)
        bad = [r for r in results if not r.passed]
        return dg.AssetCheckResult(
            passed=not bad, severity=severity,
            description="all columns within tolerance" if not bad else "; ".join(
                f"{r.column}: {r.status}" + (f" {r.current_pct} % (allowed {r.allowed_pct} %)" if r.current_pct is not None else "")
                for r in bad),
            metadata={
                _keys.PARITY_COLUMNS_KEY: metadata_table(
                    [r.model_dump() for r in results],
                    [("column", "string"), ("current_pct", "float"), ("baseline_pct", "float"), ("allowed_pct", "float"),
                     ("current_nulls", "int"), ("status", "string")]),
                _keys.COLUMNS_JSON_KEY: dg.MetadataValue.json([r.model_dump() for r in results]),
                _keys.QUERY_KEY: dg.MetadataValue.md(f"```sql\n{q}\n```"),
            },
        )

    return _null_rate
