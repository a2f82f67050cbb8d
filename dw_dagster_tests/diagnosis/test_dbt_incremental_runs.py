"""Which recorded run of an unpartitioned dbt incremental model was responsible for which watermark values,
and the fix's refusals (a strategy that appends, a window over the cap, no key, the diff not merged)."""

import datetime as dt
from pathlib import Path

import pytest

from dw_dagster.diagnosis.dbt_incremental import day_loads, run_ranges
from dw_dagster.pipelines.dbt_incremental import DbtIncrementalModel, DbtIncrementalRun

T0 = dt.datetime(2026, 11, 1)


def _run(low_h, snap_h):
    low = T0 + dt.timedelta(hours=low_h) if low_h is not None else None
    return DbtIncrementalRun(model="m", unique_id="model.p.m", relation="main.m", watermark_column="ts", operator=">",
                             max_column="ts", watermark_high_before=low, watermark_low=low, source_table="raw.t",
                             arrival_column="arrived", source_snapshot_ts=T0 + dt.timedelta(hours=snap_h), recorded_at=T0)


def _h(v):
    return None if v is None else (v - T0) / dt.timedelta(hours=1)


@pytest.mark.parametrize("lows,expected", [
    # each run reads above the last value of the one before: consecutive ranges, newest first
    ([None, 10, 30], [(30, None), (10, 30), (None, 10)]),
    # a lookback made the third run reach below the second: the second is responsible for nothing
    ([None, 10, 8, 12], [(12, None), (8, 12), (None, 8)]),
    # a full refresh read everything: nothing before it counts
    ([5, None, 7], [(7, None), (None, 7)]),
])
def test_each_watermark_value_belongs_to_the_last_run_that_could_read_it(lows, expected):
    runs = [_run(low, 100 + i) for i, low in enumerate(lows)]
    got = run_ranges(runs)
    assert [(_h(lo), _h(up)) for lo, up, _ in got] == expected
    assert [_h(r.watermark_low) for _, _, r in got] == [lo for lo, _ in expected]  # each range is its own run's


def test_ranges_split_by_day_with_the_bounds_of_a_strict_greater_than():
    runs = [_run(None, 1), _run(30, 40)]  # the second run read ts > 2 November 06:00
    loads = day_loads(run_ranges(runs), T0, T0 + dt.timedelta(days=3))
    assert [(ld.partition_key, _h(ld.start), _h(ld.end), _h(ld.source_snapshot_ts)) for ld in loads] == [
        ("2026-11-01", 0, 24, 1), ("2026-11-02", 24, 30 + 1 / 3_600_000_000, 1),
        ("2026-11-02", 30 + 1 / 3_600_000_000, 48, 40), ("2026-11-03", 48, 72, 40)]


# -- the fix's refusals

def _fix(tmp_path: Path, *, strategy=None, unique_key="id", key="id", days=("2026-11-02",), cap=7):
    from dw_dagster.core.domains import Domain
    from dw_dagster.core.models import BlastRadius, CauseFinding, Diagnosis, Incident
    from dw_dagster.proposals.dbt_incremental import propose_dbt_incremental_fix
    from dw_dagster_tests.pipelines.test_dbt_incremental import WHERE

    (tmp_path / "dbt" / "models").mkdir(parents=True, exist_ok=True)
    (tmp_path / "dbt" / "models" / "m.sql").write_text(WHERE)
    finding = CauseFinding(kind="late_rows_behind_watermark", summary="s", confidence=1.0, explained_rows=6,
                           unexplained_rows=0, window=list(days),
                           details={"watermark_column": "updated_at", "arrival_column": "ingested_at",
                                    "proposed_lookback_hours": 48})
    incident = Incident(id="inc-1", asset_key=["m"], source="dw_check", detected_at=T0, summary="s", gap_rows=6)
    diagnosis = Diagnosis(id="dg-1", incident_id="inc-1", asset_key=["m"], created_at=T0, causes=[finding],
                          blast_radius=BlastRadius(root="m"), gap_rows=6, unexplained_rows=0)
    model = DbtIncrementalModel(unique_id="model.p.m", name="m", relation="main.m", file="models/m.sql",
                                unique_key=unique_key, incremental_strategy=strategy, upstream=("raw.t",))
    return propose_dbt_incremental_fix(
        incident=incident, diagnosis=diagnosis, finding=finding,
        domain=Domain(name="d", assets=[["m"]], approvers=["a@x.example"], max_window_partitions=cap),
        repo_root=tmp_path, project_dir=tmp_path / "dbt", model=model, dialect="duckdb", key_column=key,
        arrival_in_model=True, target_resource_key="warehouse", target_table="main.m", source_table="raw.t",
        rebuild_assets=[], verify_checks=[["m", "reconciliation"]])


