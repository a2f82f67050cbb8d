"""PUBLIC_CASES.md C18: a watermark skips back-dated and tied rows."""

import datetime as dt

from dw_dagster.diagnosis.causes.watermark import PartitionLoad, diagnose_late_rows

T = dt.datetime


def _c18(db):
    db.execute("CREATE SCHEMA src; CREATE SCHEMA tgt")
    db.execute("CREATE TABLE src.orders (id INT, updated_at TIMESTAMP, ingested_at TIMESTAMP)")
    rows = [(i, T(2024, 3, 9, 8 + 4 * (i - 1)), T(2024, 3, 9, 8 + 4 * (i - 1))) for i in range(1, 5)]
    rows += [(5, T(2024, 3, 9, 22), T(2024, 3, 10, 2)), (6, T(2024, 3, 9, 23, 50), T(2024, 3, 9, 23, 50, 5)),
             (7, T(2024, 3, 9, 23, 50), T(2024, 3, 10, 2, 30)), (8, T(2024, 3, 10, 4), T(2024, 3, 10, 4))]
    db.execute("INSERT INTO src.orders VALUES " + ", ".join(f"({i}, TIMESTAMP '{u}', TIMESTAMP '{g}')" for i, u, g in rows))
    # run 1 at 00:05 loaded 1-4 and 6; run 2 at 06:00 read updated_at > 23:50:00 and loaded 8
    db.execute("CREATE TABLE tgt.orders AS SELECT * FROM src.orders WHERE id IN (1, 2, 3, 4, 6, 8)")
    return [
        PartitionLoad("2024-03-09", T(2024, 3, 9), T(2024, 3, 10), source_snapshot_ts=T(2024, 3, 9, 23, 50, 5)),
        PartitionLoad("2024-03-10", T(2024, 3, 10), T(2024, 3, 11), source_snapshot_ts=T(2024, 3, 10, 4)),
    ]


def test_c18_late_and_tied_rows(duck):
    loads = _c18(duck)
    f = diagnose_late_rows(duck, duck, source_table="src.orders", target_table="tgt.orders", key_column="id",
                           partition_column="updated_at", watermark_column="updated_at", arrival_column="ingested_at",
                           loads=loads, high_watermark=T(2024, 3, 9, 23, 50), gap_rows=2)
    assert f.kind == "late_rows_behind_watermark"
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (2, 0, 1.0)
    assert f.window == ["2024-03-09"]
    assert f.details["below_watermark_rows"] == 1 and f.details["tied_with_watermark_rows"] == 1
    assert f.details["min_lookback_hours"] == 4.0  # id 5: 22:00 -> 02:00
    assert f.details["proposed_lookback_hours"] == 24
    sample = next(e for e in f.evidence if "late keys" in e.description)
    assert [(v["key"], v["class"]) for v in sample.values] == [(5, "below"), (7, "tied")]
    assert f.details["sample_present_in_target"] == 0
    assert all(e.sql for e in f.evidence)  # every value comes with the query that produced it


def test_gap_the_cause_does_not_explain_is_reported(duck):
    loads = _c18(duck)
    duck.execute("DELETE FROM tgt.orders WHERE id = 2")  # a row lost for another reason
    f = diagnose_late_rows(duck, duck, source_table="src.orders", target_table="tgt.orders", key_column="id",
                           partition_column="updated_at", watermark_column="updated_at", arrival_column="ingested_at",
                           loads=loads, high_watermark=T(2024, 3, 9, 23, 50), gap_rows=3)
    assert (f.explained_rows, f.unexplained_rows) == (2, 1)
    assert f.confidence == round(2 / 3, 4)


def test_no_late_rows_means_no_confidence(duck):
    loads = _c18(duck)
    duck.execute("INSERT INTO tgt.orders SELECT * FROM src.orders WHERE id IN (5, 7)")
    duck.execute("UPDATE src.orders SET ingested_at = updated_at")
    f = diagnose_late_rows(duck, duck, source_table="src.orders", target_table="tgt.orders", key_column="id",
                           partition_column="updated_at", watermark_column="updated_at", arrival_column="ingested_at",
                           loads=loads, high_watermark=T(2024, 3, 9, 23, 50), gap_rows=0)
    assert f.confidence == 0.0 and f.explained_rows == 0 and f.window == []
