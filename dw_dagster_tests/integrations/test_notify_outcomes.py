"""Outcome-true notifications: only a verified repair resolves the page, closes the alert, closes
Lightup's incident and tells Slack "resolved"; every other outcome (applied but not verified, failed
at a stage, halted by the org-wide stop, an undo) keeps or re-triggers the page with the failing
check, its SQL and values, and says what really happened, on PagerDuty, Opsgenie, Slack and Lightup.

One paging fake, one Lightup fake, one instance and one sensor daemon for the whole file; each
outcome gets its own incident (and its own Lightup incident), so the cases do not meet.
"""

import datetime as dt
from types import SimpleNamespace

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.core.models import CheckOutcome, Incident, Receipt, utcnow
from dw_dagster.integrations.lightup import LightupResource
from dw_dagster.integrations.notifications import build_notification_sensor, notifications
from dw_dagster.integrations.opsgenie import OpsgenieResource
from dw_dagster.integrations.pagerduty import PagerDutyResource
from dw_dagster.integrations.paging import dedup_key_for
from dw_dagster.integrations.slack import SlackResource
from dw_dagster.receipts.job import _outcome
from dw_dagster_dev.fakes.paging_server import (
    DEFAULT_OPSGENIE_KEY,
    DEFAULT_PAGERDUTY_TOKEN,
    DEFAULT_PAGERDUTY_USERS,
    DEFAULT_ROUTING_KEY,
    DEFAULT_SLACK_TOKEN,
    start_paging_server,
)
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_tests.harness.lightup_fixtures import epoch, fake_lightup

ASSET = ["store_sales_line"]
CHANNEL = "C0DWAPPROV"
QUERY = "SELECT region, count(*) FROM pos.sales_line GROUP BY region"
FAST = dict(timeout_s=5.0, retry_base_wait_s=0.01, retry_max_wait_s=0.05)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    server, url = start_paging_server()
    with fake_lightup(tmp_path_factory.mktemp("lightup")) as (lu_server, lu, ids, _), dg.instance_for_test() as instance:
        lightup = LightupResource(server=lu_server.url, refresh_token=lu.refresh_token, attempts=2, base_wait_s=0.01)
        slack = SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{url}/api", default_channel=CHANNEL, **FAST)
        pd = PagerDutyResource(routing_key=DEFAULT_ROUTING_KEY, api_token=DEFAULT_PAGERDUTY_TOKEN,
                               from_email=DEFAULT_PAGERDUTY_USERS[0], events_base_url=url, rest_base_url=url,
                               incident_lookup_s=2.0, **FAST)
        og = OpsgenieResource(api_key=DEFAULT_OPSGENIE_KEY, base_url=url, **FAST)
        defs = dg.Definitions(
            assets=[dg.AssetSpec(dg.AssetKey(ASSET))],
            resources={"lightup": lightup, "slack": slack, "pd": pd, "og": og},
            sensors=[build_notification_sensor(name="notify_pd", dagster_url="https://dagster.example",
                                               lightup_resource_key="lightup", pager_resource_key="pd",
                                               slack_resource_key="slack", recheck_timeout_s=30),
                     build_notification_sensor(name="notify_og", dagster_url="https://dagster.example",
                                               pager_resource_key="og")])
        daemon = LocalSensorDaemon(defs, instance, log_level="CRITICAL")
        daemon.tick("notify_pd")
        daemon.tick("notify_og")
        yield SimpleNamespace(server=server, lu=lu, ids=ids, instance=instance, daemon=daemon)
    server.stop()


def _record(instance, key: str, model) -> None:
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(ASSET), metadata={key: dg.MetadataValue.json(model.model_dump(mode="json"))}))


def _tick(w) -> None:
    w.daemon.tick("notify_pd")
    w.daemon.tick("notify_og")


def _stages(**states) -> dict:
    return {name: SimpleNamespace(state=st, result=res) for name, (st, res) in states.items()}


FAILED_CHECK = CheckOutcome(asset_key=ASSET, check_name="region_compare", passed=False, severity="ERROR", run_id="r-verify",
                            metadata={"dw/gap_rows": 40, "dw/failing_slices": 1, "dw/queries": f"```sql\n{QUERY}\n```",
                                      "dw/slices_json": [{"slice": {"region": "Southwest"}, "gap_rows": 40,
                                                          "gap_pct": 1.8, "passed": False}]})
