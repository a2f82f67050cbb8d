"""Tableau REST API: refresh a workbook's extract after a verified repair, before its dashboard is needed.

Calls (Tableau REST API reference, "Authentication Methods", "Workbooks and Views Methods → Update
Workbook Now", "Jobs, Tasks, and Schedules → Query Job"), JSON throughout (``Accept:
application/json``):

- ``POST /api/{version}/auth/signin`` with ``{"credentials": {"personalAccessTokenName",
  "personalAccessTokenSecret", "site": {"contentUrl"}}}`` → ``{"credentials": {"token", "site":
  {"id", "contentUrl"}, "user": {"id"}}}``; later calls carry ``X-Tableau-Auth: <token>``;
- ``GET /api/{version}/sites/{site-id}/workbooks?filter=name:eq:<name>`` → ``{"workbooks":
  {"workbook": [{"id", "name", ...}]}}`` (a workbook named by its name);
- ``POST /api/{version}/sites/{site-id}/workbooks/{workbook-id}/refresh`` with ``{}`` → 202
  ``{"job": {"id", "mode": "Asynchronous", "type": "RefreshExtract", "createdAt"}}``;
- ``GET /api/{version}/sites/{site-id}/jobs/{job-id}`` → ``{"job": {..., "progress",
  "startedAt", "completedAt", "finishCode"}}``: ``finishCode`` 0 succeeded, 1 failed, 2 cancelled;
  absent while the job runs;
- ``POST /api/{version}/auth/signout``.

The refresh is a POST that starts a job each time, so it is sent once (``idempotent=False``): a
request that may have reached the server is not sent again blindly.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from dw_dagster.core.http import HttpApiError, RetryPolicy, json_body, send
from dw_dagster.errors import DwDagsterError

SERVICE = "tableau"
API_VERSION = "3.22"


class TableauRefreshFailed(DwDagsterError, RuntimeError):
    """A workbook's extract refresh job ended without success (finishCode 1 or 2), or did not end in time."""


@dataclass(frozen=True)
class RefreshResult:
    """One finished extract refresh: the job, when it completed (aware UTC), its finish code."""

    workbook_id: str
    job_id: str
    completed_at: dt.datetime
    finish_code: int


def _ts(text: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


class TableauClient:
    """Sign in with a personal access token, refresh a workbook's extract, wait for its job.

    Args:
        server: the Tableau Server or Cloud URL (``https://10ax.online.tableau.com``).
        site: the site's content URL (``""`` for the default site).
        token_name, token_secret: the personal access token.
        version: the REST API version.
    """

    def __init__(self, server: str, site: str, token_name: str, token_secret: str, *, version: str = API_VERSION,
                 policy: RetryPolicy = RetryPolicy(), sleep: Callable[[float], None] = time.sleep) -> None:
        self._http = httpx.Client(base_url=server.rstrip("/") + f"/api/{version}",
                                  headers={"Accept": "application/json", "Content-Type": "application/json"},
                                  timeout=policy.timeout_s)
        self._site, self._name, self._secret, self._policy, self._sleep = site, token_name, token_secret, policy, sleep
        self.site_id: str | None = None

    def __enter__(self) -> "TableauClient":
        self.sign_in()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def sign_in(self) -> None:
        """Sign in; the token goes into every later request's ``X-Tableau-Auth``."""
        body = {"credentials": {"personalAccessTokenName": self._name, "personalAccessTokenSecret": self._secret,
                                "site": {"contentUrl": self._site}}}
        r = send(self._http, SERVICE, "POST", "/auth/signin", json=body, policy=self._policy, sleep=self._sleep)
        cred = json_body(r, SERVICE, "POST")["credentials"]
        self._http.headers["X-Tableau-Auth"] = cred["token"]
        self.site_id = cred["site"]["id"]

    def workbook_id(self, name: str) -> str:
        """The id of the site's workbook named ``name``.

        Raises:
            HttpApiError: no such workbook (404-like, with the name).
        """
        r = send(self._http, SERVICE, "GET", f"/sites/{self.site_id}/workbooks", params={"filter": f"name:eq:{name}"},
                 policy=self._policy, sleep=self._sleep)
        found = (json_body(r, SERVICE, "GET").get("workbooks") or {}).get("workbook") or []
        if not found:
            raise HttpApiError(SERVICE, "GET", f"/sites/{self.site_id}/workbooks", 404, f"no workbook named {name!r}")
        return found[0]["id"]

    def refresh(self, workbook_id: str) -> str:
        """Start the workbook's extract refresh; the job id."""
        r = send(self._http, SERVICE, "POST", f"/sites/{self.site_id}/workbooks/{workbook_id}/refresh", json={},
                 policy=self._policy, sleep=self._sleep, idempotent=False)
        return json_body(r, SERVICE, "POST")["job"]["id"]

    def wait(self, workbook_id: str, job_id: str, *, timeout_s: float = 1800.0, poll_s: float = 5.0) -> RefreshResult:
        """Poll the job until it ends.

        Raises:
            TableauRefreshFailed: the job failed or was cancelled, or did not end within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            r = send(self._http, SERVICE, "GET", f"/sites/{self.site_id}/jobs/{job_id}", policy=self._policy,
                     sleep=self._sleep)
            job = json_body(r, SERVICE, "GET")["job"]
            if job.get("finishCode") is not None:
                code = int(job["finishCode"])
                if code != 0:
                    raise TableauRefreshFailed(f"extract refresh job {job_id} of workbook {workbook_id} ended with "
                                               f"finishCode {code} ({'failed' if code == 1 else 'cancelled'})")
                return RefreshResult(workbook_id, job_id, _ts(job.get("completedAt")) or dt.datetime.now(dt.timezone.utc), 0)
            if time.monotonic() > deadline:
                raise TableauRefreshFailed(f"extract refresh job {job_id} of workbook {workbook_id} did not end within "
                                           f"{timeout_s:.0f} s (progress {job.get('progress', '?')} %)")
            self._sleep(poll_s)

    def close(self) -> None:
        """Sign out (best effort) and close the connection."""
        try:
            if "X-Tableau-Auth" in self._http.headers:
                send(self._http, SERVICE, "POST", "/auth/signout", policy=RetryPolicy(attempts=1), sleep=self._sleep)
        except HttpApiError:
            pass
        finally:
            self._http.close()


__all__ = ["API_VERSION", "RefreshResult", "TableauClient", "TableauRefreshFailed"]
