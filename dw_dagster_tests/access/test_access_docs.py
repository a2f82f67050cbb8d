"""The access guide's snippets (docs/guides/access.md), run: access/domains.yaml validates,
access/definitions.py builds the location, access/slack_command.txt is a command the slash
endpoint reads, access/request_output.json has the shape ``access request --json`` prints (its
keys are checked against a real run in ``test_access_cli.py``)."""

import json
import shutil
from pathlib import Path

from dw_dagster.access.slack import parse_text
from dw_dagster.core.domains import load_domains

SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets"


def test_access_domains_yaml_validates():
    doms = load_domains(SNIPPETS / "access/domains.yaml")
    assert doms.access.max_hours == 72 and doms.access.role_name == "{email}"
    crm = doms.get("crm")
    assert crm.autonomous_access == "non_sensitive" and crm.autonomous(["access_grant"])
    assert not doms.get("finance").autonomous(["access_grant"])
    assert [d.name for d in doms.for_table("finance.ledger")] == ["finance"]


def test_access_definitions_py_builds_the_location(tmp_path, monkeypatch):
    shutil.copy(SNIPPETS / "access/domains.yaml", tmp_path / "domains.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WAREHOUSE_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    scope: dict = {}
    code = (SNIPPETS / "access/definitions.py").read_text()
    exec(compile(code, "docs/snippets/access/definitions.py", "exec"), scope)  # noqa: S102 - the docs' own code
    defs = scope["defs"]
    assert defs.resolve_sensor_def("dw_access_sensor") is not None
    assert {defs.resolve_job_def(n).name for n in ("dw_access_grant", "dw_access_revoke", "dw_approve_change_set")}
    assert defs.resolve_job_def("dw_access_grant").tags["dw/kind"] == "access"


def test_access_slack_command_txt_parses():
    text = (SNIPPETS / "access/slack_command.txt").read_text().strip()
    command, _, rest = text.partition(" ")
    args = parse_text(rest)
    assert command == "/dw-access" and (args.grant, args.duration, args.why) == ("analyst", "8h", "quarter close")


def test_access_request_output_json_has_the_summary_shape():
    shown = json.loads((SNIPPETS / "access/request_output.json").read_text())
    assert {"request_id", "grantee", "statements", "rollback", "newly_reachable", "sensitive", "approvers",
            "expires_at"} <= set(shown)
    assert set(shown["newly_reachable"][0]) == {"table", "columns", "privilege", "table_level", "grant_option"}
    assert set(shown["sensitive"][0]) == {"table", "column", "category", "rule"}
