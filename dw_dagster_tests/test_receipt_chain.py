"""Receipts can be checked for tampering: altered, re-hashed without the key, removed (middle or newest)."""

import datetime as dt
import sqlite3
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster.models import Receipt
from dw_dagster.remediation.receipt_chain import verify_receipts
from dw_dagster.remediation.receipts import log_receipts, receipt_observation

BIN = Path(sys.executable).parent
ASSET = dg.AssetKey("orders")


def _receipts(n: int) -> list[Receipt]:
    out, prev = [], None
    for i in range(n):
        r = Receipt(id=f"rc-{i:03d}", asset_key=["orders"], change_set_id=f"cs-{i}", change_set_version="v1",
                    incident_id=f"inc-{i}", cause_kind="late_rows_behind_watermark", cause_summary="late rows",
                    evidence_summary={"explained_rows": 10 + i}, diff="", approver="dana@x.example",
                    approved_at=dt.datetime(2026, 11, 28, tzinfo=dt.timezone.utc), signature_valid=True,
                    partitions=["2026-11-26"], run_ids={}, rows_before={"all": {"gap_rows": 10 + i}},
                    rows_after={"all": {"gap_rows": 0}}, checks=[], verified=True, undo="rerun",
                    created_at=dt.datetime(2026, 11, 28, tzinfo=dt.timezone.utc), previous_hash=prev)
        prev = r.content_hash()
        out.append(r)
    return out


class _Cfg(dg.Config):
    first: int
    count: int


@dg.op
def _write(context: dg.OpExecutionContext, config: _Cfg) -> None:
    rs = _receipts(config.first + config.count)[config.first:]
    log_receipts(context, rs, [receipt_observation(r, f"receipt {r.id}") for r in rs])


@dg.job(tags={"dw/kind": "receipt"})
def _receipt_job():
    _write()


@pytest.fixture
def instance(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        for first in range(3):  # three repairs, three runs, one receipt each, chained
            assert _receipt_job.execute_in_process(instance=inst, run_config={"ops": {"_write": {"config": {"first": first, "count": 1}}}}).success
        yield inst, tmp_path


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
    inst, _ = instance
    assert verify_receipts(inst) == (3, [])


def test_altered_receipt_is_named(instance):
    inst, home = instance
    assert _sql(home, """UPDATE event_logs SET event = replace(event, '"explained_rows": 11', '"explained_rows": 99')
                         WHERE event LIKE '%"explained_rows": 11%'""") >= 1
    count, problems = verify_receipts(inst)
    assert [(p.kind, p.asset, p.receipt_id) for p in problems] == [("altered", "orders", "rc-001")]


def test_rehashed_without_the_key_is_caught(instance, monkeypatch):
    inst, _ = instance
    monkeypatch.setenv("DW_APPROVAL_SIGNING_KEY", "another-deployments-key-0000")
    count, problems = verify_receipts(inst)
    assert count == 3 and {p.kind for p in problems} == {"altered"}
    assert any("(run tags)" == p.asset for p in problems) and any("signature" in p.detail for p in problems)


def test_removed_middle_receipt_breaks_the_chain(instance):
    inst, home = instance
    assert _sql(home, "DELETE FROM event_logs WHERE event LIKE '%rc-001%' AND event LIKE '%AssetObservation%'") >= 1
    kinds = {(p.kind, p.receipt_id) for p in verify_receipts(inst)[1]}
    assert kinds == {("broken_chain", "rc-002"), ("missing", "rc-001")}


def test_removed_newest_receipt_is_missing(instance):
    inst, home = instance
    assert _sql(home, "DELETE FROM event_logs WHERE event LIKE '%rc-002%' AND event LIKE '%AssetObservation%'") >= 1
    assert [(p.kind, p.receipt_id) for p in verify_receipts(inst)[1]] == [("missing", "rc-002")]


def test_cli_exit_codes(instance):
    inst, home = instance
    ok = subprocess.run([str(BIN / "dw-dagster"), "receipts", "verify", "--dagster-home", str(home)], capture_output=True, text=True)
    assert ok.returncode == 0 and "3 receipt(s) verified" in ok.stdout
    _sql(home, "DELETE FROM event_logs WHERE event LIKE '%rc-002%' AND event LIKE '%AssetObservation%'")
    bad = subprocess.run([str(BIN / "dw-dagster"), "receipts", "verify", "--dagster-home", str(home)], capture_output=True, text=True)
    assert bad.returncode == 1 and "missing: orders receipt rc-002" in bad.stderr
