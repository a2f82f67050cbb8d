"""build_lightup_incident_sensor against the fake Lightup: no incident lost, none repeated (C20, C21),
outages, malformed incidents, unmapped tables, bad cursors, and the diagnosis run it launches."""

import json
import time

import dagster as dg
import httpx
import pytest

from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.integrations.lightup import LightupResource
from dw_dagster.detection.lightup import build_lightup_compare_check, build_lightup_incident_sensor, lightup_incident_id
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core.models import Diagnosis, utcnow
from dw_dagster.core import records
from dw_dagster_tests.harness.lightup_fixtures import SOUTHWEST_MISSING, fake_lightup

TARGET = dg.AssetKey("store_sales_line")
SOURCE = dg.AssetKey(["pos_source", "sales_line"])
MAPPING = {"warehouse:pos.sales_line": TARGET, "pos-informix:pos.sales_line": SOURCE}
SEEN: list = []


def _diagnoser(context, incident):
    SEEN.append(incident)
    from dw_dagster.core.models import BlastRadius

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
    assert run.tags["dagster/run_key"] == lightup_incident_id(inc_uuid) and run.tags["dw/lightup_incident"] == inc_uuid
    (inc,) = SEEN
    assert (inc.source, inc.external_id, inc.gap_rows, inc.slices[0].slice) == ("lightup", inc_uuid, SOUTHWEST_MISSING, {"region": "Southwest"})
    assert inc.id == lightup_incident_id(inc_uuid)
    assert f"target {SOUTHWEST_MISSING:,} rows short (" in inc.summary and "vs source" not in inc.summary
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


# -- exactly once: duplicates, late visibility, linked incidents, failing incidents, the ledger -------------

T0 = 1_790_000_000.0
SENSOR = "dw_lightup_incident_sensor"


def observations(tick, key: str = "dw/incident") -> list:
    return [e for e in tick.events if isinstance(e, dg.AssetObservation) and key in (e.metadata or {})]


def ledger(instance):
    from dw_dagster.core.ledger import ledger_for

    return ledger_for(instance)


def test_an_incident_a_dry_run_recorded_is_diagnosed_once_by_the_next_ticks(env):
    """The UI's "Test sensor" (or a tick whose run requests were lost) evaluates the sensor: the
    incident is recorded in the ledger, nothing is launched and the cursor is not kept. The real
    ticks after it request its diagnosis again under the same run key; the daemon launches it once."""
    server, state, ids, cred, instance = env
    state.collect()
    (inc_uuid,) = list(state.incidents)
    defs = make_defs(cred)
    dry = defs.resolve_sensor_def(SENSOR).evaluate_tick(dg.build_sensor_context(
        instance=instance, definitions=defs, sensor_name=SENSOR, resources={"lightup": defs.resources["lightup"]}))
    (asked,) = dry.run_requests  # shown, never launched
    row = ledger(instance).incident_by_external("lightup", inc_uuid)
    assert (row.state, row.incident_id) == ("open", lightup_incident_id(inc_uuid))
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    ticks = [daemon.tick(SENSOR) for _ in range(3)]
    assert [len(t.run_ids) for t in ticks] == [1, 0, 0] and not any(t.failed_run_ids for t in ticks)
    assert asked.run_key == row.incident_id
    (run,) = instance.get_runs(filters=dg.RunsFilter(job_name="dw_diagnose_incident"))
    assert run.tags["dagster/run_key"] == row.incident_id and run.tags["dw/lightup_incident"] == inc_uuid
    assert [i.external_id for i in SEEN] == [inc_uuid]
    assert ledger(instance).incident(row.incident_id).state == "diagnosed"


def test_same_incident_twice_in_one_answer_is_one_incident(env):
    server, state, ids, cred, instance = env
    state.collect()
    (inc_uuid,) = list(state.incidents)
    state.listed_extra.append(dict(state.incidents[inc_uuid]))  # the answer lists it twice
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    tick = daemon.tick(SENSOR)
    assert [u for u, _ in lightup_ids(tick)] == [inc_uuid]
    assert len(observations(tick)) == 1 and len(tick.run_ids) == 1 and len(SEEN) == 1
    assert [i.external_id for i in records.incidents(instance, [TARGET])] == [inc_uuid]
    assert lightup_ids(daemon.tick(SENSOR)) == []


