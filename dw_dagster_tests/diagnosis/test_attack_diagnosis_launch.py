"""The diagnosis job diagnoses only incidents the ledger holds: hand launches are refused and change nothing.

The diagnosis job is an ordinary job in the code location: anyone can open it in the Launchpad
and type an ``incident_json``. Once, such a run recorded the made-up incident as if a sensor had
opened it, diagnosed it, and that "diagnosed" incident then swallowed every real failure of the
asset's checks ("failed again; incident ... is still open"). The world is the small real repair of
``test_autonomy_and_stop`` (a DuckDB ``orders`` table short of 20 rows, its reconciliation check,
the check-incident sensor and the diagnosis job).
"""

import datetime as dt

import dagster as dg

from dw_dagster.core import records
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import Incident, utcnow
from dw_dagster_tests.repair.test_autonomy_and_stop import _domains, detect, world  # noqa: F401

DIAGNOSE = "dw_diagnose_incident"


def _launch(defs, instance, incident_json: str) -> dg.ExecuteInProcessResult:
    """The diagnosis job run as a colleague runs it from the Launchpad: typed config, no sensor."""
    return defs.resolve_job_def(DIAGNOSE).execute_in_process(
        instance=instance, raise_on_error=False,
        run_config={"ops": {"dw_diagnose": {"config": {"incident_json": incident_json}}}})


def _failure(result: dg.ExecuteInProcessResult) -> str:
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    return failure.event_specific_data.error.message


def _fake(asset="orders", **kw) -> Incident:
    return Incident(id="inc-madeup00001", asset_key=[asset], source="dw_check", check_name="compare",
                    detected_at=utcnow() - dt.timedelta(hours=1), summary="typed into the Launchpad", gap_rows=999, **kw)


def test_a_made_up_incident_is_refused_and_the_real_failure_gets_its_own_diagnosis(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    forged = _launch(defs, instance, _fake().model_dump_json())
    assert not forged.success
    msg = _failure(forged)
    assert "refused: incident inc-madeup00001 is not in this instance's ledger" in msg and "records none itself" in msg
    led = ledger_for(instance)
    assert led.incidents() == [] and records.diagnoses(instance) == [] and records.change_sets(instance) == []
    # the real failure: the check fails, the sensor opens its own incident and diagnoses it
    daemon = detect(defs, instance)
    tick = daemon.tick("dw_check_incident_sensor")
    assert len(tick.run_ids) == 1 and not tick.failed_run_ids
    (inc,) = records.incidents(instance)
    assert inc.source == "dw_check" and inc.id != "inc-madeup00001" and inc.gap_rows == 20
    assert led.incident(inc.id).state == "diagnosed"
    (diag,) = records.diagnoses(instance)
    (cs,) = records.change_sets(instance)
    assert diag.incident_id == inc.id and cs.incident_id == inc.id


def test_an_altered_or_repeated_diagnosis_of_a_real_incident_changes_nothing(world):
    """A copy of a real incident's config with another gap, or another asset; and the real config run
    again after it was diagnosed (a re-execution): refused, the incident's state untouched."""
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    daemon = detect(defs, instance)
    assert len(daemon.tick("dw_check_incident_sensor").run_ids) == 1
    (inc,) = records.incidents(instance)
    led = ledger_for(instance)
    before = led.incident(inc.id)
    assert before.state == "diagnosed"
    for changed, field in ((inc.model_copy(update={"gap_rows": 5}), "gap_rows"),
                           (inc.model_copy(update={"asset_key": ["orders_source"]}), "asset_key")):
        result = _launch(defs, instance, changed.model_dump_json())
        assert not result.success and f"differs from incident {inc.id} as recorded ({field})" in _failure(result)
    again = _launch(defs, instance, inc.model_dump_json())
    assert not again.success
    assert f"incident {inc.id} is diagnosed, not waiting for a diagnosis" in _failure(again)
    assert "dw-dagster incidents rediagnose" in _failure(again)
    after = led.incident(inc.id)
    assert (after.state, after.attempts, after.note, after.updated_at) == (before.state, before.attempts, before.note,
                                                                           before.updated_at)
    assert len(records.diagnoses(instance)) == 1 and len(records.change_sets(instance)) == 1
    assert daemon.tick("dw_check_incident_sensor").run_ids == []  # and nothing new is asked
