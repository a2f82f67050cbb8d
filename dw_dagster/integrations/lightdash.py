"""Lightdash REST API: refresh a dashboard's charts after a verified repair, before the dashboard is needed.

A Lightdash dashboard has no extract: its tiles are saved charts whose queries Lightdash runs (and
caches) when someone opens it. "Refreshed" therefore means: the dashboard's result cache is
invalidated and every chart tile's query has run again against the repaired warehouse; the
refresh time is when the last of those queries was ready (the server's clock, its ``Date``
header). Calls (Lightdash API reference, JSON envelopes ``{"status": "ok", "results": ...}`` and
``{"status": "error", "error": {"name", "statusCode", "message"}}``):

- every request carries ``Authorization: ApiKey <personal access token>`` (``Bearer`` for a
  service-account token, ``ldsvc_...``); a bad token answers 401, a token without access 403;
- ``GET /api/v1/dashboards/{uuid-or-slug}`` → ``{"uuid", "name", "slug", "projectUuid", "updatedAt",
  "tiles": [{"uuid", "type": "saved_chart", "properties": {"savedChartUuid", "title"}}, ...]}``;
- a dashboard named by its name: ``GET /api/v2/content?projectUuids=<p>&contentTypes=dashboard&search=<name>&page=<n>&pageSize=<m>``
  → ``{"data": [{"uuid", "name", "contentType"}], "pagination": {"page", "pageSize", "totalPageCount",
  "totalResults"}}``, read page by page until the exact name is found;
- ``POST /api/v2/dashboards/{uuid}/results-cache/invalidate`` → ``{"invalidatedAt", "projectUuid"}``
  (needs project admin; a 403 there is not fatal, each query below also skips the cache);
- ``POST /api/v2/projects/{p}/query/dashboard-chart`` with ``{"tileUuid", "chartUuid", "dashboardUuid",
  "dashboardFilters": {"dimensions": [], "metrics": [], "tableCalculations": []}, "dashboardSorts": [],
  "invalidateCache": true}`` → ``{"queryUuid", "cacheMetadata": {"cacheHit"}, ...}``;
- ``GET /api/v2/projects/{p}/query/{queryUuid}?page=1&pageSize=<m>`` → ``{"status": "queued" | "executing"
  | "ready" | "error" | "cancelled" | "expired", "error"?, "rows"?, "totalPageCount"?, ...}``.

HTTP 429 (with ``Retry-After``), 5xx and transport errors are retried by :func:`dw_dagster.core.http.send`
(httpx + tenacity). Lightdash's official Python SDK (``lightdash``, 1.x) covers the semantic
layer's metric queries and the SQL runner, not dashboards, tiles or the results cache, and opens
a new connection per request without retries, so this client speaks the REST API with httpx.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from dw_dagster.core.http import HttpApiError, RetryPolicy, json_body, send
from dw_dagster.errors import DwDagsterError

SERVICE = "lightdash"
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
_NO_FILTERS = {"dimensions": [], "metrics": [], "tableCalculations": []}


class LightdashRefreshFailed(DwDagsterError, RuntimeError):
    """A chart query of the dashboard ended in error, was cancelled or expired, or did not finish in time."""


@dataclass(frozen=True)
class DashboardRefresh:
    """One refreshed dashboard: its charts' queries and when the last one was ready (aware UTC)."""

    dashboard_uuid: str
    name: str
    query_uuids: tuple[str, ...]
    refreshed_at: dt.datetime


def _server_time(response: httpx.Response) -> dt.datetime:
    """The server's ``Date`` header (aware UTC), else this machine's clock."""
    try:
        when = email.utils.parsedate_to_datetime(response.headers.get("date", ""))
    except (TypeError, ValueError, IndexError):
        when = None
    return when.astimezone(dt.timezone.utc) if when and when.tzinfo else dt.datetime.now(dt.timezone.utc)


