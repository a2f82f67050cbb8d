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

import os
import tempfile
import time
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
    native_hash_parts,
)
from dw_dagster.checks.rowdiff.stream import STREAM_PASS_ROWS, TRANSFERS
from dw_dagster.checks.rowdiff.rules import RowDiffResult, _key_expr, _options, _plan, _relabel, _utc, timestamp_rule
from dw_dagster.databases import Database, DatabaseError, LocalDuckDB, sql
from dw_dagster.dagster_private import public


#: rows (both sides) the bisect path downloads and diffs per pass by default (held in Python and the local DuckDB)
DOWNLOAD_PASS_ROWS = 2_000_000


def _row_string(exprs: Sequence[str]) -> str:
    """Per expression: 'N' for NULL, else 'V' + length + ':' + text; joined with '|' (DuckDB dialect)."""
    parts = []
    for e in exprs:
        v = f"CAST({e} AS VARCHAR)"
        parts.append(f"(CASE WHEN {v} IS NULL THEN 'N' ELSE 'V' || CAST(LENGTH({v}) AS VARCHAR) || ':' || {v} END)")
    return " || '|' || ".join(parts)


def _md5_hex_sql(dialect: str, duck_expr: str) -> str:
    """The md5 hex digest of ``duck_expr`` (DuckDB SQL, transpiled) in ``dialect``."""
    if dialect not in _MD5_HEX:
        raise NotImplementedError(f"no md5 for dialect {dialect!r}; supported: {sorted(_MD5_HEX)}")
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
        cols = [p for c in columns for p in native_hash_parts(_utc(q(c), own.get(c)), own.get(c))]
        row = [*keys, *cols]
        # the bucket takes bits 20 and up of the key's hash: DuckDB's own hash join on the key (the
        # local diff of a pass) picks its slots from the low bits of the same hash, so bucketing by
        # those bits packed a pass's rows (a narrow range of buckets) into 1 % of the slots: a 100k-row
        # join took 11 s instead of 0.03 s
        return _Hashes(f"(hash({', '.join(keys)}) >> 20)", f"(hash({', '.join(row)}) >> 16)", "{h}")
    if db.dialect not in _HEX48:
        raise NotImplementedError(f"no 48-bit row hash for dialect {db.dialect!r}; supported: {sorted(_HEX48)}")
    return _Hashes(_md5_hex_sql(db.dialect, _row_string(keys)), _md5_hex_sql(db.dialect, _row_string(row)), _HEX48[db.dialect])


def _from(db: Database, rel: str) -> str:
    return sqlglot.transpile(f"SELECT 1 FROM {rel} AS dw_x", read="duckdb", write=db.dialect)[0][len("SELECT 1 FROM "):]


def _bucket_sql(db: Database, table: str, h: _Hashes, buckets: int) -> str:
    total = "SUM(CAST(dw_h AS DECIMAL(38, 0)))" if db.dialect == "bigquery" else "SUM(dw_h)"
    key, row = h.to_int.format(h="dw_kx"), h.to_int.format(h="dw_rx")
    return (f"SELECT dw_b, COUNT(*) AS dw_n, CAST({total} AS VARCHAR) AS dw_sum FROM (SELECT MOD({key}, {buckets}) AS dw_b, "
            f"{row} AS dw_h FROM (SELECT {h.key} AS dw_kx, {h.row} AS dw_rx FROM {_from(db, table)}) AS i) AS x GROUP BY dw_b")


def _bucket_filter(db: Database, key_h: str, buckets: int, wanted: str) -> str:
    """``WHERE`` condition selecting the rows of the ``wanted`` buckets (a comma-separated list
    of bucket numbers).

    On DuckDB the bucket list travels as one string literal split into a semi-join
    (``IN (SELECT UNNEST(STRING_SPLIT(...)))``): a list of 100,000 numbers as separate SQL tokens
    took 1.25 s to parse and bind per side at 10M rows, the literal 0.2 s for the whole query.
    Other engines get a plain ``IN`` list.
    """
    if any(c not in "0123456789," for c in wanted):
        raise ValueError(f"a bucket list holds only numbers and commas, got {wanted[:40]!r}")
    if db.dialect == "duckdb":
        return f"MOD({key_h}, {buckets}) IN (SELECT CAST(UNNEST(STRING_SPLIT('{wanted}', ',')) AS BIGINT))"
    return f"MOD({key_h}, {buckets}) IN ({wanted})"


