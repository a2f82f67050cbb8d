"""The escalation ladder through a real ``dagster dev`` daemon, on a clock the test controls: a reminder,
an escalation, an escalation approver deciding with the button of the DM the daemon sent, and an
automatic denial — each step once in the ledger and once per person and channel (Slack DM, the page,
email), across the daemon's many ticks.

The code location (:mod:`.ladder_location`) runs the ladder sensor on a clock read from a file the test
writes, and the notification sensor against the fake Slack/PagerDuty and an aiosmtpd server. The change
sets are proposed 6 h 5 min ago in real time (so an escalation approver may decide now), while the
ladder's clock steps from 1 h to 25 h after the proposal.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import textwrap
import time
from pathlib import Path

import dagster as dg
import httpx
import pytest

from dw_dagster.approval.ladder import ladder_history
from dw_dagster.approval.server import build_app
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import ChangeSet, Incident, utcnow
from dw_dagster.proposals.change_sets import propose
from dw_dagster_dev.fakes.paging_server import DEFAULT_SLACK_TOKEN, start_paging_server
from dw_dagster_tests.harness.asgi_server import serve
from dw_dagster_tests.harness.dagster_dev import dagster_dev, write_instance_yaml

OWNER, BOSS = "dana.ortiz@grocer.example", "head.of.data@grocer.example"
SECRET = "3f1c9a0b7d2e4f6a8b0c1d2e3f4a5b6c"
H = dt.timedelta(hours=1)
STEP_TIMEOUT = 120


def _until(cond, what: str, dev, timeout: float = STEP_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"{what} did not happen within {timeout} s\n{dev.log_tail(60)}")


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    from aiosmtpd.controller import Controller

    root = tmp_path_factory.mktemp("ladder")
    paging, url = start_paging_server()
    paging.state.configure_slack(signing_secret=SECRET, team_id="T0FAKETEAM")
    mails: list[str] = []

    class Box:
        async def handle_DATA(self, server, session, envelope):
            mails.append(envelope.content.decode("utf-8", "replace"))
            return "250 OK"

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        smtp_port = s.getsockname()[1]
    smtp = Controller(Box(), hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    domains = root / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: store_sales
            assets: [[store_sales_line]]
            approvers: [{OWNER}]
            slack_channel: C0DATAOPS1
            remind_after: 2h
            escalate_after: 6h
            escalation_approvers: [{BOSS}]
            deny_after: 24h
        identity:
          slack:
            signing_secret_env: DW_TEST_SLACK_SECRET
            bot_token_env: DW_TEST_SLACK_TOKEN
            team_id: T0FAKETEAM
            api_url: {url}/api
        """))
    clock = root / "clock.txt"
    created = utcnow() - 6 * H - dt.timedelta(minutes=5)
    clock.write_text((created + H).isoformat())
    workspace = root / "workspace.yaml"
    workspace.write_text(textwrap.dedent("""\
        load_from:
          - python_module:
              module_name: dw_dagster_tests.e2e.ladder_location
              attribute: defs
              location_name: ladder
        """))
    dagster_home = root / "dagster_home"
    write_instance_yaml(dagster_home)
    key = "ladder-daemon-test-signing-key-0123456789"
    env = {**os.environ, c.SIGNING_KEY_ENV: key, "DW_TEST_LADDER_DOMAINS": str(domains), "DW_TEST_LADDER_CLOCK": str(clock),
           "DW_TEST_PAGING_URL": url, "DW_TEST_SMTP_PORT": str(smtp_port), "DW_TEST_SLACK_SECRET": SECRET,
           "DW_TEST_SLACK_TOKEN": DEFAULT_SLACK_TOKEN, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with pytest.MonkeyPatch.context() as mp:
        for k in (c.SIGNING_KEY_ENV, "DW_TEST_SLACK_SECRET", "DW_TEST_SLACK_TOKEN"):
            mp.setenv(k, env[k])
        with dg.DagsterInstance.from_config(str(dagster_home)) as instance, \
                dagster_dev(dagster_home, env, root, workspace=workspace, locations=("ladder",)) as dev, \
                serve(lambda base: build_app(instance, str(domains), base_url=base)) as app:
            httpx.post(f"{url}/_fake/slack/app", json={"request_url": f"{app}/slack/interactions"}).raise_for_status()
            yield dev, instance, paging, mails, clock, created
    smtp.stop()
    paging.stop()


def _propose(instance, name: str, created: dt.datetime) -> ChangeSet:
    inc = Incident(id=f"inc-{name}", asset_key=["store_sales_line"], source="dw_check", detected_at=created,
                   summary="Southwest short", gap_rows=40)
    ledger_for(instance).record_incident(incident_id=inc.id, asset_key="store_sales_line", source="dw_check",
                                         external_id=None, body=inc.model_dump_json())
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(["store_sales_line"]), metadata={c.INCIDENT_KEY: dg.MetadataValue.json(inc.model_dump(mode="json"))}))
    cs = ChangeSet.seal(id=f"cs-{name}", incident_id=inc.id, diagnosis_id=f"dg-{name}", domain="store_sales",
                        proposer=c.PROPOSER, created_at=created, expires_at=created + 24 * H, approvers=[OWNER],
                        cause_kind="late_rows_behind_watermark", summary=f"rerun 2026-11-26 ({name})",
                        target_asset=["store_sales_line"], window=["2026-11-26"], diff="", files=[], rebuild_assets=[])
    return propose(instance, cs)[0]


