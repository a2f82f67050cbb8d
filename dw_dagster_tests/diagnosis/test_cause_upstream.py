"""Upstream not refreshed or failed: read from the Dagster run and materialization history."""

import datetime as dt

import dagster as dg

from dw_dagster.diagnosis.causes.upstream import diagnose_upstream, upstream_keys

FAIL = {"up": False}
DAILY = dg.DailyPartitionsDefinition(start_date="2024-03-01", end_date="2024-03-05")


@dg.asset
def up():
    if FAIL["up"]:
        raise RuntimeError("source unreachable")
    return 1


@dg.asset(deps=[up, dg.AssetKey("ext")])
def down():
    return 2


ext = dg.AssetSpec("ext")


@dg.asset(partitions_def=DAILY)
def up_p():
    return 1


@dg.asset(partitions_def=DAILY, deps=[up_p])
def down_p():
    return 2


DEFS = dg.Definitions(assets=[up, down, ext, up_p, down_p])
GRAPH = DEFS.resolve_asset_graph()


def _landed(instance, key, partition=None):
    """A successful materialization, reported without a run (the history is what matters here)."""
    instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition))


def test_upstream_failed_since_last_success():
    FAIL["up"] = False
    with dg.instance_for_test() as instance:
        dg.materialize([up, down], instance=instance)  # a real run: planned + materialized
        ok = diagnose_upstream(instance, GRAPH, dg.AssetKey("down"), gap_rows=10)
        assert ok.details["tested"] and ok.confidence == 0.0 and "refreshed in time" in ok.summary
        ext_info = next(i for i in ok.details["upstream"] if i["asset"] == "ext")
        assert "no record, not judged" in ext_info["status"]  # an external asset nobody observes is not blamed
        FAIL["up"] = True
        try:
            failed = dg.materialize([up], instance=instance, raise_on_error=False)
        finally:
            FAIL["up"] = False
        assert not failed.success
        f = diagnose_upstream(instance, GRAPH, dg.AssetKey("down"), gap_rows=10)
        assert f.kind == "upstream_not_refreshed_or_failed" and f.confidence == 0.8
        (info,) = [i for i in f.details["upstream"] if i["asset"] == "up"]
        assert info["signals"] == ["failed"]
        assert [r["run_id"] for r in info["failed_runs_since_last_success"]] == [failed.run_id]
        assert info["failed_runs_since_last_success"][0]["status"] == "FAILURE"
        assert failed.run_id[:8] in f.summary and (f.explained_rows, f.unexplained_rows) == (0, 10)
        assert all(e.database == "dagster:event_log" and "fetch_planned_materializations" in e.sql for e in f.evidence)
        # fixed: a later success clears it
        _landed(instance, "up")
        assert diagnose_upstream(instance, GRAPH, dg.AssetKey("down")).confidence == 0.0


def test_not_refreshed_between_runs_and_freshness():
    FAIL["up"] = False
    with dg.instance_for_test() as instance:
        _landed(instance, "up")
        _landed(instance, "down")
        _landed(instance, "down")  # ran again on the same upstream data
        f = diagnose_upstream(instance, GRAPH, dg.AssetKey("down"))
        info = next(i for i in f.details["upstream"] if i["asset"] == "up")
        assert info["signals"] == ["not_refreshed_between_runs"] and f.confidence == 0.5
        _landed(instance, "up")
        _landed(instance, "down")
        fresh = diagnose_upstream(instance, GRAPH, dg.AssetKey("down"), max_age=dt.timedelta(hours=24))
        assert fresh.confidence == 0.0 and next(i for i in fresh.details["upstream"] if i["asset"] == "up")["signals"] == []
        # down_p has never run: its upstream is judged at "now" — 30 h after it landed — against a 24 h window
        _landed(instance, "up_p", "2024-03-01")
        later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=30)
        stale = diagnose_upstream(instance, GRAPH, dg.AssetKey("down_p"), max_age=dt.timedelta(hours=24), now=later)
        (info,) = stale.details["upstream"]
        assert info["signals"] == ["stale"] and info["age_hours_when_asset_ran"] >= 30 and stale.confidence == 0.5
        assert "allowed 24.0 h" in stale.summary


def test_partition_read_before_upstream_landed():
    with dg.instance_for_test() as instance:
        for pk in ("2024-03-01", "2024-03-02"):
            _landed(instance, "up_p", pk)
            _landed(instance, "down_p", pk)
        _landed(instance, "down_p", "2024-03-03")  # upstream never landed
        _landed(instance, "up_p", "2024-03-02")  # landed again after down read it
        f = diagnose_upstream(instance, GRAPH, dg.AssetKey("down_p"))
        assert f.window == ["2024-03-02", "2024-03-03"] and f.confidence == 0.7
        (info,) = f.details["upstream"]
        early = {e["partition"]: e["upstream_materialized"] for e in info["partitions_read_before_upstream_landed"]}
        assert set(early) == {"2024-03-02", "2024-03-03"} and early["2024-03-03"] is None
        only = diagnose_upstream(instance, GRAPH, dg.AssetKey("down_p"), partitions=["2024-03-01"])
        assert only.confidence == 0.0 and only.window == []


def test_no_parents_is_not_testable():
    with dg.instance_for_test() as instance:
        f = diagnose_upstream(instance, GRAPH, dg.AssetKey("up"))
        assert f.details["tested"] is False and "no upstream" in f.summary
    assert upstream_keys(GRAPH, dg.AssetKey("down")) == [dg.AssetKey("ext"), dg.AssetKey("up")]
    assert upstream_keys(GRAPH, dg.AssetKey("not_there")) == []
