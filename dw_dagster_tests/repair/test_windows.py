"""Windows are bounded: capped per domain; partitions that do not exist yet are deferred, those
outside the definition reported; nothing is dropped or invented."""

import datetime as dt

import dagster as dg

from dw_dagster.core.windows import bound_window, split_window


def test_open_ended_daily_partitions():
    today = dt.datetime.now(dt.timezone.utc).date()
    daily = dg.DailyPartitionsDefinition(start_date=(today - dt.timedelta(days=10)).isoformat())
    days = [(today - dt.timedelta(days=i)).isoformat() for i in (3, 2, 1)]
    future = [(today + dt.timedelta(days=i)).isoformat() for i in (0, 5)]
    before_start = (today - dt.timedelta(days=40)).isoformat()
    s = split_window(daily, [*days, *future, before_start, "not-a-date", days[0]], max_partitions=2)
    assert s.window == days[:2] and s.over == days[2:]
    assert s.deferred == sorted(future) and s.outside == sorted([before_start, "not-a-date"])
    assert sorted(s.window + s.over + s.deferred + s.outside) == sorted(set([*days, *future, before_start, "not-a-date"]))


def test_closed_definition_has_nothing_to_defer():
    daily = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-29")
    s = split_window(daily, ["2026-11-28", "2026-11-29", "2026-12-05"], 7)
    assert s.window == ["2026-11-28"] and s.deferred == [] and s.outside == ["2026-11-29", "2026-12-05"]
    assert bound_window(daily, ["2026-11-28", "2026-12-05"], 7) == (["2026-11-28"], ["2026-12-05"], [])


def test_static_partitions():
    static = dg.StaticPartitionsDefinition(["eu", "us"])
    s = split_window(static, ["us", "apac"], 7)
    assert (s.window, s.outside, s.deferred) == (["us"], ["apac"], [])


def test_a_window_run_spans_its_keys_in_the_definitions_order():
    """Static keys are not alphabetical: ``US, EU, APAC`` run as the range US..EU, never EU..US
    (an empty or reversed range in Dagster's order); time keys keep their order either way."""
    from dw_dagster.core.windows import RANGE_END_TAG, RANGE_START_TAG, window_run_request

    regions = dg.StaticPartitionsDefinition(["US", "EU", "APAC"])
    r = window_run_request(run_key="k", assets=[dg.AssetKey("a")], partition_keys=["EU", "US"],
                           ordered_keys=regions.get_partition_keys())
    assert (r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) == ("US", "EU")
    hourly = dg.HourlyPartitionsDefinition(start_date="2026-10-31-00:00", end_date="2026-11-02-00:00", timezone="America/New_York")
    keys = [k for k in hourly.get_partition_keys() if k.startswith("2026-11-01-01")]  # 01:00 and the repeated 01:00-0500
    r = window_run_request(run_key="k", assets=[dg.AssetKey("a")], partition_keys=keys[::-1], ordered_keys=hourly.get_partition_keys())
    assert (r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) == ("2026-11-01-01:00", "2026-11-01-01:00-0500")
