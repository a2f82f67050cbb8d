"""Source/target reconciliation by slice: row counts and exact sums, pushed down as SQL.

Each side runs one ``GROUP BY`` over its own table (``COUNT(*)`` and ``SUM`` of each measure per
slice); only the per-slice aggregates come back to Python, never the rows. The comparison is
exact for integers and decimals (Python :class:`~decimal.Decimal`, no cast to floating point) and
allows a relative tolerance only where a side returns a float. Gap in % is
``(source_rows − target_rows) / source_rows × 100`` per slice.

Column names are resolved against each side's own catalog (exact, then the engine's folding rule,
then a unique case-insensitive match; two columns differing only in case and a name matching
neither exactly is an error) and quoted as the catalog spells them (DuckDB and BigQuery match
any case themselves: no catalog read there). A measure whose sum comes back NaN or ±Inf on a side
(floating point anywhere, ``NUMERIC`` on PostgreSQL) is read again there with those rows counted
apart per slice (``[NaN, +Inf, -Inf]``) and its sum taken over the finite values only, so a NaN on
both sides neither fails the slice nor hides a difference in the finite values.

The method is the "metric reconciliation" of Soda and dbt-audit-helper's ``compare_row_counts``
extended by slice (see ``shared/reference/reconciliation_and_anomaly.md`` §2).
"""


import datetime as dt
import json
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.checks.metadata import column_list, source_deps
from dw_dagster.databases import Database, DatabaseError
from dw_dagster.core.models import SliceGap
from dw_dagster.core import keys as c
from dw_dagster.dagster_private import public

RECONCILIATION_KIND = "reconciliation"
#: metadata flag of a check result that compared nothing real (a table changed while read):
#: the incident sensor opens no incident for it and no baseline takes its numbers
INCONCLUSIVE_KEY = c.INCONCLUSIVE_KEY
FLOAT_REL_TOLERANCE = 1e-9


class ReconciliationResult(BaseModel):
    """Per-slice comparison plus the SQL that produced it (one query per side)."""

    slices: list[SliceGap]
    source_sql: str
    target_sql: str
    source_database: str
    target_database: str
    attempts: int = 1
    unstable: list[str] = Field(default_factory=list, description="why a read was not stable, per attempt that was not")

    @property
    def inconclusive(self) -> bool:
        """A table changed while it was read on every attempt: the slices compare nothing real."""
        return bool(self.unstable) and len(self.unstable) >= self.attempts

    @property
    def passed(self) -> bool:
        return not self.inconclusive and all(s.passed for s in self.slices)

    @property
    def gap_rows(self) -> int:
        return sum(s.gap_rows for s in self.slices)

    @property
    def failing(self) -> list[SliceGap]:
        return [s for s in self.slices if not s.passed]


def _nonfinite_flags(m: exp.Expression, dialect: str) -> list[exp.Expression]:
    """Conditions ``m`` is NaN, +Inf, -Inf (NaN equals itself on DuckDB, PostgreSQL and Snowflake;
    BigQuery has ``IS_NAN``/``IS_INF``)."""
    if dialect == "bigquery":
        return [exp.func("IS_NAN", m.copy()),
                exp.and_(exp.func("IS_INF", m.copy()), exp.GT(this=m.copy(), expression=exp.Literal.number(0))),
                exp.and_(exp.func("IS_INF", m.copy()), exp.LT(this=m.copy(), expression=exp.Literal.number(0)))]
    special = lambda v: exp.cast(exp.Literal.string(v), exp.DataType.build("DOUBLE"))  # noqa: E731
    return [exp.EQ(this=m.copy(), expression=special(v)) for v in ("NaN", "inf", "-inf")]


