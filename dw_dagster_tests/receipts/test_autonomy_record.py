"""Issue 31 item 5: a domain's record per change class from the ledger and the receipts, and the
domains-file diff that raises autonomy after a clean record (or lowers it after a failure).

The failure kind autonomy must answer to: an automated fix that keeps being re-applied after it
broke something — https://github.com/dagster-io/dagster/issues/21442 (a cancelled run left the
asset's state wrong; an operator had to step in).
"""

import datetime as dt
import textwrap

import dagster as dg

from dw_dagster.core.ledger import APPLIED, FAILED, RUNNING, ledger_for
from dw_dagster.core.models import ChangeSet, Receipt, UndoPlan, utcnow
from dw_dagster.proposals.change_sets import propose
from dw_dagster.receipts.autonomy import autonomy_records, propose_autonomy_change
from dw_dagster.receipts.job import receipt_observation

DOMAINS = textwrap.dedent("""\
    domains:
      - name: orders
        assets: [[orders]]
        approvers: [dana@x]
        autonomy: L2
        earn_after: 2
      - name: finance
        assets: [[ledger]]
        approvers: [fin@x]
        autonomy: L3
        allowed_change_classes: [rerun_window]
    """)


def _cs(i, domain, classes, undo_of=None):
    now = utcnow()
    return ChangeSet.seal(id=f"cs-{i}", incident_id=f"inc-{i}", diagnosis_id=f"dg-{i}", domain=domain, proposer="dw",
                          created_at=now, expires_at=now + dt.timedelta(hours=1), approvers=["dana@x"], cause_kind="k",
                          summary=f"fix {i}", target_asset=["orders" if domain == "orders" else "ledger"], window=[],
                          diff="", files=[], rebuild_assets=[], change_classes=classes,
                          undo_plan=UndoPlan(resource_key="w", table="t", partition_column="d", window=[],
                                             of_change_set=undo_of) if undo_of else None)


def _end(instance, cs, state, verified=None, note=None):
    led = ledger_for(instance)
    propose(instance, cs)
    led.set_change_set_state(cs.id, cs.version, state, note=note)
    if verified is not None:
        now = utcnow()
        r = Receipt(id=f"rc-{cs.id}", asset_key=cs.target_asset, change_set_id=cs.id, change_set_version=cs.version,
                    incident_id=cs.incident_id, cause_kind="k", cause_summary="", evidence_summary={}, diff="",
                    approver="dana@x", approved_at=now, signature_valid=True, partitions=[], run_ids={}, rows_before={},
                    rows_after={}, checks=[], verified=verified, undo="", created_at=now, previous_hash=None)
        instance.report_runless_asset_event(receipt_observation(r, "receipt"))


def test_records_per_class_and_the_domains_diff_they_propose():
    with dg.DagsterInstance.ephemeral() as instance:
        _end(instance, _cs(1, "orders", ["rerun_window", "add_test"]), APPLIED, verified=True)
        _end(instance, _cs(2, "orders", ["rerun_window"]), APPLIED, verified=True)
        _end(instance, _cs(3, "orders", ["schema_migration"]), FAILED, note="stage migration-1 failed: lock timeout")
        _end(instance, _cs(4, "finance", ["rerun_window"]), APPLIED, verified=True)
        _end(instance, _cs(5, "finance", ["undo"], undo_of="cs-4"), APPLIED, verified=True)  # cs-4 was undone
        _end(instance, _cs(6, "orders", ["rerun_window"]), RUNNING)  # not ended: not counted
        recs = {(r.domain, r.change_class): r for r in autonomy_records(instance)}
    rw = recs[("orders", "rerun_window")]
    assert (rw.applied, rw.verified, rw.failed, rw.undone, rw.clean_streak) == (2, 2, 0, 0, 2)
    mig = recs[("orders", "schema_migration")]
    assert (mig.failed, mig.clean_streak, mig.last_failure) == (1, 0, "stage migration-1 failed: lock timeout")
    fin = recs[("finance", "rerun_window")]
    assert (fin.applied, fin.undone, fin.verified, fin.clean_streak) == (1, 1, 0, 0)
    assert ("finance", "undo") not in recs
    diff = propose_autonomy_change(DOMAINS, list(recs.values()))
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    # orders earned rerun_window (two verified in a row) but not add_test (one); finance's undone class is withdrawn
    assert "+    autonomy: L3" in added and "+    allowed_change_classes: [rerun_window]" in added
    assert "+    allowed_change_classes: []" in added and "-    allowed_change_classes: [rerun_window]" in diff
    assert propose_autonomy_change(DOMAINS, []) is None


def test_the_cli_prints_the_records_and_the_diff(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from dw_dagster.cli.main import main

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        _end(instance, _cs(1, "orders", ["rerun_window"]), APPLIED, verified=True)
        _end(instance, _cs(2, "orders", ["rerun_window"]), APPLIED, verified=True)
    domains = tmp_path / "domains.yaml"
    domains.write_text(DOMAINS)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    out = CliRunner().invoke(main, ["change-sets", "--dagster-home", str(home), "autonomy", "--domains", str(domains)])
    assert out.exit_code == 0, out.output
    assert "orders  rerun_window: 2 applied, 2 verified, 0 undone, 0 failed; 2 clean in a row" in out.output
    assert "+    allowed_change_classes: [rerun_window]" in out.output
    js = CliRunner().invoke(main, ["change-sets", "--dagster-home", str(home), "autonomy", "--json"])
    assert json.loads(js.output)["records"][0]["clean_streak"] == 2 and json.loads(js.output)["domains_diff"] is None
    assert domains.read_text() == DOMAINS  # never edited
