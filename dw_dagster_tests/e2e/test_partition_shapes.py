"""The whole loop for every partition shape: incident → verified receipt → undo, through the sensors.

One small world per shape (module-scoped; a few hundred rows): an ``events`` asset partitioned
hourly, weekly, monthly, daily in America/New_York (the 25-hour fall-back day in its window),
by time × a static dimension (whose column the asset names in ``dw/partition_columns``), by a
static dimension, and by dynamic partitions. The warehouse misses every other row of the window;
the reconciliation check fails; the incident sensor opens the incident and launches the diagnosis
(whose change set reruns the window with an undo plan); the owner approves; the remediation
sensor, ticked like the daemon ticks it (:class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon`),
runs snapshot, the window, verify and receipt; the receipt is verified. Then the undo, approved,
restores exactly the table as it was before the repair (compared row by row, not by checksum).

The asset loads its partitions the way a user's asset does, from Dagster's own time windows; the
rows the repair must touch are computed here in Python. Field reports of the failure kinds:

- a sub-day window widened to whole days: https://github.com/apache/airflow/pull/68718
- day and week windows that drift off local midnight across a DST change:
  https://github.com/faucet-hq/faucet-stream/issues/461, https://github.com/dagster-io/dagster/pull/18037
- microbatch day boundaries taken in UTC instead of the data's zone: https://github.com/dbt-labs/dbt-core/issues/11578
"""

import datetime as dt
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from dw_dagster.approval.job import approve_in_process
from dw_dagster.checks import build_reconciliation_checks
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.models import BlastRadius, ChangeSet, Diagnosis, UndoPlan, utcnow
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.receipts.job import build_receipt_job
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.repair.undo import build_undo_jobs, propose, propose_undo
from dw_dagster.testing.local_daemon import LocalSensorDaemon

OWNER = "dana.ortiz@grocer.example"
UTC, NY = dt.timezone.utc, ZoneInfo("America/New_York")
EVENTS = dg.AssetKey("events")
T0 = dt.datetime(2026, 10, 25, 0, 10, tzinfo=UTC)
ROWS = [(i, T0 + dt.timedelta(minutes=53 * i), ["EU", "US"][i % 2]) for i in range(700)]  # to 2026-11-19
REGIONS = dg.StaticPartitionsDefinition(["US", "EU"])  # not alphabetical: the window run's range follows the definition

#: shape -> (definition, window, partition column, {dimension: column}, row -> in the window)
SHAPES = {
    "hourly": (dg.HourlyPartitionsDefinition(start_date="2026-10-25-00:00", end_date="2026-11-20-00:00"),
               ["2026-11-03-05:00", "2026-11-03-06:00"], "ts", {},
               lambda r: dt.datetime(2026, 11, 3, 5, tzinfo=UTC) <= r[1] < dt.datetime(2026, 11, 3, 7, tzinfo=UTC)),
    "weekly": (dg.WeeklyPartitionsDefinition(start_date="2026-10-25", end_date="2026-11-15"), ["2026-11-01"], "ts", {},
               lambda r: dt.date(2026, 11, 1) <= r[1].date() < dt.date(2026, 11, 8)),
    "monthly": (dg.MonthlyPartitionsDefinition(start_date="2026-10-01", end_date="2026-12-01"), ["2026-10-01"], "ts", {},
                lambda r: r[1].month == 10),
    "daily-new-york": (dg.DailyPartitionsDefinition(start_date="2026-10-25", end_date="2026-11-19", timezone="America/New_York"),
                       ["2026-10-31", "2026-11-01"], "ts", {},
                       lambda r: r[1].astimezone(NY).date() in (dt.date(2026, 10, 31), dt.date(2026, 11, 1))),
    "time-x-static": (dg.MultiPartitionsDefinition({"day": dg.DailyPartitionsDefinition(start_date="2026-10-25", end_date="2026-11-19"),
                                                    "area": REGIONS}),
                      ["US|2026-11-03"], "ts", {"area": "region"},  # Dagster joins the dimensions sorted by name
                      lambda r: r[1].date() == dt.date(2026, 11, 3) and r[2] == "US"),
    "static": (REGIONS, ["EU"], "region", {}, lambda r: r[2] == "EU"),
    "dynamic": (dg.DynamicPartitionsDefinition(name="regions"), ["EU"], "region", {}, lambda r: r[2] == "EU"),
}


