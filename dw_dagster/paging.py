"""Page the on-call people about a dw_dagster incident: PagerDuty and Opsgenie, over their real HTTP APIs.

Two Dagster resources, each usable on its own and each implementing the small :class:`Pager`
protocol (``trigger`` / ``annotate`` / ``resolve``) so a sensor or the demo can call one interface:

- :class:`PagerDutyResource` sends alert events to the **Events API v2**
  (``POST https://events.pagerduty.com/v2/enqueue``; PagerDuty developer docs, "Events API v2 →
  Send an Alert Event") and, to annotate, uses the **REST API v2** (``https://api.pagerduty.com``;
  "REST API → Incidents: List incidents", "Create a note on an incident") to find the incident
  that the events created (``GET /incidents?incident_key=<dedup_key>``) and add notes to it.
- :class:`OpsgenieResource` uses the **Alert API** (``https://api.opsgenie.com``, EU
  ``https://api.eu.opsgenie.com``; Opsgenie docs, "Alert API": Create Alert, Add Note to Alert,
  Close Alert, Get Request Status), addressing the alert by its ``alias``.

Both key the page on the dw_dagster incident id through :func:`dedup_key_for`, so a repeated
trigger for the same incident lands on the same page, and ``annotate``/``resolve`` need only the
incident id. Every call goes through :func:`dw_dagster.http.send` (timeouts, jittered retries on
429/5xx honouring ``Retry-After``); every failure is an :class:`~dw_dagster.http.HttpApiError`
naming the vendor, method, endpoint path and status, with the routing key, API token and API key
scrubbed from its text.

**Exactly once.** Triggers, acknowledges and resolves are idempotent by the vendors' design and
keep plain retries: PagerDuty's Events API v2 folds every event with the same ``dedup_key`` into
the one open incident ("Events API v2 → Alert de-duplication"), and Opsgenie de-duplicates a
Create Alert whose ``alias`` matches an open alert (count + 1) and refuses to close a closed one
(so a close's note is added once). Notes are not: each ``POST`` adds one more. A note given an
idempotency ``ref`` (``dw:<task>:<step>``) carries it as a last line (:func:`~dw_dagster.http.marker_line`),
is sent without blind retries, and is looked up first (PagerDuty ``GET /incidents/{id}/notes``,
"List notes for an incident"; Opsgenie ``GET /v2/alerts/{alias}/notes``, "List Alert Notes")
whenever an earlier attempt may have been applied (:func:`~dw_dagster.http.post_once`).
:meth:`PagerDutyResource.resolution_steps` and :meth:`OpsgenieResource.resolution_steps` split
``resolve`` into its side effects so a caller can record each before the next one runs.

Message builders for the notes (:func:`diagnosis_note`, :func:`resolution_note`) and a
convenience :func:`page_incident` turn dw_dagster records (:class:`~dw_dagster.models.Incident`,
:class:`~dw_dagster.models.Diagnosis`, :class:`~dw_dagster.models.Receipt`) into page text.
"""

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import parse_qs, quote, urlsplit

import dagster as dg
import httpx
from pydantic import Field

from dw_dagster.http import HttpApiError, RetryPolicy, has_marker, json_body, post_once, send, with_marker
from dw_dagster.models import Diagnosis, ExposureRef, Incident, Receipt

Severity = Literal["critical", "error", "warning", "info"]
SEVERITIES: tuple[str, ...] = ("critical", "error", "warning", "info")

#: PagerDuty Events API v2 limits ("Send an Alert Event": dedup_key ≤ 255, payload.summary ≤ 1024).
PD_DEDUP_KEY_MAX = 255
PD_SUMMARY_MAX = 1024
#: Opsgenie Alert API limits ("Create Alert": message ≤ 130, alias ≤ 512, description ≤ 15000,
#: source ≤ 100, user ≤ 100, details ≤ 8000 characters in all; "Add Note": note ≤ 25000).
OG_MESSAGE_MAX = 130
OG_ALIAS_MAX = 512
OG_DESCRIPTION_MAX = 15000
OG_NOTE_MAX = 25000
OG_SHORT_MAX = 100
OG_DETAILS_MAX = 8000
#: Severity → Opsgenie priority (P1 highest).
OPSGENIE_PRIORITY: dict[str, str] = {"critical": "P1", "error": "P2", "warning": "P3", "info": "P5"}

PAGERDUTY_ACCEPT = "application/vnd.pagerduty+json;version=2"
#: Opsgenie "List Alert Notes": at most 100 notes a page.
OG_NOTES_PAGE = 100

#: One side effect of a multi-step action: ``(step name, run)``. ``run(ref, check_first)`` performs
#: it (``ref`` is the idempotency marker for notes, or None; ``check_first`` True forces a look-up
#: before posting, None leaves the vendor's default) and returns what to record about it.
PagerStep = tuple[str, Callable[[str | None, bool | None], dict[str, Any]]]

