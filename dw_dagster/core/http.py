"""HTTP plumbing shared by the vendor clients (Lightup, PagerDuty, Opsgenie, Slack).

Every call goes through :func:`send`: httpx with a timeout, retried by tenacity with jittered
exponential back-off on transport errors, timeouts, HTTP 429 and 5xx (``Retry-After`` is honoured
when the server sends it, capped by ``max_wait_s``), and turned into :class:`HttpApiError` when it
still fails. Errors name the method, the endpoint path and the status; they never carry request
headers, so a bearer token or routing key cannot leak into a log.

**Requests that are not idempotent at the vendor** (a PagerDuty note, a Lightup comment, a Slack
message, an Opsgenie note: each POST adds one more) are sent with ``send(..., idempotent=False)``.
A request that timed out after it was sent, lost its connection mid-answer, or got a 5xx may
already have been applied by the server, so it is *not* sent again blindly: :func:`send` raises an
:class:`HttpApiError` with ``maybe_applied=True``. Only failures that prove the request was not
acted on are still retried: HTTP 429 (PagerDuty, Opsgenie and Slack document that a rate-limited
request is rejected, not processed) and errors before the request left this machine (connection
refused, connect or pool timeout). :func:`post_once` then does *check-then-post*: it looks the
side effect up by its idempotency marker (:func:`marker_line`, carried in the note's text or the
Slack message's metadata) and posts again only when the marker is not there. PagerDuty Events v2
(``dedup_key``) and Opsgenie create/close by ``alias`` are idempotent by the vendors' design and
keep the plain retries.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import tenacity
from dw_dagster.errors import DwDagsterError

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Transport errors raised before the request left this machine: the server never saw it.
NOT_SENT_ERRORS: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout,
                                                httpx.UnsupportedProtocol)
#: Prefix of every idempotency marker (``dw:<task id>:<step>``).
MARKER_PREFIX = "dw:"

T = TypeVar("T")


class HttpApiError(DwDagsterError, RuntimeError):
    """A vendor API call failed for good.

    Attributes:
        service: the vendor ("lightup", "pagerduty", ...).
        method: HTTP method.
        endpoint: the URL path (no query string, no host credentials).
        status: HTTP status, or None when no response arrived (timeout, refused connection).
        detail: a short excerpt of the response body or the transport error.
        maybe_applied: the request was sent and the server may have acted on it (a timeout after
            sending, a connection lost mid-answer, a 5xx): a non-idempotent request must be looked
            up before it is sent again (:func:`post_once`).
    """

    def __init__(self, service: str, method: str, endpoint: str, status: int | None, detail: str,
                 *, maybe_applied: bool = False) -> None:
        self.service, self.method, self.endpoint, self.status, self.detail = service, method, endpoint, status, detail
        self.maybe_applied = maybe_applied
        what = f"HTTP {status}" if status is not None else "no response"
        super().__init__(f"{service} {method} {endpoint}: {what}: {detail[:300]}")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry one call.

    Attributes:
        attempts: total tries, first one included.
        base_wait_s: first back-off (seconds); doubles each try, with full jitter.
        max_wait_s: cap on one wait (seconds), also caps ``Retry-After``.
        timeout_s: httpx timeout per try (seconds; connect, read, write and pool).
    """

    attempts: int = 4
    base_wait_s: float = 0.5
    max_wait_s: float = 8.0
    timeout_s: float = 10.0


class _Retryable(Exception):
    def __init__(self, response: httpx.Response | None, error: Exception | None) -> None:
        self.response, self.error = response, error


class _MaybeApplied(Exception):
    """A non-idempotent request failed after it was sent: not retried by :func:`send`."""

    def __init__(self, response: httpx.Response | None, error: Exception | None) -> None:
        self.response, self.error = response, error


def _retry_after(response: httpx.Response | None) -> float | None:
    if response is None:
        return None
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:  # an HTTP-date; anything else (RFC 9110 allows only these two forms) is ignored: back-off as usual
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        return max(0.0, parsed.timestamp() - time.time()) if parsed and parsed.tzinfo else None
    return max(0.0, seconds) if seconds == seconds else None  # NaN: ignored


