"""The notifications guide's code blocks, run (docs/guides/notifications.md): notifications/domains_ladder.yaml,
notifications/bad_ladder.yaml with notifications/bad_ladder_error.txt, notifications/integrations.yaml and
notifications/resources.py (notifications/fail_verify.sh is checked by test_docs)."""

from pathlib import Path

import dagster as dg
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"


def test_the_ladder_in_the_domains_file(tmp_path):
    from dw_dagster.core.domains import load_domains

    path = tmp_path / "domains.yaml"
    path.write_text((SNIPPETS / "notifications/domains_ladder.yaml").read_text())
    d = load_domains(path).get("store_sales")
    assert [(s, str(t)) for s, t in d.ladder()] == [("remind", "2:00:00"), ("escalate", "6:00:00"), ("deny", "1 day, 0:00:00")]
    assert d.escalation_approvers == ["head.of.data@grocer.example"] and d.approval_expiry_hours == 24


def test_a_bad_ladder_names_file_line_and_field(tmp_path):
    from dw_dagster.core.domains import DomainsFileError, load_domains

    path = tmp_path / "domains.yaml"
    path.write_text((SNIPPETS / "notifications/bad_ladder.yaml").read_text())
    with pytest.raises(DomainsFileError) as e:
        load_domains(path)
    assert str(e.value).replace(str(path), "domains.yaml") + "\n" == (SNIPPETS / "notifications/bad_ladder_error.txt").read_text()


def test_the_integrations_configuration_validates():
    from dw_dagster.config import IntegrationsConfig

    cfg = IntegrationsConfig.model_validate(yaml.safe_load((SNIPPETS / "notifications/integrations.yaml").read_text())["integrations"])
    assert (cfg.jira.project_key, cfg.servicenow.close_code, cfg.email.port) == ("DATA", "Solution provided", 587)
    assert cfg.review_url == "https://review.grocer.example"


def test_the_python_wiring_builds_its_sensors():
    scope: dict = {}
    exec(compile((SNIPPETS / "notifications/resources.py").read_text(), "docs/snippets/notifications/resources.py", "exec"),
         scope)
    defs: dg.Definitions = scope["notifications"]
    assert {s.name for s in defs.sensors} == {"dw_expiry_sensor", "dw_notification_sensor"}
    assert set(defs.resources) == {"slack", "email", "jira", "servicenow"}
