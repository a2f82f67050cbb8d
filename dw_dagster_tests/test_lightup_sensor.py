"""build_lightup_incident_sensor against the fake Lightup: no incident lost, none repeated (C20, C21),
outages, malformed incidents, unmapped tables, bad cursors, and the diagnosis run it launches."""

import json
import time

import dagster as dg
import httpx
import pytest

from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.lightup import LightupResource
from dw_dagster.lightup_sensor import build_lightup_compare_check, build_lightup_incident_sensor, lightup_incident_id
from dw_dagster.local_daemon import LocalSensorDaemon
from dw_dagster.models import Diagnosis, utcnow
from dw_dagster.remediation import records
from dw_dagster_tests.lightup_fixtures import SOUTHWEST_MISSING, fake_lightup

TARGET = dg.AssetKey("store_sales_line")
SOURCE = dg.AssetKey(["pos_source", "sales_line"])
MAPPING = {"warehouse:pos.sales_line": TARGET, "pos-informix:pos.sales_line": SOURCE}
SEEN: list = []


def _diagnoser(context, incident):
    SEEN.append(incident)
    from dw_dagster.models import BlastRadius

    return Diagnosis(id="dg-test", incident_id=incident.id, asset_key=incident.asset_key, created_at=utcnow(),
                     causes=[], blast_radius=BlastRadius(root="(test)"), gap_rows=incident.gap_rows,
                     unexplained_rows=incident.gap_rows), None


def make_defs(cred, mapping=MAPPING, diagnose=True, **sensor_kw):
    job = build_diagnosis_job(diagnoser=_diagnoser)
    sensor = build_lightup_incident_sensor(table_assets=mapping, diagnosis_job_name=job.name if diagnose else None,
                                           initial_lookback_seconds=2e9, **sensor_kw)
    return dg.Definitions(
        assets=[dg.AssetSpec(TARGET), dg.AssetSpec(SOURCE)],
        asset_checks=[build_lightup_compare_check(asset=TARGET, compare_metric_uuids=["x"])],
        jobs=[job], sensors=[sensor],
        resources={"lightup": LightupResource(credential_file=str(cred), attempts=2, base_wait_s=0.01, timeout_s=2)},
    )


@pytest.fixture
def env(tmp_path):
    SEEN.clear()
    with fake_lightup(tmp_path) as (server, state, ids, cred):
        instance = dg.DagsterInstance.ephemeral()
        yield server, state, ids, cred, instance


def lightup_ids(tick) -> list[tuple[str, float]]:
    return [(e.metadata["dw/lightup_incident"].value, e.metadata["dw/lightup_updated_ts"].value)
            for e in tick.events if isinstance(e, dg.AssetCheckEvaluation)]


def fault(server, **body):
    httpx.post(f"{server.url}/_fake/faults", json=body).raise_for_status()


def test_compare_incident_becomes_failed_check_and_one_diagnosis(env):
    server, state, ids, cred, instance = env
    state.collect()  # Lightup's scheduled collection finds Southwest short
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    tick = daemon.tick("dw_lightup_incident_sensor")
    (ev,) = [e for e in tick.events if isinstance(e, dg.AssetCheckEvaluation)]
    assert (ev.asset_key, ev.check_name, ev.passed) == (TARGET, "lightup_compare", False)
    assert ev.metadata["dw/gap_rows"].value == SOUTHWEST_MISSING
    assert ev.metadata["dw/target_table"].value == "warehouse:pos.sales_line"
    assert len(tick.run_ids) == 1
    run = instance.get_run_by_id(tick.run_ids[0])
    (inc_uuid,) = list(state.incidents)
    assert run.tags["dagster/run_key"].startswith(f"lightup:{inc_uuid}:")
    (inc,) = SEEN
    assert (inc.source, inc.external_id, inc.gap_rows, inc.slices[0].slice) == ("lightup", inc_uuid, SOUTHWEST_MISSING, {"region": "Southwest"})
    assert inc.id == lightup_incident_id(inc_uuid)
    assert [i.id for i in records.incidents(instance, [TARGET])] == [inc.id]
    assert instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(TARGET, "lightup_compare")) is not None
    again = daemon.tick("dw_lightup_incident_sensor")
    assert (again.events, again.run_ids, again.skip_reason) == ([], [], "no new Lightup incidents")


