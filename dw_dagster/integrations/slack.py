"""Ask for an approval in Slack: ``chat.postMessage`` over the Web API, and the messages dw_dagster sends.

:class:`SlackResource` posts with a bot token (``Authorization: Bearer xoxb-...``) to
``https://slack.com/api/chat.postMessage`` (Slack API docs, "chat.postMessage"): a JSON body
``{channel, text, blocks?}``; the answer is HTTP 200 with ``{"ok": true, "channel", "ts",
"message"}`` or ``{"ok": false, "error": "<code>"}`` (HTTP 429 with ``Retry-After`` when rate
limited, Slack docs "Rate limits"). ``ok: false`` becomes an :class:`~dw_dagster.core.http.HttpApiError`
naming the Slack error code.

**Exactly once.** ``chat.postMessage`` is not idempotent: a repeated call posts a second
message. With an idempotency ``ref`` (``dw:<task>:<step>``) the message carries it as Slack
message metadata (Slack docs "Using message metadata"; chat.postMessage ``metadata`` argument:
``{"event_type": "dw_dagster_notification", "event_payload": {"ref": ...}}``), is never re-sent
blindly after a timeout or a 5xx, and before it is sent again the channel is read back with
``conversations.history`` (``include_all_metadata=true``, paged with ``cursor``, bounded by
``oldest``; Slack API docs "conversations.history", "Pagination") for a message whose metadata
holds that ref (:func:`~dw_dagster.core.http.post_once`). Reading history needs the
``channels:history`` scope (``groups:history`` for private channels) and a channel ID; Slack
rate-limits ``conversations.history`` (Tier 3, much lower for apps not in the Marketplace), so
the look-up runs only when an earlier attempt may have been applied, unless
``check_history_first`` is set.

Message builders return a :class:`SlackMessage` (Block Kit ``header``/``section``/``context``
blocks with ``mrkdwn`` text, plus the plain ``text`` fallback Slack shows in notifications):

- :func:`approval_request_message`: a change set's summary, blast radius, expiry (UTC), the
  **Approve / Reject buttons** (an ``actions`` block, Slack docs "Actions block", "Button
  element": ``action_id`` ``dw_approve`` / ``dw_reject``, ``value`` ``{"cs": id, "v": version}``
  so a click decides on the version the owner read; handled by ``dw-dagster approvals serve``,
  :mod:`dw_dagster.approval.server`), and the other ways to decide: ``dw-dagster approve <id>
  --login``, the Launchpad of the approval job (:func:`launchpad_url`) and the exact
  ``dw-dagster approve <id> --approver <email>`` command;
- :func:`page_annotated_message` and :func:`resolved_message` for the paging loop.

Block Kit limits kept here (Slack docs "Blocks → Section block", "Header block", "Button
element", "Confirmation dialog object"): at most 50 blocks, section text ≤ 3000 characters,
header text ≤ 150 (plain_text); button text ≤ 75, ``value`` ≤ 2000; a confirmation dialog's
title ≤ 100, text ≤ 300, confirm/deny ≤ 30; message ``text`` ≤ 40000.
"""

import dataclasses
import datetime as dt
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import Field

from dw_dagster.approval.identity.slack import APPROVE_ACTION, REJECT_ACTION, button_value
from dw_dagster.core import keys as c
from dw_dagster.core.http import HttpApiError
from dw_dagster.core.models import BlastRadius, ChangeSet, Receipt
from dw_dagster.integrations.paging import _VendorResource, clip, exposure_label
from dw_dagster.dagster_private import public

APPROVAL_JOB_NAME = c.APPROVAL_JOB
APPROVAL_OP_NAME = c.APPROVAL_OP  # the approval job's one op (its Launchpad config key)
DEFAULT_REPOSITORY = "__repository__"  # the repository name Dagster gives a Definitions object

