"""Parity of a table pair, kind by kind, on real tables: DuckDB → DuckDB and PostgreSQL → DuckDB.

The failure kinds are the ones migration tools keep meeting in the field; each test's docstring
links the public report it comes from.
"""

import datetime as dt
import os
import uuid

import pytest

from dw_dagster.databases import DuckDBDatabase, SqlAlchemyDatabase
from dw_dagster.migration.config import KeyDiffRule, PairConfig
from dw_dagster.migration.parity import counts_parity, key_diff_parity, schema_parity
from dw_dagster.migration.types import compare, family
from dw_dagster_tests.conftest import POSTGRES_URL

FULL = KeyDiffRule(full_below_rows=10_000_000)


def pair(table: str, key, **kw) -> PairConfig:
    return PairConfig.model_validate({"source": {"database": "s", "table": table},
                                      "target": {"asset": table.replace(".", "/"), "database": "t", "table": table},
                                      "key": key, **kw})


@pytest.fixture(scope="module")
def pg():
    db = SqlAlchemyDatabase(POSTGRES_URL)
    schema = f"mig_{uuid.uuid4().hex[:8]}"
    try:
        db.execute(f"CREATE SCHEMA {schema}")
    except Exception as e:  # pragma: no cover - CI machines have the server
        pytest.fail(f"PostgreSQL on loopback is required: {e}")
    yield db, schema
    db.execute(f"DROP SCHEMA {schema} CASCADE")
    db.dispose()


@pytest.fixture(scope="module")
def wh(tmp_path_factory):
    db = DuckDBDatabase(tmp_path_factory.mktemp("wh") / "wh.duckdb")
    return db


def _mirror(pg_db, schema: str, wh: DuckDBDatabase, name: str, pg_ddl: str, duck_ddl: str, rows: list[str],
            target_rows: list[str] | None = None) -> str:
    pg_db.execute(f"CREATE TABLE {schema}.{name} ({pg_ddl})")
    wh.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    wh.execute(f"CREATE TABLE {schema}.{name} ({duck_ddl})")
    if rows:
        pg_db.execute(f"INSERT INTO {schema}.{name} VALUES {', '.join(rows)}")
    t_rows = rows if target_rows is None else target_rows
    if t_rows:
        wh.execute(f"INSERT INTO {schema}.{name} VALUES {', '.join(t_rows)}")
    return f"{schema}.{name}"


def test_type_mapping_across_engines_names_every_loss():
    cases = [
        ("BIGINT", "postgres", "INTEGER", "duckdb", False, "narrowed from 64 to 32 bits"),
        ("INTEGER", "postgres", "BIGINT", "duckdb", True, "widened"),
        ("DECIMAL(18,2)", "postgres", "DECIMAL(10,2)", "duckdb", False, "precision narrowed"),
        ("DECIMAL(18,4)", "postgres", "DECIMAL(18,2)", "duckdb", False, "scale reduced"),
        ("DECIMAL(18,2)", "postgres", "DOUBLE", "duckdb", False, "exact decimals become floating point"),
        ("DOUBLE PRECISION", "postgres", "FLOAT", "duckdb", False, "narrowed to single"),  # DuckDB FLOAT is 4 bytes
        ("FLOAT", "informix", "DOUBLE", "duckdb", None, ""),  # Informix FLOAT is 8 bytes: the same
        ("VARCHAR(64)", "postgres", "VARCHAR(32)", "duckdb", False, "narrowed to 32 characters"),
        ("CHAR(10)", "informix", "VARCHAR", "duckdb", True, "trailing blanks"),
        ("TIMESTAMP WITH TIME ZONE", "postgres", "TIMESTAMP", "duckdb", True, "time zone is dropped"),
        ("DATETIME YEAR TO FRACTION(5)", "informix", "TIMESTAMP", "duckdb", True, "widened from 5 to 6"),
        ("TIMESTAMP", "postgres", "TIMESTAMP(3)", "snowflake", False, "fraction digits reduced from 6 to 3"),
        ("TIMESTAMP", "postgres", "DATE", "duckdb", False, "time of day is dropped"),
        ("MONEY", "informix", "DECIMAL(16,2)", "duckdb", None, ""),
        ("SERIAL8", "informix", "BIGINT", "duckdb", None, ""),
        ("VARCHAR", "postgres", "INTEGER", "duckdb", False, "text becomes integer"),
    ]
    for a, da, b, db, ok, words in cases:
        m = compare(family(a, da), family(b, db))
        if ok is None:
            assert m is None, (a, b, m)
        else:
            assert m is not None and m.ok is ok and words in m.words, (a, b, m)
    m = compare(family("TIMESTAMP", "postgres"), family("TIMESTAMP(3)", "snowflake"), timestamp_precision="millisecond")
    assert m.ok and "compared at the millisecond" in m.words


