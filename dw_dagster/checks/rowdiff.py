"""Row-level key diff: which keys are missing, extra, duplicated or changed, and in which columns.

Inside one database (:func:`row_diff`) the diff is one query pushed down as SQL: each side is
grouped by the key (``GROUP BY`` treats NULL as a value, so keys are NULL-safe and duplicates are
counted), the two are joined with a ``FULL OUTER JOIN ... ON k IS NOT DISTINCT FROM k``, and
only differing keys come back, ordered by key (deterministic output).

Across two databases (:func:`row_diff_across`) each side computes, per bucket of
``hash(key) mod buckets``, the row count and the sum of 48-bit row hashes (md5 over a row string
with an explicit per-column NULL marker and a length prefix, so ``NULL`` ≠ ``''`` and ``'1','11'``
≠ ``'11','1'``; summed, never XOR-ed, so duplicates count). Only buckets whose (count, sum)
differ are downloaded and diffed in Python. Buckets are by hash of the key, never by string
ranges, so the two engines' string collations cannot disagree on the split
(``shared/reference/reconciliation_and_anomaly.md`` §1.7).

Typed comparison (in the database, per column):

- integers and decimals exactly (never cast to floating point);
- floating point on either side within ``abs_tolerance + rel_tolerance × max(|a|, |b|)``
  (so ``0.1+0.2`` equals ``0.30`` and ``-0.0`` equals ``0.00``);
- timestamps truncated to ``timestamp_precision`` (``"millisecond"``, ...) when given;
- ``CHAR`` against ``VARCHAR`` with trailing blanks trimmed;
- keys compared case-insensitively when asked, with keys that collide under that rule reported.
"""

import hashlib
import json
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import dagster as dg
import sqlglot
from pydantic import BaseModel, Field

from dw_dagster import sql
from dw_dagster.checks.metadata import at_least, column_list, metadata_table
from dw_dagster.checks.utc import is_aware
from dw_dagster.databases import Database, DatabaseError, LocalDuckDB

FLOAT_TYPES = ("FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8", "FLOAT64")
SINGLE_FLOAT_TYPES = ("REAL", "FLOAT4")
CHAR_TYPES = ("CHAR", "BPCHAR", "CHARACTER")
TEXT_TYPES = ("VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR", "CHARACTER", "NVARCHAR", "NCHAR", "CHARACTER VARYING")
NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT", "INT2", "INT4", "INT8", "INT64",
                 "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "DECIMAL", "NUMERIC", "NUMBER", "BIGNUMERIC")
# A float difference this large means an infinity or NaN was involved (|a - b| is never finite there).
_DOUBLE_MAX = "1.7976931348623157e308"


class RowDiffEntry(BaseModel):
    key: list[Any]
    status: str = Field(description="missing (source only), extra (target only), changed, duplicate")
    columns: list[str] = Field(default_factory=list, description="changed columns")
    source_rows: int
    target_rows: int


class RowDiffResult(BaseModel):
    """Counts of each kind of difference (keys), per-column change counts, and a key-ordered sample."""

    missing: int = 0
    extra: int = 0
    changed: int = 0
    duplicated_source: int = 0
    duplicated_target: int = 0
    changed_columns: dict[str, int] = Field(default_factory=dict)
    sample: list[RowDiffEntry] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    queries: list[str] = Field(default_factory=list)
    buckets_compared: int | None = None
    buckets_downloaded: int | None = None
    rows_downloaded: int | None = None

    @property
    def identical(self) -> bool:
        return not (self.missing or self.extra or self.changed or self.duplicated_source or self.duplicated_target)


class ColumnTypes(dict):
    """Column name (lower case) → upper-case data type, in table order; ``names`` maps each lower-case
    name back to the column's own spelling (``"Net Sales"``), for quoting it where case matters."""

    def __init__(self, types: dict[str, str] | None = None, names: dict[str, str] | None = None) -> None:
        super().__init__(types or {})
        self.names = dict(names or {n: n for n in self})


def _spelling(name: str) -> str:
    """How to name a column back: a plain name in one case (``NET_SALES`` as Snowflake folds it, or
    ``net_sales``) in lower case, anything else (``Net Sales``, ``NetSales``) as the catalog spells it."""
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None
    return name.lower() if plain and name in (name.lower(), name.upper()) else name


def column_types(db: Database, table: str) -> ColumnTypes:
    """Column name (lower case) → upper-case data type, in table order, from ``information_schema.columns``.

    A name without a schema means the session's current schema; when no table of that name is
    there and exactly one schema has one, that one. A database that knows its schemas better
    (BigQuery's tables API) provides ``column_types``.

    Raises:
        DatabaseError: the table does not exist (or has no visible columns), or an unqualified name
            is in several schemas none of which is the current one.
    """
    if hasattr(db, "column_types"):
        found = db.column_types(table)
        return found if isinstance(found, ColumnTypes) else ColumnTypes(found)
    t = sql.table(table)
    schema = t.args.get("db")
    cond = f"LOWER(table_name) = {sql.literal(t.name.lower()).sql('duckdb')}"
    if schema is not None:
        cond += f" AND LOWER(table_schema) = {sql.literal(schema.name.lower()).sql('duckdb')}"
    src = "information_schema.columns"
    q = sqlglot.transpile(f"SELECT column_name, data_type, table_schema, CURRENT_SCHEMA() FROM {src} WHERE {cond} "
                          "ORDER BY table_schema, ordinal_position", read="duckdb", write=db.dialect)[0]
    rows = db.fetch_all(q)
    if not rows:
        raise DatabaseError(f"{db.name}: table {table} not found (no columns in information_schema)")
    schemas = list(dict.fromkeys(str(r[2]) for r in rows))
    if len(schemas) > 1:
        current = [s for s in schemas if rows[0][3] is not None and s.lower() == str(rows[0][3]).lower()]
        if not current:
            raise DatabaseError(f"{db.name}: table {table} is in several schemas ({', '.join(schemas)}); name one")
        rows = [r for r in rows if str(r[2]) == current[0]]
    types = ColumnTypes({str(n).lower(): str(ty).upper() for n, ty, *_ in rows}, {str(n).lower(): _spelling(str(n)) for n, *_ in rows})
    if db.dialect == "duckdb":  # DuckDB's information_schema calls its 4-byte REAL "FLOAT"
        for n, ty in types.items():
            if ty == "FLOAT":
                types[n] = "REAL"
    return types


