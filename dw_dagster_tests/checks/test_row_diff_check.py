"""build_row_diff_check: one factory call, run through Dagster, in one database and across two."""

import dagster as dg
import pytest

from dw_dagster import DatabaseResource, build_row_diff_check
from dw_dagster.databases import DuckDBDatabase
from dw_dagster.databases.sql import UnsafeIdentifierError


def _tables(db: DuckDBDatabase, source: bool, target: bool) -> None:
    if source:
        db.execute("CREATE TABLE s (id INT, amount DECIMAL(18,2), note VARCHAR)")
        db.execute("INSERT INTO s VALUES (1, 1.00, 'a'), (2, 2.00, 'b'), (3, 3.00, 'c'), (4, 4.00, NULL)")
    if target:
        db.execute("CREATE TABLE t (id INT, amount DECIMAL(18,2), note VARCHAR)")
        db.execute("INSERT INTO t VALUES (1, 1.00, 'a'), (2, 2.01, 'b'), (4, 4.00, ''), (5, 5.00, 'e'), (5, 5.00, 'e')")


def _evaluate(check, resources):
    defs = dg.Definitions(assets=[dg.AssetSpec("t"), dg.AssetSpec("s")], asset_checks=[check], resources=resources,
                          jobs=[dg.define_asset_job("c", selection=dg.AssetSelection.checks(check))])
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("c").execute_in_process(instance=instance)
        (ev,) = result.get_asset_check_evaluations()
    return ev


def _assert_found(ev) -> None:
    assert not ev.passed
    md = {k: v.value for k, v in ev.metadata.items()}
    assert (md["dw/missing"], md["dw/extra"], md["dw/changed"], md["dw/duplicated_target"]) == (1, 1, 2, 1)
    assert md["dw/changed_columns"] == {"amount": 1, "note": 1}
    rows = [(r.data["key"], r.data["status"], r.data["columns"]) for r in md["dw/key_sample"].records]
    assert rows == [("2", "changed", "amount"), ("3", "missing", ""), ("4", "changed", "note"), ("5", "extra", "")]
    assert ev.description == "1 missing, 1 extra, 2 changed (amount ×1, note ×1), 1 key(s) duplicated in the target"


def test_in_one_database(tmp_path):
    db = DuckDBDatabase(tmp_path / "w.duckdb")
    _tables(db, True, True)
    check = build_row_diff_check(asset="t", source_asset="s", source_table="s", target_table="t", key_columns=["id"],
                                 source_resource_key="warehouse")
    ev = _evaluate(check, {"warehouse": DatabaseResource(url=f"duckdb:///{db.path}")})
    _assert_found(ev)
    assert "dw/buckets_compared" not in ev.metadata  # one join, nothing downloaded


def test_across_two_databases(tmp_path):
    a, b = DuckDBDatabase(tmp_path / "a.duckdb"), DuckDBDatabase(tmp_path / "b.duckdb")
    _tables(a, True, False)
    _tables(b, False, True)
    check = build_row_diff_check(asset="t", source_asset="s", source_table="s", target_table="t", key_columns=["id"])
    ev = _evaluate(check, {"source_db": DatabaseResource(url=f"duckdb:///{a.path}"),
                           "warehouse": DatabaseResource(url=f"duckdb:///{b.path}")})
    _assert_found(ev)
    assert ev.metadata["dw/buckets_downloaded"].value >= 1


def test_identical_tables_pass(tmp_path):
    db = DuckDBDatabase(tmp_path / "w.duckdb")
    _tables(db, True, False)
    db.execute("CREATE TABLE t AS SELECT * FROM s")
    check = build_row_diff_check(asset="t", source_asset="s", source_table="s", target_table="t", key_columns=["id"],
                                 source_resource_key="warehouse", blocking=True)
    ev = _evaluate(check, {"warehouse": DatabaseResource(url=f"duckdb:///{db.path}")})
    assert ev.passed and ev.description == "identical"


def test_bad_config_is_refused_when_built():
    with pytest.raises(UnsafeIdentifierError):
        build_row_diff_check(asset="t", source_asset="s", source_table="s", target_table="t`; DROP TABLE s; --",
                             key_columns=["id"])
    with pytest.raises(ValueError, match="key_columns"):
        build_row_diff_check(asset="t", source_asset="s", source_table="s", target_table="t", key_columns=[])
