"""Field cases of changes that are not plain inserts, in the merge load
(:func:`~dw_dagster.pipelines.incremental.load_partition`) and the row diff that diagnoses what it
left behind: two versions of a key in one window, NULL keys, keys changed or deleted at the
source, and a watermark read in a session far from UTC. Sources on DuckDB and PostgreSQL, the
warehouse a DuckDB file."""

import datetime as dt
import urllib.parse

import pytest

from dw_dagster.checks.rowdiff import row_diff_across
from dw_dagster.databases import DuckDBDatabase, SqlAlchemyDatabase
from dw_dagster.pipelines.incremental import IncrementalLoadSpec, LoadError, load_partition
from dw_dagster_tests.conftest import POSTGRES_URL
from dw_dagster_tests.field_cases.conftest import Engine
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.field_cases.tables import load

L = "dw_dagster/pipelines/incremental.py"
KINDS = [
    kind("chg-two-versions-one-window", "changes", "a key updated twice inside one load window (two versions read)",
         "https://github.com/dbt-labs/dbt-core/issues/1556", L, "test_two_versions_of_a_key_keep_the_newest", True),
    kind("chg-null-merge-key", "changes", "source rows with a NULL merge key (each reload would add them again)",
         "https://github.com/dbt-labs/dbt-adapters/issues/159", L, "test_null_merge_key_is_refused_before_writing", True),
    kind("chg-aware-watermark-session", "time", "a TIMESTAMPTZ partition/watermark column read in a non-UTC session",
         "https://github.com/airbytehq/airbyte/issues/83778", L, "test_aware_source_columns_load_the_utc_window", True),
    kind("chg-late-rows-aware-session", "time", "the late-row diagnosis over TIMESTAMPTZ source columns read in a "
         "non-UTC session", "https://github.com/dlt-hub/dlt/issues/2225", "dw_dagster/diagnosis/causes/watermark.py",
         "test_late_row_diagnosis_reads_aware_columns_as_utc", True),
    kind("chg-key-change-and-delete", "changes", "a key changed and a row hard-deleted at the source after a merge load",
         "https://github.com/estuary/connectors/pull/2185", "dw_dagster/checks/rowdiff/hashdiff.py",
         "test_key_change_and_delete_left_behind_are_found_by_the_row_diff", False),
    kind("chg-row-moves-partition", "changes", "an update that moves a row to another partition (an event re-dated "
         "into the next day)", "https://github.com/apache/flink-cdc/pull/4536", L,
         "test_a_row_moved_to_another_partition_is_not_left_in_the_old_one", False),
]

COLS = [("id", "INTEGER"), ("day_ts", "TIMESTAMP"), ("updated_at", "TIMESTAMP"), ("v", "INTEGER")]
DAY = (dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2))


def _spec(source_table, target="w_orders"):
    return IncrementalLoadSpec(source_table=source_table, target_table=target, merge_key="id", partition_column="day_ts",
                               watermark_column="updated_at", columns=["id", "day_ts", "updated_at", "v"])


@pytest.fixture
def warehouse(tmp_path):
    return DuckDBDatabase(tmp_path / "wh.duckdb")


@pytest.mark.parametrize("engine", ["duck", "pg"], indirect=True)
def test_two_versions_of_a_key_keep_the_newest(engine, warehouse):
    """dbt-core #1556 (https://github.com/dbt-labs/dbt-core/issues/1556): a merge whose source
    holds a key twice fails on Snowflake; on DuckDB both rows were inserted, so the target held key
    1 twice ("a reload never duplicates a key" broken). Right answer (Python: newest by
    ``updated_at`` per key): one row per key, the latest version; a reload changes nothing; two
    different versions at the same watermark are refused, nothing written."""
    t1, t2 = dt.datetime(2024, 1, 1, 1), dt.datetime(2024, 1, 1, 2)
    rows = [(1, t1, t1, 10), (1, t1, t2, 11), (2, t1, t1, 20), (2, t1, t1, 20)]
    src = load(engine, "versions", COLS, rows)
    for _ in range(2):
        load_partition(engine.db, warehouse, _spec(src), "2024-01-01", *DAY)
        newest = {}
        for r in rows:
            if r[0] not in newest or r[2] > newest[r[0]][2]:
                newest[r[0]] = r
        assert warehouse.fetch_all("SELECT id, updated_at, v FROM w_orders ORDER BY id") == \
            [(k, r[2], r[3]) for k, r in sorted(newest.items())]
    src = load(engine, "ties", COLS, [(3, t1, t2, 1), (3, t1, t2, 2)])
    with pytest.raises(LoadError, match=r"merge key id 3 has different rows with the same updated_at"):
        load_partition(engine.db, warehouse, _spec(src, "w_ties"), "2024-01-01", *DAY)
    assert warehouse.fetch_all("SELECT count(*) FROM w_ties") == [(0,)]