@pytest.fixture(scope="module")
def tables(pg, wh):
    db, schema = pg
    out = {}
    out["orders"] = _mirror(db, schema, wh, "orders", "id BIGINT PRIMARY KEY, region VARCHAR(16), amount DECIMAL(18,2)",
                            "id BIGINT, region VARCHAR, amount DECIMAL(18,2)",
                            [f"({i}, '{['N', 'S'][i % 2]}', {i}.25)" for i in range(1, 401)],
                            [f"({i}, '{['N', 'S'][i % 2]}', {i}.25)" for i in range(1, 401) if i != 7])
    return out


def test_counts_and_sums_per_slice_name_the_gap(pg, wh, tables):
    db, _ = pg
    r = counts_parity(pair(tables["orders"], ["id"], slice_by=["region"], sums=["amount"]), db, wh)
    assert not r.passed and r.values["gap_rows"] == 1
    assert '{"region": "S"}: 1 row short' in r.description and "sums differ by amount 7.25" in r.description
    assert any("GROUP BY" in q for q in r.sql) and r.metadata["dw/gap_rows"] == 1


def test_key_diff_full_and_sampled_by_key_buckets(pg, wh, tables):
    db, _ = pg
    p = pair(tables["orders"], ["id"])
    full = key_diff_parity(p, db, wh, FULL)
    assert not full.passed and full.values["missing"] == 1 and not full.values["sampled"]
    sampled = key_diff_parity(p, db, wh, KeyDiffRule(full_below_rows=100, sample=(1, 8)))
    assert sampled.values["sampled"] and "sampled" in sampled.description
    assert sampled.values["missing"] == (1 if 7 % 8 == 0 else 0)  # key 7 is in bucket 7: outside the sample
    sampled7 = key_diff_parity(p, db, wh, KeyDiffRule(full_below_rows=100, sample=(8, 8)))
    assert sampled7.values["missing"] == 1


def test_schema_parity_maps_types_and_counts_duplicate_keys(pg, wh):
    db, schema = pg
    t = _mirror(db, schema, wh, "narrowed", "id INTEGER, price DECIMAL(18,2), code CHAR(4)",
                "id INTEGER, price DECIMAL(10,2), code VARCHAR", ["(1, 1.00, 'A')", "(1, 2.00, 'B')"])
    r = schema_parity(pair(t, ["id"]), db, wh)
    assert not r.passed
    assert "price: DECIMAL(18,2) → DECIMAL(10,2): precision narrowed" in r.description
    assert r.values["duplicate_keys_source"] == 1 and r.values["duplicate_keys_target"] == 1
    assert any("code: CHAR(4) → VARCHAR" in n for n in r.values["notes"])


def test_trailing_blanks_of_char_sources_are_not_differences(pg, wh):
    """A CHAR(n) source column pads with blanks; the loaded VARCHAR holds the value without them.
    Source: GoogleCloudPlatform/professional-services-data-validator#842 ("Hive/PostgreSQL char(2)
    column is losing trailing space") and #1190 ("Trailing whitespaces in char fields")."""
    db, schema = pg
    t = _mirror(db, schema, wh, "padded", "code CHAR(4) PRIMARY KEY, n INTEGER", "code VARCHAR, n INTEGER",
                ["('A', 1)", "('BB', 2)"], ["('A', 1)", "('BB', 2)"])
    r = key_diff_parity(pair(t, ["code"]), db, wh, FULL)
    assert r.passed, r.description
    assert schema_parity(pair(t, ["code"]), db, wh).passed


