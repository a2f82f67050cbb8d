"""Issue 14 kinds 7 and 9: the volume sensor's baseline follows the volume check's rules over
several simulated weeks (same weekday when enough history, the same band floor, never below 0),
and neither the sensor nor the check scores a day still filling as a drop.

The sensor counts yesterday's (or today's) partition of a real DuckDB table every simulated day,
driven by its ``clock``; the table holds a weekly pattern (busy weekdays, quiet weekends).
"""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.checks.volume import build_volume_check, score_against_baseline
from dw_dagster.core import records
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.detection.volume import VolumeTable, build_volume_sensor, days_ago
from dw_dagster.detection.volume.history import VOLUME_PARTITION_KEY, VOLUME_STATUS_KEY, VOLUME_TABLE_KEY
from dw_dagster.testing.local_daemon import LocalSensorDaemon

SENSOR = "dw_volume_sensor"
MONDAY = dt.date(2026, 2, 2)  # a Monday


def weekly(day: dt.date, week: int) -> int:
    """Rows of one day: about 1,000 on weekdays, about 120 on weekends, with a small wobble."""
    base = 120 if day.weekday() >= 5 else 1000
    return base + (week * 7 + day.weekday()) % 5 * (2 if base < 500 else 9)


@pytest.fixture
def wh(tmp_path):
    db = DuckDBDatabase(tmp_path / "warehouse.duckdb")
    db.execute("CREATE SCHEMA pos; CREATE TABLE pos.sales (id BIGINT, sold_at TIMESTAMP)")
    return db


def add_day(db, day: dt.date, rows: int, hours: int = 24) -> None:
    """``rows`` rows spread over the first ``hours`` hours of ``day`` (UTC)."""
    db.execute(f"INSERT INTO pos.sales SELECT range, TIMESTAMP '{day.isoformat()} 00:00:00' + "
               f"INTERVAL (range % {hours * 60}) MINUTE FROM range({rows})")


class Clock:
    def __init__(self, t: dt.datetime) -> None:
        self.t = t

    def __call__(self) -> dt.datetime:
        return self.t


def statuses(instance) -> dict[str, str]:
    out = {}
    for rec in records.iter_observations(instance, dg.AssetKey("sales"), newest_first=False):
        md = rec.asset_observation.metadata
        if VOLUME_TABLE_KEY in md:
            out[md[VOLUME_PARTITION_KEY].value] = md[VOLUME_STATUS_KEY].value
    return out


