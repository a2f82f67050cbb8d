"""Slack chat.postMessage client and the approval-request message, against the fake on loopback."""

import datetime as dt

import dagster as dg
import httpx
import pytest
import yaml

from dw_dagster_dev.fakes.paging_server import DEFAULT_SLACK_TOKEN, start_paging_server
from dw_dagster.core.http import HttpApiError
from dw_dagster.core.models import BlastRadius, ChangeSet, ExposureRef, FileChange, ImpactedNode, Receipt
from dw_dagster.integrations.slack import (
    APPROVAL_JOB_NAME,
    SlackMessage,
    SlackResource,
    approval_request_message,
    approve_command,
    launchpad_config,
    launchpad_url,
    login_command,
    page_annotated_message,
    resolved_message,
)

NOW = dt.datetime(2026, 11, 28, 9, 30, tzinfo=dt.timezone.utc)
FAST = dict(timeout_s=2.0, retry_attempts=3, retry_base_wait_s=0.01, retry_max_wait_s=0.05)
CHANNEL = "C0DWAPPROV"


@pytest.fixture(scope="module")
def fake():
    server, url = start_paging_server()
    yield server, url
    server.stop()


@pytest.fixture
def state(fake):
    fake[0].state.reset()
    return fake[0].state


@pytest.fixture
def slack(fake, state):
    return SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{fake[1]}/api", default_channel=CHANNEL, **FAST)


def change_set() -> ChangeSet:
    return ChangeSet(
        id="cs-77d7aa500c", version="b5131ef69535d39", incident_id="inc-4f296e71f448", diagnosis_id="dg-1",
        domain="store_sales", proposer="dw-dagster", created_at=NOW, expires_at=NOW + dt.timedelta(hours=36),
        approvers=["dana.ortiz@grocer.example", "lee.park@grocer.example"], cause_kind="late_rows_behind_watermark",
        summary="Read store_sales_line by posted_ts with a 72 h lookback (was sale_ts with a strict '>')",
        target_asset=["store_sales_line"], window=["2026-11-26", "2026-11-27"],
        diff="--- a/x\n+++ b/x\n", files=[FileChange(path="pipelines/store_sales_line.yaml", before_sha256="a", after_sha256="b")],
        rebuild_assets=[["fct_store_sales_daily"], ["region_sales_daily"], ["region_sales_mtd"]],
        new_tests=["store_sales_line_daily_counts"], expected_recovered_rows=2124, undo="git revert 91d2baaa3a",
    )


def blast_radius() -> BlastRadius:
    return BlastRadius(
        root="model.store.store_sales_line",
        models=[ImpactedNode(unique_id=f"model.store.{n}", name=n, resource_type="model", depth=1)
                for n in ["fct_store_sales_daily", "region_sales_daily", "region_sales_mtd"]],
        tests=[ImpactedNode(unique_id="test.store.t", name="t", resource_type="test", depth=2)],
        exposures=[ExposureRef(unique_id="exposure.store.store_pnl", name="store_pnl", label="Store P&L", type="dashboard",
                               owner_name="Priya Raman", owner_email="priya.raman@grocer.example", depth=4)],
        owners=["priya.raman@grocer.example"],
    )


def all_text(message: SlackMessage) -> str:
    parts = []
    for b in message.blocks:
        if "text" in b:
            parts.append(b["text"]["text"])
        parts += [e["text"] for e in b.get("elements", []) if isinstance(e.get("text"), str)]
    return "\n".join(parts)


