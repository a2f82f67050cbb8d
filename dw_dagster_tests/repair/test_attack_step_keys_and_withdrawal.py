"""Attacks found in review through GraphQL alone (each worked before the fix; the tests keep them refused).

1. A ticket from the UI's "Test sensor" (``sensorDryRun``) launched with ``executionParams.stepKeys``:
   the run had the dispatched job, tags, config and assets, but ran none (or some) of its steps,
   so an empty snapshot stage "succeeded" with no undo copy, an empty receipt stage ended the
   change set applied without a receipt, and a partial rebuild skipped an asset.
2. A ticket issued before the owner was removed from the domains file launched the window after
   the decision had been withdrawn: the sensor counted an issued-but-untaken ticket as "in flight".
3. Terminating the receipt run (``terminateRun``, any UI user) ended the change set failed with no
   receipt on the asset pages; the receipt stage was never tried again.
"""

import dataclasses

import dagster as dg
import pytest

from dw_dagster.approval.job import approve_in_process
from dw_dagster.core import keys as c
from dw_dagster.core.ledger import ledger_for
from dw_dagster.proposals.change_sets import propose
from dw_dagster.guard.admission import TICKET_TAG, RunFacts, RunRefused, admit_run
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_tests.repair.test_autonomy_and_stop import OWNER, _domains, change_set, gap, world  # noqa: F401
from dw_dagster_tests.repair.test_guard import _approved


def _dry_run(defs, instance) -> dg.RunRequest:
    sensor = defs.resolve_sensor_def("dw_remediation_sensor")
    (rr,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests
    return rr


def _run_of(defs, instance, rr: dg.RunRequest) -> dg.DagsterRun:
    return instance.create_run_for_job(defs.resolve_job_def(rr.job_name), tags=dict(rr.tags),
                                       asset_selection=frozenset(rr.asset_selection or ()) or None,
                                       run_config=rr.run_config)


@pytest.mark.parametrize("skipped", [("orders", "orders_compare"), ("orders_compare",), None])
def test_a_dispatched_ticket_binds_no_run_that_skips_steps(world, skipped):
    defs, instance, domains, wh = world
    _approved(defs, instance, domains)
    rr = _dry_run(defs, instance)
    run = _run_of(defs, instance, rr)
    plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    facts = RunFacts.of_run(run, ["orders"], plan=plan)
    assert facts.skipped_steps == ()  # the run the daemon makes runs its whole plan
    # GraphQL launchRun with stepKeys: [] or a subset (None: a door that cannot compare with the plan)
    with pytest.raises(RunRefused, match="skipped_steps differ"):
        admit_run(instance, dataclasses.replace(facts, skipped_steps=skipped, plan_snapshot_id=None))
    assert ledger_for(instance).stage_by_ticket(rr.tags[TICKET_TAG]).run_id is None  # the ticket is still the sensor's
    admit_run(instance, facts)  # the exact dispatched run still binds it



def test_a_ticket_issued_before_the_decision_was_withdrawn_admits_nothing(world):
    defs, instance, domains, wh = world
    _approved(defs, instance, domains)
    rr = _dry_run(defs, instance)  # the attacker holds the window's ticket
    ticket = rr.tags[TICKET_TAG]
    domains.write_text(domains.read_text().replace(OWNER, "someone.else@grocer.example"))  # the owner is removed
    LocalSensorDaemon(defs, instance, log_level="WARNING").tick("dw_remediation_sensor")  # withdraws, takes it back
    assert ledger_for(instance).stage_by_ticket(ticket) is None
    with pytest.raises(RunRefused):
        admit_run(instance, RunFacts.of_run(_run_of(defs, instance, rr), ["orders"]))
    assert gap(wh) == 20


def test_a_withdrawn_decision_binds_no_ticket_even_before_the_sensor_notices(world):
    defs, instance, domains, wh = world
    cs, _ = _approved(defs, instance, domains)
    rr = _dry_run(defs, instance)
    led = ledger_for(instance)
    assert led.withdraw_decision(rr.tags[c.APPROVAL_TAG], "the approver left the domain")
    with pytest.raises(RunRefused, match="no longer counts"):
        admit_run(instance, RunFacts.of_run(_run_of(defs, instance, rr), ["orders"]))
    assert led.stage_by_ticket(rr.tags[TICKET_TAG]).run_id is None and gap(wh) == 20


def test_a_terminated_receipt_run_is_dispatched_again_and_the_receipt_is_written(world):
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    for _ in range(2):  # window, verify
        tick = daemon.tick("dw_remediation_sensor")
        assert tick.run_ids and not tick.failed_run_ids
    rr = _dry_run(defs, instance)
    assert rr.tags[c.STAGE_TAG] == "receipt"
    run = _run_of(defs, instance, rr)
    plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    admit_run(instance, RunFacts.of_run(run, plan=plan))  # the coordinator binds it ...
    instance.report_run_canceled(run, message="terminated from the UI")  # ... and a user terminates it mid-run
    led = ledger_for(instance)
    daemon.tick("dw_remediation_sensor")  # the sensor sees the receipt stage ended without its op ...
    tick = daemon.tick("dw_remediation_sensor")  # ... and dispatches it again
    stages = led.stages(cs.id, led.change_set_row(cs.id).version)
    assert stages["receipt"].state == "succeeded", stages["receipt"]
    assert stages["receipt"].result["verified"] is True and (stages["receipt"].result or {}).get("receipts")
    assert led.change_set_row(cs.id).state == "applied" and gap(wh) == 0 and tick is not None