def _is(kind: Sequence[str], ty: str | None) -> bool:
    if not ty or ("VARYING" in ty and "CHARACTER VARYING" not in kind):  # CHARACTER VARYING is VARCHAR, not CHAR
        return False
    return any(ty == k or ty.startswith(k + "(") or ty.startswith(k + " ") for k in kind)


def _scale(ty: str | None) -> int:
    """The scale of ``DECIMAL(p, s)`` / ``NUMERIC(p, s)`` / ``NUMBER(p, s)``; 0 for integers."""
    if ty and "," in ty and ty.endswith(")"):
        try:
            return int(ty.rsplit(",", 1)[1].rstrip(") "))
        except ValueError:
            return 0
    return 0


def _key_expr(ref: str, c: str, own: dict[str, str], other: dict[str, str], case_insensitive: bool) -> str:
    """A key column as compared: CHAR padding trimmed, text lower-cased when keys are
    case-insensitive (only text columns), and a numeric key whose type differs from the other
    side's (INTEGER against DECIMAL(10,2)) cast to one DECIMAL(38, s) so values, not spellings, match."""
    ty, ty_o = own.get(c.lower()), other.get(c.lower())
    e = ref
    if _text_vs_other(ty, ty_o):  # an INTEGER key against a VARCHAR one: matched as text
        e = f"CAST({e} AS VARCHAR)"
        ty = "VARCHAR"
    if _is(CHAR_TYPES, ty):
        e = f"RTRIM({e})"
    if case_insensitive and (ty is None or _is(TEXT_TYPES, ty)):
        e = f"LOWER({e})"
    if _is(NUMERIC_TYPES, ty) and _is(NUMERIC_TYPES, ty_o) and ty != ty_o:
        e = f"CAST({e} AS DECIMAL(38, {max(_scale(ty), _scale(ty_o))}))"
    if is_aware(ty) and ty_o and ty_o.startswith("TIMESTAMP") and not is_aware(ty_o):
        e = f"CAST({e} AT TIME ZONE 'UTC' AS TIMESTAMP)"  # an aware key against a naive (UTC by contract) one
    return e


def _text_vs_other(ty: str | None, ty_o: str | None) -> bool:
    """One side text and the other not: compared as text, since casting the text to the other
    type would round ('1.504' = DECIMAL 1.50) or fail ('abc' as INTEGER)."""
    return bool(ty and ty_o) and _is(TEXT_TYPES, ty) != _is(TEXT_TYPES, ty_o)


def _value_expr(alias: str, col: str, ty_self: str | None, ty_other: str | None, timestamp_precision: str | None) -> str:
    ref = f"{alias}.{sql.identifier(col).sql('duckdb')}"
    if _text_vs_other(ty_self, ty_other):
        return f"CAST({ref} AS VARCHAR)"
    if _is(CHAR_TYPES, ty_self) or _is(CHAR_TYPES, ty_other):
        return f"RTRIM({ref})"
    if timestamp_precision and ty_self and ty_self.startswith("TIMESTAMP"):
        if ty_self == "TIMESTAMP_NS":  # DuckDB rounds nanoseconds to microseconds on the cast DATE_TRUNC makes: floor first
            ref = f"MAKE_TIMESTAMP((EPOCH_NS({ref}) - ((EPOCH_NS({ref}) % 1000) + 1000) % 1000) // 1000)"
        return f"DATE_TRUNC('{timestamp_precision}', {ref})"
    return ref


def _differs(col: str, ts: str | None, tt: str | None, rel_tol: float, abs_tol: float, timestamp_precision: str | None) -> str:
    a = _value_expr("s", col, ts, tt, timestamp_precision)
    b = _value_expr("t", col, tt, ts, timestamp_precision)
    if (_is(FLOAT_TYPES, ts) or _is(FLOAT_TYPES, tt)) and not _text_vs_other(ts, tt):
        if _is(SINGLE_FLOAT_TYPES, ts) or _is(SINGLE_FLOAT_TYPES, tt):
            rel_tol = max(rel_tol, 2.0 ** -23)  # a 4-byte float holds 24 significant bits
        fa, fb = f"CAST({a} AS DOUBLE)", f"CAST({b} AS DOUBLE)"
        # Equal values (+Inf = +Inf; NaN = NaN on DuckDB, Snowflake and PostgreSQL) never differ; otherwise a
        # difference that is not finite (an infinity or NaN on one side) always does, and a finite one
        # is judged against the tolerance.
        return (f"(CASE WHEN {a} IS NULL OR {b} IS NULL THEN {a} IS DISTINCT FROM {b} WHEN {fa} = {fb} THEN FALSE "
                f"ELSE NOT (ABS({fa} - {fb}) <= {_DOUBLE_MAX} "
                f"AND ABS({fa} - {fb}) <= {abs_tol!r} + {rel_tol!r} * GREATEST(ABS({fa}), ABS({fb}))) END)")
    return f"({a} IS DISTINCT FROM {b})"


def row_diff_sql(source_table: str, target_table: str, key_columns: Sequence[str], compare_columns: Sequence[str],
                 source_types: dict[str, str], target_types: dict[str, str], *, rel_tolerance: float = 1e-9,
                 abs_tolerance: float = 1e-12, timestamp_precision: str | None = None,
                 case_insensitive_keys: bool = False) -> str:
    """The in-database diff query (DuckDB dialect; transpile for others). Returns differing keys only."""
    q = lambda c: sql.identifier(c).sql("duckdb")  # noqa: E731

    def side(table: str, types: dict[str, str], other: dict[str, str]) -> str:
        key_expr = lambda c, _: _key_expr(q(c), c, types, other, case_insensitive_keys)  # noqa: E731
        keys = ", ".join(f"{key_expr(c, types)} AS {q(c)}" for c in key_columns)
        # PostgreSQL and BigQuery accept only equalities in a FULL JOIN's condition, so the
        # NULL-safe match is an equality on (key as text with NULL as '', is-NULL flag).
        safe = "".join(f", COALESCE(CAST({key_expr(c, types)} AS VARCHAR), '') AS dw_kc{i}, "
                       f"CASE WHEN {key_expr(c, types)} IS NULL THEN 1 ELSE 0 END AS dw_kn{i}"
                       for i, c in enumerate(key_columns))
        vals = "".join(f", MIN({q(c)}) AS {q(c)}" for c in compare_columns)
        groups = ", ".join(key_expr(c, types) for c in key_columns)
        return f"SELECT {keys}{safe}, COUNT(*) AS dw_n{vals} FROM {sql.table(table).sql('duckdb')} GROUP BY {groups}"

    on = " AND ".join(f"s.dw_kc{i} = t.dw_kc{i} AND s.dw_kn{i} = t.dw_kn{i}" for i in range(len(key_columns)))
    flags = [_differs(c, source_types.get(c.lower()), target_types.get(c.lower()), rel_tolerance, abs_tolerance,
                      timestamp_precision) for c in compare_columns]
    sel_keys = ", ".join(f"COALESCE(s.{q(c)}, t.{q(c)}) AS {q(c)}" for c in key_columns)
    sel_flags = "".join(f", {f} AS dw_d{i}" for i, f in enumerate(flags))
    where = " OR ".join(["s.dw_n IS NULL", "t.dw_n IS NULL", "s.dw_n > 1", "t.dw_n > 1", *flags])
    order = ", ".join(f"{i + 1} NULLS FIRST" for i in range(len(key_columns)))
    return (f"WITH s AS ({side(source_table, source_types, target_types)}), t AS ({side(target_table, target_types, source_types)}) "
            f"SELECT {sel_keys}, s.dw_n AS dw_sn, t.dw_n AS dw_tn{sel_flags} "
            f"FROM s FULL OUTER JOIN t ON {on} WHERE {where} ORDER BY {order}")