def _download_sql(db: Database, table: str, h: _Hashes, key_columns: Sequence[str], columns: Sequence[str],
                  buckets: int, wanted: str | None, with_bucket: bool = False) -> str:
    """The rows of the ``wanted`` buckets (all rows when None); with ``with_bucket`` each row's
    bucket number comes last (``dw_b``), for splitting the rows into passes."""
    exprs = ", ".join(sql.identifier(c).sql("duckdb") for c in [*key_columns, *columns])
    names = sqlglot.transpile(f"SELECT {exprs}", read="duckdb", write=db.dialect)[0][len("SELECT "):]
    if wanted is None and not with_bucket:
        return f"SELECT {names} FROM {_from(db, table)}"
    bucket = f"MOD({h.to_int.format(h='dw_kx')}, {buckets})"
    where = "" if wanted is None else f" WHERE {_bucket_filter(db, h.to_int.format(h='dw_kx'), buckets, wanted)}"
    extra = f", CAST({bucket} AS BIGINT) AS dw_b" if with_bucket else ""
    return f"SELECT {names}{extra} FROM (SELECT {names}, {h.key} AS dw_kx FROM {_from(db, table)}) AS i{where}"


class _Fetched:
    """What the diff fetched from the two databases: ``bytes`` is the Arrow buffer size
    (``RecordBatch.nbytes``) of every result set fetched as Arrow (the bucket checksums and the
    downloaded rows)."""

    def __init__(self) -> None:
        self.bytes = 0

    def stream(self, db: Database, query: str):
        for batch in db.fetch_batches(query):
            self.bytes += batch.nbytes
            yield batch

    def batches(self, db: Database, query: str) -> list:
        return list(self.stream(db, query))


def _sort_key(entry) -> tuple:
    """Key order of the single-pass diff (NULLs first) for merging the passes' samples."""
    return tuple((v is not None, v) for v in entry.key)


def _merge(result: RowDiffResult, part: RowDiffResult, sample_limit: int) -> None:
    """Add one download pass's diff to ``result``. A key lands in one pass (passes split by
    bucket), so the counts add up; the samples are gathered and cut back to the first
    ``sample_limit`` keys in key order whenever they pass twice that (so at most 2 ×
    ``sample_limit`` entries are held, and each is sorted a few times, not once per pass)."""
    for f in ("missing", "extra", "changed", "duplicated_source", "duplicated_target"):
        setattr(result, f, getattr(result, f) + getattr(part, f))
    for c, n in part.changed_columns.items():
        result.changed_columns[c] = result.changed_columns.get(c, 0) + n
    result.sample += part.sample
    # a pass's NULL-key counts are its share's: the whole table's were counted before the passes
    result.warnings += [w for w in part.warnings if w not in result.warnings and "NULL(s) on the" not in w]
    if len(result.sample) > 2 * sample_limit:
        result.sample = sorted(result.sample, key=_sort_key)[:sample_limit]


