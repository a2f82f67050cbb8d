"""The named owner asked directly: a Slack DM per approver (users.lookupByEmail → conversations.open →
chat.postMessage with the signed buttons), the domain's channel too, exactly once across ticks, timeouts
and rate limits; an approver Slack cannot find named in the ledger; an escalation approver deciding with
the DM's button.

Real HTTP against the fake Slack (paging_server) through ``slack_sdk``'s ``WebClient``; one fake, one
instance, one daemon and one approvals server for the file; faults cleared after each test.
"""

import datetime as dt
import textwrap
import time
from types import SimpleNamespace

import dagster as dg
import httpx
import pytest

from dw_dagster.approval.ladder import climb
from dw_dagster.approval.server import build_app
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.domains import load_domains
from dw_dagster.core.models import ChangeSet, utcnow
from dw_dagster.integrations.notifications import build_notification_sensor, notifications
from dw_dagster.integrations.notify_people import unreachable
from dw_dagster.integrations.slack import SlackResource
from dw_dagster.integrations.slack_direct import BoundedRateLimitHandler
from dw_dagster.proposals.change_sets import propose
from dw_dagster_dev.fakes.paging_server import DEFAULT_SLACK_TOKEN, start_paging_server
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_tests.harness.asgi_server import serve

OWNER, LEE, GHOST, BOSS = ("dana.ortiz@grocer.example", "lee.park@grocer.example", "gone.person@grocer.example",
                           "head.of.data@grocer.example")
USERS = {"U0DANAORTZ": {"email": OWNER, "name": "dana.ortiz"}, "U0LEEPARK1": {"email": LEE, "name": "lee.park"},
         "U0HEADDATA": {"email": BOSS, "name": "head.of.data"}}