class LightdashClient:
    """Find a dashboard, invalidate its cache and run its charts' queries again; a context manager.

    Args:
        url: the Lightdash instance (``https://app.lightdash.cloud``).
        api_key: a personal access token (or a service-account token, ``ldsvc_...``).
        project_uuid: the project the dashboards are in.
        page_size: the page size of the content search.
    """

    def __init__(self, url: str, api_key: str, project_uuid: str, *, policy: RetryPolicy = RetryPolicy(),
                 sleep: Callable[[float], None] = time.sleep, page_size: int = 50) -> None:
        scheme = "Bearer" if api_key.startswith("ldsvc_") else "ApiKey"
        self._http = httpx.Client(base_url=url.rstrip("/"), timeout=policy.timeout_s,
                                  headers={"Authorization": f"{scheme} {api_key}", "Accept": "application/json",
                                           "Content-Type": "application/json"})
        self.project_uuid, self._policy, self._sleep, self._page_size = project_uuid, policy, sleep, page_size

    def __enter__(self) -> "LightdashClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs) -> tuple[dict, httpx.Response]:
        r = send(self._http, SERVICE, method, path, policy=self._policy, sleep=self._sleep, **kwargs)
        body = json_body(r, SERVICE, method)
        if not isinstance(body, dict) or body.get("status") != "ok":
            raise HttpApiError(SERVICE, method, path, r.status_code, f"not an ok envelope: {str(body)[:200]}")
        return body.get("results"), r

    def find_dashboard(self, name: str) -> str:
        """The uuid of the project's dashboard named exactly ``name`` (the content search, page by page).

        Raises:
            HttpApiError: no dashboard of that name (404, with the name and the pages read).
        """
        page, pages = 1, 1
        while page <= pages:
            res, _ = self._call("GET", "/api/v2/content", params={
                "projectUuids": self.project_uuid, "contentTypes": "dashboard", "search": name,
                "page": page, "pageSize": self._page_size})
            found = next((d for d in res.get("data") or [] if d.get("name") == name), None)
            if found is not None:
                return str(found["uuid"])
            pages = int((res.get("pagination") or {}).get("totalPageCount") or 1)
            page += 1
        raise HttpApiError(SERVICE, "GET", "/api/v2/content", 404,
                           f"no dashboard named {name!r} in project {self.project_uuid} ({pages} page(s) read)")

    def dashboard(self, ref: str) -> dict:
        """The dashboard ``ref`` (a uuid, a slug, or its name)."""
        if not _UUID.match(ref) and not re.fullmatch(r"[a-z0-9-]+", ref):
            ref = self.find_dashboard(ref)
        try:
            res, _ = self._call("GET", f"/api/v1/dashboards/{ref}")
        except HttpApiError as e:
            if e.status != 404 or _UUID.match(ref):
                raise
            res, _ = self._call("GET", f"/api/v1/dashboards/{self.find_dashboard(ref)}")  # a name that looked like a slug
        return res

    def refresh(self, ref: str, *, poll_s: float = 2.0, timeout_s: float = 1800.0) -> DashboardRefresh:
        """Invalidate the dashboard's cache, run every chart tile's query again, wait for all to be ready.

        Raises:
            LightdashRefreshFailed: a query ended in error, was cancelled or expired, or not within ``timeout_s``.
            HttpApiError: the API refused (401 bad token, 403 no access, 404 no such dashboard) or stayed unreachable.
        """
        d = self.dashboard(ref)
        uuid, name = str(d["uuid"]), str(d.get("name") or ref)
        try:
            self._call("POST", f"/api/v2/dashboards/{uuid}/results-cache/invalidate", json={})
        except HttpApiError as e:
            if e.status != 403:  # not a project admin: each query below skips the cache anyway
                raise
        queries = []
        for tile in d.get("tiles") or []:
            chart = (tile.get("properties") or {}).get("savedChartUuid")
            if tile.get("type") != "saved_chart" or not chart:
                continue
            res, _ = self._call("POST", f"/api/v2/projects/{self.project_uuid}/query/dashboard-chart", json={
                "tileUuid": tile["uuid"], "chartUuid": chart, "dashboardUuid": uuid, "dashboardFilters": _NO_FILTERS,
                "dashboardSorts": [], "invalidateCache": True})
            queries.append((str(res["queryUuid"]), (tile.get("properties") or {}).get("title") or chart))
        if not queries:
            raise LightdashRefreshFailed(f"dashboard {name!r} ({uuid}) has no chart tile to refresh")
        deadline, last = time.monotonic() + timeout_s, None
        for qid, title in queries:
            while True:
                res, r = self._call("GET", f"/api/v2/projects/{self.project_uuid}/query/{qid}",
                                    params={"page": 1, "pageSize": 1})
                status = res.get("status")
                if status == "ready":
                    when = _server_time(r)
                    last = when if last is None or when > last else last
                    break
                if status in ("error", "cancelled", "expired"):
                    raise LightdashRefreshFailed(f"the query of chart {title!r} on dashboard {name!r} ended {status}: "
                                                 f"{res.get('error') or 'no error given'}")
                if time.monotonic() > deadline:
                    raise LightdashRefreshFailed(f"the query of chart {title!r} on dashboard {name!r} was still {status} "
                                                 f"after {timeout_s:.0f} s")
                self._sleep(poll_s)
        return DashboardRefresh(uuid, name, tuple(q for q, _ in queries), last)

    def close(self) -> None:
        self._http.close()


__all__ = ["DashboardRefresh", "LightdashClient", "LightdashRefreshFailed"]
