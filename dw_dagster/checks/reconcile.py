"""Source/target reconciliation by slice: row counts and exact sums, pushed down as SQL.

Each side runs one ``GROUP BY`` over its own table (``COUNT(*)`` and ``SUM`` of each measure per
slice); only the per-slice aggregates come back to Python, never the rows. The comparison is
exact for integers and decimals (Python :class:`~decimal.Decimal`, no cast to floating point) and
allows a relative tolerance only where a side returns a float. Gap in % is
``(source_rows − target_rows) / source_rows × 100`` per slice.

The method is the "metric reconciliation" of Soda and dbt-audit-helper's ``compare_row_counts``
extended by slice (see ``shared/reference/reconciliation_and_anomaly.md`` §2).
"""


import datetime as dt
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import dagster as dg
from pydantic import BaseModel
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.checks.metadata import column_list, source_deps
from dw_dagster.databases import Database, DatabaseError
from dw_dagster.core.models import SliceGap

RECONCILIATION_KIND = "reconciliation"
FLOAT_REL_TOLERANCE = 1e-9


class ReconciliationResult(BaseModel):
    """Per-slice comparison plus the SQL that produced it (one query per side)."""

    slices: list[SliceGap]
    source_sql: str
    target_sql: str
    source_database: str
    target_database: str

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.slices)

    @property
    def gap_rows(self) -> int:
        return sum(s.gap_rows for s in self.slices)

    @property
    def failing(self) -> list[SliceGap]:
        return [s for s in self.slices if not s.passed]


def slice_aggregate_sql(
    table: str,
    slice_by: Sequence[str],
    measures: Sequence[str],
    dialect: str,
    key_columns: Sequence[str] = (),
) -> str:
    """Per slice: rows, distinct keys, duplicated keys and ``SUM`` of each measure, for ``dialect``.

    Columns: ``slice..., dw_rows, dw_keys, dw_dup_keys, dw_sum_0...``. With ``key_columns`` the
    rows are first grouped by slice and key (GROUP BY treats NULLs as one value, so keys are
    NULL-safe), then counted per slice; without, ``dw_keys`` and ``dw_dup_keys`` are NULL and it
    is a single ``GROUP BY``.
    """
    slices = [sql.column(c) for c in slice_by]
    if key_columns:
        keys = [sql.column(c) for c in key_columns]
        inner = (
            exp.select(*slices, *keys, exp.Count(this=exp.Star()).as_("dw_n"),
                       *(exp.Sum(this=sql.column(m)).as_(f"dw_s{i}") for i, m in enumerate(measures)))
            .from_(sql.table(table))
            .group_by(*slices, *keys)
            .subquery("dw_k")
        )
        n = exp.column("dw_n")
        aggs = [exp.Sum(this=n).as_("dw_rows"), exp.Count(this=exp.Star()).as_("dw_keys"),
                exp.Sum(this=exp.Case().when(n > 1, exp.Literal.number(1)).else_(exp.Literal.number(0))).as_("dw_dup_keys")]
        aggs += [exp.Sum(this=exp.column(f"dw_s{i}")).as_(f"dw_sum_{i}") for i in range(len(measures))]
        q = exp.select(*(exp.column(c.name) for c in slices), *aggs).from_(inner)
        if slices:
            q = q.group_by(*(exp.column(c.name) for c in slices))
        return q.sql(dialect=dialect)
    aggs = [exp.Count(this=exp.Star()).as_("dw_rows"), exp.Null().as_("dw_keys"), exp.Null().as_("dw_dup_keys")]
    aggs += [exp.Sum(this=sql.column(m)).as_(f"dw_sum_{i}") for i, m in enumerate(measures)]
    q = exp.select(*slices, *aggs).from_(sql.table(table))
    if slices:
        q = q.group_by(*slices)
    return q.sql(dialect=dialect)


def _norm_slice_value(v: Any) -> Any:
    """A slice value both sides spell the same way: aware timestamps in UTC without an offset (the
    naive side is UTC by contract), dates and times as ISO text, decimals by value (``1.50`` and
    ``1.500`` and the integer ``1.00`` alike), UUIDs and bytes as text."""
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, Decimal):
        if not v.is_finite():
            return str(v)
        return int(v) if v == v.to_integral_value() else format(v.normalize(), "f")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, uuid.UUID):
        return str(v)
    return v


