"""Nothing else runs a repair, and the ledger keeps every stage to one run: the attacks in process.

The repair is the small real one of ``test_autonomy_and_stop`` (a daily-partitioned DuckDB asset,
its reconciliation check, dw_dagster's remediation sensor and jobs). Each test launches what a
colleague could launch by hand and shows that it is refused and changes nothing, or that the
ledger, not the runs, decides what happens next.
"""

import multiprocessing
import textwrap

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.core.ledger import ledger_for
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core.models import UndoPlan
from dw_dagster.core import records
from dw_dagster.approval.job import approve_in_process
from dw_dagster.proposals.change_sets import propose
from dw_dagster.guard.admission import RunFacts, RunRefused, admit_run
from dw_dagster.repair.undo import build_undo_jobs, partition_checksum
from dw_dagster_tests.repair.test_autonomy_and_stop import OWNER, _domains, change_set, detect, gap, repair, world  # noqa: F401

WINDOW = ["2026-11-03", "2026-11-04"]
PLAN = UndoPlan(resource_key="warehouse", table="orders", partition_column="day", window=WINDOW)


def _approved(defs, instance, domains, undo_plan=None):
    _domains(domains, "L2")
    cs, _ = propose(instance, change_set(undo_plan=undo_plan))
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    return cs, LocalSensorDaemon(defs, instance, log_level="WARNING")


def test_deleting_the_runs_of_an_applied_change_set_replays_nothing(world):
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    assert repair(daemon) == ["window-1", "verify", "receipt"] and gap(wh) == 0
    for run in instance.get_runs():  # `dagster run delete`, a retention job
        instance.delete_run(run.run_id)
    wh.execute("DELETE FROM orders WHERE day = DATE '2026-11-03'")  # and the data changes again
    tick = daemon.tick("dw_remediation_sensor")
    assert tick.run_ids == [] and gap(wh) == 20
    assert ledger_for(instance).change_set_row(cs.id).state == "applied"


