"""Issue 31 item 3: a dashboard refresh that failed, or would land after its ``needed_by``, pages and
escalates — exactly once per receipt.

The receipt job writes a ``dw/bi_escalation`` record beside ``dw/bi_refreshed`` (never twice for one
receipt, so a retried receipt run adds none); the notification sensor re-triggers the incident's page
with the late dashboards, notes who is escalated to (the domain's ``escalation`` list, then its
``escalation_approvers``) and tells the domain's Slack channel. A tick that fails half-way (Slack
down) is retried without paging again. Real HTTP against the fake Opsgenie/Slack on loopback, the
real sensor on a real instance.
"""

import datetime as dt
import textwrap

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.core.models import ChangeSet, Incident, Receipt, utcnow
from dw_dagster.integrations.notifications import build_notification_sensor, notifications
from dw_dagster.integrations.opsgenie import OpsgenieResource
from dw_dagster.integrations.paging import dedup_key_for
from dw_dagster.integrations.slack import SlackResource
from dw_dagster.receipts.job import bi_escalation_record, write_bi_escalation
from dw_dagster_dev.fakes.paging_server import DEFAULT_OPSGENIE_KEY, DEFAULT_SLACK_TOKEN, start_paging_server
from dw_dagster.testing.local_daemon import LocalSensorDaemon

ASSET = dg.AssetKey("orders")


@pytest.fixture
def env(tmp_path):
    domains = tmp_path / "domains.yaml"
    domains.write_text(textwrap.dedent("""\
        domains:
          - name: finance
            assets: [[orders]]
            approvers: [nadia.okafor@shop.example]
            escalation: [finance-oncall@shop.example]
            escalate_after: 2h
            escalation_approvers: [cfo@shop.example]
            slack_channel: C0DATAOPS1
        """))
    server, url = start_paging_server()
    defs = dg.Definitions(
        assets=[dg.AssetSpec(ASSET)],
        sensors=[build_notification_sensor(pager_resource_key="pager", slack_resource_key="slack", domains=str(domains),
                                           dagster_url="https://dagster.example", location_name="orders")],
        resources={"pager": OpsgenieResource(api_key=DEFAULT_OPSGENIE_KEY, base_url=url, retry_attempts=1),
                   "slack": SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{url}/api", default_channel="C0DWAPPROV",
                                          retry_attempts=1)})
    with dg.instance_for_test() as instance:
        yield server, defs, instance
    server.stop()


def _records():
    now = utcnow()
    inc = Incident(id="inc-1", asset_key=["orders"], source="dw_check", check_name="volume", detected_at=now,
                   summary="Tuesday 9 % under baseline", gap_rows=3912)
    cs = ChangeSet(id="cs-1", version="v1", incident_id="inc-1", diagnosis_id="dg-1", domain="finance", proposer=c.PROPOSER,
                   created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=["nadia.okafor@shop.example"],
                   cause_kind="x", summary="relax shipping_country and replay", target_asset=["orders"], window=[],
                   diff="", files=[], rebuild_assets=[])
    r = Receipt(id="rc-1", asset_key=["orders"], change_set_id="cs-1", change_set_version="v1", incident_id="inc-1",
                cause_kind="x", cause_summary="", evidence_summary={}, diff="", approver="nadia.okafor@shop.example",
                approved_at=now, signature_valid=True, partitions=[], run_ids={}, rows_before={}, rows_after={},
                checks=[], verified=True, undo="", created_at=now, previous_hash=None)
    rows = [{"exposure": "daily_gmv", "tool": "lightdash", "refreshed_at": None, "deadline": "2026-11-25T07:30:00-05:00",
             "before_deadline": False, "error": "LightdashRefreshFailed: the query of chart 'GMV by day' ended error",
             "escalate": True},
            {"exposure": "store_pnl", "tool": "tableau", "refreshed_at": "2026-11-25T11:00:00+00:00",
             "deadline": "2026-11-25T08:00:00-06:00", "before_deadline": True, "error": None, "escalate": False}]
    return inc, cs, r, rows


def test_a_late_dashboard_pages_and_escalates_once_per_receipt(env):
    server, defs, instance = env
    inc, cs, r, rows = _records()
    daemon = LocalSensorDaemon(defs, instance, log_level="CRITICAL")
    daemon.tick("dw_notification_sensor")  # starts after what the instance holds
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=ASSET, metadata={c.INCIDENT_KEY: dg.MetadataValue.json(inc.model_dump(mode="json"))}))
    daemon.tick("dw_notification_sensor")  # the incident's page
    assert write_bi_escalation(instance, cs, r, rows) is True
    assert write_bi_escalation(instance, cs, r, rows) is False  # a retried receipt run: no second record
    server.state.add_fault(status=500, count=-1, path="/api/chat.postMessage")  # Slack down on this tick
    daemon.tick("dw_notification_sensor")
    server.state.clear_faults()
    daemon.tick("dw_notification_sensor")  # Slack retried; the page is not triggered or noted again
    daemon.tick("dw_notification_sensor")
    told = [(n["channel"], n["action"]) for n in notifications(instance) if n["ok"] and n["action"] == "bi_escalation"]
    assert sorted(told) == [("pager", "bi_escalation"), ("slack", "bi_escalation")]
    (alert,) = server.state.opsgenie_alerts(dedup_key_for("inc-1"))
    assert alert["count"] == 2  # the incident's trigger, then one re-trigger for the late dashboard
    (note,) = [n for n in alert["notes"] if "did not refresh before they are needed" in n["note"]]
    assert "daily_gmv (lightdash): refresh failed" in note["note"] and "store_pnl" not in note["note"]
    assert "Escalated to: finance-oncall@shop.example, cfo@shop.example" in note["note"]
    (msg,) = server.state.slack_messages("C0DATAOPS1")
    assert "rc-1" in str(msg) and "cfo@shop.example" in str(msg)


def test_the_record_names_only_what_escalates():
    inc, cs, r, rows = _records()
    rec = bi_escalation_record(cs, r, rows)
    assert (rec["receipt_id"], rec["change_set_id"], rec["incident_id"], rec["domain"]) == ("rc-1", "cs-1", "inc-1", "finance")
    assert [x["exposure"] for x in rec["rows"] if x["escalate"]] == ["daily_gmv"]