_KEY_PREFIX = "dw-dagster:"


def dedup_key_for(incident_id: str) -> str:
    """The PagerDuty ``dedup_key`` (and Opsgenie ``alias``) for a dw_dagster incident.

    Deterministic: ``"dw-dagster:" + incident_id`` while that fits in 255 characters, else the
    first 180 characters of the id plus a 16-hex SHA-256 of the whole id (so two long ids that
    share a prefix still get different keys).

    Args:
        incident_id: the :class:`~dw_dagster.models.Incident` id, e.g. ``inc-4f296e71f448``.

    Returns:
        A string of at most 255 characters (within Opsgenie's 512-character alias limit too).

    Raises:
        ValueError: ``incident_id`` is empty or blank.
    """
    if not incident_id or not incident_id.strip():
        raise ValueError("incident_id must not be empty")
    key = _KEY_PREFIX + incident_id
    if len(key) <= PD_DEDUP_KEY_MAX:
        return key
    digest = hashlib.sha256(incident_id.encode()).hexdigest()[:16]
    return f"{_KEY_PREFIX}{incident_id[:180]}:{digest}"


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending in an ellipsis when it was cut."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


@runtime_checkable
class Pager(Protocol):
    """What dw_dagster needs from a paging service, keyed by the dw_dagster incident id."""

    def trigger(self, incident_id: str, summary: str, *, severity: Severity = "error",
                details: Mapping[str, Any] | None = None,
                links: Sequence[tuple[str, str]] = ()) -> str:
        """Open (or re-trigger) the page; return the vendor key (dedup key / alias)."""
        ...

    def annotate(self, incident_id: str, text: str, *, ref: str | None = None,
                 check_first: bool | None = None) -> None:
        """Add a note (cause, blast radius, progress) to the open page, at most once per ``ref``."""
        ...

    def resolve(self, incident_id: str, *, receipt_url: str | None = None, note: str | None = None) -> None:
        """Note the receipt link (when given) and resolve the page."""
        ...


class _VendorResource(dg.ConfigurableResource):
    """Shared retry and timeout settings (see :class:`dw_dagster.http.RetryPolicy`)."""

    timeout_s: float = Field(default=10.0, description="HTTP timeout per try, seconds")
    retry_attempts: int = Field(default=4, description="tries per call, the first included")
    retry_base_wait_s: float = Field(default=0.5, description="first back-off, seconds (doubles, full jitter)")
    retry_max_wait_s: float = Field(default=8.0, description="cap on one back-off and on Retry-After, seconds")

    def retry_policy(self) -> RetryPolicy:
        """The :class:`RetryPolicy` built from this resource's fields."""
        return RetryPolicy(attempts=self.retry_attempts, base_wait_s=self.retry_base_wait_s,
                           max_wait_s=self.retry_max_wait_s, timeout_s=self.timeout_s)

    def _secrets(self) -> list[str]:
        return []

    def _redact(self, error: HttpApiError) -> HttpApiError:
        detail = error.detail
        for s in self._secrets():
            if s:
                detail = detail.replace(s, "[redacted]")
        return HttpApiError(error.service, error.method, error.endpoint, error.status, detail,
                            maybe_applied=error.maybe_applied)

    def _send(self, client: httpx.Client, service: str, method: str, url: str, *, idempotent: bool = True,
              **kwargs: Any) -> httpx.Response:
        try:
            return send(client, service, method, url, policy=self.retry_policy(), idempotent=idempotent, **kwargs)
        except HttpApiError as e:
            raise self._redact(e) from None

    def _post_once(self, post: Callable[[], Any], find: Callable[[], Any] | None, check_first: bool) -> tuple[Any, bool]:
        """:func:`~dw_dagster.http.post_once` with this resource's policy, errors redacted."""
        try:
            return post_once(post, find, policy=self.retry_policy(), check_first=check_first)
        except HttpApiError as e:
            raise self._redact(e) from None

    def _json(self, response: httpx.Response, service: str, method: str) -> Any:
        try:
            return json_body(response, service, method)
        except HttpApiError as e:
            raise self._redact(e) from None


def _base(url: str) -> str:
    return url.rstrip("/")


