"""Row diff across two databases: bucketed row-hash sums, then only the differing buckets' rows.

Across two databases (:func:`row_diff_across`) each side computes, per bucket of
``hash(key) mod buckets``, the row count and the sum of 48-bit row hashes (md5 over a row string
with an explicit per-column NULL marker and a length prefix, so ``NULL`` ≠ ``''`` and ``'1','11'``
≠ ``'11','1'``; summed, never XOR-ed, so duplicates count). Only buckets whose (count, sum)
differ are downloaded and diffed in Python. Buckets are by hash of the key as compared (trimmed,
lower-cased with ``case_insensitive_keys``, aware timestamps in UTC: a key the diff matches lands
in the same bucket on both sides), never by string ranges, so the two engines' string collations
cannot disagree on the split (the bucketed-checksum method of data-diff/reladiff, with sums
instead of XOR).
"""

from collections.abc import Sequence
from typing import NamedTuple

import sqlglot

from dw_dagster.checks.rowdiff.joindiff import (
    _HEX48,
    _MD5_HEX,
    _collision_warning,
    _collisions,
    _counts_and_null_keys,
    _diff_typed,
)
from dw_dagster.checks.rowdiff.rules import RowDiffResult, _key_expr, _options, _plan, _relabel, _utc, timestamp_rule
from dw_dagster.databases import Database, DatabaseError, LocalDuckDB, sql


def _row_string(exprs: Sequence[str]) -> str:
    """Per expression: 'N' for NULL, else 'V' + length + ':' + text; joined with '|' (DuckDB dialect)."""
    parts = []
    for e in exprs:
        v = f"CAST({e} AS VARCHAR)"
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


def _hashes(db: Database, key_columns: Sequence[str], columns: Sequence[str], native: bool, own: dict[str, str],
            other: dict[str, str], case_insensitive: bool) -> _Hashes:
    """DuckDB's native ``hash`` when both sides are DuckDB (about 27× faster than md5 strings,
    reference §1.4), else md5 over :func:`_row_string` with its first 48 bits as the integer. The
    key is hashed as compared (:func:`~.rules._key_expr`), aware timestamps as UTC wall clocks."""
    q = lambda c: sql.identifier(c).sql("duckdb")  # noqa: E731
    keys = [_key_expr(q(c), c, own, other, case_insensitive) for c in key_columns]
    row = [*keys, *(_utc(q(c), own.get(c)) for c in columns)]
    if native:
        return _Hashes(f"hash({', '.join(keys)})", f"(hash({', '.join(row)}) >> 16)", "{h}")
    return _Hashes(_md5_hex_sql(db.dialect, _row_string(keys)), _md5_hex_sql(db.dialect, _row_string(row)), _HEX48[db.dialect])


def _from(db: Database, rel: str) -> str:
    return sqlglot.transpile(f"SELECT 1 FROM {rel} AS dw_x", read="duckdb", write=db.dialect)[0][len("SELECT 1 FROM "):]


def _bucket_sql(db: Database, table: str, h: _Hashes, buckets: int) -> str:
    total = "SUM(CAST(dw_h AS DECIMAL(38, 0)))" if db.dialect == "bigquery" else "SUM(dw_h)"
    key, row = h.to_int.format(h="dw_kx"), h.to_int.format(h="dw_rx")
    return (f"SELECT dw_b, COUNT(*) AS dw_n, CAST({total} AS VARCHAR) AS dw_sum FROM (SELECT MOD({key}, {buckets}) AS dw_b, "
            f"{row} AS dw_h FROM (SELECT {h.key} AS dw_kx, {h.row} AS dw_rx FROM {_from(db, table)}) AS i) AS x GROUP BY dw_b")


