"""PagerDuty over its real HTTP APIs: alert events through the Events API v2, notes through the REST API v2.

Triggers and resolves are folded by ``dedup_key`` into the one open incident ("Events API v2 → Alert
de-duplication"); notes are not, so a note with an idempotency ref is looked up first
(``GET /incidents/{id}/notes``) whenever an earlier attempt may have been applied. The protocol,
the note texts and the exactly-once rules are in :mod:`dw_dagster.integrations.paging`.
"""

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import quote

import dagster as dg
import httpx
from pydantic import Field

from dw_dagster.core.http import HttpApiError, has_marker, with_marker
from dw_dagster.integrations.paging import (
    PD_DEDUP_KEY_MAX,
    SEVERITIES,
    PagerStep,
    Severity,
    _base,
    _resolve_text,
    _VendorResource,
    clip,
    dedup_key_for,
)
from dw_dagster.dagster_private import public

#: PagerDuty Events API v2 limits ("Send an Alert Event": dedup_key ≤ 255, payload.summary ≤ 1024).


PD_SUMMARY_MAX = 1024


PAGERDUTY_ACCEPT = "application/vnd.pagerduty+json;version=2"


@public
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