def _measure_aggs(m: exp.Expression, i: int, dialect: str, nonfinite: bool, outer: bool) -> list[exp.Expression]:
    """``SUM`` of measure ``i`` (finite values only when it can hold NaN/Inf) and, then, its
    NaN/+Inf/-Inf row counts; ``outer`` sums the inner per-key aggregates instead."""
    if outer:
        cols = [f"dw_s{i}"] + ([f"dw_nan{i}", f"dw_pinf{i}", f"dw_ninf{i}"] if nonfinite else [])
        names = [f"dw_sum_{i}"] + ([f"dw_nan_{i}", f"dw_pinf_{i}", f"dw_ninf_{i}"] if nonfinite else [])
        return [exp.Sum(this=exp.column(c)).as_(n) for c, n in zip(cols, names)]
    if not nonfinite:
        return [exp.Sum(this=m).as_(f"dw_s{i}")]
    flags = _nonfinite_flags(m, dialect)
    finite = exp.Case().when(exp.or_(*[f.copy() for f in flags]), exp.Null()).else_(m.copy())
    one = lambda f: exp.Sum(this=exp.Case().when(f, exp.Literal.number(1)).else_(exp.Literal.number(0)))  # noqa: E731
    return [exp.Sum(this=finite).as_(f"dw_s{i}"), one(flags[0]).as_(f"dw_nan{i}"), one(flags[1]).as_(f"dw_pinf{i}"),
            one(flags[2]).as_(f"dw_ninf{i}")]


def _col(name: str, quote: bool) -> exp.Column:
    if not quote:
        return sql.column(name)
    from dw_dagster.databases.catalog import quoted

    return exp.Column(this=quoted(name))


def slice_aggregate_sql(
    table: str,
    slice_by: Sequence[str],
    measures: Sequence[str],
    dialect: str,
    key_columns: Sequence[str] = (),
    nonfinite: Sequence[bool] = (),
    quote: bool = False,
    where: exp.Expression | None = None,
) -> str:
    """Per slice: rows, distinct keys, duplicated keys and ``SUM`` of each measure, for ``dialect``.

    Columns: ``slice..., dw_rows, dw_keys, dw_dup_keys``, then per measure ``dw_sum_i`` and, when
    ``nonfinite[i]``, ``dw_nan_i, dw_pinf_i, dw_ninf_i`` (rows holding NaN, +Inf, -Inf; the sum is
    then over the finite values). With ``key_columns`` the rows are first grouped by slice and key
    (GROUP BY treats NULLs as one value, so keys are NULL-safe), then counted per slice; without,
    ``dw_keys`` and ``dw_dup_keys`` are NULL and it is a single ``GROUP BY``. ``quote`` quotes
    every column name as given (names already resolved against the catalog). ``where`` (a sqlglot
    condition, e.g. from :func:`ranges_condition`) limits the rows compared.
    """
    flags = list(nonfinite) + [False] * (len(measures) - len(nonfinite))
    slices = [_col(c, quote) for c in slice_by]
    alias = [f"dw_g{i}" for i in range(len(slice_by))]
    if key_columns:
        keys = [_col(c, quote) for c in key_columns]
        inner_aggs = [a for i, m in enumerate(measures) for a in _measure_aggs(_col(m, quote), i, dialect, flags[i], False)]
        inner = (
            exp.select(*(c.as_(a) for c, a in zip(slices, alias)), exp.Count(this=exp.Star()).as_("dw_n"), *inner_aggs)
            .from_(sql.table(table))
            .where(where)
            .group_by(*slices, *keys)
            .subquery("dw_k")
        )
        n = exp.column("dw_n")
        aggs = [exp.Sum(this=n).as_("dw_rows"), exp.Count(this=exp.Star()).as_("dw_keys"),
                exp.Sum(this=exp.Case().when(n > 1, exp.Literal.number(1)).else_(exp.Literal.number(0))).as_("dw_dup_keys")]
        aggs += [a for i, m in enumerate(measures) for a in _measure_aggs(None, i, dialect, flags[i], True)]
        q = exp.select(*(exp.column(a) for a in alias), *aggs).from_(inner)
        if slices:
            q = q.group_by(*(exp.column(a) for a in alias))
        return q.sql(dialect=dialect)
    aggs = [exp.Count(this=exp.Star()).as_("dw_rows"), exp.Null().as_("dw_keys"), exp.Null().as_("dw_dup_keys")]
    for i, m in enumerate(measures):
        parts = _measure_aggs(_col(m, quote), i, dialect, flags[i], False)
        aggs += [p.this.as_(p.alias.replace("dw_s", "dw_sum_").replace("dw_nan", "dw_nan_").replace("dw_pinf", "dw_pinf_")
                            .replace("dw_ninf", "dw_ninf_")) for p in parts]
    q = exp.select(*slices, *aggs).from_(sql.table(table)).where(where)
    if slices:
        q = q.group_by(*slices)
    return q.sql(dialect=dialect)


