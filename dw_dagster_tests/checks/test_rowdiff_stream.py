"""The streaming path of the cross-database diff (issue 32, item 2) on the PostgreSQL server on
loopback against DuckDB: the same answer as the hash-and-bisect path, key for key, on changed,
missing, extra and duplicated rows, NULL keys and NULL values, numeric (with and without a typmod),
timestamptz, unicode text and bytea; in one pass and in several; which path ran and the bytes moved
reported for both; ``auto`` choosing by the measured stream rate; a type the stream cannot read
refused by ``stream`` and left to the bisect path by ``auto``."""

import re

import pytest

from dw_dagster.checks.rowdiff import row_diff_across
from dw_dagster.checks.rowdiff.stream import StreamUnavailable
from dw_dagster.databases import DuckDBDatabase


_COLS = ("(id BIGINT, amount NUMERIC(12, 3), ratio NUMERIC, ts TIMESTAMPTZ, label TEXT, payload BYTEA, "
         "score DOUBLE PRECISION, day DATE, ok BOOLEAN)")
_DUCK_COLS = ("(id BIGINT, amount DECIMAL(12, 3), ratio DECIMAL(20, 6), ts TIMESTAMPTZ, label VARCHAR, payload BLOB, "
              "score DOUBLE, day DATE, ok BOOLEAN)")
# both sides: rows 1..6 equal (NULLs in every column of row 5, a NULL key in one row each side)
_SAME = ["(1, 1.500, 0.25, '2024-03-10 01:30:00+00', 'plain', '\\x00ff', 1.5, '2024-03-10', TRUE)",
         "(2, -0.001, 12345.678901, '2024-11-03 05:59:59.999999+00', 'Zürich ✓ 東京', '\\x', 0.1, '1999-12-31', FALSE)",
         "(3, 999999999.999, 0, '1970-01-01 00:00:00+00', '', NULL, -0.0, '2000-01-01', NULL)",
         "(5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
         "(NULL, 7.000, 1, '2030-01-01 00:00:00+00', 'null key', '\\x01', 2.0, '2030-01-01', TRUE)"]
# source only: 10 (missing); changed in the target: 2's label (unicode), 3's payload, 4's timestamp and amount;
# 6 duplicated in the target; 11 only in the target (extra)
_SOURCE = _SAME + ["(4, 2.000, 3.5, '2024-06-01 12:00:00+00', 'x', '\\xdeadbeef', 3.0, '2024-06-01', TRUE)",
                   "(6, 1.000, 1, '2024-01-01 00:00:00+00', 'dup', NULL, 1.0, '2024-01-01', TRUE)",
                   "(10, 1.000, 1, '2024-01-01 00:00:00+00', 'gone', NULL, 1.0, '2024-01-01', TRUE)"]
_TARGET = [r.replace("'Zürich ✓ 東京'", "'Zurich ✓ 東京'").replace("'', NULL, -0.0", "'', '\\x00', -0.0") for r in _SAME] + [
    "(4, 2.001, 3.5, '2024-06-01 12:00:01+00', 'x', '\\xdeadbeef', 3.0, '2024-06-01', TRUE)",
    "(6, 1.000, 1, '2024-01-01 00:00:00+00', 'dup', NULL, 1.0, '2024-01-01', TRUE)",
    "(6, 1.000, 1, '2024-01-01 00:00:00+00', 'dup', NULL, 1.0, '2024-01-01', TRUE)",
    "(11, 1.000, 1, '2024-01-01 00:00:00+00', 'new', NULL, 1.0, '2024-01-01', TRUE)"]


def _answer(r):
    return (r.missing, r.extra, r.changed, r.duplicated_source, r.duplicated_target, dict(r.changed_columns),
            sorted((str(e.key), e.status, e.columns, e.source_rows, e.target_rows) for e in r.sample), sorted(r.warnings))