SECRET, TEAM = "3f1c9a0b7d2e4f6a8b0c1d2e3f4a5b6c", "T0FAKETEAM"
DOMAIN_CHANNEL = "C0DATAOPS1"
H = dt.timedelta(hours=1)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    fake, url = start_paging_server()
    fake.state.configure_slack(signing_secret=SECRET, users=USERS, team_id=TEAM)
    domains = tmp_path_factory.mktemp("dm") / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: store_sales
            assets: [[store_sales_line]]
            approvers: [{OWNER}, {LEE}, {GHOST}]
            slack_channel: {DOMAIN_CHANNEL}
            remind_after: 2h
            escalate_after: 6h
            escalation_approvers: [{BOSS}]
            deny_after: 24h
        identity:
          slack:
            signing_secret_env: DW_TEST_SLACK_SECRET
            bot_token_env: DW_TEST_SLACK_TOKEN
            team_id: {TEAM}
            api_url: {url}/api
        """))
    slack = SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{url}/api", default_channel="C0DWAPPROV",
                          timeout_s=0.5, retry_attempts=3, retry_base_wait_s=0.01, retry_max_wait_s=1.5)
    with pytest.MonkeyPatch.context() as mp, dg.instance_for_test() as instance:
        mp.setenv("DW_TEST_SLACK_SECRET", SECRET)
        mp.setenv("DW_TEST_SLACK_TOKEN", DEFAULT_SLACK_TOKEN)
        mp.setenv(c.SIGNING_KEY_ENV, "slack-dm-test-signing-key-0123456789")
        defs = dg.Definitions(assets=[dg.AssetSpec(dg.AssetKey("store_sales_line"))], resources={"slack": slack},
                              sensors=[build_notification_sensor(slack_resource_key="slack", domains=str(domains),
                                                                 review_url="https://review.grocer.example")])
        daemon = LocalSensorDaemon(defs, instance, log_level="CRITICAL")
        daemon.tick("dw_notification_sensor")
        with serve(lambda base: build_app(instance, str(domains), base_url=base)) as app:
            httpx.post(f"{url}/_fake/slack/app", json={"request_url": f"{app}/slack/interactions"}).raise_for_status()
            yield SimpleNamespace(fake=fake, url=url, instance=instance, daemon=daemon, domains=domains, slack=slack)
    fake.stop()


@pytest.fixture(autouse=True)
def _no_faults(world):
    yield
    world.fake.state.clear_faults()


def _propose(w, name: str, created: dt.datetime | None = None) -> ChangeSet:
    created = created or utcnow()
    cs = ChangeSet.seal(id=f"cs-{name}", incident_id=f"inc-{name}", diagnosis_id=f"dg-{name}", domain="store_sales",
                        proposer=c.PROPOSER, created_at=created, expires_at=created + 24 * H, approvers=[OWNER, LEE, GHOST],
                        cause_kind="late_rows_behind_watermark", summary=f"rerun 2026-11-26 ({name})",
                        target_asset=["store_sales_line"], window=["2026-11-26"], diff="", files=[], rebuild_assets=[])
    return propose(w.instance, cs)[0]


def _dms(w, cs_id: str, user: str) -> list[dict]:
    state = w.fake.state
    dm = next((cid for cid, name in state.credentials.slack_channels.items() if name == f"dm-{user}"), None)
    return [m for m in state.slack_messages(dm) if cs_id in str(m)] if dm else []


def _tick(w):
    return w.daemon.tick("dw_notification_sensor")


def test_each_approver_is_asked_directly_and_the_domain_channel_too(world):
    w = world
    before_cursor = w.daemon.cursors["dw_notification_sensor"]
    cs = _propose(w, "direct")
    _tick(w)
    for user in ("U0DANAORTZ", "U0LEEPARK1"):
        [dm] = _dms(w, cs.id, user)
        actions = next(b for b in dm["blocks"] if b["type"] == "actions")
        assert [e["action_id"] for e in actions["elements"]] == ["dw_approve", "dw_reject"]
        assert f"https://review.grocer.example/change-sets/{cs.id}" in str(dm["blocks"])
    [channel] = [m for m in w.fake.state.slack_messages(DOMAIN_CHANNEL) if cs.id in str(m)]
    assert channel["channel"] == DOMAIN_CHANNEL
    [missed] = unreachable(w.instance, cs.id)  # not skipped in silence: named in the ledger
    assert (missed["email"], missed["channel"], missed["version"]) == (GHOST, "slack", cs.version)
    shown = [records.metadata_json(r.asset_observation.metadata, c.UNREACHABLE_KEY)
             for r in records.iter_observations(w.instance, dg.AssetKey(["store_sales_line"]))]
    assert [s["email"] for s in shown if s and s["change_set_id"] == cs.id] == [GHOST]
    before = len(w.fake.state.request_log("/api/"))
    _tick(w)
    assert len(w.fake.state.request_log("/api/")) == before  # the next tick repeats nothing, not even a look-up
    w.daemon.cursors["dw_notification_sensor"] = before_cursor  # a restart that lost the tick's cursor
    _tick(w)
    assert len(w.fake.state.request_log("/api/")) == before and len(_dms(w, cs.id, "U0DANAORTZ")) == 1


def test_a_dm_applied_while_its_answer_timed_out_is_found_not_sent_again(world):
    """chat.postMessage has no idempotency key, so a post whose answer is lost and is retried blindly
    appears twice (https://github.com/slackapi/slack-api-specs/issues/10; the SDK's own retries doing it:
    https://github.com/openclaw/openclaw/issues/22780). The DM carries its ref as message metadata and is
    looked up in the DM's history before it is ever posted again."""
    w = world
    w.fake.state.add_fault(delay_s=0.9, after_apply=True, count=2, method="POST", path="/api/chat.postMessage")
    cs = _propose(w, "timeout")
    _tick(w)
    _tick(w)
    assert len(_dms(w, cs.id, "U0DANAORTZ")) == 1 and len(_dms(w, cs.id, "U0LEEPARK1")) == 1
    done = [n for n in notifications(w.instance) if n.get("change_set_id") == cs.id and n["channel"].startswith("slack_dm:")
            and n["ok"]]
    assert {n["person"] for n in done} == {OWNER, LEE}


def test_rate_limits_are_waited_out_within_the_tick_and_never_longer(world):
    """A 429 carries Retry-After; slack_sdk's default handlers retry connection errors only, and an
    unbounded wait hangs the caller (https://github.com/downstairs-dawgs/clacks/issues/91: "decide max retry
    count / max total wait so commands fail eventually rather than hang silently")."""
    w = world
    w.fake.state.add_fault(status=429, retry_after=1, count=1, path="/api/users.lookupByEmail")
    cs = _propose(w, "ratelimit")
    _tick(w)
    assert len(_dms(w, cs.id, "U0DANAORTZ")) == 1  # waited one second, then sent in the same tick
    w.fake.state.add_fault(status=429, retry_after=120, count=-1, path="/api/conversations.open")
    slow = _propose(w, "ratelimit-long")
    started = time.monotonic()
    tick = _tick(w)
    assert time.monotonic() - started < 20 and "rate limited (Retry-After 120" in tick.skip_reason
    assert _dms(w, slow.id, "U0DANAORTZ") == []
    w.fake.state.clear_faults()
    _tick(w)
    assert len(_dms(w, slow.id, "U0DANAORTZ")) == 1 and len(_dms(w, slow.id, "U0LEEPARK1")) == 1


def test_the_bounded_handler_refuses_a_retry_after_beyond_its_bound():
    from slack_sdk.http_retry.request import HttpRequest
    from slack_sdk.http_retry.response import HttpResponse
    from slack_sdk.http_retry.state import RetryState

    handler = BoundedRateLimitHandler(max_retry_count=3, max_wait_s=2.0)
    request = HttpRequest(method="POST", url="https://slack.com/api/chat.postMessage", headers={})
    assert not handler.can_retry(state=RetryState(), request=request,
                                 response=HttpResponse(status_code=429, headers={"Retry-After": ["30"]}, body={}))
    assert handler.can_retry(state=RetryState(), request=request,
                             response=HttpResponse(status_code=429, headers={"Retry-After": ["1"]}, body={}))


def test_the_escalation_approver_is_asked_by_dm_and_decides_with_its_button(world):
    w = world
    t0 = utcnow() - 7 * H  # proposed seven hours ago: the escalation is due
    cs = _propose(w, "escalated", t0)
    _tick(w)
    climb(w.instance, load_domains(w.domains), utcnow())
    _tick(w)
    [dm] = _dms(w, cs.id, "U0HEADDATA")
    assert "Escalated" in dm["text"] and any(b["type"] == "actions" for b in dm["blocks"])
    r = httpx.post(f"{w.url}/_fake/slack/click", timeout=30, json={"channel": dm["channel"], "ts": dm["ts"],
                                                                   "action_id": "dw_approve", "user": "U0HEADDATA"})
    assert r.status_code == 200 and r.json()["body"]["text"].startswith("Recorded: change set"), r.text
    [approval] = records.approvals(w.instance, cs.id)
    assert (approval.approver, approval.change_set_version, approval.method) == (BOSS, cs.version, "slack")
