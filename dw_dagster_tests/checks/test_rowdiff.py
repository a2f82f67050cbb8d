"""Row-level key diff: PUBLIC_CASES C01, C02, C03, C07 in one database and across two."""

import pytest

from dw_dagster.checks.rowdiff import row_diff
from dw_dagster.checks.rowdiff import row_diff_across
from dw_dagster.databases import DuckDBDatabase


def _c02(db, schema):
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    for t, rows in (("s", "(1,'1','11'),(2,NULL,'x'),(3,NULL,'y'),(4,'',NULL)"),
                    ("t", "(1,'11','1'),(2,'x',NULL),(3,NULL,'y'),(4,NULL,NULL)")):
        db.execute(f"CREATE TABLE {schema}.{t} (id INT, a VARCHAR, b VARCHAR); INSERT INTO {schema}.{t} VALUES {rows}")


def test_c02_null_semantics_in_db(duck):
    _c02(duck, "x")
    r = row_diff(duck, "x.s", "x.t", ["id"])
    assert (r.missing, r.extra, r.changed) == (0, 0, 3)
    assert [(e.key, e.columns) for e in r.sample] == [([1], ["a", "b"]), ([2], ["a", "b"]), ([4], ["a"])]


@pytest.mark.parametrize("portable", [False, True], ids=["native_hash", "portable_md5"])
def test_c02_across_databases(tmp_path, portable):
    a, b = DuckDBDatabase(tmp_path / "a.duckdb"), DuckDBDatabase(tmp_path / "b.duckdb")
    _c02(a, "x")
    _c02(b, "y")
    r = row_diff_across(a, b, "x.s", "y.t", ["id"], ["a", "b"], portable=portable)
    assert (r.missing, r.extra, r.changed) == (0, 0, 3)
    assert [(e.key, e.columns) for e in r.sample] == [([1], ["a", "b"]), ([2], ["a", "b"]), ([4], ["a"])]  # keys keep their type
    assert r.rows_downloaded <= 6  # only the buckets holding ids 1, 2 and 4


def test_across_downloads_only_differing_buckets(tmp_path):
    a, b = DuckDBDatabase(tmp_path / "a.duckdb"), DuckDBDatabase(tmp_path / "b.duckdb")
    a.execute("CREATE TABLE t AS SELECT i AS id, i * 2 AS v FROM range(50000) r(i)")
    b.execute("CREATE TABLE t AS SELECT i AS id, CASE WHEN i = 777 THEN -1 ELSE i * 2 END AS v FROM range(50000) r(i) WHERE i <> 4242")
    for portable in (False, True):
        r = row_diff_across(a, b, "t", "t", ["id"], ["v"], portable=portable)
        assert {(e.key[0], e.status) for e in r.sample} == {(4242, "missing"), (777, "changed")}
        assert r.buckets_downloaded == 2 and r.rows_downloaded < 200


def test_c01_null_keys_match_and_duplicates_count(duck):
    duck.execute("CREATE TABLE s (region VARCHAR, sku VARCHAR, qty INT); CREATE TABLE t (region VARCHAR, sku VARCHAR, qty INT)")
    duck.execute("INSERT INTO s VALUES ('EU','A',1), (NULL,'B',2); INSERT INTO t VALUES ('EU','A',1), (NULL,'B',2)")
    r = row_diff(duck, "s", "t", ["region", "sku"])
    assert r.identical
    assert r.warnings == ["key column region has 1 NULL(s) on the source side; compared NULL-safely",
                          "key column region has 1 NULL(s) on the target side; compared NULL-safely"]
    duck.execute("INSERT INTO t VALUES (NULL,'B',2)")
    r = row_diff(duck, "s", "t", ["region", "sku"])
    assert (r.missing, r.extra, r.changed, r.duplicated_target) == (0, 0, 0, 1)
    assert [(e.key, e.status, e.target_rows) for e in r.sample] == [([None, "B"], "duplicate", 2)]