def run_weeks(db, *, weeks: int, min_same_weekday: int, drop: dict[dt.date, int] | None = None, method="zscore"):
    """One tick per simulated day at 06:00 UTC, counting yesterday; returns {day: status} and incidents."""
    drop = drop or {}
    clock = Clock(dt.datetime.combine(MONDAY, dt.time(6), dt.timezone.utc))
    sensor = build_volume_sensor(tables=[VolumeTable("pos.sales", "sales", partition_column="sold_at")],
                                 databases={"warehouse": db}, min_history=7, history_length=28,
                                 min_same_weekday=min_same_weekday, method=method, clock=clock)
    instance = dg.DagsterInstance.ephemeral()
    daemon = LocalSensorDaemon(dg.Definitions(sensors=[sensor]), instance, log_level="WARNING")
    for i in range(weeks * 7):
        day = MONDAY + dt.timedelta(days=i)
        add_day(db, day, drop.get(day, weekly(day, i // 7)))
        clock.t = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(6), dt.timezone.utc)
        daemon.tick(SENSOR)
    return statuses(instance), records.incidents(instance)


@pytest.mark.parametrize("method", ["zscore", "mad"])
def test_same_weekday_baseline_keeps_quiet_weekends_ok_and_catches_a_weekday_drop(wh, method):
    # week 5: Wednesday at 70 % of its usual count (still far above any weekend)
    wed = MONDAY + dt.timedelta(weeks=4, days=2)
    got, incidents = run_weeks(wh, weeks=5, min_same_weekday=3, drop={wed: 700}, method=method)
    weekends = [d for d in got if dt.date.fromisoformat(d).weekday() >= 5]
    # from the fourth week on every day has three earlier days of its weekday: weekends are scored
    # against weekends (before that, against every day, as the check does)
    assert len(weekends) == 10 and all(got[d] == "ok" for d in weekends[-4:])
    assert got[wed.isoformat()] == "low"
    if method == "zscore":  # (the median of an all-days history flags the early weekends: one incident, still open)
        assert all(got[d] in ("ok", "insufficient_history") for d in weekends)
        assert [i.summary.split(":")[0] for i in incidents] == [f"pos.sales on warehouse, partition sold_at = {wed}"]


def test_an_all_days_baseline_is_what_the_old_rule_gave(wh, tmp_path):
    # the same data with the rule off: with the z-score the weekday drop hides inside the wide
    # all-days band; with the median (MAD) a quiet weekend reads low against a weekday-heavy history
    wed = MONDAY + dt.timedelta(weeks=4, days=2)
    got, incidents = run_weeks(wh, weeks=5, min_same_weekday=0, drop={wed: 700})
    assert got[wed.isoformat()] == "ok" and incidents == []
    other = DuckDBDatabase(tmp_path / "other.duckdb")
    other.execute("CREATE SCHEMA pos; CREATE TABLE pos.sales (id BIGINT, sold_at TIMESTAMP)")
    got, incidents = run_weeks(other, weeks=2, min_same_weekday=0, method="mad")
    assert got[(MONDAY + dt.timedelta(days=12)).isoformat()] == "low"  # the 2nd Saturday
    assert len(incidents) == 1


def test_the_sensor_scores_one_value_as_the_check_does():
    # the floor: a near-constant baseline still has a band of 2 % of its mean; the clamp: never below 0
    s = score_against_baseline(985, [1000, 1000, 1001, 999], min_band_pct=2.0)
    assert (s.lower, s.upper, s.status) == (980.0, 1020.0, "ok")
    wide = score_against_baseline(0, [5, 400, 3, 2], min_band_pct=2.0)
    assert wide.lower == 0.0


def test_today_still_filling_is_not_a_drop_for_the_sensor(wh):
    # three weeks of complete days, each counted at its own 23:59; then today at 09:00 with 9 of
    # its 24 hours loaded
    clock = Clock(dt.datetime.combine(MONDAY, dt.time(23, 59), dt.timezone.utc))
    sensor = build_volume_sensor(tables=[VolumeTable("pos.sales", "sales", partition_column="sold_at", partition=days_ago(0))],
                                 databases={"warehouse": wh}, min_history=7, clock=clock)
    instance = dg.DagsterInstance.ephemeral()
    daemon = LocalSensorDaemon(dg.Definitions(sensors=[sensor]), instance, log_level="WARNING")
    for i in range(21):
        day = MONDAY + dt.timedelta(days=i)
        add_day(wh, day, weekly(day, i // 7))
        clock.t = dt.datetime.combine(day, dt.time(23, 59), dt.timezone.utc)
        daemon.tick(SENSOR)
    today = MONDAY + dt.timedelta(days=21)
    add_day(wh, today, weekly(today, 3) * 9 // 24, hours=9)
    clock.t = dt.datetime.combine(today, dt.time(9), dt.timezone.utc)
    daemon.tick(SENSOR)
    assert statuses(instance)[today.isoformat()] == "filling" and records.incidents(instance) == []
    # the load stopped there: once the day is over (a few stragglers later) the same day is a drop
    wh.execute(f"INSERT INTO pos.sales SELECT range, TIMESTAMP '{today.isoformat()} 22:00:00' FROM range(10)")
    clock.t = dt.datetime.combine(today + dt.timedelta(days=1), dt.time(0, 5), dt.timezone.utc)
    closed = build_volume_sensor(tables=[VolumeTable("pos.sales", "sales", partition_column="sold_at", partition=days_ago(1))],
                                 databases={"warehouse": wh}, min_history=7, clock=clock)
    LocalSensorDaemon(dg.Definitions(sensors=[closed]), instance, log_level="WARNING").tick(SENSOR)
    assert statuses(instance)[today.isoformat()] == "low" and len(records.incidents(instance)) == 1


def _run_check(wh, check):
    defs = dg.Definitions(assets=[dg.AssetSpec("sales")], asset_checks=[check],
                          jobs=[dg.define_asset_job("chk", selection=dg.AssetSelection.checks(check))],
                          resources={"warehouse": DatabaseResource(url=f"duckdb:///{wh.path}")})
    (ev,) = defs.resolve_job_def("chk").execute_in_process(instance=dg.DagsterInstance.ephemeral()).get_asset_check_evaluations()
    return ev, {d["day"]: d["status"] for d in ev.metadata["dw/days_json"].value}


def test_the_volume_check_does_not_score_today_still_filling_as_a_drop(wh):
    for i in range(28):
        day = MONDAY + dt.timedelta(days=i)
        add_day(wh, day, weekly(day, i // 7))
    today = MONDAY + dt.timedelta(days=28)
    add_day(wh, today, 200, hours=5)  # 05:00 on a Monday: 200 rows so far
    clock = Clock(dt.datetime.combine(today, dt.time(5), dt.timezone.utc))
    check = build_volume_check(asset="sales", table="pos.sales", timestamp_column="sold_at", evaluate_days=3, clock=clock)
    ev, days = _run_check(wh, check)
    assert ev.passed and days[today.isoformat()] == "filling" and "still filling" in ev.description
    # the next morning the same day is complete and short: a drop
    clock.t = dt.datetime.combine(today + dt.timedelta(days=1), dt.time(5), dt.timezone.utc)
    ev, days = _run_check(wh, check)
    assert not ev.passed and days[today.isoformat()] == "low"
