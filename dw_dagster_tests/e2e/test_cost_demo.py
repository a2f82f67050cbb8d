"""``dw-dagster demo cost --json`` as a user runs it: one report per engine (the embedded DuckDB default and
Snowflake on fakesnow with a seeded month), and one drafted warehouse change approved by its owner through
the identity provider, applied and verified over the next week's metering."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dw_dagster_tests.mcp.conftest import clean_env

BIN = Path(sys.executable).parent
DONE_WHEN = {"period", "engine", "metered", "attributed", "idle", "unattributed", "by_model", "by_asset", "by_run",
             "by_warehouse", "sql"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    work = tmp_path_factory.mktemp("cost_demo")
    proc = subprocess.run([str(BIN / "dw-dagster"), "demo", "cost", "--json", "--workdir", str(work)],
                          capture_output=True, text=True, env=clean_env(), cwd=work, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, json.loads(proc.stdout), proc.stderr


def test_one_reconciled_report_per_engine(demo):
    _, out, _ = demo
    assert [r["engine"] for r in out["reports"]] == ["duckdb", "snowflake"]
    for r in out["reports"]:
        assert DONE_WHEN <= set(r) and r["reconciled"]
        assert abs(r["attributed"] + r["idle"] + r["unattributed"] - r["metered"]) <= 1e-6
    duck, snow = out["reports"]
    assert duck["unit"] == "seconds" and "store_sales_line" in duck["by_asset"]
    assert any(k.startswith("model.store_sales.") for k in duck["by_model"])
    assert snow["unit"] == "credits" and set(snow["by_warehouse"]) >= {"LOAD_WH", "TRANSFORM_WH", "BI_WH"}
    assert snow["idle"] > 0 and snow["idle_by_warehouse"]["LOAD_WH"] > 0
    assert snow["beside"]["query_attribution_history"]["queries_not_in_view"] > 0


def test_a_warehouse_change_approved_applied_and_verified(demo):
    _, out, stderr = demo
    wc = out["warehouse_change"]
    assert {"forward", "rollback", "approved_by", "saving_expected", "saving_measured", "verified"} <= set(wc)
    assert wc["forward"] == "ALTER WAREHOUSE LOAD_WH SET AUTO_SUSPEND = 60"
    assert wc["rollback"] == "ALTER WAREHOUSE LOAD_WH SET AUTO_SUSPEND = 1800"
    assert wc["approved_by"].startswith("priya.raman@grocer.example (verified by OIDC")
    assert wc["verified"] is True and wc["saving_measured"] > 0 and wc["saving_expected"] > 0
    assert [r["approver"] for r in out["refused"]][0] == "dw-dagster"
    assert out["receipt"]["verified"] and out["receipt"]["repair_cost"]["runs"] == 2
    assert "[simulated]" in stderr and "stage verify waits until" in stderr


def test_the_receipts_verify_on_the_demos_instance(demo):
    work, _, _ = demo
    home = work / "dagster_home"
    key = (home / "approval_signing.key").read_text().strip()
    proc = subprocess.run([str(BIN / "dw-dagster"), "receipts", "verify"], capture_output=True, text=True,
                          env=clean_env(DAGSTER_HOME=str(home), DW_APPROVAL_SIGNING_KEY=key), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
