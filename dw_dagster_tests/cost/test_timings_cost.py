"""Execution seconds for DuckDB and engines without billing: Dagster step timings and dbt node timings.

The dbt-like asset below records what dagster-dbt records on a node's materialization and test
evaluation (``unique_id``, ``invocation_id``, ``Execution Duration`` from dbt's run_results), so the
report reads them as it reads dagster-dbt's (the store-sales demo runs real dbt; its receipt test
covers that path).
"""

import datetime as dt
import json
import time

import dagster as dg
import pytest

from dw_dagster.cost.models import Period
from dw_dagster.cost.timings import DagsterTimingCost

INVOCATION = "0f3c9d2e-1111-4a2b-9c8d-7e6f5a4b3c2d"


@dg.asset
def load() -> None:
    time.sleep(0.2)


@dg.multi_asset(specs=[dg.AssetSpec("orders"), dg.AssetSpec("customers")],
                check_specs=[dg.AssetCheckSpec("not_null_orders_order_id", asset="orders")])
def dbt_like():
    time.sleep(0.1)
    for key, node, secs in (("orders", "model.shop.orders", 0.05), ("customers", "model.shop.customers", 0.03)):
        yield dg.MaterializeResult(asset_key=key, metadata={"unique_id": node, "invocation_id": INVOCATION,
                                                            "Execution Duration": secs})
    yield dg.AssetCheckResult(asset_key="orders", check_name="not_null_orders_order_id", passed=True,
                              metadata={"unique_id": "test.shop.not_null_orders_order_id.1a2b3",
                                        "invocation_id": INVOCATION, "Execution Duration": 0.02})


@pytest.fixture(scope="module")
def instance():
    with dg.instance_for_test() as inst:
        runs = [dg.materialize([load], instance=inst).run_id, dg.materialize([dbt_like], instance=inst).run_id]
        yield inst, runs


def _today():
    today = dt.datetime.now(dt.timezone.utc).date()
    return Period(since=today, until=today + dt.timedelta(days=1))


def _step_seconds(inst, run_id):
    return {s.step_key: s.end_time - s.start_time for s in inst.get_run_step_stats(run_id)}


def test_seconds_per_node_asset_and_run(instance):
    inst, (load_run, dbt_run) = instance
    r = DagsterTimingCost(inst).report(_today())
    load_s, dbt_s = _step_seconds(inst, load_run)["load"], _step_seconds(inst, dbt_run)["dbt_like"]
    assert r.unit == "seconds" and r.engine == "duckdb"
    assert r.metered == pytest.approx(load_s + dbt_s, abs=1e-9)
    assert r.by_model == pytest.approx({"model.shop.orders": 0.05, "model.shop.customers": 0.03,
                                        "test.shop.not_null_orders_order_id.1a2b3": 0.02})
    rest = dbt_s - 0.10  # dbt start-up and the asset's own Python, split over the step's two assets
    assert r.by_asset["load"] == pytest.approx(load_s)
    assert r.by_asset["orders"] == pytest.approx(0.05 + 0.02 + rest / 2)
    assert r.by_asset["customers"] == pytest.approx(0.03 + rest / 2)
    assert r.by_run == pytest.approx({load_run: load_s, dbt_run: dbt_s})
    assert r.reconciled and r.unattributed == 0 and r.idle == 0
    assert r.queries_by["model"]["model.shop.orders"] == 1


def test_run_results_outside_dagster_count_once(instance, tmp_path):
    inst, _ = instance
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"metadata": {"invocation_id": "inv-outside"}, "results": [
        {"unique_id": "model.shop.orders", "execution_time": 1.5, "status": "success"},
        {"unique_id": "test.shop.unique_orders_order_id.9f8e7", "execution_time": 0.25, "status": "pass"}]}))
    again = tmp_path / "again.json"  # the invocation the Dagster run already recorded: not counted twice
    again.write_text(json.dumps({"metadata": {"invocation_id": INVOCATION},
                                 "results": [{"unique_id": "model.shop.orders", "execution_time": 99.0}]}))
    base = DagsterTimingCost(inst).report(_today())
    r = DagsterTimingCost(inst, run_results=[outside, again], node_assets={"model.shop.orders": "orders"}).report(_today())
    assert r.metered == pytest.approx(base.metered + 1.75)
    assert r.by_model["model.shop.orders"] == pytest.approx(0.05 + 1.5)
    assert r.by_asset["orders"] == pytest.approx(base.by_asset["orders"] + 1.5)
    assert r.reconciled


