"""An attack found in review (it worked before the fix; the test keeps it refused): a cancelled stage run wedges the repair for good.

README rule 2: "a run cancelled while queued (an org-wide stop) gets a fresh ticket, since nothing
ran"; rule 4: "A repair that changed data always ends with a receipt". Anyone in the UI can press
Terminate on a queued or running repair run (GraphQL ``terminateRun``), and ``dw-dagster stop``
cancels queued repair runs itself. Before the fix:

1. ``_Tick._reconcile`` reads ``run.start_time`` on the cancelled ``DagsterRun``; Dagster 1.13's
   ``DagsterRun`` has no such attribute (it is on the run *record*), so every tick raises
   AttributeError for that change set: the stage stays ``started`` forever, no receipt is written
   and its window stays held (the nightly load of those partitions is refused forever).
2. Once (1) is fixed, the fresh ticket goes out with the same run key as the cancelled run, and the
   daemon skips a request whose run key an existing (cancelled) run of the sensor carries:
   the stage stays ``issued`` forever.

Reproduced through ``dagster dev`` too (/tmp/attack/e2e_dos.py: ``terminateRun`` on the QUEUED window run).
"""

import dagster as dg

from dw_dagster.core.ledger import ledger_for
from dw_dagster.testing.local_daemon import RUN_KEY_TAG, SENSOR_NAME_TAG
from dw_dagster.core import records
from dw_dagster.guard.admission import RunFacts, admit_run
from dw_dagster_tests.repair.test_autonomy_and_stop import gap, repair, world  # noqa: F401
from dw_dagster_tests.repair.test_guard import _approved


def _the_daemons_run(defs, instance):
    """The window stage's run exactly as the sensor daemon creates and submits it (bound at submission)."""
    sensor = defs.resolve_sensor_def("dw_remediation_sensor")
    (rr,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests
    tags = {**rr.tags, SENSOR_NAME_TAG: "dw_remediation_sensor", RUN_KEY_TAG: rr.run_key}
    run = instance.create_run_for_job(defs.resolve_job_def(rr.job_name), tags=tags,
                                      asset_selection=frozenset(rr.asset_selection))
    admit_run(instance, RunFacts.of_run(run, ["orders"]))  # GuardedRunCoordinator.submit_run
    return run


def test_a_stage_run_cancelled_while_queued_gets_a_fresh_ticket_and_the_repair_finishes(world):
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    run = _the_daemons_run(defs, instance)
    instance.report_run_canceled(run, message="Terminate pressed on the queued run")  # or `dw-dagster stop`
    assert repair(daemon) == ["window-1", "verify", "receipt"], (
        f"stages { {k: v.state for k, v in ledger_for(instance).stages(cs.id, cs.version).items()} }")
    assert gap(wh) == 0


def test_a_stage_run_terminated_after_it_started_ends_the_repair_with_a_receipt(world):
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    run = _the_daemons_run(defs, instance)
    instance.report_dagster_event(dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_START.value,
                                                  job_name=run.job_name), run_id=run.run_id)
    # its first step started (a run terminated before any step is given a fresh ticket: test_liveness.py)
    instance.report_dagster_event(dg.DagsterEvent(event_type_value=dg.DagsterEventType.STEP_START.value,
                                                  job_name=run.job_name, step_key="orders"), run_id=run.run_id)
    instance.report_run_canceled(run, message="Terminate pressed on the running window run")
    for _ in range(4):
        daemon.tick("dw_remediation_sensor")
    mine = [r for r in records.receipts(instance, dg.AssetKey("orders")) if r.change_set_id == cs.id]
    assert mine and mine[0].outcome.startswith("failed at window-1"), (
        f"no receipt; stages {ledger_for(instance).stages(cs.id, cs.version)}")
    assert ledger_for(instance).change_set_row(cs.id).state == "failed"  # the window is no longer held
