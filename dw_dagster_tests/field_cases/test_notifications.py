"""Field cases of the notifications (:mod:`dw_dagster.integrations.slack`): text that came from the
warehouse or an alert (a change set's summary, a page's note) put into a Slack message, where
``<`` and ``>`` are control characters in the ``text`` fallback as much as in the blocks; and the
history look-up that keeps a message from going out twice, against a real loopback server."""

import datetime as dt

import pytest

from dw_dagster.core import keys as c
from dw_dagster.core.http import HttpApiError
from dw_dagster.core.models import ChangeSet, FileChange, utcnow
from dw_dagster.integrations.slack import SlackResource, approval_request_message, page_annotated_message
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.field_cases.loopback import serve

KINDS = [
    kind("notify-slack-untrusted-markup", "vendors", "text from the warehouse or an alert holding Slack markup "
         "(<!channel>, <url|label>) in a notification's text fallback",
         "https://github.com/Smana/runlore/pull/196", "dw_dagster/integrations/slack.py",
         "test_untrusted_text_never_becomes_slack_markup", True),
    kind("notify-slack-more-without-cursor", "vendors", "a Slack history page with has_more but an empty next_cursor, "
         "read before a post that may have gone out already", "https://github.com/slackapi/python-slack-sdk/issues/603",
         "dw_dagster/integrations/slack.py", "test_a_history_with_more_messages_but_no_cursor_is_not_read_as_not_posted",
         True),
]

HOSTILE = "late rows <!channel> <https://evil.example/approve|Approve here> & more"


def _slack_escaped(s: str) -> str:
    """Slack's documented escaping ("Formatting text"): & first, then < and >."""
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _texts(message) -> list[str]:
    out = [message.text]

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "text" and isinstance(v, str):
                    out.append(v)
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(message.blocks)
    return out


def _change_set(summary: str) -> ChangeSet:
    now = utcnow()
    return ChangeSet.seal(
        id="cs-field00002", incident_id="inc-2", diagnosis_id="dg-2", domain="store_sales", proposer=c.PROPOSER,
        created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=["dana.ortiz@grocer.example"],
        cause_kind="late_rows_behind_watermark", summary=summary, target_asset=["store_sales_line"],
        window=["2026-11-26"], diff="", files=[FileChange(path="p.yaml", before_sha256="a", after_sha256="b")],
        rebuild_assets=[["fct"]])


def test_untrusted_text_never_becomes_slack_markup():
    """runlore PR #196 (https://github.com/Smana/runlore/pull/196): untrusted text interpolated
    verbatim into ``mrkdwn`` blocks "and the plain-text fallback" lets a hostile log line inject
    live markup: a mass mention, or ``<https://evil.example|click here>`` shown as a link. The
    blocks were escaped, but the approval request's ``text`` (what Slack shows in notifications)
    carried the change set's summary raw, and the page-annotated message its note. Right answer
    (Slack's escaping, done here in Python): every text of each message holds the hostile part
    only escaped, never a raw ``<!channel>`` or ``<https://evil...|...>``."""
    messages = [approval_request_message(_change_set(HOSTILE), None, dagster_url="https://dagster.example",
                                         location="store_sales", header="Reminder <!here>"),
                page_annotated_message("inc-2", "pagerduty", HOSTILE)]
    for m in messages:
        for text in _texts(m):
            assert "<!channel>" not in text and "<!here>" not in text and "<https://evil" not in text, text
        assert _slack_escaped("<!channel> <https://evil.example/approve|Approve here>") in m.text


def test_a_history_with_more_messages_but_no_cursor_is_not_read_as_not_posted():
    """python-slack-sdk #603 (https://github.com/slackapi/python-slack-sdk/issues/603): Slack sets
    ``response_metadata.next_cursor`` to ``""`` rather than leaving it out, so clients must tell
    "no cursor" from "no more". Before posting a message that may have been posted already, the
    Slack client reads the channel history for its ref; a page saying ``has_more: true`` with an
    empty cursor was taken for the end of the history: "not posted", and the message went out a
    second time. Right answer (the server's own ``has_more``): the look-up fails saying it cannot
    tell, and nothing is posted; a history that really ends answers "not found" and posts once."""
    posts = []

    def slack(has_more):
        def answer(method, path, query, body):
            if path.endswith("/conversations.history"):
                return 200, {"ok": True, "messages": [{"ts": "1.0", "text": "other"}], "has_more": has_more,
                             "response_metadata": {"next_cursor": ""}}
            if path.endswith("/chat.postMessage"):
                posts.append(body)
                return 200, {"ok": True, "channel": body["channel"], "ts": "2.0", "message": {"text": body["text"]}}
            return 404, {"ok": False, "error": "unknown_method"}
        return answer

    for has_more in (True, False):
        with serve(slack(has_more)) as (url, seen):
            res = SlackResource(bot_token="xoxb-test", base_url=f"{url}/api", retry_attempts=1)
            if has_more:
                with pytest.raises(HttpApiError, match="has_more but gives no next_cursor"):
                    res.post_message("hello", channel="C0123456789", ref="dw:task-1:notify", check_first=True)
                assert posts == [] and all("chat.postMessage" not in r for r in seen)
            else:
                assert res.post_message("hello", channel="C0123456789", ref="dw:task-1:notify", check_first=True)["ok"]
                assert len(posts) == 1