SECTION_TEXT_MAX = 3000
HEADER_TEXT_MAX = 150
MESSAGE_TEXT_MAX = 40000
#: ``metadata.event_type`` of dw_dagster's messages (Slack: "an alphanumeric string", lower case
#: with underscores recommended in "Designing metadata event schema").
METADATA_EVENT_TYPE = "dw_dagster_notification"
#: Messages per ``conversations.history`` page (Slack recommends no more than 200).
HISTORY_PAGE = 200
_CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]{2,}")

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
    "missing_scope": "the bot token lacks a scope this method needs",
    "invalid_metadata_format": "Slack rejected the message metadata",
    "invalid_cursor": "the pagination cursor is not valid",
}


@dataclass(frozen=True)
class SlackMessage:
    """One Slack message: the plain ``text`` fallback, Block Kit ``blocks`` and optional ``metadata``.

    ``metadata`` is Slack message metadata, ``{"event_type", "event_payload"}`` (not shown to
    people; read back with ``conversations.history`` and ``include_all_metadata``).
    """

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] | None = None

    def payload(self, channel: str) -> dict[str, Any]:
        """The ``chat.postMessage`` JSON body for ``channel``."""
        body: dict[str, Any] = {"channel": channel, "text": clip(self.text, MESSAGE_TEXT_MAX)}
        if self.blocks:
            body["blocks"] = self.blocks[:50]
        if self.metadata:
            body["metadata"] = self.metadata
        return body


def ref_metadata(ref: str) -> dict[str, Any]:
    """The message metadata that carries an idempotency marker: ``{"event_type", "event_payload": {"ref"}}``."""
    return {"event_type": METADATA_EVENT_TYPE, "event_payload": {"ref": ref}}


def message_ref(message: Any) -> str | None:
    """The idempotency marker in a message's metadata (as ``conversations.history`` returns it), or None."""
    md = message.get("metadata") if isinstance(message, dict) else None
    if not isinstance(md, dict) or md.get("event_type") != METADATA_EVENT_TYPE:
        return None
    ref = (md.get("event_payload") or {}).get("ref") if isinstance(md.get("event_payload"), dict) else None
    return ref if isinstance(ref, str) else None


