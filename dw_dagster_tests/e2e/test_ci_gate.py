"""Checks in CI: `dagster job execute` on a checks-only job exits non-zero exactly when a blocking check fails."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dw_dagster.databases import DuckDBDatabase

BIN = Path(sys.executable).parent

CODE = textwrap.dedent('''
    import dagster as dg
    from dw_dagster import DatabaseResource, build_null_rate_check, build_reconciliation_checks

    recon = build_reconciliation_checks(
        asset="orders", source_asset="orders_source", source_table="src.orders", target_table="tgt.orders",
        slice_by=["region"], measures=["amount"], key_columns=["id"], blocking=True)
    nulls = build_null_rate_check(asset="orders", table="tgt.orders", columns=["region"], name="region_nulls",
                                  severity=dg.AssetCheckSeverity.WARN)
    defs = dg.Definitions(
        assets=[dg.AssetSpec("orders"), dg.AssetSpec("orders_source")],
        asset_checks=[recon, nulls],
        jobs=[dg.define_asset_job("ci_checks", selection=dg.AssetSelection.all_asset_checks())],
        resources={"source_db": DatabaseResource(url=dg.EnvVar("CI_WAREHOUSE")),
                   "warehouse": DatabaseResource(url=dg.EnvVar("CI_WAREHOUSE"))},
    )
''')


@pytest.mark.parametrize("target_rows,exit_code", [("(1,'EU',10.00),(2,'US',5.50)", 0), ("(1,'EU',10.00)", 1)],
                         ids=["passing", "failing"])
def test_checks_job_exit_code(tmp_path, target_rows, exit_code):
    db = DuckDBDatabase(tmp_path / "staging.duckdb")
    db.execute("CREATE SCHEMA src; CREATE SCHEMA tgt")
    db.execute("CREATE TABLE src.orders (id INT, region VARCHAR, amount DECIMAL(18,2))")
    db.execute("INSERT INTO src.orders VALUES (1,'EU',10.00),(2,'US',5.50)")
    db.execute(f"CREATE TABLE tgt.orders AS SELECT * FROM src.orders WHERE false; INSERT INTO tgt.orders VALUES {target_rows}")
    (tmp_path / "ci_defs.py").write_text(CODE)
    env = {**os.environ, "CI_WAREHOUSE": f"duckdb:///{db.path}", "DAGSTER_HOME": str(tmp_path)}
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    proc = subprocess.run([str(BIN / "dagster"), "job", "execute", "-f", str(tmp_path / "ci_defs.py"), "-j", "ci_checks"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == exit_code, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "reconciliation" in out
    if exit_code:
        assert "rows short" in out or "DagsterAssetCheckFailedError" in out