def _bucket_filter(db: Database, key_h: str, buckets: int, wanted: "str | tuple[int, int]") -> str:
    """``WHERE`` condition selecting the rows of the ``wanted`` buckets: a comma-separated list
    of bucket numbers, or an inclusive ``(low, high)`` range of them (a download pass when more
    than half the buckets differ).

    On DuckDB the bucket list travels as one string literal split into a semi-join
    (``IN (SELECT UNNEST(STRING_SPLIT(...)))``): a list of 100,000 numbers as separate SQL tokens
    took 1.25 s to parse and bind per side at 10M rows, the literal 0.2 s for the whole query.
    Other engines get a plain ``IN`` list.
    """
    if isinstance(wanted, tuple):
        return f"MOD({key_h}, {buckets}) BETWEEN {int(wanted[0])} AND {int(wanted[1])}"
    if any(c not in "0123456789," for c in wanted):
        raise ValueError(f"a bucket list holds only numbers and commas, got {wanted[:40]!r}")
    if db.dialect == "duckdb":
        return f"MOD({key_h}, {buckets}) IN (SELECT CAST(UNNEST(STRING_SPLIT('{wanted}', ',')) AS BIGINT))"
    return f"MOD({key_h}, {buckets}) IN ({wanted})"


def _download_sql(db: Database, table: str, h: _Hashes, key_columns: Sequence[str], columns: Sequence[str],
                  buckets: int, wanted: "str | tuple[int, int] | None") -> str:
    exprs = ", ".join(sql.identifier(c).sql("duckdb") for c in [*key_columns, *columns])
    names = sqlglot.transpile(f"SELECT {exprs}", read="duckdb", write=db.dialect)[0][len("SELECT "):]
    if wanted is None:
        return f"SELECT {names} FROM {_from(db, table)}"
    return (f"SELECT {names} FROM (SELECT {names}, {h.key} AS dw_kx FROM {_from(db, table)}) AS i "
            f"WHERE {_bucket_filter(db, h.to_int.format(h='dw_kx'), buckets, wanted)}")


class _Fetched:
    """What the diff fetched from and sent to the two databases: ``bytes`` is the Arrow buffer
    size (``RecordBatch.nbytes``) of every result set fetched as Arrow (the bucket checksums and
    the downloaded rows), ``rows`` the rows downloaded."""

    def __init__(self) -> None:
        self.bytes = 0

    def batches(self, db: Database, query: str) -> list:
        out = list(db.fetch_batches(query))
        self.bytes += sum(b.nbytes for b in out)
        return out


def _sort_key(entry) -> tuple:
    """Key order of the single-pass diff (NULLs first) for merging the passes' samples."""
    return tuple((v is not None, v) for v in entry.key)


def _merge(result: RowDiffResult, part: RowDiffResult, sample_limit: int) -> None:
    """Add one download pass's diff to ``result``; the sample keeps the first ``sample_limit``
    keys in key order over all passes (a key lands in one pass: passes split by bucket)."""
    for f in ("missing", "extra", "changed", "duplicated_source", "duplicated_target"):
        setattr(result, f, getattr(result, f) + getattr(part, f))
    for c, n in part.changed_columns.items():
        result.changed_columns[c] = result.changed_columns.get(c, 0) + n
    if part.sample:
        result.sample = sorted(result.sample + part.sample, key=_sort_key)[:sample_limit]


