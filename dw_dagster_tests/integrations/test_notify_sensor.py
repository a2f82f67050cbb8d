"""The notification sensor: once per record and channel; one channel's failure is retried without
repeating the others (Opsgenie page, Slack approval request, Lightup untouched for non-Lightup incidents).

Exactly once, with real HTTP against the fakes and the real sensor ticking on a real instance: a
note, comment or message the vendor applied while its answer timed out is found by its marker and
not posted again (in the same call or on the next tick); a later step of a task that fails (the
PagerDuty resolve event, Lightup's close) is retried alone on the next tick.
"""

import datetime as dt
import time
from urllib.parse import quote

import dagster as dg
import httpx
import pytest

from dw_dagster.core import keys as c
from dw_dagster_dev.fakes.paging_server import (
    DEFAULT_OPSGENIE_KEY,
    DEFAULT_PAGERDUTY_TOKEN,
    DEFAULT_PAGERDUTY_USERS,
    DEFAULT_ROUTING_KEY,
    DEFAULT_SLACK_TOKEN,
    start_paging_server,
)
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core.models import BlastRadius, ChangeSet, Diagnosis, Incident, Receipt, utcnow
from dw_dagster.integrations.notifications import NOTIFICATION_STEP_KEY, build_notification_sensor, notifications, step_ref, task_id_for
from dw_dagster.integrations.paging import dedup_key_for
from dw_dagster.integrations.opsgenie import OpsgenieResource
from dw_dagster.integrations.pagerduty import PagerDutyResource
from dw_dagster.integrations.slack import SlackResource

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
    assert sent == [("pager", "annotate", True), ("pager", "trigger", True), ("slack", "approval_request", True),
                    ("slack_dm:fin@x.example", "approval_request", False)]  # no Slack member has that address
    [dm] = [n for n in notifications(instance) if n["channel"].startswith("slack_dm:")]
    assert dm["unreachable"] is True and "cannot be reached in Slack" in dm["detail"]
    (alert,) = server.state.opsgenie_alerts(dedup_key_for("inc-1"))
    assert len(alert["notes"]) == 1
    (msg,) = server.state.slack_messages("C0DWAPPROV")
    assert "dw-dagster approve cs-1 --approver fin@x.example" in str(msg)
    daemon.tick("dw_notification_sensor")
    assert len(notifications(instance)) == 4 and len(server.state.slack_messages()) == 1


def test_failed_channel_is_retried_without_repeating_the_others(env):
    server, defs, instance = env
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    daemon.tick("dw_notification_sensor")
    _records(instance)
    server.state.add_fault(status=500, count=-1, path="/api/chat.postMessage")
    first = daemon.tick("dw_notification_sensor")
    failed = [n for n in notifications(instance) if not n["ok"] and not n.get("unreachable")]
    assert [(n["channel"], n["action"]) for n in failed] == [("slack", "change_set")]
    server.state.clear_faults()
    daemon.tick("dw_notification_sensor")
    ok = sorted((n["channel"], n["action"]) for n in notifications(instance) if n["ok"])
    assert ok == [("pager", "annotate"), ("pager", "trigger"), ("slack", "approval_request")]
    (alert,) = server.state.opsgenie_alerts(dedup_key_for("inc-1"))
    assert len(alert["notes"]) == 1  # the page was not annotated twice
    assert len(server.state.slack_messages()) == 1 and first.cursor is not None


# -- exactly once: a side effect applied while its answer was lost is not repeated -------------

SLOW = 0.8  # the fakes' after-apply delay, seconds (longer than the client timeouts below)
QUICK = dict(timeout_s=0.25, retry_base_wait_s=0.01, retry_max_wait_s=0.05)


def _defs(resources: dict, **keys) -> dg.Definitions:
    return dg.Definitions(assets=[dg.AssetSpec(ASSET)], resources=resources, sensors=[build_notification_sensor(
        dagster_url="https://dagster.example", location_name="orders", **keys)])