def test_a_run_deleted_mid_stage_ends_the_repair_with_a_receipt_not_a_replay(world):
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    sensor = defs.resolve_sensor_def("dw_remediation_sensor")
    (rr,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests
    run = instance.create_run_for_job(defs.resolve_job_def(rr.job_name), tags=rr.tags,
                                      asset_selection=frozenset(rr.asset_selection))  # the run the daemon makes
    admit_run(instance, RunFacts.of_run(run, ["orders"]))  # what the coordinator does at submission
    instance.delete_run(run.run_id)  # deleted before it recorded an end
    stages = repair(daemon)
    assert stages == ["receipt"] and gap(wh) == 20  # the window never ran again
    (r,) = records.receipts(instance, dg.AssetKey("orders"))
    assert r.outcome.startswith("failed at window-1 (abandoned") and "deleted" in r.outcome and not r.verified
    assert ledger_for(instance).change_set_row(cs.id).state in ("failed", "running")
    daemon.tick("dw_remediation_sensor")
    assert ledger_for(instance).change_set_row(cs.id).state == "failed"


def test_a_failing_run_with_copied_tags_does_not_kill_the_approved_change_set(world):
    """A colleague copies the stage's tags onto a run that fails: it cannot take the stage; the
    sensor's own run does, and the repair completes."""
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    sensor = defs.resolve_sensor_def("dw_remediation_sensor")
    (rr,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests

    @dg.op
    def boom():
        raise RuntimeError("a failing run with the stage's tags")

    @dg.job(name="rerun_orders")  # even the same job name
    def impostor():
        boom()

    forged = impostor.execute_in_process(instance=instance, tags=rr.tags, raise_on_error=False)
    assert not forged.success
    assert ledger_for(instance).stage_by_ticket(rr.tags["dw/ticket"]).state == "issued"
    assert repair(daemon) == ["window-1", "verify", "receipt"] and gap(wh) == 0


def test_a_hand_launched_window_and_stage_tags_are_refused_by_the_guard(world):
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    for tags in ({"dagster/asset_partition_range_start": WINDOW[0], "dagster/asset_partition_range_end": WINDOW[-1]},
                 {"dagster/partition": WINDOW[0], c.CHANGE_SET_TAG: cs.id, c.STAGE_TAG: "window-1", "dw/ticket": "f" * 32}):
        with pytest.raises(RunRefused):
            admit_run(instance, RunFacts("r-x", "rerun_orders", {**tags, "dw/kind": "window"}, ("orders",)))
    with pytest.raises(RunRefused, match="held by change set"):  # any other job on a held partition
        admit_run(instance, RunFacts("r-y", "__ASSET_JOB", {"dagster/partition": WINDOW[1]}, ("orders",)))
    admit_run(instance, RunFacts("r-z", "__ASSET_JOB", {"dagster/partition": "2026-11-05"}, ("orders",)))  # outside: fine
    assert gap(wh) == 20


def test_undo_jobs_by_hand_are_refused_and_never_overwrite_the_kept_copy(world):
    """dw_undo_snapshot after a repair would overwrite the undo copy; dw_undo_restore unapproved
    would put the window back: both need the sensor's ticket."""
    defs, instance, domains, wh = world
    before = partition_checksum(wh, "orders", "day", WINDOW)
    cs, daemon = _approved(defs, instance, domains, undo_plan=PLAN)
    assert repair(daemon) == ["snapshot", "window-1", "verify", "receipt"]
    after = partition_checksum(wh, "orders", "day", WINDOW)
    snapshot_job, restore_job = build_undo_jobs(["warehouse"])
    for job, op in ((snapshot_job, "dw_snapshot_window"), (restore_job, "dw_restore_window")):
        res = job.execute_in_process(instance=instance, raise_on_error=False, resources=defs.resources,
                                     run_config={"ops": {op: {"config": {"change_set_id": cs.id}}}})
        assert not res.success
    from dw_dagster.repair.undo import recorded_snapshot

    snap = recorded_snapshot(instance, cs.id)
    assert (snap["rows"], snap["checksum"]) == before  # the copy is what was there before the repair
    assert partition_checksum(wh, "orders", "day", WINDOW) == after


def _map_in_processes(ctx, n: int, fn, args: list) -> list:
    """``fn`` over ``args`` in ``n`` spawned processes, which then exit on their own (close and join).
    ``with Pool`` terminates them instead, and Dagster turns a SIGTERM into a KeyboardInterrupt, which
    can catch a worker mid-flush and leave the pool waiting for it for ever."""
    pool = ctx.Pool(n)
    try:
        return pool.map(fn, args)
    finally:
        pool.close()
        pool.join()


def _tick(args):
    """One process evaluating the remediation sensor. The ledger's ``issue_ticket`` waits at a barrier
    shared by every process: each has read the (no) stages and decided to issue window-1 before any
    issues it, so only the ledger's uniqueness can keep the stage to one ticket."""
    home, domains, path, barrier = args
    import importlib.util
    import os
    import threading

    from dw_dagster.core.ledger import Ledger

    os.environ["DW_DOMAINS_FILE"] = domains
    issue = Ledger.issue_ticket
    met: list[bool] = []

    def issue_together(self, *a, **kw):
        try:
            barrier.wait(timeout=120)
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)
        return issue(self, *a, **kw)

    Ledger.issue_ticket = issue_together
    spec = importlib.util.spec_from_file_location("guard_world", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with dg.DagsterInstance.from_config(home) as instance:
        tick = mod.SENSOR.evaluate_tick(dg.build_sensor_context(instance=instance))
        return sorted((r.run_key, r.tags["dw/ticket"]) for r in tick.run_requests), met


def test_concurrent_ticks_issue_one_ticket_per_stage(tmp_path):
    """Four processes evaluate the remediation sensor at the same moment (a slow daemon and a
    second one, or a re-executed tick), all four past reading the stages before any issues a ticket
    (a barrier in front of the ledger's write): the stage's ticket is issued once; every request
    carries it."""
    domains = tmp_path / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: orders
            assets: [[orders]]
            approvers: [{OWNER}]
            identity: unverified
        """))
    world_file = tmp_path / "guard_world.py"
    world_file.write_text(textwrap.dedent("""\
        import dagster as dg
        from dw_dagster.receipts.job import build_receipt_job
        from dw_dagster.repair.sensor import build_remediation_sensor
        DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-06")
        W = dg.define_asset_job("rerun_orders", selection=["orders"], partitions_def=DAILY)
        V = dg.define_asset_job("verify_orders", selection=["orders"])
        SENSOR = build_remediation_sensor(partitions_def=DAILY, window_job=W, rebuild_job=V, verify_job=V,
                                          receipt_job=build_receipt_job())
        """))
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    import os

    os.environ["DW_DOMAINS_FILE"] = str(domains)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            cs, _ = propose(instance, change_set())
            assert approve_in_process(instance, cs.id, approver=OWNER)[0]
        ctx = multiprocessing.get_context("spawn")
        with ctx.Manager() as manager:
            barrier = manager.Barrier(4)
            results = _map_in_processes(ctx, 4, _tick, [(str(home), str(domains), str(world_file), barrier)] * 4)
    finally:
        os.environ.pop("DW_DOMAINS_FILE", None)
    assert [met for _, met in results] == [[True]] * 4, results  # every process issued at the same moment
    requests = [r for res, _ in results for r in res]
    assert requests and len({t for _, t in requests}) == 1 and len({k for k, _ in requests}) == 1, results
    with dg.DagsterInstance.from_config(str(home)) as instance:
        stages = ledger_for(instance).stages(cs.id, cs.version)
    assert list(stages) == ["window-1"] and stages["window-1"].state == "issued"


def test_a_malformed_record_is_quarantined_and_nothing_crashes(world):
    """A bad dw/change_set or dw/approval observation, and a ledger body that no longer parses:
    the sensor, the approval job and `change-sets` go on, naming the record; dw_control shows it."""
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    for key in (c.CHANGE_SET_KEY, c.APPROVAL_KEY, c.INCIDENT_KEY):
        instance.report_runless_asset_event(dg.AssetObservation(asset_key=dg.AssetKey("orders"), metadata={
            key: dg.MetadataValue.json({"id": "garbage", "window": "not a list"})}))
    other, _ = propose(instance, change_set().model_copy().__class__.seal(**{
        **change_set().model_dump(exclude={"version"}), "id": "cs-broken00001"}))
    from dw_dagster.core.ledger import change_sets_t

    with ledger_for(instance).engine.begin() as conn:
        conn.execute(change_sets_t.update().where(change_sets_t.c.change_set_id == other.id).values(body="{not json"))
    assert repair(daemon) == ["window-1", "verify", "receipt"]  # the good change set still runs
    refs = {q["ref"] for q in records.quarantined(instance)}
    assert any(r.startswith(f"change_set:{other.id}") for r in refs)
    assert records.find_change_set(instance, other.id) is None
    ok, msg = approve_in_process(instance, other.id, approver=OWNER)
    assert not ok and "does not parse" in msg
    shown = [r.asset_observation.metadata for r in records.iter_observations(instance, dg.AssetKey("dw_control"))]
    assert any("dw/quarantined" in m and m["dw/quarantined"].value["ref"].startswith(f"change_set:{other.id}") for m in shown)
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([str(Path(sys.executable).parent / "dw-dagster"), "change-sets", "--dagster-home",
                          instance.root_directory], capture_output=True, text=True)
    assert out.returncode == 0 and f"QUARANTINED change_set change_set:{other.id}" in out.stdout, out.stderr


def test_an_incident_whose_diagnosis_failed_is_diagnosed_again_and_people_can_close_it(world, tmp_path):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    calls = []

    def flaky(context, incident):
        calls.append(incident.id)
        if len(calls) == 1:
            raise RuntimeError("the warehouse timed out")
        from dw_dagster.core.models import BlastRadius, Diagnosis, utcnow

        return Diagnosis(id="dg-2", incident_id=incident.id, asset_key=incident.asset_key, created_at=utcnow(), causes=[],
                         blast_radius=BlastRadius(root="orders"), gap_rows=incident.gap_rows, unexplained_rows=0), None

    from dw_dagster.diagnosis.job import build_diagnosis_job

    diag = build_diagnosis_job(diagnoser=flaky)
    defs2 = dg.Definitions.merge(dg.Definitions(assets=defs.assets, asset_checks=defs.asset_checks, resources=defs.resources,
                                                sensors=defs.sensors, executor=dg.in_process_executor,
                                                jobs=[j for j in defs.jobs if j.name != diag.name]),
                                 dg.Definitions(jobs=[diag]))
    daemon = detect(defs2, instance)
    first = daemon.tick("dw_check_incident_sensor")
    assert first.failed_run_ids and len(calls) == 1
    (inc,) = records.incidents(instance)
    assert ledger_for(instance).incident(inc.id).state == "diagnosis_failed"
    verify = defs2.resolve_job_def("verify_orders")
    verify.execute_in_process(instance=instance, raise_on_error=False)  # the check fails again: new evidence
    again = daemon.tick("dw_check_incident_sensor")
    assert len(again.run_ids) == 1 and len(calls) == 2
    assert any("diagnosed again" in (e.description or "") for e in again.events)
    assert ledger_for(instance).incident(inc.id).state == "diagnosed"
    import subprocess
    import sys
    from pathlib import Path

    dw = [str(Path(sys.executable).parent / "dw-dagster")]
    home = ["--dagster-home", instance.root_directory]
    no_reason = subprocess.run(dw + ["incidents", "close", inc.id, "--by", OWNER, "--reason", " ", *home],
                               capture_output=True, text=True)
    assert no_reason.returncode == 2
    closed = subprocess.run(dw + ["incidents", "close", inc.id, "--by", OWNER, "--reason", "fixed upstream by hand", *home],
                            capture_output=True, text=True)
    assert closed.returncode == 0 and "closed" in closed.stdout, closed.stderr
    assert ledger_for(instance).incident(inc.id).state == "closed"
    (entry,) = ledger_for(instance).audit_entries("incident_closed", inc.id)
    assert entry["by"] == OWNER and entry["body"]["reason"] == "fixed upstream by hand"
    reopened = subprocess.run(dw + ["incidents", "reopen", inc.id, "--by", OWNER, "--reason", "it came back", *home],
                              capture_output=True, text=True)
    assert reopened.returncode == 0, reopened.stderr
    third = daemon.tick("dw_check_incident_sensor")
    assert len(third.run_ids) == 1 and len(calls) == 3


def test_an_issued_ticket_binds_only_the_run_the_sensor_dispatched(world):
    """A colleague reads the ticket from the queued run's tags and launches first with a wider range,
    another asset selection or a run config that points a resource elsewhere: refused. The run the
    sensor requested, exactly, still takes the stage."""
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    sensor = defs.resolve_sensor_def("dw_remediation_sensor")
    (rr,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests
    wider = {**rr.tags, "dagster/asset_partition_range_start": "2026-11-01"}
    attempts = {
        "partitions": RunFacts("r-1", rr.job_name, wider, ("orders",), ("orders",), {}),
        "assets": RunFacts("r-2", rr.job_name, dict(rr.tags), ("orders", "other"), ("orders", "other"), {}),
        "config": RunFacts("r-3", rr.job_name, dict(rr.tags), ("orders",), ("orders",),
                           {"resources": {"warehouse": {"config": {"url": "duckdb:///elsewhere.duckdb"}}}}),
    }
    for what, facts in attempts.items():
        with pytest.raises(RunRefused, match=f"its {what} differ"):
            admit_run(instance, facts)
    assert ledger_for(instance).stage_by_ticket(rr.tags["dw/ticket"]).state == "issued"
    assert repair(daemon) == ["window-1", "verify", "receipt"] and gap(wh) == 0


class _CountingEventLog:
    """The instance's event log storage, counting every read (writes pass through)."""

    READS = ("get_", "fetch_", "all_", "has_", "can_", "_get")

    def __init__(self, storage) -> None:
        self._storage, self.reads = storage, []

    def __getattr__(self, name):
        if name.startswith(self.READS) and name != "get_event_log_connection":
            self.reads.append(name)
        return getattr(self._storage, name)


def test_the_remediation_tick_and_find_change_set_read_no_event_log(world, monkeypatch):
    """At every step of a repair (approved, window done, verify done, receipt written, applied) the
    remediation sensor's tick and `find_change_set` read the ledger only: their cost does not grow
    with the event log."""
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    sensor = defs.resolve_sensor_def("dw_remediation_sensor")
    real = instance._event_storage
    asked = []
    for _ in range(5):
        counting = _CountingEventLog(real)
        monkeypatch.setattr(instance, "_event_storage", counting)
        data = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        found = records.find_change_set(instance, cs.id)
        monkeypatch.setattr(instance, "_event_storage", real)
        assert counting.reads == [] and found is not None and found.version == cs.version
        asked.append([rr.tags["dw/stage"] for rr in data.run_requests])
        daemon.tick("dw_remediation_sensor")
    assert asked == [["window-1"], ["verify"], ["receipt"], [], []] and gap(wh) == 0
    assert ledger_for(instance).change_set_row(cs.id).state == "applied"



# -- an executor that reads its own settings back from the run's executor (as dagster-celery does) ----

SEEN_BY_EXECUTOR: list[str] = []


class _SelfReadingExecutor(dg.Executor):
    """Runs in process, but its loop asks ``plan_context.executor`` for a setting, as dagster-celery's
    ``core_celery_execution_loop`` calls ``plan_context.executor.app_args()``."""

    def __init__(self, inner: dg.Executor) -> None:
        self.inner = inner

    @property
    def retries(self):
        return self.inner.retries

    def app_args(self) -> dict:
        return {"broker": "memory://"}

    def execute(self, plan_context, execution_plan):
        SEEN_BY_EXECUTOR.append(plan_context.executor.app_args()["broker"])
        yield from self.inner.execute(plan_context, execution_plan)


_self_reading = dg.ExecutorDefinition(
    name="self_reading", config_schema=dg.in_process_executor.config_schema,
    executor_creation_fn=lambda ctx: _SelfReadingExecutor(dg.in_process_executor.executor_creation_fn(ctx)))


@dg.op
def _one() -> int:
    return 1


def _self_reading_job():
    from dw_dagster.guard.admission import guarded_executor

    @dg.job(executor_def=guarded_executor(_self_reading))
    def self_reading_job():
        _one()

    return self_reading_job


def _window_job_on_self_reading():
    from dw_dagster.guard.admission import guarded_executor

    @dg.job(executor_def=guarded_executor(_self_reading), tags={"dw/kind": "window"})
    def window_on_self_reading():
        _one()

    return window_on_self_reading


def test_an_executor_reading_its_settings_from_the_run_runs_behind_the_guard(tmp_path):
    """The guard wraps the executor the run sees; the wrapped executor's own settings stay reachable
    (dagster-celery failed with "'_GuardedExecutor' object has no attribute 'app_args'"), and a
    repair job on it without a ticket is still refused before its step."""
    SEEN_BY_EXECUTOR.clear()
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        ok = dg.execute_job(dg.reconstructable(_self_reading_job), instance=instance)
        assert ok.success and SEEN_BY_EXECUTOR == ["memory://"]
        refused = dg.execute_job(dg.reconstructable(_window_job_on_self_reading), instance=instance, raise_on_error=False)
        assert not refused.success and SEEN_BY_EXECUTOR == ["memory://"]
        assert not [e for e in refused.all_events if e.is_step_start]
        text = " ".join(f"{e.message} {e.dagster_event.event_specific_data}" for e in instance.all_logs(refused.run_id)
                        if e.dagster_event and e.dagster_event.event_type_value in ("RUN_FAILURE", "PIPELINE_FAILURE"))
        assert "dw_dagster refused" in text and "no dw/ticket" in text