@public
def row_diff_across(source: Database, target: Database, source_table: str, target_table: str,
                    key_columns: Sequence[str], compare_columns: Sequence[str] | None = None, *,
                    rel_tolerance: float = 1e-9, abs_tolerance: float = 1e-12, timestamp_precision: str | None = None,
                    timestamp_rounding: str = "tolerate", case_insensitive_keys: bool = False,
                    trim_trailing_blanks: bool = False, source_char_columns: Sequence[str] | None = None,
                    target_char_columns: Sequence[str] | None = None, buckets: int | None = None,
                    max_download_rows: int = 20_000_000, sample_limit: int = 100, portable: bool = False,
                    pass_rows: int | None = None, sample: tuple[int, int] | None = None, transfer: str = "auto",
                    stream_min_mbps: float | None = None) -> RowDiffResult:
    """Diff two tables in different databases: by bucketed checksums (see the module docstring), or
    by streaming every row once into a local DuckDB (:mod:`.stream`), as ``transfer`` says.

    ``transfer="bisect"`` runs the steps below; ``"stream"`` reads each side's rows once (a
    PostgreSQL side with a binary ``COPY``) and runs the same typed comparison locally, in passes
    of about ``pass_rows`` rows; ``"auto"`` (the default) streams when a side is PostgreSQL, both
    sides can be streamed, the catalogs estimate :data:`~.stream.STREAM_MIN_ROWS` rows or more to
    compare and a probe of the PostgreSQL side's stream is fast enough (``stream_min_mbps``, or by
    default against the source's own time to hash the same rows: a LAN), and bisects otherwise (a WAN, another engine, a column type the stream does not
    read). The result's ``transfer`` names the path that ran and ``bytes_fetched`` the bytes moved.

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
            local join over them). Default: :data:`DOWNLOAD_PASS_ROWS` for the bisect path's
            download, :data:`~.stream.STREAM_PASS_ROWS` for the stream, whose rows are in the local
            DuckDB already (it spills beyond its memory limit): each pass reads both tables again.
        transfer: ``"auto"``, ``"stream"`` or ``"bisect"`` (above).
        stream_min_mbps: with ``"auto"``, the probe's rate at or above which the stream runs; None (the
            default) compares the probe's seconds with the source's own time to hash the same rows
            for the bisect path: the stream runs unless it took more than twice that (the bisect
            path reads the source at least twice).
        sample: ``(k, n)``: compare only the keys in buckets ``0 .. k-1`` of ``n`` (``MOD(ABS(key),
            n) < k`` on the first key column, which must be an integer on both sides; pushed down,
            so both sides read the same keys; rows whose first key is NULL are always compared);
            None compares every key. The result's warnings
            say what share was compared.

    A side whose engine has no row hash in SQL (Informix: no MD5 built in) cannot be checksummed
    in its database: both sides' rows (of the sample, when given) are downloaded and diffed
    locally in one pass, refused above ``max_download_rows``.

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
        ValueError: ``pass_rows`` is below 1, or an unknown ``transfer``.
        StreamUnavailable: ``transfer="stream"`` and a side cannot be streamed (its engine, a column type).
        CatalogError: a configured column name matches two columns differing only in case.
    """
    import pyarrow as pa

    if pass_rows is not None and pass_rows < 1:
        raise ValueError(f"pass_rows must be at least 1, got {pass_rows}")
    if transfer not in TRANSFERS:
        raise ValueError(f"transfer must be one of {', '.join(TRANSFERS)}, got {transfer!r}")
    native = source.dialect == target.dialect == "duckdb" and not portable
    opts = _options(rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys, timestamp_rounding)
    plan = _plan(source, target, source_table, target_table, key_columns, compare_columns, trim_trailing_blanks,
                 source_char_columns, target_char_columns)
    sample_note = None
    if sample is not None:
        plan, sample_note = _sampled(plan, sample)
    key_columns, compare_columns, st, tt = plan.keys, plan.columns, plan.st, plan.tt
    if transfer != "bisect":
        share = 1.0 if sample is None else sample[0] / sample[1]
        tables = {"source": (source, source_table), "target": (target, target_table)}
        streamed, probe = _stream(source, target, plan, opts, transfer, stream_min_mbps, sample_limit,
                                  pass_rows or STREAM_PASS_ROWS,
                                  timestamp_precision, timestamp_rounding,
                                  plan.warnings + ([sample_note] if sample_note else []), tables, share)
        if streamed is not None:
            return _relabel(streamed, plan.labels)
    else:
        probe = None
    n_s, warn_s, q_ns = _counts_and_null_keys(source, plan.source_rel, key_columns, "source", plan.labels)
    n_t, warn_t, q_nt = _counts_and_null_keys(target, plan.target_rel, key_columns, "target", plan.labels)
    warnings, queries = plan.warnings + warn_s + warn_t + ([sample_note] if sample_note else []), [q_ns, q_nt]
    if not (_hashable(source) and _hashable(target)):
        return _download_all(source, target, plan, n_s, n_t, warnings, queries, opts, sample_limit, max_download_rows,
                             timestamp_precision, timestamp_rounding)
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
        result = RowDiffResult(queries=queries, warnings=warnings, buckets_compared=buckets, transfer="bisect",
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
            _download_passes(result, local, fetched, source, target, plan, hs, ht, buckets, all_rows,
                             pass_rows or DOWNLOAD_PASS_ROWS, opts,
                             sample_limit)
    finally:
        local.close()
    result.bytes_fetched = fetched.bytes
    result.bytes_sent = sum(len(q.encode()) for q in result.queries)
    result.transfer_probe_mbps = None if probe is None else round(probe, 1)
    return _relabel(result, plan.labels)


def _stream(source: Database, target: Database, plan, opts, transfer: str, min_mbps: float, sample_limit: int,
            pass_rows: int, timestamp_precision, timestamp_rounding, warnings: list[str], tables: dict,
            share: float) -> tuple[RowDiffResult | None, float | None]:
    """The streaming path's result, or None when ``auto`` chooses the bisect path (:mod:`.stream`), and
    the probe's MB/s when one ran."""
    from dw_dagster.checks.rowdiff import stream as st

    StreamUnavailable, probe_mbps, stream_diff, streamable = st.StreamUnavailable, st.probe_mbps, st.stream_diff, st.streamable
    mbps = None
    if transfer == "auto":
        if "postgres" not in (source.dialect, target.dialect) or streamable(source) or streamable(target):
            return None, None
        rows = max(st.estimated_rows(db, t) for db, t in tables.values()) * share
        if rows < st.STREAM_MIN_ROWS:  # a small read: the stream's fixed cost (a connection, a local engine) outweighs it
            return None, None
        try:
            remote = [(db, rel) for db, rel in ((source, plan.source_rel), (target, plan.target_rel)) if db.dialect == "postgres"]
            probes = [probe_mbps(db, rel) for db, rel in remote]
        except (StreamUnavailable, DatabaseError):
            return None, None
        mbps = min(p[0] for p in probes)
        if min_mbps is not None and mbps < min_mbps:
            return None, mbps
        if min_mbps is None:  # measured against the bisect path's own work: its hash of the same rows
            native = source.dialect == target.dialect == "duckdb"
            for (db, rel), (_, stream_s, rows) in zip(remote, probes):
                h = _hashes(db, plan.keys, plan.columns, native, plan.st if db is source else plan.tt,
                            plan.tt if db is source else plan.st, opts.case_insensitive_keys)
                q = _bucket_sql(db, f"(SELECT * FROM {rel} AS dw_l LIMIT {int(rows)})", h, 1024)
                # the bisect path reads the source at least twice (counts, bucket sums) and hashes it once
                if stream_s > 2 * st.probe_hash_s(db, lambda db=db, q=q: db.fetch_all(q)):
                    return None, mbps
    try:
        result = stream_diff(source, target, plan, opts, sample_limit=sample_limit, pass_rows=pass_rows,
                             timestamp_precision=timestamp_precision, timestamp_rounding=timestamp_rounding,
                             warnings=warnings, merge=_merge)
    except StreamUnavailable:
        if transfer == "stream":
            raise
        return None, mbps
    result.transfer_probe_mbps = None if mbps is None else round(mbps, 1)
    return result, mbps


def _hashable(db: Database) -> bool:
    """Whether the engine computes the 48-bit row hash in SQL (Informix has no MD5 built in)."""
    return db.dialect in _HEX48


def _sampled(plan, sample: tuple[int, int]):
    """The plan reading only the keys in buckets ``0 .. k-1`` of ``n`` of its first (integer) key column.

    Raises:
        ValueError: a sample that is not ``0 < k <= n``, or a first key column that is not an integer on both sides.
    """
    from dw_dagster.checks.rowdiff.rules import _is

    k, n = (int(v) for v in sample)
    if not 0 < k <= n:
        raise ValueError(f"a sample is k of n buckets with 0 < k <= n, got {k} of {n}")
    key = plan.keys[0]
    ints = ("TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT", "INT2", "INT4", "INT8", "INT64", "SERIAL")
    if not (_is(ints, plan.st.get(key)) and _is(ints, plan.tt.get(key))):
        raise ValueError(f"sampling by key buckets needs an integer first key column; {plan.labels.get(key, key)} is "
                         f"{plan.st.get(key)} / {plan.tt.get(key)}")
    cond = f"(MOD(ABS({key}), {n}) < {k} OR {key} IS NULL)"  # rows with a NULL key are always in the sample
    wrap = lambda rel: f"(SELECT * FROM {rel} AS dw_r WHERE {cond})"  # noqa: E731
    note = (f"sampled: keys with {plan.labels.get(key, key)} mod {n} below {k} ({k / n:.1%} of the key space) were "
            "compared; the counts cover the sample only")
    return plan._replace(source_rel=wrap(plan.source_rel), target_rel=wrap(plan.target_rel)), note


def _download_all(source: Database, target: Database, plan, n_s: int, n_t: int, warnings: list[str], queries: list[str],
                  opts, sample_limit: int, max_download_rows: int, timestamp_precision, timestamp_rounding) -> RowDiffResult:
    """Both sides' rows downloaded and diffed locally in one pass (an engine without a row hash)."""
    if n_s + n_t > max_download_rows:
        raise DatabaseError(f"{n_s + n_t} rows to download (no row hash on {source.dialect if not _hashable(source) else target.dialect}) "
                            f"exceed max_download_rows={max_download_rows}; compare a sample (sample=(k, n))")
    result = RowDiffResult(queries=queries, warnings=warnings + ["no row hash in SQL on one side: every row compared "
                                                                 "was downloaded"],
                           buckets_compared=0, buckets_downloaded=0, rows_downloaded=0, download_passes=0,
                           transfer="download", timestamp_rule=timestamp_rule(timestamp_precision, timestamp_rounding))
    local, fetched = LocalDuckDB(), _Fetched()
    try:
        downloaded = []
        for db, rel in ((source, plan.source_rel), (target, plan.target_rel)):
            names = ", ".join([*plan.keys, *plan.columns])
            q = sqlglot.transpile(f"SELECT {names} FROM {rel} AS dw_x", read="duckdb", write=db.dialect)[0]
            result.queries.append(q)
            downloaded.append(fetched.batches(db, q))
        _diff_pass(result, local, downloaded, plan, opts, sample_limit)
    finally:
        local.close()
    result.bytes_fetched = fetched.bytes
    result.bytes_sent = sum(len(q.encode()) for q in result.queries)
    return _relabel(result, plan.labels)


def _download_passes(result: RowDiffResult, local: LocalDuckDB, fetched: _Fetched, source: Database, target: Database,
                     plan, hs: _Hashes, ht: _Hashes, buckets: int, all_rows: bool, pass_rows: int, opts,
                     sample_limit: int) -> None:
    """Step 3 in passes of about ``pass_rows`` rows (both sides together; a pass holds at least
    one bucket). The wanted buckets (the differing ones, or all when more than half differ), in
    bucket order, are cut where their running row count crosses a multiple of ``pass_rows``.
    One pass: the rows are downloaded and diffed in memory. Several: each side is read once,
    with each row's bucket, and its rows are written, batch by batch, to one Arrow IPC file per
    pass in a temporary directory (``tempfile``'s, ``TMPDIR``); then each pass's two files are
    read back, diffed and dropped. So the rows held at once are bounded by ``pass_rows`` (plus one
    fetched batch), not by the table, and each table is read once whatever the passes. The
    bucket lists are built as text in the local DuckDB, never as Python lists."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    keys, columns = plan.keys, plan.columns
    local.execute(f"CREATE TABLE dw_p AS SELECT dw_b, CAST((SUM(dw_n) OVER (ORDER BY dw_b ROWS BETWEEN UNBOUNDED PRECEDING "
                  f"AND CURRENT ROW) - dw_n) // {int(pass_rows)} AS BIGINT) AS dw_pass FROM dw_d "
                  f"{'' if all_rows else 'WHERE dw_diff'}")
    lows = [int(r[0]) for r in local.fetch_all("SELECT MIN(dw_b) FROM dw_p GROUP BY dw_pass ORDER BY 1")]
    wanted = None if all_rows else local.fetch_all("SELECT STRING_AGG(CAST(dw_b AS VARCHAR), ',' ORDER BY dw_b) FROM dw_p")[0][0]
    sides = ((source, plan.source_rel, hs), (target, plan.target_rel, ht))
    if len(lows) == 1:
        downloaded = []
        for db, rel, h in sides:
            q = _download_sql(db, rel, h, keys, columns, buckets, wanted)
            result.queries.append(q)
            downloaded.append(fetched.batches(db, q))
        _diff_pass(result, local, downloaded, plan, opts, sample_limit)
        return
    starts = np.asarray(lows, dtype=np.int64)
    with tempfile.TemporaryDirectory(prefix="dw_rowdiff_") as tmp:
        files: list[dict[int, str]] = []
        for side, (db, rel, h) in enumerate(sides):
            q = _download_sql(db, rel, h, keys, columns, buckets, wanted, with_bucket=True)
            result.queries.append(q)
            writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
            try:
                for batch in fetched.stream(db, q):
                    if not batch.num_rows:
                        continue
                    bucket = pc.cast(batch.column(batch.num_columns - 1), pa.int64()).to_numpy(zero_copy_only=False)
                    part = np.maximum(np.searchsorted(starts, bucket, side="right") - 1, 0)  # (a bucket read after the sums: pass 0)
                    order = np.argsort(part, kind="stable")
                    part = part[order]
                    rows = batch.select(list(range(batch.num_columns - 1))).take(pa.array(order))
                    cuts = [0, *(np.flatnonzero(np.diff(part)) + 1).tolist(), len(part)]
                    for lo, hi in zip(cuts, cuts[1:]):
                        k = int(part[lo])
                        if k not in writers:
                            writers[k] = pa.ipc.new_file(f"{tmp}/{side}_{k}.arrow", rows.schema)
                        writers[k].write_batch(rows.slice(lo, hi - lo))
            finally:
                for w in writers.values():
                    w.close()
            files.append({k: f"{tmp}/{side}_{k}.arrow" for k in writers})
        for k in range(len(lows)):
            downloaded = []
            for side_files in files:
                path = side_files.get(k)
                downloaded.append(pa.ipc.open_file(path).read_all().to_batches() if path else [])
                if path:
                    os.remove(path)
            _diff_pass(result, local, downloaded, plan, opts, sample_limit)
    result.sample = sorted(result.sample, key=_sort_key)[:sample_limit]


def _diff_pass(result: RowDiffResult, local: LocalDuckDB, downloaded: list[list], plan, opts, sample_limit: int) -> None:
    """Diff one pass's rows (``downloaded``: the source's and the target's Arrow batches) in the
    local DuckDB by the typed rules, and add it to ``result``."""
    import pyarrow as pa

    schema = next((bs[0].schema for bs in downloaded if bs), None)  # an empty side borrows the other's
    if schema is None:
        return
    for name, batches in zip(("dw_s", "dw_t"), downloaded):
        tbl = pa.Table.from_batches(batches) if batches else schema.empty_table()
        local.con.register(name, tbl)
        result.rows_downloaded += tbl.num_rows
    del downloaded[:], tbl
    try:
        part, _ = _diff_typed(local, "dw_s", "dw_t", plan.keys, plan.columns, plan.st, plan.tt, opts, sample_limit)
    finally:
        for name in ("dw_s", "dw_t"):
            local.con.unregister(name)
    _merge(result, part, sample_limit)
    result.download_passes += 1
