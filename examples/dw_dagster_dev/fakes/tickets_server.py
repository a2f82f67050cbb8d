"""A protocol-accurate fake of Jira Cloud (REST API v3) and ServiceNow (Table API) on loopback, in one server.

Jira Cloud (Atlassian developer docs, "The Jira Cloud platform REST API v3"; paths under ``/rest/api/3``):

- Basic auth ``email:api_token`` (else 401 ``{"errorMessages": ["Client must be authenticated to access this
  resource."], "errors": {}}``);
- ``POST /issue``: ``fields.project.key`` (a known project, else 400 ``errors.project``), ``fields.issuetype.name``
  (Task, Bug, Story), ``fields.summary`` (required, one line, ≤ 255), ``fields.description`` an Atlassian
  Document Format ``doc`` (a plain string is refused, as v3 does: ``errors.description``), ``fields.labels``
  (no spaces) → 201 ``{"id", "key", "self"}``;
- ``POST /search/jql`` (enhanced search): ``{"jql", "fields", "maxResults", "nextPageToken"}`` →
  ``{"issues": [{"id", "key", "self", "fields"}], "isLast", "nextPageToken"?}``. JQL: clauses joined by
  ``AND`` — ``project = KEY``, ``labels = "x"``, ``text ~ "words"`` or a quoted phrase ``text ~ "\\"phrase\\""``
  (summary, description and comments) — and ``ORDER BY created ASC|DESC``; anything else is a 400
  ``{"errorMessages": ["Error in the JQL Query: ..."]}``. Like Jira's index, a new issue shows in search
  results only ``search_lag_s`` after it was created (0 by default: a test turns it on);
- ``GET /issue/{key}`` (``fields``), ``GET``/``POST /issue/{key}/comment`` (ADF ``body``; GET paged by
  ``startAt``/``maxResults``: ``{"startAt", "maxResults", "total", "comments"}``), ``GET``/``POST
  /issue/{key}/transitions`` (a simplified workflow: To Do (``new``), In Progress (``indeterminate``), Done
  (``done``), every transition allowed from any status; ``{"transition": {"id"}}`` → 204; an unknown id → 400);
  an unknown issue → 404 ``{"errorMessages": ["Issue does not exist or you do not have permission to see it."]}``.

ServiceNow (ServiceNow docs, "Table API"; paths under ``/api/now/table``):

- Basic auth (else 401 ``{"error": {"message": "User Not Authenticated", "detail": ...}, "status": "failure"}``);
- ``GET /incident`` and ``GET /sys_journal_field`` with ``sysparm_query`` (encoded query: ``field=value``,
  ``fieldLIKEvalue``, ``^`` for AND, ``^OR`` for OR, ``ORDERBYfield`` / ``ORDERBYDESCfield``; ``^^`` is a
  literal ``^``), ``sysparm_fields``, ``sysparm_limit`` → ``{"result": [...]}``;
- ``POST /incident`` → 201 ``{"result": record}`` (``sys_id``, ``number`` INC0010001..., ``state`` "1", ...);
- ``PATCH /incident/{sys_id}``: each ``work_notes`` value is one more journal entry (``sys_journal_field``:
  ``element_id``, ``element``, ``name``, ``value``, ``sys_created_on``); ``state`` 6 (Resolved) or 7 (Closed)
  without ``close_code`` and ``close_notes`` is refused as the data policy does (403 "Data Policy
  Exception"); an unknown sys_id → 404 ``{"error": {"message": "No Record found", ...}}``.

Test controls: ``state.add_fault(status=429, retry_after=1, path=r"^/rest/api/3/issue$", method="POST",
count=1, after_apply=False, delay_s=0)`` (``path`` a regex on the path; ``after_apply``: the request is
handled, its effect stays, only the answer is delayed or replaced — the "timed out after the server acted"
case), ``state.clear_faults()``, ``state.requests`` (method, path, status of each request).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

DEFAULT_JIRA_USER = ("dw-bot@grocer.example", "fake-atlassian-api-token-0001")
DEFAULT_SNOW_USER = ("dw.integration", "fake-servicenow-password-0001")
DEFAULT_PROJECT = "DATA"
JIRA_STATUSES = {"11": ("To Do", "new"), "21": ("In Progress", "indeterminate"), "31": ("Done", "done")}


@dataclass
class Fault:
    status: int | None = None
    count: int = 1
    path: str = ""
    method: str | None = None
    retry_after: float | None = None
    after_apply: bool = False
    delay_s: float = 0.0


@dataclass
class TicketsState:
    """Everything the fake holds; guarded by ``lock``."""

    jira_users: dict[str, str] = field(default_factory=lambda: {DEFAULT_JIRA_USER[0]: DEFAULT_JIRA_USER[1]})
    projects: set[str] = field(default_factory=lambda: {DEFAULT_PROJECT, "OPS"})
    snow_users: dict[str, str] = field(default_factory=lambda: {DEFAULT_SNOW_USER[0]: DEFAULT_SNOW_USER[1]})
    search_lag_s: float = 0.0
    issues: list[dict[str, Any]] = field(default_factory=list)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    journal: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    base_url: str = ""

    def add_fault(self, **kw: Any) -> None:
        with self.lock:
            self.faults.append(Fault(**kw))

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.count != 0 and re.search(f.path, path) and (f.method is None or f.method == method):
                    f.count -= 1 if f.count > 0 else 0
                    return f
        return None

    def issue(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            return next((i for i in self.issues if i["key"] == key or i["id"] == key), None)

    def posts(self, pattern: str) -> int:
        """How many POST/PATCH requests matched ``pattern`` (a regex on the path) were handled."""
        with self.lock:
            return sum(1 for r in self.requests if r["method"] in ("POST", "PATCH") and re.search(pattern, r["path"])
                       and r["handled"])


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# -- Atlassian Document Format ----------------------------------------------------------------------

def _adf_ok(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("type") == "doc" and doc.get("version") == 1 and isinstance(doc.get("content"), list)


def _adf_text(node: Any) -> str:
    if isinstance(node, dict):
        if node.get("type") == "text":
            return str(node.get("text", ""))
        return "\n".join(_adf_text(c) for c in node.get("content") or [])
    return ""


# -- Jira ---------------------------------------------------------------------------------------------

def _jira_error(status: int, messages: list[str] | None = None, errors: dict | None = None) -> JSONResponse:
    return JSONResponse({"errorMessages": messages or [], "errors": errors or {}}, status_code=status)


def _jira_auth(state: TicketsState, request: Request) -> bool:
    auth = request.headers.get("authorization", "")
    if not auth.startswith("Basic "):
        return False
    try:
        user, _, token = base64.b64decode(auth[6:]).decode().partition(":")
    except ValueError:
        return False
    return state.jira_users.get(user) == token


def _issue_view(state: TicketsState, issue: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    name, cat = JIRA_STATUSES[issue["status"]]
    every = {"summary": issue["summary"], "labels": issue["labels"], "description": issue["description"],
             "status": {"name": name, "statusCategory": {"key": cat, "name": {"new": "To Do", "indeterminate":
                                                                               "In Progress", "done": "Done"}[cat]}},
             "project": {"key": issue["project"]}, "issuetype": {"name": issue["issuetype"]}, "created": issue["created"]}
    wanted = every if not fields or fields == ["*all"] else {k: v for k, v in every.items() if k in fields}
    return {"id": issue["id"], "key": issue["key"], "self": f"{state.base_url}/rest/api/3/issue/{issue['id']}",
            "fields": wanted}


_CLAUSE = re.compile(r'^\s*(project|labels|text|summary|description)\s*(=|~)\s*(?:"((?:[^"\\]|\\.)*)"|([A-Za-z0-9_.-]+))\s*$',
                     re.I)


def _jql(jql: str) -> tuple[list[tuple[str, str, str]], str, bool]:
    """(clauses, order field, descending) of the JQL subset; ValueError for anything else."""
    m = re.search(r"\s+ORDER\s+BY\s+(\w+)(?:\s+(ASC|DESC))?\s*$", jql, re.I)
    order, desc = ("created", False)
    if m:
        order, desc = m.group(1).lower(), (m.group(2) or "ASC").upper() == "DESC"
        jql = jql[:m.start()]
    clauses = []
    for part in re.split(r"\s+AND\s+", jql.strip(), flags=re.I) if jql.strip() else []:
        c = _CLAUSE.match(part)
        if c is None:
            raise ValueError(f"Error in the JQL Query: the fake does not understand {part.strip()!r}")
        value = c.group(3) if c.group(3) is not None else c.group(4)
        clauses.append((c.group(1).lower(), c.group(2), value.replace('\\"', '"')))
    return clauses, order, desc


def _text_match(issue: dict[str, Any], value: str, fields: tuple[str, ...]) -> bool:
    hay = " ".join([issue["summary"] if "summary" in fields else "",
                    _adf_text(issue["description"]) if "description" in fields else "",
                    *(_adf_text(c["body"]) for c in issue["comments"] if "comments" in fields)]).lower()
    if value.startswith('"') and value.endswith('"'):
        return value.strip('"').lower() in hay
    return all(w.lower() in hay for w in value.split())


def _matches(issue: dict[str, Any], clauses: list[tuple[str, str, str]]) -> bool:
    for name, op, value in clauses:
        if name == "project" and not (op == "=" and issue["project"] == value):
            return False
        if name == "labels" and not (op == "=" and value in issue["labels"]):
            return False
        if name in ("text", "summary", "description"):
            where = ("summary", "description", "comments") if name == "text" else (name,)
            if op != "~" or not _text_match(issue, value, where):
                return False
    return True


def jira_create(state: TicketsState, body: Any) -> Response:
    f = (body or {}).get("fields") if isinstance(body, dict) else None
    if not isinstance(f, dict):
        return _jira_error(400, ["Field 'fields' is required."])
    errors = {}
    project = (f.get("project") or {}).get("key")
    if project not in state.projects:
        errors["project"] = "valid project is required"
    if (f.get("issuetype") or {}).get("name") not in ("Task", "Bug", "Story"):
        errors["issuetype"] = "Specify an issue type"
    summary = f.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        errors["summary"] = "You must specify a summary of the issue."
    elif "\n" in summary or len(summary) > 255:
        errors["summary"] = "Summary must be less than 255 characters and on one line."
    if "description" in f and not _adf_ok(f["description"]):
        errors["description"] = "Operation value must be an Atlassian Document (see the Atlassian Document Format)"
    labels = f.get("labels") or []
    bad = [x for x in labels if not isinstance(x, str) or " " in x or not x]
    if bad:
        errors["labels"] = f"The label '{bad[0]}' contains spaces which is invalid."
    if errors:
        return _jira_error(400, [], errors)
    with state.lock:
        n = 1 + sum(1 for i in state.issues if i["project"] == project)
        issue = {"id": str(10000 + len(state.issues) + 1), "key": f"{project}-{n}", "project": project,
                 "issuetype": f["issuetype"]["name"], "summary": summary, "description": f.get("description"),
                 "labels": list(labels), "status": "11", "comments": [], "created": _now().isoformat(),
                 "created_ts": time.time()}
        state.issues.append(issue)
    return JSONResponse({"id": issue["id"], "key": issue["key"], "self": f"{state.base_url}/rest/api/3/issue/{issue['id']}"},
                        status_code=201)


def jira_search(state: TicketsState, body: Any) -> Response:
    if not isinstance(body, dict) or not isinstance(body.get("jql"), str):
        return _jira_error(400, ["jql is required"])
    try:
        clauses, order, desc = _jql(body["jql"])
    except ValueError as e:
        return _jira_error(400, [str(e)])
    limit = max(1, min(5000, int(body.get("maxResults") or 50)))
    start = int(body.get("nextPageToken") or 0)
    cutoff = time.time() - state.search_lag_s
    with state.lock:
        rows = [i for i in state.issues if i["created_ts"] <= cutoff and _matches(i, clauses)]
    rows.sort(key=lambda i: i["created_ts"], reverse=desc)
    page = rows[start:start + limit]
    out: dict[str, Any] = {"issues": [_issue_view(state, i, body.get("fields")) for i in page],
                           "isLast": start + limit >= len(rows)}
    if not out["isLast"]:
        out["nextPageToken"] = str(start + limit)
    return JSONResponse(out)


def jira_issue_routes(state: TicketsState, method: str, key: str, rest: str, request: Request, body: Any) -> Response:
    issue = state.issue(key)
    if issue is None:
        return _jira_error(404, ["Issue does not exist or you do not have permission to see it."])
    if rest == "" and method == "GET":
        fields = request.query_params.get("fields")
        return JSONResponse(_issue_view(state, issue, fields.split(",") if fields else None))
    if rest == "comment" and method == "POST":
        if not isinstance(body, dict) or not _adf_ok(body.get("body")):
            return _jira_error(400, [], {"comment": "Comment body is not valid!"})
        with state.lock:
            comment = {"id": str(20000 + sum(len(i["comments"]) for i in state.issues) + 1), "body": body["body"],
                       "author": {"emailAddress": DEFAULT_JIRA_USER[0]}, "created": _now().isoformat()}
            issue["comments"].append(comment)
        return JSONResponse(comment, status_code=201)
    if rest == "comment" and method == "GET":
        start = int(request.query_params.get("startAt") or 0)
        size = max(1, min(100, int(request.query_params.get("maxResults") or 50)))
        with state.lock:
            rows = list(issue["comments"])
        return JSONResponse({"startAt": start, "maxResults": size, "total": len(rows), "comments": rows[start:start + size]})
    if rest == "transitions" and method == "GET":
        return JSONResponse({"transitions": [
            {"id": tid, "name": name, "to": {"name": name, "statusCategory": {"key": cat}}, "isAvailable": True}
            for tid, (name, cat) in JIRA_STATUSES.items()]})
    if rest == "transitions" and method == "POST":
        tid = str(((body or {}).get("transition") or {}).get("id", ""))
        if tid not in JIRA_STATUSES:
            return _jira_error(400, [f"Transition id '{tid}' is not valid for this issue."])
        with state.lock:
            issue["status"] = tid
        return Response(status_code=204)
    return _jira_error(405, [f"{method} /issue/{{key}}/{rest} is not supported by the fake"])


# -- ServiceNow ---------------------------------------------------------------------------------------

def _snow_error(status: int, message: str, detail: str = "") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "detail": detail}, "status": "failure"}, status_code=status)


def _snow_auth(state: TicketsState, request: Request) -> bool:
    return _jira_auth(TicketsState(jira_users=state.snow_users), request)


def _query(encoded: str) -> tuple[list[list[tuple[str, str, str]]], list[tuple[str, bool]]]:
    """An encoded query as AND-terms, each a list of OR-alternatives (``A^B^ORC`` is A AND (B OR C)), and the ordering."""
    text = encoded.replace("^^", "\x00")
    terms: list[list[tuple[str, str, str]]] = []
    order: list[tuple[str, bool]] = []
    for part in text.split("^"):
        part = part.replace("\x00", "^")
        if not part:
            continue
        if part.startswith("ORDERBYDESC"):
            order.append((part[11:], True))
            continue
        if part.startswith("ORDERBY"):
            order.append((part[7:], False))
            continue
        alternative = part.startswith("OR") and bool(terms)
        m = re.match(r"^(\w+?)(LIKE|!=|=)(.*)$", part[2:] if alternative else part, re.S)
        if m is None:
            raise ValueError(f"the fake does not understand the clause {part!r}")
        clause = (m.group(1), m.group(2), m.group(3))
        if alternative:
            terms[-1].append(clause)
        else:
            terms.append([clause])
    return terms, order


def _query_match(row: dict[str, Any], terms: list[list[tuple[str, str, str]]]) -> bool:
    def one(c: tuple[str, str, str]) -> bool:
        value = str(row.get(c[0], ""))
        return {"=": value == c[2], "!=": value != c[2], "LIKE": c[2].lower() in value.lower()}[c[1]]
    return all(any(one(c) for c in alternatives) for alternatives in terms)


def snow_table(state: TicketsState, table: str, request: Request) -> Response:
    rows = state.incidents if table == "incident" else state.journal
    try:
        groups, order = _query(request.query_params.get("sysparm_query", ""))
    except ValueError as e:
        return _snow_error(400, "Invalid query", str(e))
    limit = int(request.query_params.get("sysparm_limit") or 10000)
    wanted = [f for f in (request.query_params.get("sysparm_fields") or "").split(",") if f]
    with state.lock:
        found = [dict(r) for r in rows if _query_match(r, groups)]
    for name, desc in reversed(order):
        found.sort(key=lambda r: str(r.get(name, "")), reverse=desc)
    found = found[:limit]
    return JSONResponse({"result": [{k: v for k, v in r.items() if not wanted or k in wanted} for r in found]})


def _fields(record: dict[str, Any], request: Request) -> dict[str, Any]:
    wanted = [f for f in (request.query_params.get("sysparm_fields") or "").split(",") if f]
    return {k: v for k, v in record.items() if not wanted or k in wanted}


def snow_create(state: TicketsState, request: Request, body: Any) -> Response:
    if not isinstance(body, dict):
        return _snow_error(400, "Exception while reading request", "The payload is not valid JSON.")
    now = _now().strftime("%Y-%m-%d %H:%M:%S")
    with state.lock:
        record = {"sys_id": secrets.token_hex(16), "number": f"INC{10001 + len(state.incidents):07d}", "state": "1",
                  "sys_created_on": now, "sys_updated_on": now, "short_description": "", "description": "",
                  "correlation_id": "", "correlation_display": "", "urgency": "3", "impact": "3", "close_code": "",
                  "close_notes": "", "work_notes": ""}
        notes = body.pop("work_notes", None)
        record.update({k: str(v) for k, v in body.items()})
        state.incidents.append(record)
        if notes:
            _journal(state, record["sys_id"], str(notes))
    return JSONResponse({"result": _fields(record, request)}, status_code=201)


def _journal(state: TicketsState, sys_id: str, value: str) -> None:
    state.journal.append({"sys_id": secrets.token_hex(16), "element_id": sys_id, "element": "work_notes",
                          "name": "incident", "value": value, "sys_created_on": _now().strftime("%Y-%m-%d %H:%M:%S.%f")})


def snow_update(state: TicketsState, sys_id: str, request: Request, body: Any) -> Response:
    if not isinstance(body, dict):
        return _snow_error(400, "Exception while reading request", "The payload is not valid JSON.")
    with state.lock:
        record = next((r for r in state.incidents if r["sys_id"] == sys_id), None)
        if record is None:
            return _snow_error(404, "No Record found", "Record doesn't exist or ACL restricts the record retrieval")
        new = {k: str(v) for k, v in body.items() if k != "work_notes"}
        if new.get("state") in ("6", "7"):
            missing = [label for name, label in (("close_code", "Resolution code"), ("close_notes", "Resolution notes"))
                       if not (new.get(name) or record.get(name))]
            if missing:
                return _snow_error(403, "Operation Failed",
                                   "Data Policy Exception: \n" + "\n".join(f" {m} is mandatory" for m in missing))
        record.update(new)
        record["sys_updated_on"] = _now().strftime("%Y-%m-%d %H:%M:%S")
        if body.get("work_notes"):
            _journal(state, sys_id, str(body["work_notes"]))
    return JSONResponse({"result": _fields(record, request)})


# -- the app ------------------------------------------------------------------------------------------

def build_app(state: TicketsState) -> Starlette:
    async def handle(request: Request) -> Response:
        method, path = request.method, request.url.path
        raw = await request.body()
        fault = state.take_fault(method, path)
        entry = {"method": method, "path": path, "status": None, "handled": False}
        with state.lock:
            state.requests.append(entry)
        if fault is not None and not fault.after_apply:
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.status is not None:
                entry["status"] = fault.status
                return _fault(fault)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = "__invalid__"
        response = route(request, method, path, body)
        entry["status"], entry["handled"] = response.status_code, response.status_code < 400
        if fault is not None and fault.after_apply:
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.status is not None:
                entry["status"] = fault.status
                return _fault(fault)
        return response

    def route(request: Request, method: str, path: str, body: Any) -> Response:
        if path.startswith("/rest/api/3/"):
            if not _jira_auth(state, request):
                return _jira_error(401, ["Client must be authenticated to access this resource."])
            rest = path[len("/rest/api/3/"):]
            if rest == "issue" and method == "POST":
                return jira_create(state, body)
            if rest == "search/jql" and method == "POST":
                return jira_search(state, body)
            m = re.match(r"^issue/([^/]+)(?:/(comment|transitions))?$", rest)
            if m:
                return jira_issue_routes(state, method, m.group(1), m.group(2) or "", request, body)
            return _jira_error(404, [f"no route {method} {path} in the fake"])
        if path.startswith("/api/now/table/"):
            if not _snow_auth(state, request):
                return _snow_error(401, "User Not Authenticated", "Required to provide Auth information")
            rest = path[len("/api/now/table/"):]
            if method == "GET" and rest in ("incident", "sys_journal_field"):
                return snow_table(state, rest, request)
            if method == "POST" and rest == "incident":
                return snow_create(state, request, body)
            m = re.match(r"^incident/([0-9a-f]{32})$", rest)
            if m and method in ("PATCH", "PUT"):
                return snow_update(state, m.group(1), request, body)
            return _snow_error(400, "Invalid table or operation", f"{method} {path}")
        return JSONResponse({"error": "not found"}, status_code=404)

    return Starlette(routes=[Route("/{path:path}", handle, methods=["GET", "POST", "PATCH", "PUT", "DELETE"])])


def _fault(f: Fault) -> Response:
    headers = {"Retry-After": f"{f.retry_after if f.retry_after is not None else 1:g}"} if f.status == 429 else {}
    body = {"errorMessages": ["Rate limit exceeded."]} if f.status == 429 else {"error": f"fault {f.status}"}
    return JSONResponse(body, status_code=f.status or 500, headers=headers)


class FakeTicketsServer:
    """The fake on a loopback port, served by uvicorn in a background thread (a context manager)."""

    def __init__(self, state: TicketsState | None = None, port: int = 0, host: str = "127.0.0.1") -> None:
        import socket

        import uvicorn

        self.state = state or TicketsState()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.url = f"http://{host}:{self._sock.getsockname()[1]}"
        self.state.base_url = self.url
        self._server = uvicorn.Server(uvicorn.Config(build_app(self.state), log_level="warning", access_log=False,
                                                     lifespan="off"))
        self._thread: threading.Thread | None = None

    def start(self) -> FakeTicketsServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                        name="fake-tickets")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake Jira/ServiceNow server did not start within 10 s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread:
            self._thread.join(10)
        self._sock.close()

    def __enter__(self) -> FakeTicketsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["DEFAULT_JIRA_USER", "DEFAULT_PROJECT", "DEFAULT_SNOW_USER", "FakeTicketsServer", "TicketsState"]
