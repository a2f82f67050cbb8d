"""Approve / Reject buttons in Slack: a signed click by the listed owner decides, nothing else does.

Everything runs over real HTTP on loopback: the approval request is posted with
:class:`~dw_dagster.integrations.slack.SlackResource` to the fake Slack (:mod:`dw_dagster_dev.fakes.paging_server`),
whose ``/_fake/slack/click`` builds the ``block_actions`` payload for that message's button, signs
it as Slack does (Slack API docs, "Verifying requests from Slack") and POSTs it to the approvals
server (:mod:`dw_dagster.approval.server`, uvicorn in a thread), which looks the user up with
``users.info`` on the same fake and decides on a real Dagster instance.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import urlencode

import dagster as dg
import httpx
import pytest

from dw_dagster_tests.harness.asgi_server import serve

from dw_dagster.core import keys as c
from dw_dagster.approval.server import build_app
from dw_dagster_dev.fakes.paging_server import DEFAULT_SLACK_TOKEN, start_paging_server
from dw_dagster.core.ledger import PROPOSED, ledger_for
from dw_dagster.core.models import ChangeSet, FileChange, utcnow
from dw_dagster.core import records
from dw_dagster.core.signing import signature_valid
from dw_dagster.approval.job import valid_approval
from dw_dagster.proposals.change_sets import propose
from dw_dagster.integrations.slack import SlackResource, approval_request_message

OWNER = "dana.ortiz@grocer.example"
CHANNEL = "C0DWAPPROV"
TEAM = "T0FAKETEAM"
SECRET = "3f1c9a0b7d2e4f6a8b0c1d2e3f4a5b6c"
SECRET_ENV, TOKEN_ENV = "DW_TEST_SLACK_SIGNING_SECRET", "DW_TEST_SLACK_BOT_TOKEN"
USERS = {
    "U0DANAORTZ": {"email": "Dana.Ortiz@grocer.example", "name": "dana.ortiz", "real_name": "Dana Ortiz"},
    "U0LEEPARK1": {"email": "lee.park@grocer.example", "name": "lee.park"},
    "U0GONEUSR1": {"email": OWNER, "name": "dana.old", "deleted": True},
    "U0BOTUSER1": {"email": OWNER, "name": "approve-bot", "is_bot": True},
    "U0NOEMAIL1": {"name": "no.email"},
}
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def env():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET_ENV, SECRET)
        mp.setenv(TOKEN_ENV, DEFAULT_SLACK_TOKEN)
        yield


@pytest.fixture(scope="module")
def fake():
    server, url = start_paging_server()
    server.state.configure_slack(signing_secret=SECRET, users=USERS, team_id=TEAM)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def domains(tmp_path_factory, fake):
    path = tmp_path_factory.mktemp("slack") / "domains.yaml"
    path.write_text(textwrap.dedent(f"""\
        domains:
          - name: store_sales
            assets: [[store_sales_line]]
            approvers: [{OWNER}]
            identity: verified
        identity:
          slack:
            signing_secret_env: {SECRET_ENV}
            bot_token_env: {TOKEN_ENV}
            team_id: {TEAM}
            api_url: {fake.base_url}/api
        """))
    return path


@pytest.fixture(scope="module")
def instance(env):
    with dg.instance_for_test() as inst:
        yield inst


@pytest.fixture(scope="module")
def server(instance, domains, fake):
    with serve(lambda base: build_app(instance, str(domains), base_url=base)) as base:
        r = httpx.post(f"{fake.base_url}/_fake/slack/app", json={"request_url": f"{base}/slack/interactions"})
        assert r.json()["request_url"] == f"{base}/slack/interactions" and "signing_secret" not in r.json()
        yield base


@pytest.fixture
def slack(fake):
    return SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{fake.base_url}/api", default_channel=CHANNEL,
                         timeout_s=5.0, retry_attempts=1)


def change_set(cs_id: str, summary: str = "Rerun 2026-11-26..2026-11-27 of store_sales_line") -> ChangeSet:
    now = utcnow()
    return ChangeSet.seal(
        id=cs_id, incident_id="inc-slack1", diagnosis_id="dg-slack1", domain="store_sales", proposer=c.PROPOSER,
        created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=[OWNER], cause_kind="late_rows_behind_watermark",
        summary=summary, target_asset=["store_sales_line"], window=["2026-11-26", "2026-11-27"], diff="",
        files=[FileChange(path="pipelines/store_sales_line.yaml", before_sha256="a", after_sha256="b")],
        rebuild_assets=[["fct_store_sales_daily"]])


def ask(instance, slack, cs: ChangeSet) -> tuple[ChangeSet, str]:
    """Propose ``cs`` and post its approval request (with the buttons) to the fake Slack; return (cs, ts)."""
    recorded, _ = propose(instance, cs)
    answer = slack.post_message(approval_request_message(recorded, None, dagster_url="http://dagster.local",
                                                         location="store_sales"))
    return recorded, answer["ts"]


def click(fake, ts: str, action_id: str = "dw_approve", user: str = "U0DANAORTZ", **extra) -> dict:
    r = httpx.post(f"{fake.base_url}/_fake/slack/click", timeout=30,
                   json={"channel": CHANNEL, "ts": ts, "action_id": action_id, "user": user, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def new_id() -> str:
    return f"cs-slack{next(_ids):05d}"


def wait_for_reply(fake, text: str) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [r for r in fake.state.slack_responses() if r["body"].get("text") == text]
        if found:
            return found[-1]
        time.sleep(0.05)
    raise AssertionError(f"no reply {text!r} was posted to the response_url: {fake.state.slack_responses()}")


def test_owner_click_approves_the_version_shown(instance, fake, slack, server, domains):
    cs, ts = ask(instance, slack, change_set(new_id()))
    answer = click(fake, ts)
    payload = answer["payload"]
    assert payload["type"] == "block_actions" and payload["user"]["id"] == "U0DANAORTZ"
    assert payload["actions"][0]["value"] == json.dumps({"cs": cs.id, "v": cs.version}, separators=(",", ":"))
    assert answer["status"] == 200
    text = answer["body"]["text"]
    assert answer["body"]["response_type"] == "ephemeral" and answer["body"]["replace_original"] is False
    assert text == (f"Recorded: change set {cs.id} approved by {OWNER} (verified by a signed Slack interaction, "
                    f"slack:{TEAM}).")
    (row,) = ledger_for(instance).decisions(cs.id)
    assert (row["decision"], row["approver"], row["method"], row["version"]) == ("approve", OWNER, "slack", cs.version)
    (approval,) = records.approvals(instance, cs.id)
    assert approval.identity.subject == "U0DANAORTZ" and approval.identity.issuer == f"slack:{TEAM}"
    assert approval.identity.credential_id.startswith("slack:") and signature_valid(approval)
    assert approval.comment == f"approve button in Slack channel {CHANNEL}, message {ts}"
    assert valid_approval(instance, cs, str(domains)) == approval  # it lets the change set run
    observed = [rec.asset_observation.metadata[c.APPROVAL_KEY].value
                for rec in records.iter_observations(instance, dg.AssetKey(["store_sales_line"]))
                if c.APPROVAL_KEY in rec.asset_observation.metadata]
    assert any(o["id"] == approval.id and o["identity"]["method"] == "slack" for o in observed)
    # the same reply goes to the click's response_url, where Slack takes replies to block_actions from
    reply = wait_for_reply(fake, text)
    assert reply["path"].startswith(f"/actions/{TEAM}/") and reply["body"]["response_type"] == "ephemeral"


def test_reject_click_ends_the_version(instance, fake, slack, server):
    cs, ts = ask(instance, slack, change_set(new_id()))
    answer = click(fake, ts, action_id="dw_reject")
    assert answer["body"]["text"] == (f"Recorded: change set {cs.id} rejected by {OWNER} (verified by a signed Slack "
                                      f"interaction, slack:{TEAM}).")
    assert ledger_for(instance).change_set_row(cs.id).state == "rejected"
    again = click(fake, ts)
    assert again["status"] == 200 and "is rejected; a new proposal is needed" in again["body"]["text"]
    assert [d["decision"] for d in ledger_for(instance).decisions(cs.id)] == ["reject"]


REFUSED = [
    # (id, click arguments, HTTP status, the reason (a regular expression), shown as a refusal on the asset)
    ("forged_signature", {"forge": True}, 401,
     "bad signature: the request is not signed with the Slack app's signing secret", False),
    ("stale_timestamp", {"age_s": 301}, 401, r"stale request: its timestamp is 30[12] s old, at most 300 s allowed", False),
    ("future_timestamp", {"age_s": -400}, 401, r"stale request: its timestamp is (399|400) s in the future", False),
    ("another_team", {"team": "T0OTHERORG"}, 200, "the click came from Slack workspace T0OTHERORG, not T0FAKETEAM", True),
    ("not_listed", {"user": "U0LEEPARK1"}, 200,
     r"lee\.park@grocer\.example is not an approver of domain 'store_sales' \(listed now: dana\.ortiz@grocer\.example\)", True),
    ("deleted_user", {"user": "U0GONEUSR1"}, 200, "Slack user U0GONEUSR1 is deactivated", True),
    ("bot", {"user": "U0BOTUSER1"}, 200, "Slack user U0BOTUSER1 is a bot, not a person", True),
    ("no_email", {"user": "U0NOEMAIL1"}, 200, "Slack user U0NOEMAIL1 has no email visible to the app", True),
    ("unknown_user", {"user": "U0NOBODY00"}, 200, r"Slack users\.info refused user U0NOBODY00: user_not_found", True),
]


@pytest.mark.parametrize("how,status,reason,shown", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_clicks_record_nothing(instance, fake, slack, server, how, status, reason, shown):
    cs, ts = ask(instance, slack, change_set(new_id()))
    answer = click(fake, ts, **how)
    assert answer["status"] == status
    if status == 401:  # not from Slack: nobody in Slack sees it, nothing is shown on the asset
        assert set(answer["body"]) == {"ok", "error"} and answer["body"]["ok"] is False
        assert re.match(reason, answer["body"]["error"])
    else:
        assert answer["body"]["response_type"] == "ephemeral"
        assert re.match("Refused: " + reason, answer["body"]["text"])
    led = ledger_for(instance)
    assert led.decisions(cs.id) == [] and led.change_set_row(cs.id).state == PROPOSED
    refusals = records.refusals(instance, cs.id)
    assert [bool(re.match(reason, r["reason"])) for r in refusals] == ([True] if shown else [])
    if shown:
        assert refusals[0]["change_set_id"] == cs.id and refusals[0]["decision"] == "approve"
    # the version is still open: the owner's own click decides it
    assert click(fake, ts)["body"]["text"].startswith(f"Recorded: change set {cs.id} approved by {OWNER}")


def test_replayed_request_is_refused(instance, fake, slack, server):
    cs, ts = ask(instance, slack, change_set(new_id()))
    first = click(fake, ts, user="U0LEEPARK1")  # refused (not listed), and its signed request is spent
    assert first["status"] == 200 and "is not an approver" in first["body"]["text"]
    replay = httpx.post(f"{fake.base_url}/_fake/slack/replay", timeout=30).json()
    assert replay["status"] == 401
    assert replay["body"]["error"] == "replayed request: this signed Slack request was already received once"
    approved = click(fake, ts)
    assert approved["body"]["text"].startswith("Recorded:")
    replay = httpx.post(f"{fake.base_url}/_fake/slack/replay", timeout=30).json()  # the approval itself, again
    assert replay["status"] == 401 and replay["body"]["error"].startswith("replayed request")
    assert [(d["decision"], d["approver"]) for d in ledger_for(instance).decisions(cs.id)] == [("approve", OWNER)]


def test_click_on_a_version_edited_since_is_refused(instance, fake, slack, server):
    cs_id = new_id()
    old, old_ts = ask(instance, slack, change_set(cs_id))
    new, new_ts = ask(instance, slack, change_set(cs_id, summary="Rerun 2026-11-20..2026-11-27 of store_sales_line"))
    assert new.version != old.version
    answer = click(fake, old_ts)
    assert answer["status"] == 200
    assert answer["body"]["text"] == (
        f"Refused: change set {cs_id} changed since you read it (version {old.version[:12]}… is now "
        f"{new.version[:12]}…): review the new version")
    assert ledger_for(instance).decisions(cs_id) == []
    assert click(fake, new_ts)["body"]["text"].startswith(f"Recorded: change set {cs_id} approved by {OWNER}")
    (row,) = ledger_for(instance).decisions(cs_id)
    assert row["version"] == new.version


def test_bot_token_without_users_read_is_a_clear_refusal(instance, fake, slack, server):
    cs, ts = ask(instance, slack, change_set(new_id()))
    scopes = set(fake.state.credentials.slack_scopes)
    fake.state.configure_slack(scopes=scopes - {"users:read"})
    try:
        answer = click(fake, ts)
    finally:
        fake.state.configure_slack(scopes=scopes)
    assert answer["body"]["text"] == "Refused: Slack users.info refused user U0DANAORTZ: missing_scope (needs users:read)"
    assert ledger_for(instance).decisions(cs.id) == []


def test_healthz_and_an_unsigned_post(server):
    assert httpx.get(f"{server}/healthz").json() == {"ok": True}
    r = httpx.post(f"{server}/slack/interactions", data={"payload": "{}"})
    assert r.status_code == 401 and "header missing" in r.json()["error"]


def test_the_serve_command_records_a_click(tmp_path, fake, slack, domains, server):
    """``dw-dagster approvals serve`` as a person starts it: a subprocess on its own port and DAGSTER_HOME."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = Path(sys.executable).parent
    proc = subprocess.Popen([str(bin_dir / "dw-dagster"), "approvals", "serve", "--port", str(port), "--domains",
                             str(domains), "--dagster-home", str(home)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).json() == {"ok": True}:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "dw-dagster approvals serve did not answer /healthz"
            time.sleep(0.2)
        with dg.instance_for_test(temp_dir=str(home), set_dagster_home=False) as inst:
            cs, ts = ask(inst, slack, change_set(new_id()))
            fake.state.configure_slack(request_url=f"{url}/slack/interactions")
            answer = click(fake, ts)
            assert answer["body"]["text"].startswith(f"Recorded: change set {cs.id} approved by {OWNER}")
            (row,) = ledger_for(inst).decisions(cs.id)
            assert (row["approver"], row["method"]) == (OWNER, "slack")
    finally:
        fake.state.configure_slack(request_url=f"{server}/slack/interactions")
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert f"review page {url}/ · OIDC redirect URI {url}/callback · Slack Request URL {url}/slack/interactions" in err
    assert "the domains file names no OIDC provider" in err


def test_replies_are_posted_only_to_slack_or_the_configured_api(server, fake):
    """A signed payload's response_url elsewhere (here: the fake under another host name) gets nothing."""
    from dw_dagster_dev.fakes.paging_server import slack_signature

    elsewhere = fake.base_url.replace("127.0.0.1", "localhost") + f"/actions/{TEAM}/1/x"
    payload = {"type": "block_actions", "team": {"id": TEAM}, "user": {"id": "U0DANAORTZ", "team_id": TEAM},
               "response_url": elsewhere,
               "actions": [{"type": "button", "action_id": "dw_approve", "value": '{"cs":"cs-nowhere01","v":"abc"}'}]}
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()))
    before = len(fake.state.slack_responses())
    r = httpx.post(f"{server}/slack/interactions", content=body, headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": slack_signature(SECRET, ts, body)})
    assert r.status_code == 200 and r.json()["text"] == "Refused: no change set 'cs-nowhere01' in this Dagster instance"
    time.sleep(0.5)
    assert len(fake.state.slack_responses()) == before


@pytest.mark.parametrize("element,error", [
    ({"type": "button", "action_id": "dw_approve", "text": {"type": "plain_text", "text": "A" * 76}},
     "'text.text' String should have at most 75 characters [json-pointer:/blocks/0]"),
    ({"type": "button", "action_id": "dw_approve", "text": {"type": "plain_text", "text": "Approve"}, "value": "v" * 2001},
     "'value' String should have at most 2000 characters [json-pointer:/blocks/0]"),
    ({"type": "button", "action_id": "dw_approve", "text": {"type": "mrkdwn", "text": "*Approve*"}},
     "'text.type' Input should be 'plain_text' [json-pointer:/blocks/0]"),
], ids=["text_too_long", "value_too_long", "mrkdwn_text"])
def test_fake_slack_refuses_buttons_slack_refuses(fake, element, error):
    r = httpx.post(f"{fake.base_url}/api/chat.postMessage", json={"channel": CHANNEL, "text": "t", "blocks": [
        {"type": "actions", "elements": [element]}]},
        headers={"Authorization": f"Bearer {DEFAULT_SLACK_TOKEN}", "Content-Type": "application/json; charset=utf-8"})
    assert r.json()["ok"] is False and r.json()["error"] == "invalid_blocks" and r.json()["errors"] == [error]


def test_users_info_answers_as_slack_documents(fake):
    from slack_sdk import WebClient

    user = WebClient(token=DEFAULT_SLACK_TOKEN, base_url=f"{fake.base_url}/api/").users_info(user="U0DANAORTZ")["user"]
    assert (user["id"], user["team_id"], user["name"], user["deleted"], user["is_bot"]) == (
        "U0DANAORTZ", TEAM, "dana.ortiz", False, False)
    assert user["profile"]["email"] == "Dana.Ortiz@grocer.example" and user["profile"]["real_name"] == "Dana Ortiz"
