"""How a change set version ends, and what that does to its incident and to its window.

* A version that ends without a repair that proved itself (rejected, expired) releases its incident
  (``unrepaired``, recorded in the ledger's audit): the next failure of the asset's checks is new
  evidence and leads to a new diagnosis, instead of being swallowed by an incident that stays
  ``diagnosed`` for good ("failed again; incident ... is still open").
* A new version recorded while an earlier approved version is being repaired (a re-diagnosis
  mid-repair) does not orphan it: the earlier version is walked to its end with its receipt, its
  window stays held until then, and the new version waits for its own decision.

The world is the small real repair of ``test_autonomy_and_stop`` (a daily-partitioned DuckDB
``orders`` table short of 20 rows, its reconciliation check, dw_dagster's sensors and jobs).
"""

import dagster as dg
import pytest

from dw_dagster.approval.job import approve_in_process
from dw_dagster.core import records
from dw_dagster.core.ledger import LedgerError, ledger_for
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.proposals.change_sets import propose
from dw_dagster.guard.admission import RunFacts, RunRefused, admit_run
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_tests.repair.test_autonomy_and_stop import (  # noqa: F401
    OWNER,
    _domains,
    change_set,
    gap,
    repair,
    world,
)

CHECKS = "dw_check_incident_sensor"


def _with_diagnoser(defs, instance, proposals: list):
    """The world's definitions with a diagnosis job whose n-th diagnosis proposes ``proposals[n]``
    (keyword arguments of ``change_set``; the last one again once they run out): new evidence that
    changes what is proposed, or not. Returns the daemon and the list of incidents diagnosed."""
    from dw_dagster.core.models import BlastRadius, Diagnosis, utcnow

    calls: list[str] = []

    def diagnoser(context, incident):
        kw = proposals[min(len(calls), len(proposals) - 1)]
        calls.append(incident.id)
        d = Diagnosis(id=f"dg-{incident.id}-{len(calls)}", incident_id=incident.id, asset_key=incident.asset_key,
                      created_at=utcnow(), causes=[], blast_radius=BlastRadius(root="orders"), gap_rows=incident.gap_rows,
                      unexplained_rows=0)
        return d, change_set(incident_id=incident.id, **kw)

    diag = build_diagnosis_job(diagnoser=diagnoser)
    merged = dg.Definitions.merge(
        dg.Definitions(assets=defs.assets, asset_checks=defs.asset_checks, resources=defs.resources, sensors=defs.sensors,
                       executor=dg.in_process_executor, jobs=[j for j in defs.jobs if j.name != diag.name]),
        dg.Definitions(jobs=[diag]))
    return merged, LocalSensorDaemon(merged, instance, log_level="WARNING"), calls


def _fail_again(defs, instance) -> None:
    """The asset's reconciliation check runs and fails (the table is still short)."""
    result = defs.resolve_job_def("verify_orders").execute_in_process(instance=instance, raise_on_error=False)
    assert not result.get_asset_check_evaluations()[0].passed