@pytest.fixture
def tables(tmp_path, postgres, pg_schema):
    postgres.execute(f"CREATE TABLE {pg_schema}.t {_COLS}; INSERT INTO {pg_schema}.t VALUES {', '.join(_SOURCE)}")
    duck = DuckDBDatabase(tmp_path / "w.duckdb")
    rows = ", ".join(re.sub(r"'\\x[0-9a-f]*'", "NULL", r) for r in _TARGET)  # bytea set by _bytea_target
    duck.execute(f"CREATE TABLE t {_DUCK_COLS}; INSERT INTO t VALUES {rows}")
    _bytea_target(duck)
    return postgres, duck, f"{pg_schema}.t"


def _bytea_target(duck):
    """The target's bytea values as the source holds them (DuckDB reads '\\x00ff' as text bytes)."""
    duck.execute("UPDATE t SET payload = CASE id WHEN 1 THEN from_hex('00ff') WHEN 2 THEN from_hex('') "
                 "WHEN 3 THEN from_hex('00') WHEN 4 THEN from_hex('deadbeef') ELSE NULL END")
    duck.execute("UPDATE t SET payload = from_hex('01') WHERE id IS NULL")


def test_stream_and_bisect_give_the_same_answer(tables):
    pg, duck, src = tables
    bisect = row_diff_across(pg, duck, src, "t", ["id"], transfer="bisect")
    stream = row_diff_across(pg, duck, src, "t", ["id"], transfer="stream")
    several = row_diff_across(pg, duck, src, "t", ["id"], transfer="stream", pass_rows=3)
    assert (bisect.transfer, stream.transfer, several.transfer) == ("bisect", "stream", "stream")
    assert _answer(stream) == _answer(bisect) == _answer(several)
    # worked by hand: 10 missing; 11 extra; 2 (label), 3 (payload), 4 (amount, ts) changed; 6 twice in the target
    assert (stream.missing, stream.extra, stream.changed, stream.duplicated_target) == (1, 1, 3, 1)
    assert stream.changed_columns == {"label": 1, "payload": 1, "amount": 1, "ts": 1}
    assert (stream.download_passes, several.download_passes) == (1, 6)  # 17 rows, 3 a pass
    # only PostgreSQL's rows travel: the DuckDB target is diffed where it is, beside the streamed rows
    assert stream.rows_downloaded == len(_SOURCE) and stream.bytes_fetched > 0 and bisect.bytes_fetched > 0
    assert len(stream.queries) == 1 and stream.queries[0].startswith("COPY (SELECT")
    assert "TO STDOUT (FORMAT binary)" in stream.queries[0]
    assert 'CAST(dwcol0 AS TEXT)' in stream.queries[0]  # numeric sent as the server's text (the driver's decode is slow)
    # the other way round: DuckDB the source, PostgreSQL the target
    back_b = row_diff_across(duck, pg, "t", src, ["id"], transfer="bisect")
    back_s = row_diff_across(duck, pg, "t", src, ["id"], transfer="stream")
    assert back_s.transfer == "stream" and _answer(back_s) == _answer(back_b)
    assert (back_s.missing, back_s.extra, back_s.changed) == (1, 1, 3)


def test_stream_reads_a_sample_and_compare_columns_like_bisect(tables):
    pg, duck, src = tables
    for kw in ({"compare_columns": ["amount", "label"]}, {"sample": (1, 2)}, {"case_insensitive_keys": False,
                                                                             "timestamp_precision": "second"}):
        b = row_diff_across(pg, duck, src, "t", ["id"], transfer="bisect", **kw)
        s = row_diff_across(pg, duck, src, "t", ["id"], transfer="stream", **kw)
        assert _answer(s) == _answer(b), kw


def test_auto_chooses_by_the_measured_rate(tables, monkeypatch):
    from dw_dagster.checks.rowdiff import stream

    pg, duck, src = tables
    pg.execute(f"ANALYZE {src}")
    small = row_diff_across(pg, duck, src, "t", ["id"], stream_min_mbps=0.0)  # a few rows: no probe, bisect
    assert small.transfer == "bisect" and small.transfer_probe_mbps is None
    monkeypatch.setattr(stream, "STREAM_MIN_ROWS", 0)  # as if the tables were large
    fast = row_diff_across(pg, duck, src, "t", ["id"], stream_min_mbps=0.0)
    assert fast.transfer == "stream" and fast.transfer_probe_mbps is not None
    slow = row_diff_across(pg, duck, src, "t", ["id"], stream_min_mbps=1e9)  # a link slower than asked: bisect
    assert slow.transfer == "bisect" and slow.transfer_probe_mbps is not None
    assert _answer(fast) == _answer(slow)
    both_duck = row_diff_across(duck, duck, "t", "t", ["id"])  # no PostgreSQL side: DuckDB's native hashes
    assert both_duck.transfer == "bisect" and both_duck.transfer_probe_mbps is None


