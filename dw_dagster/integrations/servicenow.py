"""ServiceNow over the Table API: one incident per dw_dagster incident, work notes, resolved on a verified receipt.

Endpoints (ServiceNow docs, "Table API"; the ``incident`` and ``sys_journal_field`` tables):

- ``GET /api/now/table/incident?sysparm_query=correlation_id=<id>`` (encoded query; ``sysparm_fields``,
  ``sysparm_limit``) → ``{"result": [...]}``;
- ``POST /api/now/table/incident`` → 201 ``{"result": {sys_id, number, state, ...}}`` with
  ``correlation_id`` = the dw_dagster incident id and ``correlation_display`` = ``dw_dagster``
  (the fields ServiceNow provides for a record's id in an external system);
- ``PATCH /api/now/table/incident/{sys_id}`` with ``work_notes`` (each write adds one journal
  entry) or ``state`` = 6 (Resolved) with ``close_code`` and ``close_notes`` (ServiceNow's data
  policy refuses a resolution without them);
- ``GET /api/now/table/sys_journal_field?sysparm_query=element_id=<sys_id>^element=work_notes``
  (the incident's work notes).

Basic auth with an integration user (``password=dg.EnvVar("SERVICENOW_PASSWORD")``). pysnow is
unmaintained since 2021, so this is httpx on dw_dagster's retry policy (:func:`~dw_dagster.core.http.send`).

**Exactly once.** Creating the incident and adding a work note are not idempotent: the create is
looked up by ``correlation_id`` before it may repeat an attempt and after an answer was lost; a
work note carries the marker line (:func:`~dw_dagster.core.http.marker_line`) and is looked up in
``sys_journal_field`` the same way. Resolving is a PATCH of fields to fixed values (idempotent),
skipped when the incident is already resolved or closed. 429 with ``Retry-After`` (ServiceNow's
rate-limit rules answer so) is honoured.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
from pydantic import Field

from dw_dagster.dagster_private import public

from dw_dagster.core.http import HttpApiError, has_marker, marker_line, with_marker
from dw_dagster.integrations.paging import _VendorResource, clip
from dw_dagster.integrations.tickets import Ticket

#: incident states (ServiceNow's incident table: 1 New, 2 In Progress, 3 On Hold, 6 Resolved, 7 Closed, 8 Canceled)
RESOLVED, CLOSED, CANCELED = "6", "7", "8"
SHORT_DESCRIPTION_MAX = 160


def _encoded(value: str) -> str:
    """A value for an encoded query: ``^`` separates clauses, so it is doubled as ServiceNow escapes it."""
    return value.replace("^", "^^")


@public
class ServiceNowResource(_VendorResource):
    """ServiceNow's Table API (see the module docstring). ``kind`` is ``servicenow`` (its notification channel)."""

    instance_url: str = Field(description="https://<instance>.service-now.com")
    username: str = Field(description="the integration user")
    password: str = Field(description="its password (dg.EnvVar('SERVICENOW_PASSWORD'))")
    assignment_group: str | None = Field(default=None, description="sys_id or name of the group new incidents go to")
    caller_id: str | None = Field(default=None, description="the caller of new incidents (a sys_user)")
    category: str | None = Field(default=None, description="category of new incidents, e.g. software")
    close_code: str = Field(default="Solution provided", description="the resolution code a verified repair "
                            "resolves with: a choice of incident.close_code on your instance (releases since Utah offer "
                            "'Solution provided'; older ones 'Solved (Permanently)')")

    @property
    def kind(self) -> str:
        return "servicenow"

    def _secrets(self) -> list[str]:
        return [self.password]

    def _url(self, path: str) -> str:
        return f"{self.instance_url.rstrip('/')}/api/now/table/{path}"

    def _call(self, method: str, path: str, *, idempotent: bool = True, **kwargs: Any) -> Any:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        with httpx.Client(auth=(self.username, self.password), headers=headers) as client:
            response = self._send(client, "servicenow", method, self._url(path), idempotent=idempotent, **kwargs)
        body = self._json(response, "servicenow", method)
        if not isinstance(body, dict) or "result" not in body:
            raise HttpApiError("servicenow", method, f"/api/now/table/{path.split('?')[0]}", response.status_code,
                               f"no 'result' in the answer: {str(body)[:200]}")
        return body["result"]

    def record_url(self, sys_id: str) -> str:
        return f"{self.instance_url.rstrip('/')}/nav_to.do?uri=incident.do?sys_id={quote(sys_id, safe='')}"

    def _ticket(self, row: dict[str, Any], opened_by: str = "dw_dagster") -> Ticket:
        return Ticket(key=str(row.get("number") or row["sys_id"]), id=str(row["sys_id"]), url=self.record_url(str(row["sys_id"])),
                      opened_by=opened_by)

    def query(self, encoded: str, *, fields: str = "sys_id,number,state,correlation_id", limit: int = 5) -> list[dict]:
        rows = self._call("GET", "incident", params={"sysparm_query": encoded, "sysparm_fields": fields,
                                                     "sysparm_limit": str(limit)})
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

    def find_ticket(self, incident_id: str) -> Ticket | None:
        """The incident whose ``correlation_id`` is the dw_dagster incident id (the oldest), or None."""
        found = self.query(f"correlation_id={_encoded(incident_id)}^ORDERBYsys_created_on")
        return self._ticket(found[0]) if found else None

    def find_alerting_ticket(self, lightup_incident_uuid: str, config: dict[str, Any]) -> Ticket | None:
        """The incident Lightup's ServiceNow channel opened: ``correlation_id`` (or, failing that, the
        description) holds the Lightup incident's uuid."""
        u = _encoded(lightup_incident_uuid)
        found = self.query(f"correlation_id={u}^ORdescriptionLIKE{u}^ORDERBYsys_created_on")
        return self._ticket(found[0], "lightup") if found else None

    def open_ticket(self, incident_id: str, summary: str, description: str, *, check_first: bool = True) -> Ticket:
        """Create the incident for ``incident_id`` at most once (``correlation_id`` = the id)."""
        body: dict[str, Any] = {"short_description": clip(" ".join(summary.split()), SHORT_DESCRIPTION_MAX),
                                "description": description, "correlation_id": incident_id,
                                "correlation_display": "dw_dagster", "urgency": "2", "impact": "2"}
        for name in ("assignment_group", "caller_id", "category"):
            if getattr(self, name):
                body[name] = getattr(self, name)

        def post() -> Ticket:
            row = self._call("POST", "incident", idempotent=False, json=body,
                             params={"sysparm_fields": "sys_id,number,state,correlation_id"})
            if not isinstance(row, dict) or "sys_id" not in row:
                raise HttpApiError("servicenow", "POST", "/api/now/table/incident", 201, f"no sys_id: {str(row)[:200]}")
            return self._ticket(row)

        ticket, _ = self._post_once(post, lambda: self.find_ticket(incident_id), check_first)
        return ticket

    def work_notes(self, sys_id: str, containing: str | None = None) -> list[dict]:
        q = f"element_id={_encoded(sys_id)}^element=work_notes" + (f"^valueLIKE{_encoded(containing)}" if containing else "")
        rows = self._call("GET", "sys_journal_field", params={"sysparm_query": q + "^ORDERBYsys_created_on",
                                                              "sysparm_fields": "sys_id,value,sys_created_on",
                                                              "sysparm_limit": "1000"})
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

    def comment(self, ticket: Ticket, text: str, *, ref: str | None, check_first: bool | None = None) -> dict[str, Any]:
        """A work note on the incident, at most once per ``ref``."""
        full = with_marker(text, ref)

        def post() -> dict[str, Any]:
            self._call("PATCH", f"incident/{quote(ticket.id, safe='')}", idempotent=False, json={"work_notes": full},
                       params={"sysparm_fields": "sys_id"})
            return {"ref": ref}

        def find() -> dict[str, Any] | None:
            hit = next((n for n in self.work_notes(ticket.id, marker_line(ref)) if has_marker(n.get("value"), ref)), None)
            return {"ref": ref, "journal_id": hit.get("sys_id"), "deduplicated": True} if hit else None

        answer, _ = self._post_once(post, find if ref else None, True if check_first is None else check_first)
        return answer

    def close(self, ticket: Ticket, text: str) -> dict[str, Any]:
        """Resolve the incident (state 6, ``close_code``, ``close_notes``); nothing when it is resolved or closed."""
        rows = self.query(f"sys_id={_encoded(ticket.id)}", fields="sys_id,state")
        if rows and str(rows[0].get("state")) in (RESOLVED, CLOSED, CANCELED):
            return {"state": str(rows[0].get("state")), "already": True}
        self._call("PATCH", f"incident/{quote(ticket.id, safe='')}", params={"sysparm_fields": "sys_id,state"},
                   json={"state": RESOLVED, "close_code": self.close_code, "close_notes": clip(text, 4000)})
        return {"state": RESOLVED, "close_code": self.close_code}


__all__ = ["ServiceNowResource"]