@pytest.mark.parametrize("engine", ["duck", "pg"], indirect=True)
def test_null_merge_key_is_refused_before_writing(engine, warehouse):
    """dbt-adapters #159 (https://github.com/dbt-labs/dbt-adapters/issues/159): with a NULL in the
    unique key, every incremental run inserted the row again (``NULL = NULL`` is not true). The
    merge load did the same: each reload of an updated NULL-key row added one more. Right answer:
    the load is refused, saying how many rows and which key, and nothing is written."""
    t = dt.datetime(2024, 1, 1, 3)
    src = load(engine, "null_keys", COLS, [(1, t, t, 1), (None, t, t, 9)])
    with pytest.raises(LoadError, match=r"1 source row\(s\) .* NULL merge key id.*nothing was written"):
        load_partition(engine.db, warehouse, _spec(src), "2024-01-01", *DAY)
    assert warehouse.fetch_all("SELECT count(*) FROM w_orders") == [(0,)]


def test_aware_source_columns_load_the_utc_window(pg, warehouse):
    """airbyte #83778 (https://github.com/airbytehq/airbyte/issues/83778): incremental syncs
    silently skipped rows when the source session's time zone was not UTC. The load compared
    TIMESTAMPTZ columns with naive UTC bounds, which PostgreSQL read in the session's zone (here
    America/New_York): partition 2024-01-01 (UTC) missed 00:30Z and took the next day's 00:30Z.
    Right answer (Python): the rows whose instant falls in [2024-01-01, 2024-01-02) UTC."""
    utc = dt.timezone.utc
    instants = {1: dt.datetime(2024, 1, 1, 0, 30, tzinfo=utc), 2: dt.datetime(2024, 1, 1, 23, 30, tzinfo=utc),
                3: dt.datetime(2024, 1, 2, 0, 30, tzinfo=utc)}
    aware = [("id", "INTEGER"), ("day_ts", "TIMESTAMPTZ"), ("updated_at", "TIMESTAMPTZ"), ("v", "INTEGER")]
    src = load(pg, "aware_src", aware, [(k, t, t, k) for k, t in instants.items()])
    ny = SqlAlchemyDatabase(f"{POSTGRES_URL}?options={urllib.parse.quote('-c TimeZone=America/New_York')}")
    try:
        r = load_partition(ny, warehouse, _spec(src), "2024-01-01", *DAY)
    finally:
        ny.dispose()
    lo, hi = (d.replace(tzinfo=utc) for d in DAY)
    want = sorted(k for k, t in instants.items() if lo <= t < hi)
    assert [i for (i,) in warehouse.fetch_all("SELECT id FROM w_orders ORDER BY id")] == want == [1, 2]
    assert r.rows_read == 2


def test_key_change_and_delete_left_behind_are_found_by_the_row_diff(duck, pg, warehouse):
    """estuary/connectors PR #2185 (https://github.com/estuary/connectors/pull/2185): an update that
    changes a row's key, transcribed as an update, leaves "vestigial rows corresponding to old
    primary-key values" in merge-updated destinations; a hard delete is never seen by a watermark
    load either. Right answer (Python: target keys − source keys): the diagnosis's row diff
    (PostgreSQL source against the DuckDB warehouse) reports the old key and the deleted key as
    extra, and the new key's row as equal."""
    t1, t2 = dt.datetime(2024, 1, 1, 1), dt.datetime(2024, 1, 1, 2)
    src = load(pg, "kchg", COLS, [(1, t1, t1, 10), (2, t1, t1, 20), (3, t1, t1, 30)])
    load_partition(pg.db, warehouse, _spec(src), "2024-01-01", *DAY)
    pg.db.execute(f"UPDATE {src} SET id = 4, updated_at = '{t2}' WHERE id = 1")
    pg.db.execute(f"DELETE FROM {src} WHERE id = 2")
    load_partition(pg.db, warehouse, _spec(src), "2024-01-01", *DAY)
    r = row_diff_across(pg.db, warehouse, src, "w_orders", ["id"])
    source = {k for (k,) in pg.db.fetch_all(f"SELECT id FROM {src}")}
    target = {k for (k,) in warehouse.fetch_all("SELECT id FROM w_orders")}
    assert sorted(e.key[0] for e in r.sample if e.status == "extra") == sorted(target - source) == [1, 2]
    assert (r.missing, r.changed) == (len(source - target), 0) == (0, 0)


