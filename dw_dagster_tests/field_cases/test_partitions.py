"""Field cases of partitions beyond one time dimension and windows still open: which partitions
a change set may rerun now (:func:`~dw_dagster.core.windows.split_window`) and the one run that
reruns them (:func:`~dw_dagster.core.windows.window_run_request`), on real Dagster definitions
and a real (ephemeral) instance."""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.core.windows import RANGE_END_TAG, RANGE_START_TAG, split_window, window_run_request
from dw_dagster_tests.field_cases.kinds import kind

W = "dw_dagster/core/windows.py"
KINDS = [
    kind("part-multi-open-day", "partitions", "date × region partitions: today's (still open) and tomorrow's keys",
         "https://github.com/dagster-io/dagster/pull/13432", W, "test_multi_partition_keys_of_open_or_future_days_are_deferred",
         True),
    kind("part-multi-range-rectangle", "partitions", "one run over date × region keys that are not a full rectangle",
         "https://github.com/dagster-io/dagster/issues/28861", W,
         "test_one_run_over_multi_keys_never_covers_unapproved_partitions", True),
    kind("part-dynamic-needs-instance", "partitions", "dynamic partitions read without the instance",
         "https://github.com/dagster-io/dagster/issues/20959", W, "test_dynamic_partitions_need_the_instance", True),
    kind("part-end-offset-open", "partitions", "a daily definition with end_offset=1: today's partition exists but is open",
         "https://github.com/dagster-io/dagster/issues/14692", W, "test_end_offset_partition_in_progress_is_deferred", False),
    kind("part-dst-skipped-hour", "time", "an hourly key in the hour a spring-forward skips",
         "https://github.com/timescale/timescaledb/issues/9136", W, "test_hour_skipped_by_dst_is_not_invented", False),
]
KINDS[1]["handled"] = f"{W}, dw_dagster/repair/sensor.py"

UTC = dt.timezone.utc
NOW = dt.datetime(2024, 3, 10, 12, 0, tzinfo=UTC)
MULTI = dg.MultiPartitionsDefinition({"date": dg.DailyPartitionsDefinition(start_date="2024-03-01"),
                                      "region": dg.StaticPartitionsDefinition(["eu", "us"])})


def test_multi_partition_keys_of_open_or_future_days_are_deferred():
    """dagster PR #13432 (https://github.com/dagster-io/dagster/pull/13432): multi-partitioned
    assets with a time dimension must be limited to the time windows that exist, as a
    time-partitioned asset is. The window treated ``date|region`` keys as plain names: today's
    (open) and tomorrow's (not created) keys went into the rerun window. Right answer (Dagster's
    own daily definition at the same clock): only closed days run; open/future ones are deferred
    with when they close; an unknown region or a day before the start is outside."""
    wanted = ["2024-03-10|us", "2024-03-09|us", "2024-03-11|eu", "2024-02-01|us", "2024-03-09|xx", "bad"]
    s = split_window(MULTI, wanted, 10, now=NOW)
    daily = MULTI.time_window_dimension.partitions_def
    closed = {k for k in daily.get_partition_keys(current_time=NOW) if daily.time_window_for_partition_key(k).end <= NOW}
    assert s.window == [k for k in wanted if k.split("|")[0] in closed and k.endswith(("|eu", "|us"))] == ["2024-03-09|us"]
    assert sorted(s.deferred) == ["2024-03-10|us", "2024-03-11|eu"]
    assert s.available_at["2024-03-10|us"] == dt.datetime(2024, 3, 11, tzinfo=UTC)
    assert sorted(s.outside) == ["2024-02-01|us", "2024-03-09|xx", "bad"]
    assert "region 'xx'" in s.reasons["2024-03-09|xx"]