def test_a_rejected_change_set_lets_the_next_failure_diagnose_the_incident_again(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    # the 1st and 2nd diagnoses find different things; the 3rd proposes the 2nd's content again
    defs, daemon, calls = _with_diagnoser(defs, instance, [dict(), dict(classes=("rerun_window",))])
    led = ledger_for(instance)
    _fail_again(defs, instance)
    assert len(daemon.tick(CHECKS).run_ids) == 1
    (inc,) = records.incidents(instance)
    (first,) = records.change_sets(instance)
    ok, msg = approve_in_process(instance, first.id, approver=OWNER, decision="reject", comment="wrong window")
    assert ok, msg
    row = led.incident(inc.id)
    assert row.state == "unrepaired" and "rejected by" in row.note
    (entry,) = led.audit_entries("incident_unrepaired", inc.id)
    assert (entry["by"], entry["body"]["change_set_id"], entry["body"]["version"]) == ("dw-dagster", first.id, first.version)

    _fail_again(defs, instance)  # new evidence: a new diagnosis, a new version waiting for its own decision
    tick = daemon.tick(CHECKS)
    assert len(tick.run_ids) == 1 and not tick.failed_run_ids and calls == [inc.id, inc.id]
    assert any(f"incident {inc.id} diagnosed again" in (e.description or "") for e in tick.events)
    assert instance.get_run_by_id(tick.run_ids[0]).tags["dagster/run_key"] == f"{inc.id}:diagnose:1"
    second = led.change_set_row(first.id)
    assert second.version != first.version and (second.state, second.latest) == ("proposed", True)
    assert led.change_set_row(first.id, first.version).state == "rejected" and led.incident(inc.id).state == "diagnosed"

    assert approve_in_process(instance, first.id, approver=OWNER, decision="reject")[0]
    assert led.incident(inc.id).state == "unrepaired"
    _fail_again(defs, instance)  # a diagnosis that proposes the rejected content again revives nothing
    assert len(daemon.tick(CHECKS).run_ids) == 1 and len(calls) == 3
    row = led.incident(inc.id)
    assert row.state == "unrepaired" and "which is rejected: nothing new to decide" in row.note
    assert [r.state for r in led.change_set_rows(latest_only=False)] == ["rejected", "rejected"]
    _fail_again(defs, instance)  # and the next failure is still new evidence
    assert len(daemon.tick(CHECKS).run_ids) == 1 and len(calls) == 4
    assert gap(wh) == 20


def test_an_expired_change_set_lets_the_next_failure_diagnose_the_incident_again(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    defs, daemon, calls = _with_diagnoser(defs, instance, [dict(expires_in_h=-1.0), dict(classes=("rerun_window",))])
    led = ledger_for(instance)
    _fail_again(defs, instance)
    assert len(daemon.tick(CHECKS).run_ids) == 1
    (inc,) = records.incidents(instance)
    (first,) = records.change_sets(instance)
    assert led.incident(inc.id).state == "diagnosed"
    daemon.tick("dw_expiry_sensor")
    expired = [records.metadata_json(r.asset_observation.metadata, "dw/change_set_expired")
               for r in records.iter_observations(instance, dg.AssetKey(first.target_asset))]
    assert [e["change_set_id"] for e in expired if e] == [first.id]
    row = led.incident(inc.id)
    assert row.state == "unrepaired" and f"change set {first.id} expired" in row.note
    assert [e["body"]["version"] for e in led.audit_entries("incident_unrepaired", inc.id)] == [first.version]

    _fail_again(defs, instance)
    tick = daemon.tick(CHECKS)
    assert len(tick.run_ids) == 1 and not tick.failed_run_ids and calls == [inc.id, inc.id]
    second = led.change_set_row(first.id)
    assert second.version != first.version and second.state == "proposed" and led.incident(inc.id).state == "diagnosed"
    assert approve_in_process(instance, first.id, approver=OWNER)[0]  # the new version gets its own decision
    assert repair(daemon) == ["window-1", "verify", "receipt"] and gap(wh) == 0
    assert led.incident(inc.id).state == "closed"  # its verified receipt closed it


def _held(instance, partition: str) -> bool:
    """Whether a run of another job (the nightly load, `Materialize` in the UI) on ``partition`` is refused."""
    try:
        admit_run(instance, RunFacts("r-nightly", "__ASSET_JOB", {"dagster/partition": partition}, ("orders",)))
    except RunRefused as e:
        assert "held by change set" in e.description
        return True
    return False


def test_a_version_recorded_mid_repair_does_not_orphan_the_running_one(world):
    """Approve, let window-1 run, record an edited version (a re-diagnosis mid-repair): the first
    version is walked to its end with its receipt, its window held until then; the new version
    waits for its own decision, and then for nothing else."""
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    led = ledger_for(instance)
    v1, _ = propose(instance, change_set())
    assert approve_in_process(instance, v1.id, approver=OWNER)[0]
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    first = daemon.tick("dw_remediation_sensor")
    assert [instance.get_run_by_id(r).tags["dw/stage"] for r in first.run_ids] == ["window-1"]
    assert gap(wh) == 0 and _held(instance, "2026-11-03")
    v2, new = propose(instance, change_set(classes=("rerun_window",)))  # the edited version
    assert new and v2.id == v1.id and v2.version != v1.version
    assert (led.change_set_row(v1.id, v1.version).latest, led.change_set_row(v1.id).version) == (False, v2.version)
    assert _held(instance, "2026-11-04")  # still held: v1's repair has not ended
    assert approve_in_process(instance, v2.id, approver=OWNER)[0]  # approved early: it waits for v1's repair
    assert repair(daemon) == ["verify", "receipt"]  # v1 to its end; v2 approved meanwhile, not started
    (r1,) = [r for r in records.receipts(instance, dg.AssetKey("orders")) if r.change_set_version == v1.version]
    assert r1.outcome == "applied" and r1.verified and r1.partitions == ["2026-11-03", "2026-11-04"]
    assert set(r1.run_ids) == {"window-1", "verify"}
    assert led.change_set_row(v1.id, v1.version).state == "applied" and not led.stages(v2.id, v2.version)
    assert repair(daemon) == ["window-1", "verify", "receipt"]  # then v2, under its own approval
    v2_stages = led.stages(v2.id, v2.version)
    assert sorted(v2_stages) == ["receipt", "verify", "window-1"]  # v2 ran only after v1's receipt
    assert min(s.issued_at for s in v2_stages.values()) > led.stages(v1.id, v1.version)["receipt"].finished_at
    assert led.change_set_row(v2.id).state == "applied" and not _held(instance, "2026-11-03")
    assert [r.change_set_version for r in records.receipts(instance, dg.AssetKey("orders"))] == [v2.version, v1.version]


def test_a_version_recorded_before_the_repair_started_supersedes_the_approved_one(world):
    """Approved but not started (no stage issued): the new version replaces it; nothing of the first
    runs, its window is not held, and the new version waits for its own decision."""
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    led = ledger_for(instance)
    v1, _ = propose(instance, change_set())
    assert approve_in_process(instance, v1.id, approver=OWNER)[0]
    assert _held(instance, "2026-11-03")
    v2, _ = propose(instance, change_set(classes=("rerun_window",)))
    assert led.change_set_row(v1.id, v1.version).state == "superseded" and not _held(instance, "2026-11-03")
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    tick = daemon.tick("dw_remediation_sensor")
    assert tick.run_ids == [] and "waiting for approval" in tick.skip_reason
    assert led.stages(v1.id, v1.version) == {} and gap(wh) == 20
    with pytest.raises(LedgerError, match="is not approved or running"):
        led.issue_ticket(v1.id, v1.version, "window-1", "ap-x", "rerun_orders")
