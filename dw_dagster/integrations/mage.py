"""Mage OSS's REST API over httpx: status, pipelines, pipeline runs, block runs, run logs, triggers.

dw_dagster only *reads* Mage: it places an incident among the pipeline runs and reads the outcome
of a rerun the engineer starts in Mage. Routes, envelopes and auth follow mage-ai 0.9.80's source
(``shared/reference/components_mcp_mage.md`` §4; ``mage_ai/server/server.py`` routes,
``mage_ai/api/resources/*Resource.py``, ``mage_ai/api/presenters/*Presenter.py``):

- ``GET /api/status`` → ``{"statuses": [{repo_path, require_user_authentication, scheduler_status, ...}]}``
  (no auth);
- ``GET /api/pipelines`` → ``{"pipelines": [...], "metadata": {count, results, next}}``;
  ``GET /api/pipelines/{uuid}`` → ``{"pipeline": {uuid, name, type, blocks, ...}}``;
- ``GET /api/pipeline_runs?pipeline_uuid=&status=|status[]=a,b&start_timestamp=&end_timestamp=&order_by[]=id asc
  &disable_retries_grouping=true&_limit=&_offset=`` → ``{"pipeline_runs": [...], "metadata": {count, next}}``
  (``PipelineRunResource.collection``: the time range filters ``created_at`` with epoch seconds read
  by ``datetime.fromtimestamp`` in the *server's* local time; without ``disable_retries_grouping``
  the runs of the page's last ``execution_date`` are regrouped across pages);
  ``GET /api/pipeline_runs/{id}`` → ``{"pipeline_run": {..., block_runs}}``;
- ``GET /api/block_runs?pipeline_run_id=&_limit=&_offset=`` → ``{"block_runs": [...], "metadata": {count, next}}``;
- ``GET /api/pipelines/{uuid}/logs?pipeline_run_id[]=`` → ``{"logs": [{block_run_logs, pipeline_run_logs,
  total_block_run_log_count, total_pipeline_run_log_count}]}``, each log file ``{name, path, size,
  modified_timestamp, content}`` with lines ``<ISO time> <JSON {level, message, error?, ...}>``;
- ``GET /api/pipelines/{uuid}/pipeline_schedules`` → ``{"pipeline_schedules": [...]}`` (the triggers;
  ``GET /api/pipeline_schedules?pipeline_uuid=`` does *not* filter by pipeline in 0.9.80).

**Auth** (``mage_ai/api/middleware.py``): every request carries the API key (``X-API-KEY``; Mage OSS
accepts only ``OAUTH2_APPLICATION_CLIENT_ID`` from ``mage_ai/settings/server.py``). With user
authentication on (``REQUIRE_USER_AUTHENTICATION``, default on), ``POST /api/sessions
{"session": {"email", "password"}}`` returns ``{"session": {"token": <JWT {expires, token}>, "expires"}}``
and the JWT's inner ``token`` goes in the ``OAUTH-TOKEN`` header. It is renewed ahead of
``expires`` (``MAGE_ACCESS_TOKEN_EXPIRY_TIME``, 30 days by default) and once more, then the request
retried, on ``401 expired_oauth_token`` / ``invalid_oauth_token``. Without credentials no token is
sent (an instance without user authentication).

**Errors**: every request asks for real HTTP statuses (``_http_error_codes=true``, ``api/views.py``),
and a body ``{"error": {code, message, type}}`` is an error whatever the HTTP status: Mage rewrites
unhandled exceptions (a pipeline that does not exist, a bad trigger token) to HTTP 200 with
``{"error": {"code": 500, "exception", "message": <traceback>}}`` (``server/api/base.py:write_error``).
They raise :class:`MageApiError`, which names the pipeline or run and what to check and never carries
a token. 429, 5xx and transport errors are retried (:func:`dw_dagster.core.http.send`).

Timestamps: Mage writes UTC (``datetime.now(tz=pytz.UTC)``, the database's ``now()``) and presents it
without an offset (``"2026-12-02 04:57:16"``); the models make every timestamp timezone-aware UTC.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg
import httpx
from pydantic import Field, PrivateAttr

from dw_dagster.core.http import HttpApiError, RetryPolicy, send
from dw_dagster.errors import DwDagsterError
from dw_dagster.integrations.mage_models import (
    BLOCK_RUN_STATUSES,
    RUN_FINISHED,
    RUN_PROBLEMS,
    RUN_STATUSES,
    MageBlock,
    MageBlockRun,
    MageLogFile,
    MageLogSummary,
    MagePipeline,
    MageRun,
    MageStatus,
    MageTrigger,
    summarize_log,
    utc_time,
)
from dw_dagster.dagster_private import public

SERVICE = "mage"
URL_ENV, API_KEY_ENV, EMAIL_ENV, PASSWORD_ENV = "MAGE_URL", "MAGE_API_KEY", "MAGE_EMAIL", "MAGE_PASSWORD"
#: Mage OSS's API key: the public ``OAUTH2_APPLICATION_CLIENT_ID`` constant in ``mage_ai/settings/server.py``.
DEFAULT_API_KEY = "zkWlN0PkIKSN0C11CfUHUj84OT5XOJ6tDZ6bDRO2"
_TOKEN_ERRORS = frozenset({"expired_oauth_token", "invalid_oauth_token"})


class MageError(DwDagsterError):
    """A Mage answer dw_dagster cannot use, or a Mage setting that does not fit."""


#: how many times a paged list is read again when it shrinks between two page requests
PAGED_READS = 3


class MageApiError(HttpApiError, MageError):
    """Mage refused a request or failed on it (an HTTP error status or an ``{"error": ...}`` body).

    Attributes:
        what: the object asked for ("pipeline run 12", "pipeline 'finance_daily'").
        code: Mage's ``error.code`` (an HTTP status; 500 for an exception Mage rewrote to HTTP 200),
            or the HTTP status, or None when no answer arrived.
        type: Mage's ``error.type`` (``record_not_found``, ``unauthorized_access``,
            ``invalid_api_key``, ``expired_oauth_token`` ...) or None.
        hint: what to check.
    """

    def __init__(self, method: str, endpoint: str, status: int | None, *, what: str, code: int | None,
                 type: str | None, problem: str, hint: str, maybe_applied: bool = False) -> None:
        self.what, self.code, self.type, self.hint = what, code, type, hint
        super().__init__(SERVICE, method, endpoint, status, f"{what}: {problem}; check {hint}",
                         maybe_applied=maybe_applied)


def _jwt_claims(token: str) -> dict[str, Any]:
    """The claims of a session JWT, read without verifying it (only the timing depends on them)."""
    try:
        body = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


@public
class MageClient:
    """A read-only session with one Mage OSS instance.

    Args:
        url: the server's base URL, e.g. ``http://mage.internal:6789``.
        api_key: sent as ``X-API-KEY`` (default: Mage OSS's public key, :data:`DEFAULT_API_KEY`).
        email: a Mage user's email, for instances with user authentication (with ``password``).
        password: that user's password.
        ui_url: base URL of Mage's UI for links (default: ``url``).
        policy: retries and timeouts per request.
        transport: an httpx transport (tests may pass one; the default is real HTTP).
        clock: epoch seconds now (tests pass a fake clock to age the session token).

    Raises:
        MageError: ``email`` without ``password`` or the reverse.
    """

    def __init__(self, url: str, *, api_key: str | None = None, email: str | None = None, password: str | None = None,
                 ui_url: str | None = None, policy: RetryPolicy = RetryPolicy(),
                 transport: httpx.BaseTransport | None = None, clock: Callable[[], float] = time.time) -> None:
        if bool(email) != bool(password):
            raise MageError("Mage user authentication needs both an email and a password "
                            f"(set both, or neither for an instance without it: ${EMAIL_ENV}, ${PASSWORD_ENV})")
        self.url = url.rstrip("/")
        self.ui_url = (ui_url or self.url).rstrip("/")
        self.email, self._password = email or None, password or None
        self.policy, self._clock = policy, clock
        self._http = httpx.Client(base_url=self.url, transport=transport, headers={
            "Accept": "application/json", "User-Agent": "dw-dagster", "X-API-KEY": api_key or DEFAULT_API_KEY})
        self._token: str | None = None
        self._renew_at: float | None = None
        #: how many times this client logged in (``POST /api/sessions``)
        self.logins = 0

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MageClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MageClient({self.url!r}, email={self.email!r})"

    # -- plumbing ------------------------------------------------------------------------------
    def _fail(self, method: str, path: str, status: int | None, what: str, error: Any, *,
              maybe_applied: bool = False) -> MageApiError:
        err = error if isinstance(error, Mapping) else {}
        code = err.get("code") if isinstance(err.get("code"), int) else status
        etype = err.get("type") if isinstance(err.get("type"), str) else None
        problem = str(err.get("exception") or err.get("message") or error or "error")
        if code == 500 and err.get("exception"):
            problem = f"Mage raised: {err['exception']}"
        problem = " ".join(problem.split())[:300]
        creds = self.email is not None
        if status is None:
            hint = f"that Mage is running and reachable at {self.url} (GET /api/status answers without auth)"
        elif etype == "invalid_api_key":
            hint = (f"the API key (MageResource.api_key / ${API_KEY_ENV}; Mage OSS accepts only "
                    "OAUTH2_APPLICATION_CLIENT_ID from mage_ai/settings/server.py)")
        elif path == "/api/sessions":
            hint = f"the Mage user's email and password (${EMAIL_ENV}, ${PASSWORD_ENV})"
        elif etype in _TOKEN_ERRORS:
            hint = "the Mage server's clock and MAGE_ACCESS_TOKEN_EXPIRY_TIME: a fresh session token was refused"
        elif code == 403 and not creds:
            hint = (f"whether this Mage instance requires user authentication (GET /api/status → "
                    f"require_user_authentication); if so set an email and password (${EMAIL_ENV}, ${PASSWORD_ENV})")
        elif code == 403:
            hint = f"the role of Mage user {self.email} (it needs at least Viewer to read pipelines and runs)"
        elif code == 404 or "does not exist" in problem:
            problem = "not found" if code == 404 else problem
            hint = f"the name or id, and that {self.url} is the Mage instance that runs it (GET /api/pipelines)"
        elif code is not None and code >= 500:
            hint = f"Mage's server log at {self.url} (the error is Mage's own)"
        else:
            hint = "the request's parameters against Mage's API (mage_ai/api/resources)"
        return MageApiError(method, path, status, what=what, code=code, type=etype, problem=problem, hint=hint,
                            maybe_applied=maybe_applied)

    def _send(self, method: str, path: str, what: str, headers: dict[str, str], **kwargs: Any) -> Any:
        params = {**(kwargs.pop("params", None) or {}), "_http_error_codes": "true"}
        try:
            r = send(self._http, SERVICE, method, path, policy=self.policy, params=params, headers=headers, **kwargs)
        except MageApiError:
            raise
        except HttpApiError as e:
            body: Any = None
            if e.status is not None:
                try:  # a Mage error body, whitespace-collapsed by send(); small for 4xx
                    body = json.loads(e.detail).get("error")
                except (ValueError, AttributeError):
                    body = None
            raise self._fail(method, path, e.status, what, body or e.detail, maybe_applied=e.maybe_applied) from None
        try:
            data = r.json()
        except ValueError:
            raise self._fail(method, path, r.status_code, what, {"message": "the answer is not JSON"}) from None
        if not isinstance(data, dict):
            raise self._fail(method, path, r.status_code, what,
                             {"message": f"expected a JSON object, got {type(data).__name__}"})
        if data.get("error"):  # Mage's HTTP-200 error body
            raise self._fail(method, path, r.status_code, what, data["error"])
        return data

    def _login(self) -> None:
        data = self._send("POST", "/api/sessions", f"login of Mage user {self.email}", {},
                          json={"session": {"email": self.email, "password": self._password}})
        session = data.get("session") if isinstance(data.get("session"), dict) else {}
        jwt = session.get("token")
        claims = _jwt_claims(jwt) if isinstance(jwt, str) else {}
        if not isinstance(claims.get("token"), str):
            raise self._fail("POST", "/api/sessions", 200, f"login of Mage user {self.email}",
                             {"message": "the session has no token (expected a JWT with a 'token' claim)"})
        self._token = claims["token"]
        # `session.expires` is naive UTC; the JWT's `expires` is the same instant read in the server's local time
        expires = utc_time(session.get("expires")) if session.get("expires") else utc_time(claims.get("expires"))
        now = self._clock()
        life = expires.timestamp() - now if expires else None
        self._renew_at = now + life - min(30.0, life / 2) if life and life > 0 else None
        self.logins += 1

    def _headers(self) -> dict[str, str]:
        if self.email is None:
            return {}
        if self._token is None or (self._renew_at is not None and self._clock() >= self._renew_at):
            self._login()
        assert self._token is not None
        return {"OAUTH-TOKEN": self._token}

    def request(self, method: str, path: str, *, what: str, params: Mapping[str, Any] | None = None,
                json: Any = None, login: bool = True) -> dict[str, Any]:
        """One authenticated call; returns the decoded JSON object.

        Args:
            method: HTTP method.
            path: the API path, e.g. ``/api/pipeline_runs/12``.
            what: the object asked for, for error messages ("pipeline run 12").
            params: query parameters (``_http_error_codes=true`` is always added).
            json: the request body.
            login: send the session token (logging in first when needed); False for the routes
                Mage serves without one (``/api/status``).

        Raises:
            MageApiError: an HTTP error or an ``{"error": ...}`` body (after one re-login on an
                expired or invalid session token), retries exhausted, or an answer that is not a
                JSON object.
        """
        for attempt in (1, 2):
            try:
                headers = self._headers() if login else {}
                return self._send(method, path, what, headers, params=dict(params or {}), json=json)
            except MageApiError as e:
                if attempt == 1 and self.email is not None and e.type in _TOKEN_ERRORS:
                    self._token = None  # expired or revoked: log in again and retry once
                    continue
                raise
        raise AssertionError("unreachable")

    def _pages(self, path: str, key: str, what: str, params: Mapping[str, Any], page_size: int,
               max_items: int) -> list[dict]:
        """Every item of a paged list (``_limit``/``_offset``, ``metadata.next``), deduplicated by ``id``.

        Offsets move when items before them are deleted between two page requests (Mage's
        retention deletes old runs): the next page then starts one item late and that item is never
        read. Mage's ``metadata.count`` (the list's size) falling between two pages says so; the
        whole list is read again (at most :data:`PAGED_READS` times), never answered in part."""
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        for _ in range(PAGED_READS):
            out: dict[Any, dict] = {}
            offset, count = 0, None
            while True:
                data = self.request("GET", path, what=what, params={**params, "_limit": page_size, "_offset": offset})
                items = data.get(key)
                if not isinstance(items, list):
                    raise self._fail("GET", path, 200, what, {"message": f"the answer has no {key!r} list"})
                now = (data.get("metadata") or {}).get("count")
                if isinstance(now, int) and isinstance(count, int) and now < count:
                    break  # items before the offset were deleted: this read may have skipped one
                count = now if isinstance(now, int) else count
                fresh = [i for i in items if isinstance(i, dict) and i.get("id") not in out]
                out.update((i.get("id"), i) for i in fresh)
                if len(out) > max_items:
                    raise MageError(f"Mage {what}: more than {max_items} items; narrow the time range or raise max_items")
                if not (data.get("metadata") or {}).get("next") or not items:
                    return list(out.values())
                if not fresh:
                    raise self._fail("GET", path, 200, what, {"message": f"page at _offset={offset} repeats the previous "
                                                                         "one (the server ignores _offset)"})
                offset += len(items)
        raise self._fail("GET", path, 200, what, {"message": f"the list changed while it was read ({PAGED_READS} reads: "
                                                             "items were deleted between page requests, so an offset page "
                                                             "may skip one); try again when Mage's cleanup is done"})

    # -- reads ---------------------------------------------------------------------------------
    def status(self) -> MageStatus:
        """``GET /api/status``: the instance (repo, user authentication, scheduler); needs no login."""
        data = self.request("GET", "/api/status", what="Mage status", login=False)
        statuses = data.get("statuses")
        if not isinstance(statuses, list) or not statuses or not isinstance(statuses[0], dict):
            raise self._fail("GET", "/api/status", 200, "Mage status", {"message": "no 'statuses' in the answer"})
        return MageStatus.model_validate(statuses[0])

    def pipelines(self) -> list[MagePipeline]:
        """``GET /api/pipelines``: every pipeline of the project (with its blocks)."""
        data = self.request("GET", "/api/pipelines", what="pipeline list")
        return [MagePipeline.model_validate(p) for p in data.get("pipelines") or [] if isinstance(p, dict)]

    def pipeline(self, uuid: str) -> MagePipeline:
        """``GET /api/pipelines/{uuid}``.

        Raises:
            MageApiError: no such pipeline (Mage answers HTTP 200 with a code-500 error body
                ``Pipeline <uuid> does not exist.``).
        """
        data = self.request("GET", f"/api/pipelines/{uuid}", what=f"pipeline {uuid!r}")
        return MagePipeline.model_validate(data.get("pipeline") or {})

    def pipeline_runs(self, pipeline_uuid: str | None = None, *, status: str | Sequence[str] | None = None,
                      created_after: dt.datetime | None = None, created_before: dt.datetime | None = None,
                      page_size: int = 100, max_runs: int = 10_000) -> list[MageRun]:
        """``GET /api/pipeline_runs``: runs, oldest first, every page read.

        Args:
            pipeline_uuid: only this pipeline's runs (None: every pipeline).
            status: one status or several (:data:`RUN_STATUSES`).
            created_after: only runs created at or after this time (naive = UTC); sent as
                ``start_timestamp``, whole seconds rounded down.
            created_before: only runs created at or before this time; ``end_timestamp``, rounded up.
                Mage compares both with ``created_at`` in its server's local time: a Mage server not on
                UTC shifts the range by its offset (:func:`dw_dagster.integrations.mage_runs.runs_in_window`
                widens it and filters again).
            page_size: ``_limit`` per request.
            max_runs: more runs than this is an error (an unbounded read).

        Returns:
            Runs in ``id`` order, each with its block runs as the list endpoint nests them.

        Raises:
            MageApiError: naming the pipeline.
            MageError: more than ``max_runs`` runs.
        """
        params: dict[str, Any] = {"order_by[]": "id asc", "disable_retries_grouping": "true"}
        if pipeline_uuid is not None:
            params["pipeline_uuid"] = pipeline_uuid
        if isinstance(status, str):
            params["status"] = status
        elif status:
            params["status[]"] = ",".join(status)
        if created_after is not None:
            params["start_timestamp"] = math.floor(utc_time(created_after).timestamp())
        if created_before is not None:
            params["end_timestamp"] = math.ceil(utc_time(created_before).timestamp())
        what = f"runs of pipeline {pipeline_uuid!r}" if pipeline_uuid else "pipeline runs"
        items = self._pages("/api/pipeline_runs", "pipeline_runs", what, params, page_size, max_runs)
        return sorted((MageRun.model_validate(i) for i in items), key=lambda r: r.id)

    def latest_run(self, pipeline_uuid: str) -> MageRun | None:
        """The pipeline's newest run (highest ``id``; ``order_by[]=id desc&_limit=1``), or None when it has none."""
        data = self.request("GET", "/api/pipeline_runs", what=f"latest run of pipeline {pipeline_uuid!r}",
                            params={"pipeline_uuid": pipeline_uuid, "order_by[]": "id desc",
                                    "disable_retries_grouping": "true", "_limit": 1, "_offset": 0})
        runs = [MageRun.model_validate(r) for r in data.get("pipeline_runs") or [] if isinstance(r, dict)]
        return max(runs, key=lambda r: r.id) if runs else None

    def pipeline_run(self, run_id: int) -> MageRun:
        """``GET /api/pipeline_runs/{id}``: one run with its block runs (oldest first)."""
        data = self.request("GET", f"/api/pipeline_runs/{int(run_id)}", what=f"pipeline run {run_id}")
        return MageRun.model_validate(data.get("pipeline_run") or {})

    def block_runs(self, run_id: int, *, page_size: int = 100) -> list[MageBlockRun]:
        """``GET /api/block_runs?pipeline_run_id=``: the run's block runs, every page read, by ``id``."""
        items = self._pages("/api/block_runs", "block_runs", f"block runs of pipeline run {run_id}",
                            {"pipeline_run_id": int(run_id)}, page_size, 100_000)
        return sorted((MageBlockRun.model_validate(i) for i in items), key=lambda b: b.id)

    def run_logs(self, run: MageRun) -> MageLogSummary:
        """``GET /api/pipelines/{uuid}/logs?pipeline_run_id[]=``: the run's log files, summarised.

        Mage adds the logs of blocks run from its editor to that answer; only files in the run's own
        log folder (``.logs/<execution_partition>/``) are kept when the run names its partition.
        """
        what = f"logs of pipeline run {run.id} of {run.pipeline_uuid!r}"
        data = self.request("GET", f"/api/pipelines/{run.pipeline_uuid}/logs", what=what,
                            params={"pipeline_run_id[]": str(run.id)})
        files: list[MageLogFile] = []
        for group in data.get("logs") or []:
            if not isinstance(group, dict):
                continue
            for f in [*(group.get("block_run_logs") or []), *(group.get("pipeline_run_logs") or [])]:
                if not isinstance(f, dict):
                    continue
                if run.execution_partition and f"/{run.execution_partition}/" not in str(f.get("path", "")):
                    continue
                files.append(summarize_log(str(f.get("name") or "?"), str(f.get("content") or "")))
        return MageLogSummary(pipeline_uuid=run.pipeline_uuid, run_id=run.id, files=tuple(files))

    def triggers(self, pipeline_uuid: str) -> list[MageTrigger]:
        """``GET /api/pipelines/{uuid}/pipeline_schedules``: the pipeline's triggers, newest first."""
        data = self.request("GET", f"/api/pipelines/{pipeline_uuid}/pipeline_schedules",
                            what=f"triggers of pipeline {pipeline_uuid!r}")
        return [MageTrigger.model_validate(s) for s in data.get("pipeline_schedules") or [] if isinstance(s, dict)]

    def find_trigger(self, pipeline_uuid: str, *, name: str | None = None,
                     schedule_type: str | None = None) -> MageTrigger | None:
        """The pipeline's first trigger with this ``name`` and/or ``schedule_type`` (api, time, event), or None."""
        for t in self.triggers(pipeline_uuid):
            if (name is None or t.name == name) and (schedule_type is None or t.schedule_type == schedule_type):
                return t
        return None

    # -- links ---------------------------------------------------------------------------------
    def pipeline_url(self, pipeline_uuid: str) -> str:
        """The pipeline's triggers page in Mage's UI (``/pipelines/<uuid>/triggers``)."""
        return f"{self.ui_url}/pipelines/{pipeline_uuid}/triggers"

    def run_url(self, run: MageRun) -> str:
        """The run's page in Mage's UI (``/pipelines/<uuid>/runs/<id>``)."""
        return f"{self.ui_url}/pipelines/{run.pipeline_uuid}/runs/{run.id}"


