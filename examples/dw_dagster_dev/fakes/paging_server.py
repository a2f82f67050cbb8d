"""A protocol-accurate fake of PagerDuty, Opsgenie and Slack on loopback, in one threaded HTTP server.

Routes (one server, told apart by path, as the real hosts are):

- PagerDuty **Events API v2** (PagerDuty developer docs, "Events API v2 → Send an Alert Event",
  "Overview → Response Codes"): ``POST /v2/enqueue``. Body ``{routing_key, event_action:
  trigger|acknowledge|resolve, dedup_key (≤ 255), payload: {summary (≤ 1024), source, severity:
  critical|error|warning|info, timestamp?, component?, group?, class?, custom_details?}, links?,
  images?, client?, client_url?}``; ``payload`` is required for triggers, ``dedup_key`` for
  acknowledge/resolve. 202 ``{"status": "success", "message": "Event processed", "dedup_key"}``;
  400 ``{"status": "invalid event", "message": "Event object is invalid", "errors": [...]}``
  (also for an unknown routing key). A trigger opens an incident per dedup key (or adds to the
  open one); acknowledge/resolve move it; events for a key with no open incident are dropped
  (still 202), as documented.
- PagerDuty **REST API v2** ("REST API → Authentication", "Errors", "Incidents"): ``Authorization:
  Token token=<token>`` (else 401 ``{"error": {"message", "code": 2006}}``); ``GET /incidents``
  (``incident_key``, ``statuses[]``, ``limit``, ``offset``) → ``{"incidents", "limit",
  "offset", "more", "total"}``; ``GET /incidents/{id}``; ``GET``/``POST /incidents/{id}/notes``
  (POST body ``{"note": {"content"}}``, needs a ``From`` header naming a known user; 201
  ``{"note": {...}}``); unknown incident → 404 ``{"error": {"message": "Not Found", "code": 2100}}``.
- Opsgenie **Alert API** (Opsgenie docs, "Alert API"): ``Authorization: GenieKey <key>`` (else
  401); ``POST /v2/alerts`` (message ≤ 130 required, alias ≤ 512, description ≤ 15000,
  responders/visibleTo of ``{type: team|user|escalation|schedule, id|name|username}``, actions ≤ 10
  of ≤ 50, tags ≤ 20 of ≤ 50, details string→string ≤ 8000 in all, entity ≤ 512, source ≤ 100,
  priority P1..P5, user ≤ 100, note ≤ 25000); ``POST /v2/alerts/{id}/notes`` (note ≤ 25000
  required); ``POST /v2/alerts/{id}/close``; ``identifierType`` = ``id`` (default) | ``tiny`` |
  ``alias``. Each answers 202 ``{"result": "Request will be processed", "took", "requestId"}`` and
  is processed asynchronously in the real service; the outcome is read with ``GET
  /v2/alerts/requests/{requestId}`` → ``{"data": {"success", "isSuccess", "action", "status",
  "alertId", "alias", "processedAt", "integrationId"}, "took", "requestId"}``. Validation errors:
  422 ``{"message", "took", "requestId"}``. A create with the alias of an open alert is
  de-duplicated (``count`` + 1). ``GET /v2/alerts/{id}`` → ``{"data": alert}`` or 404.
  ``GET /v2/alerts/{id}/notes`` ("List Alert Notes": ``identifierType``, ``offset``,
  ``direction`` next|prev, ``limit`` 1..100 (default 100), ``order`` asc|desc (default desc)) →
  ``{"data": [{"note", "owner", "createdAt", "offset"}], "paging": {"first", "next"?},
  "took", "requestId"}``; 404 for an unknown alert.
- Slack **Web API** ``POST /api/chat.postMessage`` (Slack API docs, "chat.postMessage", "Rate
  limits", "Block Kit"): ``Authorization: Bearer <token>``; always HTTP 200, ``{"ok": true,
  "channel", "ts", "message"}`` or ``{"ok": false, "error"}`` with ``not_authed``,
  ``invalid_auth``, ``channel_not_found``, ``no_text``, ``msg_too_long`` (text > 40000),
  ``invalid_blocks`` (more than 50 blocks, unknown block type, section text > 3000, header text >
  150 or not plain_text, ...; with ``errors``), ``invalid_json``, ``invalid_arguments`` (a field of
  the wrong type). ``warning: missing_charset`` when the JSON content type has no charset. 429
  with ``Retry-After`` and ``{"ok": false, "error": "ratelimited"}`` under a rate fault.
  ``metadata`` (Slack docs "Using message metadata") must be an object (or, form-encoded, its
  JSON) with an alphanumeric/underscore ``event_type`` and an object ``event_payload``, else
  ``invalid_metadata_format``; it is kept on the message.
- Slack ``GET``/``POST /api/conversations.history`` (Slack API docs "conversations.history",
  "Pagination"): ``Authorization: Bearer``; ``channel`` (an ID; else ``channel_not_found``),
  ``cursor`` (else ``invalid_cursor``), ``limit`` (default 100, at most 999), ``oldest`` /
  ``latest`` (exclusive unless ``inclusive``), ``include_all_metadata`` (messages carry
  ``metadata`` only then). ``{"ok": true, "messages": [...] newest first, "has_more",
  "pin_count", "response_metadata": {"next_cursor"}}`` (the cursor only while ``has_more``).
  A token without ``channels:history`` (``groups:history`` for ``G...``) gets ``missing_scope``
  with ``needed`` and ``provided``.
- Slack ``GET``/``POST /api/users.info`` (Slack API docs "users.info"): ``Authorization: Bearer``;
  ``user`` (else ``invalid_arguments``; unknown → ``user_not_found``); needs ``users:read`` (else
  ``missing_scope``); ``{"ok": true, "user": {"id", "team_id", "name", "deleted", "real_name",
  "tz", "is_admin", "is_bot", "is_app_user", "updated", "profile": {"real_name", "display_name",
  "email", "team", ...}}}``, ``profile.email`` only with ``users:read.email``. Users are
  configured in :class:`Credentials` (``slack_users``: id → email, name, deleted, is_bot, team_id).
- Slack ``GET``/``POST /api/users.lookupByEmail`` (Slack API docs "users.lookupByEmail"): needs
  ``users:read.email``; ``email`` (else ``invalid_arguments``); an address no active, non-bot member
  has → ``users_not_found``; else ``{"ok": true, "user"}`` as ``users.info``.
- Slack ``POST /api/conversations.open`` (Slack API docs "conversations.open"): form-encoded or JSON
  ``users`` = one user ID; needs ``im:write``; ``user_not_found``, ``user_disabled`` (deleted),
  ``users_list_not_supplied``, ``too_many_users``; answers ``{"ok": true, "no_op", "already_open",
  "channel": {"id": "D..."}}`` with the same ``D...`` id each time for a user. The direct message
  channel can then be posted to (``chat.postMessage``) and read (``conversations.history``, which
  needs ``im:history`` for ``D...`` channels).
- Slack **interactivity** (Slack API docs "Handling user interaction in your Slack apps",
  "block_actions payloads", "Verifying requests from Slack"): the test control ``POST
  /_fake/slack/click`` ``{"channel", "ts", "action_id", "user"}`` clicks a button of a posted
  message: it builds the ``block_actions`` payload (``type``, ``user {id, username, name,
  team_id}``, ``api_app_id``, ``token``, ``container {type: message, message_ts, channel_id,
  is_ephemeral}``, ``trigger_id``, ``team {id, domain}``, ``enterprise``, ``channel {id, name}``,
  ``message`` as stored, ``state``, ``response_url``, ``actions [{type: button, action_id,
  block_id, text, value, style, action_ts}]``), form-encodes it as ``payload=<JSON>``, signs it as
  Slack does (``X-Slack-Request-Timestamp`` = now, ``X-Slack-Signature`` = ``v0=`` + HMAC-SHA256
  hex of ``v0:{timestamp}:{body}`` under the app's signing secret) and POSTs it to the app's
  interactivity request URL; the answer is ``{"status", "body", "payload", "timestamp"}``. Optional
  ``team`` (a click from another workspace, signed the same way), ``age_s`` (a timestamp that many
  seconds old, correctly signed), ``forge: true`` (signed with another secret). ``POST
  /_fake/slack/replay`` sends the last click again byte for byte. ``POST /_fake/slack/app``
  configures ``signing_secret``, ``request_url``, ``team_id``, ``users`` (merged) and ``scopes``.
  Replies the app posts to a click's ``response_url`` (``POST /actions/...``, JSON) are kept
  (``state.slack_responses()``).

Where a vendor does not publish the exact wording of an error, the fake's text is its own; the
status codes and body shapes are the documented ones. The fake enforces the documented length
limits strictly (the real services may truncate some fields instead of rejecting them), so a
client that passes the fake stays within the limits.

Test controls under ``/_fake/``: ``GET /_fake/state`` (incidents, alerts, Opsgenie request
statuses, Slack messages, request log; never credentials), ``POST /_fake/faults`` with
``{"status": 429, "count": 2}``, ``{"status": 500, "count": 1, "path": "/v2/alerts"}``,
``{"delay_s": 2}`` (optional ``path`` prefix, ``method``, ``retry_after`` seconds, ``count`` -1 =
forever), ``DELETE /_fake/faults``, ``POST /_fake/reset``. A fault is applied *before* the request
is handled (the request has no effect) unless it has ``"after_apply": true``: then the request is
handled (the note, message or event lands) and only the answer is delayed (``delay_s``) or
replaced (``status``), the realistic "the client timed out after the server acted" case, e.g.
``{"delay_s": 3, "after_apply": true, "method": "POST", "path": "/api/chat.postMessage"}``. The
same is available in Python on :class:`PagingState` (``server.state``).

Run on its own: ``python -m dw_dagster_dev.fakes.paging_server --port 8766`` prints its base URL on
one line and serves until SIGTERM or SIGINT. Credentials are the ``DEFAULT_*`` constants below
(or ``--routing-key``/``--pagerduty-token``/``--opsgenie-key``/``--slack-token``).
"""

