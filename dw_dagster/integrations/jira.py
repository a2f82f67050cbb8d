"""Jira Cloud over its REST API v3: one issue per dw_dagster incident, comments in ADF, done on a verified receipt.

Endpoints (Atlassian developer docs, "The Jira Cloud platform REST API v3"):

- ``POST /rest/api/3/issue`` ("Create issue"): ``{"fields": {"project": {"key"}, "issuetype": {"name"},
  "summary", "description": <ADF>, "labels"}}`` → 201 ``{"id", "key", "self"}``;
- ``POST /rest/api/3/search/jql`` ("Search for issues using JQL (enhanced search)"): ``{"jql",
  "fields", "maxResults", "nextPageToken"}`` → ``{"issues", "nextPageToken"?, "isLast"}``;
- ``POST``/``GET /rest/api/3/issue/{key}/comment`` ("Add comment" with an ADF ``body``, "Get
  comments" paged by ``startAt``/``maxResults``, ``{"comments", "total"}``);
- ``GET``/``POST /rest/api/3/issue/{key}/transitions`` ("Get transitions": each with ``to.statusCategory.key``;
  "Transition issue": ``{"transition": {"id"}}`` → 204);
- ``GET /rest/api/3/issue/{key}?fields=status``.

Basic auth with an Atlassian account email and an API token (``api_token=dg.EnvVar("JIRA_API_TOKEN")``).

**Why not the ``jira`` package or atlassian-python-api.** Neither keeps the exactly-once contract:
``jira``'s ``ResilientSession`` sends any request again, a ``POST`` that created an issue or a comment
included, after a connection error or a 502/503/504 (pycontribs/jira ``jira/resilientsession.py``),
which is how a lost answer becomes a duplicate; its comments and search default to REST v2 (plain
text, the deprecated ``/search``). atlassian-python-api has no look-up before a retry of a lost create
either. What the contract needs — never re-sending a create blindly, looking it up by its label while
Jira's search index catches up, ADF bodies — is a few calls, so this is httpx on dw_dagster's retry
policy (:func:`~dw_dagster.core.http.send`, tenacity).

**Exactly once.** Creating an issue and adding a comment are not idempotent. The issue carries the
label ``dw-incident-<incident id>``; before a create that may repeat an earlier attempt, and after
a create whose answer was lost (a timeout once sent, a 5xx), the label is searched. Jira's search
index is eventually consistent (a just-created issue can be missing from JQL results for a few
seconds), so the look-up after a lost answer is retried for up to ``search_wait_s`` before a new
create is allowed. A comment carries the marker line (:func:`~dw_dagster.core.http.marker_line`)
and is looked up in the issue's comments the same way. 429 (with ``Retry-After``) and connection
failures before sending are retried (the request was not processed); a transition to done is
skipped when the issue is already done, so it may repeat.
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import Field

from dw_dagster.dagster_private import public

from dw_dagster.core.http import HttpApiError, has_marker, with_marker
from dw_dagster.integrations.paging import _VendorResource, clip
from dw_dagster.integrations.tickets import Ticket, adf, adf_text

SUMMARY_MAX = 255  # Jira: "summary" is a single line of at most 255 characters
LABEL_PREFIX = "dw-incident-"


def incident_label(incident_id: str) -> str:
    """``dw-incident-<id>``: Jira labels hold no spaces; anything outside ``[A-Za-z0-9_.-]`` becomes ``_``."""
    return LABEL_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", incident_id)[:240]


@public
class JiraResource(_VendorResource):
    """Jira Cloud (see the module docstring). ``kind`` is ``jira`` (its notification channel)."""

    base_url: str = Field(description="https://<site>.atlassian.net")
    email: str = Field(description="the Atlassian account the API token belongs to")
    api_token: str = Field(description="an Atlassian API token (dg.EnvVar('JIRA_API_TOKEN'))")
    project_key: str = Field(description="the project dw_dagster opens issues in, e.g. DATA")
    issue_type: str = Field(default="Task", description="the issue type of new issues")
    done_transition: str | None = Field(default=None, description="the transition to take to done (default: the "
                                        "first whose target status is in the done category)")
    search_wait_s: float = Field(default=10.0, description="how long a look-up after a lost create waits for the "
                                 "search index, seconds")

    @property
    def kind(self) -> str:
        return "jira"

    def _secrets(self) -> list[str]:
        return [self.api_token]

    def _url(self, path: str) -> str:
        return f"{self.base_url.rstrip('/')}/rest/api/3{path}"

    def _call(self, method: str, path: str, *, idempotent: bool = True, **kwargs: Any) -> Any:
        with httpx.Client(auth=(self.email, self.api_token), headers={"Accept": "application/json"}) as client:
            response = self._send(client, "jira", method, self._url(path), idempotent=idempotent, **kwargs)
        return self._json(response, "jira", method) if response.content else {}

    def browse_url(self, key: str) -> str:
        return f"{self.base_url.rstrip('/')}/browse/{quote(key, safe='')}"

    def _ticket(self, issue: dict[str, Any], opened_by: str = "dw_dagster") -> Ticket:
        return Ticket(key=str(issue["key"]), id=str(issue.get("id", "")), url=self.browse_url(str(issue["key"])),
                      opened_by=opened_by)

    # -- search ----------------------------------------------------------------------------

    def search(self, jql: str, *, fields: tuple[str, ...] = ("summary", "status", "labels"), limit: int = 50) -> list[dict]:
        """Issues matching ``jql`` (enhanced search, every page up to ``limit`` issues)."""
        out: list[dict] = []
        token: str | None = None
        while len(out) < limit:
            body: dict[str, Any] = {"jql": jql, "fields": list(fields), "maxResults": min(100, limit - len(out))}
            if token:
                body["nextPageToken"] = token
            page = self._call("POST", "/search/jql", json=body)
            out += [i for i in page.get("issues") or [] if isinstance(i, dict)]
            token = page.get("nextPageToken")
            if page.get("isLast", True) or not token:
                break
        return out

    def find_ticket(self, incident_id: str) -> Ticket | None:
        """The issue labelled ``dw-incident-<id>`` in the project (the oldest, if someone copied the label)."""
        jql = f'project = "{self.project_key}" AND labels = "{incident_label(incident_id)}" ORDER BY created ASC'
        found = self.search(jql, limit=5)
        return self._ticket(found[0]) if found else None

    def _find_waiting(self, incident_id: str) -> Ticket | None:
        deadline = time.monotonic() + self.search_wait_s
        while True:
            found = self.find_ticket(incident_id)
            if found is not None or time.monotonic() >= deadline:
                return found
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def find_alerting_ticket(self, lightup_incident_uuid: str, config: dict[str, Any]) -> Ticket | None:
        """The issue Lightup's Jira channel opened: the one whose text holds the Lightup incident's uuid
        (in the project the channel names, when it names one)."""
        project = config.get("projectKey") or config.get("project_key")
        jql = (f'project = "{project}" AND ' if project else "") + f'text ~ "\\"{lightup_incident_uuid}\\"" ORDER BY created ASC'
        found = self.search(jql, limit=5)
        return self._ticket(found[0], "lightup") if found else None

    # -- write -----------------------------------------------------------------------------

    def open_ticket(self, incident_id: str, summary: str, description: str, *, check_first: bool = True) -> Ticket:
        """Create the issue for ``incident_id`` at most once (labelled ``dw-incident-<id>``)."""
        body = {"fields": {"project": {"key": self.project_key}, "issuetype": {"name": self.issue_type},
                           "summary": clip(" ".join(summary.split()), SUMMARY_MAX), "description": adf(description),
                           "labels": [incident_label(incident_id), "dw-dagster"]}}

        def post() -> Ticket:
            created = self._call("POST", "/issue", idempotent=False, json=body)
            if not isinstance(created, dict) or "key" not in created:
                raise HttpApiError("jira", "POST", "/rest/api/3/issue", 201, f"no issue key in the answer: {str(created)[:200]}")
            return self._ticket(created)

        ticket, _ = self._post_once(post, lambda: self._find_waiting(incident_id), check_first)
        return ticket

    def comments(self, key: str) -> list[dict]:
        out, start = [], 0
        while True:
            page = self._call("GET", f"/issue/{quote(key, safe='')}/comment", params={"startAt": start, "maxResults": 100})
            rows = [c for c in page.get("comments") or [] if isinstance(c, dict)]
            out += rows
            start += len(rows)
            if not rows or start >= int(page.get("total") or 0):
                return out

    def comment(self, ticket: Ticket, text: str, *, ref: str | None, check_first: bool | None = None) -> dict[str, Any]:
        """``POST /issue/{key}/comment`` with the text as ADF, at most once per ``ref``."""
        full = with_marker(text, ref, 32000)

        def post() -> dict[str, Any]:
            made = self._call("POST", f"/issue/{quote(ticket.key, safe='')}/comment", idempotent=False,
                              json={"body": adf(full)})
            return {"comment_id": str(made.get("id", "")), "ref": ref}

        def find() -> dict[str, Any] | None:
            hit = next((c for c in self.comments(ticket.key) if has_marker(adf_text(c.get("body")), ref)), None)
            return {"comment_id": str(hit.get("id", "")), "ref": ref, "deduplicated": True} if hit else None

        answer, _ = self._post_once(post, find if ref else None, True if check_first is None else check_first)
        return answer

    def close(self, ticket: Ticket, text: str) -> dict[str, Any]:
        """Transition the issue to a status in the done category (nothing when it is there already)."""
        issue = self._call("GET", f"/issue/{quote(ticket.key, safe='')}", params={"fields": "status"})
        status = ((issue.get("fields") or {}).get("status") or {})
        if (status.get("statusCategory") or {}).get("key") == "done":
            return {"status": status.get("name"), "already": True}
        options = self._call("GET", f"/issue/{quote(ticket.key, safe='')}/transitions").get("transitions") or []
        done = [t for t in options if ((t.get("to") or {}).get("statusCategory") or {}).get("key") == "done"]
        if self.done_transition:
            done = [t for t in done if str(t.get("name", "")).lower() == self.done_transition.lower()] or done
        if not done:
            raise HttpApiError("jira", "POST", f"/rest/api/3/issue/{ticket.key}/transitions", 200,
                               f"no transition from {status.get('name')!r} leads to a done status "
                               f"(offered: {', '.join(str(t.get('name')) for t in options) or 'none'})")
        self._call("POST", f"/issue/{quote(ticket.key, safe='')}/transitions", json={"transition": {"id": str(done[0]["id"])}})
        return {"status": (done[0].get("to") or {}).get("name"), "transition": done[0].get("name")}


__all__ = ["JiraResource", "incident_label"]
