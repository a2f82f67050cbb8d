"""A protocol-accurate fake of Mage OSS's REST API (mage-ai 0.9.80), on loopback, for the tests and the demo.

Routes, envelopes, field names, timestamp formats and error bodies are those of the real server
(``shared/reference/components_mcp_mage.md`` §4; checked side by side against a real ``mage start`` by
``dw_dagster_tests/integrations/test_mage_real.py``):

- ``GET /api/status`` (no auth) → ``{"statuses": [{...}], "metadata": {}}``;
- ``POST /api/sessions {"session": {"email", "password"}}`` → ``{"session": {"expires", "token", "user"},
  "metadata": null}``; ``token`` is an HS256 JWT ``{"expires": <epoch>, "token": <inner token>}``;
- ``GET/POST /api/pipelines``, ``GET /api/pipelines/{uuid}``, ``POST /api/pipelines/{uuid}/blocks``;
- ``GET/POST /api/pipelines/{uuid}/pipeline_schedules`` (triggers; an API trigger gets a ``token``);
- runs started with the trigger's token, no user auth needed (``server/api/triggers.py``):
  ``POST /api/pipeline_schedules/{id}/pipeline_runs/{token}`` and ``POST .../api_trigger`` with
  ``Authorization: Bearer <token>``; with a session: ``POST /api/pipeline_schedules/{id}/pipeline_runs``;
- ``GET /api/pipeline_runs`` (``pipeline_uuid``, ``status``, ``status[]``, ``start_timestamp``/``end_timestamp``
  on ``created_at``, ``order_by[]``, ``_limit`` (default 40)/``_offset``; ``metadata {count, next}``),
  ``GET/PUT /api/pipeline_runs/{id}`` (PUT ``{"status": "cancelled"}`` cancels), ``GET /api/pipeline_runs/{id}/block_runs``;
- ``GET /api/block_runs?pipeline_run_id=&pipeline_uuid=`` (paged);
- ``GET /api/pipelines/{uuid}/logs?pipeline_run_id[]=`` (log files in Mage's line format).

Auth as ``mage_ai/api/middleware.py``: the API key (``X-API-KEY``, ``api_key`` in the query or a POST
body) and, with user authentication on, a session token (``OAUTH-TOKEN: <inner token>``,
``Authorization: Bearer <inner token>`` or the cookie ``oauth_token=<JWT>``). A wrong key or token is
HTTP 401 even without ``_http_error_codes`` (the middleware sets it), the body's ``status`` then 200;
no token at all is ``403 unauthorized_access`` "Private access for <action> only, invalid scope.".
Other errors are HTTP 200 with ``{"error": {code, message, type}, "status": 200}`` unless the query
has ``_http_error_codes`` (any non-empty value); exceptions (a pipeline that does not exist, a bad
trigger token, a ``_limit`` that is not a number) are HTTP 200 with
``{"error": {"code": 500, "errors", "exception", "message": <traceback>}, "url_parameters"}`` always.

Runs move the way Mage's scheduler moves them, faster: ``initial`` for ``pickup_s`` after creation,
then ``running`` with one block run per block, in the pipeline's order, each ``block_s`` long; then
``completed`` (``completed_at`` set) or, when the run's variables hold a truthy ``fail``, ``failed`` at
the first block with ``ValueError: <fail if it is a string, else "dw test: asked to fail">``, the
later blocks ``upstream_failed``, ``completed_at`` left empty (as Mage leaves it). The test harness's
loader block on the real server fails the same way. A streaming pipeline's run stays ``running``
with no block runs until cancelled. Time comes from ``clock`` (tests may pass their own).

What the fake adds, under ``/_fake/`` (no auth): ``POST /_fake/runs`` seeds runs with fixed statuses
and times (a history for an incident window; ``FakeMage.add_run`` in Python); ``POST /_fake/faults``
``{"status": 503, "count": N, "path": <regex>, "method"}`` (N answers with that HTTP status),
``{"exception": "message", "count": N, "path"}`` (N HTTP-200 code-500 bodies), ``{"expire_tokens": true}``,
``{"outage": true}``, ``{"reset": true}``; ``GET /_fake/state``.

Not modelled: retries grouping (``disable_retries_grouping``; every fake run has its own
``execution_date``, so the grouping would not change a page), backfills, event triggers, roles other
than the owner, Mage's reuse of the mutated "not found" message after a login.

Run on its own: ``python -m dw_dagster_dev.fakes.mage_server --port 6789``.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import re
import secrets
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

#: ``OAUTH2_APPLICATION_CLIENT_ID`` in ``mage_ai/settings/server.py``: the only API key Mage OSS accepts.
MAGE_OSS_API_KEY = "zkWlN0PkIKSN0C11CfUHUj84OT5XOJ6tDZ6bDRO2"
#: ``DEFAULT_OWNER_EMAIL`` / ``DEFAULT_OWNER_PASSWORD`` in ``mage_ai/settings/server.py``.
DEFAULT_EMAIL, DEFAULT_PASSWORD = "admin@admin.com", "admin"
UTC = dt.timezone.utc

_ERR_NOT_FOUND = {"code": 404, "message": "Record not found.", "type": "record_not_found"}
_ERR_API_KEY = {"code": 401, "message": "Invalid API key.", "type": "invalid_api_key"}
_ERR_TOKEN = {"code": 401, "message": "Invalid OAuth token.", "type": "invalid_oauth_token"}
_ERR_EXPIRED = {"code": 401, "message": "Expired OAuth token.", "type": "expired_oauth_token"}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _naive(t: dt.datetime | None, *, seconds: bool = False, sep: str = " ") -> str | None:
    """Mage's presentation of a UTC timestamp: naive, ``str(datetime)`` (microseconds only when non-zero)."""
    if t is None:
        return None
    t = t.astimezone(UTC).replace(tzinfo=None)
    if seconds:  # columns filled by the database's now(): whole seconds
        t = t.replace(microsecond=0)
    return t.isoformat(sep=sep)