def test_a_type_the_stream_cannot_read(tmp_path, postgres, pg_schema, monkeypatch):
    from dw_dagster.checks.rowdiff import stream

    monkeypatch.setattr(stream, "STREAM_MIN_ROWS", 0)
    postgres.execute(f"CREATE TABLE {pg_schema}.j (id INT, doc JSONB); INSERT INTO {pg_schema}.j VALUES (1, '{{\"a\": 1}}')")
    duck = DuckDBDatabase(tmp_path / "j.duckdb")
    duck.execute("CREATE TABLE j (id INT, doc JSON); INSERT INTO j VALUES (1, '{\"a\": 1}')")
    with pytest.raises(StreamUnavailable, match="jsonb"):
        row_diff_across(postgres, duck, f"{pg_schema}.j", "j", ["id"], transfer="stream")
    r = row_diff_across(postgres, duck, f"{pg_schema}.j", "j", ["id"], stream_min_mbps=0.0)
    assert r.transfer == "bisect" and r.identical
    # a numeric NaN has no DuckDB decimal: refused by the stream, never compared wrongly
    postgres.execute(f"CREATE TABLE {pg_schema}.n (id INT, v NUMERIC(10, 2)); INSERT INTO {pg_schema}.n VALUES (1, 'NaN')")
    duck.execute("CREATE TABLE n (id INT, v DOUBLE); INSERT INTO n VALUES (1, 'NaN')")
    with pytest.raises(StreamUnavailable, match="cannot hold locally"):
        row_diff_across(postgres, duck, f"{pg_schema}.n", "n", ["id"], transfer="stream")
    with pytest.raises(ValueError, match="transfer must be one of"):
        row_diff_across(postgres, duck, f"{pg_schema}.j", "j", ["id"], transfer="fast")


def test_docs_snippet_row_diff_transfer(tmp_path, monkeypatch, postgres, capsys):
    """docs/snippets/checks/row_diff_transfer.py: both paths run against a PostgreSQL schema and a DuckDB copy."""
    import runpy
    from pathlib import Path

    from dw_dagster_tests.conftest import POSTGRES_URL

    postgres.execute("DROP SCHEMA IF EXISTS sales_src CASCADE; CREATE SCHEMA sales_src; CREATE TABLE sales_src.orders "
                     "(order_id INT, total NUMERIC(10, 2)); INSERT INTO sales_src.orders VALUES (1, 9.99), (2, 5.00), (3, 1.00)")
    try:
        duck = DuckDBDatabase(tmp_path / "warehouse.duckdb")
        duck.execute("CREATE SCHEMA sales_src; CREATE TABLE sales_src.orders (order_id INT, total DECIMAL(10, 2)); "
                     "INSERT INTO sales_src.orders VALUES (1, 9.99), (2, 5.01), (4, 1.00)")
        monkeypatch.setenv("SHOP_PG_URL", POSTGRES_URL)
        monkeypatch.chdir(tmp_path)
        runpy.run_path(str(Path(__file__).resolve().parents[2] / "docs" / "snippets" / "checks" / "row_diff_transfer.py"))
    finally:
        postgres.execute("DROP SCHEMA sales_src CASCADE")
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == ["stream", "bisect"]
    assert all(ln.split()[2:] == ["1", "1", "1"] and int(ln.split()[1]) > 0 for ln in lines)