def row_diff_across(source: Database, target: Database, source_table: str, target_table: str,
                    key_columns: Sequence[str], compare_columns: Sequence[str] | None = None, *,
                    rel_tolerance: float = 1e-9, abs_tolerance: float = 1e-12, timestamp_precision: str | None = None,
                    timestamp_rounding: str = "tolerate", case_insensitive_keys: bool = False,
                    trim_trailing_blanks: bool = False, source_char_columns: Sequence[str] | None = None,
                    target_char_columns: Sequence[str] | None = None, buckets: int | None = None,
                    max_download_rows: int = 20_000_000, sample_limit: int = 100, portable: bool = False,
                    pass_rows: int = 2_000_000) -> RowDiffResult:
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
       database, and the result has the same shape and ordering. The download runs in passes
       of about ``pass_rows`` rows (:func:`_download_passes`), each diffed and dropped before
       the next, so memory does not grow with the table: each extra pass costs one more scan
       of each table.

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
        rel_tolerance, abs_tolerance, timestamp_precision, timestamp_rounding, case_insensitive_keys,
        trim_trailing_blanks, source_char_columns, target_char_columns: as in :func:`row_diff`; each
            name is resolved against its own side's catalog.
        buckets: bucket count (default: chosen from the row counts as above).
        max_download_rows: refuse (raise) rather than download more rows than this in step 3.
        sample_limit: how many differing keys to keep (the counts cover all of them).
        portable: use the md5 row hash even between two DuckDB databases.
        pass_rows: rows (both sides together) downloaded and diffed per pass, about; bounds the
            memory of step 3 (about 50 bytes a row for a key and three short columns, plus the
            local join over them).

    Returns:
        A :class:`RowDiffResult` with ``buckets_compared``, ``buckets_downloaded``,
        ``rows_downloaded``, ``download_passes``, ``bytes_fetched`` (Arrow buffer bytes of the
        bucket checksums and rows fetched from the two databases; the per-side count, NULL-key
        and collision queries' few values are not counted) and ``bytes_sent`` (UTF-8 bytes of
        the SQL in ``queries``, which carries the bucket lists) set; ``queries`` holds the SQL
        sent to the two databases.

    Raises:
        NotImplementedError: a dialect without a row hash here (DuckDB, PostgreSQL, Snowflake and
            BigQuery have one).
        DatabaseError: a table or column is missing, a query fails, or the rows to download
            exceed ``max_download_rows``.
        ValueError: ``pass_rows`` is below 1.
        CatalogError: a configured column name matches two columns differing only in case.
    """
    import pyarrow as pa

    if pass_rows < 1:
        raise ValueError(f"pass_rows must be at least 1, got {pass_rows}")
    native = source.dialect == target.dialect == "duckdb" and not portable
    opts = _options(rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys, timestamp_rounding)
    plan = _plan(source, target, source_table, target_table, key_columns, compare_columns, trim_trailing_blanks,
                 source_char_columns, target_char_columns)
    key_columns, compare_columns, st, tt = plan.keys, plan.columns, plan.st, plan.tt
    n_s, warn_s, q_ns = _counts_and_null_keys(source, plan.source_rel, key_columns, "source", plan.labels)
    n_t, warn_t, q_nt = _counts_and_null_keys(target, plan.target_rel, key_columns, "target", plan.labels)
    warnings, queries = plan.warnings + warn_s + warn_t, [q_ns, q_nt]
    collisions, collided = [], []
    for db, rel, side, own, other in ((source, plan.source_rel, "source", st, tt), (target, plan.target_rel, "target", tt, st)):
        found, total, q = _collisions(db, rel, key_columns, side, own, other, case_insensitive_keys)
        collisions += found
        collided.append(total)
        warnings += [_collision_warning(c) for c in found]
        if q:
            queries.append(q)
    if buckets is None:
        want = max(n_s, n_t) / 16
        buckets = 1 << max(10, min(20, round(max(want, 1)).bit_length()))
    ci = case_insensitive_keys
    hs = _hashes(source, key_columns, compare_columns, native, st, tt, ci)
    ht = _hashes(target, key_columns, compare_columns, native, tt, st, ci)
    qs, qt = _bucket_sql(source, plan.source_rel, hs, buckets), _bucket_sql(target, plan.target_rel, ht, buckets)
    queries += [qs, qt]
    local, fetched = LocalDuckDB(), _Fetched()
    try:
        for name, db, q in (("dw_bs", source, qs), ("dw_bt", target, qt)):
            # one Arrow table registered and copied once (LocalDuckDB.load inserts batch by batch,
            # 1.5 s slower at 1M buckets, and matches column names by case; Snowflake's are upper case)
            batches = fetched.batches(db, q)
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
        local.execute("CREATE TABLE dw_d AS SELECT COALESCE(s.dw_b, t.dw_b) AS dw_b, "
                      "COALESCE(s.dw_n, 0) + COALESCE(t.dw_n, 0) AS dw_n, "
                      "s.dw_n IS DISTINCT FROM t.dw_n OR s.dw_sum IS DISTINCT FROM t.dw_sum AS dw_diff "
                      "FROM dw_bs s FULL OUTER JOIN dw_bt t ON s.dw_b = t.dw_b")
        (n_diff, diff_rows, all_rows_n), = local.fetch_all(
            "SELECT COUNT(*) FILTER (WHERE dw_diff), COALESCE(SUM(dw_n) FILTER (WHERE dw_diff), 0), "
            "COALESCE(SUM(dw_n), 0) FROM dw_d")
        result = RowDiffResult(queries=queries, warnings=warnings, buckets_compared=buckets,
                               buckets_downloaded=int(n_diff), rows_downloaded=0, download_passes=0, collisions=collisions,
                               collided_source=collided[0], collided_target=collided[1],
                               timestamp_rule=timestamp_rule(timestamp_precision, timestamp_rounding))
        (in_s, in_t), = local.fetch_all("SELECT (SELECT COALESCE(SUM(dw_n), 0) FROM dw_bs), (SELECT COALESCE(SUM(dw_n), 0) FROM dw_bt)")
        result.unstable = [f"{side} {table} changed while read: {n:,} rows counted, {b:,} hashed"
                           for side, table, n, b in (("source", source_table, n_s, in_s), ("target", target_table, n_t, in_t))
                           if int(n) != int(b)]
        if n_diff:
            all_rows = n_diff > buckets // 2
            size = int(all_rows_n if all_rows else diff_rows)
            if size > max_download_rows:
                raise DatabaseError(f"{n_diff} differing buckets hold {size} rows, over max_download_rows={max_download_rows}")
            _download_passes(result, local, fetched, source, target, plan, hs, ht, buckets, all_rows, pass_rows, opts,
                             sample_limit)
    finally:
        local.con.close()
    result.bytes_fetched = fetched.bytes
    result.bytes_sent = sum(len(q.encode()) for q in result.queries)
    return _relabel(result, plan.labels)


def _download_passes(result: RowDiffResult, local, fetched: _Fetched, source: Database, target: Database, plan,
                     hs: _Hashes, ht: _Hashes, buckets: int, all_rows: bool, pass_rows: int, opts, sample_limit: int) -> None:
    """Step 3 in passes of about ``pass_rows`` rows (both sides together; a pass holds at least
    one bucket): the wanted buckets (the differing ones, or all when more than half differ), in
    bucket order, are cut where their running row count crosses a multiple of ``pass_rows``;
    each pass downloads its buckets' rows from both sides, diffs them and is dropped before the
    next, so the rows held at once are bounded by ``pass_rows``, not by the table size. The bucket
    lists are built as text in the local DuckDB, never as Python lists."""
    import pyarrow as pa

    keys, columns, st, tt = plan.keys, plan.columns, plan.st, plan.tt
    local.execute(f"CREATE TABLE dw_p AS SELECT dw_b, CAST((SUM(dw_n) OVER (ORDER BY dw_b ROWS BETWEEN UNBOUNDED PRECEDING "
                  f"AND CURRENT ROW) - dw_n) // {int(pass_rows)} AS BIGINT) AS dw_pass FROM dw_d "
                  f"{'' if all_rows else 'WHERE dw_diff'}")
    passes = local.fetch_all("SELECT dw_pass, MIN(dw_b), MAX(dw_b) FROM dw_p GROUP BY dw_pass ORDER BY dw_pass")
    for number, low, high in passes:
        if all_rows:
            wanted = None if len(passes) == 1 else (int(low), int(high))
        else:
            (wanted,), = local.fetch_all(f"SELECT STRING_AGG(CAST(dw_b AS VARCHAR), ',' ORDER BY dw_b) FROM dw_p "
                                         f"WHERE dw_pass = {int(number)}")
        downloaded = []
        for db, rel, h in ((source, plan.source_rel, hs), (target, plan.target_rel, ht)):
            q = _download_sql(db, rel, h, keys, columns, buckets, wanted)
            result.queries.append(q)
            downloaded.append(fetched.batches(db, q))
        schema = next((bs[0].schema for bs in downloaded if bs), None)  # an empty side borrows the other's
        if schema is None:
            continue
        for name, batches in zip(("dw_s", "dw_t"), downloaded):
            tbl = pa.Table.from_batches(batches) if batches else schema.empty_table()
            local.con.register(name, tbl)
            result.rows_downloaded += tbl.num_rows
        del downloaded, tbl
        part, _ = _diff_typed(local, "dw_s", "dw_t", keys, columns, st, tt, opts, sample_limit)
        for name in ("dw_s", "dw_t"):
            local.con.unregister(name)
        _merge(result, part, sample_limit)
        result.download_passes += 1
