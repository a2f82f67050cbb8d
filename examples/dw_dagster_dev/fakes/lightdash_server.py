"""A protocol-accurate fake of Lightdash's REST API (the calls :mod:`dw_dagster.integrations.lightdash` makes) on loopback.

Envelopes as Lightdash answers: ``{"status": "ok", "results": ...}``, errors ``{"status": "error",
"error": {"name", "statusCode", "message"}}``. Routes:

- every call needs ``Authorization: ApiKey <token>`` with the fake's token: none or another → 401
  ``AuthorizationError``; a token listed in ``viewer_tokens`` may read but not invalidate (403
  ``ForbiddenError`` on the cache invalidation, as for a user who is not a project admin);
- ``GET /api/v1/dashboards/{uuid-or-slug}`` → the dashboard with its ``tiles`` (one ``saved_chart``
  tile per chart, plus a ``markdown`` tile); unknown → 404 ``NotFoundError``;
- ``GET /api/v2/content?projectUuids&contentTypes=dashboard&search&page&pageSize`` → ``{"data",
  "pagination": {"page", "pageSize", "totalPageCount", "totalResults"}}``: a case-insensitive
  substring search in the project's order, ``pageSize`` at most 100 (else 400 ``ParameterError``);
- ``POST /api/v2/dashboards/{uuid}/results-cache/invalidate`` → ``{"invalidatedAt", "projectUuid"}``;
- ``POST /api/v2/projects/{p}/query/dashboard-chart`` (``tileUuid``, ``chartUuid``, ``dashboardUuid``;
  the tile must hold the chart, else 404) → ``{"queryUuid", "cacheMetadata": {"cacheHit"}, ...}``: a
  cache hit unless the cache was invalidated or ``invalidateCache`` is true;
- ``GET /api/v2/projects/{p}/query/{q}?page&pageSize`` → ``queued`` then ``executing`` until
  ``polls_to_ready`` reads, then ``ready`` with rows paged, or ``error`` for a chart in ``fail``.

Faults: ``rate_limit`` answers that many of the next requests with 429 and ``Retry-After: 1``
(``{"status": "error", "error": {"name": "TooManyRequestsError", ...}}``); ``requests`` records every call.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _ok(results: Any, status: int = 200) -> JSONResponse:
    return JSONResponse({"status": "ok", "results": results}, status_code=status)


def _err(status: int, name: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"status": "error", "error": {"name": name, "statusCode": status, "message": message}},
                        status_code=status, headers=headers)


def _id(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "lightdash:" + ":".join(parts)))


@dataclass
class FakeLightdash:
    """The fake's state: one project, its dashboards (name → chart titles), queries, faults."""

    token: str = "ldpat_dw_dagster"
    viewer_tokens: set[str] = field(default_factory=set)
    project_uuid: str = field(default_factory=lambda: _id("project", "finance"))
    dashboards: dict[str, list[str]] = field(default_factory=lambda: {"Daily GMV": ["GMV by day", "GMV by payment method"]})
    fail: set[str] = field(default_factory=set)
    polls_to_ready: int = 2
    rate_limit: int = 0
    rows_per_chart: int = 3
    queries: dict[str, dict[str, Any]] = field(default_factory=dict)
    invalidated: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def dashboard_uuid(self, name: str) -> str:
        return _id(self.project_uuid, "dashboard", name)

    def slug(self, name: str) -> str:
        return "-".join("".join(ch if ch.isalnum() else " " for ch in name.lower()).split())

    def dashboard(self, ref: str) -> dict | None:
        name = next((n for n in self.dashboards if ref in (self.dashboard_uuid(n), self.slug(n))), None)
        if name is None:
            return None
        tiles = [{"uuid": _id(self.dashboard_uuid(name), "tile", t), "type": "saved_chart", "x": 0, "y": 3 * i, "w": 12,
                  "h": 3, "tabUuid": None, "properties": {"savedChartUuid": _id(self.project_uuid, "chart", t), "title": t,
                                                          "hideTitle": False}}
                 for i, t in enumerate(self.dashboards[name])]
        tiles.append({"uuid": _id(self.dashboard_uuid(name), "tile", "note"), "type": "markdown", "x": 0, "y": 99,
                      "w": 12, "h": 1, "properties": {"title": "About", "content": "Finance's morning numbers."}})
        return {"organizationUuid": _id("org"), "projectUuid": self.project_uuid, "uuid": self.dashboard_uuid(name),
                "name": name, "slug": self.slug(name), "description": None, "updatedAt": _now(), "tiles": tiles,
                "filters": {"dimensions": [], "metrics": [], "tableCalculations": []}, "tabs": [],
                "spaceUuid": _id("space"), "spaceName": "Finance", "views": 12, "firstViewedAt": None}