Aggregates = dict[tuple, tuple[int, int | None, int | None, list[Any]]]


def _fetch(db: Database, sql_text: str, n_slice: int) -> Aggregates:
    out: Aggregates = {}
    for row in db.fetch_all(sql_text):
        key = tuple(_norm_slice_value(v) for v in row[:n_slice])
        rows, keys, dups = row[n_slice : n_slice + 3]
        out[key] = (int(rows or 0), None if keys is None else int(keys), None if dups is None else int(dups), list(row[n_slice + 3 :]))
    return out


def _sums_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(float(a)) or math.isnan(float(b)):  # NaN only equals NaN (both sides hold a NaN)
            return math.isnan(float(a)) and math.isnan(float(b))
        return math.isclose(float(a), float(b), rel_tol=FLOAT_REL_TOLERANCE, abs_tol=1e-12)
    return Decimal(a) == Decimal(b)


def _num_str(v: Any) -> str:
    return "null" if v is None else str(v)


def compare_slice_aggregates(
    source: Mapping[tuple, tuple],
    target: Mapping[tuple, tuple],
    slice_by: Sequence[str],
    measures: Sequence[str],
) -> list[SliceGap]:
    """Compare per-slice aggregates from both sides; slices present on one side only are gaps.

    Each side maps a slice to ``(rows, distinct keys | None, duplicated keys | None, [sums])``
    (a 2-tuple ``(rows, [sums])`` is accepted too). A slice passes when rows, distinct keys,
    duplicated keys and every sum agree, so a duplicate on one side and a missing row on the
    other never cancel out.

    Returns:
        One :class:`~dw_dagster.core.models.SliceGap` per slice, sorted by slice value (NULL first).
    """
    def norm(v):
        return (v[0], None, None, v[1]) if len(v) == 2 else v

    empty = (0, None, None, [None] * len(measures))
    keys = sorted(set(source) | set(target), key=lambda k: tuple((v is not None, str(v)) for v in k))
    out = []
    for k in keys:
        s_rows, s_keys, s_dups, s_sums = norm(source.get(k, empty))
        t_rows, t_keys, t_dups, t_sums = norm(target.get(k, empty))
        if k not in source and t_keys is not None:
            s_keys, s_dups = 0, 0
        if k not in target and s_keys is not None:
            t_keys, t_dups = 0, 0
        gap = s_rows - t_rows
        pct = round(gap / s_rows * 100, 4) if s_rows else (0.0 if t_rows == 0 else -100.0)
        sums_ok = all(_sums_equal(a, b) for a, b in zip(s_sums, t_sums))
        sum_gaps = {}
        for m, a, b in zip(measures, s_sums, t_sums):
            if a is not None and b is not None and not isinstance(a, float) and not isinstance(b, float):
                sum_gaps[m] = str(Decimal(a) - Decimal(b))
            elif a is not None and b is not None:
                sum_gaps[m] = repr(float(a) - float(b))
        out.append(
            SliceGap(
                slice=dict(zip(slice_by, k)),
                source_rows=s_rows,
                target_rows=t_rows,
                gap_rows=gap,
                gap_pct=pct,
                source_keys=s_keys,
                target_keys=t_keys,
                source_duplicate_keys=s_dups,
                target_duplicate_keys=t_dups,
                source_sums={m: _num_str(v) for m, v in zip(measures, s_sums)},
                target_sums={m: _num_str(v) for m, v in zip(measures, t_sums)},
                sum_gaps=sum_gaps,
                passed=gap == 0 and s_keys == t_keys and s_dups == t_dups and sums_ok,
            )
        )
    return out


