"""The notification sensor: once per record and channel; one channel's failure is retried without
repeating the others (Opsgenie page, Slack approval request, Lightup untouched for non-Lightup incidents)."""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster import constants as c
from dw_dagster.fakes.paging_server import DEFAULT_OPSGENIE_KEY, DEFAULT_SLACK_TOKEN, start_paging_server
from dw_dagster.local_daemon import LocalSensorDaemon
from dw_dagster.models import BlastRadius, ChangeSet, Diagnosis, Incident, utcnow
from dw_dagster.notify_sensor import build_notification_sensor, notifications
from dw_dagster.paging import OpsgenieResource, dedup_key_for
from dw_dagster.slack import SlackResource

ASSET = dg.AssetKey("orders")


@pytest.fixture
def env():
    server, url = start_paging_server()
    defs = dg.Definitions(
        assets=[dg.AssetSpec(ASSET)],
        sensors=[build_notification_sensor(pager_resource_key="pager", slack_resource_key="slack",
                                           dagster_url="https://dagster.example", location_name="orders")],
        resources={"pager": OpsgenieResource(api_key=DEFAULT_OPSGENIE_KEY, base_url=url, retry_attempts=1),
                   "slack": SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{url}/api", default_channel="C0DWAPPROV",
                                          retry_attempts=1)},
    )
    with dg.instance_for_test() as instance:
        yield server, defs, instance
    server.stop()


def _record(instance, key: str, model) -> None:
    instance.report_runless_asset_event(dg.AssetObservation(asset_key=ASSET, metadata={key: dg.MetadataValue.json(model.model_dump(mode="json"))}))


def _records(instance):
    inc = Incident(id="inc-1", asset_key=["orders"], source="dw_check", check_name="volume", detected_at=utcnow(),
                   summary="Tuesday 9 % under baseline", gap_rows=3912)
    diag = Diagnosis(id="dg-1", incident_id="inc-1", asset_key=["orders"], created_at=utcnow(), causes=[],
                     blast_radius=BlastRadius(root="orders"), gap_rows=3912, unexplained_rows=3912)
    now = utcnow()
    cs = ChangeSet(id="cs-1", version="v1", incident_id="inc-1", diagnosis_id="dg-1", domain="orders", proposer=c.PROPOSER,
                   created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=["fin@x.example"], cause_kind="x",
                   summary="relax shipping_country and replay", target_asset=["orders"], window=[], diff="", files=[],
                   rebuild_assets=[])
    _record(instance, c.INCIDENT_KEY, inc)
    _record(instance, c.DIAGNOSIS_KEY, diag)
    _record(instance, c.CHANGE_SET_KEY, cs)


def test_first_tick_starts_after_existing_records(env):
    server, defs, instance = env
    _records(instance)  # e.g. an earlier demo's incident in the same instance
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    first = daemon.tick("dw_notification_sensor")
    assert "starting after the 3 record(s)" in first.skip_reason
    assert daemon.tick("dw_notification_sensor").events == []
    assert notifications(instance) == [] and server.state.slack_messages() == []


def test_each_record_once_per_channel(env):
    server, defs, instance = env
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    daemon.tick("dw_notification_sensor")
    _records(instance)
    daemon.tick("dw_notification_sensor")
    sent = sorted((n["channel"], n["action"], n["ok"]) for n in notifications(instance))
    assert sent == [("pager", "annotate", True), ("pager", "trigger", True), ("slack", "approval_request", True)]
    (alert,) = server.state.opsgenie_alerts(dedup_key_for("inc-1"))
    assert len(alert["notes"]) == 1
    (msg,) = server.state.slack_messages("C0DWAPPROV")
    assert "dw-dagster approve cs-1 --approver fin@x.example" in str(msg)
    daemon.tick("dw_notification_sensor")
    assert len(notifications(instance)) == 3 and len(server.state.slack_messages()) == 1


def test_failed_channel_is_retried_without_repeating_the_others(env):
    server, defs, instance = env
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    daemon.tick("dw_notification_sensor")
    _records(instance)
    server.state.add_fault(status=500, count=-1, path="/api/chat.postMessage")
    first = daemon.tick("dw_notification_sensor")
    failed = [n for n in notifications(instance) if not n["ok"]]
    assert [(n["channel"], n["action"]) for n in failed] == [("slack", "change_set")]
    server.state.clear_faults()
    daemon.tick("dw_notification_sensor")
    ok = sorted((n["channel"], n["action"]) for n in notifications(instance) if n["ok"])
    assert ok == [("pager", "annotate"), ("pager", "trigger"), ("slack", "approval_request")]
    (alert,) = server.state.opsgenie_alerts(dedup_key_for("inc-1"))
    assert len(alert["notes"]) == 1  # the page was not annotated twice
    assert len(server.state.slack_messages()) == 1 and first.cursor is not None