def test_an_answer_with_an_older_version_keeps_the_newest(env):
    server, state, ids, cred, instance = env
    mon = ids["rows_monitor"]
    newest = state.add_incident(uuid="v-inc", filter_uuid=mon, updated_ts=T0 + 10, slice={"region": "West"}, ongoing=False)
    state.listed_extra.append({**newest, "updated_ts": T0, "ongoing": True})  # a lagging replica's older copy
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    tick = daemon.tick(SENSOR)
    assert lightup_ids(tick) == [("v-inc", T0 + 10)]
    (ev,) = [e for e in tick.events if isinstance(e, dg.AssetCheckEvaluation)]
    assert ev.passed and tick.run_ids == []  # closed by Lightup: reported as passed, nothing diagnosed
    # later only the stale copy is listed: a version older than one handled is never reported
    del state.incidents["v-inc"]
    assert lightup_ids(daemon.tick(SENSOR)) == []


def test_incident_visible_late_below_the_watermark_is_picked_up_once(env):
    server, state, ids, cred, instance = env
    mon = ids["rows_monitor"]
    state.add_incident(uuid="early", filter_uuid=mon, updated_ts=T0, slice={"region": "West"}, ongoing=False)
    daemon = LocalSensorDaemon(make_defs(cred, diagnose=False), instance, log_level="WARNING")  # default overlap
    assert lightup_ids(daemon.tick(SENSOR)) == [("early", T0)]
    # stamped 60 s before the incident already read, listed only now (a monitor run that committed late)
    state.add_incident(uuid="late", filter_uuid=mon, updated_ts=T0 - 60, slice={"region": "West"}, ongoing=False)
    assert lightup_ids(daemon.tick(SENSOR)) == [("late", T0 - 60)]
    assert lightup_ids(daemon.tick(SENSOR)) == []
    assert json.loads(daemon.cursors[SENSOR])["updated_ts"] == T0


def test_cursor_stays_bounded_over_a_long_history(env):
    server, state, ids, cred, instance = env
    mon = ids["rows_monitor"]
    daemon = LocalSensorDaemon(make_defs(cred, diagnose=False), instance, log_level="WARNING")
    seen, sizes = [], []
    for i in range(20):  # one incident every 100 s; the window re-reads 300 s
        state.add_incident(uuid=f"h-{i:02d}", filter_uuid=mon, updated_ts=T0 + 100 * i, slice={"region": "West"},
                           ongoing=False)
        tick = daemon.tick(SENSOR)
        seen += lightup_ids(tick)
        sizes.append(len(json.loads(tick.cursor)["handled"]))
    assert seen == [(f"h-{i:02d}", T0 + 100 * i) for i in range(20)]
    assert max(sizes) <= 4  # the versions inside the window, never the history
    assert len(daemon.cursors[SENSOR]) < 400


def test_second_incident_on_an_asset_is_linked_then_diagnosed_when_the_first_closes(env):
    from dw_dagster.core.ledger import DIAGNOSED, OPEN
    from dw_dagster.receipts.job import close_incident

    server, state, ids, cred, instance = env
    state.collect()  # Southwest short: incident A
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    assert len(daemon.tick(SENSOR).run_ids) == 1
    (first,) = SEEN
    state.add_incident(uuid="second", filter_uuid=ids["rows_monitor"], slice={"region": "West"},
                       start_ts=epoch_day("2026-11-23"), end_ts=epoch_day("2026-11-25"))
    tick = daemon.tick(SENSOR)
    assert [u for u, _ in lightup_ids(tick)] == ["second"] and tick.run_ids == []
    row = ledger(instance).incident_by_external("lightup", "second")
    assert (row.linked_to, row.state, row.incident_id) == (first.id, OPEN, lightup_incident_id("second"))
    (obs,) = observations(tick)
    assert f"linked to incident {first.id}" in obs.description and obs.metadata["dw/lightup_incident"].value == "second"
    assert daemon.tick(SENSOR).run_ids == [] and len(SEEN) == 1  # still linked: nothing launched
    assert close_incident(instance, first.id, "owner@grocer.example", "repaired")
    tick = daemon.tick(SENSOR)
    assert len(tick.run_ids) == 1 and SEEN[-1].external_id == "second"
    assert f"incident {row.incident_id} diagnosed again" in observations(tick)[0].description
    row = ledger(instance).incident(row.incident_id)
    assert (row.linked_to, row.state) == (None, DIAGNOSED)
    again = daemon.tick(SENSOR)
    assert (again.run_ids, again.events) == ([], []) and len(SEEN) == 2


