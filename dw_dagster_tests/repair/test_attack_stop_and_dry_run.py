"""An attack found in review (it worked before the fix; the test keeps it refused): tickets handed out by a dry run still run during an org-wide stop.

GraphQL ``sensorDryRun`` (the UI's "Test sensor" button, open to anyone who may start sensors)
evaluates the remediation sensor in the code server against the real instance: the sensor issues
the stage's ticket in the ledger and the response lists it in the run request's tags, although no
run is launched (tried through ``dagster dev``: /tmp/attack/e2e_attack.py, E1). Whoever holds that
ticket can launch the stage's run themselves. The guard's checks at binding are the job and (since
68a194d) the run's shape; nothing re-checks the org-wide stop or the approval, so the stage runs
while ``dw-dagster stop`` is in force ("halts every automatic dispatch at once", README rule 6).
"""

import dagster as dg
import pytest

from dw_dagster.guard.stop import set_stop
from dw_dagster.guard.admission import RunFacts, RunRefused, admit_run
from dw_dagster_tests.repair.test_autonomy_and_stop import world  # noqa: F401
from dw_dagster_tests.repair.test_guard import _approved


def test_a_ticket_issued_before_an_org_wide_stop_admits_no_run_during_it(world):
    defs, instance, domains, wh = world
    _approved(defs, instance, domains)
    sensor = defs.resolve_sensor_def("dw_remediation_sensor")
    (rr,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests  # a dry run
    set_stop(instance, True, "cto@grocer.example", "nothing changes tonight")
    run = instance.create_run_for_job(defs.resolve_job_def(rr.job_name), tags=dict(rr.tags),
                                      asset_selection=frozenset(rr.asset_selection))  # the exact dispatched shape
    with pytest.raises(RunRefused, match="stop"):
        admit_run(instance, RunFacts.of_run(run, ["orders"]))
