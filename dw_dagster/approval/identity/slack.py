"""A signed Slack interaction (an Approve / Reject button click) as proof of who decided.

Slack sends a click on a message button to the app's interactivity Request URL as an HTTP POST
with ``Content-Type: application/x-www-form-urlencoded`` and one field, ``payload``, holding the
JSON of a ``block_actions`` payload (Slack API docs, "Handling user interaction in your Slack
apps", "block_actions payloads"). :class:`SlackInteractionVerifier` accepts one only when:

1. **Slack signed it** (Slack API docs, "Verifying requests from Slack"): the
   ``X-Slack-Signature`` header is ``v0=`` + HMAC-SHA256 (hex) of ``v0:{timestamp}:{raw body}``
   keyed with the app's signing secret, ``{timestamp}`` being ``X-Slack-Request-Timestamp``.
   Checked with :class:`slack_sdk.signature.SignatureVerifier` (constant-time comparison);
2. **it is fresh**: the timestamp is at most 5 minutes from now, as Slack recommends against
   replays, and
3. **it is new**: the signature's SHA-256 is consumed once in the ledger
   (:meth:`dw_dagster.core.ledger.Ledger.use_credential`), so the same signed request sent again within
   the 5 minutes is refused too;
4. it is a ``block_actions`` payload with one ``dw_approve`` / ``dw_reject`` button whose
   ``value`` is ``{"cs": <change set id>, "v": <version>}`` (:func:`button_value`), from the
   workspace named by ``team_id`` when one is configured;
5. the clicking user, looked up with ``users.info`` (Slack API docs, "users.info"; the bot token
   needs ``users:read`` and, for ``user.profile.email``, ``users:read.email``), exists, is not
   deactivated (``deleted``), is not a bot, and has an email.

The result is a :class:`~dw_dagster.core.identity.VerifiedIdentity` with method ``slack`` and the
action (decision, change set id and the version the person saw). Whether that person may decide
is :func:`dw_dagster.approval.job.decide`'s business, never this module's.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from dw_dagster.core.identity import IdentityError, VerifiedIdentity, canonical_email

#: the button ``action_id`` of each decision
APPROVE_ACTION = "dw_approve"
REJECT_ACTION = "dw_reject"
ACTIONS = {APPROVE_ACTION: "approve", REJECT_ACTION: "reject"}
#: how far a request's timestamp may be from now (Slack: "more than five minutes ... could be a replay attack")
MAX_AGE_SECONDS = 5 * 60
#: prefix of the ledger credential that makes one signed request usable once
REQUEST_CREDENTIAL_PREFIX = "slack-request:"
_MAX_BODY = 64 * 1024


class SlackNotConfigured(IdentityError):
    """The signing secret or the bot token is not in the environment: no click can be checked."""


class NotFromSlack(IdentityError):
    """The request is not a fresh, first-time request signed by Slack (bad or missing signature, stale
    timestamp, replay). Answered 401: Slack never sees it, so nobody is shown the reason in Slack."""


def button_value(change_set_id: str, version: str) -> str:
    """A button's ``value``: compact JSON ``{"cs": id, "v": version}`` (binds the click to the version shown)."""
    return json.dumps({"cs": change_set_id, "v": version}, separators=(",", ":"))


@dataclass(frozen=True)
class SlackAction:
    """What a verified click asks for, and where it came from.

    Attributes:
        decision: ``approve`` or ``reject``.
        change_set_id: from the button's value.
        version: the change set version the message showed.
        user_id: the Slack user who clicked (``user.id``).
        team_id: the workspace (``team.id``).
        channel_id: ``channel.id`` (or ``container.channel_id``), when the click was on a message.
        message_ts: the message's ``ts``.
        response_url: where a reply to the click can be posted (``response_url``).
    """

    decision: str
    change_set_id: str
    version: str
    user_id: str
    team_id: str
    channel_id: str | None = None
    message_ts: str | None = None
    response_url: str | None = None


def _secret(env: str, what: str) -> str:
    value = os.environ.get(env, "")
    if not value.strip():
        raise SlackNotConfigured(f"environment variable {env} ({what}) is not set")
    return value