@public
class MageResource(dg.ConfigurableResource):
    """Read access to a Mage OSS instance for sensors and ops.

    Settings, first match wins: the field (pass ``dg.EnvVar`` for secrets), then the environment
    variable: ``url`` / ``$MAGE_URL``, ``api_key`` / ``$MAGE_API_KEY`` (default Mage OSS's public
    key), ``email`` / ``$MAGE_EMAIL`` and ``password`` / ``$MAGE_PASSWORD`` (both, or neither for an
    instance without user authentication).

    Attributes:
        url: the server's base URL, e.g. ``http://mage.internal:6789``.
        api_key: the API key.
        email: a Mage user (a Viewer is enough: dw_dagster only reads).
        password: that user's password.
        ui_url: base URL for links into Mage's UI (default: ``url``).
        timeout_s: per-request timeout (seconds).
        attempts: tries per request on 429/5xx/timeouts.
        base_wait_s: first back-off (seconds; doubles, jittered).
    """

    url: str | None = Field(default=None, description="Mage server URL, e.g. http://mage.internal:6789.")
    api_key: str | None = Field(default=None, description="Mage API key (default: Mage OSS's public key).")
    email: str | None = Field(default=None, description="Mage user's email (user authentication on).")
    password: str | None = Field(default=None, description="Mage user's password (use dg.EnvVar).")
    ui_url: str | None = Field(default=None, description="Base URL of Mage's UI for links.")
    timeout_s: float = Field(default=10.0, description="Per-request timeout, seconds.")
    attempts: int = Field(default=4, description="Tries per request on 429, 5xx and timeouts.")
    base_wait_s: float = Field(default=0.5, description="First back-off wait, seconds (doubles, jittered).")

    _client: MageClient | None = PrivateAttr(default=None)

    def get_client(self) -> MageClient:
        """A client for the configured instance (one per resource instance, reused).

        Raises:
            MageError: no URL configured, or only one of email and password.
        """
        if self._client is None:
            url = self.url or os.environ.get(URL_ENV)
            if not url:
                raise MageError(f"no Mage URL: set MageResource.url or ${URL_ENV}")
            self._client = MageClient(
                url, api_key=self.api_key or os.environ.get(API_KEY_ENV), email=self.email or os.environ.get(EMAIL_ENV),
                password=self.password or os.environ.get(PASSWORD_ENV), ui_url=self.ui_url,
                policy=RetryPolicy(attempts=self.attempts, timeout_s=self.timeout_s, base_wait_s=self.base_wait_s))
        return self._client


__all__ = ["BLOCK_RUN_STATUSES", "DEFAULT_API_KEY", "RUN_FINISHED", "RUN_PROBLEMS", "RUN_STATUSES", "MageApiError",
           "MageBlock", "MageBlockRun", "MageClient", "MageError", "MageLogFile", "MageLogSummary", "MagePipeline",
           "MageResource", "MageRun", "MageStatus", "MageTrigger", "summarize_log"]
