"""Incident history read back from the Dagster event log; the repeat note; ``dw-dagster incidents``."""

import datetime as dt
import json
import os
import subprocess
import sys

import dagster as dg
import pytest
from click.testing import CliRunner

from dw_dagster.core import keys as c
from dw_dagster.cli import main
from dw_dagster.diagnosis.history import attach_history, history_note, incident_history
from dw_dagster.diagnosis.job import diagnosis_markdown
from dw_dagster.core.models import Approval, BlastRadius, CauseFinding, ChangeSet, Diagnosis, Incident, Receipt

BIN = os.path.join(os.path.dirname(sys.executable), "dw-dagster")
T1 = dt.datetime(2026, 11, 28, 9, 0, tzinfo=dt.timezone.utc)
T2 = dt.datetime(2026, 12, 5, 9, 0, tzinfo=dt.timezone.utc)
SALES, ORDERS = ["store_sales_line"], ["orders"]


def _finding(kind="late_rows_behind_watermark", explained=2124):
    return CauseFinding(kind=kind, summary=f"{kind} summary", confidence=1.0, explained_rows=explained, unexplained_rows=0)


def _observe(instance, asset, key, record):
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(asset), metadata={key: dg.MetadataValue.json(record.model_dump(mode="json"))}))


def _incident(iid, asset, when, gap):
    return Incident(id=iid, asset_key=asset, source="lightup", detected_at=when, summary=f"{gap} rows short", gap_rows=gap,
                    gap_pct=1.8)


def _diagnosis(did, inc, finding):
    return Diagnosis(id=did, incident_id=inc.id, asset_key=inc.asset_key, created_at=inc.detected_at, causes=[finding],
                     blast_radius=BlastRadius(root="source.p.pos.sales_line"), gap_rows=inc.gap_rows, unexplained_rows=0)