import argparse
import base64
import datetime as dt
import hashlib
import hmac
import json
import secrets
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT_ROUTING_KEY = "R0FAKEDWDAGSTER0ROUTINGKEY000001"  # 32 characters, like a real integration key
DEFAULT_PAGERDUTY_TOKEN = "u+FakePagerDutyRestToken"
DEFAULT_PAGERDUTY_USERS = ("oncall@grocer.example",)
DEFAULT_OPSGENIE_KEY = "a1b2c3d4-0000-4000-8000-fakeopsgenie"
DEFAULT_SLACK_TOKEN = "xoxb-000000000000-000000000000-FakeSlackBotToken"
DEFAULT_SLACK_CHANNELS = {"C0DWAPPROV": "dw-approvals", "C0DATAOPS1": "data-ops"}
DEFAULT_SLACK_SCOPES = ("chat:write", "channels:history", "groups:history", "users:read", "users:read.email",
                        "im:write", "im:history")
DEFAULT_SLACK_TEAM = "T0FAKETEAM"
#: a Slack signing secret is 32 hex digits (Slack app settings, "Basic Information → App Credentials")
DEFAULT_SLACK_SIGNING_SECRET = "8f742231b10e8888abcd99ee01fa5a5d"
DEFAULT_SLACK_USERS: dict[str, dict[str, Any]] = {
    "U0DANAORTZ": {"email": "dana.ortiz@grocer.example", "name": "dana.ortiz", "real_name": "Dana Ortiz"},
    "U0HEADDATA": {"email": "head.of.data@grocer.example", "name": "head.of.data", "real_name": "Robin Okafor"},
}
#: the deprecated verification token Slack still puts in interaction payloads (never to be trusted)
FAKE_VERIFICATION_TOKEN = "FakeVerificationTokenNotASecret"

