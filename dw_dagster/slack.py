"""Ask for an approval in Slack: ``chat.postMessage`` over the Web API, and the messages dw_dagster sends.

:class:`SlackResource` posts with a bot token (``Authorization: Bearer xoxb-...``) to
``https://slack.com/api/chat.postMessage`` (Slack API docs, "chat.postMessage"): a JSON body
``{channel, text, blocks?}``; the answer is HTTP 200 with ``{"ok": true, "channel", "ts",
"message"}`` or ``{"ok": false, "error": "<code>"}`` (HTTP 429 with ``Retry-After`` when rate
limited, Slack docs "Rate limits"). ``ok: false`` becomes an :class:`~dw_dagster.http.HttpApiError`
naming the Slack error code.

Message builders return a :class:`SlackMessage` (Block Kit ``header``/``section``/``context``
blocks with ``mrkdwn`` text, plus the plain ``text`` fallback Slack shows in notifications):

- :func:`approval_request_message`: a change set's summary, blast radius, expiry (UTC) and the
  two ways to approve it: the Launchpad of the approval job (:func:`launchpad_url`) and the exact
  ``dw-dagster approve <id> --approver <email>`` command;
- :func:`page_annotated_message` and :func:`resolved_message` for the paging loop.

Block Kit limits kept here (Slack docs "Blocks → Section block", "Header block"): at most 50
blocks, section text ≤ 3000 characters, header text ≤ 150 (plain_text); message ``text`` ≤ 40000.
"""

import datetime as dt
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import Field

from dw_dagster.http import HttpApiError
from dw_dagster.models import BlastRadius, ChangeSet, Receipt
from dw_dagster.paging import _VendorResource, clip, exposure_label

APPROVAL_JOB_NAME = "dw_approve_change_set"  # dw_dagster.remediation.approval.APPROVAL_JOB_NAME
APPROVAL_OP_NAME = "dw_record_decision"  # the approval job's one op (its Launchpad config key)
DEFAULT_REPOSITORY = "__repository__"  # the repository name Dagster gives a Definitions object

SECTION_TEXT_MAX = 3000
HEADER_TEXT_MAX = 150
MESSAGE_TEXT_MAX = 40000

_HINTS = {
    "not_authed": "no bot token was sent",
    "invalid_auth": "the bot token is not valid",
    "account_inactive": "the token's user or workspace is deactivated",
    "token_revoked": "the bot token was revoked",
    "channel_not_found": "the channel does not exist or the bot cannot see it",
    "not_in_channel": "invite the bot to the channel first",
    "is_archived": "the channel is archived",
    "invalid_blocks": "Slack rejected the blocks",
    "msg_too_long": "the message text is too long",
    "no_text": "neither text nor blocks were sent",
    "ratelimited": "rate limited",
    "invalid_arguments": "the request arguments are invalid",
}


@dataclass(frozen=True)
class SlackMessage:
    """One Slack message: the plain ``text`` fallback and Block Kit ``blocks``."""

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)

    def payload(self, channel: str) -> dict[str, Any]:
        """The ``chat.postMessage`` JSON body for ``channel``."""
        body: dict[str, Any] = {"channel": channel, "text": clip(self.text, MESSAGE_TEXT_MAX)}
        if self.blocks:
            body["blocks"] = self.blocks[:50]
        return body


class SlackResource(_VendorResource):
    """Slack Web API with a bot token (``bot_token=dg.EnvVar("SLACK_BOT_TOKEN")``, ``xoxb-...``).

    The bot needs the ``chat:write`` scope and membership of the channel.
    """

    bot_token: str = Field(description="bot token, xoxb-...")
    base_url: str = Field(default="https://slack.com/api", description="Web API base URL")
    default_channel: str | None = Field(default=None, description="channel ID (C...) used when none is given")

    def _secrets(self) -> list[str]:
        return [self.bot_token]

    def post_message(self, message: SlackMessage | str, *, channel: str | None = None) -> dict[str, Any]:
        """``chat.postMessage``; return Slack's answer (``{"ok": true, "channel", "ts", "message"}``).

        Args:
            message: a :class:`SlackMessage`, or plain text.
            channel: channel ID (``C...``) or name; default ``default_channel``.

        Raises:
            ValueError: no channel given and no ``default_channel``.
            HttpApiError: ``ok: false`` (status 200, the Slack error code and a hint in the
                message), 429 still rate limited after retries (``Retry-After`` honoured), 5xx,
                timeouts. Never contains the token.
        """
        channel = channel or self.default_channel
        if not channel:
            raise ValueError("no Slack channel: pass channel= or set default_channel")
        msg = message if isinstance(message, SlackMessage) else SlackMessage(text=message)
        url = f"{self.base_url.rstrip('/')}/chat.postMessage"
        endpoint = httpx.URL(url).path
        headers = {"Authorization": f"Bearer {self.bot_token}", "Content-Type": "application/json; charset=utf-8"}
        with httpx.Client(headers=headers) as client:
            response = self._send(client, "slack", "POST", url, json=msg.payload(channel))
        body = self._json(response, "slack", "POST")
        if not isinstance(body, dict):
            raise HttpApiError("slack", "POST", endpoint, response.status_code, "response is not a JSON object")
        if body.get("ok") is not True:
            code = str(body.get("error") or "unknown_error")
            extra = body.get("errors") or (body.get("response_metadata") or {}).get("messages") or []
            detail = f"Slack error {code!r}" + (f" ({_HINTS[code]})" if code in _HINTS else "")
            if extra:
                detail += ": " + "; ".join(str(x) for x in extra)[:200]
            raise self._redact(HttpApiError("slack", "POST", endpoint, response.status_code, detail))
        return body