def test_approval_request_content():
    msg = approval_request_message(change_set(), blast_radius(), dagster_url="http://dagster.local:3000/",
                                   location="store_sales")
    url = "http://dagster.local:3000/locations/store_sales/jobs/dw_approve_change_set/playground"
    blocks = msg.blocks
    assert blocks[0] == {"type": "header", "text": {"type": "plain_text", "emoji": False,
                                                    "text": "Approval needed: change set cs-77d7aa500c"}}
    assert [b["type"] for b in blocks] == ["header", "section", "section", "section", "actions", "section", "context"]
    assert all(b["text"]["type"] == "mrkdwn" for b in blocks if b["type"] == "section")
    # the Approve / Reject buttons carry the change set id and the version the owner reads
    approve, reject = blocks[4]["elements"]
    assert (approve["action_id"], approve["style"], approve["text"]["text"]) == ("dw_approve", "primary", "Approve")
    assert (reject["action_id"], reject["style"], reject["text"]["text"]) == ("dw_reject", "danger", "Reject")
    assert approve["value"] == reject["value"] == '{"cs":"cs-77d7aa500c","v":"b5131ef69535d39"}'
    assert approve["confirm"]["title"]["text"] == "Approve change set cs-77d7aa500c?"
    assert blocks[4]["block_id"] == "dw_decide:cs-77d7aa500c"
    body = all_text(msg)
    assert "Read store_sales_line by posted_ts with a 72 h lookback (was sale_ts with a strict '&gt;')" in body
    assert "fct_store_sales_daily, region_sales_daily, region_sales_mtd" in body
    assert "Store P&amp;L (dashboard, owner Priya Raman &lt;priya.raman@grocer.example&gt;)" in body
    assert "Owners: priya.raman@grocer.example" in body
    assert "*Expires:* 2026-11-29 21:30 UTC" in body
    assert f"<{url}|Open the Launchpad of dw_approve_change_set>" in body
    assert "dw-dagster approve cs-77d7aa500c --approver dana.ortiz@grocer.example" in body
    assert "dw-dagster approve cs-77d7aa500c --approver lee.park@grocer.example" in body
    assert "```dw-dagster approve cs-77d7aa500c --login```" in body
    assert "2026-11-26, 2026-11-27" in body and "2,124" in body
    # plain-text fallback (notifications) carries the essentials
    assert url in msg.text and "dw-dagster approve cs-77d7aa500c --approver dana.ortiz@grocer.example" in msg.text
    assert "dw-dagster approve cs-77d7aa500c --login" in msg.text and "buttons" in msg.text
    assert "2026-11-29 21:30 UTC" in msg.text and "Store" not in msg.text[:20]
    # Block Kit limits
    assert all(len(b["text"]["text"]) <= 3000 for b in blocks if b["type"] == "section")


def test_approve_command_matches_the_real_cli():
    from dw_dagster.cli import main

    cmd = approve_command("cs-77d7aa500c", "dana.ortiz@grocer.example", dagster_home="/srv/dagster home")
    args = __import__("shlex").split(cmd)
    assert args[:2] == ["dw-dagster", "approve"]
    ctx = main.commands["approve"].make_context("approve", args[2:])
    assert ctx.params["change_set_id"] == "cs-77d7aa500c"
    assert ctx.params["approver"] == "dana.ortiz@grocer.example" and ctx.params["dagster_home"] == "/srv/dagster home"
    args = __import__("shlex").split(login_command("cs-77d7aa500c", dagster_home="/srv/dagster home"))
    ctx = main.commands["approve"].make_context("approve", args[2:])  # the message's --login alternative is real
    assert ctx.params["login"] is True and ctx.params["change_set_id"] == "cs-77d7aa500c"


def test_launchpad_link_and_config_match_the_approval_job():
    from dw_dagster.approval.job import APPROVAL_JOB_NAME as REAL_NAME
    from dw_dagster.approval.job import approval_job

    assert APPROVAL_JOB_NAME == REAL_NAME
    assert launchpad_url("http://d", "my loc") == "http://d/locations/my%20loc/jobs/dw_approve_change_set/playground"
    assert launchpad_url("http://d", "loc", repository="repo") == "http://d/locations/repo@loc/jobs/dw_approve_change_set/playground"
    config = yaml.safe_load(launchpad_config("cs-1", "dana.ortiz@grocer.example"))
    assert dg.validate_run_config(approval_job, config)


