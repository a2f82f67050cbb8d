"""Field cases of the windows a change set reruns (:func:`~dw_dagster.core.windows.split_window`)
on time partitions that are not plain UTC days: weeks, months in a time zone, a compact key
format; against Dagster's own definitions at the same clock, on a real definition."""

import datetime as dt
import zoneinfo

import dagster as dg

from dw_dagster.core.windows import split_window
from dw_dagster_tests.field_cases.kinds import kind

W = "dw_dagster/core/windows.py"
KINDS = [
    kind("win-weekly-day-key", "partitions", "a day that is not a week's start given as a weekly partition key: "
         "outside, naming the week that holds it", "https://github.com/dagster-io/dagster/issues/6057", W,
         "test_a_day_key_for_weekly_partitions_names_the_week_that_holds_it", True),
    kind("win-monthly-zone-open", "partitions", "monthly partitions in a time zone: the current month is deferred "
         "until it ends there, not at UTC midnight", "https://github.com/dagster-io/dagster/issues/14692", W,
         "test_a_month_in_a_time_zone_closes_at_its_local_end", False),
    kind("win-compact-key-format", "partitions", "daily partitions with a compact key format (%Y%m%d): ISO-dashed keys "
         "are outside, never read as the same day", "https://github.com/dagster-io/dagster/issues/13216", W,
         "test_keys_in_another_format_are_outside", False),
]

UTC = dt.timezone.utc
NOW = dt.datetime(2024, 3, 13, 12, 0, tzinfo=UTC)  # a Wednesday


def test_a_day_key_for_weekly_partitions_names_the_week_that_holds_it():
    """dagster #6057 (https://github.com/dagster-io/dagster/issues/6057): weekly partitions run
    Sunday to Sunday whatever ``start_date`` says, so a date that is not a Sunday names no
    partition. Dagster's ``time_window_for_partition_key`` of such a key answers the *next* week;
    the window's refusal repeated it ("its window is partition 2024-03-10") for Tuesday
    2024-03-05, which lies in the week 2024-03-03. Right answer (Python: the Sunday on or before
    the day): outside, naming 2024-03-03; the closed week runs, the open one is deferred."""
    weekly = dg.WeeklyPartitionsDefinition(start_date="2024-02-04")
    s = split_window(weekly, ["2024-03-05", "2024-03-03", "2024-03-10"], 10, now=NOW)
    day = dt.date(2024, 3, 5)
    holder = (day - dt.timedelta(days=(day.weekday() + 1) % 7)).isoformat()
    assert holder == "2024-03-03"
    assert (s.window, s.outside, s.deferred) == (["2024-03-03"], ["2024-03-05"], ["2024-03-10"])
    assert f"partition {holder}" in s.reasons["2024-03-05"]
    assert s.available_at["2024-03-10"] == dt.datetime(2024, 3, 17, tzinfo=UTC)


def test_a_month_in_a_time_zone_closes_at_its_local_end():
    """dagster #14692 (https://github.com/dagster-io/dagster/issues/14692): partitions around the
    newest one misbehave when their window is not over. A monthly definition in New York: at
    noon UTC on 2024-03-13, February has closed, March is still running and must wait until
    midnight of 04-01 *in New York* (04:00 UTC, daylight time), not UTC midnight. Right answer
    (zoneinfo): February runs; March is deferred until 2024-04-01T04:00Z."""
    monthly = dg.MonthlyPartitionsDefinition(start_date="2024-01-01", timezone="America/New_York")
    s = split_window(monthly, ["2024-03-01", "2024-02-01"], 10, now=NOW)
    ends = dt.datetime(2024, 4, 1, tzinfo=zoneinfo.ZoneInfo("America/New_York")).astimezone(UTC)
    assert (s.window, s.deferred) == (["2024-02-01"], ["2024-03-01"])
    assert s.available_at["2024-03-01"] == ends == dt.datetime(2024, 4, 1, 4, 0, tzinfo=UTC)


def test_keys_in_another_format_are_outside():
    """dagster #13216 (https://github.com/dagster-io/dagster/issues/13216): time partitions with
    ``fmt="%Y%m%d"`` (and a cron of weekdays) are common; a key typed in ISO form
    (``2024-03-11``) is not one of them. Right answer (Dagster's own keys at the same clock): the
    compact keys that exist run, the ISO-dashed one is outside ("not a partition key"), today's
    compact key is deferred (it does not exist until the day is over)."""
    daily = dg.DailyPartitionsDefinition(start_date="20240301", fmt="%Y%m%d")
    existing = set(daily.get_partition_keys(current_time=NOW))
    s = split_window(daily, ["20240312", "2024-03-11", "20240313", "20240310"], 10, now=NOW)
    assert s.window == sorted(k for k in ["20240312", "20240310"] if k in existing)
    assert s.outside == ["2024-03-11"] and "not a partition key" in s.reasons["2024-03-11"]
    assert s.deferred == ["20240313"] and "20240313" not in existing