def _ticking(defs, instance) -> LocalSensorDaemon:
    daemon = LocalSensorDaemon(defs, instance, log_level="CRITICAL")
    daemon.tick("dw_notification_sensor")  # the first tick starts after what the instance holds
    return daemon


def _settle(state, path: str, method: str, n: int, wait_s: float = 3.0) -> list[dict]:
    """The fake's log of ``method path``, once ``n`` entries are in (a delayed answer is logged late)."""
    deadline = time.monotonic() + wait_s
    while True:
        log = [r for r in state.request_log(path) if r["method"] == method]
        if len(log) >= n or time.monotonic() > deadline:
            return log
        time.sleep(0.02)


def _ref(record_id: str, channel: str, action: str, step: str) -> str:
    return step_ref(task_id_for(record_id, channel, action), step)


@pytest.fixture
def paging():
    server, url = start_paging_server()
    yield server, url
    server.stop()


def test_slack_message_applied_but_timed_out_is_not_posted_on_the_next_tick(paging):
    server, url = paging
    slack = SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{url}/api", default_channel="C0DWAPPROV",
                          retry_attempts=1, **QUICK)
    with dg.instance_for_test() as instance:
        daemon = _ticking(_defs({"slack": slack}, slack_resource_key="slack"), instance)
        _records(instance)
        server.state.add_fault(delay_s=SLOW, after_apply=True, method="POST", path="/api/chat.postMessage")
        server.state.add_fault(status=500, count=1, path="/api/conversations.history")  # the in-call look-up fails too
        daemon.tick("dw_notification_sensor")
        [failed] = [n for n in notifications(instance) if n["channel"] == "slack"]
        assert (failed["channel"], failed["action"], failed["ok"]) == ("slack", "change_set", False)
        assert "could not check whether it was applied" in failed["detail"]
        [msg] = server.state.slack_messages("C0DWAPPROV")  # Slack did post it
        ref = _ref("change_set:cs-1:v1", "slack", "approval_request", "message")
        assert msg["metadata"] == {"event_type": "dw_dagster_notification", "event_payload": {"ref": ref}}

        second = daemon.tick("dw_notification_sensor")  # retried: reads the history first, finds it
        assert "told: slack approval_request" in second.skip_reason
        assert len(server.state.slack_messages()) == 1
        assert len(_settle(server.state, "/api/chat.postMessage", "POST", 1)) == 1
        done = [n for n in notifications(instance) if n["ok"]]
        assert [(n["action"], n["ts"], n["steps"]["message"]["deduplicated"]) for n in done] == [
            ("approval_request", msg["ts"], True)]
        daemon.tick("dw_notification_sensor")
        assert len(server.state.slack_messages()) == 1 and len(notifications(instance)) == 3  # + the unreachable DM


def test_opsgenie_note_applied_but_timed_out_is_posted_once(paging):
    server, url = paging
    pager = OpsgenieResource(api_key=DEFAULT_OPSGENIE_KEY, base_url=url, retry_attempts=2, **QUICK)
    with dg.instance_for_test() as instance:
        daemon = _ticking(_defs({"pager": pager}, pager_resource_key="pager"), instance)
        alias = dedup_key_for("inc-1")
        server.state.add_fault(delay_s=SLOW, after_apply=True, method="POST", path=f"/v2/alerts/{quote(alias, safe='')}/notes")
        _records(instance)
        daemon.tick("dw_notification_sensor")
        ref = _ref("diagnosis:dg-1", "pager", "annotate", "note")
        [note] = server.state.opsgenie_notes(alias)
        assert note["note"].endswith(f"\n[dw-dagster ref {ref}]") and "dw_dagster diagnosis dg-1" in note["note"]
        assert sorted((n["action"], n["ok"]) for n in notifications(instance)) == [("annotate", True), ("trigger", True)]
        daemon.tick("dw_notification_sensor")
        assert len(server.state.opsgenie_notes(alias)) == 1
        assert len(_settle(server.state, f"/v2/alerts/{quote(alias, safe='')}/notes", "POST", 1)) == 1