def test_post_approval_request_to_the_fake(slack, state):
    msg = approval_request_message(change_set(), blast_radius(), dagster_url="http://d", location="store_sales")
    answer = slack.post_message(msg)
    assert answer["ok"] is True and answer["channel"] == CHANNEL and answer["ts"]
    assert "warning" not in answer  # the client sends charset=utf-8
    [stored] = state.slack_messages(CHANNEL)
    assert stored["blocks"] == msg.blocks and stored["text"] == msg.text and stored["ts"] == answer["ts"]
    # by channel name too, and the other messages
    slack.post_message(page_annotated_message("inc-1", "PagerDuty", "Cause: late rows"), channel="#data-ops")
    slack.post_message(resolved_message("inc-1", [receipt()], "http://d/receipt"), channel="data-ops")
    texts = [m["text"] for m in state.slack_messages("C0DATAOPS1")]
    assert texts[0].startswith("Page for incident inc-1 annotated on PagerDuty")
    assert texts[1] == "Incident inc-1 resolved with 1 receipt(s): http://d/receipt"


def receipt() -> Receipt:
    return Receipt(id="rc-1", asset_key=["store_sales_line"], change_set_id="cs-1", change_set_version="v",
                   incident_id="inc-1", cause_kind="k", cause_summary="s", evidence_summary={}, diff="",
                   approver="dana.ortiz@grocer.example", approved_at=NOW, signature_valid=True,
                   partitions=["2026-11-26"], run_ids={}, rows_before={}, rows_after={}, checks=[], verified=True,
                   undo="", created_at=NOW, previous_hash=None)


@pytest.mark.parametrize("channel, token, code", [
    ("#no-such-channel", DEFAULT_SLACK_TOKEN, "channel_not_found"),
    (CHANNEL, "xoxb-wrong-secret-0000", "invalid_auth"),
])
def test_ok_false_is_a_clear_error_without_the_token(fake, state, channel, token, code):
    client = SlackResource(bot_token=token, base_url=f"{fake[1]}/api", **FAST)
    with pytest.raises(HttpApiError) as e:
        client.post_message("hi", channel=channel)
    assert e.value.service == "slack" and e.value.endpoint == "/api/chat.postMessage" and e.value.status == 200
    assert f"Slack error '{code}'" in str(e.value) and token not in str(e.value)
    assert len(state.request_log("/api/")) == 1  # not retried


@pytest.mark.parametrize("body, headers, code", [
    ({"channel": CHANNEL, "text": "x"}, {}, "not_authed"),
    ({"text": "x"}, None, "channel_not_found"),
    ({"channel": CHANNEL}, None, "no_text"),
    ({"channel": CHANNEL, "text": 5}, None, "invalid_arguments"),
    ({"channel": CHANNEL, "text": "x" * 40001}, None, "msg_too_long"),
    ({"channel": CHANNEL, "blocks": [{"type": "header", "text": {"type": "mrkdwn", "text": "h"}}]}, None, "invalid_blocks"),
    ({"channel": CHANNEL, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}]}, None, "invalid_blocks"),
    ({"channel": CHANNEL, "blocks": [{"type": "carousel"}]}, None, "invalid_blocks"),
    ({"channel": CHANNEL, "blocks": [{"type": "divider"}] * 51}, None, "invalid_blocks"),
])
def test_fake_slack_rejects_what_slack_rejects(fake, body, headers, code):
    h = {"Authorization": f"Bearer {DEFAULT_SLACK_TOKEN}"} if headers is None else headers
    r = httpx.post(f"{fake[1]}/api/chat.postMessage", json=body, headers=h)
    assert r.status_code == 200 and r.json()["ok"] is False and r.json()["error"] == code