def test_c03_decimals_exact_floats_tolerant(duck):
    duck.execute("CREATE TABLE s (id INT, amount DOUBLE, big DECIMAL(38,2)); CREATE TABLE t (id INT, amount DECIMAL(18,2), big DECIMAL(38,2))")
    duck.execute("INSERT INTO s VALUES (1, 0.1 + 0.2, 1.00), (2, 5, 12345678901234567.89), (3, -0.0, 0)")
    duck.execute("INSERT INTO t VALUES (1, 0.30, 1.00), (2, 5, 12345678901234567.90), (3, 0.00, 0)")
    r = row_diff(duck, "s", "t", ["id"])
    assert [(e.key, e.columns) for e in r.sample] == [([2], ["big"])]


def test_c07_missing_and_duplicate_reported_in_key_order(duck):
    duck.execute("CREATE TABLE s (k INT, amt DECIMAL(18,2)); CREATE TABLE t (k INT, amt DECIMAL(18,2))")
    duck.execute("INSERT INTO s SELECT i, 10 FROM range(1, 6) r(i); INSERT INTO t VALUES (1,10),(2,10),(3,10),(3,10),(4,10)")
    r = row_diff(duck, "s", "t", ["k"])
    assert [(e.key, e.status) for e in r.sample] == [([3], "duplicate"), ([5], "missing")]
    assert (r.missing, r.duplicated_target) == (1, 1)


def test_case_insensitive_keys_and_collisions(duck):
    duck.execute("CREATE TABLE s (k VARCHAR, c VARCHAR); CREATE TABLE t (k VARCHAR, c VARCHAR)")
    duck.execute("INSERT INTO s VALUES ('ab', 'x'), ('Cd', 'y'), ('cd', 'y'); INSERT INTO t VALUES ('AB', 'x'), ('cd', 'y')")
    r = row_diff(duck, "s", "t", ["k"], case_insensitive_keys=True)
    # 'Cd' and 'cd' are two source keys that fold into one: a collision, not a duplicate
    assert (r.missing, r.extra, r.duplicated_source, r.collided_source) == (0, 0, 0, 1)
    assert [(c.side, c.key, c.spellings) for c in r.collisions] == [("source", ["cd"], ["Cd", "cd"])]
    assert any("collide" in w and "cd" in w for w in r.warnings)


def test_unknown_table(duck):
    from dw_dagster.databases import DatabaseError

    with pytest.raises(DatabaseError, match="not found"):
        row_diff(duck, "nope", "nope2", ["k"])


def test_char_padding_against_varchar_on_postgres(postgres):
    postgres.execute("DROP SCHEMA IF EXISTS dw_rowdiff CASCADE")
    postgres.execute("CREATE SCHEMA dw_rowdiff")
    try:
        postgres.execute("CREATE TABLE dw_rowdiff.s (k CHAR(6), code CHAR(5)); CREATE TABLE dw_rowdiff.t (k VARCHAR(6), code VARCHAR(5))")
        postgres.execute("INSERT INTO dw_rowdiff.s VALUES ('a1', 'X'), ('b2', 'Y'), ('c3', 'Z')")
        postgres.execute("INSERT INTO dw_rowdiff.t VALUES ('a1', 'X'), ('b2', 'Y '), ('c3', 'W')")
        r = row_diff(postgres, "dw_rowdiff.s", "dw_rowdiff.t", ["k"])
        # 'X' in CHAR(5) is 'X    '; trailing blanks are padding, so only c3 differs
        assert [(e.key, e.columns) for e in r.sample] == [(["c3"], ["code"])]
    finally:
        postgres.execute("DROP SCHEMA IF EXISTS dw_rowdiff CASCADE")


