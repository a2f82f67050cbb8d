"""Receipts can be checked for tampering: altered (JSON or markdown), re-hashed without the key,
removed (first, middle or newest), their runs deleted. The chain head lives in the ledger."""

import datetime as dt
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import ChangeSet, utcnow
from dw_dagster.core import records
from dw_dagster.approval.job import approve_in_process
from dw_dagster.proposals.change_sets import propose
from dw_dagster.receipts.chain import verify_receipts
from dw_dagster.receipts.job import build_receipt_job

BIN = Path(sys.executable).parent
ASSET = dg.AssetKey("orders")
OWNER = "dana@x.example"


def _repair(inst, i: int) -> tuple[str, str]:
    """One approved change set whose receipt stage the remediation sensor dispatched; returns
    (receipt id, the receipt run's id)."""
    now = utcnow()
    cs, _ = propose(inst, ChangeSet.seal(
        id=f"cs-r{i}", incident_id=f"inc-{i}", diagnosis_id=f"dg-{i}", domain="orders", proposer=c.PROPOSER,
        created_at=now, expires_at=now + dt.timedelta(hours=1), approvers=[OWNER], cause_kind="late_rows_behind_watermark",
        summary=f"repair {i} with {10 + i} rows", target_asset=["orders"], window=[], diff="", files=[], rebuild_assets=[]))
    assert approve_in_process(inst, cs.id, approver=OWNER)[0]
    approval = records.approvals(inst, cs.id)[0]
    ticket = ledger_for(inst).issue_ticket(cs.id, cs.version, "receipt", approval.id, "dw_receipts")
    res = build_receipt_job().execute_in_process(
        instance=inst, run_config={"ops": {"dw_write_receipts": {"config": {"change_set_id": cs.id}}}},
        tags={"dw/ticket": ticket, c.CHANGE_SET_TAG: cs.id, c.STAGE_TAG: "receipt"})
    assert res.success
    (r,) = [x for x in records.receipts(inst, ASSET) if x.change_set_id == cs.id]
    return r.id, res.run_id


@pytest.fixture
def instance(tmp_path, monkeypatch):
    domains = tmp_path / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: orders
            assets: [[orders]]
            approvers: [{OWNER}]
            identity: unverified
        """))
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        made = [_repair(inst, i) for i in range(3)]  # three repairs, three receipt runs, chained
        yield inst, tmp_path, made


def _sql(home: Path, statement: str, *args) -> int:
    """Run ``statement`` on every SQLite file of the instance's storage (how an attacker would edit it)."""
    changed = 0
    for db in sorted((home / "history").rglob("*.db")):
        con = sqlite3.connect(db)
        try:
            if con.execute("SELECT name FROM sqlite_master WHERE name = 'event_logs'").fetchall():
                changed += con.execute(statement, args).rowcount
                con.commit()
        finally:
            con.close()
    return changed


def test_intact_chain_verifies(instance):
    inst, _, made = instance
    assert verify_receipts(inst) == (3, [])
    chain = ledger_for(inst).receipt_links("orders")
    assert [link.receipt_id for link in chain] == [rid for rid, _ in made]
    assert chain[1].previous_hash == chain[0].hash and chain[0].previous_hash is None


def test_altered_receipt_is_named(instance):
    inst, home, made = instance
    assert _sql(home, """UPDATE event_logs SET event = replace(event, 'repair 1 with 11 rows', 'repair 1 with 99 rows')
                         WHERE event LIKE '%repair 1 with 11 rows%'""") >= 1
    count, problems = verify_receipts(inst)
    assert [(p.kind, p.asset, p.receipt_id) for p in problems] == [("altered", "orders", made[1][0])]


def test_altered_markdown_alone_is_named(instance):
    """dw/receipt_md is what the asset page shows: the hash covers it too."""
    inst, home, made = instance
    assert _sql(home, """UPDATE event_logs SET event = replace(event, '**Outcome**: applied', '**Outcome**: applied and verified by the CFO')
                         WHERE event LIKE ?""", f"%{made[2][0]}%") >= 1
    problems = verify_receipts(inst)[1]
    assert [(p.kind, p.receipt_id) for p in problems] == [("altered", made[2][0])]
    assert "markdown" in problems[0].detail