def test_closed_incident_reports_passed_and_no_new_diagnosis(env, tmp_path):
    server, state, ids, cred, instance = env
    state.collect()
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    daemon.tick("dw_lightup_incident_sensor")
    # the repair: the warehouse gets the missing rows; Lightup's next collection closes the incident
    from dw_dagster.databases import DuckDBDatabase

    DuckDBDatabase(tmp_path / "wh.duckdb").execute(
        f"ATTACH '{tmp_path / 'pos_db.duckdb'}' AS s (READ_ONLY); INSERT INTO pos.sales_line SELECT * FROM s.pos.sales_line "
        "WHERE region = 'Southwest' AND sale_ts >= TIMESTAMP '2026-11-23'")
    time.sleep(0.01)
    state.collect()
    tick = daemon.tick("dw_lightup_incident_sensor")
    (ev,) = [e for e in tick.events if isinstance(e, dg.AssetCheckEvaluation)]
    assert ev.passed and ev.metadata["dw/gap_rows"].value == 0
    assert tick.run_ids == [] and len(SEEN) == 1


def test_c20_ties_on_updated_ts(env):
    """Poll 1 sees A(t) and B(t+5); C(t+5, uuid > B) appears after: poll 2 yields exactly C."""
    server, state, ids, cred, instance = env
    mon = ids["rows_monitor"]
    t = 1_790_000_000.0
    state.add_incident(uuid="aaaa-a", filter_uuid=mon, updated_ts=t, slice={"region": "West"})
    state.add_incident(uuid="bbbb-b", filter_uuid=mon, updated_ts=t + 5, slice={"region": "West"})
    daemon = LocalSensorDaemon(make_defs(cred, diagnose=False), instance, log_level="WARNING")
    assert lightup_ids(daemon.tick("dw_lightup_incident_sensor")) == [("aaaa-a", t), ("bbbb-b", t + 5)]
    state.add_incident(uuid="cccc-c", filter_uuid=mon, updated_ts=t + 5, slice={"region": "West"})
    tick = daemon.tick("dw_lightup_incident_sensor")
    assert lightup_ids(tick) == [("cccc-c", t + 5)]
    cur = json.loads(tick.cursor)
    assert (cur["updated_ts"], cur["last_id"]) == (t + 5, "cccc-c")
    assert lightup_ids(daemon.tick("dw_lightup_incident_sensor")) == []


def test_c21_one_failing_incident_neither_blocks_nor_repeats(env):
    server, state, ids, cred, instance = env
    mon = ids["rows_monitor"]
    t = 1_790_000_000.0
    state.add_incident(uuid="i1", filter_uuid=mon, updated_ts=t + 1, slice={"region": "West"})
    state.add_incident(uuid="i2", filter_uuid="monitor-not-yet-there", updated_ts=t + 2, slice={"region": "West"})
    state.add_incident(uuid="i3", filter_uuid=mon, updated_ts=t + 3, slice={"region": "West"})
    daemon = LocalSensorDaemon(make_defs(cred, diagnose=False), instance, log_level="WARNING")
    t1 = daemon.tick("dw_lightup_incident_sensor")
    assert [u for u, _ in lightup_ids(t1)] == ["i1", "i3"]
    assert json.loads(t1.cursor)["updated_ts"] == t + 2  # never past the unhandled i2
    t2 = daemon.tick("dw_lightup_incident_sensor")
    assert lightup_ids(t2) == [] and "i2" in (t2.skip_reason or "")
    # the monitor becomes readable (e.g. permissions fixed): i2 is handled once, nothing else repeats
    state.monitors["monitor-not-yet-there"] = {**state.monitors[mon]}
    t3 = daemon.tick("dw_lightup_incident_sensor")
    assert [u for u, _ in lightup_ids(t3)] == ["i2"]
    assert json.loads(t3.cursor)["updated_ts"] == t + 3
    assert lightup_ids(daemon.tick("dw_lightup_incident_sensor")) == []


def test_outage_of_several_ticks_loses_and_repeats_nothing(env):
    server, state, ids, cred, instance = env
    state.collect()
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    assert len(daemon.tick("dw_lightup_incident_sensor").run_ids) == 1
    fault(server, outage=True)
    mon = ids["rows_monitor"]
    state.add_incident(uuid="during-outage", filter_uuid=mon, slice={"region": "West"}, ongoing=False)
    for _ in range(3):
        tick = daemon.tick("dw_lightup_incident_sensor")
        assert "Lightup not reachable" in tick.skip_reason and tick.events == []
    fault(server, outage=False)
    tick = daemon.tick("dw_lightup_incident_sensor")
    assert [u for u, _ in lightup_ids(tick)] == ["during-outage"]
    assert lightup_ids(daemon.tick("dw_lightup_incident_sensor")) == []
    assert len(SEEN) == 1


