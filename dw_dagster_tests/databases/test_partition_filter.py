"""The rows of a set of partitions, for every partition shape, on real DuckDB and PostgreSQL tables.

Each case builds the predicate from the asset's ``PartitionsDefinition``
(:mod:`dw_dagster.databases.partitions`), runs it on a table of rows every 37 minutes across the
2026 fall-back change (America/New_York, 1 November), and compares the ids it selects with the
right answer computed here in Python from the rows' instants with ``zoneinfo`` (the hour, the
local day, the Sunday-started week, the month, the static column). The PostgreSQL session runs
in Asia/Tokyo, so an aware column compared with naive literals would be off by nine hours.

Field reports of the same failure kinds:

- a sub-day window widened to whole days (our old ``CAST(col AS DATE) IN (...)``):
  https://github.com/apache/airflow/pull/68718
- day boundaries taken in UTC instead of the partition's zone:
  https://github.com/dbt-labs/dbt-core/pull/12380 (https://github.com/dbt-labs/dbt-core/issues/11578)
- a UTC bound read as a naive timestamp in a non-UTC session:
  https://github.com/dbt-labs/dbt-core/issues/10976
- the repeated hour of a fall-back day, a key of its own: https://github.com/dagster-io/dagster/pull/18022
"""

import datetime as dt
import uuid
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from dw_dagster.databases import DuckDBDatabase, SqlAlchemyDatabase
from dw_dagster.databases.partitions import PartitionError, partition_filter, where_sql
from dw_dagster.repair.undo import partition_checksum
from dw_dagster_tests.conftest import POSTGRES_URL

UTC, NY = dt.timezone.utc, ZoneInfo("America/New_York")
T0 = dt.datetime(2026, 10, 24, 0, 7, tzinfo=UTC)
ROWS = [(i, T0 + dt.timedelta(minutes=37 * i), ["EU", "US", "APAC"][i % 3], f"store-{i % 4}") for i in range(1000)]

HOURLY_NY = dg.HourlyPartitionsDefinition(start_date="2026-10-31-00:00", end_date="2026-11-03-00:00", timezone="America/New_York")
FALL_BACK = [k for k in HOURLY_NY.get_partition_keys() if k.startswith("2026-11-01-0")][:5]  # 00:00 .. 03:00, 01:00 twice
MULTI = dg.MultiPartitionsDefinition({"day": dg.DailyPartitionsDefinition(start_date="2026-10-24", end_date="2026-11-20"),
                                      "region": dg.StaticPartitionsDefinition(["EU", "US", "APAC"])})


def _ny(t):
    return t.astimezone(NY)


def _week(d: dt.date) -> str:
    return (d - dt.timedelta(days=(d.weekday() + 1) % 7)).isoformat()  # the Sunday that starts it


#: (name, definition, keys, column, rows' truth: row -> in the window)
CASES = [
    ("hourly", dg.HourlyPartitionsDefinition(start_date="2026-10-24-00:00"), ["2026-11-03-05:00", "2026-11-03-06:00", "2026-11-04-23:00"],
     "ts", lambda r: r[1].strftime("%Y-%m-%d-%H:00") in ("2026-11-03-05:00", "2026-11-03-06:00", "2026-11-04-23:00")),
    ("hourly-ny-fall-back", HOURLY_NY, FALL_BACK, "ts",
     lambda r: dt.datetime(2026, 11, 1, 4, tzinfo=UTC) <= r[1] < dt.datetime(2026, 11, 1, 9, tzinfo=UTC)),
    ("daily-ny", dg.DailyPartitionsDefinition(start_date="2026-10-24", timezone="America/New_York"), ["2026-11-01", "2026-11-02"],
     "ts", lambda r: _ny(r[1]).date().isoformat() in ("2026-11-01", "2026-11-02")),
    ("daily-ny-aware", dg.DailyPartitionsDefinition(start_date="2026-10-24", timezone="America/New_York"), ["2026-10-31", "2026-11-01"],
     "tstz", lambda r: _ny(r[1]).date().isoformat() in ("2026-10-31", "2026-11-01")),
    ("daily-ny-date-column", dg.DailyPartitionsDefinition(start_date="2026-10-24", timezone="America/New_York"), ["2026-11-01", "2026-11-03"],
     "day_ny", lambda r: _ny(r[1]).date().isoformat() in ("2026-11-01", "2026-11-03")),
    ("daily-kolkata", dg.DailyPartitionsDefinition(start_date="2026-10-24", timezone="Asia/Kolkata"), ["2026-11-02"],
     "ts", lambda r: r[1].astimezone(ZoneInfo("Asia/Kolkata")).date().isoformat() == "2026-11-02"),
    ("weekly", dg.WeeklyPartitionsDefinition(start_date="2026-10-25"), ["2026-11-01", "2026-11-08"],
     "ts", lambda r: _week(r[1].date()) in ("2026-11-01", "2026-11-08")),
    ("monthly", dg.MonthlyPartitionsDefinition(start_date="2026-10-01"), ["2026-10-01"],
     "ts", lambda r: r[1].strftime("%Y-%m") == "2026-10"),
    ("static", dg.StaticPartitionsDefinition(["EU", "US", "APAC"]), ["APAC", "EU"], "region", lambda r: r[2] in ("APAC", "EU")),
    ("dynamic", dg.DynamicPartitionsDefinition(name="stores"), ["store-3"], "store", lambda r: r[3] == "store-3"),
    ("multi", MULTI, ["2026-11-02|EU", "2026-11-03|EU", "2026-11-02|US"],
     "ts", lambda r: (r[1].date().isoformat(), r[2]) in {("2026-11-02", "EU"), ("2026-11-03", "EU"), ("2026-11-02", "US")}),
]