def test_timestamps_at_a_common_precision(duck):
    duck.execute("CREATE TABLE s (id INT, ts TIMESTAMP); CREATE TABLE t (id INT, ts TIMESTAMP)")
    duck.execute("INSERT INTO s VALUES (1, TIMESTAMP '2024-03-10 12:00:00.123456'), (2, TIMESTAMP '2024-03-10 12:00:00.100')")
    duck.execute("INSERT INTO t VALUES (1, TIMESTAMP '2024-03-10 12:00:00.123'), (2, TIMESTAMP '2024-03-10 12:00:00.200')")
    assert row_diff(duck, "s", "t", ["id"]).changed == 2  # exact: microseconds differ
    r = row_diff(duck, "s", "t", ["id"], timestamp_precision="millisecond")
    assert [(e.key, e.columns) for e in r.sample] == [([2], ["ts"])]


def _pair(tmp_path, ddl: str, source_rows: str, target_rows: str):
    a, b = DuckDBDatabase(tmp_path / "a.duckdb"), DuckDBDatabase(tmp_path / "b.duckdb")
    for db, rows in ((a, source_rows), (b, target_rows)):
        db.execute(f"CREATE TABLE t ({ddl})")
        if rows:
            db.execute(f"INSERT INTO t VALUES {rows}")
    return a, b


@pytest.mark.parametrize("portable", [False, True], ids=["native_hash", "portable_md5"])
def test_c01_across_warns_about_null_keys_even_when_nothing_differs(tmp_path, portable):
    a, b = _pair(tmp_path, "region VARCHAR, sku VARCHAR, qty INT", "('EU','A',1), (NULL,'B',2)", "('EU','A',1), (NULL,'B',2)")
    r = row_diff_across(a, b, "t", "t", ["region", "sku"], portable=portable)
    assert r.identical and r.buckets_downloaded == 0
    assert r.warnings == ["key column region has 1 NULL(s) on the source side; compared NULL-safely",
                          "key column region has 1 NULL(s) on the target side; compared NULL-safely"]
    b.execute("INSERT INTO t VALUES (NULL,'B',2)")  # the variant: one bad MERGE
    r = row_diff_across(a, b, "t", "t", ["region", "sku"], portable=portable)
    assert (r.missing, r.extra, r.changed, r.duplicated_target) == (0, 0, 0, 1)
    assert [(e.key, e.status, e.target_rows) for e in r.sample] == [([None, "B"], "duplicate", 2)]
    assert "key column region has 2 NULL(s) on the target side; compared NULL-safely" in r.warnings


@pytest.mark.parametrize("portable", [False, True], ids=["native_hash", "portable_md5"])
def test_c03_across_uses_the_typed_comparison(tmp_path, portable):
    a = DuckDBDatabase(tmp_path / "a.duckdb")
    b = DuckDBDatabase(tmp_path / "b.duckdb")
    a.execute("CREATE TABLE s (id INT, amount DOUBLE, big DECIMAL(38,2))")
    a.execute("INSERT INTO s VALUES (1, 0.1 + 0.2, 1.00), (2, 5, 12345678901234567.89), (3, -0.0, 0)")
    b.execute("CREATE TABLE t (id INT, amount DECIMAL(18,2), big DECIMAL(38,2))")
    b.execute("INSERT INTO t VALUES (1, 0.30, 1.00), (2, 5, 12345678901234567.90), (3, 0.00, 0)")
    r = row_diff_across(a, b, "s", "t", ["id"], portable=portable)
    assert (r.missing, r.extra, r.changed) == (0, 0, 1)
    assert [(e.key, e.columns) for e in r.sample] == [([2], ["big"])]