def _dms(paging, user: str, cs_id: str) -> list[dict]:
    dm = next((cid for cid, n in paging.state.credentials.slack_channels.items() if n == f"dm-{user}"), None)
    return [m for m in paging.state.slack_messages(dm) if cs_id in str(m)] if dm else []


def _steps(instance, cs: ChangeSet) -> list[str]:
    return [s["step"] for s in ladder_history(instance, change_set_id=cs.id) if not s["skipped"]]


def test_every_ladder_step_through_the_daemon(ladder):
    dev, instance, paging, mails, clock, created = ladder
    a, b = _propose(instance, "decided", created), _propose(instance, "denied", created)
    _until(lambda: len(_dms(paging, "U0DANAORTZ", a.id)) == 1 and len(_dms(paging, "U0DANAORTZ", b.id)) == 1,
           "the approval request DMs", dev)

    clock.write_text((created + 2 * H + dt.timedelta(minutes=1)).isoformat())  # the reminder is due
    _until(lambda: _steps(instance, a) == ["remind"] and _steps(instance, b) == ["remind"], "the reminders", dev)
    _until(lambda: len(_dms(paging, "U0DANAORTZ", a.id)) == 2, "the reminder DM", dev)
    assert "Reminder" in _dms(paging, "U0DANAORTZ", a.id)[-1]["text"]

    clock.write_text((created + 6 * H + dt.timedelta(minutes=1)).isoformat())  # the escalation is due
    _until(lambda: len(_dms(paging, "U0HEADDATA", a.id)) == 1, "the escalation DM to the escalation approver", dev)
    [dm] = _dms(paging, "U0HEADDATA", a.id)
    assert "Escalated" in dm["text"] and any(block["type"] == "actions" for block in dm["blocks"])
    click = httpx.post(f"{paging.base_url}/_fake/slack/click", timeout=60,
                       json={"channel": dm["channel"], "ts": dm["ts"], "action_id": "dw_approve", "user": "U0HEADDATA"})
    assert click.status_code == 200 and click.json()["body"]["text"].startswith("Recorded:"), click.text
    [approval] = records.approvals(instance, a.id)
    assert (approval.approver, approval.method, approval.change_set_version) == (BOSS, "slack", a.version)

    clock.write_text((created + 24 * H + dt.timedelta(minutes=1)).isoformat())  # the denial is due
    _until(lambda: _steps(instance, b) == ["remind", "escalate", "deny"], "the automatic denial", dev)
    assert ledger_for(instance).change_set_row(b.id).state == "expired" and records.approvals(instance, b.id) == []
    assert _steps(instance, a) == ["remind", "escalate"]  # decided: never denied
    _until(lambda: any("denied" in m and b.id in m for m in mails), "the denial email", dev)

    time.sleep(8)  # many more ticks of both sensors: nothing is told twice
    assert len(_dms(paging, "U0DANAORTZ", a.id)) == 2 and len(_dms(paging, "U0HEADDATA", a.id)) == 1
    assert len(_dms(paging, "U0DANAORTZ", b.id)) == 3  # request, reminder, denial
    for cs in (a, b):  # one email per step (and the request), each once: distinct Message-IDs
        ids = [next(line for line in m.splitlines() if line.lower().startswith("message-id:"))
               for m in mails if f"X-DW-Change-Set: {cs.id}" in m]
        assert len(ids) == len(set(ids)) == 1 + len(_steps(instance, cs)), ids
    [page] = paging.state.pagerduty_incidents(f"dw-dagster:{b.incident_id}")
    notes = [n["content"] for n in page["notes"]]
    assert sum("escalation ladder" in n for n in notes) == 3 and any("Denied" in n for n in notes)
