"""Liveness in process: one crash or a connection error does not end an approved repair; a failure says what is stale.

Found in review (issue 23, item 4): the daemon or the run worker killed before the window stage's
first step, or PostgreSQL down during the rebuild, ended the change set ``failed`` and the owner had
to approve a new proposal. Here the same endings are made in one process with the
:class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon` on a small real repair (a partitioned
``orders`` table in DuckDB, a downstream ``orders_summary`` rebuilt after the window):

- a stage run that ended before its first step (its worker killed: the code server reports the
  run failed, no ``STEP_START``) gets a fresh ticket and runs again under the same approval; three
  such runs fail the stage;
- a stage whose step failed on a connection error (``sqlalchemy.exc.OperationalError``, as when the
  storage is unreachable) runs again after the backoff, up to three runs; a step that failed in the
  user's own code is not retried;
- a repair that fails half-way (window done, rebuild failed) says which assets are left stale and
  how to finish or undo; a listed approver's new approval finishes it without rerunning the window.

``test_attack_identity_and_liveness.py`` does the same through a real deployment (killed processes,
a cut PostgreSQL connection).
"""


import datetime as dt
import textwrap

import dagster as dg
import pytest
import sqlalchemy as sa

from dw_dagster.approval.job import approve_in_process
from dw_dagster.checks import build_reconciliation_checks
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import ChangeSet, utcnow
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.proposals.change_sets import propose
from dw_dagster.receipts.job import build_receipt_job
from dw_dagster.repair import liveness
from dw_dagster.guard.admission import RunFacts, admit_run
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.testing.local_daemon import LocalSensorDaemon

OWNER = "dana.ortiz@grocer.example"
DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-06")
ORDERS, SUMMARY = dg.AssetKey("orders"), dg.AssetKey("orders_summary")