def _load(db, table: str) -> None:
    db.execute(f"CREATE TABLE {table} (id INTEGER, ts TIMESTAMP, tstz TIMESTAMPTZ, day_ny DATE, region VARCHAR(8), store VARCHAR(16))")
    values = ", ".join(f"({i}, '{t:%Y-%m-%d %H:%M:%S}', '{t:%Y-%m-%d %H:%M:%S}+00:00', '{_ny(t).date()}', '{r}', '{s}')"
                       for i, t, r, s in ROWS)
    db.execute(f"INSERT INTO {table} VALUES {values}")


@pytest.fixture(scope="module", params=["duckdb", "postgres"])
def table(request, tmp_path_factory):
    if request.param == "duckdb":
        db = DuckDBDatabase(tmp_path_factory.mktemp("pf") / "wh.duckdb")
        _load(db, "rows_t")
        yield db, "rows_t"
        return
    db = SqlAlchemyDatabase(POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?") + "options=-c%20timezone%3DAsia/Tokyo")
    schema = f"pf_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE SCHEMA {schema}")
    try:
        assert db.fetch_all("SHOW timezone")[0][0] == "Asia/Tokyo"
        _load(db, f"{schema}.rows_t")
        yield db, f"{schema}.rows_t"
    finally:
        db.execute(f"DROP SCHEMA {schema} CASCADE")
        db.dispose()


@pytest.mark.parametrize("name, pdef, keys, column, truth", CASES, ids=[c[0] for c in CASES])
def test_each_shape_selects_exactly_its_rows(table, name, pdef, keys, column, truth):
    db, t = table
    filt = partition_filter(pdef, keys, column)
    got = sorted(r[0] for r in db.fetch_all(f"SELECT id FROM {t} WHERE {where_sql(db, t, filt)}"))
    want = sorted(r[0] for r in ROWS if truth(r))
    assert want and got == want
    rows, checksum = partition_checksum(db, t, column, filt)
    assert rows == len(want) and checksum != 0


def test_neighbouring_hours_are_one_range_and_the_repeated_hour_is_its_own_key():
    filt = partition_filter(HOURLY_NY, FALL_BACK, "ts")
    assert "2026-11-01-01:00-0500" in FALL_BACK and len(filt.slices) == 1
    assert (filt.slices[0].start, filt.slices[0].end) == (dt.datetime(2026, 11, 1, 4), dt.datetime(2026, 11, 1, 9))


def test_the_checksum_is_the_same_number_on_duckdb_and_postgres(tmp_path, postgres):
    """The same rows give the same count and checksum on both engines (md5 of each row's text)."""
    duck = DuckDBDatabase(tmp_path / "c.duckdb")
    schema = f"pf_{uuid.uuid4().hex[:8]}"
    postgres.execute(f"CREATE SCHEMA {schema}")
    try:
        for db, t in ((duck, "c"), (postgres, f"{schema}.c")):
            db.execute(f"CREATE TABLE {t} (id INTEGER, region VARCHAR(8), note VARCHAR(8))")
            db.execute(f"INSERT INTO {t} VALUES (1, 'EU', 'a'), (2, 'EU', NULL), (3, 'US', ''), (4, 'EU', 'b')")
        filt = partition_filter(dg.StaticPartitionsDefinition(["EU", "US"]), ["EU"], "region")
        assert partition_checksum(duck, "c", "region", filt) == partition_checksum(postgres, f"{schema}.c", "region", filt)
        assert partition_checksum(duck, "c", "region", filt)[0] == 3
    finally:
        postgres.execute(f"DROP SCHEMA {schema} CASCADE")


