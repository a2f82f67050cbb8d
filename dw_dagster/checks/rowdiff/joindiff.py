"""Row diff inside one database: one query that joins the two tables on the key.

Inside one database (:func:`row_diff`) the diff is one query pushed down as SQL: each side is
grouped by the key (``GROUP BY`` treats NULL as a value, so keys are NULL-safe and duplicates are
counted), the two are joined with a ``FULL OUTER JOIN ... ON k IS NOT DISTINCT FROM k``, and
only differing keys come back, ordered by key (deterministic output).
"""

from collections.abc import Sequence

import sqlglot

from dw_dagster.checks.rowdiff.rules import (
    TEXT_TYPES,
    RowDiffEntry,
    RowDiffResult,
    _compare_columns,
    _differs,
    _is,
    _key_expr,
    _Options,
    _options,
    _trimmed,
)
from dw_dagster.databases import Database, sql
from dw_dagster.databases.catalog import column_types


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


# ---- the asset check -----------------------------------------------------------------------------