@public
class SlackResource(_VendorResource):
    """Slack Web API with a bot token (``bot_token=dg.EnvVar("SLACK_BOT_TOKEN")``, ``xoxb-...``).

    The bot needs the ``chat:write`` scope and membership of the channel; to look for an earlier
    message before posting again (see the module docstring) also ``channels:history``
    (``groups:history`` for a private channel), and the channel must be given by its ID.
    """

    bot_token: str = Field(description="bot token, xoxb-...")
    base_url: str = Field(default="https://slack.com/api", description="Web API base URL")
    default_channel: str | None = Field(default=None, description="channel ID (C...) used when none is given")
    check_history_first: bool = Field(
        default=False, description="look for a message's ref in the channel history before every first post "
        "(needs channels:history), not only after an attempt that may have been applied")
    history_lookback_s: float = Field(default=7 * 86400.0,
                                      description="how far back a ref is looked for when no 'oldest' is given, seconds")

    def _secrets(self) -> list[str]:
        return [self.bot_token]

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.bot_token}", "Content-Type": "application/json; charset=utf-8"}

    def _answer(self, response: httpx.Response, method: str, endpoint: str) -> dict[str, Any]:
        """Slack's JSON answer, or :class:`HttpApiError` for ``ok: false`` (code, hint, details)."""
        body = self._json(response, "slack", method)
        if not isinstance(body, dict):
            raise HttpApiError("slack", method, endpoint, response.status_code, "response is not a JSON object")
        if body.get("ok") is not True:
            code = str(body.get("error") or "unknown_error")
            extra = body.get("errors") or (body.get("response_metadata") or {}).get("messages") or []
            detail = f"Slack error {code!r}" + (f" ({_HINTS[code]})" if code in _HINTS else "")
            if code == "missing_scope" and body.get("needed"):
                detail += f": needs {body['needed']}"
            if extra:
                detail += ": " + "; ".join(str(x) for x in extra)[:200]
            raise self._redact(HttpApiError("slack", method, endpoint, response.status_code, detail))
        return body

    def post_message(self, message: SlackMessage | str, *, channel: str | None = None, ref: str | None = None,
                     check_first: bool | None = None, oldest: float | None = None) -> dict[str, Any]:
        """``chat.postMessage``; return Slack's answer (``{"ok": true, "channel", "ts", "message"}``).

        Args:
            message: a :class:`SlackMessage`, or plain text.
            channel: channel ID (``C...``) or name; default ``default_channel``. A look-up for
                ``ref`` needs the ID.
            ref: idempotency marker ``dw:<task>:<step>``, sent as message metadata; the message is
                posted at most once per ``ref`` (never re-sent blindly; looked for in the channel
                history after an attempt that may have been applied).
            check_first: look for ``ref`` before the first post too (a retry on a later tick);
                None: ``check_history_first``.
            oldest: the earliest time (epoch seconds) the message can have been posted, bounding
                the history read (default: ``history_lookback_s`` ago).

        Returns:
            Slack's answer; when a message with ``ref`` was already in the channel, nothing is
            posted and the answer is ``{"ok": true, "channel", "ts", "message", "deduplicated": true}``.

        Raises:
            ValueError: no channel given and no ``default_channel``; or a look-up was needed and
                the channel is a name, not an ID.
            HttpApiError: ``ok: false`` (status 200, the Slack error code and a hint in the
                message), 429 still rate limited after retries (``Retry-After`` honoured), a 5xx
                or a timeout (not re-sent: ``maybe_applied``), the history look-up's failure
                (``missing_scope`` names the scope). Never contains the token.
        """
        channel = channel or self.default_channel
        if not channel:
            raise ValueError("no Slack channel: pass channel= or set default_channel")
        msg = message if isinstance(message, SlackMessage) else SlackMessage(text=message)
        if ref is not None:
            msg = dataclasses.replace(msg, metadata=ref_metadata(ref))
        url = f"{self.base_url.rstrip('/')}/chat.postMessage"
        endpoint = httpx.URL(url).path

        def post() -> dict[str, Any]:
            with httpx.Client(headers=self._headers()) as client:
                response = self._send(client, "slack", "POST", url, idempotent=False, json=msg.payload(channel))
            return self._answer(response, "POST", endpoint)

        def find() -> dict[str, Any] | None:
            found = self.find_message(channel, ref, oldest=oldest)
            return None if found is None else {"ok": True, "channel": channel, "ts": found.get("ts"),
                                               "message": found, "deduplicated": True}

        check = self.check_history_first if check_first is None else check_first
        answer, _ = self._post_once(post, find if ref is not None else None, bool(check))
        return answer

    def history(self, channel: str, *, oldest: float | None = None, latest: float | None = None,
                cursor: str | None = None, limit: int = HISTORY_PAGE) -> dict[str, Any]:
        """One page of ``conversations.history`` with ``include_all_metadata=true``.

        Returns:
            Slack's answer: ``{"ok": true, "messages": [...] (newest first), "has_more",
            "response_metadata": {"next_cursor"}}``.

        Raises:
            ValueError: ``channel`` is not a channel ID.
            HttpApiError: ``ok: false`` (``missing_scope``, ``channel_not_found``,
                ``invalid_cursor`` ...), 429 after retries, 5xx, timeouts.
        """
        if not _CHANNEL_ID.fullmatch(channel):
            raise ValueError(f"conversations.history needs a channel ID (C..., G...), got {channel!r}")
        url = f"{self.base_url.rstrip('/')}/conversations.history"
        params: dict[str, Any] = {"channel": channel, "include_all_metadata": "true", "limit": limit}
        if oldest is not None:
            params["oldest"] = f"{oldest:.6f}"
        if latest is not None:
            params["latest"] = f"{latest:.6f}"
        if cursor:
            params["cursor"] = cursor
        with httpx.Client(headers={"Authorization": f"Bearer {self.bot_token}"}) as client:
            response = self._send(client, "slack", "GET", url, params=params)
        return self._answer(response, "GET", httpx.URL(url).path)

    def find_message(self, channel: str, ref: str, *, oldest: float | None = None,
                     max_pages: int = 50) -> dict[str, Any] | None:
        """The message in ``channel`` whose metadata carries ``ref``, or None.

        Reads ``conversations.history`` newest first from now back to ``oldest`` (default
        ``history_lookback_s`` ago), following ``response_metadata.next_cursor``.

        Raises:
            ValueError: ``channel`` is not a channel ID.
            HttpApiError: a history page failed, or ``max_pages`` pages were read without reaching
                ``oldest`` (the answer would be a guess).
        """
        since = oldest if oldest is not None else time.time() - self.history_lookback_s
        cursor: str | None = None
        for _ in range(max(1, max_pages)):
            page = self.history(channel, oldest=since, cursor=cursor)
            for m in page.get("messages") or []:
                if message_ref(m) == ref:
                    return m
            cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
            if not page.get("has_more"):
                return None
            if not cursor:  # more messages, but no way to read them: "not found" would be a guess
                raise HttpApiError("slack", "GET", "/api/conversations.history", 200,
                                   f"the history says has_more but gives no next_cursor; cannot tell whether {ref} "
                                   "was posted")
        raise HttpApiError("slack", "GET", "/api/conversations.history", 200,
                           f"read {max_pages} pages without reaching oldest={since:.0f}; cannot tell whether "
                           f"{ref} was posted")


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