def ranges_condition(column: str, ranges: Sequence[tuple[dt.datetime, dt.datetime]]) -> exp.Expression:
    """``column`` in any of the half-open ranges ``[start, end)`` (naive UTC), as a sqlglot condition.

    An empty ``ranges`` is a condition no row meets (``1 = 0``).
    """
    col = sql.column(column)
    parts = [exp.and_(col >= sql.literal(a), col < sql.literal(b)) for a, b in ranges]
    if not parts:
        return exp.EQ(this=exp.Literal.number(1), expression=exp.Literal.number(0))
    return exp.or_(*parts) if len(parts) > 1 else parts[0]


def comparison_scope(
    partitions_def: dg.PartitionsDefinition,
    partition_column: str,
    *,
    window: Sequence[str] | None = None,
    closed_only: bool = False,
    now: dt.datetime | None = None,
    dimension_columns: "dict[str, str] | None" = None,
) -> tuple[exp.Expression | None, dict[str, Any]]:
    """Which rows a check compares: those of ``window``'s partitions, and/or of closed partitions only.

    Args:
        partitions_def: the target asset's partitions (a window of any shape; ``closed_only`` needs time windows).
        partition_column: the column whose naive-UTC values the partitions' windows are ranges of
            (for static or dynamic partitions: the column holding the key).
        window: partition keys (a repair's window): only their rows are compared; None: every partition.
        closed_only: leave out rows at or after the start of the first partition whose time window
            has not ended (still filling), and rows of partitions that do not exist yet.
        now: the current time (aware, or naive UTC; default: the clock).
        dimension_columns: a multi-partitioned asset's {dimension: column} (default: the dimension's name).

    Returns:
        (the condition, or None for every row; the scope in words and values, for the result's
        metadata: ``{"partitions": [...]}`` and/or ``{"compared_up_to": ISO time}``).

    Raises:
        ValueError: ``closed_only`` without time windows, or a window key is not a key of ``partitions_def``.
    """
    from dw_dagster.core.windows import partition_window_utc

    now = now or dt.datetime.now(dt.timezone.utc)
    now_naive = now.astimezone(dt.timezone.utc).replace(tzinfo=None) if now.tzinfo else now
    conds, scope = [], {}
    if window is not None:  # any shape: time windows, static/dynamic keys, multi-partitions (databases.partitions)
        from dw_dagster.databases.partitions import partition_filter, predicate

        conds.append(predicate(partition_filter(partitions_def, sorted(window), partition_column, dimension_columns))
                     if window else ranges_condition(partition_column, []))
        scope["partitions"] = sorted(window)
    if closed_only:
        if not isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
            raise ValueError("closed partitions need a time-window partitions definition")
        # the current partition starts at or before now; its rows (and any later) are still arriving
        aware = now if now.tzinfo else now.replace(tzinfo=dt.timezone.utc)
        try:
            current = partitions_def.get_partition_key_for_timestamp(aware.timestamp())
            cutoff_naive = min(partition_window_utc(partitions_def, current)[0], now_naive)
        except Exception:  # now is outside the definition's calendar (Dagster raises several kinds)
            cutoff_naive = now_naive
        conds.append(sql.column(partition_column) < sql.literal(cutoff_naive))
        scope["compared_up_to"] = cutoff_naive.isoformat()
    if not conds:
        return None, scope
    return (exp.and_(*conds) if len(conds) > 1 else conds[0]), scope


def _norm_slice_value(v: Any) -> Any:
    """A slice value both sides spell the same way: aware timestamps in UTC without an offset (the
    naive side is UTC by contract), dates and times as ISO text, decimals by value (``1.50`` and
    ``1.500`` and the integer ``1.00`` alike), UUIDs and bytes as text, UUID-shaped text in lower
    case (a UUID's text is case-insensitive)."""
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
    if isinstance(v, str) and _UUID_TEXT.match(v):  # a UUID kept as text (upper case from SQL Server, say)
        return v.lower()
    return v


