"""Checks in CI: `dagster job execute` on a checks-only job exits non-zero exactly when a blocking check fails."""

import os
import subprocess
import sys
import shlex
from pathlib import Path

import pytest

from dw_dagster.databases import DuckDBDatabase

BIN = Path(sys.executable).parent

# the docs' CI page (docs/snippets/ci/ci_defs.py and ci/ci_execute.sh), run as written
SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets"
CODE = (SNIPPETS / "ci/ci_defs.py").read_text()
COMMAND = shlex.split((SNIPPETS / "ci/ci_execute.sh").read_text().split("#")[0])


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
    assert COMMAND[:4] == ["dagster", "job", "execute", "-f"]
    proc = subprocess.run([str(BIN / "dagster"), *COMMAND[1:]],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == exit_code, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "reconciliation" in out
    if exit_code:
        assert "rows short" in out or "DagsterAssetCheckFailedError" in out
