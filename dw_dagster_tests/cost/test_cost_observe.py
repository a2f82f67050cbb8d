"""The daily cost observation job: numeric per-asset metadata (what the Dagster UI plots) and the day's report."""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.cost.models import Period
from dw_dagster.cost.observe import build_cost_observation_job, combine, latest_reports, report_asset_key
from dw_dagster.cost.sources import CostResource

TODAY = dt.datetime.now(dt.timezone.utc).date()


@dg.asset
def orders() -> None:
    pass


@dg.asset(deps=[orders])
def revenue() -> None:
    pass


@pytest.fixture(scope="module")
def observed():
    job, spec, schedule = build_cost_observation_job(engine="duckdb", start_date=str(TODAY - dt.timedelta(days=3)),
                                                   end_offset=1)
    defs = dg.Definitions(assets=[orders, revenue, spec], jobs=[job], schedules=[schedule],
                          resources={"dw_cost": CostResource()})
    with dg.instance_for_test() as inst:
        runs = [dg.materialize([orders, revenue], instance=inst).run_id, dg.materialize([orders], instance=inst).run_id]
        first = defs.resolve_job_def(c.COST_JOB_NAME).execute_in_process(instance=inst, partition_key=TODAY.isoformat())
        again = defs.resolve_job_def(c.COST_JOB_NAME).execute_in_process(instance=inst, partition_key=TODAY.isoformat())
        yield inst, runs, first, again, schedule


def _asset_obs(inst, key):
    return [r.asset_observation for r in inst.fetch_observations(dg.AssetKey(key), limit=10).records]


def test_each_asset_gets_numeric_cost_metadata(observed):
    inst, runs, first, _, _ = observed
    assert first.success
    (latest, _older) = _asset_obs(inst, "orders")
    md = latest.metadata
    assert isinstance(md[c.COST_SECONDS_KEY], dg.FloatMetadataValue) and md[c.COST_SECONDS_KEY].value > 0
    assert isinstance(md[c.COST_QUERIES_KEY], dg.IntMetadataValue) and md[c.COST_QUERIES_KEY].value == 2  # two steps ran it
    assert md[c.COST_DAY_KEY].value == TODAY.isoformat() and md[c.COST_ENGINE_KEY].value == "duckdb"
    assert _asset_obs(inst, "revenue")[0].metadata[c.COST_QUERIES_KEY].value == 1


def test_the_days_report_is_kept_and_a_rerun_replaces_it(observed):
    inst, runs, first, again, _ = observed
    obs = [r.asset_observation for r in inst.fetch_observations(report_asset_key("duckdb"), limit=10).records]
    assert len(obs) == 2 and obs[0].partition == TODAY.isoformat()
    day = Period(since=TODAY, until=TODAY + dt.timedelta(days=1))
    (report,) = latest_reports(inst, "duckdb", day)
    assert report.reconciled and set(runs) <= set(report.by_run)
    week = combine(latest_reports(inst, "duckdb", Period(since=TODAY - dt.timedelta(days=6), until=day.until)),
                   Period(since=TODAY - dt.timedelta(days=6), until=day.until))
    assert week.metered == pytest.approx(report.metered) and "days without one: 6" in week.notes[0]
    assert combine([], day) is None


def test_the_schedule_reports_yesterday_and_waits_to_be_started(observed):
    *_, schedule = observed
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED and schedule.job_name == c.COST_JOB_NAME