def test_bad_input_gets_a_clear_error(tmp_path):
    """The issue's own report: an hourly key read as a date (``date.fromisoformat('2026-12-05-08:00')``)."""
    daily = dg.DailyPartitionsDefinition(start_date="2026-11-01")
    with pytest.raises(PartitionError, match="'2026-12-05-08:00' is not a partition key of this DailyPartitionsDefinition"):
        partition_filter(daily, ["2026-12-05-08:00"], "ts")
    with pytest.raises(PartitionError, match="at least one partition key"):
        partition_filter(daily, [], "ts")
    db = DuckDBDatabase(tmp_path / "d.duckdb")
    db.execute("CREATE TABLE d (day DATE)")
    hourly = partition_filter(dg.HourlyPartitionsDefinition(start_date="2026-11-01-00:00"), ["2026-11-02-05:00"], "day")
    with pytest.raises(PartitionError, match="a DATE column holds whole days only"):
        where_sql(db, "d", hourly)
    with pytest.raises(PartitionError, match="column nope is not in d"):
        where_sql(db, "d", partition_filter(daily, ["2026-11-02"], "nope"))


def test_the_docs_snippet_names_the_rows_of_a_day_x_region_partition():
    """docs/snippets/checks/partition_shapes.py: the New York fall-back day is 25 UTC hours, AND its region."""
    import runpy
    from pathlib import Path

    ns = runpy.run_path(str(Path(__file__).resolve().parents[2] / "docs" / "snippets" / "checks" / "partition_shapes.py"))
    assert ns["WHERE"] == ("sale_ts >= CAST('2026-11-01 04:00:00' AS TIMESTAMP) AND sale_ts < CAST('2026-11-02 05:00:00' "
                           "AS TIMESTAMP) AND region = 'US'")
    assert ns["sales"].partitions_def is ns["PARTITIONS"]


@pytest.mark.parametrize("engine", ["duckdb", "postgres"])
def test_snapshot_and_restore_put_back_exactly_an_hourly_window(engine, tmp_path, postgres):
    """The undo's own stages on each engine: keep two New York hours (one of them the repeated
    fall-back hour), change rows inside and outside them, restore: the window is as kept, the rows
    outside keep their change."""
    from dw_dagster.core.models import UndoPlan
    from dw_dagster.repair.undo import restore_partitions, snapshot_partitions

    schema = f"pf_{uuid.uuid4().hex[:8]}"
    db, t = (DuckDBDatabase(tmp_path / "u.duckdb"), "u") if engine == "duckdb" else (postgres, f"{schema}.u")
    if engine == "postgres":
        db.execute(f"CREATE SCHEMA {schema}")
    try:
        _load(db, t)
        keys = FALL_BACK[1:3]  # 01:00 and 01:00-0500: 05:00Z..07:00Z
        plan = UndoPlan(resource_key="warehouse", table=t, partition_column="ts", window=keys)
        filt = partition_filter(HOURLY_NY, keys, "ts")
        kept = db.fetch_all(f"SELECT id, region FROM {t} ORDER BY id")
        snap = snapshot_partitions(db, plan, "cs-hourly", "v1", filt)
        inside = [r[0] for r in ROWS if dt.datetime(2026, 11, 1, 5, tzinfo=UTC) <= r[1] < dt.datetime(2026, 11, 1, 7, tzinfo=UTC)]
        assert snap["rows"] == len(inside) == 3
        db.execute(f"UPDATE {t} SET region = 'XX' WHERE id IN ({inside[0]}, 1, 2)")  # a repair touching the window, and more
        db.execute(f"DELETE FROM {t} WHERE id = {inside[1]}")
        restore_partitions(db, plan, snap)
        assert db.fetch_all(f"SELECT id, region FROM {t} ORDER BY id") == [(i, "XX" if i in (1, 2) else r) for i, r in kept]
    finally:
        if engine == "postgres":
            db.execute(f"DROP SCHEMA {schema} CASCADE; DROP TABLE IF EXISTS dw_undo.{schema}__u__cs_hourly_v1")
