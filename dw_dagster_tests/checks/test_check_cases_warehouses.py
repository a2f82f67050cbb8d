"""The same check cases on DuckDB, Snowflake (fakesnow over loopback) and BigQuery (bqemulator over loopback)."""

import datetime as dt
from decimal import Decimal

import pytest

from dw_dagster.checks.dead_letter import parked_rows
from dw_dagster.checks.freshness import freshness
from dw_dagster.checks.null_rate import null_rates
from dw_dagster.checks.reconcile import reconcile
from dw_dagster.checks.volume import volume_scores

D = dt.date


def test_c07_slices_and_keys(warehouse):
    cols = {"k": "INTEGER", "day": "DATE", "amt": "DECIMAL(18,2)"}
    day = lambda k: D(2024, 3, 1) if k <= 3 else D(2024, 3, 2)  # noqa: E731
    s = warehouse.make_table("src", cols, [(k, day(k), Decimal("10.00")) for k in range(1, 6)])
    t = warehouse.make_table("tgt", cols, [(k, day(k), Decimal("10.00")) for k in (1, 2, 3, 3, 4)])
    res = reconcile(warehouse.db, warehouse.db, s, t, ["day"], ["amt"], key_columns=["k"])
    got = {sl.slice["day"]: (sl.source_rows, sl.target_rows, sl.source_keys, sl.target_keys, sl.target_duplicate_keys)
           for sl in res.slices}
    assert got == {"2024-03-01": (3, 4, 3, 3, 1), "2024-03-02": (2, 1, 2, 1, 0)}
    assert not res.passed
    assert {sl.slice["day"]: sl.sum_gaps["amt"] for sl in res.slices} == {"2024-03-01": "-10.00", "2024-03-02": "10.00"}


def test_c08_counted_in_the_warehouse_value_under_test_not_in_its_baseline(warehouse):
    per_day = [100, 102, 98, 101, 99, 125]
    rows = [(dt.datetime(2024, 3, d, 12, i % 60),) for d, n in zip(range(1, 7), per_day) for i in range(n)]
    t = warehouse.make_table("events", {"ts": "TIMESTAMP"}, rows)
    (s,), _ = volume_scores(warehouse.db, t, "ts", evaluate_days=1, as_of=D(2024, 3, 6), training_days=5, min_band_pct=0)
    assert (s.rows, s.baseline_days, s.mean, s.stddev) == (125, 5, 100.0, 1.581)
    assert s.z_score == pytest.approx(15.81, abs=0.01) and s.status == "high" and not s.passed


def test_c10_zero_day_from_the_spine(warehouse):
    rows = [(dt.datetime(2024, 3, d, 12),) for d in range(1, 8) for _ in range(5)]
    t = warehouse.make_table("events", {"ts": "TIMESTAMP"}, rows)
    (s,), _ = volume_scores(warehouse.db, t, "ts", evaluate_days=1, as_of=D(2024, 3, 8), training_days=7)
    assert (s.rows, s.status, s.mean) == (0, "no_rows", 5.0)
    assert s.lower >= 0


def test_null_rate_jump_fails(warehouse):
    rows = [(dt.datetime(2024, 3, d, 12), "x") for d in range(1, 8) for _ in range(20)]
    rows += [(dt.datetime(2024, 3, 8, 12), None if i < 2 else "x") for i in range(20)]  # 10 % today
    t = warehouse.make_table("t", {"ts": "TIMESTAMP", "c": "VARCHAR"}, rows)
    (r,), _ = null_rates(warehouse.db, t, ["c"], timestamp_column="ts", baseline_days=7)
    assert (r.baseline_pct, r.current_pct, r.status) == (0.0, 10.0, "too_many_nulls")


def test_c14_all_null_timestamps(warehouse):
    # (fakesnow reads a NULL TIMESTAMP_NTZ back as 1970-01-01; the check decides on COUNT(ts), not on MAX)
    t = warehouse.make_table("t", {"loaded_at": "TIMESTAMP"}, [(None,), (None,), (None,)])
    r, _ = freshness(warehouse.db, t, "loaded_at", max_lag=dt.timedelta(hours=1))
    assert not r.passed and r.max_timestamp_utc is None and r.reason == "no timestamp observed (3 rows, all NULL)"
    e = warehouse.make_table("e", {"loaded_at": "TIMESTAMP"}, [])
    r, _ = freshness(warehouse.db, e, "loaded_at", max_lag=dt.timedelta(hours=1))
    assert not r.passed and "table is empty" in r.reason


def test_freshness_value_in_utc(warehouse):
    t = warehouse.make_table("t", {"loaded_at": "TIMESTAMP"}, [(dt.datetime(2024, 3, 10, 11, 0),), (None,)])
    r, _ = freshness(warehouse.db, t, "loaded_at", max_lag=dt.timedelta(hours=1),
                     now_utc=dt.datetime(2024, 3, 10, 11, 30, tzinfo=dt.timezone.utc))
    assert r.passed and r.max_timestamp_utc == dt.datetime(2024, 3, 10, 11, 0, tzinfo=dt.timezone.utc)


def test_dead_letter_by_reason(warehouse):
    rows = [(1, dt.datetime(2024, 3, 11, 9), "old"), (2, dt.datetime(2024, 3, 12, 10), "missing required field"),
            (3, dt.datetime(2024, 3, 12, 11), "missing required field")]
    t = warehouse.make_table("dlq", {"order_id": "INTEGER", "parked_at": "TIMESTAMP", "error": "VARCHAR"}, rows)
    reasons, _ = parked_rows(warehouse.db, t, "parked_at", "error", dt.datetime(2024, 3, 12))
    assert [(r.reason, r.rows) for r in reasons] == [("missing required field", 2)]


