"""Issue 31 item 1: the dedupe repair's window is the partitions' own, not UTC days.

A daily partition in ``America/New_York`` runs 05:00 to 05:00 UTC in winter (04:00 in summer; the
23- and 25-hour days of the DST changes included): the rows of the New York day 2026-11-02 that were
loaded twice include sales rung up after 19:00 local, already 11-03 in UTC, and exclude those of the
evening before. A ``CAST(ts AS DATE)`` window (UTC days) would dedupe the wrong rows and leave the
late-evening duplicates. Checked on DuckDB and PostgreSQL, on a naive UTC ``TIMESTAMP`` column and an
aware ``TIMESTAMPTZ`` one, and on a ``DATE`` column that holds the New York day itself.

The failure kind from the field: https://github.com/apache/iceberg/pull/1355 (rows of a local day lost
because day partitions were cut at UTC day boundaries: "data loss with day partition" outside UTC).
"""

import types
import uuid

import dagster as dg
import pytest

from dw_dagster.changes.dedupe import dedupe_step, run_dedupe_step

NY = dg.DailyPartitionsDefinition(start_date="2026-10-30", end_date="2026-11-10", timezone="America/New_York")
# (id, UTC instant) — the New York day 2026-11-02 is [11-02 05:00, 11-03 05:00) UTC
ROWS = [(1, "2026-11-02 04:30:00"),  # 11-01 23:30 New York: the evening before, not in the window
        (2, "2026-11-02 05:00:00"),  # 11-02 00:00 New York: the first instant of the day
        (3, "2026-11-02 18:00:00"),
        (4, "2026-11-03 02:00:00"),  # 11-02 21:00 New York, already 11-03 in UTC
        (5, "2026-11-03 05:00:00")]  # 11-03 00:00 New York: the next day
LOADED_TWICE = (1, 2, 3, 4, 5)  # the whole table loaded twice; only the window is replaced


def _run(db, table: str, column_type: str, value_sql) -> dict:
    db.execute(f"DROP TABLE IF EXISTS {table}")
    db.execute(f"CREATE TABLE {table} (id INTEGER, ts {column_type}, amount INTEGER)")
    for _ in range(2):
        for i, ts in ROWS:
            db.execute(f"INSERT INTO {table} VALUES ({i}, {value_sql(ts)}, {i * 10})")
    step = dedupe_step(table=table, key_columns=["id"], partition_column="ts", window=["2026-11-02"],
                       resource_key="warehouse", dialect=db.dialect, partitions_def=NY)
    cs = types.SimpleNamespace(id=f"cs-{uuid.uuid4().hex[:8]}", undo_plan=None)
    out = run_dedupe_step(dg.build_op_context(), cs, step, db)
    counts = dict(db.fetch_all(f"SELECT id, count(*) FROM {table} GROUP BY id"))
    db.execute(f"DROP TABLE {table}")
    return {"result": out, "counts": {int(k): int(v) for k, v in counts.items()}}


@pytest.mark.parametrize("column_type", ["TIMESTAMP", "TIMESTAMPTZ"])
def test_a_new_york_day_is_deduped_on_duckdb(duck, column_type):
    cast = (lambda ts: f"TIMESTAMPTZ '{ts}+00'") if column_type == "TIMESTAMPTZ" else (lambda ts: f"TIMESTAMP '{ts}'")
    got = _run(duck, "main.sales_ny", column_type, cast)
    assert got["counts"] == {1: 2, 2: 1, 3: 1, 4: 1, 5: 2}
    assert (got["result"]["rows_before"], got["result"]["rows_after"], got["result"]["removed_rows"]) == (6, 3, 3)


@pytest.mark.parametrize("column_type", ["TIMESTAMP", "TIMESTAMPTZ"])
def test_a_new_york_day_is_deduped_on_postgres(postgres, column_type):
    cast = (lambda ts: f"TIMESTAMPTZ '{ts}+00'") if column_type == "TIMESTAMPTZ" else (lambda ts: f"TIMESTAMP '{ts}'")
    postgres.execute("SET TIME ZONE 'Asia/Tokyo'")  # the session's zone must not matter
    got = _run(postgres, "public.dw_sales_ny_dedupe", column_type, cast)
    assert got["counts"] == {1: 2, 2: 1, 3: 1, 4: 1, 5: 2}
    assert got["result"]["distinct_keys_before"] == 3


def test_a_date_column_holds_the_new_york_day_itself(duck):
    got = _run(duck, "main.sales_ny_dates", "DATE", lambda ts: "DATE '2026-11-02'" if ts[:10] == "2026-11-02" else "DATE '2026-11-03'")
    # rows 1-3 carry the date 11-02 (the day's own calendar), 4-5 carry 11-03: only 1-3 are the window
    assert got["counts"] == {1: 1, 2: 1, 3: 1, 4: 2, 5: 2}


def test_the_step_records_its_window_and_an_old_step_reads_utc_days(duck):
    step = dedupe_step(table="main.t", key_columns=["id"], partition_column="ts", window=["2026-11-02"],
                       resource_key="warehouse", dialect="duckdb", partitions_def=NY)
    (sl,) = step.spec["filter"]["slices"]
    assert (sl["start"], sl["end"]) == ("2026-11-02T05:00:00", "2026-11-03T05:00:00")
    assert "ts >= CAST('2026-11-02 05:00:00' AS TIMESTAMP)" in step.sql[0] and "AS DATE" not in step.sql[0]
    old = dedupe_step(table="main.t", key_columns=["id"], partition_column="ts", window=["2026-11-02"],
                      resource_key="warehouse", dialect="duckdb")
    (sl,) = old.spec["filter"]["slices"]
    assert (sl["start"], sl["end"]) == ("2026-11-02T00:00:00", "2026-11-03T00:00:00")