def check_signature(body: bytes, headers: Mapping[str, str], signing_secret: str, *, now: float | None = None) -> str:
    """Check Slack's v0 request signature and its timestamp; return the signature header.

    Args:
        body: the raw request body, exactly as received.
        headers: the request headers (any case).
        signing_secret: the app's signing secret.
        now: epoch seconds to compare the timestamp with (default: now).

    Raises:
        NotFromSlack: a header is missing or malformed, the timestamp is more than 5 minutes away,
            or the signature does not match.
    """
    from slack_sdk.signature import SignatureVerifier

    h = {k.lower(): v for k, v in headers.items()}
    ts, sig = h.get("x-slack-request-timestamp"), h.get("x-slack-signature")
    if not ts or not sig:
        raise NotFromSlack("not signed by Slack: X-Slack-Request-Timestamp or X-Slack-Signature header missing")
    if not ts.isdigit() or len(ts) > 12:
        raise NotFromSlack("not signed by Slack: X-Slack-Request-Timestamp is not whole seconds since the epoch")
    if not sig.startswith("v0=") or len(sig) != 67:
        raise NotFromSlack("not signed by Slack: X-Slack-Signature is not a v0 signature")
    t = time.time() if now is None else now
    age = t - int(ts)
    if abs(age) > MAX_AGE_SECONDS:
        when = f"{age:.0f} s old" if age > 0 else f"{-age:.0f} s in the future"
        raise NotFromSlack(f"stale request: its timestamp is {when}, at most {MAX_AGE_SECONDS} s allowed "
                           "(a replay, or a clock off)")

    class _At:
        def now(self) -> float:
            return t

    try:
        valid = SignatureVerifier(signing_secret, clock=_At()).is_valid(body=body, timestamp=ts, signature=sig)
    except UnicodeDecodeError:
        valid = False
    if not valid:
        raise NotFromSlack("bad signature: the request is not signed with the Slack app's signing secret")
    return sig


def parse_block_actions(body: bytes) -> tuple[dict[str, Any], SlackAction]:
    """The ``block_actions`` payload of a form-encoded interaction body, and its dw_dagster button.

    Raises:
        IdentityError: no ``payload`` field, not JSON, not ``block_actions``, no user or team, not
            exactly one ``dw_approve``/``dw_reject`` action, or a button value that is not
            ``{"cs", "v"}``.
    """
    try:
        fields = parse_qs(body.decode("utf-8"), strict_parsing=False)
        payload = json.loads(fields["payload"][0])
    except (UnicodeDecodeError, KeyError, IndexError, ValueError):
        raise IdentityError("not a Slack interaction: the body has no JSON payload field") from None
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        kind = payload.get("type") if isinstance(payload, dict) else type(payload).__name__
        raise IdentityError(f"not a button click: payload type {kind!r}, expected 'block_actions'")
    user, team = payload.get("user") or {}, payload.get("team") or {}
    user_id = user.get("id") if isinstance(user, dict) else None
    team_id = team.get("id") if isinstance(team, dict) else None
    if not isinstance(user_id, str) or not user_id or not isinstance(team_id, str) or not team_id:
        raise IdentityError("the interaction names no user.id or team.id")
    ours = [a for a in payload.get("actions") or [] if isinstance(a, dict) and a.get("action_id") in ACTIONS]
    if len(ours) != 1:
        raise IdentityError(f"the interaction carries {len(ours)} dw_approve/dw_reject actions, expected one")
    action = ours[0]
    try:
        value = json.loads(action.get("value") or "")
        cs_id, version = value["cs"], value["v"]
    except (ValueError, TypeError, KeyError):
        raise IdentityError("the button value is not {\"cs\": ..., \"v\": ...}") from None
    if not all(isinstance(x, str) and 0 < len(x) <= 255 for x in (cs_id, version)):
        raise IdentityError("the button value names no change set id and version")
    container = payload.get("container") if isinstance(payload.get("container"), dict) else {}
    channel = payload.get("channel") if isinstance(payload.get("channel"), dict) else {}
    message = payload.get("message") if isinstance(payload.get("message"), dict) else {}
    response_url = payload.get("response_url")
    return payload, SlackAction(
        decision=ACTIONS[action["action_id"]], change_set_id=cs_id, version=version, user_id=user_id,
        team_id=team_id, channel_id=channel.get("id") or container.get("channel_id"),
        message_ts=message.get("ts") or container.get("message_ts"),
        response_url=response_url if isinstance(response_url, str) else None)