def send(
    client: httpx.Client,
    service: str,
    method: str,
    url: str,
    *,
    policy: RetryPolicy = RetryPolicy(),
    ok: Callable[[httpx.Response], bool] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    idempotent: bool = True,
    **kwargs: Any,
) -> httpx.Response:
    """Send one request with retries; return the first acceptable response.

    Args:
        client: the httpx client (its base URL, default headers and auth are used).
        service: vendor name for error messages.
        method: HTTP method.
        url: path or absolute URL.
        policy: attempts, back-off and timeout.
        ok: extra acceptance test; by default any status < 400 is accepted and any other status
            that is not retryable raises at once.
        sleep: the sleep function (tests pass a recorder).
        idempotent: False for a request that adds something each time it is applied (a note, a
            comment, a message): it is then retried only after failures that prove it was not
            acted on (HTTP 429; connection refused, connect or pool timeout), never after a
            timeout once sent, a broken connection or a 5xx (see the module docstring).
        **kwargs: passed to ``httpx.Client.request`` (``params``, ``json``, ``headers``...).

    Returns:
        The ``httpx.Response`` (status < 400).

    Raises:
        HttpApiError: a non-retryable status, or retries exhausted on 429/5xx/timeouts/connection
            errors, or (``idempotent=False``) the first failure after which the server may have
            applied the request (``maybe_applied=True``). The message names ``method`` and the
            URL path, never headers or tokens.
    """
    endpoint = httpx.URL(url).path if "://" in url else url.split("?")[0]

    def attempt() -> httpx.Response:
        try:
            response = client.request(method, url, timeout=policy.timeout_s, **kwargs)
        except NOT_SENT_ERRORS as e:
            raise _Retryable(None, e) from e
        except (httpx.TimeoutException, httpx.TransportError) as e:
            raise (_Retryable if idempotent else _MaybeApplied)(None, e) from e
        if response.status_code == 429:
            raise _Retryable(response, None)
        if response.status_code in RETRY_STATUSES:
            raise (_Retryable if idempotent else _MaybeApplied)(response, None)
        return response

    def wait(state: tenacity.RetryCallState) -> float:
        jitter = tenacity.wait_random_exponential(multiplier=policy.base_wait_s, max=policy.max_wait_s)(state)
        exc = state.outcome.exception() if state.outcome else None
        after = _retry_after(exc.response) if isinstance(exc, _Retryable) else None
        return min(policy.max_wait_s, after) if after is not None else jitter

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(_Retryable),
        stop=tenacity.stop_after_attempt(max(1, policy.attempts)),
        wait=wait,
        sleep=sleep,
        reraise=True,
    )
    try:
        response = retrying(attempt)
    except _MaybeApplied as e:
        status = e.response.status_code if e.response is not None else None
        why = _excerpt(e.response) if e.response is not None else f"{type(e.error).__name__}: {e.error}"
        raise HttpApiError(service, method, endpoint, status,
                           f"not sent again (the server may have applied it): {why}", maybe_applied=True) from None
    except _Retryable as e:
        # the last failure came after the request reached the server (a 5xx, a timeout once sent)
        sent = ((e.response is not None and e.response.status_code != 429)
                or (e.error is not None and not isinstance(e.error, NOT_SENT_ERRORS)))
        if e.response is not None:
            raise HttpApiError(service, method, endpoint, e.response.status_code,
                               f"still failing after {policy.attempts} attempts: {_excerpt(e.response)}",
                               maybe_applied=sent) from None
        raise HttpApiError(service, method, endpoint, None,
                           f"{type(e.error).__name__} after {policy.attempts} attempts: {e.error}",
                           maybe_applied=sent) from None
    if response.status_code >= 400 or (ok is not None and not ok(response)):
        raise HttpApiError(service, method, endpoint, response.status_code, _excerpt(response))
    return response


def _excerpt(response: httpx.Response) -> str:
    text = response.text if response.content else ""
    return " ".join(text.split())[:300] or response.reason_phrase


def json_body(response: httpx.Response, service: str, method: str) -> Any:
    """The response's JSON, or :class:`HttpApiError` naming the endpoint when it is not JSON."""
    try:
        return response.json()
    except ValueError:
        raise HttpApiError(service, method, response.request.url.path, response.status_code,
                           f"malformed JSON in the response: {_excerpt(response)}") from None


