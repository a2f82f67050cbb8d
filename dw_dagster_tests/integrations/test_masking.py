"""Evidence that leaves the warehouse is masked by the review's sensitive-column rules (built-in and the
domains file's ``review.sensitive``): the masked value reads ``[masked: <category>]`` and the column is
named as masked — in asset metadata (a row diff's key sample, a recorded diagnosis), in MCP answers, and
in what the page, Slack, Jira, ServiceNow and email are told about a repair that did not verify.

One paging fake, one ticket fake, one SMTP server, one instance and one daemon for the file.
"""

import socket
from types import SimpleNamespace

import dagster as dg
import pytest

from dw_dagster.checks.rowdiff import row_diff, row_diff_metadata
from dw_dagster.core import keys as c
from dw_dagster.core.domains import Domains
from dw_dagster.core.models import BlastRadius, CauseFinding, CheckOutcome, Diagnosis, Evidence, Incident, Receipt, utcnow
from dw_dagster.databases import DuckDBDatabase
from dw_dagster.integrations.jira import JiraResource, incident_label
from dw_dagster.integrations.mail import EmailResource
from dw_dagster.integrations.notifications import build_notification_sensor
from dw_dagster.integrations.opsgenie import OpsgenieResource
from dw_dagster.integrations.paging import dedup_key_for
from dw_dagster.integrations.servicenow import ServiceNowResource
from dw_dagster.integrations.slack import SlackResource
from dw_dagster.integrations.tickets import adf_text
from dw_dagster.lineage.sensitive import mask_diagnosis, rules_from
from dw_dagster_dev.fakes.paging_server import DEFAULT_OPSGENIE_KEY, DEFAULT_SLACK_TOKEN, start_paging_server
from dw_dagster_dev.fakes.tickets_server import DEFAULT_JIRA_USER, DEFAULT_SNOW_USER, FakeTicketsServer
from dw_dagster.testing.local_daemon import LocalSensorDaemon

SECRET_EMAIL, SECRET_CARD = "jo.shopper@mail.example", "4111111111111111"
DOMAINS = Domains.model_validate({
    "domains": [{"name": "store_sales", "assets": [["store_sales_line"]], "approvers": ["dana.ortiz@grocer.example"]}],
    "review": {"sensitive": {"rules": [{"name": "loyalty_card", "category": "loyalty_card",
                                         "pattern": "(^|_)loyalty_card(_|$)", "source": "grocer data policy §3"}]}}})
RULES = rules_from(DOMAINS)


@pytest.fixture(scope="module")
def outlets(tmp_path_factory):
    """Every outlet on loopback, told about one repair that did not verify, whose failing check saw a sample."""
    from aiosmtpd.controller import Controller

    paging, url = start_paging_server()
    mail = []

    class Box:
        async def handle_DATA(self, server, session, envelope):
            mail.append(envelope.content.decode("utf-8", "replace"))
            return "250 OK"

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    smtp = Controller(Box(), hostname="127.0.0.1", port=port)
    smtp.start()
    with FakeTicketsServer() as tickets, dg.instance_for_test() as instance:
        quick = dict(timeout_s=5.0, retry_base_wait_s=0.01, retry_max_wait_s=0.05)
        resources = {
            "pager": OpsgenieResource(api_key=DEFAULT_OPSGENIE_KEY, base_url=url, **quick),
            "slack": SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{url}/api", default_channel="C0DWAPPROV",
                                   **quick),
            "jira": JiraResource(base_url=tickets.url, email=DEFAULT_JIRA_USER[0], api_token=DEFAULT_JIRA_USER[1],
                                 project_key="DATA", **quick),
            "snow": ServiceNowResource(instance_url=tickets.url, username=DEFAULT_SNOW_USER[0], password=DEFAULT_SNOW_USER[1],
                                       **quick),
            "email": EmailResource(host="127.0.0.1", port=port, sender="dw@grocer.example", starttls=False)}
        defs = dg.Definitions(assets=[dg.AssetSpec(dg.AssetKey("store_sales_line"))], resources=resources, sensors=[
            build_notification_sensor(pager_resource_key="pager", slack_resource_key="slack", email_resource_key="email",
                                      ticket_resource_keys=["jira", "snow"], domains=DOMAINS)])
        daemon = LocalSensorDaemon(defs, instance, log_level="CRITICAL")
        daemon.tick("dw_notification_sensor")
        inc = Incident(id="inc-mask", asset_key=["store_sales_line"], source="dw_check", detected_at=utcnow(),
                       summary="short", gap_rows=3)
        sample = [{"customer_email": SECRET_EMAIL, "loyalty_card": SECRET_CARD, "store_id": 7}]
        check = CheckOutcome(asset_key=["store_sales_line"], check_name="row_diff", passed=False, severity="ERROR",
                             metadata={"dw/missing": 3, "dw/sample_json": sample})
        now = utcnow()
        receipt = Receipt(id="rc-mask", asset_key=["store_sales_line"], change_set_id="cs-mask", change_set_version="m" * 32,
                          incident_id=inc.id, cause_kind="x", cause_summary="x", evidence_summary={}, diff="",
                          approver="dana.ortiz@grocer.example", approved_at=now, signature_valid=True, partitions=[],
                          run_ids={}, rows_before={}, rows_after={}, checks=[check], verified=False, undo="",
                          created_at=now, previous_hash=None)
        for key, model in ((c.INCIDENT_KEY, inc), (c.RECEIPT_KEY, receipt)):
            instance.report_runless_asset_event(dg.AssetObservation(
                asset_key=dg.AssetKey(["store_sales_line"]), metadata={key: dg.MetadataValue.json(model.model_dump(mode="json"))}))
        daemon.tick("dw_notification_sensor")
        yield SimpleNamespace(paging=paging.state, tickets=tickets.state, mail=mail, inc=inc)
    smtp.stop()
    paging.stop()