_UUID_TEXT = re.compile(r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$")


Aggregates = dict[tuple, tuple[int, int | None, int | None, list[Any], list[list[int] | None]]]


def _fetch(db: Database, sql_text: str, n_slice: int, nonfinite: Sequence[bool] = ()) -> Aggregates:
    out: Aggregates = {}
    for row in db.fetch_all(sql_text):
        key = tuple(_norm_slice_value(v) for v in row[:n_slice])
        rows, keys, dups = row[n_slice : n_slice + 3]
        sums, counts, j = [], [], n_slice + 3
        while j < len(row):
            i = len(sums)
            sums.append(row[j])
            if i < len(nonfinite) and nonfinite[i]:
                counts.append([int(v or 0) for v in row[j + 1 : j + 4]])
                j += 4
            else:
                counts.append(None)
                j += 1
        if key in out:  # two values of one side that normalize alike: never merged or dropped silently
            raise DatabaseError(f"{db.name}: two slices of one side are the same slice once normalized {key} (UUID "
                                "text in two letter cases, say): make the slice column consistent on that side")
        out[key] = (int(rows or 0), None if keys is None else int(keys), None if dups is None else int(dups), sums, counts)
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

    Each side maps a slice to ``(rows, distinct keys | None, duplicated keys | None, [sums],
    [[NaN, +Inf, -Inf] rows | None per measure])`` (a 4-tuple without the last, or a 2-tuple
    ``(rows, [sums])``, is accepted too). A slice passes when rows, distinct keys, duplicated keys,
    every (finite) sum and every NaN/±Inf count agree, so a duplicate on one side and a missing row
    on the other never cancel out, nor does a NaN hide a finite difference.

    Returns:
        One :class:`~dw_dagster.core.models.SliceGap` per slice, sorted by slice value (NULL first).
    """
    def norm(v):
        v = (v[0], None, None, v[1]) if len(v) == 2 else tuple(v)
        return v if len(v) == 5 else (*v, [None] * len(measures))

    empty = (0, None, None, [None] * len(measures), [None] * len(measures))
    keys = sorted(set(source) | set(target), key=lambda k: tuple((v is not None, str(v)) for v in k))
    out = []
    for k in keys:
        s_rows, s_keys, s_dups, s_sums, s_nf = norm(source.get(k, empty))
        t_rows, t_keys, t_dups, t_sums, t_nf = norm(target.get(k, empty))
        # NaN/±Inf rows counted apart on a side that can hold them; a side that cannot holds none
        s_nf = [a or ([0, 0, 0] if b else None) for a, b in zip(s_nf, t_nf)]
        t_nf = [b or ([0, 0, 0] if a else None) for a, b in zip(s_nf, t_nf)]
        nf_ok = all(a == b for a, b in zip(s_nf, t_nf))
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
                source_nonfinite={m: v for m, v in zip(measures, s_nf) if v is not None},
                target_nonfinite={m: v for m, v in zip(measures, t_nf) if v is not None},
                passed=gap == 0 and s_keys == t_keys and s_dups == t_dups and sums_ok and nf_ok,
            )
        )
    return out


def _resolve(db: Database, table: str, slice_by: Sequence[str], measures: Sequence[str],
             key_columns: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """The catalog's names for the configured slice, measure and key columns on one side
    (:func:`~dw_dagster.databases.catalog.resolve_columns`).

    Raises:
        DatabaseError: a column is not in the table.
        CatalogError: a name matches two columns differing only in case.
    """
    from dw_dagster.databases.catalog import resolve_columns

    names = resolve_columns(db, table, [*slice_by, *measures, *key_columns])
    n, m = len(slice_by), len(measures)
    return names[:n], names[n:n + m], names[n + m:]


def _finite(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, Decimal):
        return v.is_finite()
    return True


def _read_side(db: Database, table: str, names: tuple[list[str], list[str], list[str]], measures: Sequence[str],
               where: exp.Expression | None = None) -> tuple[str, Aggregates]:
    """One side's per-slice aggregates. A measure whose sum comes back NaN or ±Inf in some slice
    is read again with its NaN/+Inf/-Inf rows counted apart and its sum over the finite values (a
    finite sum means no such row, so the common case costs one query)."""
    slice_by, ms, keys = names
    q = slice_aggregate_sql(table, slice_by, ms, db.dialect, keys, quote=True, where=where)
    agg = _aggregates(db, q, table, (), len(slice_by), measures)
    special = [any(not _finite(v[3][i]) for v in agg.values()) for i in range(len(ms))]
    if any(special):
        q = slice_aggregate_sql(table, slice_by, ms, db.dialect, keys, nonfinite=special, quote=True, where=where)
        agg = _aggregates(db, q, table, special, len(slice_by), measures)
    return q, agg


def reconcile(
    source_db: Database,
    target_db: Database,
    source_table: str,
    target_table: str,
    slice_by: Sequence[str],
    measures: Sequence[str],
    key_columns: Sequence[str] = (),
    where: exp.Expression | None = None,
    *,
    stable_read_attempts: int = 3,
    retry_wait_s: float = 2.0,
) -> ReconciliationResult:
    """Run the slice aggregates on both sides and compare them (``key_columns`` adds key counts;
    ``where``, from :func:`comparison_scope`, limits both sides to the same rows).

    Every name is resolved against its side's catalog and quoted as spelled there (see the module
    docstring; DuckDB and BigQuery match any case themselves and need no catalog read), and
    NaN/±Inf are counted apart from the finite sums (a second read of a side only when one of its
    sums comes back NaN or infinite).

    A table that changes while it is read (a target truncated and reloaded between the source read
    and the target read) must not read as "100 % short". A PostgreSQL side is read in one snapshot
    (:meth:`~dw_dagster.databases.SqlAlchemyDatabase.snapshot`: ``REPEATABLE READ``, its table
    locked ``ACCESS SHARE`` before the snapshot, so a reload in one transaction, ``TRUNCATE``
    included, is read as before or as after it); on other engines, and on a snapshot side that read
    no row at all, each side's ``COUNT(*)`` is taken right after both aggregate reads when a slice's
    rows differ, and the read is stable only when it equals the rows the aggregate read. An unstable read is retried (up to
    ``stable_read_attempts``, ``retry_wait_s`` apart); when none is stable the result is
    ``inconclusive`` (it neither passes nor counts as a failure; the check reports it as such).

    Raises:
        dw_dagster.databases.DatabaseError: a query failed (unknown table or column, no connection).
        dw_dagster.databases.catalog.CatalogError: a name matches two columns differing only in case.
        dw_dagster.databases.sql.UnsafeIdentifierError: a table or column name cannot be used.
    """
    sides = [(db, table, _resolve(db, table, slice_by, measures, key_columns), side)
             for db, table, side in ((source_db, source_table, "source"), (target_db, target_table, "target"))]
    unstable: list[str] = []
    attempts = max(1, int(stable_read_attempts))
    for attempt in range(attempts):
        reads, pinned = [], []
        for db, table, names, _ in sides:
            pinned.append(_snapshots(db))
            if pinned[-1]:  # one snapshot for the side's reads, its table locked against TRUNCATE first
                with db.snapshot([table]) as fetch:
                    reads.append(_read_side(_Pinned(db, fetch), table, names, measures, where))
            else:
                reads.append(_read_side(db, table, names, measures, where))
        (s_sql, s_agg), (t_sql, t_agg) = reads
        aggregates = [s_agg, t_agg]
        if s_agg.keys() == t_agg.keys() and all(s_agg[k][0] == t_agg[k][0] for k in s_agg):
            break  # no row gap in any slice: a change mid-read would have made one, so no recount
        # a side read in one snapshot saw one committed state of its table: no recount, unless it read
        # no row at all (a loader that empties and refills in two commits, caught in between)
        why = []
        for (db, table, _, side), a, snap in zip(sides, aggregates, pinned):
            read = sum(v[0] for v in a.values())
            if snap and read:
                continue
            after = _count(db, table, where)
            if after != read:
                why.append(f"{side} {table} changed while read: {read:,} rows read, {after:,} right after")
        if not why:
            break
        unstable.append(f"attempt {attempt + 1}: " + "; ".join(why))
        if attempt + 1 < attempts:
            time.sleep(retry_wait_s)
    slices = compare_slice_aggregates(aggregates[0], aggregates[1], slice_by, measures)
    return ReconciliationResult(
        slices=slices,
        source_sql=s_sql,
        target_sql=t_sql,
        source_database=source_db.name,
        target_database=target_db.name,
        attempts=attempt + 1,
        unstable=unstable,
    )


def _snapshots(db: Database) -> bool:
    """Whether ``db`` reads in one snapshot (:meth:`~dw_dagster.databases.SqlAlchemyDatabase.snapshot`: PostgreSQL)."""
    return db.dialect == "postgres" and callable(getattr(db, "snapshot", None))


class _Pinned:
    """``db`` whose ``fetch_all`` runs in an open snapshot."""

    def __init__(self, db: Database, fetch) -> None:
        self.dialect, self.name, self.fetch_all = db.dialect, db.name, fetch


def _count(db: Database, table: str, where: exp.Expression | None = None) -> int:
    """``COUNT(*)`` of ``table`` (of the rows ``where`` keeps)."""
    (row,) = db.fetch_all(exp.select(exp.Count(this=exp.Star())).from_(sql.table(table)).where(where).sql(dialect=db.dialect))
    return int(row[0] or 0)


def _aggregates(db: Database, q: str, table: str, nonfinite: Sequence[bool], n_slice: int, measures: Sequence[str]) -> Aggregates:
    try:
        return _fetch(db, q, n_slice, nonfinite)
    except DatabaseError as e:
        if "overflow" in str(e).lower():
            raise DatabaseError(f"{db.name}: a SUM of {', '.join(measures)} on {table} exceeds the database's exact "
                                f"numeric range (DECIMAL(38)); slice finer or compare a scaled measure. {e}") from e
        raise


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
        parts.append("finite sums differ: " + ", ".join(f"{m} by {s.sum_gaps[m]}" for m in bad_sums))
    for m, a in s.source_nonfinite.items():
        b = s.target_nonfinite.get(m)
        if a != b:
            parts.append(f"{m} NaN/+Inf/-Inf rows {a[0]}/{a[1]}/{a[2]} vs {b[0]}/{b[1]}/{b[2]}")
    return "; ".join(parts)


def reconciliation_metadata(result: ReconciliationResult, measures: Sequence[str]) -> dict[str, Any]:
    """The check result's metadata: the slice table, totals, the worst slice and the SQL run."""
    worst = max(result.slices, key=lambda s: abs(s.gap_pct), default=None)
    return {
        c.SLICES_KEY: slices_table(result.slices, measures),
        c.SLICES_JSON_KEY: dg.MetadataValue.json([s.model_dump(mode="json") for s in result.slices]),
        c.GAP_ROWS_KEY: result.gap_rows,
        c.SOURCE_ROWS_KEY: sum(s.source_rows for s in result.slices),
        c.TARGET_ROWS_KEY: sum(s.target_rows for s in result.slices),
        c.WORST_SLICE_KEY: json.dumps(worst.slice, default=str) if worst else "{}",
        c.WORST_GAP_PCT_KEY: worst.gap_pct if worst else 0.0,
        c.FAILING_SLICES_KEY: len(result.failing),
        c.READ_ATTEMPTS_KEY: result.attempts,
        c.QUERIES_KEY: dg.MetadataValue.md(
            f"source ({result.source_database}):\n```sql\n{result.source_sql}\n```\n"
            f"target ({result.target_database}):\n```sql\n{result.target_sql}\n```"
        ),
    }