def reconcile(
    source_db: Database,
    target_db: Database,
    source_table: str,
    target_table: str,
    slice_by: Sequence[str],
    measures: Sequence[str],
    key_columns: Sequence[str] = (),
) -> ReconciliationResult:
    """Run the slice aggregates on both sides and compare them (``key_columns`` adds key counts).

    Raises:
        dw_dagster.databases.DatabaseError: a query failed (unknown table or column, no connection).
        dw_dagster.databases.sql.UnsafeIdentifierError: a table or column name cannot be used.
    """
    s_sql = slice_aggregate_sql(source_table, slice_by, measures, source_db.dialect, key_columns)
    t_sql = slice_aggregate_sql(target_table, slice_by, measures, target_db.dialect, key_columns)
    aggregates = []
    for db, q, table in ((source_db, s_sql, source_table), (target_db, t_sql, target_table)):
        try:
            aggregates.append(_fetch(db, q, len(slice_by)))
        except DatabaseError as e:
            if "overflow" in str(e).lower():
                raise DatabaseError(f"{db.name}: a SUM of {', '.join(measures)} on {table} exceeds the database's exact "
                                    f"numeric range (DECIMAL(38)); slice finer or compare a scaled measure. {e}") from e
            raise
    slices = compare_slice_aggregates(aggregates[0], aggregates[1], slice_by, measures)
    return ReconciliationResult(
        slices=slices,
        source_sql=s_sql,
        target_sql=t_sql,
        source_database=source_db.name,
        target_database=target_db.name,
    )


def slices_table(slices: Sequence[SliceGap], measures: Sequence[str]) -> dg.MetadataValue:
    """The per-slice comparison as a Dagster table the UI renders."""
    cols = [dg.TableColumn("slice", "string"), dg.TableColumn("source_rows", "int"), dg.TableColumn("target_rows", "int"),
            dg.TableColumn("gap_rows", "int"), dg.TableColumn("gap_pct", "float"),
            dg.TableColumn("keys (source/target)", "string"), dg.TableColumn("duplicate keys (source/target)", "string")]
    cols += [dg.TableColumn(f"{m}_gap", "string") for m in measures]
    cols.append(dg.TableColumn("passed", "bool"))
    records = []
    for s in slices:
        rec = {
            "slice": ", ".join(f"{k}={v}" for k, v in s.slice.items()) or "(all)",
            "source_rows": s.source_rows,
            "target_rows": s.target_rows,
            "gap_rows": s.gap_rows,
            "gap_pct": s.gap_pct,
            "keys (source/target)": "n/a" if s.source_keys is None else f"{s.source_keys}/{s.target_keys}",
            "duplicate keys (source/target)": "n/a" if s.source_duplicate_keys is None
            else f"{s.source_duplicate_keys}/{s.target_duplicate_keys}",
            "passed": s.passed,
        }
        rec.update({f"{m}_gap": s.sum_gaps.get(m, "n/a") for m in measures})
        records.append(dg.TableRecord(rec))
    return dg.MetadataValue.table(records, schema=dg.TableSchema(columns=cols))


def _describe(s: SliceGap) -> str:
    parts = [f"{json.dumps(s.slice, default=str)}: {s.gap_words()}"]
    if s.source_keys is not None and (s.source_keys != s.target_keys or s.source_duplicate_keys != s.target_duplicate_keys):
        parts.append(f"keys {s.source_keys}/{s.target_keys}, duplicated keys {s.source_duplicate_keys}/{s.target_duplicate_keys}")
    bad_sums = [m for m, g in s.sum_gaps.items() if g not in ("0", "0.00", "0.0") and not g.startswith("0E")]
    if bad_sums:
        parts.append("sums differ: " + ", ".join(f"{m} by {s.sum_gaps[m]}" for m in bad_sums))
    return "; ".join(parts)


def reconciliation_metadata(result: ReconciliationResult, measures: Sequence[str]) -> dict[str, Any]:
    """The check result's metadata: the slice table, totals, the worst slice and the SQL run."""
    worst = max(result.slices, key=lambda s: abs(s.gap_pct), default=None)
    return {
        "dw/slices": slices_table(result.slices, measures),
        "dw/slices_json": dg.MetadataValue.json([s.model_dump(mode="json") for s in result.slices]),
        "dw/gap_rows": result.gap_rows,
        "dw/source_rows": sum(s.source_rows for s in result.slices),
        "dw/target_rows": sum(s.target_rows for s in result.slices),
        "dw/worst_slice": json.dumps(worst.slice, default=str) if worst else "{}",
        "dw/worst_gap_pct": worst.gap_pct if worst else 0.0,
        "dw/failing_slices": len(result.failing),
        "dw/queries": dg.MetadataValue.md(
            f"source ({result.source_database}):\n```sql\n{result.source_sql}\n```\n"
            f"target ({result.target_database}):\n```sql\n{result.target_sql}\n```"
        ),
    }


