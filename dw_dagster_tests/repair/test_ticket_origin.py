"""A stage ticket binds the code location, repository and daemon tick that dispatched it (in process, fast).

Found in review (issue 23, item 1): a ticket bound the job name and the run's shape only, and every
location built with ``build_dw_definitions`` has jobs of the same names, so a staging copy of the
location ran every stage with production's tickets; and "Test sensor" handed tickets out.
``dw_dagster_tests/e2e/test_repair_identity_and_liveness.py`` attacks this through GraphQL against a
real deployment; here each rule is checked on its own, with the sensor evaluated the way a code
server evaluates it (a ``SensorEvaluationContext`` naming its code location, with or without a
daemon tick) and tick records written to the instance as the daemon writes them:

- in a daemon tick, the ticket binds only a run the daemon reserved in that tick, of that location
  and repository: a run of the same job from another location, a run made in process and a run
  launched otherwise (its id not reserved) are refused, and the stage stays the sensor's;
- outside a daemon tick (the UI's "Test sensor"), the sensor shows its requests with no ticket and
  issues nothing; a forged tick id changes nothing.
"""

import dataclasses
import time

import dagster as dg
import pytest
from dagster._core.definitions.selector import InstigatorSelector
from dagster._core.definitions.sensor_definition import SensorEvaluationContext
from dagster._core.remote_origin import RegisteredCodeLocationOrigin
from dagster._core.scheduler.instigation import InstigatorType, TickData, TickStatus

from dw_dagster.core.ledger import ledger_for
from dw_dagster.guard.admission import TICKET_TAG, RunFacts, RunRefused, admit_run
from dw_dagster_tests.repair.test_autonomy_and_stop import world  # noqa: F401
from dw_dagster_tests.repair.test_guard import _approved

SENSOR, LOCATION, REPO = "dw_remediation_sensor", "store_sales", "__repository__"


def _tick(instance, status=TickStatus.STARTED, name=SENSOR, location=LOCATION):
    selector = InstigatorSelector(location_name=location, repository_name=REPO, name=name)
    ended = {"skip_reason": "nothing to do"} if status == TickStatus.SKIPPED else {}
    return instance.create_tick(TickData(instigator_origin_id="origin", instigator_name=name,
                                         instigator_type=InstigatorType.SENSOR, status=status, timestamp=time.time(),
                                         selector_id=selector.get_id(), **ended))


def _evaluate(defs, instance, log_key=None) -> dg.RunRequest | None:
    """The remediation sensor evaluated as a code server of location store_sales evaluates it."""
    context = SensorEvaluationContext(instance_ref=instance.get_ref(), instance=instance, log_key=log_key,
                                      repository_name=REPO, repository_def=defs.get_repository_def(),
                                      sensor_name=SENSOR, code_location_origin=RegisteredCodeLocationOrigin(LOCATION))
    requests = defs.resolve_sensor_def(SENSOR).evaluate_tick(context).run_requests
    return requests[0] if requests else None


def _facts(defs, instance, rr: dg.RunRequest, location: str | None = LOCATION) -> RunFacts:
    run = instance.create_run_for_job(defs.resolve_job_def(rr.job_name), tags=dict(rr.tags),
                                      asset_selection=frozenset(rr.asset_selection))
    return dataclasses.replace(RunFacts.of_run(run, ["orders"]), location=location, repository=REPO if location else None)


def test_a_daemon_ticket_binds_only_the_run_reserved_in_its_tick_of_its_location(world):
    defs, instance, domains, wh = world
    cs, _ = _approved(defs, instance, domains)
    tick = _tick(instance)
    rr = _evaluate(defs, instance, log_key=[REPO, SENSOR, str(tick.tick_id)])
    ticket = rr.tags[TICKET_TAG]
    led = ledger_for(instance)
    row = led.stage_by_ticket(ticket)
    assert row.dispatch == {"location": LOCATION, "repository": REPO, "ticks": [str(tick.tick_id)]}

    staging = _facts(defs, instance, rr, location="store_sales_staging")
    with pytest.raises(RunRefused, match="a job of the same name in another location is another run"):
        admit_run(instance, staging)
    with pytest.raises(RunRefused, match="has no code location"):
        admit_run(instance, _facts(defs, instance, rr, location=None))  # `dagster job execute`, execute_in_process
    launched = _facts(defs, instance, rr)  # same location, same shape, but launched through the UI or GraphQL
    with pytest.raises(RunRefused, match="binds only the run the daemon created for it"):
        admit_run(instance, launched)
    assert led.stage_by_ticket(ticket).run_id is None  # still the sensor's

    daemons = _facts(defs, instance, rr)  # the run the daemon creates with the id it reserved in the tick
    instance.update_tick(tick.with_run_requests([rr], reserved_run_ids=[daemons.run_id]))
    admit_run(instance, daemons)
    assert led.stage_by_ticket(ticket).run_id == daemons.run_id
    with pytest.raises(RunRefused, match="another location"):  # and once taken, a copy elsewhere is still refused
        admit_run(instance, staging)


def test_test_sensor_shows_the_requests_without_a_ticket_and_issues_nothing(world):
    defs, instance, domains, wh = world
    cs, _ = _approved(defs, instance, domains)
    led = ledger_for(instance)
    for log_key in (None, [REPO, SENSOR, "20261128_101500"], [REPO, SENSOR, "999999"]):  # no tick, a forged one
        rr = _evaluate(defs, instance, log_key=log_key)
        assert rr is not None and TICKET_TAG not in rr.tags and rr.run_key.endswith(":dry-run")
        assert led.stages(cs.id, cs.version) == {}
    other = _tick(instance, name="dw_check_incident_sensor")  # another sensor's tick is no tick of this one
    done = _tick(instance, status=TickStatus.SKIPPED)  # nor is a tick that ended
    for t in (other, done):
        rr = _evaluate(defs, instance, log_key=[REPO, SENSOR, str(t.tick_id)])
        assert TICKET_TAG not in rr.tags
    assert led.stages(cs.id, cs.version) == {}
    with pytest.raises(RunRefused, match="held by change set"):  # what the dry run showed, launched: refused
        admit_run(instance, _facts(defs, instance, rr))