# -- message builders --------------------------------------------------------------------------

def mrkdwn_escape(text: str) -> str:
    """Escape ``&``, ``<`` and ``>`` as Slack requires in message text (Slack docs "Formatting text")."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(text, SECTION_TEXT_MAX)}}


def _header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": clip(text, HEADER_TEXT_MAX), "emoji": False}}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(text, SECTION_TEXT_MAX)}]}


def _list(items: Sequence[str], limit: int = 12) -> str:
    if not items:
        return "none"
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def utc_text(when: dt.datetime) -> str:
    """``2026-11-29 21:59 UTC`` (naive datetimes are taken as UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def launchpad_url(dagster_url: str, location: str, job_name: str = APPROVAL_JOB_NAME,
                  repository: str = DEFAULT_REPOSITORY) -> str:
    """The Dagster UI Launchpad of a job: ``<dagster_url>/locations/<location>/jobs/<job>/playground``.

    Dagster's UI writes a code location's path as the URL-encoded location name when the
    repository is ``__repository__`` (a ``Definitions`` object), else ``<repository>@<location>``.
    """
    loc = quote(location, safe="")
    repo_path = loc if repository == DEFAULT_REPOSITORY else f"{quote(repository, safe='')}@{loc}"
    return f"{dagster_url.rstrip('/')}/locations/{repo_path}/jobs/{quote(job_name, safe='')}/playground"


def approve_command(change_set_id: str, approver: str, *, dagster_home: str | None = None) -> str:
    """The exact CLI command: ``dw-dagster approve <id> --approver <email> [--dagster-home DIR]``."""
    parts = ["dw-dagster", "approve", change_set_id, "--approver", approver]
    if dagster_home:
        parts += ["--dagster-home", dagster_home]
    return shlex.join(parts)


def launchpad_config(change_set_id: str, approver: str) -> str:
    """The approval job's Launchpad run config (YAML) for one change set and approver."""
    return (f"ops:\n  {APPROVAL_OP_NAME}:\n    config:\n      change_set_id: {change_set_id}\n"
            f"      approver: {approver}\n      decision: approve")


def approval_request_message(
    change_set: ChangeSet,
    blast_radius: BlastRadius | None,
    *,
    dagster_url: str,
    location: str,
    job_name: str = APPROVAL_JOB_NAME,
    repository: str = DEFAULT_REPOSITORY,
    dagster_home: str | None = None,
) -> SlackMessage:
    """The approval request for a change set, for the domain's approvers.

    Args:
        change_set: the proposal (summary, window, approvers, expiry, id).
        blast_radius: from the diagnosis (models, exposures with owners, owners); None if unknown.
        dagster_url: the Dagster UI base URL, e.g. ``https://dagster.example.com``.
        location: the code location name holding the approval job.
        job_name: the approval job (default ``dw_approve_change_set``).
        repository: the repository name inside the location (default ``__repository__``).
        dagster_home: when given, the CLI command carries ``--dagster-home`` with it.

    Returns:
        A :class:`SlackMessage`: header, summary, blast radius, expiry and approvers, how to
        approve (Launchpad link with its config, and one CLI command per listed approver, at most
        5), and a context line with the version and proposer. The ``text`` fallback holds the
        summary, expiry, link and first command.
    """
    cs = change_set
    esc = mrkdwn_escape
    url = launchpad_url(dagster_url, location, job_name, repository)
    approvers = list(cs.approvers) or ["YOUR_EMAIL"]
    commands = [approve_command(cs.id, a, dagster_home=dagster_home) for a in approvers[:5]]
    expires = utc_text(cs.expires_at)
    asset = "/".join(cs.target_asset)

    summary = (f"*{esc(cs.summary)}*\n"
               f"*Asset:* `{esc(asset)}`   *Cause:* `{esc(cs.cause_kind)}`   *Incident:* `{esc(cs.incident_id)}`\n"
               f"*Window:* {esc(_list(cs.window))}   *Rows to recover:* {cs.expected_recovered_rows:,}\n"
               f"*Rebuild:* {esc(_list(['/'.join(k) for k in cs.rebuild_assets]))}")
    if cs.new_tests:
        summary += f"\n*New tests:* {esc(_list(cs.new_tests))}"
    if blast_radius is not None:
        br = blast_radius
        radius = ("*Blast radius*\n"
                  f"• Models: {esc(_list([m.name for m in br.models]))}\n"
                  f"• Exposures: {esc(_list([exposure_label(e) for e in br.exposures]))}\n"
                  f"• Owners: {esc(_list(br.owners))}\n"
                  f"• dbt tests downstream: {len(br.tests)}")
    else:
        radius = "*Blast radius*\nnot computed"
    timing = (f"*Expires:* {expires} (approve before then, or it must be proposed again)\n"
              f"*Approvers ({esc(cs.domain)}):* {esc(_list(cs.approvers))}")
    how = (f"*How to approve*\n"
           f"1. <{esc(url)}|Open the Launchpad of {esc(job_name)}> and launch with:\n"
           f"```{esc(launchpad_config(cs.id, approvers[0]))}```\n"
           f"2. Or run:\n```{esc(chr(10).join(commands))}```\n"
           f"Only a listed approver can approve; the proposer ({esc(cs.proposer)}) cannot. "
           f"Add `--reject` to reject.")
    blocks = [
        _header(f"Approval needed: change set {cs.id}"),
        _section(summary),
        _section(radius),
        _section(timing),
        _section(how),
        _context(f"version `{esc(cs.version)}` · proposed by {esc(cs.proposer)} · undo: {esc(clip(cs.undo, 300)) or 'n/a'}"),
    ]
    text = (f"Approval needed for change set {cs.id} on {asset}: {cs.summary}. "
            f"Expires {expires}. Approve in the Launchpad: {url} or run: {commands[0]}")
    return SlackMessage(text=text, blocks=blocks)


def page_annotated_message(incident_id: str, vendor: str, note: str, *, page_url: str | None = None) -> SlackMessage:
    """"Page annotated": which incident, which paging service, the note (cause, blast radius)."""
    link = f" (<{mrkdwn_escape(page_url)}|open the page>)" if page_url else ""
    blocks = [
        _section(f"*Page annotated* on {mrkdwn_escape(vendor)} for incident `{mrkdwn_escape(incident_id)}`{link}"),
        _section(f"```{mrkdwn_escape(clip(note, SECTION_TEXT_MAX - 10))}```"),
    ]
    return SlackMessage(text=f"Page for incident {incident_id} annotated on {vendor}: {clip(note, 500)}", blocks=blocks)


def resolved_message(incident_id: str, receipts: Sequence[Receipt], receipt_url: str | None) -> SlackMessage:
    """"Resolved with receipt": per asset, the change set, approver, partitions and verification."""
    lines = [f"*Resolved* incident `{mrkdwn_escape(incident_id)}`: repaired, verified, receipts written."]
    if receipt_url:
        lines.append(f"<{mrkdwn_escape(receipt_url)}|Read the receipt>")
    for r in receipts[:20]:
        lines.append(f"• `{mrkdwn_escape('/'.join(r.asset_key))}`: change set `{mrkdwn_escape(r.change_set_id)}`, "
                     f"approved by {mrkdwn_escape(r.approver)}, partitions {mrkdwn_escape(_list(r.partitions))}, "
                     f"verified {'yes' if r.verified else 'NO'}")
    text = f"Incident {incident_id} resolved with {len(receipts)} receipt(s)" + (f": {receipt_url}" if receipt_url else "")
    return SlackMessage(text=text, blocks=[_section("\n".join(lines))])


__all__ = [
    "APPROVAL_JOB_NAME",
    "SlackMessage",
    "SlackResource",
    "approval_request_message",
    "approve_command",
    "launchpad_config",
    "launchpad_url",
    "mrkdwn_escape",
    "page_annotated_message",
    "resolved_message",
    "utc_text",
]