class SlackInteractionVerifier:
    """Turns a signed Slack button click into a verified identity (see the module docstring).

    Args:
        settings: the domains file's ``identity.slack`` (:class:`dw_dagster.core.domains.SlackIdentity`).
        timeout_seconds: timeout of the ``users.info`` call.
    """

    def __init__(self, settings: Any, *, timeout_seconds: float = 10.0) -> None:
        self.settings = settings
        self.timeout_seconds = timeout_seconds

    def verify(self, body: bytes, headers: Mapping[str, str], ledger: Any, *,
               now: float | None = None) -> tuple[VerifiedIdentity, SlackAction]:
        """Check one interaction request; return who clicked and what they asked for.

        Args:
            body: the raw request body.
            headers: the request headers.
            ledger: the instance's :class:`~dw_dagster.core.ledger.Ledger` (consumes the request once).
            now: epoch seconds (default: now).

        Returns:
            ``(identity, action)``; ``identity.credential_id`` is ``slack:<SHA-256 of the
            signature>``, consumed by the decision it is used for.

        Raises:
            SlackNotConfigured: the signing secret or the bot token is not set (nothing was checked).
            NotFromSlack: not signed, stale, forged or replayed (reasons as in :func:`check_signature`).
            IdentityError: signed, but not usable: not a dw_dagster button click, another
                workspace, or a user who is unknown, deactivated, a bot or without an email (also
                when ``users.info`` fails).
        """
        digest = self.signed(body, headers, ledger, now=now)
        _, action = parse_block_actions(body)
        return self.person(action.user_id, action.team_id, digest, now=now), action

    def signed(self, body: bytes, headers: Mapping[str, str], ledger: Any, *, now: float | None = None) -> str:
        """Check that a request (an interaction or a slash command) is a fresh, first-time one signed
        by Slack; return the SHA-256 of its signature (consumed in the ledger).

        Raises:
            SlackNotConfigured, NotFromSlack: as :meth:`verify`.
        """
        s = self.settings
        if len(body) > _MAX_BODY:
            raise NotFromSlack(f"request body larger than {_MAX_BODY} bytes")
        secret = _secret(s.signing_secret_env, "the Slack app's signing secret")
        _secret(s.bot_token_env, "the Slack bot token")
        signature = check_signature(body, headers, secret, now=now)
        digest = hashlib.sha256(signature.encode()).hexdigest()
        if not ledger.use_credential(REQUEST_CREDENTIAL_PREFIX + digest, "slack request"):
            raise NotFromSlack("replayed request: this signed Slack request was already received once")
        return digest

    def person(self, user_id: str, team_id: str, digest: str, *, now: float | None = None,
               what: str = "interaction") -> VerifiedIdentity:
        """The person behind a signed request: ``users.info`` says who, in which workspace, whether a
        bot or deactivated, and their email.

        Raises:
            IdentityError: another workspace, a deactivated user, a bot, no email, or users.info failed.
        """
        s = self.settings
        if s.team_id and team_id != s.team_id:
            said = "click" if what == "interaction" else what
            raise IdentityError(f"the {said} came from Slack workspace {team_id}, not {s.team_id}")
        user = self.user_info(user_id)
        if s.team_id and user.get("team_id") not in (None, s.team_id):
            raise IdentityError(f"Slack user {user_id} belongs to workspace {user.get('team_id')}, not {s.team_id}")
        if user.get("deleted") is True:
            raise IdentityError(f"Slack user {user_id} is deactivated")
        if user.get("is_bot") is True or user.get("is_app_user") is True or user_id == "USLACKBOT":
            raise IdentityError(f"Slack user {user_id} is a bot, not a person")
        email = (user.get("profile") or {}).get("email")
        if not isinstance(email, str) or not email.strip():
            raise IdentityError(f"Slack user {user_id} has no email visible to the app (the bot token "
                                "needs the users:read.email scope)")
        at = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.timezone.utc)
        team = s.team_id or team_id
        return VerifiedIdentity(
            email=canonical_email(email), method="slack", issuer=f"slack:{team}", subject=user_id,
            verified_at=at, credential_id=f"slack:{digest}",
            detail=f"a signed Slack {what} by user {user_id} ({user.get('name') or '?'}) in workspace {team}")

    def user_info(self, user_id: str) -> dict[str, Any]:
        """``users.info`` for ``user_id`` through slack_sdk's ``WebClient`` (the ``user`` object).

        Raises:
            IdentityError: the bot token is not set, Slack answers ``ok: false`` (the error code,
                e.g. ``user_not_found``, ``missing_scope`` with what is needed), or is unreachable.
        """
        from slack_sdk import WebClient
        from slack_sdk.errors import SlackApiError, SlackRequestError

        token = _secret(self.settings.bot_token_env, "the Slack bot token")
        client = WebClient(token=token, base_url=self.settings.api_url.rstrip("/") + "/", timeout=int(self.timeout_seconds))
        try:
            answer = client.users_info(user=user_id)
        except SlackApiError as e:
            data = e.response.data if isinstance(e.response.data, dict) else {}
            code = data.get("error") or f"HTTP {e.response.status_code}"
            needed = f" (needs {data['needed']})" if data.get("needed") else ""
            raise IdentityError(f"Slack users.info refused user {user_id}: {code}{needed}") from None
        except (SlackRequestError, OSError, ValueError) as e:
            raise IdentityError(f"cannot reach Slack users.info: {type(e).__name__}") from None
        user = answer.get("user")
        if not isinstance(user, dict) or user.get("id") != user_id:
            raise IdentityError(f"Slack users.info answered without user {user_id}")
        return user


__all__ = ["ACTIONS", "APPROVE_ACTION", "MAX_AGE_SECONDS", "NotFromSlack", "REJECT_ACTION", "SlackAction",
           "SlackInteractionVerifier", "SlackNotConfigured", "button_value", "check_signature", "parse_block_actions"]