def _rows_sql(pdef: dg.PartitionsDefinition, key, cols: dict[str, str], column: str) -> str:
    """The user's own load: a partition's rows from Dagster's time window (UTC) and its static keys."""
    if isinstance(pdef, dg.MultiPartitionsDefinition):
        mk = pdef.get_partition_key_from_str(str(key))
        return " AND ".join(_rows_sql(d.partitions_def, mk.keys_by_dimension[d.name], cols, cols.get(d.name, column))
                            for d in pdef.partitions_defs)
    if isinstance(pdef, dg.TimeWindowPartitionsDefinition):
        tw = pdef.time_window_for_partition_key(key)
        lo, hi = (t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") for t in (tw.start, tw.end))
        return f"ts >= TIMESTAMP '{lo}' AND ts < TIMESTAMP '{hi}'"
    return f"{column} = '{key}'"


def _table(wh) -> list[tuple]:
    return wh.fetch_all("SELECT id, ts, region, amount FROM events ORDER BY id")


@pytest.fixture(scope="module", params=list(SHAPES))
def world(request, tmp_path_factory):
    shape = request.param
    pdef, window, column, cols, in_window = SHAPES[shape]
    tmp = tmp_path_factory.mktemp(shape)
    domains = tmp / "domains.yaml"
    domains.write_text(f"domains:\n  - name: events\n    assets: [[events]]\n    approvers: [{OWNER}]\n"
                       "    escalation: [oncall@grocer.example]\n    autonomy: L2\n    identity: unverified\n")
    wh = DuckDBDatabase(tmp / "wh.duckdb")
    values = ", ".join(f"({i}, TIMESTAMP '{t:%Y-%m-%d %H:%M:%S}', '{r}', {i % 7}.25)" for i, t, r in ROWS)
    wh.execute(f"CREATE TABLE src_events (id INT, ts TIMESTAMP, region VARCHAR, amount DECIMAL(18,2)); "
               f"INSERT INTO src_events VALUES {values}; CREATE TABLE events AS SELECT * FROM src_events")
    missing = [r[0] for r in ROWS if in_window(r) and r[0] % 4 < 2]
    wh.execute(f"DELETE FROM events WHERE id IN ({', '.join(map(str, missing))})")

    @dg.asset(key=EVENTS, partitions_def=pdef, backfill_policy=dg.BackfillPolicy.single_run(),
              metadata={c.PARTITION_COLUMNS_KEY: cols} if cols else None)
    def events(context: dg.AssetExecutionContext, warehouse: DatabaseResource) -> None:
        w = warehouse.get_database()
        for pk in context.partition_keys:
            where = _rows_sql(pdef, pk, cols, column)
            w.execute(f"DELETE FROM events WHERE {where}; INSERT INTO events SELECT * FROM src_events WHERE {where}")

    recon = build_reconciliation_checks(asset=EVENTS, source_asset="src_events", source_table="src_events",
                                        target_table="events", slice_by=["region"], measures=["amount"], key_columns=["id"],
                                        source_resource_key="warehouse", target_resource_key="warehouse", name="compare",
                                        partition_column=column, partitions_def=pdef)  # the verify compares the window only
    check_key = dg.AssetCheckKey(EVENTS, "compare")
    verify_job = dg.define_asset_job("verify_events", selection=dg.AssetSelection.checks(check_key))
    window_job = dg.define_asset_job("rerun_events", selection=dg.AssetSelection.assets(EVENTS), partitions_def=pdef)
    plan = UndoPlan(resource_key="warehouse", table="events", partition_column=column, window=[])

    def diagnoser(context, incident):
        d = Diagnosis(id="dg-" + incident.id, incident_id=incident.id, asset_key=incident.asset_key, created_at=utcnow(),
                      causes=[], blast_radius=BlastRadius(root="events"), gap_rows=incident.gap_rows, unexplained_rows=0)
        now = utcnow()
        cs = ChangeSet.seal(id=f"cs-{shape}", incident_id=incident.id, diagnosis_id=d.id, domain="events", proposer=c.PROPOSER,
                            created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=[OWNER],
                            cause_kind="late_rows_behind_watermark", summary=f"rerun {', '.join(window)}",
                            target_asset=["events"], window=list(window), diff="", files=[], rebuild_assets=[],
                            verify_checks=[["events", "compare"]], change_classes=["rerun_window"], undo="undo it",
                            undo_plan=plan.model_copy(update={"window": list(window)}))
        return d, cs

    diag = build_diagnosis_job(diagnoser=diagnoser)
    receipts = build_receipt_job()
    defs = dg.Definitions(
        assets=[events, dg.AssetSpec("src_events")], asset_checks=[recon], jobs=[verify_job, window_job, diag, receipts],
        sensors=[build_check_incident_sensor(check_keys=[check_key], diagnosis_job_name=diag.name),
                 build_remediation_sensor(partitions_of=EVENTS, window_job=window_job, verify_job=verify_job,
                                          receipt_job=receipts, undo_jobs=build_undo_jobs(["warehouse"]), domains=domains)],
        resources={"warehouse": DatabaseResource(url=f"duckdb:///{wh.path}")}, executor=dg.in_process_executor)
    with dg.instance_for_test() as instance:
        if isinstance(pdef, dg.DynamicPartitionsDefinition):
            instance.add_dynamic_partitions("regions", ["US", "EU"])
        yield shape, defs, instance, wh, missing, domains


def _repair(daemon: LocalSensorDaemon) -> list[str]:
    stages = []
    for _ in range(8):
        tick = daemon.tick("dw_remediation_sensor")
        assert not tick.failed_run_ids, tick.failed_run_ids
        if not tick.run_ids:
            daemon.last_skip = tick.skip_reason
            break
        stages.append(daemon.instance.get_run_by_id(tick.run_ids[0]).tags[c.STAGE_TAG])
    return stages


def test_incident_to_verified_receipt_to_undo(world, monkeypatch):
    shape, defs, instance, wh, missing, domains = world
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    before = _table(wh)
    assert len(before) == len(ROWS) - len(missing) and missing
    ev = defs.resolve_job_def("verify_events").execute_in_process(instance=instance, raise_on_error=False)
    assert not ev.get_asset_check_evaluations()[0].passed
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    assert len(daemon.tick("dw_check_incident_sensor").run_ids) == 1
    cs = next(x for x in records.change_sets(instance) if x.id == f"cs-{shape}")
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    stages = _repair(daemon)
    assert stages and stages[0] == "snapshot" and stages[-2:] == ["verify", "receipt"] and any(s.startswith("window-") for s in stages), daemon.last_skip
    receipt = next(r for r in records.receipts(instance, EVENTS) if r.change_set_id == cs.id)
    assert receipt.verified, receipt
    evals = [e.dagster_event.event_specific_data for e in instance.all_logs(receipt.run_ids["verify"])
             if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert evals[0].metadata["dw/compared_partitions"].value == ", ".join(sorted(cs.window))  # the window's rows only
    assert sorted(r[0] for r in _table(wh)) == list(range(len(ROWS)))  # every missing row is back, nothing else

    undo = propose_undo(instance, cs.id)
    propose(instance, undo)
    assert approve_in_process(instance, undo.id, approver=OWNER)[0]
    assert _repair(daemon)[0] == "restore"
    assert _table(wh) == before  # the window exactly as the snapshot kept it; the other partitions untouched