def test_null_key_components_are_compared_not_skipped(pg, wh):
    """Rows whose (compound) key holds a NULL are matched NULL-safely; a missing one is reported.
    Source: datafold/data-diff#634 ("Incorrect handling of composite PK with null values") and #366
    ("Data-diff assuming NULL values are not equal to NULL values")."""
    db, schema = pg
    rows = ["(1, NULL, 10)", "(2, 'x', 20)", "(3, NULL, 30)"]
    t = _mirror(db, schema, wh, "nullkeys", "a INTEGER, b VARCHAR(4), v INTEGER", "a INTEGER, b VARCHAR, v INTEGER",
                rows, rows[:2])
    r = key_diff_parity(pair(t, ["a", "b"]), db, wh, FULL)
    assert not r.passed and r.values["missing"] == 1 and r.values["changed"] == 0
    assert "NULL" in " ".join(r.metadata["dw/warnings"].value.splitlines())


def test_exact_sums_beyond_double_precision(pg, wh):
    """Sums are compared exactly, never through float64: a difference of 1 in an 18-digit value is found.
    Source: GoogleCloudPlatform/professional-services-data-validator#754 ("sum, min, max false success
    for numeric values with precision > 16"), #900 and #1007 (casts to float64 hid mismatches)."""
    db, schema = pg
    t = _mirror(db, schema, wh, "bignum", "id INTEGER, v DECIMAL(38,0)", "id INTEGER, v DECIMAL(38,0)",
                ["(1, 123456789012345678)"], ["(1, 123456789012345679)"])
    r = counts_parity(pair(t, ["id"], sums=["v"]), db, wh)
    assert not r.passed and "sums differ by v -1" in r.description


def test_time_zone_aware_source_against_naive_utc_target(pg, wh):
    """A TIMESTAMPTZ source loaded as naive UTC compares equal whatever the session zone; schema parity names
    the dropped zone. Source: GoogleCloudPlatform/professional-services-data-validator#706 ("TIMESTAMP WITH
    TIME ZONE fails for Oracle/PostgreSQL validation") and #929 (row validation of time-zoned timestamps)."""
    db, schema = pg
    db.execute(f"CREATE TABLE {schema}.tz (id INTEGER, ts TIMESTAMPTZ)")
    db.execute(f"INSERT INTO {schema}.tz VALUES (1, '2026-11-01 09:00:00+02'), (2, '2026-11-01 23:30:00-05')")
    wh.execute(f"CREATE TABLE {schema}.tz (id INTEGER, ts TIMESTAMP)")
    wh.execute(f"INSERT INTO {schema}.tz VALUES (1, TIMESTAMP '2026-11-01 07:00:00'), (2, TIMESTAMP '2026-11-02 04:30:00')")
    t = f"{schema}.tz"
    r = key_diff_parity(pair(t, ["id"]), db, wh, FULL)
    assert r.passed, r.description
    s = schema_parity(pair(t, ["id"]), db, wh)
    assert s.passed and any("time zone is dropped" in n for n in s.values["notes"])


def test_text_keys_are_bucketed_by_hash_not_by_collation_ranges(pg, wh):
    """Keys with hyphens and mixed case sort differently on PostgreSQL and DuckDB; the diff buckets by a hash
    of the key, never by string ranges, so it finds exactly the one missing key.
    Source: datafold/data-diff#762 ("PostgreSQL and MySQL interpret string ordering differently")."""
    db, schema = pg
    keys = ["a-1", "a1", "A-1", "a_1", "b-2", "B2", "-z", "z-"]
    rows = [f"('{k}', {i})" for i, k in enumerate(keys)]
    t = _mirror(db, schema, wh, "textkeys", "k VARCHAR(8) PRIMARY KEY, v INTEGER", "k VARCHAR, v INTEGER",
                rows, rows[:3] + rows[4:])
    r = key_diff_parity(pair(t, ["k"]), db, wh, FULL)
    assert not r.passed and r.values["missing"] == 1
    assert r.metadata["dw/key_sample"].value.records[0].data["key"] == "a_1"