def test_c01_null_keys_reconcile(warehouse):
    cols = {"region": "VARCHAR", "sku": "VARCHAR", "qty": "INTEGER"}
    s = warehouse.make_table("s", cols, [("EU", "A", 1), (None, "B", 2)])
    t = warehouse.make_table("t", cols, [("EU", "A", 1), (None, "B", 2), (None, "B", 2)])
    (total,) = reconcile(warehouse.db, warehouse.db, s, t, [], ["qty"], key_columns=["region", "sku"]).slices
    assert (total.source_keys, total.target_keys, total.target_duplicate_keys) == (2, 2, 1) and not total.passed


def test_c02_row_diff(warehouse):
    from dw_dagster.checks.rowdiff import row_diff

    cols = {"id": "INTEGER", "a": "VARCHAR", "b": "VARCHAR"}
    s = warehouse.make_table("s", cols, [(1, "1", "11"), (2, None, "x"), (3, None, "y"), (4, "", None)])
    t = warehouse.make_table("t", cols, [(1, "11", "1"), (2, "x", None), (3, None, "y"), (4, None, None)])
    r = row_diff(warehouse.db, s, t, ["id"])
    assert [(e.key, e.columns) for e in r.sample] == [([1], ["a", "b"]), ([2], ["a", "b"]), ([4], ["a"])]


def test_c03_exact_decimals_tolerant_floats(warehouse):
    from dw_dagster.checks.rowdiff import row_diff

    s = warehouse.make_table("s", {"id": "INTEGER", "amount": "DOUBLE", "big": "DECIMAL(18,2)"},
                             [(1, 0.1 + 0.2, Decimal("1.00")), (2, 5.0, Decimal("123456789012345.67")), (3, -0.0, Decimal("0.00"))])
    t = warehouse.make_table("t", {"id": "INTEGER", "amount": "DECIMAL(18,2)", "big": "DECIMAL(18,2)"},
                             [(1, Decimal("0.30"), Decimal("1.00")), (2, Decimal("5.00"), Decimal("123456789012345.68")),
                              (3, Decimal("0.00"), Decimal("0.00"))])
    r = row_diff(warehouse.db, s, t, ["id"])
    assert [(e.key, e.columns) for e in r.sample] == [([2], ["big"])]


def test_c02_c03_across_engines_duckdb_to_warehouse(warehouse, tmp_path):
    """Source in a local DuckDB file, target in the warehouse: bucketed md5 checksums across engines,
    then the typed comparison on the downloaded rows (keys keep their types; floats get the tolerance)."""
    from dw_dagster.checks.rowdiff import row_diff_across
    from dw_dagster.databases import DuckDBDatabase
    from dw_dagster_tests.harness.emulators import make_table

    local = DuckDBDatabase(tmp_path / "source.duckdb")
    local.execute("CREATE SCHEMA src")
    cols = {"id": "INTEGER", "a": "VARCHAR", "b": "VARCHAR", "amount": "DOUBLE", "big": "DECIMAL(18,2)"}
    make_table(local, "src.s", cols, [(1, "1", "11", 0.1 + 0.2, Decimal("1.00")), (2, None, "x", 5.0, Decimal("123456789012345.67")),
                                       (3, None, "y", -0.0, Decimal("0.00")), (4, "", None, 1.5, Decimal("2.00")),
                                       (5, "gone", "gone", 0.0, Decimal("0.00"))])
    t = warehouse.make_table("t", {**cols, "amount": "DECIMAL(18,2)"},
                             [(1, "11", "1", Decimal("0.30"), Decimal("1.00")), (2, "x", None, Decimal("5.00"), Decimal("123456789012345.68")),
                              (3, None, "y", Decimal("0.00"), Decimal("0.00")), (4, None, None, Decimal("1.50"), Decimal("2.00")),
                              (6, "new", "new", Decimal("0.00"), Decimal("0.00"))])
    r = row_diff_across(local, warehouse.db, "src.s", t, ["id"])
    assert (r.missing, r.extra, r.changed) == (1, 1, 3)
    assert [(e.key, e.status, e.columns) for e in r.sample] == [
        ([1], "changed", ["a", "b"]), ([2], "changed", ["a", "b", "big"]), ([4], "changed", ["a"]),
        ([5], "missing", []), ([6], "extra", [])]


def test_across_engines_same_hashes_nothing_downloaded(warehouse, tmp_path):
    """Integers and text print alike on every engine, so equal rows give equal md5 bucket sums
    and only the bucket holding the one changed row is downloaded."""
    from dw_dagster.checks.rowdiff import row_diff_across
    from dw_dagster.databases import DuckDBDatabase
    from dw_dagster_tests.harness.emulators import make_table

    local = DuckDBDatabase(tmp_path / "source.duckdb")
    local.execute("CREATE SCHEMA src")
    cols = {"id": "INTEGER", "name": "VARCHAR", "qty": "INTEGER"}
    rows = [(i, f"item {i}" if i % 7 else None, i * 3) for i in range(1, 301)]
    make_table(local, "src.s", cols, rows)
    t = warehouse.make_table("t", cols, [r if r[0] != 150 else (150, "item 150", -1) for r in rows])
    r = row_diff_across(local, warehouse.db, "src.s", t, ["id"])
    assert [(e.key, e.columns) for e in r.sample] == [([150], ["qty"])]
    assert r.buckets_downloaded == 1 and r.rows_downloaded <= 6  # a bucket holds up to a few rows