def _counts_and_null_keys(db: Database, table: str, key_columns: Sequence[str], side: str) -> tuple[int, list[str], str]:
    """Row count of ``table`` and the NULL-key warnings, in one pushed-down query."""
    parts = "".join(f", COUNT(*) - COUNT({sql.identifier(c).sql('duckdb')})" for c in key_columns)
    q = sqlglot.transpile(f"SELECT COUNT(*){parts} FROM {sql.table(table).sql('duckdb')}", read="duckdb", write=db.dialect)[0]
    (row,) = db.fetch_all(q)
    return int(row[0]), [_null_key_warning(c, n, side) for c, n in zip(key_columns, row[1:]) if n], q


def _null_key_warning(column: str, nulls: int, side: str) -> str:
    return f"key column {column} has {nulls} NULL(s) on the {side} side; compared NULL-safely"


def _collisions(db: Database, table: str, key_columns: Sequence[str], side: str, types: dict[str, str]) -> tuple[list[str], str]:
    q_ = lambda c: sql.identifier(c).sql("duckdb")  # noqa: E731
    text = lambda c: types.get(c.lower()) is None or _is(TEXT_TYPES, types.get(c.lower()))  # noqa: E731
    lowered = ", ".join(f"LOWER({q_(c)})" if text(c) else q_(c) for c in key_columns)
    raw = " || '|' || ".join(f"COALESCE(CAST({q_(c)} AS VARCHAR), '')" for c in key_columns)
    q = sqlglot.transpile(
        f"SELECT {lowered}, COUNT(DISTINCT {raw}) FROM {sql.table(table).sql('duckdb')} GROUP BY {lowered} "
        f"HAVING COUNT(DISTINCT {raw}) > 1 ORDER BY 1 LIMIT 20", read="duckdb", write=db.dialect)[0]
    return [f"{side} keys collide when case is ignored: {list(r[:-1])} ({r[-1]} spellings)" for r in db.fetch_all(q)], q


def _tally(result: RowDiffResult, key: list, sn: int | None, tn: int | None, flags: Sequence[bool],
           compare_columns: Sequence[str], sample_limit: int) -> None:
    sn, tn = int(sn or 0), int(tn or 0)
    cols = [c for c, f in zip(compare_columns, flags) if f] if sn and tn else []
    if sn > 1:
        result.duplicated_source += 1
    if tn > 1:
        result.duplicated_target += 1
    if not tn:
        status = "missing"
        result.missing += 1
    elif not sn:
        status = "extra"
        result.extra += 1
    elif cols:
        status = "changed"
        result.changed += 1
        for c in cols:
            result.changed_columns[c] = result.changed_columns.get(c, 0) + 1
    else:
        status = "duplicate"
    if len(result.sample) < sample_limit:
        result.sample.append(RowDiffEntry(key=key, status=status, columns=cols, source_rows=sn, target_rows=tn))


