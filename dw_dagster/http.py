"""HTTP plumbing shared by the vendor clients (Lightup, PagerDuty, Opsgenie, Slack).

Every call goes through :func:`send`: httpx with a timeout, retried by tenacity with jittered
exponential back-off on transport errors, timeouts, HTTP 429 and 5xx (``Retry-After`` is honoured
when the server sends it, capped by ``max_wait_s``), and turned into :class:`HttpApiError` when it
still fails. Errors name the method, the endpoint path and the status; they never carry request
headers, so a bearer token or routing key cannot leak into a log.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import tenacity

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class HttpApiError(RuntimeError):
    """A vendor API call failed for good.

    Attributes:
        service: the vendor ("lightup", "pagerduty", ...).
        method: HTTP method.
        endpoint: the URL path (no query string, no host credentials).
        status: HTTP status, or None when no response arrived (timeout, refused connection).
        detail: a short excerpt of the response body or the transport error.
    """

    def __init__(self, service: str, method: str, endpoint: str, status: int | None, detail: str) -> None:
        self.service, self.method, self.endpoint, self.status, self.detail = service, method, endpoint, status, detail
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


def _retry_after(response: httpx.Response | None) -> float | None:
    if response is None:
        return None
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def send(
    client: httpx.Client,
    service: str,
    method: str,
    url: str,
    *,
    policy: RetryPolicy = RetryPolicy(),
    ok: Callable[[httpx.Response], bool] | None = None,
    sleep: Callable[[float], None] = time.sleep,
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
        **kwargs: passed to ``httpx.Client.request`` (``params``, ``json``, ``headers``...).

    Returns:
        The ``httpx.Response`` (status < 400).

    Raises:
        HttpApiError: a non-retryable status, or retries exhausted on 429/5xx/timeouts/connection
            errors. The message names ``method`` and the URL path, never headers or tokens.
    """
    endpoint = httpx.URL(url).path if "://" in url else url.split("?")[0]

    def attempt() -> httpx.Response:
        try:
            response = client.request(method, url, timeout=policy.timeout_s, **kwargs)
        except (httpx.TimeoutException, httpx.TransportError) as e:
            raise _Retryable(None, e) from e
        if response.status_code in RETRY_STATUSES:
            raise _Retryable(response, None)
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
    except _Retryable as e:
        if e.response is not None:
            raise HttpApiError(service, method, endpoint, e.response.status_code,
                               f"still failing after {policy.attempts} attempts: {_excerpt(e.response)}") from None
        raise HttpApiError(service, method, endpoint, None,
                           f"{type(e.error).__name__} after {policy.attempts} attempts: {e.error}") from None
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
