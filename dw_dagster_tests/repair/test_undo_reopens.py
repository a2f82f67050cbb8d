"""What happened, in plain words, and an undo that hands the incident back (issue 25 items 2-4).

One world (``test_autonomy_and_stop.world``: DuckDB source and warehouse, the reconciliation check,
the incident sensor, the remediation sensor with the undo jobs) on a real Dagster instance: the
incident is detected and diagnosed, its change set (with an undo plan) is repaired and undone, and
the undo's receipt is checked against the snapshot, not against the checks.
"""

import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster.approval.job import approve_in_process
from dw_dagster.core import records
from dw_dagster.core.ledger import CLOSED, FAILED, OPEN, ledger_for
from dw_dagster.core.models import BlastRadius, Diagnosis, FileChange, UndoPlan, utcnow
from dw_dagster.diagnosis.causes.undone import undo_record, with_undone_rows
from dw_dagster.diagnosis.combine import unexplained_finding
from dw_dagster.diagnosis.history import incident_history
from dw_dagster.proposals.change_sets import record_proposal
from dw_dagster.receipts.job import receipt_markdown
from dw_dagster.repair.undo import partition_checksum, propose, propose_undo, reverse_diff
from dw_dagster_tests.repair import test_autonomy_and_stop as tas
from dw_dagster_tests.repair.test_autonomy_and_stop import OWNER, _domains, detect, gap, repair, world  # noqa: F401

WINDOW = ["2026-11-03", "2026-11-04"]
PLAN = UndoPlan(resource_key="warehouse", table="orders", partition_column="day", window=WINDOW)
ORDERS = dg.AssetKey("orders")


def _diagnosed(world, monkeypatch, plan: UndoPlan):
    """Detect the incident and diagnose it; the diagnosis proposes the change set with ``plan``."""
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    made = tas.change_set
    monkeypatch.setattr(tas, "change_set", lambda **kw: made(undo_plan=plan, **kw))
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    (cs,) = records.change_sets(instance)
    return daemon, cs


def test_failed_stage_receipt_names_the_error_and_the_incident_never_reads_fixed(world, monkeypatch):
    """The snapshot stage fails (its partition column does not exist): the receipt carries the error's
    class and message and the run that raised it, and the incident reads "repair failed at snapshot: ...".

    From the field: a failed run's reason only showed by filtering its event log for RUN_FAILURE
    (https://github.com/dagster-io/dagster/pull/33262), and a failed step's cause stayed out of the UI
    (https://github.com/dagster-io/dagster/issues/11580)."""
    defs, instance, domains, wh = world
    daemon, cs = _diagnosed(world, monkeypatch, PLAN.model_copy(update={"partition_column": "no_such_day"}))
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    for _ in range(3):
        daemon.tick("dw_remediation_sensor")
    (r,) = [r for r in records.receipts(instance, ORDERS) if r.change_set_id == cs.id]
    failure = r.evidence_summary["failure"]
    snap_run = ledger_for(instance).stages(cs.id, cs.version)["snapshot"].run_id
    assert failure["stage"] == "snapshot" and failure["run_id"] == snap_run and failure["run_url"].endswith(snap_run)
    assert "no_such_day" in failure["message"] or any("no_such_day" in e["message"] for e in failure["causes"])
    assert r.outcome.startswith(f"failed at snapshot: {failure['error_class']}: ") and snap_run in r.outcome
    assert not r.verified and gap(wh) == 20  # nothing ran
    (entry,) = incident_history(instance, ORDERS)
    assert entry.status.startswith(f"repair failed at snapshot: {failure['error_class']}: ") and "fixed" not in entry.status