def unwrap_list(body: Any, *, keys: tuple[str, ...] = ("data",)) -> list:
    """A list from a bare JSON array or from a wrapper object such as ``{"data": [...]}``.

    Raises:
        ValueError: ``body`` is neither (the caller adds the endpoint to the message).
    """
    if isinstance(body, list):
        return body
    if isinstance(body, Mapping):
        for key in keys:
            if isinstance(body.get(key), list):
                return body[key]
    raise ValueError(f"expected a JSON array or an object with {' or '.join(keys)!r} holding one, "
                     f"got {type(body).__name__}")


# -- exactly once: idempotency markers and check-then-post --------------------------------------

def marker_line(ref: str) -> str:
    """The line that carries an idempotency marker in a note or comment: ``[dw-dagster ref <ref>]``.

    Args:
        ref: the marker, ``dw:<task id>:<step>`` (see :func:`dw_dagster.integrations.notifications.step_ref`).

    Raises:
        ValueError: ``ref`` does not start with ``dw:`` or holds whitespace or brackets.
    """
    if not ref.startswith(MARKER_PREFIX) or any(ch.isspace() or ch in "[]" for ch in ref):
        raise ValueError(f"an idempotency marker looks like 'dw:<task>:<step>', got {ref!r}")
    return f"[dw-dagster ref {ref}]"


def with_marker(text: str, ref: str | None, limit: int | None = None) -> str:
    """``text`` with the marker as its last line, the text cut (never the marker) to fit ``limit``.

    Args:
        text: the note or comment.
        ref: the marker, or None for ``text`` unchanged (cut to ``limit``).
        limit: the vendor's length limit for the whole text, when it publishes one.
    """
    if ref is None:
        return text if limit is None or len(text) <= limit else text[: max(0, limit - 1)] + "…"
    line = "\n" + marker_line(ref)
    if limit is not None and len(text) + len(line) > limit:
        room = max(0, limit - len(line))
        text = text[: max(0, room - 1)] + "…" if room else ""
    return text + line


def has_marker(text: Any, ref: str) -> bool:
    """True when ``text`` (a note or comment body) carries the marker line for ``ref``."""
    return isinstance(text, str) and marker_line(ref) in text


def post_once(
    post: Callable[[], T],
    find: Callable[[], T | None] | None,
    *,
    policy: RetryPolicy = RetryPolicy(),
    check_first: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[T, bool]:
    """Check-then-post: apply a non-idempotent request at most once per marker.

    ``post`` sends the request with ``send(..., idempotent=False)``; ``find`` looks for the side
    effect by its marker (a note or comment whose text carries :func:`marker_line`, a Slack
    message whose metadata carries the ref) and returns it, or None.

    - ``check_first``: look before the first POST (a retry of the task on a later tick, after an
      earlier attempt may have been applied).
    - After a POST that failed with ``maybe_applied`` (timeout once sent, broken connection, 5xx),
      wait (``base_wait_s`` doubling per try, capped at ``max_wait_s``) so a request still in
      flight can land, look again, and post again only when the marker is not there, up to
      ``policy.attempts`` POSTs in all.

    A request the vendor is still processing when the look-up runs (Opsgenie processes notes
    asynchronously) can be missed; the wait narrows that window and the next tick looks again.

    Args:
        post: sends the request; returns what the vendor answered.
        find: looks the side effect up; None when the caller has no marker (then a failure after
            sending is raised, never re-sent).
        policy: attempts (POSTs in all) and waits.
        check_first: look before the first POST.
        sleep: the sleep function (tests pass a recorder).

    Returns:
        ``(value, posted)``: what ``post`` answered and True, or what ``find`` found and False.

    Raises:
        HttpApiError: the POST failed for a reason that proves it was not applied, or it may have
            been applied and the marker was not found after the last attempt (``maybe_applied``;
            the look-up's own failure is added to the detail).
    """
    if check_first and find is not None:
        found = find()
        if found is not None:
            return found, False
    attempts = max(1, policy.attempts)
    error: HttpApiError | None = None
    for attempt in range(1, attempts + 1):
        try:
            return post(), True
        except HttpApiError as e:
            if not e.maybe_applied or find is None:
                raise
            error = e
        sleep(min(policy.max_wait_s, policy.base_wait_s * 2 ** (attempt - 1)))
        try:
            found = find()
        except Exception as lookup:  # noqa: BLE001 - reported with the POST's own failure
            raise HttpApiError(error.service, error.method, error.endpoint, error.status,
                               f"{error.detail}; could not check whether it was applied: {lookup}",
                               maybe_applied=True) from None
        if found is not None:
            return found, False
    assert error is not None
    raise error