def test_closed_partitions_only_with_a_time_column(pg, wh):
    """Rows of the partition still being written (today) are left out of both sides' counts."""
    db, schema = pg
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    old, today = (now - dt.timedelta(days=2)).strftime("%Y-%m-%d 10:00:00"), now.strftime("%Y-%m-%d 00:00:01")
    t = _mirror(db, schema, wh, "filling", "id INTEGER, ts TIMESTAMP", "id INTEGER, ts TIMESTAMP",
                [f"(1, '{old}')", f"(2, '{today}')"], [f"(1, TIMESTAMP '{old}')"])
    assert counts_parity(pair(t, ["id"], time_column="ts"), db, wh).passed
    assert not counts_parity(pair(t, ["id"]), db, wh).passed


def test_a_missing_target_table_fails_every_kind_without_raising(pg, wh):
    db, schema = pg
    db.execute(f"CREATE TABLE {schema}.gone (id INTEGER)")
    p = pair(f"{schema}.gone", ["id"])
    for r in (schema_parity(p, db, wh), counts_parity(p, db, wh), key_diff_parity(p, db, wh, FULL)):
        assert not r.passed and "could not be compared" in r.description, r


def test_duckdb_to_duckdb(tmp_path):
    s, t = DuckDBDatabase(tmp_path / "s.duckdb"), DuckDBDatabase(tmp_path / "t.duckdb")
    for db in (s, t):
        db.execute("CREATE SCHEMA pos")
        db.execute("CREATE TABLE pos.x AS SELECT i AS id, CAST(i AS DECIMAL(10,2)) AS v FROM range(100) r(i)")
    t.execute("UPDATE pos.x SET v = 0 WHERE id = 5")
    p = pair("pos.x", ["id"], sums=["v"])
    assert schema_parity(p, s, t).passed
    assert not counts_parity(p, s, t).passed
    r = key_diff_parity(p, s, t, FULL)
    assert r.values["changed"] == 1 and r.values["changed_columns"] == {"v": 1}
    assert os.path.exists(tmp_path / "t.duckdb")


def test_lightup_compare_metric_latest_datapoint_must_read_zero(tmp_path):
    """The pair's Lightup compare metric, read over real HTTP from the fake Lightup on loopback: its latest
    datapoint reads the Southwest gap until the target is repaired and Lightup collects again."""
    from dw_dagster.integrations.lightup import LightupClient, read_credential_file
    from dw_dagster.migration.parity import lightup_parity
    from dw_dagster_tests.harness.lightup_fixtures import epoch, fake_lightup

    with fake_lightup(tmp_path) as (server, state, ids, cred):
        state.collect([ids["rows_compare"]])  # Lightup's scheduled collection
        p = pair("pos.sales_line", ["sales_line_id"], lightup_compare_metric=ids["rows_compare"])
        with LightupClient(read_credential_file(cred)) as client:
            bad = lightup_parity(p, client, now=epoch("2026-11-26"))
            assert not bad.passed and "Southwest" in bad.description and bad.values["metric"] == ids["rows_compare"]
            src, wh = DuckDBDatabase(tmp_path / "pos_db.duckdb"), DuckDBDatabase(tmp_path / "wh.duckdb")
            wh.execute(f"ATTACH '{src.path}' AS s (READ_ONLY); INSERT INTO pos.sales_line SELECT * FROM s.pos.sales_line "
                       "WHERE region = 'Southwest' AND sale_ts >= TIMESTAMP '2026-11-23'")
            state.collect([ids["rows_compare"]])
            good = lightup_parity(p, client, now=epoch("2026-11-26"))
            assert good.passed and "reads 0" in good.description, good.description
            none = lightup_parity(p, client, now=epoch("2026-10-01"))  # nothing collected in the fortnight before
            assert not none.passed and "no datapoint" in none.description
