"""A diagnosis the ledger owes is requested until it starts, and launched once.

A sensor tick records its incidents in the ledger while it runs, but its run requests live only in
its result: the UI's "Test sensor" evaluates a tick and launches nothing, and a daemon that dies
after the tick loses them. Every tick therefore requests again the diagnosis of each incident still
waiting for it, under a run key that depends only on the ledger (the incident id, then
``<id>:diagnose:<n>`` for the n-th time it is asked again): the daemon, like
:class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon`, launches each key once per sensor.
The world is the small real repair of ``test_autonomy_and_stop`` (the check-incident sensor and the
diagnosis job on a DuckDB table short of 20 rows).
"""

import subprocess
import sys
from pathlib import Path

import dagster as dg

from dw_dagster.core import records
from dw_dagster.core.ledger import ledger_for
from dw_dagster_tests.repair.test_autonomy_and_stop import OWNER, _domains, detect, world  # noqa: F401

SENSOR = "dw_check_incident_sensor"
DIAGNOSE = "dw_diagnose_incident"


def _dry_run(defs, instance):
    """The UI's "Test sensor": the tick is evaluated against the instance, nothing is launched."""
    return defs.resolve_sensor_def(SENSOR).evaluate_tick(
        dg.build_sensor_context(instance=instance, definitions=defs, sensor_name=SENSOR))


def _diagnosis_runs(instance) -> list[dg.DagsterRun]:
    return sorted(instance.get_runs(filters=dg.RunsFilter(job_name=DIAGNOSE)), key=lambda r: r.tags["dagster/run_key"])


def test_an_incident_a_dry_run_recorded_is_diagnosed_once_by_the_next_ticks(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    daemon = detect(defs, instance)
    (asked,) = _dry_run(defs, instance).run_requests
    (inc,) = records.incidents(instance)
    assert asked.run_key == inc.id and ledger_for(instance).incident(inc.id).state == "open"
    ticks = [daemon.tick(SENSOR) for _ in range(3)]
    assert [len(t.run_ids) for t in ticks] == [1, 0, 0] and not any(t.failed_run_ids for t in ticks)
    assert [r.tags["dagster/run_key"] for r in _diagnosis_runs(instance)] == [inc.id]
    assert ledger_for(instance).incident(inc.id).state == "diagnosed" and len(records.diagnoses(instance)) == 1


def test_incidents_rediagnose_leads_to_exactly_one_new_diagnosis_even_when_its_tick_is_lost(world):
    """`dw-dagster incidents rediagnose` twice: the first time the next ticks launch one diagnosis;
    the second time the tick that moved the incident to `open` is a dry run (its request lost), and
    the ticks after it still launch exactly one (under the attempt's own run key)."""
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    daemon = detect(defs, instance)
    assert len(daemon.tick(SENSOR).run_ids) == 1
    (inc,) = records.incidents(instance)
    dw = [str(Path(sys.executable).parent / "dw-dagster"), "incidents", "rediagnose", inc.id, "--by", OWNER,
          "--dagster-home", instance.root_directory]
    for attempt in (1, 2):
        out = subprocess.run([*dw, "--reason", f"the source was backfilled ({attempt})"], capture_output=True, text=True)
        assert out.returncode == 0 and "marked for re-diagnosis" in out.stdout, out.stderr
        assert ledger_for(instance).incident(inc.id).state == "rediagnose"
        if attempt == 2:
            (lost,) = _dry_run(defs, instance).run_requests
            assert lost.run_key == f"{inc.id}:diagnose:2" and ledger_for(instance).incident(inc.id).state == "open"
        ticks = [daemon.tick(SENSOR) for _ in range(2)]
        assert [len(t.run_ids) for t in ticks] == [1, 0] and not any(t.failed_run_ids for t in ticks)
        row = ledger_for(instance).incident(inc.id)
        assert (row.state, row.attempts) == ("diagnosed", attempt)
    assert [r.tags["dagster/run_key"] for r in _diagnosis_runs(instance)] == [inc.id, f"{inc.id}:diagnose:1",
                                                                            f"{inc.id}:diagnose:2"]
    assert len(records.diagnoses(instance)) == 3
    audit = ledger_for(instance).audit_entries("incident_rediagnose", inc.id)
    assert [e["by"] for e in audit] == [OWNER, OWNER] and "backfilled (2)" in audit[0]["body"]["reason"]