def launchpad_config(change_set_id: str, approver: str | None = None) -> str:
    """The approval job's Launchpad run config (YAML) for one change set: the ID token line is to be
    filled with the output of ``dw-dagster approvals token <id>`` (a token bound to this decision;
    ``approver`` is not part of it: a typed email proves nothing)."""
    return (f"ops:\n  {APPROVAL_OP_NAME}:\n    config:\n      change_set_id: {change_set_id}\n"
            f"      decision: approve\n      id_token: PASTE-FROM-dw-dagster-approvals-token-{change_set_id}")


def decision_buttons(cs: ChangeSet) -> dict[str, Any]:
    """The ``actions`` block with the Approve / Reject buttons of a change set version.

    Each button's ``value`` is :func:`~dw_dagster.approval.identity.slack.button_value` (the id and the
    version shown), and each asks for confirmation first (a Block Kit confirmation dialog).
    """
    value = button_value(cs.id, cs.version)

    def button(action_id: str, label: str, style: str, verb: str) -> dict[str, Any]:
        return {"type": "button", "action_id": action_id, "style": style, "value": value,
                "text": {"type": "plain_text", "text": label, "emoji": False},
                "confirm": {"title": {"type": "plain_text", "text": clip(f"{label} change set {cs.id}?", 100)},
                            "text": {"type": "mrkdwn", "text": clip(
                                f"{verb} version `{cs.version[:12]}` of change set `{mrkdwn_escape(cs.id)}`: "
                                f"{mrkdwn_escape(cs.summary)}", 300)},
                            "confirm": {"type": "plain_text", "text": label},
                            "deny": {"type": "plain_text", "text": "Cancel"},
                            "style": style}}

    return {"type": "actions", "block_id": clip(f"dw_decide:{cs.id}", 255), "elements": [
        button(APPROVE_ACTION, "Approve", "primary", "Approve"),
        button(REJECT_ACTION, "Reject", "danger", "Reject (ends this version)"),
    ]}


def login_command(change_set_id: str, *, dagster_home: str | None = None) -> str:
    """``dw-dagster approve <id> --login [--dagster-home DIR]``: decide from a terminal as a verified person."""
    parts = ["dw-dagster", "approve", change_set_id, "--login"]
    if dagster_home:
        parts += ["--dagster-home", dagster_home]
    return shlex.join(parts)


def _access_lines(cs: ChangeSet) -> str | None:
    """The summary of an access change set (:mod:`dw_dagster.access`): for whom, until when, what opens."""
    from dw_dagster.approval.access_view import access_request_of

    req = access_request_of(cs)
    if req is None:
        return None
    esc = mrkdwn_escape
    e, spec = req["dry_run"]["engine"], req["spec"]
    opens = [f"{x['privilege']} on {x['table']}" + (f" ({', '.join(x['columns'])})" if not x.get("table_level") else "")
             for x in e["newly_reachable"]] + [f"{x['privilege']} on {x['table']} through {x['how']}"
                                               for x in e.get("also_reachable", [])]
    sensitive = [f"{x['table']}.{x['column']} ({x['category']})" for x in req["dry_run"]["sensitive"]]
    return (f"*{esc(cs.summary)}*\n*Access for:* {esc(spec['grantee_email'])}   *Asked by:* {esc(req['requester'])}\n"
            f"*Why:* {esc(spec['why'])}\n*Until:* {esc(req['expires_at'])} (revoked then)\n"
            f"*Opens:* {esc(_list(opens))}\n*Sensitive columns:* {esc(_list(sensitive))}")