def _public(item: dict[str, Any]) -> dict[str, Any]:
    """The fields Mage shows (the fake's own bookkeeping starts with ``_``)."""
    return {k: v for k, v in item.items() if not k.startswith("_")}


def _slug(name: str) -> str:
    """Mage's ``clean_name``: lower case, anything but letters, digits and ``_`` replaced by ``_``."""
    return re.sub(r"[^a-z0-9_]", "_", name.strip().lower())


@dataclass
class Faults:
    status: int | None = None
    status_count: int = 0
    status_path: str | None = None
    status_method: str | None = None
    exception: str | None = None
    exception_count: int = 0
    exception_path: str | None = None
    outage: bool = False


@dataclass
class FakeMage:
    """The fake's state: one Mage project with its users, pipelines, triggers, runs and block runs.

    Attributes:
        require_user_authentication: Mage's ``REQUIRE_USER_AUTHENTICATION`` (default on, as in 0.9.80).
        token_ttl_s: session lifetime, seconds (Mage's ``MAGE_ACCESS_TOKEN_EXPIRY_TIME``, 30 days).
        pickup_s: seconds from a run's creation to its start (Mage's scheduler: about 4–10 s).
        block_s: seconds per block run.
        clock: epoch seconds now.
    """

    require_user_authentication: bool = True
    token_ttl_s: float = 2_592_000.0
    pickup_s: float = 0.2
    block_s: float = 0.2
    clock: Callable[[], float] = time.time
    repo_path: str = "/home/src/dw_project"
    users: dict[str, str] = field(default_factory=lambda: {DEFAULT_EMAIL: DEFAULT_PASSWORD})
    pipelines: dict[str, dict[str, Any]] = field(default_factory=dict)
    schedules: dict[int, dict[str, Any]] = field(default_factory=dict)
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    block_runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)
    requests: list[str] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    project_uuid: str = field(default_factory=lambda: uuidlib.uuid4().hex)

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.clock(), UTC)

    # -- sessions --------------------------------------------------------------------------------
    def login(self, email: str) -> dict[str, Any]:
        """A new session for ``email``: ``{"expires", "token", "user"}`` as ``SessionPresenter`` shows it."""
        inner = secrets.token_urlsafe()
        expires = self.clock() + self.token_ttl_s
        self.tokens[inner] = expires
        head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
        body = _b64(json.dumps({"expires": expires, "token": inner}, separators=(",", ":")).encode())
        sig = _b64(hmac.new(self.key, f"{head}.{body}".encode(), hashlib.sha256).digest())
        role = {"name": "Owner", "user_id": None, "id": 1, "created_at": _naive(self.now(), seconds=True),
                "updated_at": _naive(self.now(), seconds=True)}
        user = {"avatar": None, "first_name": None, "id": 1, "last_name": None, "owner": True, "project_access": 1,
                "roles": None, "roles_display": "Owner", "roles_new": [role], "username": email.split("@")[0]}
        return {"expires": _naive(dt.datetime.fromtimestamp(expires, UTC)), "token": f"{head}.{body}.{sig}", "user": user}

    def inner_from_cookie(self, jwt: str) -> str | None:
        try:
            head, body, sig = jwt.split(".")
            good = _b64(hmac.new(self.key, f"{head}.{body}".encode(), hashlib.sha256).digest())
            return json.loads(_unb64(body)).get("token") if hmac.compare_digest(sig, good) else None
        except (ValueError, AttributeError):
            return None

    # -- pipelines and triggers ------------------------------------------------------------------
    def add_pipeline(self, name: str, type: str = "python", description: str | None = None) -> dict[str, Any]:
        """A pipeline as ``PipelinePresenter`` shows it (``type``: python = batch, streaming, ...)."""
        uuid = _slug(name)
        now = self.now()
        p = {"cache_block_output_in_memory": False, "concurrency_config": {}, "created_at": str(now),
             "data_integration": None, "description": description, "executor_config": {}, "executor_count": 1,
             "executor_type": None, "name": name, "notification_config": {}, "remote_variables_dir": None,
             "retry_config": {}, "run_pipeline_in_one_process": False, "settings": {"triggers": None}, "tags": [],
             "type": type, "uuid": uuid, "variables_dir": f"{self.repo_path}/.mage_data", "spark_config": {},
             "blocks": [], "callbacks": [], "conditionals": [], "widgets": [], "updated_at": now.isoformat()}
        self.pipelines[uuid] = p
        return p

    def add_block(self, pipeline_uuid: str, name: str, type: str = "data_loader", language: str = "python",
                  content: str = "", upstream_blocks: list[str] | None = None) -> dict[str, Any]:
        p = self.pipelines[pipeline_uuid]
        b = {"all_upstream_blocks_executed": True, "color": None, "configuration": {}, "downstream_blocks": [],
             "executor_config": None, "executor_type": "local_python", "has_callback": False, "name": name,
             "language": language, "retry_config": None, "status": "updated", "timeout": None, "type": type,
             "upstream_blocks": list(upstream_blocks or []), "uuid": _slug(name), "content": content}
        for up in p["blocks"]:
            if up["uuid"] in b["upstream_blocks"]:
                up["downstream_blocks"].append(b["uuid"])
        p["blocks"].append(b)
        return b

    def add_trigger(self, pipeline_uuid: str, name: str, schedule_type: str = "api", status: str = "active",
                    schedule_interval: str | None = None) -> dict[str, Any]:
        now = self.now()
        sid = max(self.schedules, default=0) + 1
        s = {"created_at": _naive(now, seconds=True), "description": None, "global_data_product_uuid": None, "id": sid,
             "last_enabled_at": _naive(now), "name": name, "pipeline_uuid": pipeline_uuid, "repo_path": self.repo_path,
             "schedule_interval": schedule_interval, "schedule_type": schedule_type, "settings": None, "sla": None,
             "start_time": None, "status": status, "token": uuidlib.uuid4().hex if schedule_type == "api" else None,
             "updated_at": _naive(now, seconds=True), "variables": None}
        self.schedules[sid] = s
        return s

    # -- runs ------------------------------------------------------------------------------------
    def start_run(self, schedule_id: int, variables: dict[str, Any] | None = None,
                  event_variables: dict[str, Any] | None = None, *, seeded: bool = False) -> dict[str, Any]:
        """A new run of the trigger's pipeline, ``initial`` until the scheduler picks it up."""
        s = self.schedules[schedule_id]
        now = self.now()
        rid = max(self.runs, default=0) + 1
        partition = f"{schedule_id}/{now.strftime('%Y%m%dT%H%M%S_%f')}"
        run = {"pipeline_schedule_id": schedule_id, "pipeline_uuid": s["pipeline_uuid"], "execution_date": _naive(now),
               "status": "initial", "started_at": None, "completed_at": None,
               "variables": {**(variables or {}), "execution_partition": partition}, "passed_sla": False,
               "event_variables": event_variables, "metrics": None, "backfill_id": None,
               "executor_type": "local_python", "id": rid, "created_at": _naive(now, seconds=True),
               "updated_at": _naive(now, seconds=True), "_created": now, "_static": False, "_logs": {}}
        self.runs[rid] = run
        if not seeded and self.pipelines[s["pipeline_uuid"]]["type"] != "streaming":
            for b in self.pipelines[s["pipeline_uuid"]]["blocks"]:  # Mage makes them with the run
                self._block_run(run, b["uuid"], "initial", None, None)
        return run

    def add_run(self, pipeline_uuid: str, status: str, started_at: dt.datetime, ended_at: dt.datetime | None = None,
                *, trigger: str = "schedule", block_runs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Seed a finished or running run with fixed times (a history for an incident window).

        Args:
            pipeline_uuid: an existing pipeline.
            status: a pipeline-run status.
            started_at: its start (aware, or naive UTC); created one second before.
            ended_at: its end (``completed_at`` when completed, ``updated_at`` otherwise).
            trigger: the trigger's name (a time trigger with that name is made when missing).
            block_runs: ``[{"block_uuid", "status", "error"?}]``; default: one per block, with the
                run's status (``failed`` for the first block of a failed run, ``upstream_failed`` after).
        """
        p = self.pipelines[pipeline_uuid]
        s = next((s for s in self.schedules.values() if s["pipeline_uuid"] == pipeline_uuid and s["name"] == trigger),
                 None) or self.add_trigger(pipeline_uuid, trigger, schedule_type="time", schedule_interval="@daily")
        start = started_at if started_at.tzinfo else started_at.replace(tzinfo=UTC)
        end = (ended_at if ended_at is None or ended_at.tzinfo else ended_at.replace(tzinfo=UTC))
        run = self.start_run(s["id"], seeded=True)
        created = start - dt.timedelta(seconds=1)
        run.update(status=status, _static=True, _created=created, created_at=_naive(created, seconds=True),
                   execution_date=_naive(created), started_at=_naive(start),
                   completed_at=_naive(end) if status == "completed" else None,
                   updated_at=_naive(end or start, seconds=True))
        run["variables"]["execution_partition"] = f"{s['id']}/{created.strftime('%Y%m%dT%H%M%S_%f')}"
        if block_runs is None and p["type"] != "streaming":
            block_runs, failed = [], False
            for b in p["blocks"]:
                st = "upstream_failed" if failed else ("failed" if status == "failed" else status)
                failed = failed or st == "failed"
                block_runs.append({"block_uuid": b["uuid"], "status": st})
        for br in block_runs or []:
            self._block_run(run, br["block_uuid"], br["status"], start, end if br["status"] == "completed" else None,
                            error=br.get("error") or ("seeded failure" if br["status"] == "failed" else None))
        return run

    def _block_run(self, run: dict[str, Any], block_uuid: str, status: str, started: dt.datetime | None,
                   completed: dt.datetime | None, error: str | None = None) -> dict[str, Any]:
        bid = max(self.block_runs, default=0) + 1
        metrics = self._error_metrics(block_uuid, error) if error else {}
        br = {"pipeline_run_id": run["id"], "block_uuid": block_uuid, "status": status, "started_at": _naive(started),
              "completed_at": _naive(completed), "metrics": metrics, "id": bid,
              "created_at": run["created_at"], "updated_at": _naive(completed or started or run["_created"], seconds=True)}
        self.block_runs[bid] = br
        return br

    @staticmethod
    def _error_metrics(block_uuid: str, error: str) -> dict[str, Any]:
        """A failed block run's ``metrics``: ``{"error": {"error", "errors", "message"}}`` as Mage stores it."""
        return {"error": {"error": error, "errors": [f"  File \"<string>\", line 8, in {block_uuid}\n"],
                          "message": f"Traceback (most recent call last):\nValueError: {error}\n"}}

    def advance(self) -> None:
        """Move every run that is not seeded as the scheduler would, up to :meth:`now` (idempotent)."""
        now = self.now()
        for run in self.runs.values():
            if run["_static"] or run["status"] in ("completed", "failed", "cancelled"):
                continue
            p = self.pipelines[run["pipeline_uuid"]]
            start = run["_created"] + dt.timedelta(seconds=self.pickup_s)
            if now < start:
                continue
            if run["status"] == "initial":
                run.update(status="running", started_at=_naive(start), updated_at=_naive(start, seconds=True))
                self._log(run, "scheduler.log", start, "INFO",
                          f"Pipeline {p['uuid']} for run {run['id']} in schedule {run['pipeline_schedule_id']} is alive.")
            if p["type"] == "streaming":
                continue  # a stream runs until it is cancelled
            fail = run["variables"].get("fail")
            message = fail if isinstance(fail, str) else "dw test: asked to fail"
            blocks = {b["uuid"]: b for b in p["blocks"]}
            t, failed, done = start, False, True
            for br in sorted((b for b in self.block_runs.values() if b["pipeline_run_id"] == run["id"]),
                             key=lambda b: b["id"]):
                if br["status"] in ("completed", "failed", "upstream_failed", "cancelled"):
                    failed = failed or br["status"] == "failed"
                    t = br.get("_ended") or t
                    continue
                if failed:
                    br.update(status="upstream_failed", updated_at=_naive(t, seconds=True))
                    continue
                if br["status"] == "initial":
                    br.update(status="running", started_at=_naive(t), updated_at=_naive(t, seconds=True))
                end = t + dt.timedelta(seconds=self.block_s)
                if now < end:
                    done = False
                    break
                br.update(status="failed" if fail else "completed", completed_at=None if fail else _naive(end),
                          updated_at=_naive(end, seconds=True), _ended=end,
                          metrics=self._error_metrics(br["block_uuid"], message) if fail else {})
                self._block_logs(run, p, blocks.get(br["block_uuid"], {"uuid": br["block_uuid"], "type": "?"}), br, t,
                                 message if fail else None)
                failed, t = bool(fail), end
            if done:
                run.update(status="failed" if failed else "completed", completed_at=None if failed else _naive(t),
                           updated_at=_naive(t, seconds=True))

    # -- logs ------------------------------------------------------------------------------------
    def _log(self, run: dict[str, Any], name: str, at: dt.datetime, level: str, message: str,
             error: str | None = None, **tags: Any) -> None:
        entry = {**tags, "pipeline_run_id": run["id"], "pipeline_schedule_id": run["pipeline_schedule_id"],
                 "pipeline_uuid": run["pipeline_uuid"], "level": level, "message": message,
                 "timestamp": at.timestamp(), "uuid": uuidlib.uuid4().hex}
        if error:
            entry["error"] = error
        line = f"{at.replace(tzinfo=None, microsecond=0).isoformat()} {json.dumps(entry)}\n"
        if error:
            line += error
        run["_logs"][name] = run["_logs"].get(name, "") + line

    def _block_logs(self, run: dict[str, Any], p: dict[str, Any], b: dict[str, Any], br: dict[str, Any],
                    at: dt.datetime, error: str | None) -> None:
        tags = {"block_run_id": br["id"], "block_uuid": b["uuid"], "block_type": b["type"]}
        name = f"{b['uuid']}.log"
        self._log(run, "scheduler.log", at, "INFO", f"Execute PipelineRun {run['id']}, BlockRun {br['id']}: "
                  f"pipeline {p['uuid']} block {b['uuid']}")
        self._log(run, name, at, "INFO", "Start executing block with BlockExecutor.", **tags)
        if error:
            tb = f"Traceback (most recent call last):\n  File \"<string>\", line 8, in load_data\nValueError: {error}\n"
            self._log(run, name, at, "EXCEPTION", f"Failed to execute block {b['uuid']}", error=tb, **tags)
            self._log(run, "scheduler.log", at, "EXCEPTION", f"BlockRun {br['id']} (block_uuid: {b['uuid']}) failed.",
                      error=tb, **tags)
        else:
            self._log(run, name, at, "INFO", f"Finish executing block with {b['type']}.", **tags)
            self._log(run, "scheduler.log", at, "INFO", f"BlockRun {br['id']} (block_uuid: {b['uuid']}) completes.",
                      **tags)

    def log_files(self, run: dict[str, Any]) -> tuple[list[dict], list[dict]]:
        """``(block_run_logs, pipeline_run_logs)`` as ``File.to_dict(include_content=True)`` shows them."""
        p = self.pipelines[run["pipeline_uuid"]]
        folder = f"{p['variables_dir']}/pipelines/{p['uuid']}/.logs/{run['variables']['execution_partition']}"

        def f(name: str) -> dict[str, Any]:
            content = run["_logs"].get(name, "")
            return {"name": name, "path": f"{folder}/{name}", "size": len(content.encode()),
                    "modified_timestamp": self.clock(), "content": content}

        blocks = [f(f"{b['uuid']}.log") for b in p["blocks"] if f"{b['uuid']}.log" in run["_logs"]]
        return blocks, [f("pipeline.log"), f("scheduler.log")]

    # -- presentation ----------------------------------------------------------------------------
    def present_run(self, run: dict[str, Any], fmt: str) -> dict[str, Any]:
        """A run as ``PipelineRunPresenter`` shows it: ``fmt`` is "list", "detail" or "plain"."""
        out = _public(run)
        if fmt == "plain":
            return out
        s = self.schedules[run["pipeline_schedule_id"]]
        brs = sorted((b for b in self.block_runs.values() if b["pipeline_run_id"] == run["id"]), key=lambda b: b["id"])
        if fmt == "detail":
            out["block_runs"] = [{**_public(b), "pipeline_schedule_id": s["id"], "pipeline_schedule_name": s["name"]}
                                 for b in brs]
            return out
        out.update(block_runs=[_public(b) for b in brs], block_runs_count=len(brs),
                   completed_block_runs_count=sum(b["status"] == "completed" for b in brs),
                   pipeline_schedule_name=s["name"], pipeline_schedule_token=s["token"],
                   pipeline_schedule_type=s["schedule_type"], pipeline_tags=None, pipeline_type=None,
                   repo_path=self.repo_path)
        return out

    def present_schedule(self, s: dict[str, Any]) -> dict[str, Any]:
        runs = [r for r in self.runs.values() if r["pipeline_schedule_id"] == s["id"]]
        last = max(runs, key=lambda r: r["id"], default=None)
        return {**s, "event_matchers": [], "last_pipeline_run_status": last["status"] if last else None,
                "next_pipeline_run_date": None,
                "pipeline_in_progress_runs_count": sum(r["status"] in ("initial", "running") for r in runs),
                "pipeline_runs_count": len(runs), "tags": []}


# -- HTTP ----------------------------------------------------------------------------------------

class _Exception(Exception):
    """An exception Mage would not catch: HTTP 200, ``{"error": {"code": 500, ...}}`` (``write_error``)."""


class _ApiError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        self.error = error


def _url_parameters(path: str) -> dict[str, str]:
    """The route's keyword arguments as Mage's Tornado routes name them (``server/server.py``)."""
    m = re.fullmatch(r"/api/pipeline_schedules/(\w+)/(?:pipeline_runs/(\w+)|api_trigger)", path)
    if m:
        return {"pipeline_schedule_id": m[1], **({"token": m[2]} if m[2] else {})}
    parts = path.strip("/").split("/")[1:]
    return dict(zip(("resource", "pk", "child", "child_pk"), parts, strict=False))


def _exception_body(message: str, url_parameters: dict[str, Any]) -> JSONResponse:
    trace = ["  File \"/usr/local/lib/python3.11/site-packages/tornado/web.py\", line 1788, in _execute\n"]
    return JSONResponse({"error": {"code": 500, "errors": trace, "exception": message,
                                   "message": "Traceback (most recent call last):\n" + "".join(trace)
                                   + f"Exception: {message}\n"}, "url_parameters": url_parameters})


def _helpers(state: FakeMage) -> SimpleNamespace:
    """What every endpoint shares: error rendering, authentication, the endpoint wrapper, paging and lookups."""

    def codes(request: Request) -> bool:
        return bool(request.query_params.get("_http_error_codes"))

    def render_error(request: Request, error: dict[str, Any], http: int | None = None) -> JSONResponse:
        status = error["code"] if codes(request) else 200
        return JSONResponse({"error": error, "status": status}, status_code=status if codes(request) else (http or 200))

    def authenticate(request: Request, body: Any) -> tuple[dict[str, Any] | None, bool]:
        """``(error, has_user)`` as ``OAuthMiddleware.prepare`` decides them."""
        if not state.require_user_authentication:
            return None, True
        key = request.headers.get("x-api-key")
        if not key and request.method == "POST":  # a JSON body's api_key, else (not JSON) the query's
            key = body.get("api_key") if isinstance(body, dict) else request.query_params.get("api_key")
        elif not key:
            key = request.query_params.get("api_key")
        if not key or key != MAGE_OSS_API_KEY:
            return _ERR_API_KEY, False
        token = request.headers.get("oauth-token")
        if not token and request.headers.get("authorization", "").startswith("Bearer "):
            token = request.headers["authorization"][len("Bearer "):]
        if not token and request.cookies.get("oauth_token"):
            token = state.inner_from_cookie(request.cookies["oauth_token"]) or "?"
        if not token:
            return None, False
        if token not in state.tokens:
            return _ERR_TOKEN, False
        if state.tokens[token] < state.clock():
            return _ERR_EXPIRED, False
        return None, True

    def endpoint(handler: Callable[..., Any], *, action: str | None = None, auth: bool = True,
                 token_trigger: bool = False):
        async def run(request: Request) -> Response:
            state.requests.append(f"{request.method} {request.url.path}")
            path = request.url.path
            raw = await request.body() if request.method in ("POST", "PUT") else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                return _exception_body("Expecting value: line 1 column 1 (char 0)", _url_parameters(path))
            with state.lock:
                f = state.faults
                if not path.startswith("/_fake"):
                    if f.outage:
                        return Response("Service Unavailable", status_code=503)
                    if (f.status and f.status_count > 0 and (not f.status_path or re.search(f.status_path, path))
                            and (not f.status_method or f.status_method == request.method)):
                        f.status_count -= 1
                        return Response("upstream error", status_code=f.status,
                                        headers={"Retry-After": "0"} if f.status == 429 else None)
                    if f.exception and f.exception_count > 0 and (not f.exception_path or re.search(f.exception_path, path)):
                        f.exception_count -= 1
                        return _exception_body(f.exception, _url_parameters(path))
                if auth:
                    error, has_user = authenticate(request, body)
                    if error is not None:
                        return render_error(request, error, http=401)
                    if not has_user and action is not None:
                        return render_error(request, {"code": 403, "type": "unauthorized_access",
                                                      "message": f"Private access for {action} only, invalid scope."})
                state.advance()
                try:
                    result = handler(request, body)
                except _ApiError as e:
                    return render_error(request, e.error)
                except _Exception as e:
                    return _exception_body(str(e), _url_parameters(path))
            if isinstance(result, Response):
                return result
            return JSONResponse(result)
        return run

    def page(items: list[Any], request: Request, default: int = 40) -> tuple[list[Any], dict[str, Any]]:
        try:
            limit = int(request.query_params.get("_limit", default))
            offset = int(request.query_params.get("_offset", 0))
        except ValueError as e:
            raise _Exception(str(e)) from None
        chunk = items[offset:offset + limit + 1]
        return chunk[:limit], {"count": len(items), "next": len(chunk) > limit}

    def timestamp(request: Request, name: str) -> dt.datetime | None:
        value = request.query_params.get(name)
        if not value:
            return None
        try:
            return dt.datetime.fromtimestamp(int(value), UTC)
        except (ValueError, OverflowError):
            raise _ApiError({"code": 400, "message": f"Value is invalid for {name}.", "type": "record_invalid"}) from None

    def pipeline_or_raise(uuid: str) -> dict[str, Any]:
        if uuid not in state.pipelines:
            raise _Exception(f"Pipeline {uuid} does not exist.")
        return state.pipelines[uuid]

    def run_or_404(run_id: str) -> dict[str, Any]:
        run = state.runs.get(int(run_id)) if run_id.isdigit() else None
        if run is None:
            raise _ApiError(dict(_ERR_NOT_FOUND))
        return run

    return SimpleNamespace(codes=codes, render_error=render_error, authenticate=authenticate, endpoint=endpoint,
                           page=page, timestamp=timestamp, pipeline_or_raise=pipeline_or_raise, run_or_404=run_or_404)


def _pipeline_handlers(state: FakeMage, h: SimpleNamespace) -> dict[str, Callable[..., Any]]:
    """Status, sessions, pipelines, their blocks and schedules."""
    page, pipeline_or_raise = h.page, h.pipeline_or_raise

    # -- handlers ---------------------------------------------------------------------------------
    def status(request, body):
        return {"statuses": [{"is_instance_manager": False, "max_print_output_lines": 1000,
                              "repo_path": state.repo_path, "repo_path_relative": state.repo_path.rsplit("/", 1)[-1],
                              "repo_path_relative_root": state.repo_path.rsplit("/", 1)[-1],
                              "repo_path_root": state.repo_path, "server_process_id": 1, "scheduler_process_id": 2,
                              "scheduler_status": "running", "instance_type": None,
                              "disable_pipeline_edit_access": False,
                              "require_user_authentication": state.require_user_authentication,
                              "require_user_permissions": False, "project_type": "standalone",
                              "project_uuid": state.project_uuid}], "metadata": {}}

    def sessions(request, body):
        s = (body or {}).get("session") or {}
        email, password = s.get("email") or s.get("username"), s.get("password")
        if not email or not password:
            raise _ApiError({**_ERR_NOT_FOUND, "message": "Email/username and password are required."})
        if state.users.get(email) != password:
            raise _ApiError({**_ERR_NOT_FOUND, "message": "Email/username and/or password invalid."})
        return {"session": state.login(email), "metadata": None}

    def pipelines(request, body):
        if request.method == "POST":
            p = (body or {}).get("pipeline") or {}
            if _slug(p.get("name", "")) in state.pipelines:
                raise _Exception(f"Pipeline {p.get('name')} already exists.")
            return {"pipeline": state.add_pipeline(p.get("name", ""), p.get("type") or "python", p.get("description")),
                    "metadata": None}
        # 0.9.80 lists pipelines from its pipeline cache, filled when a pipeline is created: blocks added
        # through the API later are missing there (GET /api/pipelines/{uuid} reads them from the files)
        items = [{**_public(p), "blocks": []} for _, p in sorted(state.pipelines.items())]
        return {"pipelines": items, "metadata": {"count": len(items), "results": len(items), "next": None}}

    def pipeline(request, body):
        p = pipeline_or_raise(request.path_params["uuid"])
        blocks = [{**b, "callback_blocks": [], "conditional_blocks": [], "outputs": [], "metadata": {}, "tags": []}
                  for b in p["blocks"]]
        return {"pipeline": {**p, "blocks": blocks, "extensions": {}}, "metadata": None}

    def blocks(request, body):
        p = pipeline_or_raise(request.path_params["uuid"])
        b = (body or {}).get("block") or {}
        return {"block": state.add_block(p["uuid"], b.get("name", ""), b.get("type") or "data_loader",
                                         b.get("language") or "python", b.get("content") or "",
                                         b.get("upstream_blocks")), "metadata": None}

    def schedules(request, body):
        p = pipeline_or_raise(request.path_params["uuid"])
        if request.method == "POST":
            s = (body or {}).get("pipeline_schedule") or {}
            return {"pipeline_schedule": state.add_trigger(p["uuid"], s.get("name") or "trigger",
                                                           s.get("schedule_type") or "time",
                                                           s.get("status") or "inactive", s.get("schedule_interval")),
                    "metadata": None}
        items = [state.present_schedule(s) for _, s in sorted(state.schedules.items(), reverse=True)
                 if s["pipeline_uuid"] == p["uuid"]]
        items, meta = page(items, request)
        return {"pipeline_schedules": items, "metadata": meta}

    return {"status": status, "sessions": sessions, "pipelines": pipelines, "pipeline": pipeline, "blocks": blocks,
            "schedules": schedules}


def _run_handlers(state: FakeMage, h: SimpleNamespace) -> dict[str, Callable[..., Any]]:
    """Triggers (API token and session), pipeline runs, block runs and logs."""
    endpoint, page, timestamp, pipeline_or_raise, run_or_404 = h.endpoint, h.page, h.timestamp, h.pipeline_or_raise, h.run_or_404

    def token_trigger(request, body):
        sid = request.path_params["schedule_id"]
        s = state.schedules.get(int(sid)) if sid.isdigit() else None
        if s is None:
            raise _Exception(str(_ERR_NOT_FOUND))
        token = request.path_params.get("token")
        if token is None and request.headers.get("authorization", "").startswith("Bearer "):
            token = request.headers["authorization"][len("Bearer "):]
        if s["schedule_type"] != "api":
            raise _Exception("This endpoint is only supported for API trigger.")
        if s["token"] != token:
            raise _Exception(f"Invalid token for pipeline schedule ID {sid}.")
        payload = (body or {}).get("pipeline_run") or {}
        events = {k: v for k, v in (body or {}).items() if k != "pipeline_run"}
        return {"pipeline_run": state.present_run(state.start_run(s["id"], payload.get("variables") or {}, events),
                                                  "plain")}

    def session_trigger(request, body):
        sid = request.path_params["schedule_id"]
        if not sid.isdigit() or int(sid) not in state.schedules:
            raise _ApiError(dict(_ERR_NOT_FOUND))
        payload = (body or {}).get("pipeline_run") or {}
        return {"pipeline_run": state.present_run(state.start_run(int(sid), payload.get("variables") or {}), "plain"),
                "metadata": None}

    def pipeline_runs(request, body):
        q = request.query_params
        runs = list(state.runs.values())
        if q.get("pipeline_uuid"):
            runs = [r for r in runs if r["pipeline_uuid"] == q["pipeline_uuid"]]
        if q.get("status"):
            runs = [r for r in runs if r["status"] == q["status"]]
        if q.get("status[]"):
            wanted = q["status[]"].split(",")
            runs = [r for r in runs if r["status"] in wanted]
        start, end = timestamp(request, "start_timestamp"), timestamp(request, "end_timestamp")
        if start is not None:
            runs = [r for r in runs if r["_created"].replace(microsecond=0) >= start]
        if end is not None:
            runs = [r for r in runs if r["_created"].replace(microsecond=0) <= end]
        order = [(s.strip().split(" ") + ["asc"])[:2] for s in q.get("order_by[]", "").split(",") if s.strip()]
        if not order:
            order = [["execution_date", "desc"], ["id", "desc"]]
        for col, direction in reversed(order):
            runs.sort(key=lambda r: (r.get(col) is not None, r.get(col)), reverse=direction.lower() == "desc")
        items, meta = page(runs, request)
        return {"pipeline_runs": [state.present_run(r, "list") for r in items], "metadata": meta}

    def pipeline_run(request, body):
        run = run_or_404(request.path_params["run_id"])
        if request.method == "PUT":
            change = (body or {}).get("pipeline_run") or {}
            if change.get("status") == "cancelled" and run["status"] not in ("completed", "failed", "cancelled"):
                now = state.now()
                run.update(status="cancelled", updated_at=_naive(now, seconds=True), _static=True)
                for b in state.block_runs.values():
                    if b["pipeline_run_id"] == run["id"] and b["status"] in ("initial", "queued", "running"):
                        b.update(status="cancelled", updated_at=_naive(now, seconds=True))
            return {"pipeline_run": state.present_run(run, "plain"), "metadata": None}
        return {"pipeline_run": state.present_run(run, "detail"), "metadata": None}

    def block_runs_list(request, body):
        q = request.query_params
        brs = list(state.block_runs.values())
        run_id = request.path_params.get("run_id") or q.get("pipeline_run_id")
        nested = "run_id" in request.path_params
        if nested:
            run_or_404(run_id)
        if run_id and run_id.isdigit():
            brs = [b for b in brs if b["pipeline_run_id"] == int(run_id)]
        if q.get("pipeline_uuid"):
            brs = [b for b in brs if state.runs[b["pipeline_run_id"]]["pipeline_uuid"] == q["pipeline_uuid"]]
        brs.sort(key=lambda b: (b["started_at"] or "", b["created_at"] or "", b["completed_at"] or ""), reverse=True)
        items, meta = page(brs, request)
        out = []
        for b in items:  # the list endpoint builds its rows itself: ISO 8601 with a "T", schedule columns joined
            run = state.runs[b["pipeline_run_id"]]
            s = state.schedules[run["pipeline_schedule_id"]]
            iso = {k: (b[k].replace(" ", "T") if b[k] else None) for k in ("completed_at", "created_at", "started_at",
                                                                           "updated_at")}
            out.append({"block_uuid": b["block_uuid"], **iso, "id": b["id"], "pipeline_run_id": b["pipeline_run_id"],
                        "status": b["status"], "pipeline_schedule_id": None if nested else s["id"],
                        "pipeline_schedule_name": None if nested else s["name"]})
        return {"block_runs": out, "metadata": meta}

    def logs(request, body):
        p = pipeline_or_raise(request.path_params["uuid"])
        wanted = [i for i in request.query_params.get("pipeline_run_id[]", "").split(",") if i.strip()]
        runs = [r for r in state.runs.values() if r["pipeline_uuid"] == p["uuid"]
                and (not wanted or str(r["id"]) in wanted)]
        block_logs, run_logs = [], []
        for r in sorted(runs, key=lambda r: r["_created"], reverse=True)[:20]:
            b, pl = state.log_files(r)
            block_logs += b
            run_logs += pl
        return {"logs": [{"block_run_logs": block_logs, "pipeline_run_logs": run_logs,
                          "total_block_run_log_count": len(block_logs),
                          "total_pipeline_run_log_count": len(runs)}], "metadata": {}}

    return {"token_trigger": token_trigger, "session_trigger": session_trigger, "pipeline_runs": pipeline_runs,
            "pipeline_run": pipeline_run, "block_runs_list": block_runs_list, "logs": logs}


def _fake_handlers(state: FakeMage, h: SimpleNamespace) -> dict[str, Callable[..., Any]]:
    """The fake's controls (faults, runs, state)."""
    # -- fake controls ----------------------------------------------------------------------------
    def fake_faults(request, body):
        body = body or {}
        if body.get("reset"):
            state.faults = Faults()
        f = state.faults
        if "status" in body:
            f.status, f.status_count = int(body["status"]), int(body.get("count", 1))
            f.status_path, f.status_method = body.get("path"), (body.get("method") or "").upper() or None
        if "exception" in body:
            f.exception, f.exception_count, f.exception_path = body["exception"], int(body.get("count", 1)), body.get("path")
        if "outage" in body:
            f.outage = bool(body["outage"])
        if body.get("expire_tokens"):
            state.tokens = {t: 0.0 for t in state.tokens}
        return {"faults": f.__dict__}

    def fake_runs(request, body):
        items = body if isinstance(body, list) else [body]
        out = []
        for i in items:
            started = dt.datetime.fromisoformat(i["started_at"])
            ended = dt.datetime.fromisoformat(i["ended_at"]) if i.get("ended_at") else None
            run = state.add_run(i["pipeline_uuid"], i["status"], started, ended, trigger=i.get("trigger") or "schedule",
                                block_runs=i.get("block_runs"))
            out.append(state.present_run(run, "detail"))
        return {"pipeline_runs": out}

    def fake_state(request, body):
        return {"pipelines": sorted(state.pipelines), "runs": len(state.runs), "sessions": len(state.tokens),
                "requests": len(state.requests)}

    return {"fake_faults": fake_faults, "fake_runs": fake_runs, "fake_state": fake_state}


def build_app(state: FakeMage) -> Starlette:
    """The Starlette app serving ``state``."""
    h = _helpers(state)
    endpoint = h.endpoint
    handlers = {**_pipeline_handlers(state, h), **_run_handlers(state, h), **_fake_handlers(state, h)}
    routes = [
        Route("/api/status", endpoint(handlers["status"], auth=False)),
        Route("/api/statuses", endpoint(handlers["status"], auth=False)),
        Route("/api/sessions", endpoint(handlers["sessions"]), methods=["POST"]),
        Route("/api/pipelines", endpoint(handlers["pipelines"], action="list"), methods=["GET", "POST"]),
        Route("/api/pipelines/{uuid}", endpoint(handlers["pipeline"], action="detail")),
        Route("/api/pipelines/{uuid}/blocks", endpoint(handlers["blocks"], action="create"), methods=["POST"]),
        Route("/api/pipelines/{uuid}/pipeline_schedules", endpoint(handlers["schedules"], action="list"), methods=["GET", "POST"]),
        Route("/api/pipelines/{uuid}/logs", endpoint(handlers["logs"], action="list")),
        Route("/api/pipeline_schedules/{schedule_id}/pipeline_runs/{token}", endpoint(handlers["token_trigger"], auth=False),
              methods=["POST"]),
        Route("/api/pipeline_schedules/{schedule_id}/api_trigger", endpoint(handlers["token_trigger"], auth=False),
              methods=["POST"]),
        Route("/api/pipeline_schedules/{schedule_id}/pipeline_runs", endpoint(handlers["session_trigger"], action="create"),
              methods=["POST"]),
        Route("/api/pipeline_runs", endpoint(handlers["pipeline_runs"], action="list")),
        Route("/api/pipeline_runs/{run_id}", endpoint(handlers["pipeline_run"], action="detail"), methods=["GET", "PUT"]),
        Route("/api/pipeline_runs/{run_id}/block_runs", endpoint(handlers["block_runs_list"], action="list")),
        Route("/api/block_runs", endpoint(handlers["block_runs_list"], action="list")),
        Route("/_fake/faults", endpoint(handlers["fake_faults"], auth=False), methods=["POST"]),
        Route("/_fake/runs", endpoint(handlers["fake_runs"], auth=False), methods=["POST"]),
        Route("/_fake/state", endpoint(handlers["fake_state"], auth=False)),
    ]
    return Starlette(routes=routes)


class FakeMageServer:
    """The fake on a loopback port, served by uvicorn in a background thread.

    Use as a context manager; :attr:`url` is ``http://127.0.0.1:<port>``.
    """

    def __init__(self, state: FakeMage | None = None, port: int = 0, host: str = "127.0.0.1") -> None:
        import socket

        import uvicorn

        self.state = state or FakeMage()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(build_app(self.state), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def start(self) -> FakeMageServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                        name="fake-mage")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake Mage server did not start within 10 s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread:
            self._thread.join(10)
        self._sock.close()

    def __enter__(self) -> FakeMageServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(port: int, require_user_authentication: bool = True, token_ttl_s: float = 2_592_000.0) -> None:
    """Run the fake until SIGINT/SIGTERM; prints ``{"url", "api_key", "email", "password"}`` as JSON."""
    import signal

    state = FakeMage(require_user_authentication=require_user_authentication, token_ttl_s=token_ttl_s)
    server = FakeMageServer(state, port=port).start()
    print(json.dumps({"url": server.url, "api_key": MAGE_OSS_API_KEY, "email": DEFAULT_EMAIL,
                      "password": DEFAULT_PASSWORD}), flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    server.stop()


if __name__ == "__main__":  # pragma: no cover - exercised as a subprocess by the tests
    import argparse

    ap = argparse.ArgumentParser(description="Fake Mage OSS REST API on loopback")
    ap.add_argument("--port", type=int, default=6789)
    ap.add_argument("--no-auth", action="store_true", help="REQUIRE_USER_AUTHENTICATION off")
    ap.add_argument("--token-ttl-s", type=float, default=2_592_000.0, help="session lifetime, seconds")
    a = ap.parse_args()
    serve(a.port, not a.no_auth, a.token_ttl_s)