def test_fake_slack_warns_missing_charset(fake, state):
    r = httpx.post(f"{fake[1]}/api/chat.postMessage", content=b'{"channel": "C0DWAPPROV", "text": "x"}',
                   headers={"Authorization": f"Bearer {DEFAULT_SLACK_TOKEN}", "Content-Type": "application/json"})
    assert r.json()["ok"] is True and r.json()["warning"] == "missing_charset"


def test_rate_limit_honours_retry_after_then_succeeds(slack, state):
    state.add_fault(status=429, count=2, path="/api/", retry_after=0.01)
    assert slack.post_message("hi")["ok"] is True
    assert [r["status"] for r in state.request_log("/api/")] == [429, 429, 200]


def test_rate_limited_for_good(slack, state):
    state.add_fault(status=429, count=-1, path="/api/", retry_after=0.01)
    with pytest.raises(HttpApiError) as e:
        slack.post_message("hi")
    assert e.value.status == 429 and "ratelimited" in str(e.value) and DEFAULT_SLACK_TOKEN not in str(e.value)


# -- exactly once: the ref travels as message metadata and is read back from the history -------

REF = "dw:0123456789abcdef:message"
SLOW = 0.8  # the fake's after-apply delay, seconds (longer than the client timeouts below)
AUTH = {"Authorization": f"Bearer {DEFAULT_SLACK_TOKEN}"}


def history(fake, **params):
    return httpx.get(f"{fake[1]}/api/conversations.history", params={"channel": CHANNEL, **params}, headers=AUTH).json()


def _posts(state) -> list[dict]:
    return [r for r in state.request_log("/api/chat.postMessage") if r["method"] == "POST"]


def test_message_metadata_is_kept_and_read_back(slack, fake, state):
    from dw_dagster.integrations.slack import message_ref, ref_metadata

    answer = slack.post_message("approve cs-1", ref=REF)
    assert answer["message"]["metadata"] == ref_metadata(REF) == {
        "event_type": "dw_dagster_notification", "event_payload": {"ref": REF}}
    [stored] = state.slack_messages(CHANNEL)
    assert message_ref(stored) == REF
    body = history(fake, include_all_metadata="true")
    assert body["ok"] is True and message_ref(body["messages"][0]) == REF
    assert "metadata" not in history(fake)["messages"][0]  # only with include_all_metadata
    assert slack.find_message(CHANNEL, REF)["ts"] == answer["ts"]
    assert slack.find_message(CHANNEL, "dw:0123456789abcdef:other") is None


@pytest.mark.parametrize("metadata", [
    {"event_type": "has space", "event_payload": {}},
    {"event_type": "ok_type", "event_payload": "not an object"},
    {"event_payload": {"ref": "x"}},
    "{not json",
])
def test_fake_slack_rejects_malformed_metadata(fake, state, metadata):
    r = httpx.post(f"{fake[1]}/api/chat.postMessage", json={"channel": CHANNEL, "text": "x", "metadata": metadata},
                   headers={**AUTH, "Content-Type": "application/json; charset=utf-8"})
    assert r.json()["ok"] is False and r.json()["error"] == "invalid_metadata_format"
    assert state.slack_messages() == []


def test_fake_history_pages_newest_first_within_bounds(slack, fake, state):
    answers = [slack.post_message(f"m{i}") for i in range(5)]
    ts = [a["ts"] for a in answers]
    page = history(fake, limit=2)
    assert [m["text"] for m in page["messages"]] == ["m4", "m3"] and page["has_more"] is True
    rest = history(fake, limit=10, cursor=page["response_metadata"]["next_cursor"])
    assert [m["text"] for m in rest["messages"]] == ["m2", "m1", "m0"] and rest["has_more"] is False
    assert "response_metadata" not in rest
    assert [m["text"] for m in history(fake, oldest=ts[1], latest=ts[4])["messages"]] == ["m3", "m2"]
    assert [m["text"] for m in history(fake, oldest=ts[1], latest=ts[3], inclusive="true")["messages"]] == ["m3", "m2", "m1"]
    assert history(fake, cursor="bm9wZQ==")["error"] == "invalid_cursor"
    assert history(fake, channel="#dw-approvals")["error"] == "channel_not_found"  # IDs only
    r = httpx.get(f"{fake[1]}/api/conversations.history", params={"channel": CHANNEL})
    assert r.json() == {"ok": False, "error": "not_authed"}