_PD_SUMMARY_MAX = 1024
_PD_DEDUP_MAX = 255


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _iso(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso_ms(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


# -- request schemas ---------------------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class PdLink(_Strict):
    href: str
    text: str | None = None


class PdImage(_Strict):
    src: str
    href: str | None = None
    alt: str | None = None


class PdPayload(_Strict):
    summary: str = Field(min_length=1, max_length=_PD_SUMMARY_MAX)
    source: str = Field(min_length=1)
    severity: Literal["critical", "error", "warning", "info"]
    timestamp: str | None = None
    component: str | None = None
    group: str | None = None
    class_: str | None = Field(default=None, alias="class")
    custom_details: Any = None

    @field_validator("timestamp")
    @classmethod
    def _iso8601(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError("must be an ISO 8601 timestamp") from None
        return v


class PdEvent(_Strict):
    routing_key: str = Field(min_length=1)
    event_action: Literal["trigger", "acknowledge", "resolve"]
    dedup_key: str | None = Field(default=None, min_length=1, max_length=_PD_DEDUP_MAX)
    payload: PdPayload | None = None
    links: list[PdLink] | None = None
    images: list[PdImage] | None = None
    client: str | None = None
    client_url: str | None = None

    @model_validator(mode="after")
    def _by_action(self) -> "PdEvent":
        if self.event_action == "trigger" and self.payload is None:
            raise ValueError("'payload' is required for trigger events")
        if self.event_action != "trigger" and not self.dedup_key:
            raise ValueError(f"'dedup_key' is required for {self.event_action} events")
        return self


class PdNote(_Strict):
    content: str = Field(min_length=1)


class PdNoteBody(_Strict):
    note: PdNote


class OgResponder(_Strict):
    type: Literal["team", "user", "escalation", "schedule"]
    id: str | None = None
    name: str | None = None
    username: str | None = None

    @model_validator(mode="after")
    def _identified(self) -> "OgResponder":
        if not (self.id or self.name or self.username):
            raise ValueError("responder must have an id, a name or a username")
        return self


class OgCreate(_Strict):
    message: str = Field(min_length=1, max_length=130)
    alias: str | None = Field(default=None, max_length=512)
    description: str | None = Field(default=None, max_length=15000)
    responders: list[OgResponder] | None = Field(default=None, max_length=50)
    visibleTo: list[OgResponder] | None = Field(default=None, max_length=50)
    actions: list[str] | None = Field(default=None, max_length=10)
    tags: list[str] | None = Field(default=None, max_length=20)
    details: dict[str, str] | None = None
    entity: str | None = Field(default=None, max_length=512)
    source: str | None = Field(default=None, max_length=100)
    priority: Literal["P1", "P2", "P3", "P4", "P5"] = "P3"
    user: str | None = Field(default=None, max_length=100)
    note: str | None = Field(default=None, max_length=25000)

    @field_validator("actions", "tags")
    @classmethod
    def _short_items(cls, v: list[str] | None) -> list[str] | None:
        for item in v or []:
            if len(item) > 50:
                raise ValueError("items can not be longer than 50 characters")
        return v

    @field_validator("details")
    @classmethod
    def _details_size(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v and sum(len(k) + len(x) for k, x in v.items()) > 8000:
            raise ValueError("can not be longer than 8000 characters in total")
        return v


class OgNote(_Strict):
    note: str = Field(min_length=1, max_length=25000)
    user: str | None = Field(default=None, max_length=100)
    source: str | None = Field(default=None, max_length=100)


class OgClose(_Strict):
    note: str | None = Field(default=None, max_length=25000)
    user: str | None = Field(default=None, max_length=100)
    source: str | None = Field(default=None, max_length=100)


class SlackText(_Strict):
    type: Literal["mrkdwn", "plain_text"]
    text: str = Field(min_length=1, max_length=3000)
    emoji: bool | None = None
    verbatim: bool | None = None


def _plain(limit: int) -> type:
    class Plain(_Strict):
        model_config = ConfigDict(extra="forbid", strict=True)
        type: Literal["plain_text"]
        text: str = Field(min_length=1, max_length=limit)
        emoji: bool | None = None
    return Plain


class SlackConfirm(_Strict):
    """A confirmation dialog object (Slack docs "Confirmation dialog object")."""

    model_config = ConfigDict(extra="forbid", strict=True)
    title: _plain(100)  # type: ignore[valid-type]
    text: SlackText
    confirm: _plain(30)  # type: ignore[valid-type]
    deny: _plain(30)  # type: ignore[valid-type]
    style: Literal["primary", "danger"] | None = None

    @field_validator("text")
    @classmethod
    def _short(cls, v: SlackText) -> SlackText:
        if len(v.text) > 300:
            raise ValueError("a confirmation dialog's text can be at most 300 characters")
        return v


class SlackButton(_Strict):
    """A button element (Slack docs "Button element")."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["button"]
    text: _plain(75)  # type: ignore[valid-type]
    action_id: str | None = Field(default=None, min_length=1, max_length=255)
    value: str | None = Field(default=None, max_length=2000)
    url: str | None = Field(default=None, max_length=3000)
    style: Literal["primary", "danger"] | None = None
    confirm: SlackConfirm | None = None
    accessibility_label: str | None = Field(default=None, max_length=75)


class SlackBlock(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["section", "header", "divider", "context", "actions", "image", "rich_text", "input", "file", "video"]
    block_id: str | None = Field(default=None, max_length=255)
    text: SlackText | None = None
    fields: list[SlackText] | None = Field(default=None, max_length=10)
    elements: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _by_type(self) -> "SlackBlock":
        if self.type == "section" and self.text is None and not self.fields:
            raise ValueError("a section block needs text or fields")
        if self.type == "header":
            if self.text is None or self.text.type != "plain_text" or len(self.text.text) > 150:
                raise ValueError("a header block needs plain_text text of at most 150 characters")
        if self.type == "context":
            if not self.elements or len(self.elements) > 10:
                raise ValueError("a context block needs 1 to 10 elements")
        if self.type == "actions":
            if not self.elements or len(self.elements) > 25:
                raise ValueError("an actions block needs 1 to 25 elements")
            ids = [e.get("action_id") for e in self.elements if e.get("action_id")]
            if len(ids) != len(set(ids)):
                raise ValueError("action_id values must be unique within a block")
            for e in self.elements:
                if e.get("type") == "button":
                    SlackButton.model_validate(e)
        for f in self.fields or []:
            if len(f.text) > 2000:
                raise ValueError("section fields can be at most 2000 characters")
        return self


class SlackPost(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    channel: str = Field(min_length=1)
    text: str | None = None
    blocks: list[dict[str, Any]] | None = None
    thread_ts: str | None = None
    mrkdwn: bool | None = None
    unfurl_links: bool | None = None
    unfurl_media: bool | None = None
    metadata: Any = None


class SlackMetadata(_Strict):
    """chat.postMessage ``metadata`` (Slack docs "Using message metadata")."""

    model_config = ConfigDict(extra="forbid", strict=True)

    event_type: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_]+$")
    event_payload: dict[str, Any]


def _messages(e: ValidationError) -> list[str]:
    out = []
    for err in e.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        out.append(f"'{where}' {msg}" if where else msg)
    return out


# -- state and faults --------------------------------------------------------------------------

@dataclass
class Fault:
    """One switchable fault: ``count`` responses (−1 = all) on paths starting with ``path``.

    ``method`` limits it to one HTTP method. With ``after_apply`` the request is handled first
    (its effect stays) and only the answer is delayed by ``delay_s`` and/or replaced by ``status``.
    """

    status: int | None = None
    count: int = 1
    delay_s: float = 0.0
    path: str = ""
    retry_after: float | None = None
    body: Any = None
    after_apply: bool = False
    method: str | None = None


@dataclass
class Credentials:
    """What the fake accepts: routing keys, REST tokens and users, Opsgenie keys, Slack tokens and channels."""

    routing_keys: set[str] = field(default_factory=lambda: {DEFAULT_ROUTING_KEY})
    pagerduty_tokens: set[str] = field(default_factory=lambda: {DEFAULT_PAGERDUTY_TOKEN})
    pagerduty_users: set[str] = field(default_factory=lambda: set(DEFAULT_PAGERDUTY_USERS))
    opsgenie_keys: set[str] = field(default_factory=lambda: {DEFAULT_OPSGENIE_KEY})
    slack_tokens: set[str] = field(default_factory=lambda: {DEFAULT_SLACK_TOKEN})
    slack_channels: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_SLACK_CHANNELS))
    slack_scopes: set[str] = field(default_factory=lambda: set(DEFAULT_SLACK_SCOPES))
    slack_team_id: str = DEFAULT_SLACK_TEAM
    slack_signing_secret: str = DEFAULT_SLACK_SIGNING_SECRET
    slack_users: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_SLACK_USERS.items()})
    slack_request_url: str | None = None


class PagingState:
    """Everything the fake remembers, guarded by one lock. Tests read it through the accessors."""

    def __init__(self, credentials: Credentials | None = None) -> None:
        self.credentials = credentials or Credentials()
        self.lock = threading.RLock()
        self.base_url = ""  # set by the server once it knows its port (response_url of clicks)
        self.reset()

    def reset(self) -> None:
        """Forget incidents, alerts, messages, faults and the request log (credentials stay)."""
        with self.lock:
            self.pd_incidents: list[dict[str, Any]] = []
            self.pd_events: list[dict[str, Any]] = []
            self.og_alerts: list[dict[str, Any]] = []
            self.og_requests: dict[str, dict[str, Any]] = {}
            self.slack: dict[str, list[dict[str, Any]]] = {}
            self.slack_replies: list[dict[str, Any]] = []
            self.last_click: dict[str, Any] | None = None
            self.requests: list[dict[str, Any]] = []
            self.faults: list[Fault] = []
            self._seq = 0

    def next_seq(self) -> int:
        with self.lock:
            self._seq += 1
            return self._seq

    # faults
    def add_fault(self, status: int | None = None, count: int = 1, delay_s: float = 0.0, path: str = "",
                  retry_after: float | None = None, body: Any = None, after_apply: bool = False,
                  method: str | None = None) -> None:
        """Queue a fault: the next ``count`` matching requests get ``status`` (after ``delay_s``).

        Args:
            status: the status answered instead (None: the real answer, only delayed).
            count: how many requests it hits (−1 = all).
            delay_s: seconds to wait before answering.
            path: path prefix it applies to ("" = all).
            retry_after: ``Retry-After`` seconds sent with it (429 gets 1 by default).
            body: the body answered with ``status`` (default: the vendor's error shape).
            after_apply: handle the request first (its effect stays), then delay or fail the answer.
            method: only requests with this HTTP method.
        """
        with self.lock:
            self.faults.append(Fault(status, count, delay_s, path, retry_after, body, after_apply,
                                     method.upper() if method else None))

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def take_fault(self, path: str, method: str | None = None) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if (path.startswith(f.path) and f.count != 0
                        and (f.method is None or method is None or f.method == method.upper())):
                    if f.count > 0:
                        f.count -= 1
                    return f
            self.faults = [f for f in self.faults if f.count != 0]
            return None

    # accessors
    def pagerduty_incidents(self, dedup_key: str | None = None) -> list[dict[str, Any]]:
        """Incidents (oldest first), optionally only those with ``incident_key == dedup_key``."""
        with self.lock:
            return [json.loads(json.dumps(i)) for i in self.pd_incidents
                    if dedup_key is None or i["incident_key"] == dedup_key]

    def opsgenie_alerts(self, alias: str | None = None) -> list[dict[str, Any]]:
        """Alerts (oldest first), optionally only those with ``alias``."""
        with self.lock:
            return [json.loads(json.dumps(a)) for a in self.og_alerts if alias is None or a["alias"] == alias]

    def opsgenie_request(self, request_id: str) -> dict[str, Any] | None:
        with self.lock:
            r = self.og_requests.get(request_id)
            return dict(r) if r else None

    def slack_messages(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Messages posted (oldest first), to one channel ID or to all; each has ``channel``."""
        with self.lock:
            chans = [channel] if channel else list(self.slack)
            return [json.loads(json.dumps(m)) for c in chans for m in self.slack.get(c, [])]

    def slack_responses(self) -> list[dict[str, Any]]:
        """What the app posted to clicks' ``response_url`` (oldest first): ``{path, body}``."""
        with self.lock:
            return json.loads(json.dumps(self.slack_replies))

    def configure_slack(self, *, signing_secret: str | None = None, request_url: str | None = None,
                        team_id: str | None = None, users: dict[str, dict[str, Any]] | None = None,
                        scopes: Iterable[str] | None = None) -> None:
        """Set the Slack app's signing secret, interactivity request URL, workspace, users (merged by
        id: ``{"email", "name"?, "real_name"?, "deleted"?, "is_bot"?, "team_id"?}``) or bot scopes."""
        cr = self.credentials
        with self.lock:
            if signing_secret is not None:
                cr.slack_signing_secret = signing_secret
            if request_url is not None:
                cr.slack_request_url = request_url
            if team_id is not None:
                cr.slack_team_id = team_id
            for uid, u in (users or {}).items():
                cr.slack_users[uid] = dict(u)
            if scopes is not None:
                cr.slack_scopes = set(scopes)

    def opsgenie_notes(self, alias: str) -> list[dict[str, Any]]:
        """The notes of the (open, else newest) alert with ``alias``, oldest first; [] when none."""
        with self.lock:
            alert = _og_find(self, alias, "alias")
            return json.loads(json.dumps(alert["notes"])) if alert else []

    def request_log(self, path_prefix: str = "") -> list[dict[str, Any]]:
        """``{method, path, status}`` of every request served (faulted ones included)."""
        with self.lock:
            return [dict(r) for r in self.requests if r["path"].startswith(path_prefix)]

    def snapshot(self) -> dict[str, Any]:
        """The whole state as JSON-able data (``GET /_fake/state``)."""
        with self.lock:
            return {
                "pagerduty": {"incidents": self.pagerduty_incidents(), "events": json.loads(json.dumps(self.pd_events))},
                "opsgenie": {"alerts": self.opsgenie_alerts(), "requests": json.loads(json.dumps(self.og_requests))},
                "slack": {"messages": {c: json.loads(json.dumps(ms)) for c, ms in self.slack.items()},
                          "responses": self.slack_responses()},
                "requests": self.request_log(),
                "faults": [f.__dict__ for f in self.faults],
            }


# -- vendor logic ------------------------------------------------------------------------------

Reply = tuple[int, Any, dict[str, str]]


def _pd_invalid(errors: list[str]) -> Reply:
    return 400, {"status": "invalid event", "message": "Event object is invalid", "errors": errors}, {}


def _pd_rest_error(status: int, message: str, code: int, errors: list[str] | None = None) -> Reply:
    body: dict[str, Any] = {"error": {"message": message, "code": code}}
    if errors:
        body["error"]["errors"] = errors
    return status, body, {}


def _pd_id() -> str:
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
    return "Q" + "".join(secrets.choice(alphabet) for _ in range(13))


def pd_enqueue(state: PagingState, raw: Any) -> Reply:
    if not isinstance(raw, dict):
        return _pd_invalid(["Event object must be a JSON object"])
    if raw.get("routing_key") not in state.credentials.routing_keys:
        return _pd_invalid(["Invalid routing key"] if raw.get("routing_key") else ["'routing_key' is missing"])
    try:
        event = PdEvent.model_validate(raw)
    except ValidationError as e:
        return _pd_invalid(_messages(e))
    now = _now()
    with state.lock:
        key = event.dedup_key or uuid.uuid4().hex
        record = {k: v for k, v in raw.items() if k != "routing_key"}
        record["dedup_key"] = key
        record["received_at"] = _iso(now)
        state.pd_events.append(record)
        open_ = [i for i in state.pd_incidents if i["incident_key"] == key and i["status"] != "resolved"]
        if event.event_action == "trigger":
            p = event.payload
            assert p is not None
            if open_:
                open_[-1]["alert_counts"]["triggered"] += 1
                open_[-1]["updated_at"] = _iso(now)
            else:
                n = len(state.pd_incidents) + 1
                pid = _pd_id()
                state.pd_incidents.append({
                    "id": pid, "type": "incident", "incident_number": n, "title": p.summary,
                    "summary": f"[#{n}] {p.summary}", "status": "triggered", "incident_key": key,
                    "urgency": "high" if p.severity in ("critical", "error") else "low", "severity": p.severity,
                    "source": p.source, "custom_details": p.custom_details,
                    "links": [link.model_dump() for link in event.links or []],
                    "created_at": _iso(now), "updated_at": _iso(now), "resolved_at": None,
                    "alert_counts": {"triggered": 1, "resolved": 0, "all": 1},
                    "html_url": f"https://fake.pagerduty.com/incidents/{pid}", "notes": [],
                })
        elif open_:
            inc = open_[-1]
            inc["status"] = "acknowledged" if event.event_action == "acknowledge" else "resolved"
            inc["updated_at"] = _iso(now)
            if inc["status"] == "resolved":
                inc["resolved_at"] = _iso(now)
        # acknowledge/resolve for a key without an open incident: dropped, still 202 (documented)
    return 202, {"status": "success", "message": "Event processed", "dedup_key": key}, {}


def _pd_public(inc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in inc.items() if k != "notes"}


def pd_rest(state: PagingState, method: str, path: str, query: dict[str, list[str]],
            headers: dict[str, str], raw: Any) -> Reply:
    auth = headers.get("authorization", "")
    token = auth[len("Token token="):] if auth.startswith("Token token=") else None
    if token not in state.credentials.pagerduty_tokens:
        return _pd_rest_error(401, "Authentication failed", 2006)
    parts = [unquote(p) for p in path.strip("/").split("/")]
    with state.lock:
        if method == "GET" and parts == ["incidents"]:
            rows = state.pd_incidents
            if "incident_key" in query:
                rows = [i for i in rows if i["incident_key"] == query["incident_key"][0]]
            statuses = query.get("statuses[]") or query.get("statuses")
            if statuses:
                rows = [i for i in rows if i["status"] in statuses]
            try:
                limit = min(100, int(query.get("limit", ["25"])[0]))
                offset = int(query.get("offset", ["0"])[0])
            except ValueError:
                return _pd_rest_error(400, "Invalid Input Provided", 2001, ["limit and offset must be integers"])
            page = rows[offset:offset + limit]
            return 200, {"incidents": [_pd_public(i) for i in page], "limit": limit, "offset": offset,
                         "more": offset + limit < len(rows), "total": None}, {}
        inc = next((i for i in state.pd_incidents if len(parts) >= 2 and parts[0] == "incidents" and i["id"] == parts[1]), None)
        if len(parts) in (2, 3) and parts[0] == "incidents" and inc is None:
            return _pd_rest_error(404, "Not Found", 2100)
        if method == "GET" and len(parts) == 2:
            return 200, {"incident": _pd_public(inc)}, {}
        if len(parts) == 3 and parts[2] == "notes":
            if method == "GET":
                return 200, {"notes": list(inc["notes"])}, {}
            if method == "POST":
                sender = headers.get("from", "").strip().lower()
                if not sender:
                    return _pd_rest_error(400, "Invalid Input Provided", 2001,
                                          ["A 'From' header with the email of a valid user is required"])
                if sender not in {u.lower() for u in state.credentials.pagerduty_users}:
                    return _pd_rest_error(400, "Requester User Not Found", 1008)
                try:
                    body = PdNoteBody.model_validate(raw)
                except ValidationError as e:
                    return _pd_rest_error(400, "Invalid Input Provided", 2001, _messages(e))
                note = {"id": _pd_id(), "user": {"id": "PUSER01", "type": "user_reference", "summary": sender},
                        "channel": {"summary": "The PagerDuty website or APIs"},
                        "content": body.note.content, "created_at": _iso(_now())}
                inc["notes"].append(note)
                return 201, {"note": note}, {}
    return _pd_rest_error(404, "Not Found", 2100)


def _og(status: int, body: dict[str, Any] | None = None, message: str | None = None) -> tuple[int, Any, dict[str, str], str]:
    rid = str(uuid.uuid4())
    out = dict(body or {})
    if message is not None:
        out["message"] = message
    out.update({"took": 0.004, "requestId": rid})
    return status, out, {}, rid


def _og_error(e: ValidationError) -> str:
    msgs = []
    for err in e.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "Request"
        text = err["msg"].removeprefix("Value error, ")
        if err["type"] == "string_too_long":
            text = f"can not be longer than {err['ctx']['max_length']} characters"
        elif err["type"] == "string_too_short" or err["type"] == "missing":
            text = "can not be empty"
        msgs.append(f"{where[:1].upper()}{where[1:]} {text}.")
    return " ".join(msgs)


def _og_find(state: PagingState, identifier: str, kind: str) -> dict[str, Any] | None:
    key = {"id": "id", "tiny": "tinyId", "alias": "alias"}[kind]
    found = [a for a in state.og_alerts if a[key] == identifier]
    open_ = [a for a in found if a["status"] == "open"]
    return (open_ or found or [None])[-1]


def _og_request_record(state: PagingState, rid: str, action: str, ok: bool, status: str,
                       alert: dict[str, Any] | None, alias: str | None) -> None:
    state.og_requests[rid] = {
        "success": ok, "isSuccess": ok, "action": action, "processedAt": _iso_ms(_now()),
        "integrationId": "00000000-fake-4000-8000-integration0", "status": status,
        "alertId": alert["id"] if alert else "", "alias": alias or (alert["alias"] if alert else ""),
    }


def _og_add_note(state: PagingState, alert: dict[str, Any], note: str, user: str | None, source: str | None,
                 now: dt.datetime) -> None:
    """Append a note; its ``offset`` (the paging key "List Alert Notes" returns) is creation ms + sequence."""
    alert["notes"].append({"note": note, "owner": user or "", "source": source or "", "createdAt": _iso_ms(now),
                           "offset": f"{int(now.timestamp() * 1000)}_{state.next_seq():09d}"})


def _og_list_notes(state: PagingState, identifier: str, kind: str, query: dict[str, list[str]]) -> Reply:
    """``GET /v2/alerts/{id}/notes``: a page of notes after (direction next) or before ``offset``."""
    alert = _og_find(state, identifier, kind)
    if alert is None:
        status, body, h, _ = _og(404, message="Alert does not exist")
        return status, body, h
    order = query.get("order", ["desc"])[0]
    direction = query.get("direction", ["next"])[0]
    if order not in ("asc", "desc") or direction not in ("next", "prev"):
        status, body, h, _ = _og(422, message="order must be asc or desc; direction must be next or prev.")
        return status, body, h
    try:
        limit = int(query.get("limit", ["100"])[0])
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        status, body, h, _ = _og(422, message="Limit should be between 1 and 100.")
        return status, body, h
    notes = sorted(alert["notes"], key=lambda n: n["offset"], reverse=order == "desc")
    offset = query.get("offset", [None])[0]
    if offset is not None:
        keys = [n["offset"] for n in notes]
        if offset not in keys:
            status, body, h, _ = _og(422, message=f"Invalid offset: {offset}")
            return status, body, h
        i = keys.index(offset)
        notes = notes[i + 1:] if direction == "next" else notes[:i][::-1]
    page = notes[:limit]
    data = [{"note": n["note"], "owner": n.get("owner") or n.get("source") or "", "createdAt": n["createdAt"],
             "offset": n["offset"]} for n in page]
    base = f"https://api.opsgenie.com/v2/alerts/{identifier}/notes?identifierType={kind}&limit={limit}&order={order}"
    paging: dict[str, str] = {"first": base + "&direction=next"}
    if len(notes) > limit:
        paging["next"] = f"{base}&offset={page[-1]['offset']}&direction=next"
    status, body, h, _ = _og(200, {"data": data, "paging": paging})
    return status, body, h


def opsgenie(state: PagingState, method: str, path: str, query: dict[str, list[str]],
             headers: dict[str, str], raw: Any) -> Reply:
    auth = headers.get("authorization", "")
    key = auth[len("GenieKey "):] if auth.startswith("GenieKey ") else None
    if key not in state.credentials.opsgenie_keys:
        status, body, h, _ = _og(401, message="Could not authenticate")
        return status, body, h
    parts = [unquote(p) for p in path.strip("/").split("/")]  # v2, alerts, ...
    kind = query.get("identifierType", ["id"])[0]
    if kind not in ("id", "tiny", "alias"):
        status, body, h, _ = _og(422, message=f"Invalid identifierType: {kind}. Use one of [id, tiny, alias].")
        return status, body, h
    now = _now()
    with state.lock:
        if method == "POST" and parts == ["v2", "alerts"]:
            if not isinstance(raw, dict):
                status, body, h, _ = _og(422, message="Request body must be a JSON object.")
                return status, body, h
            try:
                req = OgCreate.model_validate(raw)
            except ValidationError as e:
                status, body, h, _ = _og(422, message=_og_error(e))
                return status, body, h
            status, body, h, rid = _og(202, {"result": "Request will be processed"})
            alias = req.alias or str(uuid.uuid4())
            existing = _og_find(state, alias, "alias")
            if existing is not None and existing["status"] == "open":
                existing["count"] += 1
                existing["updatedAt"] = _iso_ms(now)
                _og_request_record(state, rid, "Create", True, "Alert is de-duplicated", existing, alias)
            else:
                alert = {
                    "id": str(uuid.uuid4()), "tinyId": str(len(state.og_alerts) + 1), "alias": alias,
                    "message": req.message, "description": req.description or "", "status": "open",
                    "acknowledged": False, "isSeen": False, "count": 1, "priority": req.priority,
                    "tags": req.tags or [], "details": req.details or {}, "entity": req.entity or "",
                    "source": req.source or "", "owner": "", "user": req.user or "",
                    "responders": [r.model_dump(exclude_none=True) for r in req.responders or []],
                    "actions": req.actions or [], "createdAt": _iso_ms(now), "updatedAt": _iso_ms(now),
                    "notes": [],
                }
                if req.note:
                    _og_add_note(state, alert, req.note, req.user, req.source, now)
                state.og_alerts.append(alert)
                _og_request_record(state, rid, "Create", True, "Created alert", alert, alias)
            return status, body, h
        if method == "GET" and len(parts) == 4 and parts[:3] == ["v2", "alerts", "requests"]:
            rec = state.og_requests.get(parts[3])
            if rec is None:
                status, body, h, _ = _og(404, message="Request not found. It might not be processed, yet.")
                return status, body, h
            status, body, h, _ = _og(200, {"data": dict(rec)})
            return status, body, h
        if method == "GET" and len(parts) == 4 and parts[:2] == ["v2", "alerts"] and parts[3] == "notes":
            return _og_list_notes(state, parts[2], kind, query)
        if method == "GET" and len(parts) == 3 and parts[:2] == ["v2", "alerts"]:
            alert = _og_find(state, parts[2], kind)
            if alert is None:
                status, body, h, _ = _og(404, message="Alert does not exist")
                return status, body, h
            status, body, h, _ = _og(200, {"data": json.loads(json.dumps(alert))})
            return status, body, h
        if method == "POST" and len(parts) == 4 and parts[:2] == ["v2", "alerts"] and parts[3] in ("notes", "close"):
            model = OgNote if parts[3] == "notes" else OgClose
            try:
                req = model.model_validate(raw if raw is not None else {})
            except ValidationError as e:
                status, body, h, _ = _og(422, message=_og_error(e))
                return status, body, h
            status, body, h, rid = _og(202, {"result": "Request will be processed"})
            alert = _og_find(state, parts[2], kind)
            action = "AddNote" if parts[3] == "notes" else "Close"
            alias = parts[2] if kind == "alias" else None
            if alert is None:
                _og_request_record(state, rid, action, False, "Alert does not exist", None, alias)
            elif parts[3] == "close" and alert["status"] == "closed":
                _og_request_record(state, rid, action, False, "Alert is already closed", alert, alias)
            else:
                if req.note:
                    _og_add_note(state, alert, req.note, req.user, req.source, now)
                if parts[3] == "close":
                    alert["status"] = "closed"
                _og_request_record(state, rid, action, True,
                                   "Added note" if parts[3] == "notes" else "Closed alert", alert, alias)
                alert["updatedAt"] = _iso_ms(now)
            return status, body, h
    status, body, h, _ = _og(404, message="Not found")
    return status, body, h


def _slack_error(error: str, **extra: Any) -> Reply:
    return 200, {"ok": False, "error": error, **extra}, {}


def slack_post(state: PagingState, headers: dict[str, str], raw_bytes: bytes) -> Reply:
    auth = headers.get("authorization", "")
    ctype = headers.get("content-type", "")
    form: dict[str, Any] | None = None
    if ctype.startswith("application/x-www-form-urlencoded"):
        form = {k: v[0] for k, v in parse_qs(raw_bytes.decode("utf-8", "replace")).items()}
    token = auth[len("Bearer "):] if auth.startswith("Bearer ") else (form or {}).get("token")
    if not token:
        return _slack_error("not_authed")
    if token not in state.credentials.slack_tokens:
        return _slack_error("invalid_auth")
    if form is not None:
        raw: Any = dict(form)
        if "blocks" in raw:
            try:
                raw["blocks"] = json.loads(raw["blocks"])
            except ValueError:
                return _slack_error("invalid_blocks_format")
        raw.pop("token", None)
    else:
        try:
            raw = json.loads(raw_bytes or b"{}")
        except ValueError:
            return _slack_error("invalid_json")
    if not isinstance(raw, dict):
        return _slack_error("invalid_arguments")
    if not raw.get("channel"):
        return _slack_error("channel_not_found")
    try:
        post = SlackPost.model_validate(raw)
    except ValidationError as e:
        return _slack_error("invalid_arguments", response_metadata={"messages": [f"[ERROR] {m}" for m in _messages(e)]})
    channels = state.credentials.slack_channels
    name = post.channel.lstrip("#")
    channel_id = post.channel if post.channel in channels else next((c for c, n in channels.items() if n == name), None)
    if channel_id is None:
        return _slack_error("channel_not_found")
    if post.blocks is not None:
        errors = []
        if len(post.blocks) > 50:
            errors.append("no more than 50 items allowed [json-pointer:/blocks]")
        for i, block in enumerate(post.blocks[:50]):
            try:
                SlackBlock.model_validate(block)
            except ValidationError as e:
                errors += [f"{m} [json-pointer:/blocks/{i}]" for m in _messages(e)]
        if errors:
            return _slack_error("invalid_blocks", errors=errors,
                                response_metadata={"messages": [f"[ERROR] {m}" for m in errors]})
    if not post.text and not post.blocks:
        return _slack_error("no_text")
    if post.text and len(post.text) > 40000:
        return _slack_error("msg_too_long")
    metadata = None
    if post.metadata is not None:
        raw_md = post.metadata
        if isinstance(raw_md, str):  # form-encoded (or JSON-in-a-string) metadata
            try:
                raw_md = json.loads(raw_md)
            except ValueError:
                return _slack_error("invalid_metadata_format")
        try:
            metadata = SlackMetadata.model_validate(raw_md).model_dump()
        except ValidationError as e:
            return _slack_error("invalid_metadata_format",
                                response_metadata={"messages": [f"[ERROR] {m}" for m in _messages(e)]})
    ts = f"{int(time.time())}.{state.next_seq():06d}"
    message = {"type": "message", "subtype": "bot_message", "text": post.text or "", "user": "U0FAKEBOT1",
               "bot_id": "B0FAKEBOT1", "app_id": "A0FAKEAPP1", "ts": ts, "team": "T0FAKETEAM"}
    if post.blocks:
        message["blocks"] = post.blocks
    if metadata is not None:
        message["metadata"] = metadata
    with state.lock:
        state.slack.setdefault(channel_id, []).append({**message, "channel": channel_id})
    body: dict[str, Any] = {"ok": True, "channel": channel_id, "ts": ts, "message": message}
    if form is None and "charset" not in ctype.lower():
        body["warning"] = "missing_charset"
        body["response_metadata"] = {"warnings": ["missing_charset"]}
    return 200, body, {}


def _slack_token(headers: dict[str, str], form: dict[str, Any] | None) -> str | None:
    auth = headers.get("authorization", "")
    return auth[len("Bearer "):] if auth.startswith("Bearer ") else (form or {}).get("token")


def _slack_ts(value: Any, default: float) -> float | None:
    if value is None or value == "":
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _slack_read_args(method: str, headers: dict[str, str], query: dict[str, list[str]],
                     raw_bytes: bytes) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A Slack read method's arguments: the query string, overlaid by a form-encoded POST body
    (returned too, as ``form``, since it may carry the token)."""
    args: dict[str, Any] = {k: v[0] for k, v in query.items()}
    form: dict[str, Any] | None = None
    if method == "POST" and headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        form = {k: v[0] for k, v in parse_qs(raw_bytes.decode("utf-8", "replace")).items()}
        args.update(form)
    return args, form


def slack_history(state: PagingState, method: str, headers: dict[str, str], query: dict[str, list[str]],
                  raw_bytes: bytes) -> Reply:
    """``conversations.history`` (query string, or a form-encoded POST), newest first."""
    args, form = _slack_read_args(method, headers, query, raw_bytes)
    token = _slack_token(headers, form)
    if not token:
        return _slack_error("not_authed")
    if token not in state.credentials.slack_tokens:
        return _slack_error("invalid_auth")
    channel = args.get("channel")
    if not channel:
        return _slack_error("channel_not_found")
    if channel not in state.credentials.slack_channels:  # names are not accepted here, only IDs
        return _slack_error("channel_not_found")
    needed = {"G": "groups:history", "D": "im:history"}.get(channel[:1], "channels:history")
    if needed not in state.credentials.slack_scopes:
        return _slack_error("missing_scope", needed=needed, provided=",".join(sorted(state.credentials.slack_scopes)))
    try:
        limit = int(args.get("limit") or 100)
    except ValueError:
        return _slack_error("invalid_arguments")
    limit = max(1, min(999, limit))
    oldest, latest = _slack_ts(args.get("oldest"), 0.0), _slack_ts(args.get("latest"), time.time() + 1)
    if oldest is None:
        return _slack_error("invalid_ts_oldest")
    if latest is None:
        return _slack_error("invalid_ts_latest")
    inclusive = str(args.get("inclusive", "")).lower() in ("1", "true")
    with_metadata = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
    before = latest
    cursor = args.get("cursor")
    if cursor:
        try:
            decoded = base64.b64decode(cursor.encode(), validate=True).decode()
            if not decoded.startswith("next_ts:"):
                raise ValueError(decoded)
            before, inclusive_before = float(decoded[len("next_ts:"):]), True
        except (ValueError, UnicodeDecodeError):
            return _slack_error("invalid_cursor")
    else:
        inclusive_before = inclusive
    with state.lock:
        stored = list(state.slack.get(channel, []))

    def keep(m: dict[str, Any]) -> bool:
        ts = float(m["ts"])
        low = ts >= oldest if inclusive else ts > oldest
        high = ts <= before if inclusive_before else ts < before
        return low and high

    rows = sorted((m for m in stored if keep(m)), key=lambda m: float(m["ts"]), reverse=True)
    page, rest = rows[:limit], rows[limit:]
    messages = []
    for m in page:
        out = {k: v for k, v in m.items() if k != "channel" and (with_metadata or k != "metadata")}
        messages.append(json.loads(json.dumps(out)))
    body: dict[str, Any] = {"ok": True, "messages": messages, "has_more": bool(rest), "pin_count": 0,
                            "channel_actions_ts": None, "channel_actions_count": 0}
    if rest:
        body["response_metadata"] = {"next_cursor": base64.b64encode(f"next_ts:{rest[0]['ts']}".encode()).decode()}
    return 200, body, {}


def slack_users_info(state: PagingState, method: str, headers: dict[str, str], query: dict[str, list[str]],
                     raw_bytes: bytes) -> Reply:
    """``users.info`` (query string, or a form-encoded POST): the user object, email only with users:read.email."""
    args, form = _slack_read_args(method, headers, query, raw_bytes)
    token = _slack_token(headers, form)
    cr = state.credentials
    if not token:
        return _slack_error("not_authed")
    if token not in cr.slack_tokens:
        return _slack_error("invalid_auth")
    if "users:read" not in cr.slack_scopes:
        return _slack_error("missing_scope", needed="users:read", provided=",".join(sorted(cr.slack_scopes)))
    uid = args.get("user")
    if not uid:
        return _slack_error("invalid_arguments", response_metadata={"messages": ["[ERROR] missing required field: user"]})
    with state.lock:
        u = dict(cr.slack_users.get(uid) or {})
    if not u:
        return _slack_error("user_not_found")
    return 200, {"ok": True, "user": _slack_user(cr, uid, u)}, {}


def _slack_user(cr: "Credentials", uid: str, u: dict[str, Any]) -> dict[str, Any]:
    """A Slack user object as ``users.info`` and ``users.lookupByEmail`` return it."""
    name = u.get("name") or uid.lower()
    real = u.get("real_name") or name
    profile: dict[str, Any] = {"real_name": real, "display_name": name, "real_name_normalized": real,
                               "display_name_normalized": name, "status_text": "", "status_emoji": "",
                               "avatar_hash": "g" + uid[-11:].lower(), "team": u.get("team_id", cr.slack_team_id),
                               "image_24": f"https://avatars.slack-edge.example/{uid}_24.png"}
    if u.get("email") and "users:read.email" in cr.slack_scopes:
        profile["email"] = u["email"]
    if u.get("is_bot"):
        profile["bot_id"] = "B" + uid[1:]
    user = {"id": uid, "team_id": u.get("team_id", cr.slack_team_id), "name": name, "deleted": bool(u.get("deleted")),
            "color": "9f69e7", "real_name": real, "tz": "Europe/London", "tz_label": "Greenwich Mean Time",
            "tz_offset": 0, "profile": profile, "is_admin": False, "is_owner": False, "is_primary_owner": False,
            "is_restricted": False, "is_ultra_restricted": False, "is_bot": bool(u.get("is_bot")),
            "is_app_user": False, "updated": 1764000000, "has_2fa": False}
    return user


def _slack_auth(state: PagingState, headers: dict[str, str], form: dict[str, Any] | None,
                scope: str) -> Reply | None:
    """The error reply for a missing/invalid token or a missing scope, else None."""
    token = _slack_token(headers, form)
    cr = state.credentials
    if not token:
        return _slack_error("not_authed")
    if token not in cr.slack_tokens:
        return _slack_error("invalid_auth")
    if scope not in cr.slack_scopes:
        return _slack_error("missing_scope", needed=scope, provided=",".join(sorted(cr.slack_scopes)))
    return None


def slack_lookup_by_email(state: PagingState, method: str, headers: dict[str, str], query: dict[str, list[str]],
                          raw_bytes: bytes) -> Reply:
    """``users.lookupByEmail`` (Slack API docs): needs ``users:read.email``; ``users_not_found`` for an
    address no (active) member of the workspace has; the user object otherwise."""
    args, form = _slack_read_args(method, headers, query, raw_bytes)
    refused = _slack_auth(state, headers, form, "users:read.email")
    if refused is not None:
        return refused
    email = str(args.get("email") or "").strip().lower()
    if not email:
        return _slack_error("invalid_arguments", response_metadata={"messages": ["[ERROR] missing required field: email"]})
    cr = state.credentials
    with state.lock:
        found = [(uid, dict(u)) for uid, u in cr.slack_users.items()
                 if str(u.get("email", "")).lower() == email and not u.get("deleted") and not u.get("is_bot")]
    if not found:
        return _slack_error("users_not_found")
    uid, u = found[0]
    return 200, {"ok": True, "user": _slack_user(cr, uid, u)}, {}


def slack_open_conversation(state: PagingState, method: str, headers: dict[str, str], query: dict[str, list[str]],
                            raw_bytes: bytes) -> Reply:
    """``conversations.open`` with ``users`` = one user ID (Slack API docs): needs ``im:write``; opens
    (or returns the already open) direct message channel ``D...``, registered as a channel the bot can
    post to and read (``im:history``)."""
    args, form = _slack_read_args(method, headers, query, raw_bytes)
    if headers.get("content-type", "").startswith("application/json"):
        try:
            args.update(json.loads(raw_bytes or b"{}"))
        except ValueError:
            return _slack_error("invalid_json")
    refused = _slack_auth(state, headers, form, "im:write")
    if refused is not None:
        return refused
    users = [u for u in str(args.get("users") or "").split(",") if u]
    if not users and not args.get("channel"):
        return _slack_error("users_list_not_supplied")
    if len(users) != 1:
        return _slack_error("not_enough_users" if not users else "too_many_users")
    cr = state.credentials
    with state.lock:
        u = cr.slack_users.get(users[0])
        if u is None:
            return _slack_error("user_not_found")
        if u.get("deleted"):
            return _slack_error("user_disabled")
        cid = "D" + hashlib.sha256(users[0].encode()).hexdigest()[:10].upper()
        already = cid in cr.slack_channels
        cr.slack_channels[cid] = f"dm-{users[0]}"
    return 200, {"ok": True, "no_op": already, "already_open": already, "channel": {"id": cid}}, {}


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    """``v0=`` + HMAC-SHA256 hex of ``v0:{timestamp}:{body}`` (Slack API docs, "Verifying requests from Slack")."""
    return "v0=" + hmac.new(secret.encode(), b"v0:" + timestamp.encode() + b":" + body, hashlib.sha256).hexdigest()


def block_actions_payload(state: PagingState, channel: str, ts: str, action_id: str, user_id: str,
                          team_id: str | None = None) -> dict[str, Any]:
    """The ``block_actions`` payload Slack sends when ``user_id`` clicks ``action_id`` on a posted message.

    Raises:
        LookupError: no such message, or it has no button with that ``action_id``.
    """
    cr = state.credentials
    with state.lock:
        message = next((m for m in state.slack.get(channel, []) if m["ts"] == ts), None)
        user = dict(cr.slack_users.get(user_id) or {})
    if message is None:
        raise LookupError(f"no message {ts} in channel {channel}")
    found = [(b, e) for b in message.get("blocks") or [] if b.get("type") == "actions"
             for e in b.get("elements") or [] if e.get("type") == "button" and e.get("action_id") == action_id]
    if not found:
        raise LookupError(f"message {ts} has no button with action_id {action_id!r}")
    block, button = found[0]
    team = team_id or cr.slack_team_id
    name = user.get("name") or user_id.lower()
    action = {"type": "button", "action_id": action_id, "block_id": block.get("block_id") or "b" + ts[-6:],
              "text": button["text"], "action_ts": f"{time.time():.6f}"}
    for k in ("value", "style"):
        if k in button:
            action[k] = button[k]
    seq = state.next_seq()
    return {
        "type": "block_actions",
        "user": {"id": user_id, "username": name, "name": name, "team_id": user.get("team_id", team)},
        "api_app_id": "A0FAKEAPP1",
        "token": FAKE_VERIFICATION_TOKEN,
        "container": {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": False},
        "trigger_id": f"{int(time.time())}{seq:04d}.{int(time.time() * 1000) % 10**12}.{secrets.token_hex(16)}",
        "team": {"id": team, "domain": "grocer-fake"},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel, "name": cr.slack_channels.get(channel, "")},
        "message": {k: v for k, v in message.items() if k not in ("channel", "metadata")},
        "state": {"values": {}},
        "response_url": f"{state.base_url}/actions/{team}/{seq:013d}/{secrets.token_urlsafe(18)}",
        "actions": [action],
    }


def _deliver(state: PagingState, url: str, headers: dict[str, str], body: bytes) -> Reply:
    import httpx

    with state.lock:
        state.last_click = {"url": url, "headers": dict(headers), "body": body.decode()}
    try:
        r = httpx.post(url, content=body, headers=headers, timeout=10)
    except httpx.HTTPError as e:
        return 502, {"error": f"the request URL did not answer: {type(e).__name__}"}, {}
    try:
        answer: Any = r.json()
    except ValueError:
        answer = r.text
    return 200, {"status": r.status_code, "body": answer, "timestamp": headers["X-Slack-Request-Timestamp"]}, {}


def slack_click(state: PagingState, spec: dict[str, Any]) -> Reply:
    """``POST /_fake/slack/click``: click a button as Slack would (see the module docstring)."""
    cr = state.credentials
    if not cr.slack_request_url:
        return 409, {"error": "no interactivity request URL configured (POST /_fake/slack/app)"}, {}
    try:
        payload = block_actions_payload(state, str(spec["channel"]), str(spec["ts"]), str(spec["action_id"]),
                                        str(spec["user"]), spec.get("team"))
    except KeyError as e:
        return 400, {"error": f"missing {e.args[0]!r}"}, {}
    except LookupError as e:
        return 404, {"error": str(e)}, {}
    body = urlencode({"payload": json.dumps(payload, separators=(",", ":"))}).encode()
    timestamp = str(int(time.time() - float(spec.get("age_s") or 0)))
    secret = "forged" + secrets.token_hex(13) if spec.get("forge") else cr.slack_signing_secret
    headers = {"Content-Type": "application/x-www-form-urlencoded",
               "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
               "X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": slack_signature(secret, timestamp, body)}
    status, answer, h = _deliver(state, cr.slack_request_url, headers, body)
    if isinstance(answer, dict):
        answer["payload"] = payload
    return status, answer, h


def slack_replay(state: PagingState) -> Reply:
    """``POST /_fake/slack/replay``: send the last click again, same headers, same bytes."""
    with state.lock:
        last = dict(state.last_click) if state.last_click else None
    if last is None:
        return 409, {"error": "no click to replay"}, {}
    return _deliver(state, last["url"], last["headers"], last["body"].encode())


def _fault_body(path: str, status: int) -> Any:
    if path.startswith("/v2/enqueue"):
        if status == 429:
            return {"status": "throttle event", "message": "Requests for this service are arriving too quickly. Please retry later."}
        return {"status": "error", "message": "internal error"}
    if path.startswith("/incidents"):
        if status == 429:
            return {"error": {"message": "Rate Limit Exceeded", "code": 2020}}
        return {"error": {"message": "An internal error has occurred. PagerDuty team has been notified.", "code": 2000}}
    if path.startswith("/v2/alerts"):
        return {"message": "Too many requests" if status == 429 else "Internal Server Error", "took": 0.001,
                "requestId": str(uuid.uuid4())}
    if path.startswith("/api/"):
        return {"ok": False, "error": "ratelimited" if status == 429 else "fatal_error"}
    return {"error": f"fault {status}"}


# -- HTTP ----------------------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    server: "PagingServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        with self.server.state.lock:  # logged before the client can see the answer
            self.server.state.requests.append({"method": self.command, "path": urlsplit(self.path).path, "status": status})
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass

    def _handle(self) -> None:
        state = self.server.state
        split = urlsplit(self.path)
        path, query = split.path, parse_qs(split.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw_bytes = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}

        if path.startswith("/_fake/"):
            self._control(path, raw_bytes)
            return
        fault = state.take_fault(path, self.command)
        if fault is not None and not fault.after_apply:
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.status is not None:
                self._reply(*self._fault_reply(fault, path))
                return
        reply = self._route(state, path, query, headers, raw_bytes)
        if fault is not None and fault.after_apply:  # the request took effect; only the answer suffers
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.status is not None:
                reply = self._fault_reply(fault, path)
        self._reply(*reply)

    @staticmethod
    def _fault_reply(fault: Fault, path: str) -> Reply:
        extra = {}
        if fault.status == 429 or fault.retry_after is not None:
            extra["Retry-After"] = f"{fault.retry_after if fault.retry_after is not None else 1:g}"
        assert fault.status is not None
        return fault.status, fault.body if fault.body is not None else _fault_body(path, fault.status), extra

    def _route(self, state: PagingState, path: str, query: dict[str, list[str]], headers: dict[str, str],
               raw_bytes: bytes) -> Reply:
        if path.startswith("/api/"):
            if self.command == "POST" and path == "/api/chat.postMessage":
                return slack_post(state, headers, raw_bytes)
            if self.command in ("GET", "POST") and path == "/api/conversations.history":
                return slack_history(state, self.command, headers, query, raw_bytes)
            if self.command in ("GET", "POST") and path == "/api/users.info":
                return slack_users_info(state, self.command, headers, query, raw_bytes)
            if self.command in ("GET", "POST") and path == "/api/users.lookupByEmail":
                return slack_lookup_by_email(state, self.command, headers, query, raw_bytes)
            if self.command == "POST" and path == "/api/conversations.open":
                return slack_open_conversation(state, self.command, headers, query, raw_bytes)
            return 200, {"ok": False, "error": "unknown_method"}, {}
        if path.startswith("/actions/") and self.command == "POST":  # a click's response_url
            try:
                reply = json.loads(raw_bytes or b"")
            except ValueError:
                return 400, {"ok": False, "error": "invalid_payload"}, {}
            with state.lock:
                state.slack_replies.append({"path": path, "body": reply})
            return 200, {"ok": True}, {}
        raw: Any = None
        if raw_bytes:
            try:
                raw = json.loads(raw_bytes)
            except ValueError:
                if path == "/v2/enqueue":
                    return _pd_invalid(["Invalid JSON"])
                if path.startswith("/v2/alerts"):
                    return _og(400, message="Could not parse the request body as JSON.")[:3]
                return _pd_rest_error(400, "Invalid Input Provided", 2001, ["Invalid JSON"])
        if path == "/v2/enqueue":
            if self.command != "POST":
                return 405, {"status": "invalid event", "message": "Method not allowed", "errors": []}, {}
            return pd_enqueue(state, raw)
        if path == "/incidents" or path.startswith("/incidents/"):
            return pd_rest(state, self.command, path, query, headers, raw)
        if path == "/v2/alerts" or path.startswith("/v2/alerts/"):
            return opsgenie(state, self.command, path, query, headers, raw)
        return 404, {"error": f"no route {self.command} {path}"}, {}

    def _control(self, path: str, raw_bytes: bytes) -> None:
        state = self.server.state
        if path == "/_fake/state" and self.command == "GET":
            self._reply(200, state.snapshot())
        elif path == "/_fake/faults" and self.command == "POST":
            try:
                spec = json.loads(raw_bytes or b"{}")
                specs = spec if isinstance(spec, list) else [spec]
                for s in specs:
                    state.add_fault(**s)
            except (ValueError, TypeError) as e:
                self._reply(400, {"error": f"bad fault spec: {e}"})
                return
            self._reply(200, {"faults": [f.__dict__ for f in state.faults]})
        elif path == "/_fake/faults" and self.command == "DELETE":
            state.clear_faults()
            self._reply(200, {"faults": []})
        elif path in ("/_fake/slack/click", "/_fake/slack/replay", "/_fake/slack/app") and self.command == "POST":
            try:
                spec = json.loads(raw_bytes or b"{}")
                if not isinstance(spec, dict):
                    raise ValueError("the body must be a JSON object")
                if path == "/_fake/slack/app":
                    state.configure_slack(**spec)
                    cr = state.credentials
                    self._reply(200, {"request_url": cr.slack_request_url, "team_id": cr.slack_team_id,
                                      "users": sorted(cr.slack_users), "scopes": sorted(cr.slack_scopes)})
                else:
                    self._reply(*(slack_click(state, spec) if path.endswith("/click") else slack_replay(state)))
            except (ValueError, TypeError) as e:
                self._reply(400, {"error": f"bad control request: {e}"})
        elif path == "/_fake/reset" and self.command == "POST":
            state.reset()
            self._reply(200, {"reset": True})
        else:
            self._reply(404, {"error": f"no control route {self.command} {path}"})

    do_GET = do_POST = do_DELETE = do_PUT = _handle


class PagingServer(ThreadingHTTPServer):
    """The fake's HTTP server; ``state`` is its :class:`PagingState`, ``base_url`` its root URL."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: PagingState | None = None) -> None:
        super().__init__(address, _Handler)
        self.state = state or PagingState()
        host, port = self.server_address[:2]
        self.base_url = self.state.base_url = f"http://{host}:{port}"

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.shutdown()
        self.server_close()


def start_paging_server(port: int = 0, host: str = "127.0.0.1",
                        credentials: Credentials | None = None) -> tuple[PagingServer, str]:
    """Start the fake in a daemon thread; return ``(server, base_url)``. Stop it with ``server.stop()``.

    Args:
        port: TCP port (0 = a free one).
        host: interface, loopback by default.
        credentials: what it accepts (default: the ``DEFAULT_*`` constants).
    """
    server = PagingServer((host, port), PagingState(credentials))
    thread = threading.Thread(target=server.serve_forever, name="paging-fake", daemon=True)
    thread.start()
    return server, server.base_url


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m dw_dagster_dev.fakes.paging_server [--host H] [--port N]``: serve until SIGTERM/SIGINT."""
    ap = argparse.ArgumentParser(description="Fake PagerDuty + Opsgenie + Slack APIs on loopback.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--routing-key", default=DEFAULT_ROUTING_KEY)
    ap.add_argument("--pagerduty-token", default=DEFAULT_PAGERDUTY_TOKEN)
    ap.add_argument("--pagerduty-user", action="append", default=None)
    ap.add_argument("--opsgenie-key", default=DEFAULT_OPSGENIE_KEY)
    ap.add_argument("--slack-token", default=DEFAULT_SLACK_TOKEN)
    args = ap.parse_args(list(argv) if argv is not None else None)
    creds = Credentials(routing_keys={args.routing_key}, pagerduty_tokens={args.pagerduty_token},
                        pagerduty_users=set(args.pagerduty_user or DEFAULT_PAGERDUTY_USERS),
                        opsgenie_keys={args.opsgenie_key}, slack_tokens={args.slack_token})
    server, url = start_paging_server(args.port, args.host, creds)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(url, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