def epoch_day(day: str) -> float:
    from dw_dagster_tests.harness.lightup_fixtures import epoch

    return epoch(day)


def quarantined_refs(instance) -> list[str]:
    return [q["ref"] for q in records.quarantined(instance)]


def test_incident_failing_for_good_is_quarantined_on_dw_control_and_the_cursor_moves_on(env):
    from dw_dagster.core.ledger import QUARANTINED

    server, state, ids, cred, instance = env
    mon = ids["rows_monitor"]
    state.add_incident(uuid="gone", filter_uuid="monitor-deleted", updated_ts=T0 + 1, slice={"region": "West"})
    state.add_incident(uuid="fine", filter_uuid=mon, updated_ts=T0 + 2, slice={"region": "West"}, ongoing=False)
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")  # default max_attempts=5
    seen = []
    for n in range(1, 5):
        tick = daemon.tick(SENSOR)
        seen += lightup_ids(tick)
        cur = json.loads(tick.cursor)
        assert cur["updated_ts"] == T0 + 1 and cur["attempts"] == {"gone": [repr(T0 + 1), n]}
        assert ledger(instance).incident_by_external("lightup", "gone") is None
    tick = daemon.tick(SENSOR)  # the 5th try: quarantined
    (obs,) = observations(tick, "dw/quarantined")
    assert obs.asset_key == dg.AssetKey("dw_control") and "quarantined after 5 tries" in obs.description
    assert "HTTP 404" in obs.description
    row = ledger(instance).incident_by_external("lightup", "gone")
    assert (row.state, row.source, row.asset_key, row.incident_id) == (QUARANTINED, "lightup", "dw_control",
                                                                       lightup_incident_id("gone"))
    assert "HTTP 404" in json.loads(row.body)["summary"]
    assert quarantined_refs(instance) == [f"lightup:gone:{T0 + 1!r}"]
    cur = json.loads(tick.cursor)
    assert cur["updated_ts"] == T0 + 2 and "attempts" not in cur
    assert lightup_ids(daemon.tick(SENSOR)) == [] and seen == [("fine", T0 + 2)]
    assert SEEN == [] and observations(tick) == []  # nothing diagnosed, no dw/incident for it


def test_unmapped_table_is_quarantined_after_max_attempts(env):
    server, state, ids, cred, instance = env
    state.collect()
    (inc_uuid,) = list(state.incidents)
    daemon = LocalSensorDaemon(make_defs(cred, mapping={"pos-informix:pos.sales_line": SOURCE}, max_attempts=2),
                               instance, log_level="WARNING")
    assert "try 1 of 2" in daemon.tick(SENSOR).skip_reason
    tick = daemon.tick(SENSOR)
    (obs,) = observations(tick, "dw/quarantined")
    assert obs.asset_key == dg.AssetKey("dw_control") and "is not mapped to a Dagster asset" in obs.description
    assert ledger(instance).incident_by_external("lightup", inc_uuid).state == "quarantined"
    assert daemon.tick(SENSOR).skip_reason == "no new Lightup incidents"


def test_incident_whose_datapoints_always_fail_is_quarantined_on_its_asset(env):
    from dw_dagster_tests.harness.lightup_fixtures import add_sales_monitor

    server, state, ids, cred, instance = env
    sales = add_sales_monitor(state, ids)
    state.add_incident(uuid="sales-1", filter_uuid=sales, updated_ts=T0 + 1, slice={"region": "West"})
    state.add_incident(uuid="rows-1", filter_uuid=ids["rows_monitor"], updated_ts=T0 + 2, slice={"region": "West"},
                       ongoing=False)
    fault(server, status=500, count=100_000, path=f"/metrics/{ids['sales_source']}/datapoints")
    daemon = LocalSensorDaemon(make_defs(cred, max_attempts=3), instance, log_level="WARNING")
    seen = lightup_ids(daemon.tick(SENSOR)) + lightup_ids(daemon.tick(SENSOR))
    assert seen == [("rows-1", T0 + 2)]  # the others are never blocked by it
    tick = daemon.tick(SENSOR)
    (obs,) = observations(tick, "dw/quarantined")
    assert obs.asset_key == TARGET and "HTTP 500" in obs.description  # it reached its asset before failing
    row = ledger(instance).incident_by_external("lightup", "sales-1")
    assert (row.state, row.asset_key) == ("quarantined", "store_sales_line")
    assert json.loads(tick.cursor)["updated_ts"] == T0 + 2 and SEEN == []
    assert lightup_ids(daemon.tick(SENSOR)) == []


