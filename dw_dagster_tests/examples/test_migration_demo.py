"""``dw-dagster demo migration --json`` end to end (the embedded default, DuckDB → DuckDB), as ``make
demo-migration`` runs it: two waves of five pairs, the sales-line pair failing parity behind the
loader's watermark and repaired with the owner's approval, both waves held and signed off by the
owner through the identity provider, then reopened by a source update. (PostgreSQL → DuckDB runs the
same gate in ``dw_dagster_tests/migration/test_gate_e2e.py``.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
OWNER = "dana.ortiz@grocer.example"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    work = tmp_path_factory.mktemp("migration_demo")
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "DW_MIGRATION_HOME", "DW_MIGRATION_SOURCE_URL")}
    env.pop("DW_APPROVAL_SIGNING_KEY", None)  # the demo makes its own, next to its instance
    proc = subprocess.run([str(BIN / "dw-dagster"), "demo", "migration", "--json", "--workdir", str(work)],
                          capture_output=True, text=True, env=env, cwd=work, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout), proc.stderr, work


def test_the_json_has_every_field_the_issue_names(demo):
    out, _, _ = demo
    assert {"waves", "parity", "repaired", "reopened", "seconds"} <= set(out) and out["ok"]
    assert [w["name"] for w in out["waves"]] == ["wave1", "wave2"]
    for w in out["waves"]:
        assert len(w["pairs"]) == 5 and len(w["evidence_hash"]) == 32
        assert w["signed_off_by"]["email"] == OWNER and w["signed_off_by"]["method"] == "oidc"
    assert {w["name"]: w["state"] for w in out["waves"]} == {"wave1": "reopened", "wave2": "signed_off"}
    assert len(out["parity"]) == 10
    assert all(set(kinds) == {"schema", "counts", "key_diff"} for kinds in out["parity"].values())


def test_the_failing_pair_was_repaired_through_the_loop(demo):
    out, log, _ = demo
    rep = out["repaired"]
    assert rep["pair"] == "pos.sales_line → warehouse/sales_line" and rep["receipt_id"].startswith("rc-")
    assert rep["cause"] == "late_rows_behind_watermark" and rep["approved_by"]["method"] == "oidc"
    assert "wave1: failing" in log and "pos.sales_line → warehouse/sales_line: failing: counts" in log
    refused = " ".join(r["reason"] for r in out["refused"])
    assert "is not an approver" in refused and "needs a verified identity" in refused


def test_the_source_update_reopened_wave_1(demo):
    out, log, _ = demo
    assert out["reopened"]["wave"] == "wave1" and "sales_line" in out["reopened"]["cause"]
    assert out["reopened"]["incident"] and "REOPENED" in log


def test_status_reads_the_same_instance(demo):
    _, _, work = demo
    home = work / "dagster_home_migration"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    proc = subprocess.run([str(BIN / "dw-dagster"), "migration", "status", "--json"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    waves = {w["wave"]: w for w in json.loads(proc.stdout)}
    assert waves["wave1"]["state"] == "reopened" and waves["wave2"]["state"] == "signed_off"
    assert waves["wave2"]["signed_off_by"]["method"] == "oidc"