def test_one_run_over_multi_keys_never_covers_unapproved_partitions():
    """dagster #28861 (https://github.com/dagster-io/dagster/issues/28861): a single-run backfill
    of a multi-partitioned asset does not get the partition set the user selected. Dagster reads
    a range of ``date|region`` keys as a rectangle, so one run over ``03-08|eu`` .. ``03-09|us``
    also rebuilds ``03-08|us`` and ``03-09|eu``. Right answer: refused, naming those partitions;
    a full rectangle is one run."""
    with pytest.raises(ValueError, match=r"would also run 2 partition\(s\) not in the window \(2024-03-08\|us, 2024-03-09\|eu\)"):
        window_run_request(run_key="k", assets=[dg.AssetKey("a")], partition_keys=["2024-03-09|us", "2024-03-08|eu"],
                           partitions_def=MULTI)
    with pytest.raises(ValueError, match="pass the asset's partitions_def"):
        window_run_request(run_key="k", assets=[dg.AssetKey("a")], partition_keys=["2024-03-09|us"])
    full = ["2024-03-08|eu", "2024-03-08|us", "2024-03-09|eu", "2024-03-09|us"]
    r = window_run_request(run_key="k", assets=[dg.AssetKey("a")], partition_keys=full, partitions_def=MULTI)
    covered = MULTI.get_partition_keys_in_range(dg.PartitionKeyRange(r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]))
    assert sorted(covered) == full


def test_dynamic_partitions_need_the_instance():
    """dagster #20959 (https://github.com/dagster-io/dagster/issues/20959): dynamic partitions
    read without the instance fail with "The instance is not available to load partitions", which
    names neither the cause nor the fix. Right answer: without the instance a refusal that says to
    pass it; with it, the instance's partitions are the window (a key it does not hold is outside)."""
    tenants = dg.DynamicPartitionsDefinition(name="tenants")
    with pytest.raises(ValueError, match="dynamic partitions: pass the Dagster instance"):
        split_window(tenants, ["acme"], 10, now=NOW)
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("tenants", ["acme", "globex"])
        s = split_window(tenants, ["globex", "acme", "initech"], 10, now=NOW, instance=instance)
        assert (s.window, s.outside) == (sorted(set(instance.get_dynamic_partitions("tenants")) & {"globex", "acme"}),
                                         ["initech"])


def test_end_offset_partition_in_progress_is_deferred():
    """dagster #14692 (https://github.com/dagster-io/dagster/issues/14692): daily partitions with
    an end offset misbehave around the newest partition. With ``end_offset=1`` today's partition
    exists at noon but its day is not over. Right answer: deferred "still in progress" until
    midnight; yesterday runs."""
    daily = dg.DailyPartitionsDefinition(start_date="2024-03-01", end_offset=1)
    assert "2024-03-10" in daily.get_partition_keys(current_time=NOW)
    s = split_window(daily, ["2024-03-10", "2024-03-09"], 10, now=NOW)
    assert (s.window, s.deferred, s.reasons["2024-03-10"]) == (["2024-03-09"], ["2024-03-10"], "still in progress")
    assert s.available_at["2024-03-10"] == daily.time_window_for_partition_key("2024-03-10").end.astimezone(UTC)


def test_hour_skipped_by_dst_is_not_invented():
    """timescaledb #9136 (https://github.com/timescale/timescaledb/issues/9136): hourly buckets
    around a DST change put timestamps in the wrong bucket. On 2024-03-10 New York skips 02:00.
    Right answer: the key ``2024-03-10-02:00`` is outside (naming the partition that holds that
    instant), never invented; its neighbours run."""
    hourly = dg.HourlyPartitionsDefinition(start_date="2024-03-09-00:00", timezone="America/New_York")
    s = split_window(hourly, ["2024-03-10-01:00", "2024-03-10-02:00", "2024-03-10-03:00"], 10, now=NOW)
    assert "2024-03-10-02:00" not in hourly.get_partition_keys(current_time=NOW)
    assert (s.window, s.outside) == (["2024-03-10-01:00", "2024-03-10-03:00"], ["2024-03-10-02:00"])
    assert "2024-03-10-03:00" in s.reasons["2024-03-10-02:00"]
