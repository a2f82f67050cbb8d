"""Opsgenie over its Alert API (Create Alert, Add Note, Close Alert, Get Request Status), the alert addressed by its ``alias``.

Opsgenie de-duplicates a Create Alert whose alias matches an open alert and refuses to close a
closed one; a note with an idempotency ref is looked up first (``GET /v2/alerts/{alias}/notes``).
The protocol, the note texts and the exactly-once rules are in :mod:`dw_dagster.integrations.paging`.
"""

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
from pydantic import Field

from dw_dagster.core.http import HttpApiError, has_marker, with_marker
from dw_dagster.integrations.paging import (
    OPSGENIE_PRIORITY,
    SEVERITIES,
    PagerStep,
    Severity,
    _base,
    _resolve_text,
    _string_details,
    _VendorResource,
    clip,
    dedup_key_for,
)
from dw_dagster.dagster_private import public

#: Opsgenie Alert API limits ("Create Alert": message ≤ 130, alias ≤ 512, description ≤ 15000,
#: source ≤ 100, user ≤ 100, details ≤ 8000 characters in all; "Add Note": note ≤ 25000).
OG_MESSAGE_MAX = 130


OG_ALIAS_MAX = 512


OG_DESCRIPTION_MAX = 15000


OG_NOTE_MAX = 25000


OG_SHORT_MAX = 100


OG_DETAILS_MAX = 8000


#: Opsgenie "List Alert Notes": at most 100 notes a page.
OG_NOTES_PAGE = 100


@public
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