PASSED_CHECK = FAILED_CHECK.model_copy(update={"passed": True, "metadata": {"dw/gap_rows": 0}})

OUTCOMES = {
    # the receipt job's own wording for each end (receipts.job._outcome), not a hand-written copy
    "verified": dict(outcome=_outcome("receipt", _stages(**{"window-1": ("succeeded", {})}), ""), verified=True,
                     checks=[PASSED_CHECK]),
    "not_verified": dict(outcome=_outcome("receipt", _stages(**{"window-1": ("succeeded", {}), "verify": ("succeeded", {})}),
                                          ""), verified=False, checks=[FAILED_CHECK]),
    "failed": dict(outcome=_outcome("receipt", _stages(**{"snapshot": ("succeeded", {}), "window-1": (
        "failed", {"reason": "Binder Error: column posted_ts not found"})}), ""), verified=False, checks=[]),
    "halted": dict(outcome=_outcome("receipt-halt", _stages(**{"window-1": ("succeeded", {})}),
                                    "org-wide stop by ops@grocer.example: warehouse maintenance"), verified=False, checks=[]),
}


def _incident(w, name: str, region: str) -> Incident:
    raw = w.lu.add_incident(filter_uuid=w.ids["rows_monitor"], slice={"region": region},
                            start_ts=epoch("2026-11-20"), end_ts=epoch("2026-11-25"))
    return Incident(id=f"inc-{name}", asset_key=ASSET, source="lightup", external_id=raw["uuid"],
                    check_name="lightup_compare", detected_at=utcnow(), summary="Southwest rows short", gap_rows=40)


def _receipt(inc: Incident, name: str, *, outcome: str, verified: bool, checks: list, cause_kind: str = "late_rows") -> Receipt:
    now = utcnow()
    return Receipt(id=f"rc-{name}", asset_key=ASSET, change_set_id=f"cs-{name}", change_set_version="v" * 32,
                   incident_id=inc.id, cause_kind=cause_kind, cause_summary="rows behind the watermark", evidence_summary={},
                   diff="", approver="dana.ortiz@grocer.example", approved_at=now, signature_valid=True,
                   partitions=["2026-11-23"], run_ids={"window-1": "r-window"}, rows_before={}, rows_after={},
                   checks=checks, verified=verified, undo="", created_at=now + dt.timedelta(seconds=1),
                   previous_hash=None, outcome=outcome)


def _open_and_end(w, name: str, region: str, **receipt) -> Incident:
    inc = _incident(w, name, region)
    _record(w.instance, c.INCIDENT_KEY, inc)
    _tick(w)
    _record(w.instance, c.RECEIPT_KEY, _receipt(inc, name, **receipt))
    _tick(w)
    return inc


def _slack_text(w, inc: Incident) -> str:
    msgs = [m for m in w.server.state.slack_messages(CHANNEL) if inc.id in str(m)]
    assert len(msgs) == 1, msgs
    return str(msgs[0])


def _lightup_comments(w, inc: Incident) -> list[str]:
    return [x["comment"] for x in w.lu.comments.get(inc.external_id, [])]


def test_applied_and_verified_resolves_everything(world):
    w = world
    inc = _open_and_end(w, "verified", "West", **OUTCOMES["verified"])  # West is whole: Lightup's re-read gap is 0
    [page] = w.server.state.pagerduty_incidents(dedup_key_for(inc.id))
    assert page["status"] == "resolved"
    assert page["notes"][-1]["content"].startswith("Resolved by dw_dagster: repaired, verified, receipt written.")
    [alert] = w.server.state.opsgenie_alerts(dedup_key_for(inc.id))
    assert alert["status"] == "closed"
    assert "*Resolved* incident" in _slack_text(w, inc)
    assert w.lu.incidents[inc.external_id]["status"] == 5
    assert "Compare gap is 0." in _lightup_comments(w, inc)[-1]
    assert {(n["channel"], n["action"]) for n in notifications(w.instance) if n.get("incident_id") == inc.id} >= {
        ("pager", "resolve"), ("slack", "resolved"), ("lightup", "verify")}