def test_across_timestamp_precision_char_padding_and_case_insensitive_keys(tmp_path):
    a, b = _pair(tmp_path, "k VARCHAR, ts TIMESTAMP, c VARCHAR",
                 "('AB', TIMESTAMP '2024-03-09 22:00:00.123456', 'x'), ('cd', TIMESTAMP '2024-03-09 22:00:00', 'y')",
                 "('ab', TIMESTAMP '2024-03-09 22:00:00.123', 'x'), ('CD', TIMESTAMP '2024-03-09 22:00:01', 'y'), ('Cd', TIMESTAMP '2024-03-09 22:00:01', 'y')")
    r = row_diff_across(a, b, "t", "t", ["k"], timestamp_precision="millisecond", case_insensitive_keys=True)
    assert (r.missing, r.extra) == (0, 0)
    # 'AB' = 'ab' once case is ignored and equal at millisecond precision; the target's 'CD' and
    # 'Cd' fold into one key: a collision, never paired with the source's 'cd'
    assert [(e.key, e.status, e.columns) for e in r.sample] == [(["cd"], "collision", [])]
    assert (r.duplicated_target, r.collided_target) == (0, 1)
    assert any("collide after normalization" in w and "target" in w for w in r.warnings)
    r = row_diff_across(a, b, "t", "t", ["k"], ["ts"], case_insensitive_keys=True)  # microseconds now count
    assert [e.key for e in r.sample if e.status == "changed"] == [["ab"]]


def test_across_one_side_empty(tmp_path):
    a, b = _pair(tmp_path, "id INT, v DECIMAL(18,2)", "(1, 1.00), (2, 2.00)", "")
    r = row_diff_across(a, b, "t", "t", ["id"])
    assert (r.missing, r.extra, r.changed) == (2, 0, 0)
    assert [e.key for e in r.sample] == [[1], [2]]
    r = row_diff_across(b, a, "t", "t", ["id"])
    assert (r.missing, r.extra) == (0, 2)


def test_across_unknown_column_is_a_clear_error(tmp_path):
    from dw_dagster.databases import DatabaseError

    a, b = _pair(tmp_path, "id INT, v INT", "(1, 1)", "(1, 1)")
    with pytest.raises(DatabaseError, match="compared column nope is not in both"):
        row_diff_across(a, b, "t", "t", ["id"], ["nope"])
    with pytest.raises(DatabaseError, match="not found"):
        row_diff_across(a, b, "t", "missing_table", ["id"])


def test_settings_that_reach_sql_are_checked(duck):
    duck.execute("CREATE TABLE s (id INT, ts TIMESTAMP); CREATE TABLE t (id INT, ts TIMESTAMP)")
    for bad in ("fortnight", "second', ts) FROM s; DROP TABLE t; --"):
        with pytest.raises(ValueError, match="timestamp_precision must be one of"):
            row_diff(duck, "s", "t", ["id"], timestamp_precision=bad)
    with pytest.raises(ValueError, match="rel_tolerance"):
        row_diff(duck, "s", "t", ["id"], rel_tolerance=float("inf"))
    with pytest.raises(ValueError, match="not a string"):
        row_diff(duck, "s", "t", "id")
    assert duck.fetch_all("SELECT COUNT(*) FROM t") == [(0,)]


def test_text_against_a_number_is_compared_as_text_not_rounded(duck):
    duck.execute("CREATE TABLE s (id INT, amount DECIMAL(18,2), n INT, flag BOOLEAN)")
    duck.execute("CREATE TABLE t (id VARCHAR, amount VARCHAR, n VARCHAR, flag VARCHAR)")
    duck.execute("INSERT INTO s VALUES (1, 1.50, 1, true), (2, 2.00, 2, false), (3, 3.00, 3, true)")
    duck.execute("INSERT INTO t VALUES ('1', '1.504', '1.4', 'yes'), ('2', '2.00', '2', 'false'), ('3', '3.00', 'abc', 'true')")
    r = row_diff(duck, "s", "t", ["id"])  # keys INTEGER vs VARCHAR match as text; no cast rounds a value
    assert (r.missing, r.extra) == (0, 0)
    assert [(e.key, e.columns) for e in r.sample] == [(["1"], ["amount", "n", "flag"]), (["3"], ["n"])]


