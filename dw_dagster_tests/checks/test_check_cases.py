"""PUBLIC_CASES C08, C10, C14 and the null-rate, freshness and dead-letter rules, with their exact values."""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.checks.dead_letter import build_dead_letter_check, parked_rows
from dw_dagster.checks.freshness import evaluate_freshness, freshness, last_deadline, to_utc
from dw_dagster.checks.null_rate import null_rates
from dw_dagster.checks.volume import score_days, volume_scores
from dw_dagster.databases import DatabaseResource

D = dt.date
UTC = dt.timezone.utc


def test_c08_value_under_test_never_in_its_baseline():
    counts = {D(2024, 3, i): n for i, n in zip(range(1, 7), [100, 102, 98, 101, 99, 125])}
    (s,) = score_days(counts, [D(2024, 3, 6)], min_band_pct=0)
    assert s.baseline_days == 5 and s.mean == 100.0 and s.stddev == 1.581
    assert s.z_score == pytest.approx(15.81, abs=0.01)
    assert s.status == "high" and not s.passed


def test_c10_empty_day_is_zero_from_the_spine_and_bands_stay_non_negative(duck):
    duck.execute("CREATE TABLE events (d TIMESTAMP)")
    duck.execute("INSERT INTO events SELECT TIMESTAMP '2024-03-01' + to_days(CAST(i // 100 AS INTEGER)) FROM range(700) r(i)")
    scores, _ = volume_scores(duck, "events", "d", evaluate_days=1, as_of=D(2024, 3, 8), training_days=7)
    (s,) = scores
    assert s.rows == 0 and s.status == "no_rows" and not s.passed
    assert s.lower == 98.0  # mean 100, band floor 2 %; never below 0
    noisy = score_days({D(2024, 3, i): n for i, n in zip(range(1, 6), [0, 200, 0, 200, 0])}, [D(2024, 3, 5)])
    assert noisy[0].lower == 0.0


def test_volume_insufficient_history_is_explicit():
    (s,) = score_days({D(2024, 3, 1): 10, D(2024, 3, 2): 11}, [D(2024, 3, 2)])
    assert s.status == "insufficient_history" and not s.passed and s.mean is None


def test_volume_uses_same_weekday_when_history_allows():
    counts = {}
    for i in range(28):
        day = D(2024, 3, 1) + dt.timedelta(days=i)
        counts[day] = 200 if day.weekday() == 5 else 100
    sat = D(2024, 3, 30)
    counts[sat] = 200
    (s,) = score_days(counts, [sat])
    assert s.baseline_days == 4 and s.mean == 200.0 and s.passed


@pytest.mark.parametrize("nulls_today,passed", [(0, True), (5, True), (50, False)], ids=["0pct", "0.5pct", "5pct"])
def test_null_rate_floor(duck, nulls_today, passed):
    duck.execute("CREATE TABLE t (ts TIMESTAMP, c VARCHAR)")
    duck.execute("INSERT INTO t SELECT TIMESTAMP '2024-03-01' + to_days(CAST(i // 1000 AS INTEGER)), 'x' FROM range(7000) r(i)")
    duck.execute(f"INSERT INTO t SELECT TIMESTAMP '2024-03-08 12:00', CASE WHEN i < {nulls_today} THEN NULL ELSE 'x' END FROM range(1000) r(i)")
    (r,), _ = null_rates(duck, "t", ["c"], timestamp_column="ts", baseline_days=7)
    assert r.baseline_pct == 0.0 and r.current_pct == nulls_today / 10
    assert r.passed is passed


def test_null_rate_relative_to_a_nonzero_baseline(duck):
    duck.execute("CREATE TABLE t (ts TIMESTAMP, c VARCHAR)")
    duck.execute("INSERT INTO t SELECT TIMESTAMP '2024-03-01' + to_days(CAST(i // 1000 AS INTEGER)), "
                 "CASE WHEN i % 10 = 0 THEN NULL ELSE 'x' END FROM range(8000) r(i)")  # 10 % every day
    (r,), _ = null_rates(duck, "t", ["c"], timestamp_column="ts", baseline_days=7)
    assert (r.baseline_pct, r.current_pct, r.allowed_pct, r.passed) == (10.0, 10.0, 15.0, True)


@pytest.mark.parametrize("rows", ["empty", "all_null"])
def test_c14_no_timestamp_observed(duck, rows):
    duck.execute("CREATE TABLE t (loaded_at TIMESTAMP)")
    if rows == "all_null":
        duck.execute("INSERT INTO t VALUES (NULL), (NULL), (NULL)")
    r, _ = freshness(duck, "t", "loaded_at", max_lag=dt.timedelta(hours=1))
    assert not r.passed and r.max_timestamp_utc is None and "no timestamp observed" in r.reason


