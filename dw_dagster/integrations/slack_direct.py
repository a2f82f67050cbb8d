"""Direct messages in Slack through ``slack_sdk``'s ``WebClient``: the named owner is asked in person.

The route Slack documents for messaging a person the app knows by email (Slack API docs,
"users.lookupByEmail", "conversations.open", "chat.postMessage"):

1. ``users.lookupByEmail`` (scope ``users:read.email``) → the member's ID, or ``users_not_found``
   (no active member has that address: the person is *unreachable* in Slack, which dw_dagster
   records and shows instead of skipping silently);
2. ``conversations.open`` with ``users=<id>`` (scope ``im:write``) → the direct message channel
   ``D...`` (the same one every time: opening is idempotent);
3. ``chat.postMessage`` to that channel (``chat:write``), with the idempotency ref as message
   metadata, looked up with ``conversations.history`` (``im:history``) before a post is ever
   repeated (:func:`~dw_dagster.core.http.post_once`): a DM the server applied while its answer was
   lost is found, not sent twice.

Rate limits: the client carries :class:`BoundedRateLimitHandler`, ``slack_sdk``'s
``RateLimitErrorRetryHandler`` bounded for a sensor tick: a 429 is retried after its
``Retry-After`` (Slack docs "Rate limits": the request was not processed) at most
``retry_attempts - 1`` times and only while ``Retry-After`` is within ``retry_max_wait_s``;
beyond that the call fails, the task is recorded as not done, and the next tick tries again
(nothing lost, nothing repeated). No other retry handler is installed: ``slack_sdk``'s connection
error handler would re-send a ``chat.postMessage`` blindly after a reset that came once the server
had acted.
"""

from __future__ import annotations

import random
import socket
import time
from typing import TYPE_CHECKING, Any
from urllib.error import URLError

from dw_dagster.core.extras import missing_extra

try:
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError
    from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
except ImportError as _e:  # an optional surface: its extra
    raise missing_extra("slack", _e) from _e

from dw_dagster.core.http import HttpApiError

if TYPE_CHECKING:
    from dw_dagster.integrations.slack import SlackMessage, SlackResource

#: Slack error codes that mean "this person cannot be reached in Slack", not "try again"
UNREACHABLE_ERRORS = frozenset({"users_not_found", "user_not_found", "user_disabled", "cannot_dm_bot"})


def _retry_after(response: Any) -> float | None:
    for k, v in (response.headers or {}).items():
        if k.lower() == "retry-after":
            try:
                return float(v[0] if isinstance(v, list) else v)
            except (TypeError, ValueError):
                return None
    return None


class BoundedRateLimitHandler(RateLimitErrorRetryHandler):
    """``RateLimitErrorRetryHandler`` that never waits longer than ``max_wait_s`` in one go.

    A 429 whose ``Retry-After`` is longer is not retried here (the sensor tick would stall); the
    caller gets the 429 and the next tick tries again.
    """

    def __init__(self, max_retry_count: int = 2, max_wait_s: float = 8.0) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self.max_wait_s = max_wait_s
        self.waits: list[float] = []

    def _can_retry(self, *, state, request, response=None, error=None) -> bool:
        if response is None or response.status_code != 429:
            return False
        after = _retry_after(response)
        return after is None or after <= self.max_wait_s

    def prepare_for_next_attempt(self, *, state, request, response=None, error=None) -> None:
        if response is None:
            raise error  # type: ignore[misc]
        after = _retry_after(response)
        wait = min(self.max_wait_s, (after if after is not None else 1.0) + random.random() * 0.1)
        self.waits.append(wait)
        state.next_attempt_requested = True
        time.sleep(wait)
        state.increment_current_attempt()


def web_client(slack: SlackResource) -> WebClient:
    """A ``WebClient`` on the resource's token and base URL, with only the bounded rate-limit handler."""
    return WebClient(token=slack.bot_token, base_url=slack.base_url.rstrip("/") + "/", timeout=slack.timeout_s,
                     retry_handlers=[BoundedRateLimitHandler(max(0, slack.retry_attempts - 1), slack.retry_max_wait_s)])


