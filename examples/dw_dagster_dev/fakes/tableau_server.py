"""A protocol-accurate fake of Tableau's REST API (the calls :mod:`dw_dagster.integrations.tableau` makes) on loopback.

Routes, under ``/api/{version}`` (Tableau REST API reference, JSON with ``Accept: application/json``):

- ``POST /auth/signin``: ``{"credentials": {"personalAccessTokenName", "personalAccessTokenSecret",
  "site": {"contentUrl"}}}``; a wrong token or site → 401 ``{"error": {"summary": "Signin Error",
  "detail": "Error signing in to Tableau Server", "code": "401001"}}``; else 200 ``{"credentials":
  {"site": {"id", "contentUrl"}, "user": {"id"}, "token", "estimatedTimeToExpiration"}}``.
- Every other call needs ``X-Tableau-Auth`` with a live token (else 401 ``code 401002``) and the
  signed-in site's id in the path (else 403 ``code 403000``).
- ``GET /sites/{site}/workbooks?filter=name:eq:<name>`` → ``{"pagination": {...}, "workbooks":
  {"workbook": [{"id", "name", "contentUrl", "updatedAt"}]}}``.
- ``POST /sites/{site}/workbooks/{id}/refresh`` (body ``{}``) → 202 ``{"job": {"id", "mode":
  "Asynchronous", "type": "RefreshExtract", "createdAt"}}``; unknown workbook → 404 ``code
  404006``; a workbook without an extract → 400 ``code 400093`` (as the server answers for a
  live-connection workbook).
- ``GET /sites/{site}/jobs/{id}`` → ``{"job": {"id", "mode", "type", "progress", "createdAt",
  "startedAt"?, "completedAt"?, "finishCode"?, "extractRefreshJob": {"workbook": {"id", "name"}}}}``:
  a job finishes after ``polls_to_finish`` reads (progress 0 → 100), with ``finishCode`` 0, or 1
  when the workbook is set to fail (``fail``), with ``notes``; unknown job → 404 ``code 404003``.
- ``POST /auth/signout`` → 204; the token dies.
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
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _err(status: int, code: str, summary: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": {"summary": summary, "detail": detail, "code": code}}, status_code=status)


@dataclass
class FakeTableau:
    """The fake's state: one site, its workbooks (name → extract or not), jobs, live tokens."""

    site: str = "grocer"
    token_name: str = "dw-dagster"
    token_secret: str = "s3cret"
    workbooks: dict[str, bool] = field(default_factory=lambda: {"Store P&L": True})
    fail: set[str] = field(default_factory=set)
    polls_to_finish: int = 2
    site_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    ids: dict[str, str] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def workbook_id(self, name: str) -> str:
        return self.ids.setdefault(name, str(uuid.uuid5(uuid.NAMESPACE_URL, f"tableau:{self.site}:{name}")))


def build_app(state: FakeTableau) -> Starlette:
    def authed(request: Request) -> JSONResponse | None:
        state.requests.append((request.method, request.url.path))
        if request.headers.get("x-tableau-auth") not in state.tokens:
            return _err(401, "401002", "Unauthorized Access", "Invalid authentication credentials were provided.")
        if request.path_params.get("site") != state.site_id:
            return _err(403, "403000", "Forbidden", "The site in the URL is not the site signed in to.")
        return None

    async def signin(request: Request) -> Response:
        state.requests.append((request.method, request.url.path))
        cred = (await request.json()).get("credentials") or {}
        if (cred.get("personalAccessTokenName"), cred.get("personalAccessTokenSecret"),
                (cred.get("site") or {}).get("contentUrl")) != (state.token_name, state.token_secret, state.site):
            return _err(401, "401001", "Signin Error", "Error signing in to Tableau Server")
        token = uuid.uuid4().hex
        state.tokens.add(token)
        return JSONResponse({"credentials": {"site": {"id": state.site_id, "contentUrl": state.site},
                                             "user": {"id": str(uuid.uuid4())}, "token": token,
                                             "estimatedTimeToExpiration": "365:59:59"}})

    async def signout(request: Request) -> Response:
        state.requests.append((request.method, request.url.path))
        state.tokens.discard(request.headers.get("x-tableau-auth"))
        return Response(status_code=204)

    async def workbooks(request: Request) -> Response:
        if (bad := authed(request)) is not None:
            return bad
        flt = request.query_params.get("filter", "")
        names = [n for n in state.workbooks if not flt or flt == f"name:eq:{n}"]
        found = [{"id": state.workbook_id(n), "name": n, "contentUrl": n.replace(" ", ""), "updatedAt": _now()} for n in names]
        return JSONResponse({"pagination": {"pageNumber": "1", "pageSize": "100", "totalAvailable": str(len(found))},
                             "workbooks": {"workbook": found}})

    async def refresh(request: Request) -> Response:
        if (bad := authed(request)) is not None:
            return bad
        wid = request.path_params["workbook"]
        name = next((n for n in state.workbooks if state.workbook_id(n) == wid), None)
        if name is None:
            return _err(404, "404006", "Resource Not Found", f"Workbook '{wid}' could not be found.")
        if not state.workbooks[name]:
            return _err(400, "400093", "Bad Request", "The workbook has no extract to refresh.")
        job = {"id": str(uuid.uuid4()), "mode": "Asynchronous", "type": "RefreshExtract", "createdAt": _now(),
               "progress": "0", "extractRefreshJob": {"workbook": {"id": wid, "name": name}}}
        with state.lock:
            state.jobs[job["id"]] = {**job, "_reads": 0}
        return JSONResponse({"job": {k: job[k] for k in ("id", "mode", "type", "createdAt")}}, status_code=202)

    async def job(request: Request) -> Response:
        if (bad := authed(request)) is not None:
            return bad
        with state.lock:
            j = state.jobs.get(request.path_params["job"])
            if j is None:
                return _err(404, "404003", "Resource Not Found", "Job could not be found.")
            j["_reads"] += 1
            j.setdefault("startedAt", _now())
            if j["_reads"] >= state.polls_to_finish and "finishCode" not in j:
                failed = j["extractRefreshJob"]["workbook"]["name"] in state.fail
                j.update(progress="100", completedAt=_now(), finishCode="1" if failed else "0")
                if failed:
                    j["notes"] = "Extract refresh failed: the data source could not be reached."
            return JSONResponse({"job": {k: v for k, v in j.items() if not k.startswith("_")}})

    base = "/api/{version}"
    return Starlette(routes=[
        Route(f"{base}/auth/signin", signin, methods=["POST"]),
        Route(f"{base}/auth/signout", signout, methods=["POST"]),
        Route(base + "/sites/{site}/workbooks", workbooks, methods=["GET"]),
        Route(base + "/sites/{site}/workbooks/{workbook}/refresh", refresh, methods=["POST"]),
        Route(base + "/sites/{site}/jobs/{job}", job, methods=["GET"]),
    ])


class FakeTableauServer:
    """The fake on a loopback port (uvicorn in a thread); a context manager; :attr:`url` is its base URL."""

    def __init__(self, state: FakeTableau | None = None, host: str = "127.0.0.1") -> None:
        import socket

        import uvicorn

        self.state = state or FakeTableau()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.url = f"http://{host}:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(build_app(self.state), log_level="warning", access_log=False,
                                                     lifespan="off"))
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FakeTableauServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                        name="fake-tableau")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake Tableau server did not start within 10 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        if self._thread:
            self._thread.join(10)
        self._sock.close()


__all__ = ["FakeTableau", "FakeTableauServer", "build_app"]