def test_late_row_diagnosis_reads_aware_columns_as_utc(pg, warehouse):
    """dlt #2225 (https://github.com/dlt-hub/dlt/issues/2225): UTC cursor bounds compared with
    columns of another zone lagged (or read nothing) by the zone's offset. The late-row diagnosis
    compared its naive UTC windows, snapshot and high-watermark with TIMESTAMPTZ source columns,
    which a New York session read five hours off: the late row was not found (explained 0 of 1).
    Right answer (Python over the same instants): the rows at or below the high-watermark that
    arrived after the partition's load read the source, and are missing from the target."""
    from dw_dagster.diagnosis.causes.watermark import PartitionLoad, diagnose_late_rows

    utc = dt.timezone.utc
    T = lambda h, m=0: dt.datetime(2024, 3, 10, h, m, tzinfo=utc)  # noqa: E731
    rows = [(1, T(1), T(1), T(1)), (2, T(2), T(2), T(5)), (3, T(23, 30), T(23, 30), T(23, 30))]
    aware = [("id", "INTEGER"), ("day_ts", "TIMESTAMPTZ"), ("updated_at", "TIMESTAMPTZ"), ("ingested_at", "TIMESTAMPTZ")]
    src = load(pg, "late_src", aware, rows)
    tgt = load(Engine("duckdb", warehouse, ""), "late_tgt", [("id", "INTEGER"), ("day_ts", "TIMESTAMP")], [(1, T(1).replace(tzinfo=None))])
    snapshot, hwm = T(4), T(3)
    ny = SqlAlchemyDatabase(f"{POSTGRES_URL}?options={urllib.parse.quote('-c TimeZone=America/New_York')}")
    try:
        f = diagnose_late_rows(ny, warehouse, source_table=src, target_table=tgt, key_column="id", partition_column="day_ts",
                               watermark_column="updated_at", arrival_column="ingested_at",
                               loads=[PartitionLoad("2024-03-10", dt.datetime(2024, 3, 10), dt.datetime(2024, 3, 11),
                                                    source_snapshot_ts=snapshot.replace(tzinfo=None))],
                               high_watermark=hwm.replace(tzinfo=None), gap_rows=2)
    finally:
        ny.dispose()
    late = [r[0] for r in rows if r[2] <= hwm and r[3] > snapshot and r[0] != 1]
    assert late == [2] and f.explained_rows == len(late) and f.window == ["2024-03-10"]


@pytest.mark.parametrize("engine", ["duck", "pg"], indirect=True)
def test_a_row_moved_to_another_partition_is_not_left_in_the_old_one(engine, warehouse):
    """flink-cdc PR #4536 (https://github.com/apache/flink-cdc/pull/4536): "duplicate rows when an
    UPDATE changes the partition value" — an upsert that only looks in the row's new partition
    leaves the old version in the old one (the key then lives twice). Key 1 is re-dated from 2024-01-01 to 2024-01-02
    and the 02 partition is loaded, then the 01 partition is reloaded. Right answer (Python: the
    source's rows by key): one row per key, key 1 with its new day and value, in every order of
    loads; nothing of the old version left."""
    t0, t1 = dt.datetime(2024, 1, 1, 10), dt.datetime(2024, 1, 2, 12)
    rows = [(1, t0, t0, 1), (2, dt.datetime(2024, 1, 1, 11), dt.datetime(2024, 1, 1, 11), 2)]
    src = load(engine, "moves", COLS, rows)
    load_partition(engine.db, warehouse, _spec(src), "2024-01-01", *DAY)
    engine.db.execute(f"UPDATE {src} SET day_ts = '2024-01-02 09:00:00', updated_at = '{t1}', v = 10 WHERE id = 1")
    days = {"2024-01-01": DAY, "2024-01-02": (DAY[1], DAY[1] + dt.timedelta(days=1))}
    for key in ("2024-01-02", "2024-01-01"):
        load_partition(engine.db, warehouse, _spec(src), key, *days[key])
        want = sorted(engine.db.fetch_all(f"SELECT id, day_ts, v FROM {src}"))
        assert warehouse.fetch_all("SELECT id, day_ts, v FROM w_orders ORDER BY id") == want
    assert want[0] == (1, dt.datetime(2024, 1, 2, 9), 10)