@pytest.fixture
def world(tmp_path, monkeypatch):
    """``orders`` missing 20 rows, ``orders_summary`` built from it; ``faults`` makes the next runs fail."""
    domains = tmp_path / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: orders
            assets: [[orders], [orders_summary]]
            approvers: [{OWNER}]
            identity: unverified
        """))
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    monkeypatch.setattr(liveness, "BACKOFF_SECONDS", (0.0, 0.0, 0.0))
    src, wh = DuckDBDatabase(tmp_path / "src.duckdb"), DuckDBDatabase(tmp_path / "wh.duckdb")
    for db in (src, wh):
        db.execute("CREATE TABLE orders (id INT, day DATE, region VARCHAR, amount DECIMAL(18,2))")
    src.execute("INSERT INTO orders SELECT i, DATE '2026-11-01' + CAST(i % 5 AS INTEGER), ['EU','US'][i % 2 + 1], 1.25 "
                "FROM range(100) t(i)")
    wh.execute(f"ATTACH '{src.path}' AS s (READ_ONLY); INSERT INTO orders SELECT * FROM s.orders "
               "WHERE NOT (region = 'US' AND day IN (DATE '2026-11-03', DATE '2026-11-04')); "
               "CREATE TABLE orders_summary AS SELECT count(*) AS n FROM orders")
    faults: dict[str, list] = {"orders": [], "orders_summary": []}

    def fault(name: str) -> None:
        if faults[name]:
            raise faults[name].pop(0)

    @dg.asset(key=ORDERS, partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run())
    def orders(context: dg.AssetExecutionContext, warehouse: DatabaseResource) -> None:
        fault("orders")
        w = warehouse.get_database()
        for pk in context.partition_keys:
            w.execute(f"DELETE FROM orders WHERE day = DATE '{pk}'; ATTACH '{src.path}' AS s (READ_ONLY); "
                      f"INSERT INTO orders SELECT * FROM s.orders WHERE day = DATE '{pk}'")

    @dg.asset(key=SUMMARY, deps=[ORDERS])
    def orders_summary(warehouse: DatabaseResource) -> None:
        fault("orders_summary")
        warehouse.get_database().execute("CREATE OR REPLACE TABLE orders_summary AS SELECT count(*) AS n FROM orders")

    recon = build_reconciliation_checks(asset=ORDERS, source_asset="orders_source", source_table="orders",
                                        target_table="orders", slice_by=["region"], measures=["amount"],
                                        key_columns=["id"], source_resource_key="source",
                                        target_resource_key="warehouse", name="compare")
    verify_job = dg.define_asset_job("verify_orders", selection=dg.AssetSelection.checks(dg.AssetCheckKey(ORDERS, "compare")))
    window_job = dg.define_asset_job("rerun_orders", selection=dg.AssetSelection.assets(ORDERS), partitions_def=DAILY)
    rebuild_job = dg.define_asset_job("rebuild_summary", selection=dg.AssetSelection.assets(SUMMARY))
    defs = dg.Definitions(
        assets=[orders, orders_summary, dg.AssetSpec("orders_source")], asset_checks=[recon],
        jobs=[verify_job, window_job, rebuild_job, build_receipt_job()],
        sensors=[build_remediation_sensor(partitions_def=DAILY, window_job=window_job, rebuild_job=rebuild_job,
                                          verify_job=verify_job, receipt_job=build_receipt_job())],
        resources={"source": DatabaseResource(url=f"duckdb:///{src.path}"),
                   "warehouse": DatabaseResource(url=f"duckdb:///{wh.path}")},
        executor=dg.in_process_executor)
    with dg.instance_for_test() as instance:
        cs, _ = propose(instance, _change_set())
        assert approve_in_process(instance, cs.id, approver=OWNER)[0]
        yield defs, instance, wh, faults, cs, LocalSensorDaemon(defs, instance, log_level="CRITICAL")


def _change_set() -> ChangeSet:
    now = utcnow()
    return ChangeSet.seal(
        id="cs-live00001", incident_id="inc-live", diagnosis_id="dg-live", domain="orders", proposer=c.PROPOSER,
        created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=[OWNER],
        cause_kind="late_rows_behind_watermark", summary="rerun 11-03..11-04", target_asset=["orders"],
        window=["2026-11-03", "2026-11-04"], diff="", files=[], rebuild_assets=[["orders_summary"]],
        verify_checks=[["orders", "compare"]], change_classes=["rerun_window", "rebuild_models"], undo="rerun again")


def _operational_error() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("INSERT INTO event_logs ...", {}, Exception(
        "server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally"))


def _ticks(daemon: LocalSensorDaemon, n: int = 12) -> list[str]:
    """Tick the remediation sensor until it dispatches nothing more; the stages of the runs it launched."""
    stages = []
    for _ in range(n):
        tick = daemon.tick("dw_remediation_sensor")
        if not tick.run_ids and not tick.failed_run_ids:
            break
        stages += [daemon.instance.get_run_by_id(r).tags[c.STAGE_TAG] for r in tick.run_ids + tick.failed_run_ids]
    return stages


def _gap(wh) -> int:
    return 100 - wh.fetch_all("SELECT count(*) FROM orders")[0][0]


def _worker_killed_before_the_first_step(defs, instance) -> str:
    """The daemon's run of the next stage, taken by the coordinator, whose worker died before a step: the
    code server reports it failed (what Dagster does when a run's process exits)."""
    (rr,) = defs.resolve_sensor_def("dw_remediation_sensor").evaluate_tick(
        dg.build_sensor_context(instance=instance, definitions=defs)).run_requests
    run = instance.create_run_for_job(defs.resolve_job_def(rr.job_name), tags=dict(rr.tags),
                                      asset_selection=frozenset(rr.asset_selection or ()) or None,
                                      run_config=rr.run_config)
    plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    admit_run(instance, RunFacts.of_run(run, plan=plan))  # bound at submission
    instance.report_engine_event("Run execution process for it unexpectedly exited with signal 9 (SIGKILL).", run)
    instance.report_run_failed(run)
    return run.run_id


def test_a_stage_whose_worker_died_before_its_first_step_runs_again_under_the_same_approval(world):
    defs, instance, wh, faults, cs, daemon = world
    killed = _worker_killed_before_the_first_step(defs, instance)
    assert _ticks(daemon) == ["window-1", "rebuild", "verify", "receipt"]
    led = ledger_for(instance)
    row = led.change_set_row(cs.id)
    assert row.state == "applied" and _gap(wh) == 0
    window = led.stages(cs.id, row.version)["window-1"]
    assert window.run_id != killed and window.result["attempts"] == 2
    (d,) = led.decisions(cs.id)  # the one approval the owner gave
    assert d["active"] and window.approval_id == d["approval_id"]
    (r,) = records.receipts(instance, ORDERS)
    assert r.verified and r.outcome == "applied"


def test_three_runs_that_never_start_a_step_fail_the_stage(world):
    defs, instance, wh, faults, cs, daemon = world
    led = ledger_for(instance)
    killed = [_worker_killed_before_the_first_step(defs, instance) for _ in range(3)]
    for _ in range(3):
        daemon.tick("dw_remediation_sensor")  # the receipt of the failed repair, then the end
    row = led.change_set_row(cs.id)
    window = led.stages(cs.id, row.version)["window-1"]
    assert window.state == "failed" and "3 runs ended before executing a step" in window.result["reason"]
    assert killed[-1] == window.run_id and row.state == "failed" and _gap(wh) == 20
    assert "no data changed" in row.note  # nothing is stale


def test_a_connection_error_mid_stage_is_retried_after_the_backoff(world):
    defs, instance, wh, faults, cs, daemon = world
    faults["orders_summary"].append(_operational_error())  # the rebuild's first run loses its storage
    assert _ticks(daemon) == ["window-1", "rebuild", "rebuild", "verify", "receipt"]
    led = ledger_for(instance)
    row = led.change_set_row(cs.id)
    assert row.state == "applied" and _gap(wh) == 0
    assert led.stages(cs.id, row.version)["rebuild"].result["attempts"] == 2


def test_connection_errors_past_the_last_attempt_fail_the_repair_saying_what_is_stale(world):
    defs, instance, wh, faults, cs, daemon = world
    faults["orders_summary"] += [_operational_error() for _ in range(3)]
    assert _ticks(daemon) == ["window-1", "rebuild", "rebuild", "rebuild", "receipt"]
    led = ledger_for(instance)
    row = led.change_set_row(cs.id)
    assert row.state == "failed" and "left stale: orders_summary" in row.note
    assert f"dw-dagster approve {cs.id} --login" in row.note and f"dw-dagster undo {cs.id}" in row.note
    (r,) = [x for x in records.receipts(instance, SUMMARY) if x.change_set_id == cs.id]
    assert r.outcome.startswith("failed at rebuild") and "left stale: orders_summary" in r.outcome and not r.verified


def test_a_step_failing_in_user_code_is_not_retried_and_the_owner_finishes_the_repair(world):
    defs, instance, wh, faults, cs, daemon = world
    faults["orders_summary"].append(ValueError("division by zero in the summary model"))
    assert _ticks(daemon) == ["window-1", "rebuild", "receipt"]
    led = ledger_for(instance)
    row = led.change_set_row(cs.id)
    assert row.state == "failed" and "left stale: orders_summary" in row.note and _gap(wh) == 0
    # the owner fixed the model; approving the same version again finishes the repair
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER, comment="summary model fixed; finish it")
    assert ok, msg
    assert _ticks(daemon) == ["rebuild", "verify", "receipt"]  # the window is not rerun
    row = led.change_set_row(cs.id)
    assert row.state == "applied"
    decisions = led.decisions(cs.id)
    assert [d["active"] for d in decisions] == [True, False] and "approved finishing it" in decisions[1]["withdrawn_reason"]
    receipts = [x for x in records.receipts(instance, ORDERS) if x.change_set_id == cs.id]  # newest first
    assert [r.outcome.split(" ")[0] for r in receipts] == ["applied", "failed"]
    assert receipts[0].verified and not receipts[1].verified and "left stale: orders_summary" in receipts[1].outcome