def _duckdb_single_pass(db, source_table, target_table, key_columns, compare_columns, st, tt, rel_tolerance,
                        abs_tolerance, timestamp_precision, case_insensitive_keys, sample_limit) -> "RowDiffResult | None":
    """DuckDB fast path, one statement in two steps. First the two tables are joined on the key
    carrying only a 64-bit hash of the compared columns (about half the cost of joining the rows
    themselves at 10M rows): that gives the join's side counts, the NULL keys, and the candidate
    keys (unmatched, or a different hash). Then only the candidates' rows are joined again and
    compared with the typed rules. Equal hashes are taken as equal rows: every typed rule only
    makes more values equal, so a hash difference can never hide a difference the rules would
    report (a 2^-64 collision aside). Valid only when no key is duplicated; returns None (use
    the grouped query) when the counts or the list show a duplicate."""
    q = lambda c: sql.identifier(c).sql("duckdb")  # noqa: E731

    def key_expr(alias: str, c: str, types: dict[str, str]) -> str:
        return _key_expr(f"{alias}.{q(c)}", c, types, tt if types is st else st, case_insensitive_keys)

    n = len(key_columns)
    flags = [_differs(c, st.get(c.lower()), tt.get(c.lower()), rel_tolerance, abs_tolerance, timestamp_precision)
             for c in compare_columns]
    on = " AND ".join(f"{key_expr('s', c, st)} IS NOT DISTINCT FROM {key_expr('t', c, tt)}" for c in key_columns)
    fields = [f"'k{i}': COALESCE({key_expr('s', c, st)}, {key_expr('t', c, tt)})" for i, c in enumerate(key_columns)]
    fields += ["'sm': s.dw_m", "'tm': t.dw_m"] + [f"'d{i}': {f}" for i, f in enumerate(flags)]
    cond = " OR ".join(["s.dw_m IS NULL", "t.dw_m IS NULL", *flags])
    src, tgt = sql.table(source_table).sql("duckdb"), sql.table(target_table).sql("duckdb")
    order = ", ".join(f"COALESCE({key_expr('s', c, st)}, {key_expr('t', c, tt)}) NULLS FIRST" for c in key_columns)
    row_hash = f"hash({', '.join('x.' + q(c) for c in compare_columns)})" if compare_columns else "0"

    def hashed(table: str, types: dict[str, str]) -> str:
        keys = ", ".join(f"{key_expr('x', c, types)} AS dw_k{i}" for i, c in enumerate(key_columns))
        return f"(SELECT {keys}, {row_hash} AS dw_h FROM {table} AS x)"  # dw_h is never NULL: it marks the side

    def candidates_of(table: str, types: dict[str, str]) -> str:
        match = " AND ".join(f"dw_c.k{i} IS NOT DISTINCT FROM {key_expr('x', c, types)}" for i, c in enumerate(key_columns))
        return f"(SELECT x.*, 1 AS dw_m FROM {table} AS x WHERE EXISTS (SELECT 1 FROM dw_c WHERE {match}))"

    hk = " AND ".join(f"s.dw_k{i} IS NOT DISTINCT FROM t.dw_k{i}" for i in range(n))
    null_cols = [f"COUNT(CASE WHEN {a}.dw_h IS NOT NULL AND {a}.dw_k{i} IS NULL THEN 1 END) AS dw_n{a}{i}"
                 for a in ("s", "t") for i in range(n)]
    cand = "{" + ", ".join(f"'k{i}': COALESCE(s.dw_k{i}, t.dw_k{i})" for i in range(n)) + "}"
    step1 = (f"SELECT COUNT(s.dw_h) AS dw_js, COUNT(t.dw_h) AS dw_jt, {', '.join(null_cols)}, "
             f"LIST({cand}) FILTER (WHERE s.dw_h IS DISTINCT FROM t.dw_h) AS dw_cand "
             f"FROM {hashed(src, st)} AS s FULL OUTER JOIN {hashed(tgt, tt)} AS t ON {hk}")
    unnest = ", ".join(f"u.c.k{i} AS k{i}" for i in range(n))
    nulls = "".join(f", (SELECT dw_n{a}{i} FROM dw_p)" for a in ("s", "t") for i in range(n))
    query = (f"WITH dw_p AS ({step1}), dw_c AS (SELECT {unnest} FROM (SELECT UNNEST(dw_cand) AS c FROM dw_p) AS u) "
             f"SELECT (SELECT COUNT(*) FROM {src}), (SELECT COUNT(*) FROM {tgt}), (SELECT dw_js FROM dw_p), (SELECT dw_jt FROM dw_p), "
             f"LIST({{{', '.join(fields)}}} ORDER BY {order}) FILTER (WHERE {cond}){nulls} "
             f"FROM {candidates_of(src, st)} AS s FULL OUTER JOIN {candidates_of(tgt, tt)} AS t ON {on}")
    # Arrow, not Python objects: the list of differing rows can hold millions of entries.
    import pyarrow as pa

    tbl = pa.Table.from_batches(list(db.fetch_batches(query)))
    head = [tbl.column(i)[0].as_py() for i in range(4)]
    null_counts = [tbl.column(i)[0].as_py() for i in range(5, tbl.num_columns)]
    n_src, n_tgt, joined_s, joined_t = head
    if joined_s != n_src or joined_t != n_tgt:
        return None  # a matched key is duplicated on some side
    listed = tbl.column(4).combine_chunks()
    structs = None if listed.null_count else listed.flatten()
    count = 0 if structs is None else len(structs)
    result = RowDiffResult(queries=[query])
    for (side, c), k in zip(((side, c) for side in ("source", "target") for c in key_columns), null_counts):
        if k:
            result.warnings.append(_null_key_warning(c, k, side))
    if not count:
        return result
    # Counted with Arrow compute (the list can hold millions of differing keys); Python objects
    # only for the sample.
    import pyarrow.compute as pc

    keys = [structs.field(f"k{i}") for i in range(n)]
    if count > 1:
        same = None
        for arr in keys:  # keys arrive sorted: an unmatched duplicated key sits next to itself
            a, b = arr.slice(0, count - 1), arr.slice(1)
            eq = pc.fill_null(pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b))), False)
            same = eq if same is None else pc.and_(same, eq)
        if pc.any(same).as_py():
            return None
    in_s, in_t = pc.is_valid(structs.field("sm")), pc.is_valid(structs.field("tm"))
    both = pc.and_(in_s, in_t)
    result.missing = int(pc.sum(pc.invert(in_t)).as_py() or 0)
    result.extra = int(pc.sum(pc.invert(in_s)).as_py() or 0)
    result.changed = int(pc.sum(both).as_py() or 0)  # a matched key is listed only when a column differs
    for i, c in enumerate(compare_columns):
        changed = int(pc.sum(pc.and_(both, pc.fill_null(structs.field(f"d{i}"), False))).as_py() or 0)
        if changed:
            result.changed_columns[c] = changed
    head = structs.slice(0, sample_limit)
    cols = {name: head.field(name).to_pylist() for name in [f"k{i}" for i in range(n)] + ["sm", "tm"]
            + [f"d{i}" for i in range(len(compare_columns))]}
    for j in range(len(head)):
        sn, tn = int(cols["sm"][j] or 0), int(cols["tm"][j] or 0)
        changed_cols = [c for i, c in enumerate(compare_columns) if cols[f"d{i}"][j]] if sn and tn else []
        status = "missing" if not tn else "extra" if not sn else "changed"
        result.sample.append(RowDiffEntry(key=[cols[f"k{i}"][j] for i in range(n)], status=status, columns=changed_cols,
                                          source_rows=sn, target_rows=tn))
    return result


def row_diff(db: Database, source_table: str, target_table: str, key_columns: Sequence[str],
             compare_columns: Sequence[str] | None = None, *, rel_tolerance: float = 1e-9, abs_tolerance: float = 1e-12,
             timestamp_precision: str | None = None, case_insensitive_keys: bool = False,
             trim_trailing_blanks: bool = False, sample_limit: int = 100) -> RowDiffResult:
    """Diff two tables in the same database by key (see the module docstring).

    Args:
        db: the database holding both tables.
        source_table, target_table: ``schema.table`` names.
        key_columns: the key (compound keys allowed; NULL-safe).
        compare_columns: columns to compare; default every non-key column the two tables share.
        rel_tolerance, abs_tolerance: for floating-point columns only.
        timestamp_precision: ``DATE_TRUNC`` unit applied to timestamps before comparing.
        case_insensitive_keys: compare text keys with ``LOWER``; colliding keys are reported.
        trim_trailing_blanks: compare every text column and key with trailing blanks trimmed, as
            ``CHAR`` columns always are. Needed where a blank-padded ``CHAR`` export landed in a
            engine that reports it as ``VARCHAR`` (DuckDB has no padded ``CHAR`` type).
        sample_limit: how many differing keys to keep (the counts cover all of them).

    Returns:
        A :class:`RowDiffResult`; ``queries`` holds the SQL run.

    Raises:
        DatabaseError: a table or key column is missing, or a query fails.
    """
    st, tt = _trimmed(column_types(db, source_table), trim_trailing_blanks), _trimmed(column_types(db, target_table), trim_trailing_blanks)
    compare_columns, left_out = _compare_columns(source_table, target_table, key_columns, compare_columns, st, tt)
    opts = _options(rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys)
    result, fast = _diff_typed(db, source_table, target_table, key_columns, compare_columns, st, tt, opts, sample_limit)
    result.warnings += left_out
    for table, side in ((source_table, "source"), (target_table, "target")):
        if not fast:  # the single pass already counted NULL keys
            _, w, wq = _counts_and_null_keys(db, table, key_columns, side)
            result.warnings += w
            result.queries.append(wq)
        if case_insensitive_keys:
            w, wq = _collisions(db, table, key_columns, side, st if side == "source" else tt)
            result.warnings += w
            result.queries.append(wq)
    return result