def test_a_bad_run_results_file_is_named(instance, tmp_path):
    from dw_dagster.cost.models import CostError

    bad = tmp_path / "run_results.json"
    bad.write_text("{}")
    with pytest.raises(CostError, match="run_results.json"):
        DagsterTimingCost(instance[0], run_results=[bad]).report(_today())


def test_a_period_without_runs_is_zero_and_reconciled(instance):
    r = DagsterTimingCost(instance[0]).report(Period(since=dt.date(2020, 1, 1), until=dt.date(2020, 1, 2)))
    assert r.metered == 0 and r.reconciled and r.by_run == {}


def test_a_range_run_splits_its_step_over_the_partitions_and_dbt_invocations_map_to_runs(instance):
    from dw_dagster.cost.mapping import invocation_runs
    from dw_dagster.cost.timings import runs_in

    inst, (_, dbt_run) = instance
    daily = dg.DailyPartitionsDefinition(start_date="2026-10-01", end_date="2026-10-04")

    @dg.asset(partitions_def=daily, backfill_policy=dg.BackfillPolicy.single_run())
    def sales() -> None:
        time.sleep(0.1)

    job = dg.define_asset_job("sales_job", [sales], partitions_def=daily)
    res = dg.Definitions(assets=[sales], jobs=[job]).resolve_job_def("sales_job").execute_in_process(
        instance=inst, tags={"dagster/asset_partition_range_start": "2026-10-01",
                             "dagster/asset_partition_range_end": "2026-10-03"})
    r = DagsterTimingCost(inst).report(_today())
    step = _step_seconds(inst, res.run_id)["sales"]
    assert r.by_partition["sales"] == pytest.approx({d: step / 3 for d in ("2026-10-01", "2026-10-02", "2026-10-03")})
    assert invocation_runs(inst, runs_in(inst, _today())) == {INVOCATION: dbt_run}


def test_run_timings_cache_reads_a_finished_run_once_and_equals_read_runs(instance, monkeypatch):
    """The MCP server's explain_table asks for an asset's cost again and again: finished runs are read
    from the event log once (RunTimingsCache), and the answer is the same as reading them afresh."""
    from dw_dagster.cost import timings
    from dw_dagster.cost.timings import RunTimingsCache, read_runs

    inst, run_ids = instance
    runs = [inst.get_run_by_id(r) for r in run_ids]
    cache = RunTimingsCache()
    first = cache.read(inst, runs)
    fresh = read_runs(inst, runs)
    assert (sorted(first.steps), sorted(first.nodes), sorted(first.assets), first.invocations) == \
        (sorted(fresh.steps), sorted(fresh.nodes), sorted(fresh.assets), fresh.invocations)
    reads = []
    monkeypatch.setattr(timings, "read_runs", lambda i, rs, out=None: reads.append(rs) or fresh)
    again = cache.read(inst, runs)
    assert reads == [] and sorted(again.steps) == sorted(first.steps)  # both runs finished: nothing read again


def test_mcp_asset_cost_follows_a_new_materialization(tmp_path):
    """The cost answer is kept only while the asset has no newer observation or materialization: a new
    run that materializes it is counted at once."""
    from dw_dagster.mcp.cost import asset_cost
    from dw_dagster.mcp.state import DwState, ServerSettings

    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        dg.materialize([load], instance=inst)
        state = DwState(ServerSettings(dagster_home=str(tmp_path)))
        state._instance = inst
        one = asset_cost(state, dg.AssetKey("load"))
        assert one is not None and "1 run(s)" in one.source
        assert asset_cost(state, dg.AssetKey("load")) == one  # unchanged: the kept answer
        dg.materialize([load], instance=inst)
        two = asset_cost(state, dg.AssetKey("load"))
        assert "2 run(s)" in two.source and two.amount > one.amount