@public
def approval_request_message(
    change_set: ChangeSet,
    blast_radius: BlastRadius | None,
    *,
    dagster_url: str,
    location: str,
    job_name: str = APPROVAL_JOB_NAME,
    repository: str = DEFAULT_REPOSITORY,
    dagster_home: str | None = None,
    review_url: str | None = None,
    header: str | None = None,
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
        review_url: the change set's own page on the review site (every version, decision and
            ladder step), linked first when given.
        header: a line above the request (a reminder, an escalation: who asks and why now).

    Returns:
        A :class:`SlackMessage`: header, summary, blast radius, expiry and approvers, the Approve /
        Reject buttons (:func:`decision_buttons`), the other ways to decide (``dw-dagster approve
        <id> --login``, the Launchpad link with its config, and one typed-email CLI command per
        listed approver, at most 5), and a context line with the version and proposer. The
        ``text`` fallback holds the summary, expiry, the ``--login`` command, link and first command.
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
               + "".join(f"*Not run:* {esc(line)}\n" for line in cs.not_run_lines())
               + f"*Rebuild:* {esc(_list(['/'.join(k) for k in cs.rebuild_assets]))}")
    if cs.new_tests:
        summary += f"\n*New tests:* {esc(_list(cs.new_tests))}"
    access = _access_lines(cs)
    if access is not None:  # an access request: what it opens, not a window to rerun
        summary = access
        radius = "*Blast radius*\nthe tables above; the review page lists what reads them"
    elif blast_radius is not None:
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
    login = login_command(cs.id, dagster_home=dagster_home)
    how = (f"*Other ways to decide*\n"
           f"1. In a terminal, logged in at your identity provider:\n```{esc(login)}```\n"
           f"2. <{esc(url)}|Open the Launchpad of {esc(job_name)}> and launch with the token "
           f"`dw-dagster approvals token {esc(cs.id)}` prints (bound to this decision, accepted once):\n"
           f"```{esc(launchpad_config(cs.id, approvers[0]))}```\n"
           f"3. Or run (a typed email counts only in an `identity: unverified` domain):\n"
           f"```{esc(chr(10).join(commands))}```\n"
           f"Only a listed approver can approve; the proposer ({esc(cs.proposer)}) cannot. "
           f"Add `--reject` to reject.")
    blocks = [_header(f"Approval needed: change set {cs.id}")]
    if header:
        blocks.append(_section(f"*{esc(header)}*"))
    if review_url:
        blocks.append(_section(f"<{esc(review_url)}|Open change set {esc(cs.id)} on the review page> "
                               "(every version, decision and escalation step)"))
    blocks += [
        _section(summary),
        _section(radius),
        _section(timing),
        decision_buttons(cs),
        _section(how),
        _context(f"version `{esc(cs.version)}` · proposed by {esc(cs.proposer)} · undo: {esc(clip(cs.undo, 300)) or 'n/a'}"),
    ]
    # the text fallback (what notifications show) is mrkdwn too: text from outside (the summary is
    # built from warehouse or alert data) is escaped there as in the blocks
    text = ((f"{esc(header)} " if header else "") + f"Approval needed for change set {cs.id} (version {cs.version[:12]}) "
            f"on {esc(asset)}: {esc(cs.summary)}. " + (f"Review: {review_url}. " if review_url else "") +
            f"Expires {expires}. Approve or reject with the buttons, or run: {login}; "
            f"or in the Launchpad: {url} or run: {commands[0]}")
    return SlackMessage(text=text, blocks=blocks)