@pytest.mark.parametrize("name", ["not_verified", "failed", "halted"])
def test_an_outcome_that_did_not_prove_itself_keeps_the_page_open(world, name):
    w = world
    inc = _open_and_end(w, name, "Southwest", **OUTCOMES[name])
    outcome = OUTCOMES[name]["outcome"]
    headline = {"not_verified": "repair applied but NOT verified", "failed": "repair FAILED",
                "halted": "repair HALTED"}[name]
    [page] = w.server.state.pagerduty_incidents(dedup_key_for(inc.id))
    assert page["status"] == "triggered"
    note = page["notes"][-1]["content"]
    assert headline in note and outcome in note and "Resolved" not in note and "repaired, verified" not in note
    [alert] = w.server.state.opsgenie_alerts(dedup_key_for(inc.id))
    assert alert["status"] == "open" and alert["count"] == 2  # re-triggered into the open alert
    assert headline in alert["notes"][-1]["note"]
    slack = _slack_text(w, inc)
    assert headline in slack and "*Resolved*" not in slack and "resolved with" not in slack
    assert w.lu.incidents[inc.external_id]["status"] != 5
    comment = _lightup_comments(w, inc)[-1]
    assert headline in comment and "stays open" in comment and "repaired this" not in comment
    if name == "not_verified":  # the failing check, its SQL and its values travel with the page
        for text in (note, slack, comment, alert["notes"][-1]["note"]):
            assert "region_compare" in text and QUERY in text and "gap_rows=40" in text
            assert "region=Southwest: 40 rows short (1.80 %)" in text
        retrigger = [e for e in w.server.state.snapshot()["pagerduty"]["events"]
                     if e["dedup_key"] == dedup_key_for(inc.id) and e["event_action"] == "trigger"][-1]
        assert retrigger["payload"]["custom_details"]["failing_checks"][0]["sql"] == QUERY
    if name == "failed":
        assert "column posted_ts not found" in note
    if name == "halted":
        assert "org-wide stop by ops@grocer.example" in note and "approve to continue" in note
    told = {(n["channel"], n["action"], n.get("verdict")) for n in notifications(w.instance) if n.get("incident_id") == inc.id}
    assert {("pager", "retrigger", name), ("slack", "not_resolved", name), ("lightup", "outcome", name)} <= told


def test_an_undo_after_a_verified_repair_triggers_a_new_page(world):
    """PagerDuty folds a trigger into the open incident with its dedup key and opens a new incident when
    the one with that key is resolved ("If there's no open (i.e. unresolved) incident with this key, a new
    one will be created", https://github.com/YelpArchive/elastalert/issues/2535); a shared key would act on
    the wrong incident (https://github.com/elastic/kibana/issues/76908). The key is the incident's own, so
    an undo of a resolved repair pages again, on that incident."""
    w = world
    inc = _open_and_end(w, "undone", "West", **OUTCOMES["verified"])
    assert [p["status"] for p in w.server.state.pagerduty_incidents(dedup_key_for(inc.id))] == ["resolved"]
    undo = _receipt(inc, "undone-undo", outcome="applied", verified=True, checks=[PASSED_CHECK], cause_kind="undo")
    _record(w.instance, c.RECEIPT_KEY, undo)
    _tick(w)
    pages = w.server.state.pagerduty_incidents(dedup_key_for(inc.id))
    assert [p["status"] for p in pages] == ["resolved", "triggered"]  # the undo re-opened the page
    assert "repair UNDONE" in pages[-1]["notes"][-1]["content"]
    alerts = w.server.state.opsgenie_alerts(dedup_key_for(inc.id))
    assert [a["status"] for a in alerts] == ["closed", "open"]
    undo_msgs = [m for m in w.server.state.slack_messages(CHANNEL) if "rc-undone-undo" in str(m)]
    assert len(undo_msgs) == 1 and "repair UNDONE" in str(undo_msgs[0]) and "*Resolved*" not in str(undo_msgs[0])
    assert "repair UNDONE" in _lightup_comments(w, inc)[-1]


def test_a_second_tick_repeats_nothing(world):
    w = world
    before = len(w.server.state.request_log()), len(notifications(w.instance))
    _tick(w)
    assert (len(w.server.state.request_log()), len(notifications(w.instance))) == before
