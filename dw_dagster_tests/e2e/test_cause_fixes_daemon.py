"""Issue 31 through a real ``dagster dev`` daemon: every diagnosed cause gets its change set and the test
that would have caught it, and the daemon walks it from the incident to the receipt naming the test.

Where :mod:`dw_dagster_tests.repair.test_cause_fixes` and :mod:`dw_dagster_tests.repair.test_cause_fix_contract`
tick the sensors in process (``LocalSensorDaemon``), this file starts ``dagster dev`` (webserver, daemon,
code server; :mod:`dw_dagster_tests.harness.dagster_dev`) once, on the code location
:mod:`.cause_location`: five worlds of :mod:`dw_dagster_tests.repair.cause_world` side by side (their
own DuckDB files and git pipeline repositories), so the five incidents go through the same daemon ticks.

The test process tells each world's story (loads run on the instance of the same ``DAGSTER_HOME``,
before ``dagster dev`` starts; the loads run no checks) and then runs its ``compare`` check in process; from there the daemon's incident sensor opens the
incident and launches the diagnosis, which proposes the change set with its new test; the owner
approves through the approval job (``approve_in_process``, what ``dw-dagster approve`` runs: the
decision is checked against the domains file and recorded in the ledger the daemon reads; launching
it through GraphQL costs a run worker process a decision, and the main daemon test does that
already); the world's remediation sensor waits for
the owner's merge, then launches the repair stages, the verify stage (the new test runs, and passes)
and the receipt, which names the test. Each test reads one cause's records back from the instance.

The causes come from failures reported in the field (the same sources as the in-process tests):

========================  ===============================================================================
upstream failed           https://github.com/dagster-io/dagster/issues/18441: no "upstream
                          materializations are missing" warning when the upstream partition failed; its
                          reader ran on the missing partition anyway
upstream stale            https://github.com/dagster-io/dagster/issues/14385: partitioned assets not
                          marked stale when the upstream has new data; the reader ran on old data
duplicated load           https://github.com/airbytehq/airbyte/issues/12336 (each failed-sync retry
                          appends the records again), https://github.com/dbt-labs/dbt-core/issues/10432
                          (duplicate rows on the merge key of an incremental model)
schema change, rollback   https://github.com/dbt-labs/dbt-core/issues/10430: a contracted incremental
                          model fails on an upstream column's changed type; the target does not take it
schema change, contract   the same, fixed in the dbt model's enforced contract; the contract's
                          breaking-change rules: https://github.com/dbt-labs/dbt-core/issues/7332
========================  ===============================================================================
"""

import os
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster.approval.job import approve_in_process
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.ledger import ledger_for
from dw_dagster.proposals.watermark import apply_change_set
from dw_dagster_dev.fakes.tableau_server import FakeTableau, FakeTableauServer
from dw_dagster_tests.e2e import cause_location as cl
from dw_dagster_tests.harness.dagster_dev import dagster_dev, write_instance_yaml
from dw_dagster_tests.repair import cause_world as cw
from dw_dagster_tests.repair.cause_world import OWNER

LOCATION = "causes"
SENSOR_TAG, RUN_KEY_TAG = "dagster/sensor_name", "dagster/run_key"
TIMEOUT = 240  # all five worlds at one step (a tick, the queue and a run worker process: ~25 s on 2 busy cores)
REPAIR_TIMEOUT = 480  # all five repairs, up to five stages each (~130 s on 2 busy cores)


@dataclass
class Drive:
    """What the test process saw while the daemon drove the five worlds."""

    dev: object
    instance: dg.DagsterInstance
    worlds: dict
    approval_runs: dict = field(default_factory=dict)  # cause → the approval job's run
    before_merge: dict = field(default_factory=dict)  # cause → (stage runs, the sensor's skip reason) before the merge
    seconds: dict = field(default_factory=dict)  # moment → seconds since the five checks failed and dagster dev was up

    def key(self, cause: str) -> dg.AssetKey:
        w = self.worlds[cause]
        return w.model if cause == cl.CONTRACT else w.orders

    def change_set(self, cause: str):
        sets = records.change_sets(self.instance, [self.key(cause)])
        return sets[0] if sets else None

    def stage_runs(self, cs) -> list[dg.DagsterRun]:
        recs = self.instance.get_run_records(filters=dg.RunsFilter(tags={c.CHANGE_SET_TAG: cs.id}))
        return [r.dagster_run for r in sorted(recs, key=lambda r: r.create_timestamp) if c.STAGE_TAG in r.dagster_run.tags]

    def explain(self, what: str) -> str:
        return f"{what}\n{self.dev.log_tail(60)}"