def build_app(state: FakeLightdash) -> Starlette:
    def gate(request: Request, *, admin: bool = False) -> JSONResponse | None:
        with state.lock:
            state.requests.append((request.method, request.url.path))
            if state.rate_limit > 0:
                state.rate_limit -= 1
                return _err(429, "TooManyRequestsError", "Too many requests, please try again later.",
                            headers={"Retry-After": "1"})
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme not in ("ApiKey", "Bearer") or token not in (state.token, *state.viewer_tokens):
            return _err(401, "AuthorizationError", "You need to be logged in to access this resource")
        if admin and token != state.token:
            return _err(403, "ForbiddenError", "You don't have access to invalidate this project's results cache")
        return None

    async def dashboard(request: Request) -> Response:
        if (bad := gate(request)) is not None:
            return bad
        d = state.dashboard(request.path_params["ref"])
        if d is None:
            return _err(404, "NotFoundError", f"Dashboard not found: {request.path_params['ref']}")
        return _ok(d)

    async def content(request: Request) -> Response:
        if (bad := gate(request)) is not None:
            return bad
        q = request.query_params
        try:
            page, size = int(q.get("page", "1")), int(q.get("pageSize", "25"))
        except ValueError:
            return _err(400, "ParameterError", "page and pageSize must be integers")
        if not 1 <= size <= 100 or page < 1:
            return _err(400, "ParameterError", "pageSize must be between 1 and 100, page at least 1")
        if q.get("projectUuids") not in (None, state.project_uuid) or q.get("contentTypes", "dashboard") != "dashboard":
            found = []
        else:
            term = (q.get("search") or "").lower()
            found = [n for n in state.dashboards if term in n.lower()]  # in the project's order, not by name
        data = [{"contentType": "dashboard", "uuid": state.dashboard_uuid(n), "name": n, "slug": state.slug(n),
                 "project": {"uuid": state.project_uuid, "name": "finance"}, "views": 12}
                for n in found[(page - 1) * size: page * size]]
        return _ok({"data": data, "pagination": {"page": page, "pageSize": size, "totalResults": len(found),
                                                  "totalPageCount": max(1, -(-len(found) // size))}})

    async def invalidate(request: Request) -> Response:
        if (bad := gate(request, admin=True)) is not None:
            return bad
        ref = request.path_params["dashboard"]
        if state.dashboard(ref) is None:
            return _err(404, "NotFoundError", f"Dashboard not found: {ref}")
        state.invalidated[ref] = _now()
        return _ok({"invalidatedAt": state.invalidated[ref], "projectUuid": state.project_uuid})

    async def run_chart(request: Request) -> Response:
        if (bad := gate(request)) is not None:
            return bad
        if request.path_params["project"] != state.project_uuid:
            return _err(404, "NotFoundError", "Project not found")
        body = await request.json()
        d = state.dashboard(str(body.get("dashboardUuid")))
        tile = next((t for t in (d or {}).get("tiles", []) if t["uuid"] == body.get("tileUuid")), None)
        if tile is None or tile["properties"].get("savedChartUuid") != body.get("chartUuid"):
            return _err(404, "NotFoundError", "Chart tile not found on this dashboard")
        hit = not body.get("invalidateCache") and d["uuid"] not in state.invalidated
        qid = str(uuid.uuid4())
        with state.lock:
            state.queries[qid] = {"title": tile["properties"]["title"], "reads": 0, "created": _now()}
        return _ok({"queryUuid": qid, "cacheMetadata": {"cacheHit": hit}, "appliedDashboardFilters": body.get(
            "dashboardFilters"), "metricQuery": {}, "fields": {}, "parameterReferences": [], "usedParametersValues": {}})

    async def results(request: Request) -> Response:
        if (bad := gate(request)) is not None:
            return bad
        with state.lock:
            q = state.queries.get(request.path_params["query"])
            if q is None or request.path_params["project"] != state.project_uuid:
                return _err(404, "NotFoundError", "Query not found")
            q["reads"] += 1
            if q["reads"] < state.polls_to_ready:
                return _ok({"queryUuid": request.path_params["query"], "status": "queued" if q["reads"] == 1 else "executing"})
        if q["title"] in state.fail:
            return _ok({"queryUuid": request.path_params["query"], "status": "error",
                        "error": "Binder Error: Referenced column \"gmv\" not found"})
        page, size = int(request.query_params.get("page", "1")), int(request.query_params.get("pageSize", "500"))
        rows = [{"day": {"value": {"raw": f"2026-11-{24 + i}", "formatted": f"2026-11-{24 + i}"}}}
                for i in range(state.rows_per_chart)]
        return _ok({"queryUuid": request.path_params["query"], "status": "ready", "columns": {"day": {}},
                    "rows": rows[(page - 1) * size: page * size], "page": page, "pageSize": size,
                    "totalResults": len(rows), "totalPageCount": max(1, -(-len(rows) // size)),
                    "initialQueryExecutionMs": 41, "resultsPageExecutionMs": 3})

    return Starlette(routes=[
        Route("/api/v1/dashboards/{ref}", dashboard, methods=["GET"]),
        Route("/api/v2/content", content, methods=["GET"]),
        Route("/api/v2/dashboards/{dashboard}/results-cache/invalidate", invalidate, methods=["POST"]),
        Route("/api/v2/projects/{project}/query/dashboard-chart", run_chart, methods=["POST"]),
        Route("/api/v2/projects/{project}/query/{query}", results, methods=["GET"]),
    ])


class FakeLightdashServer:
    """The fake on a loopback port (uvicorn in a thread); a context manager; :attr:`url` is its base URL."""

    def __init__(self, state: FakeLightdash | None = None, host: str = "127.0.0.1") -> None:
        import socket

        import uvicorn

        self.state = state or FakeLightdash()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.url = f"http://{host}:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(build_app(self.state), log_level="warning", access_log=False,
                                                     lifespan="off"))
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FakeLightdashServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                        name="fake-lightdash")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake Lightdash server did not start within 10 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        if self._thread:
            self._thread.join(10)
        self._sock.close()


__all__ = ["FakeLightdash", "FakeLightdashServer", "build_app"]
