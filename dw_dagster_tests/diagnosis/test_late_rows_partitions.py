"""Issue 14 kind 5: the late-rows cause counts gaps, late rows and the window per partition key of
the asset's own PartitionsDefinition (hourly, zoned days, the fall-back hour), never per UTC date.

Each scenario is built from the definition itself: every partition is loaded over its time window
as naive UTC (what :func:`dw_dagster.core.windows.partition_window_utc` gives the load code), a few rows arrive
after their partition's load read the source, and the target lacks exactly those rows.
"""

from __future__ import annotations

import datetime as dt
from urllib.parse import quote

import dagster as dg
import pytest

from dw_dagster.core.windows import partition_window_utc
from dw_dagster.diagnosis.causes.watermark import PartitionLoad, diagnose_late_rows
from dw_dagster_tests.conftest import POSTGRES_URL


def _scenario(db, schema: str, pdef, keys: list[str], late: dict[str, list[float]]):
    """Tables ``{schema}_src.sales`` / ``{schema}_tgt.sales`` and the loads of ``keys``.

    Args:
        late: per partition key, the late rows' positions in its window (0..1 of its length).

    Returns:
        (loads, high-watermark, late rows per key).
    """
    src, tgt = f"{schema}_src", f"{schema}_tgt"
    for s in (src, tgt):
        db.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
        db.execute(f"CREATE SCHEMA {s}")
        db.execute(f"CREATE TABLE {s}.sales (id INTEGER, sold_at TIMESTAMP, posted_at TIMESTAMP)")
    rows, landed, loads, next_id = [], [], [], 1
    for k in keys:
        start, end = partition_window_utc(pdef, k)
        length = end - start
        for frac in (0.1, 0.5, 0.95):  # on time: posted when sold, read by the load at the window's end
            ts = start + length * frac
            rows.append((next_id, ts, ts))
            landed.append(next_id)
            next_id += 1
        for frac in late.get(k, []):  # sold in this window, posted two hours after its load ran
            rows.append((next_id, start + length * frac, end + dt.timedelta(hours=2)))
            next_id += 1
        loads.append(PartitionLoad(k, start, end, source_snapshot_ts=end))
    hwm = max(r[1] for r in rows if r[0] in set(landed))

    def lit(v):
        return f"TIMESTAMP '{v.isoformat(sep=' ')}'"

    db.execute(f"INSERT INTO {src}.sales VALUES " + ", ".join(f"({i}, {lit(a)}, {lit(b)})" for i, a, b in rows))
    db.execute(f"INSERT INTO {tgt}.sales SELECT * FROM {src}.sales WHERE id IN ({', '.join(map(str, landed))})")
    return loads, hwm, {k: len(v) for k, v in late.items()}


def _diagnose(db, schema, loads, hwm, gap):
    return diagnose_late_rows(db, db, source_table=f"{schema}_src.sales", target_table=f"{schema}_tgt.sales",
                              key_column="id", partition_column="sold_at", watermark_column="sold_at",
                              arrival_column="posted_at", loads=loads, high_watermark=hwm, gap_rows=gap)


HOURLY_UTC = dg.HourlyPartitionsDefinition(start_date="2026-03-28-20:00", end_date="2026-03-29-04:00", timezone="UTC")
HOURLY_NY = dg.HourlyPartitionsDefinition(start_date="2026-10-31-22:00", end_date="2026-11-01-05:00",
                                          timezone="America/New_York")
DAILY_LA = dg.DailyPartitionsDefinition(start_date="2026-03-06", end_date="2026-03-11", timezone="America/Los_Angeles")

CASES = {
    # hours around UTC midnight: a UTC date would fold four partitions into one key
    "hourly_utc": (HOURLY_UTC, {"2026-03-28-23:00": [0.3, 0.8], "2026-03-29-00:00": [0.2], "2026-03-29-02:00": [0.6]}),
    # the repeated 01:00 of the fall-back day: the first (EDT) hour and the second (EST) hour
    # are different partitions, each with its own late rows
    "hourly_new_york_fall_back": (HOURLY_NY, {"2026-11-01-01:00": [0.4], "2026-11-01-01:00-0500": [0.2, 0.7, 0.9],
                                              "2026-10-31-23:00": [0.99]}),
    # Pacific days across the spring-forward day (23 hours): evening rows fall on the next UTC date
    "daily_los_angeles_spring_forward": (DAILY_LA, {"2026-03-07": [0.97], "2026-03-08": [0.02, 0.96],
                                                    "2026-03-09": [0.5]}),
}