@public
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
    name: str = c.RECONCILIATION_CHECK,
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    description: str | None = None,
    partition_column: str | None = None,
    partitions_def: dg.PartitionsDefinition | None = None,
    closed_partitions_only: bool = False,
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
        partition_column, partitions_def: the column (naive UTC values) the asset's time-window
            partitions are ranges of. With them, a run of a repair's ``verify`` stage (tagged
            with its change set) compares only the rows of the change set's window: partitions
            it left out (outside the definition, deferred) are not held against the repair.
        closed_partitions_only: compare only rows before the start of the partition still in
            progress (needs ``partition_column`` and ``partitions_def``); the result states the
            cut-off in ``dw/compared_up_to``, so a partition still loading is never "rows short".

    Returns:
        An ``AssetChecksDefinition``. Result metadata: ``dw/slices`` (table), ``dw/gap_rows``
        (rows), ``dw/worst_gap_pct`` (%), ``dw/worst_slice``, ``dw/read_attempts``, ``dw/queries``
        (the SQL run), and when scoped ``dw/compared_partitions`` / ``dw/compared_up_to``. When a
        table changed while it was read on every attempt (see :func:`reconcile`) the result is a
        WARN marked ``dw/inconclusive`` that opens no incident.

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
    for col in [*slice_by, *measures, *key_columns, *([partition_column] if partition_column else [])]:
        sql.identifier(col)
    if (partition_column is None) != (partitions_def is None):
        raise ValueError("partition_column and partitions_def go together")
    if closed_partitions_only and not isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        raise ValueError("closed_partitions_only needs partition_column and a time-window partitions_def")
    spec_meta = {
        c.CHECK_KIND_KEY: RECONCILIATION_KIND,
        c.SOURCE_TABLE_KEY: source_table,
        c.TARGET_TABLE_KEY: target_table,
        c.SLICE_BY_KEY: ",".join(slice_by),
        c.MEASURES_KEY: ",".join(measures),
        c.KEY_COLUMNS_KEY: ",".join(key_columns),
        c.SOURCE_RESOURCE_KEY_KEY: source_resource_key,
        c.TARGET_RESOURCE_KEY_KEY: target_resource_key,
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
        where, scope = None, {}
        if partitions_def is not None and partition_column is not None:
            window = _repair_window(context)
            if window is not None or closed_partitions_only:
                where, scope = comparison_scope(partitions_def, partition_column, window=window,
                                                closed_only=closed_partitions_only,
                                                dimension_columns=_dimension_columns(context, asset))
        result = reconcile(src, tgt, source_table, target_table, slice_by, measures, key_columns, where)

        if result.inconclusive:  # a table changed on every read: say so, never as a gap
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.WARN,
                description=f"inconclusive after {result.attempts} reads: {result.unstable[-1]}",
                metadata={**reconciliation_metadata(result, measures), INCONCLUSIVE_KEY: True, **(
                    {c.COMPARED_UP_TO_KEY: scope["compared_up_to"]} if "compared_up_to" in scope else {})},
            )
        failing = result.failing
        desc = (
            "all slices match"
            if not failing
            else "; ".join(_describe(s) for s in failing[:5])
        )
        if "partitions" in scope:
            desc += f" (compared partitions {', '.join(scope['partitions'])}: the repair's window)"
        if "compared_up_to" in scope:
            desc += f" (compared rows before {scope['compared_up_to']} UTC: closed partitions only)"
        metadata = reconciliation_metadata(result, measures)
        if "partitions" in scope:
            metadata[c.COMPARED_PARTITIONS_KEY] = ", ".join(scope["partitions"])
        if "compared_up_to" in scope:
            metadata[c.COMPARED_UP_TO_KEY] = scope["compared_up_to"]
        return dg.AssetCheckResult(
            passed=result.passed,
            severity=severity,
            description=desc,
            metadata=metadata,
        )

    return _reconciliation