def _texts(o) -> dict[str, str]:
    [alert] = o.paging.opsgenie_alerts(dedup_key_for(o.inc.id))
    [issue] = [i for i in o.tickets.issues if incident_label(o.inc.id) in i["labels"]]
    [sn] = [r for r in o.tickets.incidents if r["correlation_id"] == o.inc.id]
    return {"page": str(alert["notes"]), "slack": str(o.paging.slack_messages()),
            "jira": " ".join(adf_text(x["body"]) for x in issue["comments"]),
            "servicenow": " ".join(j["value"] for j in o.tickets.journal if j["element_id"] == sn["sys_id"]),
            "email": " ".join(o.mail)}


@pytest.mark.parametrize("outlet", ["page", "slack", "jira", "servicenow", "email"])
def test_every_outlet_gets_the_sample_masked(outlets, outlet):
    text = _texts(outlets)[outlet]
    assert "row_diff" in text, text[:500]  # the failing check is told
    assert SECRET_EMAIL not in text and SECRET_CARD not in text
    assert "[masked: email]" in text and "[masked: loyalty_card]" in text and "customer_email" in text


def test_a_row_diffs_key_sample_in_asset_metadata_is_masked(tmp_path):
    db = DuckDBDatabase(tmp_path / "w.duckdb")
    db.execute("CREATE SCHEMA s; CREATE TABLE s.src (customer_email VARCHAR, n INT); CREATE TABLE s.tgt (customer_email VARCHAR, n INT);"
               f"INSERT INTO s.src VALUES ('{SECRET_EMAIL}', 1), ('b@mail.example', 2); INSERT INTO s.tgt VALUES ('b@mail.example', 2)")
    result = row_diff(db, "s.src", "s.tgt", ["customer_email"])
    md = row_diff_metadata(result, ["customer_email"], RULES)
    shown = str(md["dw/key_sample"].value)
    assert result.missing == 1 and SECRET_EMAIL not in shown and "[masked: email]" in shown
    assert md["dw/masked_columns"] == "customer_email"


def test_a_recorded_diagnosis_and_the_mcp_answer_are_masked(tmp_path, monkeypatch):
    import yaml

    from dw_dagster.core.domains import DOMAINS_FILE_ENV
    from dw_dagster.mcp.diagnosis import cause_view

    path = tmp_path / "domains.yaml"
    path.write_text(yaml.safe_dump(DOMAINS.model_dump(mode="json")))
    monkeypatch.setenv(DOMAINS_FILE_ENV, str(path))  # the MCP server reads the domains file in force

    cause = CauseFinding(
        kind="dead_letter", summary="parked", confidence=1.0, explained_rows=1, unexplained_rows=1,
        details={"unexplained_sample": [[SECRET_EMAIL, 7]]},
        evidence=[Evidence(description="keys", database="wh", sql="SELECT 1", key_columns=["customer_email", "store_id"],
                           values={"explained": [{"key": [SECRET_EMAIL, 7], "dead_lettered": True}],
                                   "unexplained": [[SECRET_EMAIL, 8]]}),
                  Evidence(description="payloads", database="wh", sql="SELECT 2", key_columns=["customer_email", "store_id"],
                           values=[{"key": [SECRET_EMAIL, 7], "payload": f'{{"loyalty_card": "{SECRET_CARD}", "qty": 2}}'}])])
    d = Diagnosis(id="dg-mask", incident_id="inc-mask", asset_key=["orders"], created_at=utcnow(), causes=[cause],
                  blast_radius=BlastRadius(root="orders"), gap_rows=2, unexplained_rows=1)
    recorded = mask_diagnosis(d, RULES).model_dump_json()
    assert SECRET_EMAIL not in recorded and SECRET_CARD not in recorded
    assert "[masked: email]" in recorded and "[masked: loyalty_card]" in recorded
    assert '"masked_columns":["loyalty_card"]' in recorded.replace(" ", "").replace('\\"', '"')
    answer = cause_view(cause).model_dump_json()  # the MCP server answers with the recorded finding, masked again
    assert SECRET_EMAIL not in answer and SECRET_CARD not in answer


def test_the_domains_file_can_add_a_rule_and_every_mask_names_its_category():
    from dw_dagster.lineage.sensitive import mask_values

    masked = mask_values({"loyalty_card": SECRET_CARD, "basket": [{"email": SECRET_EMAIL, "qty": 1}]}, RULES)
    assert masked == {"loyalty_card": "[masked: loyalty_card]", "masked_columns": ["loyalty_card"],
                      "basket": [{"email": "[masked: email]", "qty": 1, "masked_columns": ["email"]}]}
