"""An attack found in review (it worked before the fix; the test keeps it refused): any UI user blocks an approved repair by squatting its run key.

Run keys are ``<change set>:<version[:16]>:<stage>``: predictable as soon as the change set is
proposed (the ledger, the ``dw/change_set`` observation). A colleague launches any run they may
launch (here the checks-only verify job, which needs no ticket) with the tags
``dagster/sensor_name=dw_remediation_sensor`` and ``dagster/run_key=<that key>``; GraphQL
``launchRun`` accepts both. Dagster's sensor daemon then skips the stage's run request on every
tick ("already completed with run keys": ``dagster._daemon.sensor.fetch_existing_runs`` matches on
those two tags and the repository); the ticket stays ``issued`` forever, nothing is dispatched,
no receipt, and the window stays held. ``LocalSensorDaemon`` applies the daemon's same rule.

Reproduced through ``dagster dev`` (/tmp/attack/e2e_dos.py): the daemon logged
``Skipping 1 run for sensor dw_remediation_sensor already completed with run keys: ["cs-squatted:...:window-1"]``.
"""

from dw_dagster.testing.local_daemon import RUN_KEY_TAG, SENSOR_NAME_TAG
from dw_dagster_tests.repair.test_autonomy_and_stop import gap, repair, world  # noqa: F401
from dw_dagster_tests.repair.test_guard import _approved


def test_a_run_with_the_sensors_name_and_a_predicted_run_key_does_not_block_the_repair(world):
    defs, instance, domains, wh = world
    cs, daemon = _approved(defs, instance, domains)
    squat = instance.create_run_for_job(defs.resolve_job_def("verify_orders"), tags={
        SENSOR_NAME_TAG: "dw_remediation_sensor", RUN_KEY_TAG: f"{cs.id}:{cs.version[:16]}:window-1"})
    instance.report_run_failed(squat, message="the colleague's run ended (any status but NOT_STARTED)")
    assert repair(daemon) == ["window-1", "verify", "receipt"] and gap(wh) == 0