def _pagerduty(url: str, **overrides) -> PagerDutyResource:
    fields = dict(routing_key=DEFAULT_ROUTING_KEY, api_token=DEFAULT_PAGERDUTY_TOKEN, from_email=DEFAULT_PAGERDUTY_USERS[0],
                  events_base_url=url, rest_base_url=url, incident_lookup_s=1.0, retry_attempts=2, **QUICK)
    return PagerDutyResource(**{**fields, **overrides})


def _receipt(incident_id: str = "inc-1") -> Receipt:
    now = utcnow()
    return Receipt(id="rc-1", asset_key=["orders"], change_set_id="cs-1", change_set_version="v1", incident_id=incident_id,
                   cause_kind="x", cause_summary="late rows", evidence_summary={}, diff="", approver="fin@x.example",
                   approved_at=now, signature_valid=True, partitions=["2026-11-26"], run_ids={}, rows_before={},
                   rows_after={}, checks=[], verified=True, undo="", created_at=now, previous_hash=None)


def test_pagerduty_note_applied_but_timed_out_is_posted_once(paging):
    server, url = paging
    with dg.instance_for_test() as instance:
        daemon = _ticking(_defs({"pager": _pagerduty(url)}, pager_resource_key="pager"), instance)
        server.state.add_fault(delay_s=SLOW, after_apply=True, method="POST", path="/incidents/")
        _records(instance)
        daemon.tick("dw_notification_sensor")
        [incident] = server.state.pagerduty_incidents(dedup_key_for("inc-1"))
        ref = _ref("diagnosis:dg-1", "pager", "annotate", "note")
        assert [n["content"].rsplit("\n", 1)[-1] for n in incident["notes"]] == [f"[dw-dagster ref {ref}]"]
        assert len(_settle(server.state, f"/incidents/{incident['id']}/notes", "POST", 1)) == 1
        daemon.tick("dw_notification_sensor")
        assert len(server.state.pagerduty_incidents(dedup_key_for("inc-1"))[0]["notes"]) == 1


def test_pagerduty_resolve_event_fails_after_the_note_and_only_it_is_retried(paging):
    server, url = paging
    with dg.instance_for_test() as instance:
        daemon = _ticking(_defs({"pager": _pagerduty(url)}, pager_resource_key="pager"), instance)
        _records(instance)
        daemon.tick("dw_notification_sensor")
        _record(instance, c.RECEIPT_KEY, _receipt())
        server.state.add_fault(status=500, count=-1, path="/v2/enqueue")
        daemon.tick("dw_notification_sensor")
        [incident] = server.state.pagerduty_incidents(dedup_key_for("inc-1"))
        assert incident["status"] == "triggered" and len(incident["notes"]) == 2  # cause, then the receipt note
        [failed] = [n for n in notifications(instance) if not n["ok"]]
        assert (failed["channel"], failed["action"], list(failed["steps"])) == ("pager", "receipt", ["note"])
        [step] = notifications(instance, key=NOTIFICATION_STEP_KEY)[-1:]
        assert (step["step"], step["ref"]) == ("note", _ref("receipt:rc-1", "pager", "resolve", "note"))

        server.state.clear_faults()
        daemon.tick("dw_notification_sensor")
        [incident] = server.state.pagerduty_incidents(dedup_key_for("inc-1"))
        assert incident["status"] == "resolved" and len(incident["notes"]) == 2  # the note was not posted again
        notes_posted = [r for r in server.state.request_log(f"/incidents/{incident['id']}/notes") if r["method"] == "POST"]
        assert len(notes_posted) == 2
        assert [n["action"] for n in notifications(instance) if n["ok"]][-1] == "resolve"


def test_a_tick_whose_result_was_lost_repeats_nothing(env):
    server, defs, instance = env
    daemon = _ticking(defs, instance)
    before = daemon.cursors["dw_notification_sensor"]
    _records(instance)
    daemon.tick("dw_notification_sensor")
    assert len(notifications(instance)) == 4
    requests = len(server.state.request_log())
    daemon.cursors["dw_notification_sensor"] = before  # the daemon never stored that tick's cursor (timed out)
    again = daemon.tick("dw_notification_sensor")
    assert again.skip_reason == "nothing to tell" and len(notifications(instance)) == 4
    assert len(server.state.request_log()) == requests  # the records say it was all done: not even a look-up
    (alert,) = server.state.opsgenie_alerts(dedup_key_for("inc-1"))
    assert len(alert["notes"]) == 1 and len(server.state.slack_messages()) == 1