def _change_set(cid, inc, diag, kind, window):
    return ChangeSet.seal(id=cid, incident_id=inc.id, diagnosis_id=diag.id, domain="store_sales", proposer=c.PROPOSER,
                     created_at=inc.detected_at, expires_at=inc.detected_at + dt.timedelta(days=3),
                     approvers=["dana.ortiz@grocer.example"], cause_kind=kind, summary=f"fix {kind}",
                     target_asset=inc.asset_key, window=window, diff="", files=[], rebuild_assets=[])


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A Dagster instance directory holding: a fixed watermark incident, a new one of the same cause, one elsewhere."""
    path = tmp_path_factory.mktemp("dagster_home")
    with dg.instance_for_test(temp_dir=str(path)) as instance:
        inc1 = _incident("inc-1", SALES, T1, 2124)
        d1 = _diagnosis("dg-1", inc1, _finding())
        cs1 = _change_set("cs-1", inc1, d1, "late_rows_behind_watermark", ["2026-11-26", "2026-11-27"])
        ap1 = Approval(id="ap-1", change_set_id="cs-1", change_set_version=cs1.version, decision="approve",
                       approver="dana.ortiz@grocer.example", decided_at=T1 + dt.timedelta(hours=1), signature="x")
        rc1 = Receipt(id="rc-1", asset_key=SALES, change_set_id="cs-1", change_set_version="v1", incident_id="inc-1",
                      cause_kind="late_rows_behind_watermark", cause_summary="", evidence_summary={}, diff="",
                      approver="dana.ortiz@grocer.example", approved_at=T1, signature_valid=True,
                      partitions=["2026-11-26", "2026-11-27"], run_ids={}, rows_before={}, rows_after={}, checks=[],
                      verified=True, undo="", created_at=T1 + dt.timedelta(hours=2), previous_hash=None)
        inc2 = _incident("inc-2", SALES, T2, 1500)
        d2 = _diagnosis("dg-2", inc2, _finding(explained=1500))
        inc3 = _incident("inc-3", ORDERS, T2 - dt.timedelta(days=1), 3912)
        d3 = _diagnosis("dg-3", inc3, _finding("required_null_dead_letter", 3912))
        cs3 = _change_set("cs-3", inc3, d3, "required_null_dead_letter", [])
        for asset, key, rec in ((SALES, c.INCIDENT_KEY, inc1), (SALES, c.DIAGNOSIS_KEY, d1), (SALES, c.CHANGE_SET_KEY, cs1),
                                (SALES, c.APPROVAL_KEY, ap1), (SALES, c.RECEIPT_KEY, rc1), (ORDERS, c.INCIDENT_KEY, inc3),
                                (ORDERS, c.DIAGNOSIS_KEY, d3), (ORDERS, c.CHANGE_SET_KEY, cs3), (SALES, c.INCIDENT_KEY, inc2),
                                (SALES, c.DIAGNOSIS_KEY, d2)):
            _record(instance, asset, key, rec)
    return path


def _record(instance, asset, key, rec):
    """As the loop records them: incidents, change sets and decisions in the ledger, everything shown on the asset."""
    from dw_dagster.core.ledger import ledger_for
    from dw_dagster.proposals.change_sets import propose
    from dw_dagster.detection.incidents import record_incident

    if key == c.INCIDENT_KEY:
        record_incident(instance, rec)
    elif key == c.CHANGE_SET_KEY:
        propose(instance, rec)
        return
    elif key == c.APPROVAL_KEY:
        ledger_for(instance).record_decision(approval_id=rec.id, change_set_id=rec.change_set_id,
                                             version=rec.change_set_version, decision=rec.decision, approver=rec.approver,
                                             method="oidc", decided_at=rec.decided_at.timestamp(), body=rec.model_dump_json())
    _observe(instance, asset, key, rec)


def test_history_joins_incident_diagnosis_change_set_decision_and_receipt(home):
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        sales = incident_history(instance, dg.AssetKey(SALES))
        everything = incident_history(instance)
    assert [e.incident_id for e in sales] == ["inc-2", "inc-1"]
    new, old = sales
    assert (new.status, new.cause_kind, new.change_set_id, new.receipt_id) == ("diagnosed", "late_rows_behind_watermark", None, None)
    assert (old.status, old.change_set_id, old.decision, old.approver) == ("fixed (verified)", "cs-1", "approved", "dana.ortiz@grocer.example")
    assert (old.receipt_id, old.verified, old.window, old.gap_rows) == ("rc-1", True, ["2026-11-26", "2026-11-27"], 2124)
    assert [e.incident_id for e in everything] == ["inc-2", "inc-3", "inc-1"]
    assert everything[1].status == "proposed" and everything[1].cause_kind == "required_null_dead_letter"


def test_a_repeated_cause_is_noted_on_the_diagnosis(home):
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        f = attach_history(_finding(explained=1500), instance, dg.AssetKey(SALES), incident_id="inc-2")
        other = attach_history(_finding("duplicate_load", 5), instance, dg.AssetKey(SALES), incident_id="inc-2")
        nothing = attach_history(_finding(explained=0), instance, dg.AssetKey(SALES), incident_id="inc-2")
        (old,) = [e for e in incident_history(instance, dg.AssetKey(SALES)) if e.incident_id == "inc-1"]
    assert f.details["history_note"] == (
        "seen before: the same cause (late_rows_behind_watermark) on store_sales_line on 2026-11-28 (incident inc-1), "
        "fixed by change set cs-1 over 2026-11-26..2026-11-27 (receipt rc-1, verified)")
    assert f.details["history"][0]["change_set_id"] == "cs-1" and f.details["repeat_count"] == 1
    assert "history" not in other.details and "history" not in nothing.details  # a new cause, or nothing explained
    assert history_note(old).startswith("the same cause (late_rows_behind_watermark) on store_sales_line on 2026-11-28")
    md = diagnosis_markdown(Diagnosis(id="dg-x", incident_id="inc-2", asset_key=SALES, created_at=T2, causes=[f],
                                      blast_radius=BlastRadius(root="r"), gap_rows=1500, unexplained_rows=0))
    assert "**Repeat:** seen before: the same cause" in md


def test_incidents_command_json(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DW_", "DAGSTER_HOME"))}
    proc = subprocess.run([BIN, "incidents", "--asset", "store_sales_line", "--json"], capture_output=True, text=True,
                          env={**env, "DAGSTER_HOME": str(home)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert [(r["incident_id"], r["status"], r["change_set_id"], r["verified"]) for r in rows] == [
        ("inc-2", "diagnosed", None, None), ("inc-1", "fixed (verified)", "cs-1", True)]
    assert rows[1]["detected_at"].startswith("2026-11-28") and rows[1]["source"] == "lightup" and rows[1]["gap_rows"] == 2124


def test_incidents_command_text_and_errors(home, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # restored after the test; the command may set it
    runner = CliRunner()
    out = runner.invoke(main, ["incidents", "--dagster-home", str(home)])
    assert out.exit_code == 0, out.output
    assert out.output.index("inc-2") < out.output.index("inc-3") < out.output.index("inc-1")
    assert "cs-1 (approved by dana.ortiz@grocer.example) window 2026-11-26..2026-11-27; receipt rc-1 verified" in out.output
    assert "required_null_dead_letter" in out.output and "fixed (verified)" in out.output
    bad = runner.invoke(main, ["incidents", "--asset", "nope", "--dagster-home", str(home)])
    assert bad.exit_code == 2 and "no asset 'nope'" in bad.output
    monkeypatch.delenv("DAGSTER_HOME")
    unset = runner.invoke(main, ["incidents"])
    assert unset.exit_code == 2 and "DAGSTER_HOME" in unset.output
