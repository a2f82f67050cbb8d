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