def _until(drive: Drive, cond, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        assert drive.dev.proc.poll() is None, drive.explain(f"dagster dev exited while waiting for {what}")
        time.sleep(1.0)
    raise AssertionError(drive.explain(f"{what} did not happen within {timeout} s"))


def _prepare(instance: dg.DagsterInstance, root: Path, worlds: dict, domains: Path, tableau_url: str) -> None:
    """The worlds, each world's story, then its compare check, in this process on the shared instance: five failing checks."""
    for w in worlds.values():
        w.root.mkdir(parents=True)
        (cw.create_contract_world if isinstance(w, cw.ContractWorld) else cw.create_orders_world)(w)
    defs = cl.cause_definitions(root, domains, tableau_url)
    for cause, story in cw.STORIES.items():
        story(defs, instance, worlds[cause])
    cw.contract_story(instance, worlds[cl.CONTRACT])
    for w in worlds.values():
        detect = defs.resolve_job_def(w.job("detect")).execute_in_process(instance=instance, raise_on_error=False,
                                                                        run_config=cw.QUIET)
        (ev,) = detect.get_asset_check_evaluations()
        assert not ev.passed, w.name


def _approve(drive: Drive, cs) -> str:
    """The owner's decision through the approval job (the domain takes a typed email); its run's id."""
    recorded, message = approve_in_process(drive.instance, cs.id, approver=OWNER, comment="reviewed in the daemon test")
    assert recorded, message
    return records.approvals(drive.instance, cs.id)[0].run_id


def _waiting_since(drive: Drive, cause: str, since: float) -> str | None:
    """The skip reason of the world's remediation sensor's newest tick, if that tick began after ``since``."""
    ticks = drive.dev.sensor_ticks(cl.remediation_sensor_name(cause), limit=1, location=LOCATION)
    if ticks and ticks[0].get("timestamp", 0) > since and ticks[0].get("status") == "SKIPPED":
        return ticks[0].get("skipReason") or ""
    return None


def _drive(drive: Drive) -> None:
    """All five worlds at once: change sets, approvals, the wait for the merge, the merges, the receipts."""
    t0 = time.monotonic()
    causes = list(drive.worlds)
    sets = _until(drive, lambda: all(drive.change_set(k) for k in causes) and {k: drive.change_set(k) for k in causes},
                  "a change set for each of the five incidents")
    drive.seconds["proposed"] = round(time.monotonic() - t0, 1)
    drive.approval_runs = {k: _approve(drive, cs) for k, cs in sets.items()}
    approved = time.time()
    drive.seconds["approved"] = round(time.monotonic() - t0, 1)
    # approved, not merged: each world's remediation sensor ticks, waits for the merge and launches nothing
    waiting: dict = dict.fromkeys(causes)

    def all_waiting() -> bool:
        for k in causes:
            waiting[k] = waiting[k] if waiting[k] is not None else _waiting_since(drive, k, approved + 1.0)
        return all(v is not None for v in waiting.values())

    _until(drive, all_waiting, "a remediation tick after the approvals")
    drive.before_merge = {k: (drive.stage_runs(cs), waiting[k]) for k, cs in sets.items()}
    for k, cs in sets.items():
        apply_change_set(cs, drive.worlds[k].repo, OWNER)
    drive.seconds["merged"] = round(time.monotonic() - t0, 1)

    def ended(k: str) -> bool:
        runs = drive.stage_runs(sets[k])
        return any(r.tags[c.STAGE_TAG] == "receipt" and r.is_finished for r in runs) or any(
            r.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED) for r in runs)

    try:
        _until(drive, lambda: all(ended(k) for k in causes), "the five repairs' receipts", REPAIR_TIMEOUT)
    except AssertionError as e:  # each test reports its own world's state; the log tail is printed once here
        print(e)
    drive.seconds["receipts"] = round(time.monotonic() - t0, 1)