def _check(db, schema, case):
    pdef, late = CASES[case]
    keys = list(pdef.get_partition_keys())
    loads, hwm, n_late = _scenario(db, schema, pdef, keys, late)
    gap = sum(n_late.values())
    f = _diagnose(db, schema, loads, hwm, gap)
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (gap, 0, 1.0)
    assert f.window == sorted(late)
    assert all(k in keys for k in f.window)  # every key names one of the asset's partitions
    per = {p["partition"]: p for p in f.details["per_partition"]}
    assert set(per) == set(late)
    for k, n in n_late.items():
        assert (per[k]["gap_rows"], per[k]["late_rows"], per[k]["explained_rows"]) == (n, n, n)
        assert (per[k]["source_rows"], per[k]["target_rows"]) == (3 + n, 3)
    # half the late rows landed since: only the rest explain the smaller gap, in their own partitions
    first = sorted(late)[0]
    start, end = partition_window_utc(pdef, first)
    db.execute(f"INSERT INTO {schema}_tgt.sales SELECT * FROM {schema}_src.sales WHERE posted_at > sold_at "
               f"AND sold_at >= TIMESTAMP '{start.isoformat(sep=' ')}' AND sold_at < TIMESTAMP '{end.isoformat(sep=' ')}'")
    g = _diagnose(db, schema, loads, hwm, gap - n_late[first])
    assert g.window == sorted(set(late) - {first})
    assert (g.explained_rows, g.confidence) == (gap - n_late[first], 1.0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_late_rows_per_partition_key_on_duckdb(duck, case):
    _check(duck, "lr", case)


@pytest.mark.parametrize("session_zone", ["UTC", "America/New_York"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_late_rows_per_partition_key_on_postgres(case, session_zone):
    from dw_dagster.databases import SqlAlchemyDatabase

    sep = "&" if "?" in POSTGRES_URL else "?"
    db = SqlAlchemyDatabase(f"{POSTGRES_URL}{sep}options={quote(f'-c TimeZone={session_zone}')}")
    try:
        assert db.fetch_all("SHOW TimeZone")[0][0] == session_zone
    except Exception as e:  # pragma: no cover - CI machines have the server
        pytest.fail(f"PostgreSQL on loopback is required for this test: {e}")
    schema = f"lr_{case[:12]}_{session_zone.split('/')[-1].lower()}"
    try:
        _check(db, schema, case)
    finally:
        for s in (f"{schema}_src", f"{schema}_tgt"):
            db.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
        db.dispose()


def test_partition_windows_as_naive_utc():
    assert partition_window_utc(HOURLY_NY, "2026-11-01-01:00") == (dt.datetime(2026, 11, 1, 5), dt.datetime(2026, 11, 1, 6))
    assert partition_window_utc(HOURLY_NY, "2026-11-01-01:00-0500") == (dt.datetime(2026, 11, 1, 6),
                                                                         dt.datetime(2026, 11, 1, 7))
    start, end = partition_window_utc(DAILY_LA, "2026-03-08")
    assert (start, end - start) == (dt.datetime(2026, 3, 8, 8), dt.timedelta(hours=23))
    with pytest.raises(ValueError):
        partition_window_utc(dg.StaticPartitionsDefinition(["a"]), "a")


@pytest.mark.parametrize("case", sorted(CASES))
def test_late_rows_per_partition_key_across_duckdb_and_postgres(duck, postgres, case):
    """The source in DuckDB, the warehouse table in PostgreSQL: the same answer as in one database."""
    pdef, late = CASES[case]
    keys = list(pdef.get_partition_keys())
    loads, hwm, n_late = _scenario(duck, "lx", pdef, keys, late)
    schema = f"lx_{case[:12]}_tgt"
    postgres.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    postgres.execute(f"CREATE SCHEMA {schema}")
    postgres.execute(f"CREATE TABLE {schema}.sales (id INTEGER, sold_at TIMESTAMP, posted_at TIMESTAMP)")
    landed = duck.fetch_all("SELECT id, sold_at, posted_at FROM lx_tgt.sales ORDER BY id")
    postgres.execute(f"INSERT INTO {schema}.sales VALUES " + ", ".join(
        f"({i}, TIMESTAMP '{a.isoformat(sep=' ')}', TIMESTAMP '{b.isoformat(sep=' ')}')" for i, a, b in landed))
    try:
        gap = sum(n_late.values())
        f = diagnose_late_rows(duck, postgres, source_table="lx_src.sales", target_table=f"{schema}.sales",
                               key_column="id", partition_column="sold_at", watermark_column="sold_at",
                               arrival_column="posted_at", loads=loads, high_watermark=hwm, gap_rows=gap)
        one = _diagnose(duck, "lx", loads, hwm, gap)
        assert (f.explained_rows, f.confidence, f.window) == (gap, 1.0, sorted(late)) == (
            one.explained_rows, one.confidence, one.window)
        assert f.details["per_partition"] == one.details["per_partition"]
    finally:
        postgres.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
