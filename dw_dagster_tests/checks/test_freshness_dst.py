"""Issue 14 kind 8: a freshness lag of whole days across daylight-saving changes.

``max_lag`` is elapsed time (24 h is 24 h, also on a 23-hour day); ``max_lag_days`` is calendar
days in the deadline's zone. Read through the real check on DuckDB and on PostgreSQL.
"""

import datetime as dt
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from dw_dagster.checks.freshness import build_freshness_check, calendar_days_before, freshness
from dw_dagster.databases import DatabaseResource

NY = ZoneInfo("America/New_York")
UTC = dt.timezone.utc


def _table(db, schema, newest_utc):
    db.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    db.execute(f"CREATE SCHEMA {schema}")
    db.execute(f"CREATE TABLE {schema}.events (id INTEGER, loaded_at TIMESTAMP)")
    db.execute(f"INSERT INTO {schema}.events VALUES (1, TIMESTAMP '2026-01-01 00:00:00'), "
               f"(2, TIMESTAMP '{newest_utc.replace(tzinfo=None).isoformat(sep=' ')}')")


# (now, newest row, max_lag elapsed verdict, max_lag_days=1 verdict), deadline 06:00 New York
CASES = {
    # the deadline on spring-forward day (a 23-hour day): a calendar day back is 06:00 EST the day
    # before = 11:00 UTC; 24 h back is 10:00 UTC. A row at 10:30 UTC passes 24 h, not one calendar day.
    "spring_forward": (dt.datetime(2026, 3, 8, 12, tzinfo=UTC), dt.datetime(2026, 3, 7, 10, 30, tzinfo=UTC), True, False),
    # the deadline on fall-back day (25 hours): a calendar day back is 06:00 EDT = 10:00 UTC the day
    # before; 24 h back is 11:00 UTC. A row at 10:30 UTC passes one calendar day, not 24 h.
    "fall_back": (dt.datetime(2026, 11, 1, 12, tzinfo=UTC), dt.datetime(2026, 10, 31, 10, 30, tzinfo=UTC), False, True),
    # an ordinary day: both rules agree
    "ordinary": (dt.datetime(2026, 6, 10, 12, tzinfo=UTC), dt.datetime(2026, 6, 9, 10, 30, tzinfo=UTC), True, True),
}


def _verdicts(db, schema, case):
    now, newest, by_elapsed, by_days = CASES[case]
    _table(db, schema, newest)
    a, _ = freshness(db, f"{schema}.events", "loaded_at", max_lag=dt.timedelta(days=1), now_utc=now,
                     deadline=dt.time(6), deadline_timezone="America/New_York")
    b, _ = freshness(db, f"{schema}.events", "loaded_at", max_lag=None, max_lag_days=1, now_utc=now,
                     deadline=dt.time(6), deadline_timezone="America/New_York")
    assert (a.passed, b.passed) == (by_elapsed, by_days)
    deadline = b.deadline_utc.astimezone(NY)
    assert (deadline.hour, b.required_after_utc.astimezone(NY).hour) == (6, 6)  # 06:00 local, both days
    assert b.required_after_utc.astimezone(NY).date() == deadline.date() - dt.timedelta(days=1)
    assert a.deadline_utc - a.required_after_utc == dt.timedelta(hours=24)


@pytest.mark.parametrize("case", sorted(CASES))
def test_calendar_days_and_elapsed_time_on_duckdb(duck, case):
    _verdicts(duck, "fr", case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_calendar_days_and_elapsed_time_on_postgres(postgres, case):
    try:
        _verdicts(postgres, f"fr_{case}", case)
    finally:
        postgres.execute(f"DROP SCHEMA IF EXISTS fr_{case} CASCADE")


def test_calendar_days_before_keeps_the_wall_clock():
    t = dt.datetime(2026, 3, 9, 10, tzinfo=UTC)  # 06:00 EDT, the day after spring-forward
    back = calendar_days_before(t, 1, "America/New_York")
    assert back.astimezone(NY).replace(tzinfo=None) == dt.datetime(2026, 3, 8, 6) and t - back == dt.timedelta(hours=24)
    back2 = calendar_days_before(t, 2, "America/New_York")
    assert t - back2 == dt.timedelta(hours=47)


def test_the_check_says_which_rule_it_applies(duck):
    _table(duck, "fr", dt.datetime(2026, 3, 7, 10, 30, tzinfo=UTC))
    check = build_freshness_check(asset="events", table="fr.events", timestamp_column="loaded_at", max_lag_days=1,
                                  deadline=dt.time(6), deadline_timezone="America/New_York",
                                  now=lambda: dt.datetime(2026, 3, 8, 12, tzinfo=UTC))
    defs = dg.Definitions(assets=[dg.AssetSpec("events")], asset_checks=[check],
                          jobs=[dg.define_asset_job("chk", selection=dg.AssetSelection.checks(check))],
                          resources={"warehouse": DatabaseResource(url=f"duckdb:///{duck.path}")})
    (ev,) = defs.resolve_job_def("chk").execute_in_process(instance=dg.DagsterInstance.ephemeral()).get_asset_check_evaluations()
    assert not ev.passed and ev.metadata["dw/max_lag"].value == "1 calendar day(s) in America/New_York"
    assert "calendar day" in check.check_specs_by_output_name[next(iter(check.check_specs_by_output_name))].description
    with pytest.raises(ValueError, match="max_lag_days"):
        build_freshness_check(asset="events", table="fr.events", timestamp_column="loaded_at")
    with pytest.raises(ValueError, match="whole number"):
        build_freshness_check(asset="events", table="fr.events", timestamp_column="loaded_at", max_lag_days=1.5)