@pytest.fixture(scope="module")
def causes(tmp_path_factory):
    root = tmp_path_factory.mktemp("causes")
    worlds = cl.worlds(root / "worlds")
    domains = cw.domains_file(root / "domains.yaml", worlds.values())
    workspace = root / "workspace.yaml"
    workspace.write_text(textwrap.dedent(f"""\
        load_from:
          - python_module:
              module_name: dw_dagster_tests.e2e.cause_location
              attribute: defs
              location_name: {LOCATION}
        """))
    dagster_home = root / "dagster_home"
    write_instance_yaml(dagster_home)
    tableau = FakeTableauServer(FakeTableau(workbooks={"Store P&L": True}))
    env = {**os.environ, c.SIGNING_KEY_ENV: "cause-daemon-test-signing-key-0123456789", "DW_DOMAINS_FILE": str(domains),
           "DW_TEST_CAUSE_ROOT": str(root / "worlds"), "DW_TEST_TABLEAU_URL": tableau.url,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    with pytest.MonkeyPatch.context() as mp, tableau:
        for k in (c.SIGNING_KEY_ENV, "DW_DOMAINS_FILE"):
            mp.setenv(k, env[k])
        with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
            # the stories before dagster dev starts: told while it ran, they competed with its seven sensors'
            # ticks for the 2 cores (11 minutes in a full run, against one alone)
            _prepare(instance, root / "worlds", worlds, domains, tableau.url)
            with dagster_dev(dagster_home, env, root, workspace=workspace, locations=(LOCATION,)) as dev:
                drive = Drive(dev, instance, worlds)
                _drive(drive)
                yield drive
                print(f"\ncause daemon test: {drive.seconds}")
    assert dev.stragglers == []


def _assert_diagnosed_by_the_daemon(drive: Drive, cause: str):
    """The incident, and its diagnosis run launched by the daemon's incident sensor; the change set."""
    cs = drive.change_set(cause)
    assert cs is not None, drive.explain(f"{cause}: no change set")
    (inc,) = records.incidents(drive.instance, [drive.key(cause)])
    assert cs.incident_id == inc.id and inc.asset_key == list(drive.key(cause).path) and inc.source == "dw_check"
    (run,) = drive.instance.get_runs(filters=dg.RunsFilter(tags={c.INCIDENT_TAG: inc.id}))
    assert run.tags[SENSOR_TAG] == c.CHECK_INCIDENT_SENSOR and run.status == dg.DagsterRunStatus.SUCCESS
    (diag,) = [d for d in records.diagnoses(drive.instance, [drive.key(cause)]) if d.incident_id == inc.id]
    assert cs.diagnosis_id == diag.id and cs.domain == cause
    cw.assert_change_set_names_its_test(cs, drive.key(cause).path)
    return cs


def _assert_approved_through_the_job(drive: Drive, cs, cause: str) -> None:
    (approval,) = records.approvals(drive.instance, cs.id)
    assert (approval.approver, approval.decision, approval.change_set_version) == (OWNER, "approve", cs.version)
    run = drive.instance.get_run_by_id(drive.approval_runs[cause])
    assert run.job_name == c.APPROVAL_JOB and run.tags[c.CHANGE_SET_TAG] == cs.id and run.status == dg.DagsterRunStatus.SUCCESS
    runs, waiting = drive.before_merge[cause]  # the new test is part of the diff: nothing changes data before the merge
    assert runs == [] and "waiting for the owner to merge " in waiting and cs.new_tests[0] in waiting, waiting


def _assert_stages_launched_by_the_daemon(drive: Drive, cs, cause: str) -> list[str]:
    """The stage runs: each launched by the world's remediation sensor after the previous one ended, succeeded."""
    runs = drive.stage_runs(cs)
    summary = [(r.tags[c.STAGE_TAG], r.status.value) for r in runs]
    assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), drive.explain(f"{cause}: {summary}")
    for r in runs:
        stage = r.tags[c.STAGE_TAG]
        assert r.tags[SENSOR_TAG] == cl.remediation_sensor_name(cause), (stage, r.tags)
        assert r.tags[RUN_KEY_TAG].startswith(f"{cs.id}:{cs.version[:16]}:{stage}:") and r.tags["dw/ticket"]
        assert r.tags[c.APPROVAL_TAG] == records.approvals(drive.instance, cs.id)[0].id
    stages = [r.tags[c.STAGE_TAG] for r in runs]
    ledger = ledger_for(drive.instance).stages(cs.id, cs.version)
    assert all(ledger[s].run_id == r.run_id and ledger[s].state == "succeeded" for s, r in zip(stages, runs))
    for before, after in zip(stages, stages[1:]):  # one stage after the other: issued once the previous one ended
        assert ledger[after].issued_at >= ledger[before].finished_at, (before, after)
    return stages


def _assert_verify_ran_the_new_test(drive: Drive, cs, receipt) -> None:
    """The verify run evaluated the new-tests check: the change set's tests ran, and passed."""
    verify = receipt.run_ids["verify"]
    evals = [e.dagster_event.event_specific_data
             for e in drive.instance.all_logs(verify, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)]
    (new,) = [e for e in evals if e.check_name == c.NEW_TESTS_CHECK]
    assert new.passed and new.asset_key == dg.AssetKey(cs.target_asset)
    ran = new.metadata[c.NEW_TESTS_KEY].value
    assert [t["test"] for t in ran] == cs.new_tests and all(t["passed"] and t["failing_rows"] == 0 for t in ran)
    assert all(e.passed for e in evals) and {e.check_name for e in evals} == {"compare", c.NEW_TESTS_CHECK}


@pytest.mark.parametrize("cause", cl.CAUSES)
def test_a_cause_from_incident_to_the_receipt_naming_its_test_through_the_daemon(causes, cause):
    drive = causes
    w = drive.worlds[cause]
    cs = _assert_diagnosed_by_the_daemon(drive, cause)
    if cause == cl.CONTRACT:
        cw.check_contract_proposal(w, cs)
    _assert_approved_through_the_job(drive, cs, cause)
    stages = _assert_stages_launched_by_the_daemon(drive, cs, cause)
    (receipt,) = records.receipts(drive.instance, drive.key(cause))
    assert receipt.change_set_id == cs.id and receipt.approver == OWNER and receipt.signature_valid
    assert set(receipt.run_ids) | {"receipt"} == set(stages)
    assert all(receipt.run_ids[s] == r.run_id for s, r in zip(stages, drive.stage_runs(cs)) if s in receipt.run_ids)
    _assert_verify_ran_the_new_test(drive, cs, receipt)
    (cw.check_contract_repair if cause == cl.CONTRACT else cw.CHECKS[cause])(drive.instance, w, cs, stages, receipt)