def test_freshness_mixed_nulls_uses_the_non_null_max_and_is_session_zone_independent(duck):
    duck.execute("CREATE TABLE t (loaded_at TIMESTAMPTZ)")
    duck.execute("INSERT INTO t VALUES (NULL), (TIMESTAMPTZ '2024-03-10 12:00:00+00'), (TIMESTAMPTZ '2024-03-10 06:00:00-05')")
    now = dt.datetime(2024, 3, 10, 12, 30, tzinfo=UTC)
    r, _ = freshness(duck, "t", "loaded_at", max_lag=dt.timedelta(hours=1), now_utc=now)
    assert r.max_timestamp_utc == dt.datetime(2024, 3, 10, 12, 0, tzinfo=UTC) and r.passed
    assert to_utc(dt.datetime(2024, 3, 10, 7, 0), "America/New_York") == dt.datetime(2024, 3, 10, 11, 0, tzinfo=UTC)


def test_freshness_deadline_across_daylight_saving():
    # 06:00 New York is 11:00 UTC before the 2024-03-10 change and 10:00 UTC after it
    before = last_deadline(dt.datetime(2024, 3, 9, 12, 0, tzinfo=UTC), dt.time(6), "America/New_York")
    after = last_deadline(dt.datetime(2024, 3, 10, 12, 0, tzinfo=UTC), dt.time(6), "America/New_York")
    assert before == dt.datetime(2024, 3, 9, 11, 0, tzinfo=UTC)
    assert after == dt.datetime(2024, 3, 10, 10, 0, tzinfo=UTC)
    early = last_deadline(dt.datetime(2024, 3, 10, 9, 0, tzinfo=UTC), dt.time(6), "America/New_York")
    assert early == dt.datetime(2024, 3, 9, 11, 0, tzinfo=UTC)  # before today's deadline: yesterday's
    # data up to 04:00 local is required at the deadline (max_lag 2 h)
    r = evaluate_freshness(dt.datetime(2024, 3, 10, 8, 30, tzinfo=UTC), 1, 1, dt.datetime(2024, 3, 10, 12, 0, tzinfo=UTC),
                           dt.timedelta(hours=2), dt.time(6), "America/New_York")
    assert r.passed and r.required_after_utc == dt.datetime(2024, 3, 10, 8, 0, tzinfo=UTC)


def test_dead_letter_counts_by_reason_since(duck):
    duck.execute("CREATE TABLE dlq (order_id INT, parked_at TIMESTAMP, error VARCHAR)")
    duck.execute("INSERT INTO dlq VALUES (1, TIMESTAMP '2024-03-11 09:00', 'old'), "
                 "(2, TIMESTAMP '2024-03-12 10:00', 'missing required field shipping_country'), "
                 "(3, TIMESTAMP '2024-03-12 11:00', 'missing required field shipping_country'), "
                 "(4, TIMESTAMP '2024-03-12 11:30', NULL)")
    reasons, _ = parked_rows(duck, "dlq", "parked_at", "error", dt.datetime(2024, 3, 12))
    assert [(r.reason, r.rows) for r in reasons] == [("missing required field shipping_country", 2), (None, 1)]
    check = build_dead_letter_check(asset="orders", table="dlq", timestamp_column="parked_at", reason_column="error",
                                    since=lambda: dt.datetime(2024, 3, 12, tzinfo=UTC))
    with dg.instance_for_test() as instance:
        job = dg.Definitions(assets=[dg.AssetSpec("orders")], asset_checks=[check],
                             jobs=[dg.define_asset_job("c", selection=dg.AssetSelection.checks(check))],
                             resources={"warehouse": DatabaseResource(url=duck.path)}).resolve_job_def("c")
        (ev,) = job.execute_in_process(instance=instance, raise_on_error=False).get_asset_check_evaluations()
    assert not ev.passed and ev.metadata["dw/parked_rows"].value == 3


def test_volume_mad_is_robust_to_an_earlier_anomaly_in_the_baseline():
    counts = {D(2024, 3, i): n for i, n in zip(range(1, 8), [100, 101, 99, 400, 100, 102, 70])}
    (z,) = score_days(counts, [D(2024, 3, 7)], min_band_pct=0)
    (m,) = score_days(counts, [D(2024, 3, 7)], min_band_pct=0, method="mad")
    assert z.status == "ok"  # the 400 inflates the stddev and hides the drop
    assert m.status == "low" and m.mean == 100.5
    with pytest.raises(ValueError, match="zscore"):
        score_days(counts, [D(2024, 3, 7)], method="ewma")
