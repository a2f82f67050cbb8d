"""Duplicate load: merge-key violations per day, partitions loaded twice, the negative gap they explain."""

import datetime as dt

import dagster as dg

from dw_dagster.diagnosis.causes.duplicates import diagnose_duplicates, partition_load_history


def _orders(db):
    db.execute("CREATE TABLE src (id INT, d TIMESTAMP, amt DECIMAL(18,2))")
    db.execute("INSERT INTO src SELECT i, TIMESTAMP '2024-03-01 08:00:00' + INTERVAL ((i - 1) // 5) DAY, 10.00 "
               "FROM range(1, 16) t(i)")  # 5 rows per day, 03-01..03-03
    db.execute("CREATE TABLE tgt AS SELECT * FROM src")


def test_partition_appended_twice_explains_the_negative_gap(duck):
    _orders(duck)
    duck.execute("INSERT INTO tgt SELECT * FROM src WHERE d >= TIMESTAMP '2024-03-02' AND d < TIMESTAMP '2024-03-03'")
    f = diagnose_duplicates(duck, target_table="tgt", key_columns=["id"], partition_column="d", gap_rows=-5)
    assert f.kind == "duplicate_load" and f.details["direction"] == "surplus"
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (5, 0, 1.0)
    assert f.window == ["2024-03-02"]
    assert f.details["per_partition"] == [{"partition": "2024-03-02", "gap_rows": -5, "explained_rows": 5, "duplicate_keys": 5}]
    assert f.evidence[0].values == [{"partition": "2024-03-02", "duplicate_keys": 5, "surplus_rows": 5, "max_copies": 2}]
    assert [s["key"] for s in f.details["sample"]] == [[6], [7], [8], [9], [10]]
    # more extra rows than duplicates: the rest stays unexplained
    g = diagnose_duplicates(duck, target_table="tgt", key_columns=["id"], partition_column="d", gap_rows=-8)
    assert (g.explained_rows, g.unexplained_rows) == (5, 3) and g.confidence == round(5 / 8, 4)


def test_no_duplicates_is_not_this_cause(duck):
    _orders(duck)
    f = diagnose_duplicates(duck, target_table="tgt", key_columns=["id"], partition_column="d", gap_rows=-2)
    assert (f.explained_rows, f.unexplained_rows, f.confidence, f.window) == (0, 2, 0.0, [])
    assert "stay unexplained" in f.summary
    short = diagnose_duplicates(duck, target_table="tgt", key_columns=["id"], gap_rows=4)
    assert (short.explained_rows, short.unexplained_rows, short.confidence) == (0, 4, 0.0)
    assert "no duplicate load" in short.summary


def test_duplicates_that_hide_missing_rows(duck):
    """C07: keys 1,2,3,3,4 against 1..5 — counts agree, yet 5 is missing and 3 is doubled."""
    duck.execute("CREATE TABLE t7 (k INT, amt DECIMAL(18,2))")
    duck.execute("INSERT INTO t7 VALUES (1, 10), (2, 10), (3, 10), (3, 10), (4, 10)")
    f = diagnose_duplicates(duck, target_table="t7", key_columns=["k"], gap_rows=0)
    assert f.explained_rows == 0 and f.details["masked_missing_rows"] == 1
    assert "1 row(s) are really missing, not 0" in f.summary
    assert f.details["sample"] == [{"key": [3], "copies": 2}]


def test_null_key_counts_as_a_value(duck):
    duck.execute("CREATE TABLE tn (region VARCHAR, sku VARCHAR)")
    duck.execute("INSERT INTO tn VALUES ('EU', 'A'), (NULL, 'B'), (NULL, 'B')")  # C01 variant: one bad MERGE
    f = diagnose_duplicates(duck, target_table="tn", key_columns=["region", "sku"], gap_rows=-1)
    assert f.explained_rows == 1 and f.details["sample"] == [{"key": [None, "B"], "copies": 2}]


def test_partition_loaded_twice_from_the_event_log(duck):
    _orders(duck)
    duck.execute("INSERT INTO tgt SELECT * FROM src WHERE d >= TIMESTAMP '2024-03-02' AND d < TIMESTAMP '2024-03-03'")

    def load(pk, inserted):
        return dg.AssetMaterialization("orders", partition=pk, metadata={
            "dw/loads": dg.MetadataValue.json({pk: {"rows_read": 5, "rows_inserted": inserted, "rows_updated": 5 - inserted}})})

    with dg.instance_for_test() as instance:
        for pk in ("2024-03-01", "2024-03-02", "2024-03-03"):
            instance.report_runless_asset_event(load(pk, 5))
        instance.report_runless_asset_event(load("2024-03-01", 0))  # a merge rerun: nothing inserted
        instance.report_runless_asset_event(load("2024-03-02", 5))  # an append rerun: inserted again
        hist = partition_load_history(instance, dg.AssetKey("orders"))
        assert [m["rows_inserted"] for m in hist["2024-03-02"]] == [5, 5]
        f = diagnose_duplicates(duck, target_table="tgt", key_columns=["id"], partition_column="d", gap_rows=-5,
                                instance=instance, asset_key=dg.AssetKey("orders"),
                                window=(dt.datetime(2024, 3, 1), dt.datetime(2024, 3, 4)))
        (dl,) = f.details["double_loads"]
        assert dl["partition"] == "2024-03-02" and dl["surplus_rows"] == 5 and dl["rows_inserted_by_later_loads"] == 5
        assert "were loaded more than once" in f.summary
        log = next(e for e in f.evidence if e.database == "dagster:event_log")
        assert log.values["partitions_materialized_more_than_once"] == ["2024-03-01", "2024-03-02"]