def _dimension_columns(context: dg.AssetCheckExecutionContext, asset) -> dict[str, str]:
    """The checked asset's ``dw/partition_columns`` metadata (a multi-partitioned asset's
    {dimension: column}), or {} when its location's asset graph does not say."""
    from dw_dagster.core.asset_graph import asset_graph_of
    from dw_dagster.core.keys import PARTITION_COLUMNS_KEY

    graph, key = asset_graph_of(context), dg.AssetKey.from_coercible(asset)
    if graph is None or not graph.has(key):
        return {}
    cols = (graph.get(key).metadata or {}).get(PARTITION_COLUMNS_KEY) or {}
    return dict(getattr(cols, "value", getattr(cols, "data", cols)))


def _repair_window(context: dg.AssetCheckExecutionContext) -> list[str] | None:
    """The window of the change set whose ``verify`` stage this run is, else None."""
    from dw_dagster.core import keys as c
    from dw_dagster.core.records import load_change_set

    tags = context.run.tags
    cs_id = tags.get(c.CHANGE_SET_TAG)
    if not cs_id or tags.get(c.STAGE_TAG) != "verify":
        return None
    cs = load_change_set(context.instance, cs_id, tags.get(c.CHANGE_SET_VERSION_KEY))
    return list(cs.window) if cs is not None and cs.window else None