def test_unqualified_name_means_the_current_schema_and_original_spelling_is_kept(duck):
    duck.execute('CREATE SCHEMA archive; CREATE TABLE archive.t (id INT, old_col INT)')
    duck.execute('CREATE TABLE s (id INT, "Net Sales" DECIMAL(18,2), only_here INT); CREATE TABLE t (id INT, "Net Sales" DECIMAL(18,2))')
    duck.execute("INSERT INTO s VALUES (1, 1.00, 0), (2, 2.00, 0); INSERT INTO t VALUES (1, 1.00), (2, 2.50)")
    r = row_diff(duck, "s", "t", ["id"])
    assert [(e.key, e.columns) for e in r.sample] == [([2], ["Net Sales"])]
    assert "column only_here is only in s; not compared" in r.warnings
    duck.execute("CREATE SCHEMA other; CREATE TABLE other.u (id INT); CREATE SCHEMA third; CREATE TABLE third.u (id INT)")
    from dw_dagster.databases import DatabaseError

    with pytest.raises(DatabaseError, match="in several schemas"):
        row_diff(duck, "other.u", "u", ["id"])


def test_across_aware_against_naive_whatever_the_machine_zone(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        a, b = _pair(tmp_path, "id INT, v INT", "(1, 1)", "(1, 2)")
        a.execute("CREATE TABLE ts_a (id INT, ts TIMESTAMPTZ); INSERT INTO ts_a VALUES (1, '2024-03-10 12:00:00+00'), (2, '2024-03-10 13:00:00+00')")
        b.execute("CREATE TABLE ts_b (id INT, ts TIMESTAMP); INSERT INTO ts_b VALUES (1, '2024-03-10 12:00:00'), (2, '2024-03-10 13:00:01')")
        r = row_diff_across(a, b, "ts_a", "ts_b", ["id"])
        assert [(e.key, e.columns) for e in r.sample] == [([2], ["ts"])]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()



class _Spy(DuckDBDatabase):
    """A DuckDB database that records every SQL statement it is sent and the Arrow result sets
    it returns (``fetched``: query, rows, ``RecordBatch.nbytes`` summed)."""

    def __init__(self, path):
        super().__init__(path)
        self.sent, self.fetched = [], []

    def fetch_all(self, sql):
        self.sent.append(sql)
        return super().fetch_all(sql)

    def fetch_batches(self, sql, batch_rows=100_000):
        self.sent.append(sql)
        batches = list(super().fetch_batches(sql, batch_rows))
        self.fetched.append((sql, sum(b.num_rows for b in batches), sum(b.nbytes for b in batches)))
        yield from batches


def _tables(rows: int, changed_every: int, missing_every: int) -> tuple[str, str]:
    """SELECTs of a source table and of its copy with every ``changed_every``-th v changed and
    every ``missing_every``-th row missing."""
    return (f"SELECT i AS id, i * 2 AS v, 'n' || (i % 7) AS note FROM range({rows}) r(i)",
            f"SELECT i AS id, CASE WHEN i % {changed_every} = 1 THEN -1 ELSE i * 2 END AS v, "
            f"'n' || (i % 7) AS note FROM range({rows}) r(i) WHERE i % {missing_every} <> 3")


def _spied_pair(tmp_path, rows: int, changed_every: int, missing_every: int):
    a, b = _Spy(tmp_path / "a.duckdb"), _Spy(tmp_path / "b.duckdb")
    for db, select in zip((a, b), _tables(rows, changed_every, missing_every)):
        db.execute(f"CREATE TABLE t AS {select}")
    return a, b


def _downloads(db):
    return [(rows, nbytes) for q, rows, nbytes in db.fetched if "dw_sum" not in q]


@pytest.mark.parametrize("changed_every", [50, 4], ids=["some_buckets_differ", "most_buckets_differ"])
def test_across_downloads_in_bounded_passes_with_the_single_pass_answer(tmp_path, monkeypatch, changed_every):
    """The download is diffed in passes of about ``pass_rows`` rows (both sides), so memory does
    not grow with the table, and each table is still read once; counts, per-column counts and the
    key-ordered sample are those of one pass and of the in-database diff. (Before the passes,
    every differing row was diffed at once: 1,000+ rows here.)"""
    from dw_dagster.checks.rowdiff import hashdiff

    a, b = _spied_pair(tmp_path, 20_000, changed_every, 40)
    one = row_diff_across(a, b, "t", "t", ["id"], ["v", "note"], buckets=1024, sample_limit=30)
    diffed, real = [], hashdiff._diff_typed

    def counting(local, src, tgt, *args):
        diffed.append(sum(local.fetch_all(f"SELECT COUNT(*) FROM {t}")[0][0] for t in (src, tgt)))
        return real(local, src, tgt, *args)

    monkeypatch.setattr(hashdiff, "_diff_typed", counting)
    a.fetched.clear()
    b.fetched.clear()
    r = row_diff_across(a, b, "t", "t", ["id"], ["v", "note"], buckets=1024, sample_limit=30, pass_rows=400)
    assert one.download_passes == 1 and r.download_passes == len(diffed) > 3
    assert len(_downloads(a)) == len(_downloads(b)) == 1  # each table read once, whatever the passes
    assert sum(diffed) == r.rows_downloaded == one.rows_downloaded == sum(n for db in (a, b) for n, _ in _downloads(db))
    biggest_bucket = 2 * 20_000 // 1024 + 40  # a pass may run over by its last bucket
    assert max(diffed) <= 400 + biggest_bucket
    n = 20_000 // 40
    assert (r.missing, r.extra) == (one.missing, one.extra) == (n, 0)
    assert r.changed == one.changed and r.changed_columns == one.changed_columns == {"v": r.changed}
    assert [(e.key, e.status) for e in r.sample] == [(e.key, e.status) for e in one.sample]
    indb = DuckDBDatabase(tmp_path / "both.duckdb")  # the same two tables in one database
    for name, select in zip(("s", "t"), _tables(20_000, changed_every, 40)):
        indb.execute(f"CREATE TABLE {name} AS {select}")
    d = row_diff(indb, "s", "t", ["id"], ["v", "note"], sample_limit=30)
    assert (d.missing, d.extra, d.changed, d.changed_columns) == (r.missing, r.extra, r.changed, r.changed_columns)
    assert [(e.key, e.status, e.columns) for e in d.sample] == [(e.key, e.status, e.columns) for e in r.sample]


def test_across_pass_rows_must_be_positive(tmp_path):
    a, b = _spied_pair(tmp_path, 10, 4, 40)
    with pytest.raises(ValueError, match="pass_rows"):
        row_diff_across(a, b, "t", "t", ["id"], pass_rows=0)


def test_across_bytes_counters_are_what_was_fetched_and_sent(tmp_path):
    a, b = _spied_pair(tmp_path, 5_000, 100, 1_000_000)  # 50 changed rows, nothing missing
    r = row_diff_across(a, b, "t", "t", ["id"], ["v", "note"], buckets=1024)
    fetched = [f for db in (a, b) for f in db.fetched]
    assert r.bytes_fetched == sum(nbytes for _, _, nbytes in fetched) > 0
    assert r.bytes_sent == sum(len(q.encode()) for q in r.queries)
    assert set(r.queries) <= set(a.sent) | set(b.sent)  # every counted query was sent
    checksums = [nbytes for q, _, nbytes in fetched if "dw_sum" in q]
    rows = sum(n for db in (a, b) for n, _ in _downloads(db))
    assert len(checksums) == 2 and r.rows_downloaded == rows and 100 <= rows < 5_000  # only the differing buckets
    # the downloaded rows' Arrow buffers: an 8-byte id and v each, and the note's text
    assert r.bytes_fetched - sum(checksums) >= rows * 16
    a.fetched.clear()  # identical tables: the two checksum result sets only
    same = row_diff_across(a, a, "t", "t", ["id"], ["v", "note"], buckets=1024)
    assert same.identical and same.rows_downloaded == 0 and same.download_passes == 0
    assert [q for q, _, _ in a.fetched if "dw_sum" not in q] == []
    assert same.bytes_fetched == sum(nbytes for _, _, nbytes in a.fetched) == 2 * checksums[0]
    assert same.bytes_sent < r.bytes_sent  # no download queries