def test_find_message_follows_the_cursor(slack, state):
    from dw_dagster.integrations.slack import ref_metadata

    now = __import__("time").time()
    with state.lock:  # 450 messages, the wanted one the oldest: three pages of 200
        state.slack[CHANNEL] = [{"type": "message", "text": f"m{i}", "ts": f"{now - 450 + i:.6f}", "channel": CHANNEL,
                                 **({"metadata": ref_metadata(REF)} if i == 0 else {})} for i in range(450)]
    assert slack.find_message(CHANNEL, REF, oldest=now - 1000)["text"] == "m0"
    assert len(state.request_log("/api/conversations.history")) == 3
    assert slack.find_message(CHANNEL, REF, oldest=now - 100) is None  # bounded by oldest: one page
    assert len(state.request_log("/api/conversations.history")) == 4


def test_message_applied_but_timed_out_is_posted_once(fake, state):
    state.add_fault(delay_s=SLOW, after_apply=True, method="POST", path="/api/chat.postMessage")
    quick = SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{fake[1]}/api", default_channel=CHANNEL,
                          timeout_s=0.2, retry_attempts=3, retry_base_wait_s=0.01, retry_max_wait_s=0.05)
    answer = quick.post_message("approve cs-1", ref=REF)
    assert answer["deduplicated"] is True
    [stored] = state.slack_messages(CHANNEL)
    assert answer["ts"] == stored["ts"] and stored["metadata"]["event_payload"]["ref"] == REF
    # the next attempt (a retry on a later tick) reads the history first and posts nothing
    again = quick.post_message("approve cs-1", ref=REF, check_first=True)
    assert again["ts"] == stored["ts"] and len(state.slack_messages()) == 1
    __import__("time").sleep(SLOW)
    assert len(_posts(state)) == 1


def test_message_500_after_apply_is_found_in_the_same_call(slack, state):
    state.add_fault(status=500, after_apply=True, method="POST", path="/api/chat.postMessage")
    assert slack.post_message("hi", ref=REF)["deduplicated"] is True
    assert len(state.slack_messages()) == 1 and [r["status"] for r in _posts(state)] == [500]


def test_a_message_without_ref_is_not_reposted_after_a_500(slack, state):
    state.add_fault(status=500, after_apply=True, method="POST", path="/api/chat.postMessage")
    with pytest.raises(HttpApiError) as e:
        slack.post_message("hi")
    assert e.value.maybe_applied and e.value.status == 500
    assert len(state.slack_messages()) == 1 and len(_posts(state)) == 1


def test_missing_history_scope_is_a_clear_error_and_nothing_is_reposted(fake):
    from dw_dagster_dev.fakes.paging_server import Credentials

    server, url = start_paging_server(credentials=Credentials(slack_scopes={"chat:write"}))
    try:
        client = SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{url}/api", default_channel=CHANNEL, **FAST)
        server.state.add_fault(status=500, after_apply=True, method="POST", path="/api/chat.postMessage")
        with pytest.raises(HttpApiError) as e:
            client.post_message("hi", ref=REF)
        assert e.value.maybe_applied and "missing_scope" in str(e.value) and "channels:history" in str(e.value)
        assert DEFAULT_SLACK_TOKEN not in str(e.value)
        assert len(server.state.slack_messages()) == 1 and len(_posts(server.state)) == 1
        with pytest.raises(ValueError, match="channel ID"):
            client.post_message("hi", channel="#dw-approvals", ref=REF, check_first=True)
    finally:
        server.stop()
