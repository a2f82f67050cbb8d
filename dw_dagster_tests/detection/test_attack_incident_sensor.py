"""An attack found in review (it worked before the fix; the test keeps it refused): the incident sensor can be silenced from the UI.

``build_check_incident_sensor`` promises "exactly one Incident per new failing evaluation", but it
reads only the *latest* evaluation of each check and trusts its cursor:

1. a failing evaluation followed, before the next tick (30 s), by a passing one is never seen. Any
   UI user can add that passing one: GraphQL ``reportAssetCheckEvaluations(passed: true)`` (tried
   through ``dagster dev``: accepted, stored as the latest evaluation; /tmp/attack/e2e_attack.py E6);
2. GraphQL ``setSensorCursor`` (anyone who may start/stop sensors) can set
   ``{"orders:compare": 10**15}``; every later failure has a smaller storage id and is skipped
   forever, while the sensor looks healthy (its ticks succeed, empty).
"""

import json

import dagster as dg

from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core import records
from dw_dagster_tests.repair.test_autonomy_and_stop import _domains, world  # noqa: F401

CHECK = dg.AssetCheckKey(dg.AssetKey("orders"), "compare")


def _fail(defs, instance) -> None:
    result = defs.resolve_job_def("verify_orders").execute_in_process(instance=instance, raise_on_error=False)
    assert not result.get_asset_check_evaluations()[0].passed


def test_a_failure_followed_by_a_runless_pass_still_opens_an_incident(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    _fail(defs, instance)
    instance.report_runless_asset_event(dg.AssetCheckEvaluation(  # what reportAssetCheckEvaluations stores
        asset_key=CHECK.asset_key, check_name=CHECK.name, passed=True, metadata={}))
    daemon.tick("dw_check_incident_sensor")
    assert len(records.incidents(instance)) == 1


def test_a_cursor_set_past_the_event_log_does_not_silence_new_failures(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    daemon.cursors["dw_check_incident_sensor"] = json.dumps({CHECK.to_user_string(): 10**15})  # setSensorCursor
    _fail(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    assert len(records.incidents(instance)) == 1
