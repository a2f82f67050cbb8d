"""Undo of a rerun window: apply, undo through its own approval, compare counts and checksums with before."""

import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core.models import UndoPlan
from dw_dagster.core import records
from dw_dagster.approval.job import approve_in_process
from dw_dagster.repair.undo import UndoError, partition_checksum, propose, propose_undo
from dw_dagster_tests.repair.test_autonomy_and_stop import OWNER, _domains, change_set, gap, repair, world  # noqa: F401

WINDOW = ["2026-11-03", "2026-11-04"]
PLAN = UndoPlan(resource_key="warehouse", table="orders", partition_column="day", window=WINDOW)


def _apply(defs, instance, wh):
    cs = change_set(undo_plan=PLAN)
    propose(instance, (cs))
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    assert repair(daemon) == ["snapshot", "window-1", "verify", "receipt"]
    return cs, daemon


def test_apply_then_undo_restores_counts_and_checksums(world):
    defs, instance, domains, wh = world
    _domains(domains, "L3")  # an undo still waits for a person, whatever the level
    before = partition_checksum(wh, "orders", "day", WINDOW)
    with pytest.raises(UndoError, match="has not run its window"):
        propose(instance, (change_set(undo_plan=PLAN)))
        propose_undo(instance, "cs-orders0001")
    cs, daemon = _apply(defs, instance, wh)
    assert gap(wh) == 0 and partition_checksum(wh, "orders", "day", WINDOW) != before
    undo = propose_undo(instance, cs.id)
    assert undo.change_classes == ["undo"] and undo.undo_plan.of_change_set == cs.id and undo.window == WINDOW
    propose(instance, (undo))
    tick = daemon.tick("dw_remediation_sensor")
    assert tick.run_ids == [] and f"{undo.id}: waiting for approval" in tick.skip_reason
    assert approve_in_process(instance, undo.id, approver=OWNER)[0]
    assert repair(daemon) == ["restore", "verify", "receipt"]
    assert partition_checksum(wh, "orders", "day", WINDOW) == before and gap(wh) == 20
    r = next(r for r in records.receipts(instance, dg.AssetKey("orders")) if r.change_set_id == undo.id)
    assert r.approver == OWNER and set(r.run_ids) == {"restore", "verify"}
    # the other days were never touched
    assert wh.fetch_all("SELECT count(*) FROM orders WHERE day NOT IN (DATE '2026-11-03', DATE '2026-11-04')")[0][0] == 60
    with pytest.raises(UndoError, match="already proposed"):
        propose_undo(instance, cs.id)
    again = propose_undo(instance, undo.id)  # the undo of an undo: the original change set, proposed again
    assert again.id == cs.id and again.version != cs.version and again.change_classes == cs.change_classes


def test_cli_undo(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    cs, _ = _apply(defs, instance, wh)
    dw = str(Path(sys.executable).parent / "dw-dagster")
    home = ["--dagster-home", instance.root_directory]
    bad = subprocess.run([dw, "undo", "cs-nope", *home], capture_output=True, text=True)
    assert bad.returncode == 3 and "refused: no change set 'cs-nope'" in bad.stderr
    ok = subprocess.run([dw, "undo", cs.id, *home], capture_output=True, text=True)
    assert ok.returncode == 0 and f"proposed {cs.id}-undo" in ok.stdout, ok.stderr
    assert records.find_change_set(instance, f"{cs.id}-undo") is not None
    assert c.PROPOSER == records.find_change_set(instance, f"{cs.id}-undo").proposer