def test_auto_times_the_bisect_hash_once_per_probe(tables, monkeypatch):
    """The choice measured against the bisect path's hash of the probe's rows reuses that timing while the
    probe is reused (it hashed 50,000 rows on the source again for every diff: 0.3 s each)."""
    from dw_dagster.checks.rowdiff import stream

    pg, duck, src = tables
    monkeypatch.setattr(stream, "STREAM_MIN_ROWS", 0)
    monkeypatch.setattr(stream, "_probed", {})
    monkeypatch.setattr(stream, "_hashed", {})
    monkeypatch.setattr(stream, "PROBE_BASE_ROWS", 1)  # the test's table is large enough for a kept probe
    sent = []
    real = pg.fetch_all
    monkeypatch.setattr(pg, "fetch_all", lambda q: sent.append(q) or real(q))
    first = row_diff_across(pg, duck, src, "t", ["id"])
    second = row_diff_across(pg, duck, src, "t", ["id"])
    assert first.transfer == second.transfer and _answer(first) == _answer(second)
    assert sum("dw_l LIMIT" in q for q in sent) == 1, [q[:80] for q in sent if "dw_l LIMIT" in q]
    monkeypatch.setattr(stream, "_probed", {})  # the probe expired: both are measured again
    row_diff_across(pg, duck, src, "t", ["id"])
    assert sum("dw_l LIMIT" in q for q in sent) == 2


def test_the_duckdb_side_is_left_as_it_was(tmp_path, postgres, pg_schema):
    """Diffed where it is, the DuckDB file keeps no trace (no attached database, table or view of the diff's),
    opens for writing at once; four diffs at once on the one file each keep their own streamed rows."""
    import concurrent.futures

    import duckdb

    postgres.execute(f"CREATE TABLE {pg_schema}.k (id INT, v TEXT); INSERT INTO {pg_schema}.k "
                     "SELECT g, 'v' || g FROM generate_series(1, 5000) g")
    path = tmp_path / "k.duckdb"
    duck = DuckDBDatabase(path, memory_limit="256MB")
    duck.execute("CREATE TABLE k AS SELECT range::INT AS id, 'v' || range AS v FROM range(2, 5002)")
    before = duck.fetch_all("SELECT database_name, schema_name, table_name FROM duckdb_tables() ORDER BY ALL")
    for passes in (None, 1000):  # one pass, and several (each pass a share of the keys)
        r = row_diff_across(postgres, duck, f"{pg_schema}.k", "k", ["id"], transfer="stream", pass_rows=passes)
        assert (r.missing, r.extra, r.changed) == (1, 1, 0) and r.rows_downloaded == 5000
    # four at once on the one file (a wave's pairs on a thread pool): one DuckDB instance, four diffs beside it
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        many = list(pool.map(lambda _: row_diff_across(postgres, duck, f"{pg_schema}.k", "k", ["id"], transfer="stream"),
                             range(4)))
    assert [(r.missing, r.extra) for r in many] == [(1, 1)] * 4
    assert duck.fetch_all("SELECT database_name, schema_name, table_name FROM duckdb_tables() ORDER BY ALL") == before
    assert duck.fetch_all("SELECT COUNT(*) FROM duckdb_views() WHERE NOT internal") == [(0,)]
    con = duckdb.connect(str(path))  # no lock left behind
    try:
        assert con.execute("SELECT COUNT(*) FROM k").fetchone() == (5000,)
        assert [d for (d,) in con.execute("SELECT database_name FROM duckdb_databases() WHERE NOT internal").fetchall()] == ["k"]
    finally:
        con.close()


def test_a_duckdb_table_named_with_its_catalog(tmp_path, postgres, pg_schema):
    """The DuckDB side is attached under its file's own catalog name, so a three-part name written as in the
    file (``warehouse.main.t``) resolves; a file whose stem is a reserved catalog name (``memory``) too."""
    postgres.execute(f"CREATE TABLE {pg_schema}.t (id INT, v TEXT); INSERT INTO {pg_schema}.t VALUES (1, 'a'), (2, 'b')")
    for stem, name in (("warehouse", "warehouse.main.t"), ("memory", "main.t")):
        duck = DuckDBDatabase(tmp_path / f"{stem}.duckdb")
        duck.execute("CREATE TABLE t (id INT, v TEXT); INSERT INTO t VALUES (1, 'a'), (2, 'c')")
        r = row_diff_across(postgres, duck, f"{pg_schema}.t", name, ["id"], transfer="stream")
        assert (r.transfer, r.rows_downloaded, r.changed, [e.key for e in r.sample]) == ("stream", 2, 1, [[2]]), stem
