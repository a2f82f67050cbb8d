"""Field cases of the notifications (:mod:`dw_dagster.integrations.slack`): text that came from the
warehouse or an alert (a change set's summary, a page's note) put into a Slack message, where
``<`` and ``>`` are control characters in the ``text`` fallback as much as in the blocks."""

import datetime as dt

from dw_dagster.core import keys as c
from dw_dagster.core.models import ChangeSet, FileChange, utcnow
from dw_dagster.integrations.slack import approval_request_message, page_annotated_message
from dw_dagster_tests.field_cases.kinds import kind

KINDS = [
    kind("notify-slack-untrusted-markup", "vendors", "text from the warehouse or an alert holding Slack markup "
         "(<!channel>, <url|label>) in a notification's text fallback",
         "https://github.com/Smana/runlore/pull/196", "dw_dagster/integrations/slack.py",
         "test_untrusted_text_never_becomes_slack_markup", True),
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
