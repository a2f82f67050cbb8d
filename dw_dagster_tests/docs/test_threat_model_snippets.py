"""The threat model page's snippets run: the deployment's ``dagster.yaml`` and an assistant's marked answer.

- ``concepts/threat-model/dagster.yaml`` is loaded as an instance's ``dagster.yaml``: its run
  coordinator is dw_dagster's and run monitoring is on;
- ``concepts/threat-model/untrusted_event.json`` validates as a ``get_audit_trail`` event whose typed
  name is only in the untrusted part;
- ``concepts/threat-model/approvals_serve.sh`` is checked by ``test_docs.py`` (the command answers ``--help``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg

SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets"


def test_the_deployment_dagster_yaml_loads_with_the_guarded_coordinator_and_run_monitoring(tmp_path):
    from dw_dagster import GuardedRunCoordinator

    shutil.copy(SNIPPETS / "concepts/threat-model/dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_coordinator, GuardedRunCoordinator)
        assert instance.run_monitoring_enabled and instance.run_monitoring_start_timeout_seconds == 180


def test_the_marked_answer_is_a_valid_audit_event():
    from dw_dagster.mcp.audit import AuditEvent

    ev = AuditEvent.model_validate_json((SNIPPETS / "concepts/threat-model/untrusted_event.json").read_text())
    typed = ev.untrusted["actor"].untrusted_data
    assert typed not in ev.actor and typed not in ev.summary
    assert AuditEvent.model_json_schema()["$defs"]["Untrusted"]["x-dw-untrusted"] is True


def test_the_documented_diagnosis_marks_warehouse_text_as_untrusted():
    """``mcp/diagnose_incident_output.txt`` (the MCP guide): what a diagnosis quotes from the warehouse is
    inside untrusted objects, as the tool returns it."""
    import json

    from dw_dagster.mcp.diagnosis import CauseView
    from dw_dagster.mcp.untrusted import Untrusted

    text = (SNIPPETS / "mcp/diagnose_incident_output.txt").read_text()
    doc = json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")))
    primary = doc["primary"]
    for field in ("summary", "details"):
        Untrusted.model_validate(primary[field])
    for e in primary["evidence"]:
        for field in ("description", "sql", "values"):
            Untrusted.model_validate(e[field])
    Untrusted.model_validate(doc["markdown"])
    assert set(primary) <= set(CauseView.model_fields)