def _trimmed(types: ColumnTypes, trim: bool) -> ColumnTypes:
    """With ``trim``, text columns are treated as ``CHAR`` (compared with trailing blanks trimmed)."""
    return ColumnTypes({c: "CHAR" if trim and _is(TEXT_TYPES, ty) else ty for c, ty in types.items()},
                       getattr(types, "names", None))


TIMESTAMP_PRECISIONS = ("microsecond", "millisecond", "second", "minute", "hour", "day")


def _options(rel_tolerance: float, abs_tolerance: float, timestamp_precision: str | None,
             case_insensitive_keys: bool) -> "_Options":
    """The typed-comparison settings, checked (they end up in SQL).

    Raises:
        ValueError: a tolerance that is negative or not finite, or an unknown ``timestamp_precision``.
    """
    for name, v in (("rel_tolerance", rel_tolerance), ("abs_tolerance", abs_tolerance)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
    if timestamp_precision is not None and timestamp_precision not in TIMESTAMP_PRECISIONS:
        raise ValueError(f"timestamp_precision must be one of {', '.join(TIMESTAMP_PRECISIONS)} or None, got {timestamp_precision!r}")
    return _Options(float(rel_tolerance), float(abs_tolerance), timestamp_precision, bool(case_insensitive_keys))


class _Options(NamedTuple):
    rel_tolerance: float
    abs_tolerance: float
    timestamp_precision: str | None
    case_insensitive_keys: bool


def _compare_columns(source_table: str, target_table: str, key_columns: Sequence[str], compare_columns: Sequence[str] | None,
                     st: ColumnTypes, tt: ColumnTypes) -> tuple[list[str], list[str]]:
    """The columns to compare (each in its own spelling) and warnings about columns left out."""
    if isinstance(key_columns, str) or isinstance(compare_columns, str):
        raise ValueError("key_columns and compare_columns are lists of column names, not a string")
    keys_l = [k.lower() for k in key_columns]
    if len(set(keys_l)) != len(keys_l):
        raise ValueError(f"key_columns names a column twice: {list(key_columns)}")
    for k in keys_l:
        if k not in st or k not in tt:
            raise DatabaseError(f"key column {k} is not in both {source_table} and {target_table}")
    if compare_columns is None:
        names = getattr(st, "names", {})
        only = [f"column {names.get(c, c)} is only in {source_table}; not compared" for c in st if c not in tt and c not in keys_l]
        only += [f"column {getattr(tt, 'names', {}).get(c, c)} is only in {target_table}; not compared"
                 for c in tt if c not in st and c not in keys_l]
        return [names.get(c, c) for c in st if c in tt and c not in keys_l], only
    for c in compare_columns:
        if c.lower() not in st or c.lower() not in tt:
            raise DatabaseError(f"compared column {c} is not in both {source_table} and {target_table}")
    return list(compare_columns), []


def _diff_typed(db: Database, source_table: str, target_table: str, key_columns: Sequence[str],
                compare_columns: Sequence[str], st: dict[str, str], tt: dict[str, str], opts: _Options,
                sample_limit: int) -> tuple[RowDiffResult, bool]:
    """The diff with the column types given (``st``/``tt`` may come from other databases than ``db``:
    :func:`row_diff_across` passes the types of the tables the rows were downloaded from).
    Returns the result and whether DuckDB's single pass produced it (it counts NULL keys itself)."""
    if db.dialect == "duckdb":
        result = _duckdb_single_pass(db, source_table, target_table, key_columns, compare_columns, st, tt, *opts, sample_limit)
        if result is not None:
            return result, True
    q = sqlglot.transpile(
        row_diff_sql(source_table, target_table, key_columns, compare_columns, st, tt, rel_tolerance=opts.rel_tolerance,
                     abs_tolerance=opts.abs_tolerance, timestamp_precision=opts.timestamp_precision,
                     case_insensitive_keys=opts.case_insensitive_keys), read="duckdb", write=db.dialect)[0]
    result = RowDiffResult(queries=[q])
    n = len(key_columns)
    for batch in db.fetch_batches(q):
        for row in zip(*(c.to_pylist() for c in batch.columns)):
            _tally(result, list(row[:n]), row[n], row[n + 1], row[n + 2 :], compare_columns, sample_limit)
    return result, False


# ---- across two databases: bucketed checksums -------------------------------------------------

# md5 as lower-case hex text, per dialect (``{s}``: the row string).
_MD5_HEX = {"duckdb": "MD5({s})", "postgres": "MD5({s})", "snowflake": "MD5({s})", "bigquery": "TO_HEX(MD5({s}))"}

# The first 12 hex digits (48 bits) of an md5 hex column ``{h}`` as an integer, the same number on
# every engine. Snowflake's ``TO_NUMBER(h, 'XXXXXXXXXXXX')`` would do, but fakesnow (the test
# emulator) lacks a format argument, so Snowflake adds the 12 digits' values positionally.
_HEX48 = {
    "duckdb": "CAST(('0x' || SUBSTRING({h}, 1, 12)) AS BIGINT)",
    "postgres": "('x' || SUBSTRING({h}, 1, 12))::BIT(48)::BIGINT",
    "snowflake": " + ".join(f"(POSITION(SUBSTR({{h}}, {i + 1}, 1), '0123456789abcdef') - 1) * {16 ** (11 - i)}" for i in range(12)),
    "bigquery": "CAST(CONCAT('0x', SUBSTR({h}, 1, 12)) AS INT64)",
}


def _row_string(columns: Sequence[str]) -> str:
    """Per column: 'N' for NULL, else 'V' + length + ':' + text; joined with '|' (DuckDB dialect)."""
    parts = []
    for c in columns:
        v = f"CAST({sql.identifier(c).sql('duckdb')} AS VARCHAR)"
        parts.append(f"(CASE WHEN {v} IS NULL THEN 'N' ELSE 'V' || CAST(LENGTH({v}) AS VARCHAR) || ':' || {v} END)")
    return " || '|' || ".join(parts)


def _md5_hex_sql(dialect: str, duck_expr: str) -> str:
    if dialect not in _HEX48:
        raise NotImplementedError(f"no 48-bit row hash for dialect {dialect!r}; supported: {sorted(_HEX48)}")
    s = sqlglot.transpile(f"SELECT {duck_expr}", read="duckdb", write=dialect)[0][len("SELECT "):]
    return _MD5_HEX[dialect].format(s=s)


class _Hashes(NamedTuple):
    """How one side computes its hashes: ``key``/``row`` are computed once per row in an inner
    query (as ``dw_kx``/``dw_rx``), and ``to_int`` (a format string over ``{h}``) turns them into
    the integers that are bucketed and summed."""

    key: str
    row: str
    to_int: str


def _hashes(db: Database, key_columns: Sequence[str], columns: Sequence[str], native: bool) -> _Hashes:
    """DuckDB's native ``hash`` when both sides are DuckDB (about 27× faster than md5 strings,
    reference §1.4), else md5 over :func:`_row_string` with its first 48 bits as the integer."""
    if native:
        q = lambda cs: ", ".join(sql.identifier(c).sql("duckdb") for c in cs)  # noqa: E731
        return _Hashes(f"hash({q(key_columns)})", f"(hash({q([*key_columns, *columns])}) >> 16)", "{h}")
    return _Hashes(_md5_hex_sql(db.dialect, _row_string(key_columns)),
                   _md5_hex_sql(db.dialect, _row_string([*key_columns, *columns])), _HEX48[db.dialect])


def _from(db: Database, table: str) -> str:
    return sqlglot.transpile(f"SELECT 1 FROM {sql.table(table).sql('duckdb')}", read="duckdb", write=db.dialect)[0][len("SELECT 1 FROM "):]


def _bucket_sql(db: Database, table: str, h: _Hashes, buckets: int) -> str:
    total = "SUM(CAST(dw_h AS DECIMAL(38, 0)))" if db.dialect == "bigquery" else "SUM(dw_h)"
    key, row = h.to_int.format(h="dw_kx"), h.to_int.format(h="dw_rx")
    return (f"SELECT dw_b, COUNT(*) AS dw_n, CAST({total} AS VARCHAR) AS dw_sum FROM (SELECT MOD({key}, {buckets}) AS dw_b, "
            f"{row} AS dw_h FROM (SELECT {h.key} AS dw_kx, {h.row} AS dw_rx FROM {_from(db, table)}) AS i) AS x GROUP BY dw_b")


def _bucket_filter(db: Database, key_h: str, buckets: int, wanted: Sequence[int]) -> str:
    """``WHERE`` condition selecting the rows of the ``wanted`` buckets.

    On DuckDB the bucket list travels as one string literal split into a semi-join
    (``IN (SELECT UNNEST(STRING_SPLIT(...)))``): a list of 100,000 numbers as separate SQL tokens
    took 1.25 s to parse and bind per side at 10M rows, the literal 0.2 s for the whole query.
    Other engines get a plain ``IN`` list.
    """
    listed = ",".join(str(int(b)) for b in wanted)
    if db.dialect == "duckdb":
        return f"MOD({key_h}, {buckets}) IN (SELECT CAST(UNNEST(STRING_SPLIT('{listed}', ',')) AS BIGINT))"
    return f"MOD({key_h}, {buckets}) IN ({listed})"


def _download_sql(db: Database, table: str, h: _Hashes, key_columns: Sequence[str], columns: Sequence[str],
                  buckets: int, wanted: Sequence[int] | None) -> str:
    exprs = ", ".join(sql.identifier(c).sql("duckdb") for c in [*key_columns, *columns])
    names = sqlglot.transpile(f"SELECT {exprs}", read="duckdb", write=db.dialect)[0][len("SELECT "):]
    if wanted is None:
        return f"SELECT {names} FROM {_from(db, table)}"
    return (f"SELECT {names} FROM (SELECT {names}, {h.key} AS dw_kx FROM {_from(db, table)}) AS i "
            f"WHERE {_bucket_filter(db, h.to_int.format(h='dw_kx'), buckets, wanted)}")


def row_diff_across(source: Database, target: Database, source_table: str, target_table: str,
                    key_columns: Sequence[str], compare_columns: Sequence[str] | None = None, *,
                    rel_tolerance: float = 1e-9, abs_tolerance: float = 1e-12, timestamp_precision: str | None = None,
                    case_insensitive_keys: bool = False, trim_trailing_blanks: bool = False, buckets: int | None = None,
                    max_download_rows: int = 20_000_000, sample_limit: int = 100, portable: bool = False) -> RowDiffResult:
    """Diff two tables in different databases by bucketed checksums (see the module docstring).

    1. Per side, one query for the row count and the NULLs in each key column (the NULL-key
       warnings cover the whole table, not only what is downloaded). ``buckets`` defaults to the
       power of two nearest to max(rows) / 16, between 1,024 and 1,048,576, so a bucket holds
       a few rows.
    2. Per bucket of ``hash(key) mod buckets``, the row count and the sum of 48-bit row hashes
       on each side (pushed down; the per-bucket results come back as Arrow and are compared in a
       local in-memory DuckDB).
    3. Only the rows of differing buckets are downloaded (all rows when more than half the
       buckets differ), with their native types, and diffed locally by :func:`row_diff`'s
       typed comparison using the types each table has in its own database, so tolerances,
       ``CHAR`` padding, timestamp precision and case-insensitive keys mean the same as in one
       database, and the result has the same shape and ordering.

    The row hashes are DuckDB's native ``hash`` when both sides are DuckDB (about 27× faster
    than md5, ``shared/reference/reconciliation_and_anomaly.md`` §1.4), else md5 over each
    engine's text form of the row. Equal hashes are taken as equal rows (a 2^-48 chance per
    bucket of missing a change); unequal hashes only cause a download, never a reported
    difference, so engines that print the same value differently (``0.30`` and ``0.3``) cost
    bandwidth, not correctness.

    Args:
        source, target: the two databases.
        source_table, target_table: ``schema.table`` names in their databases.
        key_columns: the key (compound keys allowed; NULL-safe).
        compare_columns: columns to compare; default every non-key column the two tables share.
        rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys, trim_trailing_blanks:
            as in :func:`row_diff`.
        buckets: bucket count (default: chosen from the row counts as above).
        max_download_rows: refuse (raise) rather than download more rows than this in step 3.
        sample_limit: how many differing keys to keep (the counts cover all of them).
        portable: use the md5 row hash even between two DuckDB databases.

    Returns:
        A :class:`RowDiffResult` with ``buckets_compared``, ``buckets_downloaded`` and
        ``rows_downloaded`` set; ``queries`` holds the SQL sent to the two databases.

    Raises:
        NotImplementedError: a dialect without a row hash here (DuckDB, PostgreSQL, Snowflake and
            BigQuery have one).
        DatabaseError: a table or column is missing, a query fails, or the rows to download
            exceed ``max_download_rows``.
    """
    import pyarrow as pa

    native = source.dialect == target.dialect == "duckdb" and not portable
    st = _trimmed(column_types(source, source_table), trim_trailing_blanks)
    tt = _trimmed(column_types(target, target_table), trim_trailing_blanks)
    compare_columns, left_out = _compare_columns(source_table, target_table, key_columns, compare_columns, st, tt)
    opts = _options(rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys)
    n_s, warn_s, q_ns = _counts_and_null_keys(source, source_table, key_columns, "source")
    n_t, warn_t, q_nt = _counts_and_null_keys(target, target_table, key_columns, "target")
    warnings, queries = left_out + warn_s + warn_t, [q_ns, q_nt]
    if case_insensitive_keys:
        for db, table, side, types in ((source, source_table, "source", st), (target, target_table, "target", tt)):
            w, q = _collisions(db, table, key_columns, side, types)
            warnings += w
            queries.append(q)
    if buckets is None:
        want = max(n_s, n_t) / 16
        buckets = 1 << max(10, min(20, round(max(want, 1)).bit_length()))
    hs, ht = _hashes(source, key_columns, compare_columns, native), _hashes(target, key_columns, compare_columns, native)
    qs, qt = _bucket_sql(source, source_table, hs, buckets), _bucket_sql(target, target_table, ht, buckets)
    queries += [qs, qt]
    local = LocalDuckDB()
    try:
        for name, db, q in (("dw_bs", source, qs), ("dw_bt", target, qt)):
            # one Arrow table registered and copied once (LocalDuckDB.load inserts batch by batch,
            # 1.5 s slower at 1M buckets, and matches column names by case; Snowflake's are upper case)
            batches = list(db.fetch_batches(q))
            src = "(SELECT NULL AS dw_b, NULL AS dw_n, NULL AS dw_sum WHERE FALSE)"
            if batches:
                local.con.register(name + "_arrow", pa.Table.from_batches(batches))
                src = name + "_arrow"
            # the sums come back as text (exact on every engine); compared as numbers ('12.000' = '12')
            local.execute(f"CREATE TABLE {name} AS SELECT CAST(dw_b AS BIGINT) AS dw_b, CAST(dw_n AS BIGINT) AS dw_n, "
                          f"CAST(CAST(dw_sum AS VARCHAR) AS DECIMAL(38, 0)) AS dw_sum FROM {src}")
            if batches:
                local.con.unregister(name + "_arrow")
            del batches
        differing = [r[0] for r in local.fetch_all(
            "SELECT COALESCE(s.dw_b, t.dw_b) FROM dw_bs s FULL OUTER JOIN dw_bt t ON s.dw_b = t.dw_b "
            "WHERE s.dw_n IS DISTINCT FROM t.dw_n OR s.dw_sum IS DISTINCT FROM t.dw_sum ORDER BY 1")]
        result = RowDiffResult(queries=queries, warnings=warnings, buckets_compared=buckets,
                               buckets_downloaded=len(differing), rows_downloaded=0)
        if not differing:
            return result
        all_rows = len(differing) > buckets // 2
        only = "" if all_rows else f"WHERE dw_b IN (SELECT CAST(UNNEST(STRING_SPLIT('{','.join(map(str, differing))}', ',')) AS BIGINT))"
        (size,) = local.fetch_all(f"SELECT COALESCE(SUM(dw_n), 0) FROM (SELECT dw_b, dw_n FROM dw_bs UNION ALL "
                                  f"SELECT dw_b, dw_n FROM dw_bt) {only}")[0]
        if size > max_download_rows:
            raise DatabaseError(f"{len(differing)} differing buckets hold {size} rows, over max_download_rows={max_download_rows}")
        wanted = None if all_rows else differing
        downloaded = []
        for db, table, h in ((source, source_table, hs), (target, target_table, ht)):
            q = _download_sql(db, table, h, key_columns, compare_columns, buckets, wanted)
            result.queries.append(q)
            downloaded.append(list(db.fetch_batches(q)))
        schema = next((bs[0].schema for bs in downloaded if bs), None)  # an empty side borrows the other's
        for name, batches in zip(("dw_s", "dw_t"), downloaded):
            tbl = pa.Table.from_batches(batches) if batches else schema.empty_table()
            local.con.register(name, tbl)
            result.rows_downloaded += tbl.num_rows
        del downloaded
        diff, _ = _diff_typed(local, "dw_s", "dw_t", key_columns, compare_columns, st, tt, opts, sample_limit)
    finally:
        local.con.close()
    result.missing, result.extra, result.changed = diff.missing, diff.extra, diff.changed
    result.duplicated_source, result.duplicated_target = diff.duplicated_source, diff.duplicated_target
    result.changed_columns, result.sample = diff.changed_columns, diff.sample
    return result


def key_digest(values: Sequence[Any]) -> str:
    """A stable id for a key (sha256 of its text), for logs and receipts."""
    return hashlib.sha256("|".join("N" if v is None else f"V{len(str(v))}:{v}" for v in values).encode()).hexdigest()[:16]


# ---- the asset check -----------------------------------------------------------------------------

ROW_DIFF_KIND = "row_diff"


def _same_database(resources: Any, source_key: str, target_key: str) -> bool:
    if source_key == target_key:
        return True
    s, t = getattr(resources, source_key), getattr(resources, target_key)
    return getattr(s, "url", None) is not None and getattr(s, "url", None) == getattr(t, "url", None)


def row_diff_summary(result: RowDiffResult) -> str:
    """One line: ``identical``, or the counts and the most changed columns (``2 changed (amount ×2)``)."""
    if result.identical:
        return "identical"
    parts = [f"{n} {what}" for n, what in ((result.missing, "missing"), (result.extra, "extra"), (result.changed, "changed"))
             if n]
    if result.changed:  # "changed" is the last part
        top = sorted(result.changed_columns.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        parts[-1] += " (" + ", ".join(f"{c} ×{n}" for c, n in top) + ")"
    dups = [f"{n} key(s) duplicated in the {side}" for n, side in
            ((result.duplicated_source, "source"), (result.duplicated_target, "target")) if n]
    return ", ".join(parts + dups)


def row_diff_metadata(result: RowDiffResult) -> dict[str, Any]:
    """The check result's metadata: counts (keys), per-column change counts, a key sample table the
    Dagster UI renders, warnings and the SQL run."""
    sample = [{"key": str(e.key[0]) if len(e.key) == 1 and e.key[0] is not None else json.dumps(e.key, default=str),
               "status": e.status,
               "columns": ", ".join(e.columns), "source_rows": e.source_rows, "target_rows": e.target_rows}
              for e in result.sample]
    meta: dict[str, Any] = {
        "dw/missing": result.missing,
        "dw/extra": result.extra,
        "dw/changed": result.changed,
        "dw/duplicated_source": result.duplicated_source,
        "dw/duplicated_target": result.duplicated_target,
        "dw/changed_columns": dg.MetadataValue.json(result.changed_columns),
        "dw/key_sample": metadata_table(sample, [("key", "string"), ("status", "string"), ("columns", "string"),
                                                 ("source_rows", "int"), ("target_rows", "int")]),
        "dw/warnings": dg.MetadataValue.md("\n".join(f"- {w}" for w in result.warnings) or "none"),
        "dw/queries": dg.MetadataValue.md("\n\n".join(f"```sql\n{q}\n```" for q in result.queries)),
    }
    if result.buckets_compared is not None:
        meta.update({"dw/buckets_compared": result.buckets_compared, "dw/buckets_downloaded": result.buckets_downloaded,
                     "dw/rows_downloaded": result.rows_downloaded})
    return meta


def build_row_diff_check(
    *,
    asset: dg.AssetKey | str | Sequence[str],
    source_asset: dg.AssetKey | str | Sequence[str],
    source_table: str,
    target_table: str,
    key_columns: Sequence[str],
    compare_columns: Sequence[str] | None = None,
    source_resource_key: str = "source_db",
    target_resource_key: str = "warehouse",
    name: str = "row_diff",
    rel_tolerance: float = 1e-9,
    abs_tolerance: float = 1e-12,
    timestamp_precision: str | None = None,
    case_insensitive_keys: bool = False,
    trim_trailing_blanks: bool = False,
    sample_limit: int = 50,
    max_download_rows: int = 20_000_000,
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    description: str | None = None,
) -> dg.AssetChecksDefinition:
    """A row-level key diff asset check on the target asset: which keys are missing, extra,
    duplicated or changed, and in which columns.

    When both sides are one database (the same resource key, or two resources with the same
    ``url``) the diff is :func:`row_diff`, one join pushed down; otherwise :func:`row_diff_across`,
    bucketed checksums that download only the differing buckets.

    Args:
        asset: the target asset the check is attached to.
        source_asset: the upstream asset the target copies (an additional dependency of the check).
        source_table, target_table: ``schema.table`` names (quoted by sqlglot; a name that cannot be
            an identifier is refused when the check is built).
        key_columns: the key (compound keys allowed; NULL-safe).
        compare_columns: columns to compare; default every non-key column both tables have.
        source_resource_key, target_resource_key: keys of the two
            :class:`~dw_dagster.databases.DatabaseResource` resources.
        rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys, trim_trailing_blanks:
            the typed comparison, as in :func:`row_diff`.
        sample_limit: differing keys shown in ``dw/key_sample`` (the counts cover all of them).
        max_download_rows: across databases, refuse to download more rows than this.
        blocking: fail the run (and skip downstream) when the check fails with ERROR severity.
        severity: severity of a failed result (default ERROR).

    Returns:
        An ``AssetChecksDefinition`` that passes when the tables hold the same keys with the same
        values. Metadata: ``dw/missing``, ``dw/extra``, ``dw/changed``, ``dw/duplicated_source``,
        ``dw/duplicated_target`` (keys), ``dw/changed_columns`` (column → keys), ``dw/key_sample``
        (table), ``dw/warnings``, ``dw/queries``; across databases also ``dw/buckets_compared``,
        ``dw/buckets_downloaded``, ``dw/rows_downloaded``.

    Raises:
        UnsafeIdentifierError: a table or column name cannot be used (when the check is built).
        ValueError: no key columns, a key column named twice, a bare string where a list of columns
            is expected, a negative or non-finite tolerance, or an unknown ``timestamp_precision``.
        (When the check runs, a missing table or column fails it with a ``DatabaseError`` naming them.)
    """
    key_columns = column_list("key_columns", key_columns, allow_empty=False)
    if len({k.lower() for k in key_columns}) != len(key_columns):
        raise ValueError(f"key_columns names a column twice: {key_columns}")
    compare_columns = None if compare_columns is None else column_list("compare_columns", compare_columns)
    at_least("sample_limit", sample_limit, 0)
    at_least("max_download_rows", max_download_rows, 1)
    _options(rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys)
    sql.table(source_table), sql.table(target_table)
    for c in [*key_columns, *(compare_columns or ())]:
        sql.identifier(c)

    @dg.asset_check(
        asset=asset,
        name=name,
        additional_deps=[dg.AssetKey.from_coercible(source_asset)],
        blocking=blocking,
        required_resource_keys={source_resource_key, target_resource_key},
        metadata={"dw/check_kind": ROW_DIFF_KIND, "dw/source_table": source_table, "dw/target_table": target_table,
                  "dw/key_columns": ",".join(key_columns)},
        description=description or f"Row-level diff by {', '.join(key_columns)}: {source_table} (source) vs {target_table} (target).",
    )
    def _row_diff(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        src = getattr(context.resources, source_resource_key).get_database()
        opts = dict(compare_columns=compare_columns, rel_tolerance=rel_tolerance, abs_tolerance=abs_tolerance,
                    timestamp_precision=timestamp_precision, case_insensitive_keys=case_insensitive_keys,
                    trim_trailing_blanks=trim_trailing_blanks, sample_limit=sample_limit)
        if _same_database(context.resources, source_resource_key, target_resource_key):
            result = row_diff(src, source_table, target_table, key_columns, **opts)
        else:
            tgt = getattr(context.resources, target_resource_key).get_database()
            result = row_diff_across(src, tgt, source_table, target_table, key_columns, max_download_rows=max_download_rows, **opts)
        return dg.AssetCheckResult(passed=result.identical, severity=severity, description=row_diff_summary(result),
                                   metadata=row_diff_metadata(result))

    return _row_diff