def test_rehashed_without_the_key_is_caught(instance, monkeypatch):
    inst, _, _ = instance
    monkeypatch.setenv("DW_APPROVAL_SIGNING_KEY", "another-deployments-key-0000")
    count, problems = verify_receipts(inst)
    assert count == 3 and {p.kind for p in problems} == {"altered"} and len(problems) == 3
    assert all("signature" in p.detail for p in problems)


def test_removed_middle_receipt_is_missing(instance):
    inst, home, made = instance
    assert _sql(home, "DELETE FROM event_logs WHERE event LIKE ? AND event LIKE '%AssetObservation%'", f"%{made[1][0]}%") >= 1
    assert [(p.kind, p.receipt_id) for p in verify_receipts(inst)[1]] == [("missing", made[1][0])]


def test_removed_newest_receipt_is_missing(instance):
    inst, home, made = instance
    assert _sql(home, "DELETE FROM event_logs WHERE event LIKE ? AND event LIKE '%AssetObservation%'", f"%{made[2][0]}%") >= 1
    assert [(p.kind, p.receipt_id) for p in verify_receipts(inst)[1]] == [("missing", made[2][0])]


def test_deleting_receipt_runs_is_named(instance):
    """`dagster run delete` (or a retention job) on the receipt runs removes their events: every
    receipt they wrote is named missing; none is 'nothing to verify'."""
    inst, home, made = instance
    inst.delete_run(made[2][1])
    assert [(p.kind, p.receipt_id) for p in verify_receipts(inst)[1]] == [("missing", made[2][0])]
    for _, run_id in made[:2]:
        inst.delete_run(run_id)
    count, problems = verify_receipts(inst)
    assert count == 3 and sorted(p.receipt_id for p in problems if p.kind == "missing") == sorted(r for r, _ in made)
    bad = subprocess.run([str(BIN / "dw-dagster"), "receipts", "verify", "--dagster-home", str(home)], capture_output=True, text=True)
    assert bad.returncode == 1 and "nothing to verify" not in bad.stdout and f"missing: orders receipt {made[0][0]}" in bad.stderr


def test_a_receipt_the_ledger_never_recorded_is_unanchored(instance):
    inst, _, made = instance
    (r,) = [x for x in records.receipts(inst, ASSET) if x.id == made[0][0]]
    from dw_dagster.receipts.job import receipt_observation

    inst.report_runless_asset_event(receipt_observation(r.model_copy(update={"id": "rc-forged0001"}), "forged"))
    assert [(p.kind, p.receipt_id) for p in verify_receipts(inst)[1]] == [("unanchored", "rc-forged0001")]


def test_the_receipt_job_refuses_a_run_without_the_sensors_ticket(instance):
    """`dagster job execute` / the Launchpad on dw_receipts: no ticket, no receipt."""
    inst, _, made = instance
    res = build_receipt_job().execute_in_process(
        instance=inst, run_config={"ops": {"dw_write_receipts": {"config": {"change_set_id": "cs-r0"}}}}, raise_on_error=False)
    assert not res.success
    assert verify_receipts(inst) == (3, [])
    copied = inst.get_run_by_id(made[0][1]).tags  # a copy of a real receipt run's tags: its ticket is taken
    res = build_receipt_job().execute_in_process(
        instance=inst, run_config={"ops": {"dw_write_receipts": {"config": {"change_set_id": "cs-r0"}}}},
        tags={k: v for k, v in copied.items() if k.startswith("dw/")}, raise_on_error=False)
    assert not res.success
    assert len(records.receipts(inst, ASSET)) == 3


def test_cli_exit_codes(instance):
    inst, home, made = instance
    ok = subprocess.run([str(BIN / "dw-dagster"), "receipts", "verify", "--dagster-home", str(home)], capture_output=True, text=True)
    assert ok.returncode == 0 and "3 receipt(s) verified" in ok.stdout
    _sql(home, "DELETE FROM event_logs WHERE event LIKE ? AND event LIKE '%AssetObservation%'", f"%{made[2][0]}%")
    bad = subprocess.run([str(BIN / "dw-dagster"), "receipts", "verify", "--dagster-home", str(home)], capture_output=True, text=True)
    assert bad.returncode == 1 and f"missing: orders receipt {made[2][0]}" in bad.stderr