def build_reconciliation_checks(
    *,
    asset: dg.AssetKey | str | Sequence[str],
    source_asset: dg.AssetKey | str | Sequence[str] | None,
    source_table: str,
    target_table: str,
    slice_by: Sequence[str],
    measures: Sequence[str] = (),
    key_columns: Sequence[str] = (),
    source_resource_key: str = "source_db",
    target_resource_key: str = "warehouse",
    name: str = "reconciliation",
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    description: str | None = None,
) -> dg.AssetChecksDefinition:
    """A source-vs-target reconciliation asset check, attached to the target asset.

    The check depends on ``source_asset`` too (``additional_deps``), reads both sides through
    :class:`~dw_dagster.databases.DatabaseResource` resources, and fails when any slice differs in
    row count or in an exact sum.

    Args:
        asset: the target asset the check is attached to.
        source_asset: the upstream asset the target copies; ``None`` (or the checked asset itself)
            when the source table is not a Dagster asset, so the check has no extra dependency.
        source_table, target_table: ``schema.table`` names on each side (quoted by sqlglot).
        slice_by: columns to group by (e.g. ``["region"]``); empty for one whole-table slice.
        measures: numeric columns whose sums must match exactly (DECIMAL/integer) or within
            ``1e-9`` relative (floating point).
        key_columns: the key; adds distinct and duplicated key counts per slice (NULL-safe).
        source_resource_key, target_resource_key: resource keys of the two ``DatabaseResource``\\ s.
        name: the check name.
        blocking: fail the run (and skip downstream) when the check fails with ERROR severity.
        severity: severity of a failed result.

    Returns:
        An ``AssetChecksDefinition``. Result metadata: ``dw/slices`` (table), ``dw/gap_rows``
        (rows), ``dw/worst_gap_pct`` (%), ``dw/worst_slice``, ``dw/queries`` (the SQL run).

    Raises:
        UnsafeIdentifierError: a table or column name cannot be an identifier.
        ValueError: ``slice_by``, ``measures`` or ``key_columns`` is a bare string, not a list.
        (When the check runs, a missing table or column fails it with a ``DatabaseError`` naming them.)

    Examples:
        .. code-block:: python

            check = build_reconciliation_checks(
                asset="store_sales_line", source_asset=["pos_source", "sales_line"],
                source_table="pos.sales_line", target_table="pos.sales_line",
                slice_by=["region"], measures=["net_sales"],
                source_resource_key="pos_source", target_resource_key="warehouse",
            )
    """
    # Validate identifiers up front so a bad config fails at load time, not at 2 a.m.
    slice_by, measures = column_list("slice_by", slice_by), column_list("measures", measures)
    key_columns = column_list("key_columns", key_columns)
    sql.table(source_table), sql.table(target_table)
    for c in [*slice_by, *measures, *key_columns]:
        sql.identifier(c)
    spec_meta = {
        "dw/check_kind": RECONCILIATION_KIND,
        "dw/source_table": source_table,
        "dw/target_table": target_table,
        "dw/slice_by": ",".join(slice_by),
        "dw/measures": ",".join(measures),
        "dw/key_columns": ",".join(key_columns),
        "dw/source_resource_key": source_resource_key,
        "dw/target_resource_key": target_resource_key,
    }
    src_deps = source_deps(asset, source_asset)

    @dg.asset_check(
        asset=asset,
        name=name,
        additional_deps=src_deps,
        blocking=blocking,
        required_resource_keys={source_resource_key, target_resource_key},
        metadata=spec_meta,
        description=description
        or f"Row count and exact sums of {', '.join(measures) or 'no measures'} per "
        f"{', '.join(slice_by) or 'table'}: {source_table} (source) vs {target_table} (target).",
    )
    def _reconciliation(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        src = getattr(context.resources, source_resource_key).get_database()
        tgt = getattr(context.resources, target_resource_key).get_database()
        result = reconcile(src, tgt, source_table, target_table, slice_by, measures, key_columns)
        failing = result.failing
        desc = (
            "all slices match"
            if not failing
            else "; ".join(_describe(s) for s in failing[:5])
        )
        return dg.AssetCheckResult(
            passed=result.passed,
            severity=severity,
            description=desc,
            metadata=reconciliation_metadata(result, measures),
        )

    return _reconciliation