class PagerDutyResource(_VendorResource):
    """PagerDuty: Events API v2 to trigger/acknowledge/resolve, REST API v2 to add notes.

    Configure with ``routing_key=dg.EnvVar("PAGERDUTY_ROUTING_KEY")`` (the 32-character
    integration key of an "Events API v2" integration on the service) and, to annotate,
    ``api_token=dg.EnvVar("PAGERDUTY_API_TOKEN")`` plus ``from_email`` (PagerDuty requires a
    ``From`` header naming a valid user of the account to create notes).

    The Events API is asynchronous (202 Accepted): the incident may appear in the REST API a
    moment later, so :meth:`annotate` polls ``GET /incidents?incident_key=`` for up to
    ``incident_lookup_s`` seconds.
    """

    routing_key: str = Field(description="Events API v2 integration key (routing_key)")
    api_token: str | None = Field(default=None, description="REST API token (for notes)")
    from_email: str | None = Field(default=None, description="email of a valid PagerDuty user, sent as From")
    events_base_url: str = Field(default="https://events.pagerduty.com", description="Events API v2 host")
    rest_base_url: str = Field(default="https://api.pagerduty.com", description="REST API v2 host")
    source: str = Field(default="dw_dagster", description="payload.source of trigger events")
    incident_lookup_s: float = Field(default=30.0, description="how long annotate waits for the incident, seconds")

    def _secrets(self) -> list[str]:
        return [self.routing_key, self.api_token or ""]

    # -- Events API v2 ---------------------------------------------------------------------

    def send_event(self, event_action: Literal["trigger", "acknowledge", "resolve"], dedup_key: str,
                   payload: Mapping[str, Any] | None = None, *, links: Sequence[Mapping[str, str]] = (),
                   images: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
        """``POST /v2/enqueue`` one alert event.

        Args:
            event_action: ``trigger`` (``payload`` required), ``acknowledge`` or ``resolve``
                (payload omitted).
            dedup_key: ≤ 255 characters; use :func:`dedup_key_for`.
            payload: ``{summary, source, severity, timestamp?, component?, group?, class?,
                custom_details?}`` for triggers.
            links: ``[{"href", "text"?}]`` (triggers only).
            images: ``[{"src", "href"?, "alt"?}]`` (triggers only).

        Returns:
            The 202 body, ``{"status": "success", "message": "Event processed", "dedup_key"}``.

        Raises:
            ValueError: a trigger without payload, or a dedup_key over 255 characters.
            HttpApiError: 400 ``invalid event`` (its ``errors`` in the detail), 429/5xx after
                retries, a timeout, or a 2xx body whose ``status`` is not ``success``.
        """
        if not dedup_key or len(dedup_key) > PD_DEDUP_KEY_MAX:
            raise ValueError(f"dedup_key must be 1..{PD_DEDUP_KEY_MAX} characters")
        event: dict[str, Any] = {"routing_key": self.routing_key, "event_action": event_action,
                                 "dedup_key": dedup_key}
        if event_action == "trigger":
            if not payload:
                raise ValueError("a trigger event needs a payload (summary, source, severity)")
            event["payload"] = dict(payload)
            if links:
                event["links"] = [dict(x) for x in links]
            if images:
                event["images"] = [dict(x) for x in images]
        url = f"{_base(self.events_base_url)}/v2/enqueue"
        with httpx.Client(headers={"Content-Type": "application/json"}) as client:
            response = self._send(client, "pagerduty", "POST", url, json=event)
        body = self._json(response, "pagerduty", "POST")
        if not isinstance(body, dict) or body.get("status") != "success":
            raise HttpApiError("pagerduty", "POST", "/v2/enqueue", response.status_code,
                               f"event not accepted: {str(body)[:200]}")
        return body

    def trigger(self, incident_id: str, summary: str, *, severity: Severity = "error",
                details: Mapping[str, Any] | None = None, links: Sequence[tuple[str, str]] = (),
                component: str | None = None, group: str | None = None, event_class: str | None = None,
                timestamp: str | None = None) -> str:
        """Trigger (or re-trigger) the page for ``incident_id``; return its dedup key.

        ``summary`` is cut to 1024 characters; ``details`` becomes ``payload.custom_details``;
        ``links`` are ``(href, text)`` pairs.

        Raises:
            ValueError: unknown severity.
            HttpApiError: see :meth:`send_event`.
        """
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, got {severity!r}")
        payload: dict[str, Any] = {"summary": clip(summary, PD_SUMMARY_MAX), "source": self.source,
                                   "severity": severity}
        for name, value in (("component", component), ("group", group), ("class", event_class),
                            ("timestamp", timestamp)):
            if value:
                payload[name] = value
        if details:
            payload["custom_details"] = dict(details)
        body = self.send_event("trigger", dedup_key_for(incident_id), payload,
                               links=[{"href": h, "text": t} for h, t in links])
        return str(body.get("dedup_key") or dedup_key_for(incident_id))

    def acknowledge(self, incident_id: str) -> None:
        """Send an ``acknowledge`` event for the incident's dedup key."""
        self.send_event("acknowledge", dedup_key_for(incident_id))

    # -- REST API v2 -----------------------------------------------------------------------

    def _rest_client(self) -> httpx.Client:
        if not self.api_token:
            raise ValueError("PagerDutyResource.api_token is required for REST calls (notes)")
        headers = {"Authorization": f"Token token={self.api_token}", "Accept": PAGERDUTY_ACCEPT,
                   "Content-Type": "application/json"}
        if self.from_email:
            headers["From"] = self.from_email
        return httpx.Client(headers=headers)

    def find_incident(self, dedup_key: str, *, wait_s: float | None = None) -> dict[str, Any] | None:
        """The incident carrying ``incident_key == dedup_key``, via ``GET /incidents``.

        Prefers an incident that is not resolved, then the newest. Polls (every 0.25-1 s) for up
        to ``wait_s`` seconds (default ``incident_lookup_s``; 0 = one request) because events are
        processed asynchronously.

        Returns:
            The incident object (``id``, ``incident_key``, ``status``, ...) or None.

        Raises:
            ValueError: no ``api_token`` configured.
            HttpApiError: the list call failed (401 bad token, 429/5xx after retries, ...).
        """
        wait_s = self.incident_lookup_s if wait_s is None else wait_s
        url = f"{_base(self.rest_base_url)}/incidents"
        deadline = time.monotonic() + max(0.0, wait_s)
        pause = 0.25
        with self._rest_client() as client:
            while True:
                response = self._send(client, "pagerduty", "GET", url, params={"incident_key": dedup_key})
                body = self._json(response, "pagerduty", "GET")
                incidents = body.get("incidents") if isinstance(body, dict) else None
                if not isinstance(incidents, list):
                    raise HttpApiError("pagerduty", "GET", "/incidents", response.status_code,
                                       "response has no 'incidents' list")
                matches = [i for i in incidents if isinstance(i, dict) and i.get("incident_key") == dedup_key]
                if matches:
                    matches.sort(key=lambda i: (i.get("status") != "resolved", str(i.get("created_at", ""))))
                    return matches[-1]
                if time.monotonic() >= deadline:
                    return None
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(1.0, pause * 2)

    def list_notes(self, pd_incident_id: str) -> list[dict[str, Any]]:
        """``GET /incidents/{id}/notes`` ("List notes for an incident"): the notes, oldest first.

        Raises:
            ValueError: no ``api_token`` configured.
            HttpApiError: 401, 404 (no such incident), 429/5xx after retries, or no ``notes`` list.
        """
        url = f"{_base(self.rest_base_url)}/incidents/{quote(pd_incident_id, safe='')}/notes"
        with self._rest_client() as client:
            response = self._send(client, "pagerduty", "GET", url)
        body = self._json(response, "pagerduty", "GET")
        notes = body.get("notes") if isinstance(body, dict) else None
        if not isinstance(notes, list):
            raise HttpApiError("pagerduty", "GET", httpx.URL(url).path, response.status_code,
                               "response has no 'notes' list")
        return [n for n in notes if isinstance(n, dict)]

    def find_note(self, pd_incident_id: str, ref: str) -> dict[str, Any] | None:
        """The note on the incident whose content carries the marker line for ``ref``, or None."""
        return next((n for n in self.list_notes(pd_incident_id) if has_marker(n.get("content"), ref)), None)

    def add_note(self, pd_incident_id: str, content: str, *, ref: str | None = None,
                 check_first: bool | None = None) -> dict[str, Any]:
        """``POST /incidents/{id}/notes`` with ``{"note": {"content": ...}}``; return the note.

        The POST is not idempotent ("Create a note on an incident" adds one each time; at most
        2000 per incident), so it is never re-sent blindly after a timeout or a 5xx. With ``ref``
        the content ends in the marker line and the note is posted at most once per ``ref``:
        looked up first (``check_first``, default True here: the look-up needs no permission the
        note does not) and again after a failure that may have been applied.

        Args:
            pd_incident_id: the PagerDuty incident id (``Q...``), not the dw_dagster one.
            content: the note text.
            ref: idempotency marker ``dw:<task>:<step>``, or None (no marker, no look-up).
            check_first: look for the marker before the first POST (None: True).

        Returns:
            The new note, or the one already carrying ``ref`` (nothing posted then).

        Raises:
            ValueError: no ``api_token`` or no ``from_email`` configured.
            HttpApiError: 400 (e.g. the From user is unknown), 401, 404 (no such incident), ...;
                ``maybe_applied`` when the POST may have landed and the marker was not found.
        """
        if not self.from_email:
            raise ValueError("PagerDutyResource.from_email is required to add notes (PagerDuty's From header)")
        url = f"{_base(self.rest_base_url)}/incidents/{quote(pd_incident_id, safe='')}/notes"
        text = with_marker(content, ref)

        def post() -> dict[str, Any]:
            with self._rest_client() as client:
                response = self._send(client, "pagerduty", "POST", url, idempotent=False,
                                      json={"note": {"content": text}})
            body = self._json(response, "pagerduty", "POST")
            note = body.get("note") if isinstance(body, dict) else None
            if not isinstance(note, dict):
                raise HttpApiError("pagerduty", "POST", httpx.URL(url).path, response.status_code,
                                   "response has no 'note' object")
            return note

        find = (lambda: self.find_note(pd_incident_id, ref)) if ref else None
        note, _ = self._post_once(post, find, True if check_first is None else check_first)
        return note

    def annotate(self, incident_id: str, text: str, *, ref: str | None = None,
                 check_first: bool | None = None) -> None:
        """Find the incident for ``incident_id``'s dedup key and add ``text`` as a note.

        Args:
            incident_id: the dw_dagster incident id.
            text: the note.
            ref: idempotency marker; the note is added at most once per ``ref`` (see :meth:`add_note`).
            check_first: see :meth:`add_note`.

        Raises:
            ValueError: REST not configured (``api_token``, ``from_email``).
            HttpApiError: no incident appeared within ``incident_lookup_s`` (status 200, says so),
                or a REST call failed.
        """
        key = dedup_key_for(incident_id)
        incident = self.find_incident(key)
        if incident is None:
            raise HttpApiError("pagerduty", "GET", "/incidents", 200,
                               f"no incident with incident_key {key!r} after {self.incident_lookup_s:g} s")
        self.add_note(str(incident["id"]), text, ref=ref, check_first=check_first)

    def resolution_steps(self, incident_id: str, *, receipt_url: str | None = None,
                         note: str | None = None) -> list[PagerStep]:
        """:meth:`resolve` as its side effects, in order: ``note`` (when there is one) and ``resolve``.

        The note is a REST "Create a note" (not idempotent: give it a ``ref``); the ``resolve`` is
        an Events API v2 event for the dedup key (idempotent: a second resolve of a resolved
        incident is dropped, still 202, as PagerDuty documents).
        """
        text = _resolve_text(receipt_url, note)
        steps: list[PagerStep] = []
        if text and self.api_token and self.from_email:
            def add(ref: str | None, check_first: bool | None) -> dict[str, Any]:
                self.annotate(incident_id, text, ref=ref, check_first=check_first)
                return {}
            steps.append(("note", add))

        def resolve(ref: str | None, check_first: bool | None) -> dict[str, Any]:
            if text and not (self.api_token and self.from_email):
                dg.get_dagster_logger().warning(
                    "PagerDuty: api_token/from_email not configured; resolving %s without the receipt note", incident_id)
            self.send_event("resolve", dedup_key_for(incident_id))
            return {}
        steps.append(("resolve", resolve))
        return steps

    def resolve(self, incident_id: str, *, receipt_url: str | None = None, note: str | None = None) -> None:
        """Post a note with the receipt link, then send the ``resolve`` event.

        The note needs the REST settings (``api_token``, ``from_email``); without them the page is
        still resolved and a warning says the receipt link was not posted (an Events API v2
        resolve event carries no payload, so it cannot hold the link). Without ``receipt_url``
        and ``note`` only the resolve event is sent. :meth:`resolution_steps` gives the same two
        side effects one at a time.

        Raises:
            HttpApiError: the note or the resolve event failed (the resolve is not sent when the
                note failed, so the page stays open for a person to see).
        """
        for _, run in self.resolution_steps(incident_id, receipt_url=receipt_url, note=note):
            run(None, None)


class OpsgenieResource(_VendorResource):
    """Opsgenie Alert API v2, alerts addressed by ``alias`` (= :func:`dedup_key_for` the incident).

    Configure with ``api_key=dg.EnvVar("OPSGENIE_API_KEY")`` (an API integration key, sent as
    ``Authorization: GenieKey <key>``); use ``base_url="https://api.eu.opsgenie.com"`` for EU
    accounts. Opsgenie processes create/note/close asynchronously: a 202 means "Request will be
    processed"; :meth:`request_status` tells whether it was.
    """

    api_key: str = Field(description="Opsgenie API integration key")
    base_url: str = Field(default="https://api.opsgenie.com", description="https://api.eu.opsgenie.com for EU")
    source: str = Field(default="dw_dagster", description="the 'source' of alerts, notes and closes")
    user: str | None = Field(default=None, description="display name of the request owner ('user')")
    responder_teams: list[str] = Field(default_factory=list, description="team names to notify")
    tags: list[str] = Field(default_factory=lambda: ["dw_dagster"], description="tags on every alert")

    def _secrets(self) -> list[str]:
        return [self.api_key]

    def _client(self) -> httpx.Client:
        return httpx.Client(headers={"Authorization": f"GenieKey {self.api_key}",
                                     "Content-Type": "application/json"})

    def _post(self, path: str, body: Mapping[str, Any], params: Mapping[str, str] | None = None,
              *, idempotent: bool = True) -> dict[str, Any]:
        url = f"{_base(self.base_url)}{path}"
        with self._client() as client:
            response = self._send(client, "opsgenie", "POST", url, idempotent=idempotent, json=dict(body),
                                  params=dict(params or {}))
        data = self._json(response, "opsgenie", "POST")
        if not isinstance(data, dict) or "requestId" not in data:
            raise HttpApiError("opsgenie", "POST", httpx.URL(url).path, response.status_code,
                               f"unexpected response: {str(data)[:200]}")
        return data

    def _common(self) -> dict[str, str]:
        body = {"source": clip(self.source, OG_SHORT_MAX)}
        if self.user:
            body["user"] = clip(self.user, OG_SHORT_MAX)
        return body

    def create_alert(self, alias: str, message: str, *, description: str = "", priority: str = "P3",
                     details: Mapping[str, Any] | None = None, tags: Sequence[str] = (),
                     entity: str | None = None, note: str | None = None) -> str:
        """``POST /v2/alerts``; return the ``requestId``.

        ``message`` is cut to 130 characters, ``description`` to 15000, ``details`` values are
        turned into strings and cut so the map stays within 8000 characters.

        Raises:
            ValueError: alias empty or over 512 characters, or priority not P1..P5.
            HttpApiError: 422 (validation; Opsgenie's ``message`` in the detail), 401/403,
                429/5xx after retries, timeouts.
        """
        if not alias or len(alias) > OG_ALIAS_MAX:
            raise ValueError(f"alias must be 1..{OG_ALIAS_MAX} characters")
        if priority not in ("P1", "P2", "P3", "P4", "P5"):
            raise ValueError(f"priority must be P1..P5, got {priority!r}")
        body: dict[str, Any] = {"message": clip(message, OG_MESSAGE_MAX), "alias": alias, "priority": priority,
                                **self._common()}
        if description:
            body["description"] = clip(description, OG_DESCRIPTION_MAX)
        if details:
            body["details"] = _string_details(details, OG_DETAILS_MAX)
        all_tags = list(dict.fromkeys([*self.tags, *tags]))
        if all_tags:
            body["tags"] = [clip(t, 50) for t in all_tags[:20]]
        if self.responder_teams:
            body["responders"] = [{"type": "team", "name": t} for t in self.responder_teams]
        if entity:
            body["entity"] = clip(entity, OG_ALIAS_MAX)
        if note:
            body["note"] = clip(note, OG_NOTE_MAX)
        return str(self._post("/v2/alerts", body)["requestId"])

    def list_notes(self, alias: str, *, max_pages: int = 50) -> list[dict[str, Any]]:
        """``GET /v2/alerts/{alias}/notes?identifierType=alias`` ("List Alert Notes"), newest first.

        Pages with ``order=desc``, ``limit=100`` and the ``offset`` of ``paging.next`` (``direction=next``)
        until there is no next page or ``max_pages`` were read.

        Returns:
            ``[{"note", "owner", "createdAt", "offset"}]``; empty when the alert has no notes.

        Raises:
            HttpApiError: 404 (no such alert), 401/403 (the key lacks read access), 429/5xx
                after retries, or a body without a ``data`` list.
        """
        url = f"{_base(self.base_url)}/v2/alerts/{quote(alias, safe='')}/notes"
        params: dict[str, Any] = {"identifierType": "alias", "order": "desc", "direction": "next", "limit": OG_NOTES_PAGE}
        out: list[dict[str, Any]] = []
        with self._client() as client:
            for _ in range(max(1, max_pages)):
                response = self._send(client, "opsgenie", "GET", url, params=params)
                body = self._json(response, "opsgenie", "GET")
                data = body.get("data") if isinstance(body, dict) else None
                if not isinstance(data, list):
                    raise HttpApiError("opsgenie", "GET", httpx.URL(url).path, response.status_code,
                                       "response has no 'data' list")
                out += [n for n in data if isinstance(n, dict)]
                nxt = (body.get("paging") or {}).get("next") if isinstance(body.get("paging"), dict) else None
                offset = (parse_qs(urlsplit(nxt).query).get("offset") or [None])[0] if isinstance(nxt, str) else None
                if not data or not offset:
                    break
                params = {**params, "offset": offset}
        return out

    def find_note(self, alias: str, ref: str) -> dict[str, Any] | None:
        """The alert's note whose text carries the marker line for ``ref``, or None."""
        return next((n for n in self.list_notes(alias) if has_marker(n.get("note"), ref)), None)

    def add_note(self, alias: str, note: str, *, ref: str | None = None, check_first: bool | None = None) -> str:
        """``POST /v2/alerts/{alias}/notes?identifierType=alias``; return the ``requestId``.

        Add Note is not idempotent, so it is never re-sent blindly after a timeout or a 5xx. With
        ``ref`` the note ends in the marker line (the text is cut so the marker stays within the
        25000-character limit) and is added at most once per ``ref``: looked up with
        :meth:`list_notes` after a failure that may have been applied, and first too when
        ``check_first`` (default False here: the look-up needs the key's Read access right, which
        an integration that only creates may lack).

        Returns:
            The ``requestId`` of the Add Note request, or an empty string when a note carrying
            ``ref`` was already on the alert (nothing posted).

        Raises:
            HttpApiError: see :meth:`create_alert`; ``maybe_applied`` when the POST may have
                landed and the marker was not found.
        """
        body = {"note": with_marker(note, ref, OG_NOTE_MAX), **self._common()}
        path = f"/v2/alerts/{quote(alias, safe='')}/notes"
        find = (lambda: self.find_note(alias, ref)) if ref else None
        answer, posted = self._post_once(lambda: self._post(path, body, {"identifierType": "alias"}, idempotent=False),
                                         find, bool(check_first))
        return str(answer["requestId"]) if posted else ""

    def close_alert(self, alias: str, note: str | None = None) -> str:
        """``POST /v2/alerts/{alias}/close?identifierType=alias``; return the ``requestId``.

        Idempotent by the alert's state: a close of a closed alert is refused ("Alert is already
        closed" in the request status) and its note is not added, so retries keep plain back-off.
        """
        body: dict[str, Any] = dict(self._common())
        if note:
            body["note"] = clip(note, OG_NOTE_MAX)
        return str(self._post(f"/v2/alerts/{quote(alias, safe='')}/close", body, {"identifierType": "alias"})["requestId"])

    def get_alert(self, alias: str) -> dict[str, Any] | None:
        """``GET /v2/alerts/{alias}?identifierType=alias``: the alert (``data``), or None on 404."""
        url = f"{_base(self.base_url)}/v2/alerts/{quote(alias, safe='')}"
        with self._client() as client:
            try:
                response = self._send(client, "opsgenie", "GET", url, params={"identifierType": "alias"})
            except HttpApiError as e:
                if e.status == 404:
                    return None
                raise
        data = self._json(response, "opsgenie", "GET")
        return data.get("data") if isinstance(data, dict) else None

    def request_status(self, request_id: str) -> dict[str, Any]:
        """``GET /v2/alerts/requests/{requestId}``: ``{"isSuccess", "status", "alertId", "alias", ...}``."""
        url = f"{_base(self.base_url)}/v2/alerts/requests/{quote(request_id, safe='')}"
        with self._client() as client:
            response = self._send(client, "opsgenie", "GET", url)
        data = self._json(response, "opsgenie", "GET")
        if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
            raise HttpApiError("opsgenie", "GET", httpx.URL(url).path, response.status_code, "response has no 'data'")
        return data["data"]

    # -- Pager -----------------------------------------------------------------------------

    def trigger(self, incident_id: str, summary: str, *, severity: Severity = "error",
                details: Mapping[str, Any] | None = None, links: Sequence[tuple[str, str]] = ()) -> str:
        """Create (or deduplicate into) the alert for ``incident_id``; return its alias.

        The full summary and the links go into ``description``; ``message`` is its first 130
        characters. Severity maps to priority with :data:`OPSGENIE_PRIORITY`.
        """
        if severity not in OPSGENIE_PRIORITY:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, got {severity!r}")
        alias = dedup_key_for(incident_id)
        description = "\n".join([summary, *(f"{text}: {href}" for href, text in links)])
        self.create_alert(alias, summary, description=description, priority=OPSGENIE_PRIORITY[severity],
                          details={"dw_incident_id": incident_id, **dict(details or {})})
        return alias

    def annotate(self, incident_id: str, text: str, *, ref: str | None = None,
                 check_first: bool | None = None) -> None:
        """Add ``text`` as a note on the incident's alert, at most once per ``ref`` (see :meth:`add_note`)."""
        self.add_note(dedup_key_for(incident_id), text, ref=ref, check_first=check_first)

    def resolution_steps(self, incident_id: str, *, receipt_url: str | None = None,
                         note: str | None = None) -> list[PagerStep]:
        """:meth:`resolve` as its side effects: one ``close`` step (idempotent, carries the note)."""
        text = _resolve_text(receipt_url, note) or "Resolved by dw_dagster."

        def close(ref: str | None, check_first: bool | None) -> dict[str, Any]:
            return {"request_id": self.close_alert(dedup_key_for(incident_id), text)}
        return [("close", close)]

    def resolve(self, incident_id: str, *, receipt_url: str | None = None, note: str | None = None) -> None:
        """Close the alert; the close carries the receipt link as its note."""
        for _, run in self.resolution_steps(incident_id, receipt_url=receipt_url, note=note):
            run(None, None)


def _resolve_text(receipt_url: str | None, note: str | None) -> str | None:
    """The resolve note: ``note`` as given when it already holds the link, else the link plus ``note``."""
    if note and (not receipt_url or receipt_url in note):
        return note
    if receipt_url or note:
        return resolution_note(receipt_url, extra=note)
    return None


def _string_details(details: Mapping[str, Any], budget: int) -> dict[str, str]:
    """Opsgenie ``details``: a string → string map within ``budget`` characters (keys + values)."""
    out: dict[str, str] = {}
    used = 0
    for key, value in details.items():
        k, v = str(key), value if isinstance(value, str) else repr(value)
        room = budget - used - len(k)
        if room <= 0:
            break
        v = clip(v, room)
        out[k] = v
        used += len(k) + len(v)
    return out


# -- page text from dw_dagster records ---------------------------------------------------------

def _names(items: Iterable[str], limit: int = 10) -> str:
    items = list(items)
    if not items:
        return "none"
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def exposure_label(exposure: ExposureRef) -> str:
    """``Store P&L (dashboard, owner Priya Raman <priya@...>)`` for a dbt exposure."""
    parts = [exposure.type] if exposure.type else []
    owner = " ".join(x for x in (exposure.owner_name, f"<{exposure.owner_email}>" if exposure.owner_email else None) if x)
    if owner:
        parts.append(f"owner {owner}")
    return (exposure.label or exposure.name) + (f" ({', '.join(parts)})" if parts else "")


def blast_radius_lines(diagnosis: Diagnosis) -> list[str]:
    """One line each for models, tests, exposures (with owners) and owners of the blast radius."""
    br = diagnosis.blast_radius
    exposures = [exposure_label(e) for e in br.exposures]
    return [
        f"Models: {_names(m.name for m in br.models)}",
        f"dbt tests: {len(br.tests)}",
        f"Exposures: {_names(exposures)}",
        f"Owners: {_names(br.owners)}",
    ]


def diagnosis_note(diagnosis: Diagnosis, *, links: Sequence[tuple[str, str]] = ()) -> str:
    """A page note: the primary cause with its numbers, the window, and the blast radius.

    Args:
        diagnosis: the dw_dagster diagnosis.
        links: ``(href, text)`` pairs appended as "text: href" lines (e.g. the asset page).

    Returns:
        Plain text, a few hundred characters for a typical diagnosis (no vendor limit is near).
    """
    lines = [f"dw_dagster diagnosis {diagnosis.id} for incident {diagnosis.incident_id} "
             f"on {'/'.join(diagnosis.asset_key)}"]
    cause = diagnosis.primary
    if cause is None:
        lines.append(f"Cause: not found; {diagnosis.gap_rows:,} rows unexplained.")
    else:
        lines.append(f"Cause: {cause.kind} (confidence {cause.confidence:.0%}): {cause.summary}")
        lines.append(f"Explains {cause.explained_rows:,} of {diagnosis.gap_rows:,} rows; "
                     f"{diagnosis.unexplained_rows:,} unexplained.")
        if cause.window:
            lines.append(f"Window: {', '.join(cause.window)}")
    lines.append("Blast radius:")
    lines += [f"  {line}" for line in blast_radius_lines(diagnosis)]
    lines += [f"{text}: {href}" for href, text in links]
    return "\n".join(lines)


def resolution_note(receipt_url: str | None, receipts: Sequence[Receipt] = (), *, extra: str | None = None) -> str:
    """A page note for the resolution: the receipt link and, per receipt, asset and verification.

    Args:
        receipt_url: where the receipt can be read (e.g. the asset's page in the Dagster UI).
        receipts: the receipts written by the repair (may be empty).
        extra: a free-text line appended at the end.
    """
    lines = ["Resolved by dw_dagster: repaired, verified, receipt written."]
    if receipt_url:
        lines.append(f"Receipt: {receipt_url}")
    for r in receipts:
        lines.append(f"- {'/'.join(r.asset_key)}: change set {r.change_set_id}, approved by {r.approver}, "
                     f"partitions {', '.join(r.partitions) or 'none'}, verified={r.verified}")
    if extra:
        lines.append(extra)
    return "\n".join(lines)


def page_incident(pager: Pager, incident: Incident, *, severity: Severity = "error",
                  links: Sequence[tuple[str, str]] = ()) -> str:
    """Trigger the page for a dw_dagster :class:`~dw_dagster.models.Incident`; return the vendor key.

    The summary is the incident's summary prefixed with the asset key; details carry the incident
    id, asset, check, gap rows and gap percent.
    """
    asset = "/".join(incident.asset_key)
    details = {"incident_id": incident.id, "asset": asset, "check": incident.check_name or "",
               "gap_rows": incident.gap_rows, "gap_pct": round(incident.gap_pct, 4),
               "detected_at": incident.detected_at.isoformat()}
    return pager.trigger(incident.id, f"[dw_dagster] {asset}: {incident.summary}", severity=severity,
                         details=details, links=links)


__all__ = [
    "OPSGENIE_PRIORITY",
    "OpsgenieResource",
    "Pager",
    "PagerDutyResource",
    "PagerStep",
    "blast_radius_lines",
    "clip",
    "dedup_key_for",
    "diagnosis_note",
    "exposure_label",
    "page_incident",
    "resolution_note",
]