def test_undo_is_verified_against_the_snapshot_and_hands_the_incident_back(world, monkeypatch):
    """Repair, undo: the undo's receipt is verified by the snapshot's rows and checksums per partition
    although the check fails again (what an undo of a fix does); the incident is open again with the
    undo as evidence (the rows it took back), a later failing check opens no second incident,
    rediagnose works, and the undo of the undo proposes the original change set again.

    From the field: a rollback recorded as a forward revision, never a rewound pointer
    (https://github.com/twmht/omo-fleet/issues/33)."""
    defs, instance, domains, wh = world
    before = partition_checksum(wh, "orders", "day", WINDOW)
    daemon, cs = _diagnosed(world, monkeypatch, PLAN)
    led = ledger_for(instance)
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    assert repair(daemon) == ["snapshot", "window-1", "verify", "receipt"] and gap(wh) == 0
    assert led.incident(cs.incident_id).state == CLOSED
    undo = propose_undo(instance, cs.id)
    propose(instance, undo)
    assert approve_in_process(instance, undo.id, approver=OWNER)[0]
    assert repair(daemon) == ["restore", "verify", "receipt"]
    assert partition_checksum(wh, "orders", "day", WINDOW) == before and gap(wh) == 20
    r = next(r for r in records.receipts(instance, ORDERS) if r.change_set_id == undo.id)
    assert r.verified and any(not o.passed for o in r.checks)  # the check fails again; the undo kept its promise
    promise = r.evidence_summary["undo"]
    # neighbouring days are one range of the asset's partitions: compared as one, by rows and checksum
    assert promise["verified"] and sorted(promise["partitions"]) == ["2026-11-03..2026-11-04"] and promise["mismatched"] == []
    assert promise["taken_back"]["rows"] == 20 and promise["taken_back"]["per_partition"] == {"2026-11-03..2026-11-04": 20}
    assert wh.fetch_all(f"SELECT count(*) FROM {promise['taken_back']['table']}")[0][0] == 20  # which rows, kept
    row = led.incident(cs.incident_id)
    assert row.state == OPEN and "undone, open again" in row.note and "20 row(s) taken back" in row.note
    (entry,) = incident_history(instance, ORDERS)
    assert entry.status == "undone, open again"
    # the diagnosis knows the rows the undo took back: what it could not explain otherwise is theirs
    gapped = Diagnosis(id="dg-u", incident_id=cs.incident_id, asset_key=["orders"], created_at=utcnow(),
                       causes=[unexplained_finding(20, 20)], blast_radius=BlastRadius(root="orders"), gap_rows=20,
                       unexplained_rows=20)
    known = with_undone_rows(gapped, undo_record(led, cs.incident_id), wh)
    assert (known.primary.kind, known.primary.explained_rows, known.unexplained_rows) == ("undone_repair", 20, 0)
    assert known.primary.evidence[0].values == {"missing": 20, "taken_back": 20} and cs.id in known.primary.summary
    # a later failing check attaches to the open incident; rediagnose works on it
    detect(defs, instance).tick("dw_check_incident_sensor")
    assert [i.incident_id for i in led.incidents(asset_key="orders", states=[OPEN]) if i.linked_to is None] == [cs.incident_id]
    assert led.set_incident_state(cs.incident_id, "rediagnose", from_states=[OPEN])
    led.set_incident_state(cs.incident_id, OPEN, from_states=["rediagnose"])
    # the undo of the undo proposes the original change set again, as a new version
    again = propose_undo(instance, undo.id)
    assert again.id == cs.id and again.version != cs.version and again.window == cs.window
    assert [v["state"] for v in again.earlier_versions] == ["applied"] and "re-proposed" in again.summary
    recorded, new = propose(instance, again)
    assert new and records.find_change_set(instance, cs.id).version == recorded.version
    dw = str(Path(sys.executable).parent / "dw-dagster")
    out = subprocess.run([dw, "change-sets", "repropose", cs.id, "--dagster-home", instance.root_directory],
                         capture_output=True, text=True)
    assert out.returncode == 3 and "is proposed; decide on it" in out.stderr, out.stderr
    # approved and run again: its receipt tells the versions' story, and the new version can be undone anew
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    assert repair(daemon) == ["snapshot", "window-1", "verify", "receipt"] and gap(wh) == 0
    r2 = next(r for r in records.receipts(instance, ORDERS) if r.change_set_version == recorded.version)
    assert r2.verified and [v["version"] for v in r2.evidence_summary["versions"]] == [cs.version, recorded.version]
    assert "**Versions**" in receipt_markdown(r2) and led.incident(cs.incident_id).state == CLOSED
    assert propose_undo(instance, cs.id).id == f"{cs.id}-undo-2"


def test_retry_after_a_failed_stage_keeps_the_merged_diff(world):
    """A version proposed again after its diff was merged (the proposal reads the merged file, so its own
    diff is empty) carries the original diff marked merged, a summary that says so and its earlier
    versions; the merged diff reverses cleanly for an undo.

    From the field: a retried deployment whose record lost what the first attempt changed
    (https://github.com/twmht/omo-fleet/issues/33: the history is never rewritten)."""
    defs, instance, domains, wh = world
    led = ledger_for(instance)
    diff = "--- a/p.yaml\n+++ b/p.yaml\n@@ -1,2 +1,2 @@\n-watermark: updated_at\n+watermark: arrived_at\n lookback: 0\n"
    files = [FileChange(path="p.yaml", before_sha256="0" * 64, after_sha256="1" * 64)]
    first = tas.change_set().model_copy(update={"diff": diff, "files": files})
    first = type(first).seal(**first.model_dump(exclude={"version"}))
    record_proposal(led, first)
    led.set_change_set_state(first.id, first.version, FAILED, note="failed at snapshot: ValueError: bad key")
    retry = type(first).seal(**{**first.model_dump(exclude={"version"}), "diff": "", "summary": "rerun 11-03..11-04 again",
                                "files": [FileChange(path="p.yaml", before_sha256="1" * 64, after_sha256="1" * 64)]})
    recorded, new = record_proposal(led, retry)
    assert new and recorded.diff == diff and recorded.diff_merged_in == first.version
    assert f"merged with version {first.version[:12]}" in recorded.summary
    assert recorded.earlier_versions[0]["state"] == FAILED and "ValueError" in recorded.earlier_versions[0]["note"]
    assert recorded.files == files  # the sensor finds them merged: nothing to wait for
    back = reverse_diff(diff)
    assert "-watermark: arrived_at" in back and "+watermark: updated_at" in back and "@@ -1,2 +1,2 @@" in back


@pytest.mark.parametrize("bad", ["cs-nope"])
def test_repropose_refuses_an_unknown_change_set(world, bad):
    """A change set nobody proposed is refused with its name (exit 3), like ``dw-dagster undo``."""
    defs, instance, domains, wh = world
    dw = str(Path(sys.executable).parent / "dw-dagster")
    out = subprocess.run([dw, "change-sets", "repropose", bad, "--dagster-home", instance.root_directory],
                         capture_output=True, text=True)
    assert out.returncode == 3 and f"no change set '{bad}'" in out.stderr