def test_an_outage_counts_as_a_try_for_no_incident(env):
    server, state, ids, cred, instance = env
    state.add_incident(uuid="gone", filter_uuid="monitor-deleted", updated_ts=T0 + 1, slice={"region": "West"})
    daemon = LocalSensorDaemon(make_defs(cred, max_attempts=2), instance, log_level="WARNING")
    assert "try 1 of 2" in daemon.tick(SENSOR).skip_reason
    fault(server, outage=True)  # the list itself fails
    for _ in range(3):
        assert "Lightup not reachable" in daemon.tick(SENSOR).skip_reason
    fault(server, outage=False)
    # Lightup answers the sign-in and the list, then nothing else (health endpoint included)
    fault(server, status=503, count=100_000,
          path=r"^(?!/api/v0/ws/[^/]+/incidents/$|/api/v1/token/refresh/$|/api/v1/workspaces/$)")
    state.add_incident(uuid="during", filter_uuid=ids["rows_monitor"], updated_ts=T0 + 2, slice={"region": "West"},
                       ongoing=False)
    for _ in range(3):
        tick = daemon.tick(SENSOR)
        assert "Lightup stopped answering" in tick.skip_reason and tick.events == []
        assert json.loads(tick.cursor)["attempts"] == {"gone": [repr(T0 + 1), 1]}
    assert records.quarantined(instance) == []
    fault(server, reset=True)
    tick = daemon.tick(SENSOR)  # the 2nd real try
    assert [o.metadata["dw/lightup_incident"].value for o in observations(tick, "dw/quarantined")] == ["gone"]
    assert lightup_ids(tick) == [("during", T0 + 2)]
    assert lightup_ids(daemon.tick(SENSOR)) == []


def test_seen_means_known_to_the_ledger_by_lightup_uuid(env):
    """An incident the ledger holds under another id (recorded by an earlier release, or imported),
    closed since, is never recorded or diagnosed again when Lightup lists it (again)."""
    from dw_dagster.core.ledger import CLOSED
    from dw_dagster.core.models import Incident

    server, state, ids, cred, instance = env
    state.collect()
    (inc_uuid,) = list(state.incidents)
    inc = Incident(id="imported-7", asset_key=["store_sales_line"], source="lightup", detected_at=utcnow(),
                   summary="imported", external_id=inc_uuid)
    assert ledger(instance).record_incident(incident_id=inc.id, asset_key="store_sales_line", source="lightup",
                                            external_id=inc_uuid, body=inc.model_dump_json(), state=CLOSED)
    daemon = LocalSensorDaemon(make_defs(cred), instance, log_level="WARNING")
    tick = daemon.tick(SENSOR)
    assert [u for u, _ in lightup_ids(tick)] == [inc_uuid] and tick.run_ids == [] and observations(tick) == []
    assert [i.id for i in records.incidents(instance, [TARGET])] == ["imported-7"]


class _WriteOnlyEventLog:
    """The instance's event log storage, refusing every read (writes pass through)."""

    READS = ("get_", "fetch_", "all_", "has_", "can_", "_get")

    def __init__(self, storage):
        self._storage = storage

    def __getattr__(self, name):
        if name.startswith(self.READS) and name not in ("get_event_log_connection",):
            raise AssertionError(f"the Lightup sensor read the event log ({name})")
        return getattr(self._storage, name)


def test_a_tick_reads_no_event_log(env, monkeypatch):
    server, state, ids, cred, instance = env
    state.collect()
    state.add_incident(uuid="second", filter_uuid=ids["rows_monitor"], slice={"region": "West"})
    state.add_incident(uuid="bad", filter_uuid=None)
    state.add_incident(uuid="gone", filter_uuid="monitor-deleted")
    defs = make_defs(cred, max_attempts=1)
    sensor = defs.resolve_sensor_def(SENSOR)
    monkeypatch.setattr(instance, "_event_storage", _WriteOnlyEventLog(instance._event_storage))
    ctx = dg.build_sensor_context(instance=instance, definitions=defs, sensor_name=SENSOR,
                                  resources={"lightup": defs.resources["lightup"]})
    data = sensor.evaluate_tick(ctx)
    assert len(data.run_requests) == 1 and len(data.asset_events) > 3
    assert ledger(instance).incident_by_external("lightup", "second").linked_to is not None