def test_the_fix_rebuilds_contiguous_days_in_one_dbt_build_each(tmp_path):
    cs = _fix(tmp_path, days=("2026-11-02", "2026-11-03", "2026-11-06"))
    (step,) = cs.steps
    assert step.spec["ranges"] == [["2026-11-02 00:00:00", "2026-11-04 00:00:00"], ["2026-11-06 00:00:00", "2026-11-07 00:00:00"]]
    assert len(step.sql) == 2 and cs.window == [] and cs.undo_plan.window == ["2026-11-02", "2026-11-03", "2026-11-06"]
    assert cs.files[0].path == "dbt/models/m.sql" and "+    ingested_at > (SELECT MAX(ingested_at) - INTERVAL '48' HOUR" in cs.diff


@pytest.mark.parametrize("kwargs,message", [
    ({"strategy": "append"}, "incremental_strategy 'append', which does not merge on unique_key"),
    ({"strategy": "microbatch"}, "incremental_strategy 'microbatch'"),
    ({"unique_key": None, "key": None}, "has no unique_key and no key is configured"),
    ({"days": ("2026-11-01", "2026-11-02", "2026-11-03"), "cap": 2}, "window of 3 days exceeds domain 'd' cap of 2"),
    ({"days": ()}, "names no day to rebuild"),
])
def test_the_fix_is_refused_when_a_rebuild_could_not_be_bounded_or_idempotent(tmp_path, kwargs, message):
    from dw_dagster.proposals.watermark import ProposalError

    with pytest.raises(ProposalError, match=message):
        _fix(tmp_path, **kwargs)


def test_the_rebuild_step_refuses_a_model_without_the_approved_clause(tmp_path):
    """The step runs only on the merged model: on the model as it was, it refuses and runs no dbt."""
    import json

    from dw_dagster.databases import DuckDBDatabase
    from dw_dagster.repair.dbt_window import dbt_window_runner
    from dw_dagster.changes.steps import StepRefused

    cs = _fix(tmp_path)
    manifest = {"nodes": {"model.p.m": {
        "resource_type": "model", "name": "m", "unique_id": "model.p.m", "schema": "main", "alias": "m",
        "original_file_path": "models/m.sql", "config": {"materialized": "incremental", "unique_key": "id"},
        "depends_on": {"nodes": []}}}, "sources": {}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    run = dbt_window_runner(project_dir=tmp_path / "dbt", profiles_dir=None, manifest_path=lambda: tmp_path / "manifest.json",
                            dbt_executable="/nonexistent/dbt")
    with pytest.raises(StepRefused, match="no bounded-rebuild clause on updated_at"):
        run(None, cs, cs.steps[0], DuckDBDatabase(tmp_path / "w.duckdb"))


def test_a_partitioned_dbt_model_is_refused_before_anything_is_read():
    import dagster as dg

    from dw_dagster.core.models import Incident
    from dw_dagster.diagnosis.dbt_incremental import DbtIncrementalDiagnoser

    @dg.asset(key="m", partitions_def=dg.DailyPartitionsDefinition(start_date="2026-11-01"))
    def m():
        return None

    graph = dg.Definitions(assets=[m]).resolve_asset_graph()
    d = DbtIncrementalDiagnoser(
        target_asset=dg.AssetKey("m"), source_resource_key="w", target_resource_key="w", pipeline_root=lambda: Path("."),
        pipeline_file="models/m.sql", manifest_path=None, partitions_def=None, domains_file=None, dbt_asset_keys={},
        verify_checks=[], asset_graph=lambda: graph, model="m", project_dir=lambda: Path("."), target_table="main.m",
        arrival_column="arrived")
    incident = Incident(id="inc-1", asset_key=["m"], source="dw_check", detected_at=T0, summary="s", gap_rows=6)
    with pytest.raises(dg.Failure, match="is a partitioned dbt model"):
        d._recorded_loads(object(), incident)  # a context with neither repository nor instance: nothing else is read
