from decimal import Decimal

import dagster as dg
import pytest

from dw_dagster.checks.reconcile import build_reconciliation_checks, compare_slice_aggregates, reconcile, slice_aggregate_sql
from dw_dagster.databases import DatabaseError, DatabaseResource
from dw_dagster.databases.sql import UnsafeIdentifierError


def test_slice_sql_is_one_group_by_per_side_and_quotes_identifiers():
    q = slice_aggregate_sql("pos.sales_line", ["region"], ["net_sales"], "duckdb")
    assert q == ("SELECT region, COUNT(*) AS dw_rows, NULL AS dw_keys, NULL AS dw_dup_keys, SUM(net_sales) AS dw_sum_0 "
                 "FROM pos.sales_line GROUP BY region")
    hostile = slice_aggregate_sql('pos.x"; DROP TABLE y; --', ["region"], [], "postgres")
    assert 'pos."x""; DROP TABLE y; --"' in hostile


def _two_tables(db, src_rows, tgt_rows):
    db.execute("CREATE SCHEMA IF NOT EXISTS s; CREATE SCHEMA IF NOT EXISTS t")
    for name, rows in (("s.sales", src_rows), ("t.sales", tgt_rows)):
        db.execute(f"CREATE OR REPLACE TABLE {name} (k INT, day DATE, region VARCHAR, amt DECIMAL(18,2))")
        if rows:
            db.execute(f"INSERT INTO {name} VALUES " + ", ".join(f"({k}, DATE '{d}', '{r}', {a})" for k, d, r, a in rows))


def test_duplicate_and_missing_row_do_not_cancel_by_slice(duck):
    # C07: totals agree (5 rows, 50.00) but the day slices differ.
    src = [(k, "2024-03-01" if k <= 3 else "2024-03-02", "EU", "10.00") for k in range(1, 6)]
    tgt = [(k, "2024-03-01" if k <= 3 else "2024-03-02", "EU", "10.00") for k in (1, 2, 3, 3, 4)]
    _two_tables(duck, src, tgt)
    total = reconcile(duck, duck, "s.sales", "t.sales", [], ["amt"])
    assert total.passed  # the aggregate alone would call it equal ...
    by_day = reconcile(duck, duck, "s.sales", "t.sales", ["day"], ["amt"])
    assert not by_day.passed  # ... the slices do not
    rows = {s.slice["day"]: (s.source_rows, s.target_rows, s.gap_rows) for s in by_day.slices}
    assert rows == {"2024-03-01": (3, 4, -1), "2024-03-02": (2, 1, 1)}


def test_exact_decimal_sums_and_percent_gap(duck):
    src = [(1, "2024-03-01", "SW", "12345678901234567.89"), (2, "2024-03-01", "SW", "1.00"), (3, "2024-03-01", "NE", "5.00")]
    tgt = [(1, "2024-03-01", "SW", "12345678901234567.90"), (2, "2024-03-01", "SW", "1.00"), (3, "2024-03-01", "NE", "5.00")]
    duck.execute("CREATE SCHEMA IF NOT EXISTS s; CREATE SCHEMA IF NOT EXISTS t")
    for name, rows in (("s.sales", src), ("t.sales", tgt)):
        duck.execute(f"CREATE OR REPLACE TABLE {name} (k INT, day DATE, region VARCHAR, amt DECIMAL(38,2))")
        duck.execute(f"INSERT INTO {name} VALUES " + ", ".join(f"({k}, DATE '{d}', '{r}', {a})" for k, d, r, a in rows))
    res = reconcile(duck, duck, "s.sales", "t.sales", ["region"], ["amt"])
    sw = next(s for s in res.slices if s.slice["region"] == "SW")
    assert sw.gap_rows == 0 and not sw.passed and sw.sum_gaps["amt"] == "-0.01"
    assert next(s for s in res.slices if s.slice["region"] == "NE").passed


def test_compare_reports_slices_missing_on_one_side():
    out = compare_slice_aggregates({("SW",): (100, [Decimal("10.00")])}, {("NE",): (3, [Decimal("1.00")])}, ["region"], ["m"])
    by = {s.slice["region"]: s for s in out}
    assert by["SW"].gap_rows == 100 and by["SW"].gap_pct == 100.0 and not by["SW"].passed
    assert by["NE"].gap_rows == -3 and by["NE"].gap_pct == -100.0


def test_check_runs_in_dagster_and_fails_with_numbers(tmp_path, duck):
    src = [(k, "2024-03-01", "SW" if k % 2 else "NE", "2.50") for k in range(1, 101)]
    tgt = [r for r in src if r[0] not in (1, 3)]
    _two_tables(duck, src, tgt)
    check = build_reconciliation_checks(asset="t_sales", source_asset="s_sales", source_table="s.sales",
                                        target_table="t.sales", slice_by=["region"], measures=["amt"])
    defs = dg.Definitions(assets=[dg.AssetSpec("t_sales"), dg.AssetSpec("s_sales")], asset_checks=[check],
                          resources={"source_db": DatabaseResource(url=duck.path), "warehouse": DatabaseResource(url=duck.path)})
    job = dg.define_asset_job("c", selection=dg.AssetSelection.checks(check))
    defs = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("c").execute_in_process(instance=instance, raise_on_error=False)
    (ev,) = result.get_asset_check_evaluations()
    assert not ev.passed
    assert ev.metadata["dw/gap_rows"].value == 2
    assert ev.metadata["dw/worst_gap_pct"].value == 4.0  # 2 of 50 SW rows
    assert 'SUM("amt")' in ev.metadata["dw/queries"].value


def test_unknown_table_and_bad_identifier_give_clear_errors(duck):
    with pytest.raises(DatabaseError, match="no_such"):
        reconcile(duck, duck, "s.no_such", "t.no_such", ["region"], [])
    with pytest.raises(UnsafeIdentifierError):
        build_reconciliation_checks(asset="a", source_asset="b", source_table="s..x", target_table="t.x", slice_by=["r"])


def test_c07_with_a_key_even_the_totals_fail(duck):
    src = [(k, "2024-03-01" if k <= 3 else "2024-03-02", "EU", "10.00") for k in range(1, 6)]
    tgt = [(k, "2024-03-01" if k <= 3 else "2024-03-02", "EU", "10.00") for k in (1, 2, 3, 3, 4)]
    _two_tables(duck, src, tgt)
    (total,) = reconcile(duck, duck, "s.sales", "t.sales", [], ["amt"], key_columns=["k"]).slices
    assert (total.source_rows, total.target_rows, total.gap_rows) == (5, 5, 0)
    assert (total.source_keys, total.target_keys) == (5, 4)
    assert (total.source_duplicate_keys, total.target_duplicate_keys) == (0, 1)
    assert total.sum_gaps["amt"] == "0.00" and not total.passed


def test_c01_null_keys_count_as_one_value(duck):
    duck.execute("CREATE TABLE s (region VARCHAR, sku VARCHAR, qty INT); CREATE TABLE t (region VARCHAR, sku VARCHAR, qty INT)")
    duck.execute("INSERT INTO s VALUES ('EU', 'A', 1), (NULL, 'B', 2)")
    duck.execute("INSERT INTO t VALUES ('EU', 'A', 1), (NULL, 'B', 2), (NULL, 'B', 2)")
    (total,) = reconcile(duck, duck, "s", "t", [], ["qty"], key_columns=["region", "sku"]).slices
    assert (total.source_keys, total.target_keys) == (2, 2)
    assert (total.source_duplicate_keys, total.target_duplicate_keys) == (0, 1)  # (NULL, 'B') twice on target
    assert not total.passed