def test_a_tick_never_raises(env, monkeypatch):
    server, state, ids, cred, instance = env
    mon = ids["rows_monitor"]
    state.listed_extra += ["not an object", 42, None, [], {"uuid": 5, "updated_ts": T0}, {"uuid": "x" * 300, "updated_ts": T0},
                           {"uuid": "ts-text", "updated_ts": "yesterday", "filter_uuid": mon},
                           {"uuid": "bad-window", "updated_ts": T0, "filter_uuid": mon, "start_ts": "monday", "end_ts": T0},
                           {"uuid": "bad-slice", "updated_ts": T0, "filter_uuid": mon, "start_ts": T0, "end_ts": T0,
                            "slice": [["region", "West"]]}]
    state.add_incident(uuid="good", filter_uuid=mon, updated_ts=T0 + 1, slice={"region": "West"}, ongoing=False)
    daemon = LocalSensorDaemon(make_defs(cred, max_attempts=1), instance, log_level="WARNING")
    for cursor in ('{"handled": {"a": ["x"]}}', "[]", '{"updated_ts": 1e400}', '{"attempts": {"a": "b"}}'):
        daemon.cursors[SENSOR] = cursor
        tick = daemon.tick(SENSOR)
        assert [u for u, _ in lightup_ids(tick)] == ["good"]
        assert lightup_ids(daemon.tick(SENSOR)) == []
        daemon.cursors.pop(SENSOR)
        instance.wipe()
    import dw_dagster.detection.lightup as ls

    monkeypatch.setattr(ls, "dedupe_incidents", lambda raws: 1 / 0)  # anything unexpected
    daemon.cursors[SENSOR] = cursor = json.dumps({"updated_ts": T0, "last_id": None, "handled": {}})
    tick = daemon.tick(SENSOR)
    assert "ZeroDivisionError" in tick.skip_reason and daemon.cursors[SENSOR] == cursor


def test_dedupe_keeps_the_newest_version_and_rejects_non_finite_times():
    from dw_dagster.detection.lightup import dedupe_incidents

    base = {"uuid": "u", "filter_uuid": "m", "start_ts": 1.0, "end_ts": 2.0}
    entries, dropped = dedupe_incidents([{**base, "updated_ts": 5.0}, {**base, "updated_ts": 9.0}, {**base, "updated_ts": 9.0},
                                         {**base, "uuid": "n", "updated_ts": float("nan")}, {**base, "uuid": "i", "updated_ts": float("inf")}])
    assert [(i, ts, isinstance(x, dict)) for i, ts, x in entries][-1] == ("u", 9.0, True)
    assert dropped == [("u", 5.0)]
    assert sorted(ts for _, ts, x in entries if not isinstance(x, dict)) == [0.0, 0.0]  # malformed: below any watermark


def test_cursor_never_moves_into_the_future_and_counts_tries_per_version():
    from dw_dagster.core.cursors import UpdatedTsCursor

    cur = UpdatedTsCursor(overlap_s=300.0)
    cur.advance([("a", 100.0), ("future", 1e12)], [], ceiling=200.0)
    assert cur.updated_ts == 200.0 and cur.is_handled("future", 1e12)
    assert (cur.record_failure("b", 150.0), cur.record_failure("b", 150.0), cur.record_failure("b", 160.0)) == (1, 2, 1)
    cur.advance([], [("b", 160.0)], ceiling=300.0)
    assert UpdatedTsCursor.loads(cur.dumps(), overlap_s=300.0).tries("b", 160.0) == 1
    cur.advance([("b", 160.0)], [], ceiling=300.0)
    assert "attempts" not in json.loads(cur.dumps())


def test_l0_domain_records_the_incident_without_diagnosis(env, tmp_path):
    server, state, ids, cred, instance = env
    path = tmp_path / "domains.yaml"
    path.write_text("domains:\n  - name: store\n    assets: [[store_sales_line]]\n    approvers: [owner@grocer.example]\n"
                    "    autonomy: L0\n")
    state.collect()
    daemon = LocalSensorDaemon(make_defs(cred, domains=str(path)), instance, log_level="WARNING")
    tick = daemon.tick(SENSOR)
    assert tick.run_ids == [] and len(observations(tick)) == 1 and len(records.incidents(instance, [TARGET])) == 1
    path.write_text("domains: [not, valid")
    tick = daemon.tick(SENSOR)
    assert "domains unusable" in tick.skip_reason