def _call(slack: SlackResource, method: str, fn, *, idempotent: bool = True) -> dict[str, Any]:
    """Run one ``WebClient`` call; its answer's data, or :class:`HttpApiError` naming the Slack error."""
    from dw_dagster.integrations.slack import _HINTS

    endpoint = f"/api/{method}"
    try:
        return dict(fn().data)
    except SlackApiError as e:
        status = e.response.status_code
        data = e.response.data if isinstance(e.response.data, dict) else {}
        code = str(data.get("error") or f"HTTP {status}")
        if status == 429:
            after = _retry_after(e.response)
            raise slack._redact(HttpApiError("slack", "POST", endpoint, 429, f"rate limited (Retry-After "
                                             f"{after if after is not None else '?'} s); tried again next tick")) from None
        if status >= 500:
            raise slack._redact(HttpApiError("slack", "POST", endpoint, status, f"Slack answered {status}: {code[:200]}",
                                             maybe_applied=not idempotent)) from None
        detail = f"Slack error {code!r}" + (f" ({_HINTS[code]})" if code in _HINTS else "")
        if code == "missing_scope" and data.get("needed"):
            detail += f": needs {data['needed']}"
        raise slack._redact(HttpApiError("slack", "POST", endpoint, status, detail)) from None
    except (TimeoutError, socket.timeout, URLError, ConnectionError, OSError) as e:
        reason = getattr(e, "reason", e)
        not_sent = isinstance(reason, ConnectionRefusedError)
        raise HttpApiError("slack", "POST", endpoint, None, f"{type(reason).__name__}: {reason}",
                           maybe_applied=not idempotent and not not_sent) from None


def lookup_user(slack: SlackResource, email: str) -> dict[str, Any] | None:
    """``users.lookupByEmail``: the member (``id``, ``name``, ...), or None when Slack has no such member.

    Raises:
        HttpApiError: any other failure (``missing_scope`` names ``users:read.email``; a 429 beyond the bound).
    """
    try:
        return _call(slack, "users.lookupByEmail", lambda: web_client(slack).users_lookupByEmail(email=email))["user"]
    except HttpApiError as e:
        if any(f"'{code}'" in e.detail for code in UNREACHABLE_ERRORS):
            return None
        raise


def open_direct(slack: SlackResource, user_id: str) -> str:
    """``conversations.open`` with one user: the direct message channel's ID (``D...``)."""
    data = _call(slack, "conversations.open", lambda: web_client(slack).conversations_open(users=user_id))
    return str(data["channel"]["id"])


def post_direct(slack: SlackResource, channel: str, message: SlackMessage, *, ref: str | None,
                check_first: bool | None, oldest: float | None) -> dict[str, Any]:
    """``chat.postMessage`` to a DM channel, at most once per ``ref`` (see the module docstring).

    Returns:
        Slack's answer (``channel``, ``ts``), with ``deduplicated: true`` when the message with
        ``ref`` was already there (nothing posted).
    """
    import dataclasses

    from dw_dagster.core.http import post_once
    from dw_dagster.integrations.slack import MESSAGE_TEXT_MAX, clip, message_ref, ref_metadata

    msg = dataclasses.replace(message, metadata=ref_metadata(ref)) if ref is not None else message

    def post() -> dict[str, Any]:
        kwargs: dict[str, Any] = {"channel": channel, "text": clip(msg.text, MESSAGE_TEXT_MAX)}
        if msg.blocks:
            kwargs["blocks"] = msg.blocks[:50]
        if msg.metadata:
            kwargs["metadata"] = msg.metadata
        return _call(slack, "chat.postMessage", lambda: web_client(slack).chat_postMessage(**kwargs), idempotent=False)

    def find() -> dict[str, Any] | None:
        since = oldest if oldest is not None else time.time() - slack.history_lookback_s
        cursor = None
        for _ in range(50):
            page = _call(slack, "conversations.history", lambda: web_client(slack).conversations_history(
                channel=channel, oldest=f"{since:.6f}", include_all_metadata=True, limit=200, cursor=cursor))
            for m in page.get("messages") or []:
                if message_ref(m) == ref:
                    return {"ok": True, "channel": channel, "ts": m.get("ts"), "message": m, "deduplicated": True}
            cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
            if not page.get("has_more") or not cursor:
                return None
        raise HttpApiError("slack", "GET", "/api/conversations.history", 200, f"could not read back to {since:.0f}")

    answer, _ = slack._post_once(post, find if ref is not None else None,
                                 bool(slack.check_history_first if check_first is None else check_first))
    return answer


__all__ = ["BoundedRateLimitHandler", "UNREACHABLE_ERRORS", "lookup_user", "open_direct", "post_direct", "web_client"]
