"""``dw-dagster demo access --json``: the embedded Dagster instance and the PostgreSQL server on
loopback; request → dry-run → two owners approve → grant → reminder → revoke at expiry verified →
receipt with ``granted_at``, ``revoked_at``, ``revoke_verified: true`` (the issue's Done-when)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from dw_dagster_tests.conftest import POSTGRES_URL

BIN = Path(sys.executable).parent


def test_demo_access_json(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "DW_APPROVAL_SIGNING_KEY", "DW_DOMAINS_FILE")}
    proc = subprocess.run([str(BIN / "dw-dagster"), "demo", "access", "--json", "--workdir", str(tmp_path / "work"),
                           "--database-url", POSTGRES_URL], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])
    assert data["ok"] is True and data["request_id"].startswith("acc-")
    assert data["domains"] == ["crm", "finance"] and len(data["approvals"]) == 2
    assert {a["approver"] for a in data["approvals"]} == {"ana.ruiz@grocer.example", "bo.kim@grocer.example"}
    assert data["refused"][0]["approver"] == "sam.lee@grocer.example"
    assert data["readable_while_granted"] is True and data["readable_after_revoke"] is False
    assert data["reminder"]["text"] and data["request_id"] in data["reminder"]["text"]
    assert data["granted_at"] and data["revoked_at"] and data["revoke_verified"] is True
    assert data["receipt"]["granted_at"] and data["receipt"]["revoked_at"] and data["receipt"]["revoke_verified"] is True
    assert [s["column"] for s in data["sensitive"]] == ["email"]
    # the demo leaves nothing behind on the shared server
    import sqlalchemy as sa

    eng = sa.create_engine(POSTGRES_URL)
    with eng.connect() as con:
        prefix = data["grantee_role"].rsplit("_dana", 1)[0]
        left = f"SELECT count(*) FROM pg_roles WHERE left(rolname, {len(prefix)}) = '{prefix}'"
        assert con.exec_driver_sql(left).scalar() == 0
    eng.dispose()