def page_annotated_message(incident_id: str, vendor: str, note: str, *, page_url: str | None = None) -> SlackMessage:
    """"Page annotated": which incident, which paging service, the note (cause, blast radius)."""
    link = f" (<{mrkdwn_escape(page_url)}|open the page>)" if page_url else ""
    blocks = [
        _section(f"*Page annotated* on {mrkdwn_escape(vendor)} for incident `{mrkdwn_escape(incident_id)}`{link}"),
        _section(f"```{mrkdwn_escape(clip(note, SECTION_TEXT_MAX - 10))}```"),
    ]
    return SlackMessage(text=mrkdwn_escape(f"Page for incident {incident_id} annotated on {vendor}: {clip(note, 500)}"),
                        blocks=blocks)


def resolved_message(incident_id: str, receipts: Sequence[Receipt], receipt_url: str | None) -> SlackMessage:
    """"Resolved with receipt": per asset, the change set, approver, partitions and verification."""
    verified = bool(receipts) and all(r.verified for r in receipts)
    head = ("*Resolved* incident `{}`: repaired, verified, receipts written." if verified
            else "*NOT resolved* incident `{}`: the repair did not verify; receipts written.")
    lines = [head.format(mrkdwn_escape(incident_id))]
    if receipt_url:
        lines.append(f"<{mrkdwn_escape(receipt_url)}|Read the receipt>")
    for r in receipts[:20]:
        lines.append(f"• `{mrkdwn_escape('/'.join(r.asset_key))}`: receipt `{mrkdwn_escape(r.id)}` "
                     f"({mrkdwn_escape(r.outcome)}, {'verified' if r.verified else 'NOT verified'}), change set "
                     f"`{mrkdwn_escape(r.change_set_id)}`, approved by {mrkdwn_escape(r.approver)}, partitions "
                     f"{mrkdwn_escape(_list(r.partitions))}")
    text = (f"Incident {incident_id} {'resolved' if verified else 'NOT resolved'} with {len(receipts)} receipt(s)"
            + (f": {receipt_url}" if receipt_url else ""))
    return SlackMessage(text=text, blocks=[_section("\n".join(lines))])


def outcome_message(verdict: Any, incident_id: str, receipt_url: str | None, *,
                    next_steps: Sequence[str] = ()) -> SlackMessage:
    """A repair that resolves nothing (failed, halted, not verified, undone): what happened, the failing
    checks with their SQL and values, and what happens next. ``verdict`` is a
    :class:`~dw_dagster.integrations.outcomes.RepairVerdict`."""
    esc = mrkdwn_escape
    r = verdict.receipt
    head = (f":rotating_light: *{esc(verdict.headline)}* for incident `{esc(incident_id)}` on "
            f"`{esc('/'.join(r.asset_key))}`: {esc(r.outcome)}")
    lines = [head, f"Change set `{esc(r.change_set_id)}` approved by {esc(r.approver_identity or r.approver)}; "
             f"receipt `{esc(r.id)}` is *{'verified' if r.verified else 'NOT verified'}*."]
    if receipt_url:
        lines.append(f"<{esc(receipt_url)}|Read the receipt>")
    blocks = [_section("\n".join(lines))]
    for fc in verdict.checks[:10]:
        values = ", ".join(f"{k}={v}" for k, v in fc.values.items()) or "no values recorded"
        text = f"*Check* `{esc(fc.check)}` on `{esc(fc.asset)}` failed: {esc(clip(values, 1200))}"
        if fc.sql:
            text += f"\n```{esc(clip(fc.sql, 1500))}```"
        blocks.append(_section(text))
    if next_steps:
        blocks.append(_context("The page stays open: " + esc("; ".join(next_steps))))
    text = (esc(f"Incident {incident_id}: {verdict.headline}: {r.outcome}"
                + "".join(f"; check {fc.check} failed" for fc in verdict.checks[:5]))
            + (f". Receipt: {receipt_url}" if receipt_url else ""))
    return SlackMessage(text=text, blocks=blocks)


__all__ = [
    "APPROVAL_JOB_NAME",
    "SlackMessage",
    "SlackResource",
    "approval_request_message",
    "approve_command",
    "decision_buttons",
    "launchpad_config",
    "launchpad_url",
    "login_command",
    "message_ref",
    "mrkdwn_escape",
    "outcome_message",
    "page_annotated_message",
    "ref_metadata",
    "resolved_message",
    "utc_text",
]