def test_lightup_comment_timed_out_then_close_fails_each_side_effect_once(tmp_path):
    from dw_dagster.integrations.lightup import LightupResource
    from dw_dagster_tests.harness.lightup_fixtures import epoch, fake_lightup

    with fake_lightup(tmp_path) as (lu_server, lu, ids, cred), dg.instance_for_test() as instance:
        # West is whole in both tables: after the repair Lightup's re-collection shows a zero gap
        raw = lu.add_incident(filter_uuid=ids["rows_monitor"], slice={"region": "West"},
                              start_ts=epoch("2026-11-20"), end_ts=epoch("2026-11-25"))
        uuid = raw["uuid"]
        inc = Incident(id="inc-lu", asset_key=["orders"], source="lightup", external_id=uuid, check_name="lightup_compare",
                       detected_at=utcnow(), summary="rows short", gap_rows=200)
        diag = Diagnosis(id="dg-lu", incident_id="inc-lu", asset_key=["orders"], created_at=utcnow(), causes=[],
                         blast_radius=BlastRadius(root="orders"), gap_rows=200, unexplained_rows=200)

        def defs(**kw):
            fields = dict(server=lu_server.url, refresh_token=lu.refresh_token, attempts=2, base_wait_s=0.01)
            return _defs({"lightup": LightupResource(**{**fields, **kw})}, lightup_resource_key="lightup")

        def comments() -> list[str]:
            return [x["comment"] for x in lu.comments.get(uuid, [])]

        daemon = _ticking(defs(timeout_s=0.25), instance)
        _record(instance, c.INCIDENT_KEY, inc)
        _record(instance, c.DIAGNOSIS_KEY, diag)
        fault(lu_server, after_apply=True, delay_s=SLOW, method="POST", path="/comments$")
        daemon.tick("dw_notification_sensor")  # the comment lands, its answer times out: found, not re-sent
        ref = _ref("diagnosis:dg-lu", "lightup", "comment", "comment")
        assert len(comments()) == 1 and comments()[0].endswith(f"\n[dw-dagster ref {ref}]")
        assert [(n["action"], n["ok"]) for n in notifications(instance)] == [("comment", True)]

        daemon.defs = defs(timeout_s=10.0)
        _record(instance, c.RECEIPT_KEY, _receipt("inc-lu"))
        fault(lu_server, status=500, count=10, method="PATCH", path=r"/incidents/[^/]+$")  # the close fails
        daemon.tick("dw_notification_sensor")
        triggers = len(lu.triggers)
        assert triggers == 2 and len(comments()) == 2 and lu.incidents[uuid]["status"] == 1
        [failed] = [n for n in notifications(instance) if not n["ok"]]
        assert (failed["action"], sorted(failed["steps"])) == ("receipt", ["comment", "recheck"])
        assert failed["steps"]["recheck"]["zero"] is True

        fault(lu_server, reset=True)
        daemon.tick("dw_notification_sensor")  # recheck and comment are recorded done: only the close runs
        assert len(lu.triggers) == triggers and len(comments()) == 2 and lu.incidents[uuid]["status"] == 5
        verify = [n for n in notifications(instance) if n["action"] == "verify"]
        assert [(n["ok"], n["gap_zero"], n["closed"]) for n in verify] == [(True, True, True)]
        comment_posts = [r for r in lu.requests if r == f"POST /api/v0/ws/{lu.workspace_uuid}/incidents/{uuid}/comments"]
        assert len(comment_posts) == 2
        daemon.tick("dw_notification_sensor")
        assert len(comments()) == 2 and len(lu.triggers) == triggers


def fault(server, **body):
    httpx.post(f"{server.url}/_fake/faults", json=body).raise_for_status()