@pytest.mark.parametrize("fault_body", [{"status": 429, "count": 1}, {"status": 500, "count": 1},
                                        {"expire_tokens": True}, {"wrap_lists": True}],
                         ids=["429", "500", "expired-token", "wrapped-lists"])
def test_sensor_rides_through_faults(env, fault_body):
    server, state, ids, cred, instance = env
    state.collect()
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    daemon.tick("dw_lightup_incident_sensor") if fault_body.get("expire_tokens") else None
    fault(server, **fault_body)
    state.add_incident(uuid="after-fault", filter_uuid=ids["rows_monitor"], slice={"region": "West"}, ongoing=False)
    seen = lightup_ids(daemon.tick("dw_lightup_incident_sensor")) + lightup_ids(daemon.tick("dw_lightup_incident_sensor"))
    assert "after-fault" in [u for u, _ in seen]
    assert len(seen) == len(set(seen))


def test_malformed_incident_is_reported_once_and_others_processed(env):
    server, state, ids, cred, instance = env
    mon = ids["rows_monitor"]
    state.add_incident(uuid="bad-1", filter_uuid=None, slice={"region": "West"})
    state.add_incident(uuid="bad-2", filter_uuid=mon, slice="Southwest")
    state.add_incident(uuid="good", filter_uuid=mon, slice={"region": "West"}, ongoing=False)
    daemon = LocalSensorDaemon(make_defs(cred, diagnose=False), instance, log_level="WARNING")
    tick = daemon.tick("dw_lightup_incident_sensor")
    assert [u for u, _ in lightup_ids(tick)] == ["good"]
    again = daemon.tick("dw_lightup_incident_sensor")
    assert lightup_ids(again) == [] and again.skip_reason == "no new Lightup incidents"


def test_malformed_payload_from_api_keeps_cursor(env):
    server, state, ids, cred, instance = env
    state.collect()
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    fault(server, malformed=1, path="/incidents/")
    tick = daemon.tick("dw_lightup_incident_sensor")
    assert "malformed JSON" in tick.skip_reason and tick.cursor is None
    assert len(daemon.tick("dw_lightup_incident_sensor").run_ids) == 1


def test_unmapped_table_is_a_clear_error_and_not_lost(env):
    server, state, ids, cred, instance = env
    state.collect()
    daemon = LocalSensorDaemon(make_defs(cred, mapping={"pos-informix:pos.sales_line": SOURCE}), instance, log_level="WARNING")
    tick = daemon.tick("dw_lightup_incident_sensor")
    assert "pos.sales_line (datasource warehouse) is not mapped" in tick.skip_reason
    assert tick.run_ids == []
    daemon.defs = make_defs(cred)  # mapping fixed, same cursor
    assert len(daemon.tick("dw_lightup_incident_sensor").run_ids) == 1


def test_unreadable_cursor_starts_from_scratch(env):
    server, state, ids, cred, instance = env
    state.collect()
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    daemon.cursors["dw_lightup_incident_sensor"] = "{not json"
    tick = daemon.tick("dw_lightup_incident_sensor")
    assert len(tick.run_ids) == 1 and json.loads(tick.cursor)["updated_ts"] > 0
    # a lost cursor re-reads the incident, reports it again, but never diagnoses it twice
    daemon.cursors.pop("dw_lightup_incident_sensor")
    tick = daemon.tick("dw_lightup_incident_sensor")
    assert tick.run_ids == [] and len(lightup_ids(tick)) == 1


def test_on_demand_check_reads_ongoing_incidents(env):
    server, state, ids, cred, instance = env
    state.collect()
    check = build_lightup_compare_check(asset=TARGET, compare_metric_uuids=[ids["rows_compare"]])
    defs = dg.Definitions(assets=[dg.AssetSpec(TARGET)], asset_checks=[check],
                          jobs=[dg.define_asset_job("lightup_checks", selection=dg.AssetSelection.all_asset_checks())],
                          resources={"lightup": LightupResource(credential_file=str(cred))})
    res = defs.resolve_job_def("lightup_checks").execute_in_process(instance=instance, raise_on_error=False)
    (ev,) = res.get_asset_check_evaluations()
    assert not ev.passed and ev.metadata["dw/ongoing_incidents"].value == 1
