"""Lightup's REST API over httpx: credentials, incidents, compare metrics, datapoints, comments, triggers.

Endpoints, shapes and the token flow follow ``shared/reference/lightup_api.md`` (Lightup's
published OpenAPI document, the official ``lightctl`` client and ``lightscript``):

- credentials: the ``lightup-api-credential.json`` file downloaded from Lightup (``data.server``,
  ``data.refresh``, ``data.expiredTs``) or the variables ``LIGHTUP_SERVER`` / ``LIGHTUP_REFRESH_TOKEN``;
- ``POST /api/v1/token/refresh/`` exchanges the refresh token for an access token; it is refreshed
  30 s before the JWT's ``exp`` and once more, then the request retried, on a
  ``401 {"code": "token_not_valid"}`` (lightctl's rule);
- 429 and 5xx are retried with jittered exponential back-off (:mod:`dw_dagster.core.http`), except
  for a comment: ``POST .../comments`` adds one each time, so it is never re-sent blindly after a
  timeout or a 5xx; with an idempotency ``ref`` its text ends in a marker line and the incident's
  comments (``GET .../comments``, OAS "Incident comments": ``{"comments": [...]}``) are read first
  and after such a failure, so the comment is added at most once per ``ref``;
- lists are accepted bare or wrapped in ``{"data": [...]}`` (the monitors list is bare in the
  OpenAPI document and wrapped in lightctl's reading of it).

An incident reaches its table pair only through its monitor: ``incident.filter_uuid`` → monitor →
``config.metrics[0]`` → a metric with ``configType == "aggregationCompareMetricConfig"`` →
``sourceTable`` / ``targetTable`` and ``compares[{sourceMetricUuid, targetMetricUuid}]``. The gap
is computed here from the source and target metrics' datapoints for the incident's slice and
window, never from the compare metric's own value (Lightup does not publish how that is computed).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
from pydantic import Field, PrivateAttr

from dw_dagster.core.http import (
    HttpApiError,
    RetryPolicy,
    has_marker,
    json_body,
    post_once,
    send,
    unwrap_list,
    with_marker,
)
from dw_dagster.errors import DwDagsterError
from dw_dagster.dagster_private import public

SERVICE = "lightup"
CREDENTIAL_FILE_ENV = "LIGHTUP_CREDENTIAL_FILE"
SERVER_ENV = "LIGHTUP_SERVER"
REFRESH_TOKEN_ENV = "LIGHTUP_REFRESH_TOKEN"
WORKSPACE_ENV = "LIGHTUP_WORKSPACE"
COMPARE_CONFIG = "aggregationCompareMetricConfig"

#: Incident triage statuses (OpenAPI ``status`` enum).
STATUS = {1: "UNVIEWED", 2: "VIEWED", 3: "REJECTED", 4: "SUBMITTED", 5: "CLOSED"}


class LightupError(DwDagsterError, RuntimeError):
    """A Lightup answer dw_dagster cannot use (malformed incident, unmapped table, missing metric)."""


class LightupCredentialError(LightupError):
    """The credential file or variables are missing, malformed or expired."""


@dataclass(frozen=True)
class LightupCredential:
    """What dw_dagster reads from a Lightup API credential.

    Attributes:
        server: cluster base URL, e.g. ``https://app.acme.lightup.ai``.
        refresh: the refresh token (a JWT).
        expired_ts: refresh-token expiry, epoch seconds (None when unknown).
    """

    server: str
    refresh: str
    expired_ts: float | None = None


def read_credential_file(path: str | Path) -> LightupCredential:
    """Read ``lightup-api-credential.json`` (``{"apiVersion": "v1", "type": "apiCredential", "data": {...}}``).

    Raises:
        LightupCredentialError: no file, not JSON, no ``data.server`` / ``data.refresh``, or
            ``data.expiredTs`` in the past (Lightup's advice: download a new credential file).
            The message never contains the token.
    """
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise LightupCredentialError(f"Lightup credential file {p} does not exist") from None
    except (OSError, ValueError) as e:
        raise LightupCredentialError(f"Lightup credential file {p} is not readable JSON: {type(e).__name__}") from None
    data = raw.get("data") if isinstance(raw, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("server"), str) or not isinstance(data.get("refresh"), str):
        raise LightupCredentialError(f"Lightup credential file {p} has no data.server and data.refresh "
                                     "(expected the apiCredential file downloaded from Lightup)")
    exp = data.get("expiredTs")
    if isinstance(exp, (int, float)) and exp < time.time():
        when = dt.datetime.fromtimestamp(exp, dt.timezone.utc).isoformat()
        raise LightupCredentialError(f"Lightup credential file {p}: the refresh token expired at {when}; "
                                     "download a new credential from Lightup (Profile → API Credentials)")
    return LightupCredential(server=data["server"].rstrip("/"), refresh=data["refresh"],
                             expired_ts=float(exp) if isinstance(exp, (int, float)) else None)


def _jwt_refresh_at(token: str) -> float | None:
    """When to refresh an access token: 30 s before its ``exp`` claim (or 10 % of its lifetime when
    that is shorter). The JWT is read without verifying it; only the timing depends on it."""
    try:
        body = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        exp = float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None
    iat = claims.get("iat")
    margin = min(30.0, 0.1 * (exp - float(iat))) if isinstance(iat, (int, float)) else 30.0
    return exp - margin


@dataclass(frozen=True)
class LightupTable:
    """One side of a compare metric: the Lightup datasource and the table."""

    source_uuid: str
    source_name: str | None
    schema: str | None
    table: str

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    def keys(self) -> list[str]:
        """Mapping keys this table answers to, most specific first."""
        out = [f"{self.source_uuid}:{self.name}"]
        if self.source_name:
            out.append(f"{self.source_name}:{self.name}")
        return out


@dataclass(frozen=True)
class CompareContext:
    """An incident resolved to its compare metric and table pair."""

    incident_uuid: str
    monitor_uuid: str
    metric_uuid: str
    metric_name: str
    source: LightupTable
    target: LightupTable
    pairs: tuple[tuple[str, str, str], ...]  # (source metric, target metric, aggregation type)


@dataclass(frozen=True)
class CompareGap:
    """Source vs target values of one metric pair over an incident's slice and window.

    ``gap`` = source − target (rows for ``rowCount``, the column's unit for ``sum``);
    ``gap_pct`` = gap / source × 100 (0.0 when both are 0).
    """

    aggregation: str
    slice: dict[str, Any]
    start_ts: float
    end_ts: float
    source_value: float
    target_value: float
    datapoints: int

    @property
    def gap(self) -> float:
        return self.source_value - self.target_value

    @property
    def gap_pct(self) -> float:
        if self.source_value == 0:
            return 0.0 if self.target_value == 0 else -100.0
        return self.gap / self.source_value * 100.0


REQUIRED_INCIDENT_FIELDS = {"uuid": str, "updated_ts": (int, float), "filter_uuid": str,
                            "start_ts": (int, float), "end_ts": (int, float)}


def validate_incident(inc: Any) -> dict[str, Any]:
    """Check an incident object has what dw_dagster needs (OpenAPI ``Incident`` fields).

    Raises:
        LightupError: naming the missing or mistyped fields.
    """
    if not isinstance(inc, dict):
        raise LightupError(f"incident is not an object: {str(inc)[:100]}")
    bad = [k for k, t in REQUIRED_INCIDENT_FIELDS.items() if not isinstance(inc.get(k), t) or isinstance(inc.get(k), bool)]
    if "slice" in inc and inc["slice"] is not None and not isinstance(inc["slice"], dict):
        bad.append("slice")
    if bad:
        raise LightupError(f"malformed incident {str(inc.get('uuid'))[:60]!r}: missing or mistyped {', '.join(bad)}")
    return inc


@public
class LightupClient:
    """A Lightup API session for one workspace.

    Args:
        credential: server and refresh token.
        workspace: workspace UUID, or a workspace name (resolved with ``GET /api/v1/workspaces/?name=``),
            or None for the only/first workspace the token sees.
        policy: retries and timeouts.
        transport: an httpx transport (tests may pass one; the default is real HTTP).

    Raises:
        HttpApiError: on API failures (names the endpoint and status, never the token).
    """

    def __init__(self, credential: LightupCredential, workspace: str | None = None, policy: RetryPolicy = RetryPolicy(),
                 transport: httpx.BaseTransport | None = None) -> None:
        self.credential = credential
        self.policy = policy
        self._http = httpx.Client(base_url=credential.server, transport=transport,
                                  headers={"Accept": "application/json", "User-Agent": "dw-dagster"})
        self._access: str | None = None
        self._refresh_at: float | None = None
        self._workspace_arg = workspace
        self._workspace: str | None = None
        self.refreshes = 0

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LightupClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------
    def _refresh(self) -> None:
        r = send(self._http, SERVICE, "POST", "/api/v1/token/refresh/", policy=self.policy,
                 json={"refresh": self.credential.refresh})
        body = json_body(r, SERVICE, "POST")
        if not isinstance(body, dict) or not isinstance(body.get("access"), str):
            raise HttpApiError(SERVICE, "POST", "/api/v1/token/refresh/", r.status_code, "response has no access token")
        self._access = body["access"]
        self._refresh_at = _jwt_refresh_at(self._access)
        self.refreshes += 1

    def _token(self) -> str:
        if self._access is None or (self._refresh_at is not None and self._refresh_at < time.time()):
            self._refresh()
        assert self._access is not None
        return self._access

    def request(self, method: str, path: str, *, idempotent: bool = True, **kwargs: Any) -> Any:
        """One authenticated call; returns the decoded JSON (None for 204).

        Args:
            method: HTTP method.
            path: the API path.
            idempotent: False for a call that adds something each time (a comment): see
                :func:`dw_dagster.core.http.send`.
            **kwargs: passed to httpx (``params``, ``json``...).

        Raises:
            HttpApiError: non-retryable status, retries exhausted, or malformed JSON.
        """
        for attempt in (1, 2):
            headers = {**kwargs.pop("headers", {}), "Authorization": f"Bearer {self._token()}"}
            try:
                r = send(self._http, SERVICE, method, path, policy=self.policy, headers=headers,
                         idempotent=idempotent, **kwargs)
            except HttpApiError as e:
                if e.status == 401 and "token_not_valid" in e.detail and attempt == 1:
                    self._access = None  # lightctl: refresh once and retry
                    continue
                raise
            if r.status_code == 204 or not r.content:
                return None
            return json_body(r, SERVICE, method)
        raise AssertionError("unreachable")

    def _list(self, path: str, **params: Any) -> list:
        """A list answer, whole: an answer that says it holds only part of the list (``metadata.total``
        larger than the items sent, or a ``next`` link) is refused, never returned as the whole.

        Raises:
            HttpApiError: not a list, or a partial one (the counts in the message).
        """
        body = self.request("GET", path, params={k: v for k, v in params.items() if v is not None})
        try:
            items = unwrap_list(body)
        except ValueError as e:
            raise HttpApiError(SERVICE, "GET", path, 200, str(e)) from None
        if isinstance(body, Mapping):
            meta = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
            total = meta.get("total", body.get("total"))
            more = body.get("next") or meta.get("next")
            if isinstance(total, int) and not isinstance(total, bool) and total > len(items) or more:
                said = f"{len(items)} of {total} items (metadata.total)" if isinstance(total, int) else \
                    f"{len(items)} items and a next page ({str(more)[:80]})"
                raise HttpApiError(SERVICE, "GET", path, 200,
                                   f"the answer holds only {said}; dw_dagster does not page this list and will not "
                                   "take part of it for the whole (narrow the query's time range)")
        return items

    @property
    def workspace(self) -> str:
        """The workspace UUID (resolved on first use)."""
        if self._workspace is None:
            arg = self._workspace_arg
            items = self._list("/api/v1/workspaces/")
            match = [w for w in items if isinstance(w, dict) and arg in (w.get("uuid"), w.get("name"))] if arg else items
            if not match:
                names = ", ".join(str(w.get("name")) for w in items if isinstance(w, dict))
                raise LightupError(f"Lightup workspace {arg!r} not found (visible: {names or 'none'})")
            self._workspace = str(match[0]["uuid"])
        return self._workspace

    # -- resources -----------------------------------------------------------------------------
    def list_incidents(self, *, start_updated_ts: float | None = None, end_updated_ts: float | None = None,
                       start_ts: float | None = None, end_ts: float | None = None,
                       metric_uuids: Sequence[str] | None = None, monitor_uuids: Sequence[str] | None = None,
                       status_list: Sequence[int] | None = None) -> list:
        """``GET /api/v0/ws/{ws}/incidents/``; raw incident objects (snake_case), unvalidated.

        ``start_updated_ts``/``end_updated_ts`` filter on the last update (epoch seconds, inclusive);
        ``start_ts``/``end_ts`` on overlap with the incident's interval.
        """
        params: dict[str, Any] = {"start_updated_ts": start_updated_ts, "end_updated_ts": end_updated_ts,
                                  "start_ts": start_ts, "end_ts": end_ts}
        if metric_uuids:
            params["metric_uuids"] = ",".join(metric_uuids)
        if monitor_uuids:
            params["monitor_uuids"] = ",".join(monitor_uuids)
        if status_list:
            params["status_list"] = ",".join(str(s) for s in status_list)
        return self._list(f"/api/v0/ws/{self.workspace}/incidents/", **params)

    def get_incident(self, uuid: str) -> dict:
        return self.request("GET", f"/api/v0/ws/{self.workspace}/incidents/{uuid}")

    def set_incident_status(self, uuid: str, status: int) -> None:
        """``PATCH`` the triage status (1 UNVIEWED … 5 CLOSED; lightctl's call)."""
        if status not in STATUS:
            raise ValueError(f"Lightup incident status must be one of {sorted(STATUS)}, got {status}")
        self.request("PATCH", f"/api/v0/ws/{self.workspace}/incidents/{uuid}", json={"status": status})

    def add_comment(self, uuid: str, text: str, *, ref: str | None = None, check_first: bool = True) -> dict:
        """``POST .../incidents/{uuid}/comments`` with ``{"comment": text}``; returns the comment.

        Not idempotent (each POST adds a comment), so never re-sent blindly after a timeout or a
        5xx. With ``ref`` the text ends in the marker line ``[dw-dagster ref <ref>]`` and the
        comment is added at most once per ``ref``: :meth:`find_comment` runs first
        (``check_first``; the same token reads the comments) and after a failure that may have
        been applied (Lightup publishes no comment length limit; the marker adds under 60
        characters).

        Args:
            uuid: the Lightup incident uuid.
            text: the comment.
            ref: idempotency marker ``dw:<task>:<step>``, or None.
            check_first: look for ``ref`` before the first POST.

        Returns:
            The new comment (201 body), or the one already carrying ``ref``.

        Raises:
            HttpApiError: 400/404, retries exhausted on 429, or (``maybe_applied``) a failure after
                which the comment may have been added and the marker was not found.
        """
        path = f"/api/v0/ws/{self.workspace}/incidents/{uuid}/comments"
        body = {"comment": with_marker(text, ref)}
        find = (lambda: self.find_comment(uuid, ref)) if ref else None
        comment, _ = post_once(lambda: self.request("POST", path, idempotent=False, json=body), find,
                               policy=self.policy, check_first=check_first)
        return comment

    def comments(self, uuid: str) -> list:
        """``GET .../incidents/{uuid}/comments``: the incident's comments (``{"comments": [...]}`` unwrapped)."""
        body = self.request("GET", f"/api/v0/ws/{self.workspace}/incidents/{uuid}/comments")
        return unwrap_list(body, keys=("comments", "data"))

    def find_comment(self, uuid: str, ref: str) -> dict | None:
        """The incident's comment whose text carries the marker line for ``ref``, or None."""
        return next((c for c in self.comments(uuid) if isinstance(c, dict) and has_marker(c.get("comment"), ref)), None)

    def get_monitor(self, uuid: str) -> dict:
        return self.request("GET", f"/api/v1/ws/{self.workspace}/monitors/{uuid}")

    def list_monitors(self, metric_uuids: Sequence[str] | None = None) -> list:
        return self._list(f"/api/v1/ws/{self.workspace}/monitors/",
                          metric_uuids=",".join(metric_uuids) if metric_uuids else None)

    def get_integration(self, uuid: str) -> dict:
        """``GET /api/v1/ws/{ws}/integrations/{uuid}``: one alert channel (``type``: email, slack, msteams,
        pagerduty, jira, servicenow, opsgenie; its ``config``)."""
        return self.request("GET", f"/api/v1/ws/{self.workspace}/integrations/{uuid}")

    def alerting_integrations(self, incident_uuid: str) -> list[dict]:
        """The alert channels the incident's monitor routes to (``monitor.config.alertConfig.channels[].channelId``
        → integrations), in the monitor's order; a channel that no longer exists is left out."""
        from dw_dagster.core.http import HttpApiError

        raw = self.get_incident(incident_uuid)
        monitor_uuid = raw.get("filter_uuid") or raw.get("monitor_uuid")
        if not monitor_uuid:
            return []
        monitor = self.get_monitor(str(monitor_uuid))
        channels = ((monitor.get("config") or {}).get("alertConfig") or {}).get("channels") or []
        out = []
        for ch in channels:
            cid = ch.get("channelId") if isinstance(ch, dict) else None
            if not cid:
                continue
            try:
                out.append(self.get_integration(str(cid)))
            except HttpApiError as e:
                if e.status != 404:
                    raise
        return out

    def get_metric(self, uuid: str) -> dict:
        return self.request("GET", f"/api/v1/ws/{self.workspace}/metrics/{uuid}")

    def get_source(self, uuid: str) -> dict:
        return self.request("GET", f"/api/v1/ws/{self.workspace}/sources/{uuid}")

    def datapoints(self, metric_uuid: str, start_ts: float, end_ts: float, slice: Mapping[str, Any] | None = None) -> list:
        """``GET .../metrics/{uuid}/datapoints``: ``[{eventTs, recordedTs, slice, value, metricUuid}]``.

        The slice goes as a JSON object in the query string and is also filtered here (equality),
        since the OpenAPI document types it only as "object".
        """
        params: dict[str, Any] = {"start_ts": start_ts, "end_ts": end_ts}
        if slice is not None:
            params["slice"] = json.dumps(dict(slice), sort_keys=True)
        points = self._list(f"/api/v1/ws/{self.workspace}/metrics/{metric_uuid}/datapoints", **params)
        want = dict(slice) if slice is not None else None
        return [p for p in points if isinstance(p, dict) and (want is None or p.get("slice") == want)]

    def trigger(self, source_uuid: str, metric_uuids: Sequence[str], user_defined_id: str | None = None) -> dict:
        """``POST .../sources/{uuid}/trigger``: collect ``metric_uuids`` now; returns the trigger record."""
        body: dict[str, Any] = {"metricUuids": list(metric_uuids)}
        if user_defined_id:
            body["userDefinedId"] = user_defined_id
        return self.request("POST", f"/api/v1/ws/{self.workspace}/sources/{source_uuid}/trigger", json=body)

    def trigger_status(self, source_uuid: str, trigger_uuid: str) -> dict:
        return self.request("GET", f"/api/v1/ws/{self.workspace}/sources/{source_uuid}/trigger",
                            params={"triggerUuid": trigger_uuid})

    def wait_for_trigger(self, source_uuid: str, trigger_uuid: str, timeout_s: float = 300.0, poll_s: float = 2.0) -> dict:
        """Poll a trigger until ``triggerStatus.status == "completed"`` (the Airflow provider's rule).

        Raises:
            TimeoutError: not completed within ``timeout_s`` seconds (paused or pending).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            t = self.trigger_status(source_uuid, trigger_uuid)
            if (t.get("triggerStatus") or {}).get("status") == "completed":
                return t
            if time.monotonic() > deadline:
                raise TimeoutError(f"Lightup trigger {trigger_uuid} not completed after {timeout_s:.0f} s: "
                                   f"{(t.get('triggerStatus') or {}).get('status')}")
            time.sleep(poll_s)

    # -- reasoning over the API -----------------------------------------------------------------
    def _table(self, side: Mapping[str, Any], sources: dict[str, str | None]) -> LightupTable:
        src = str(side.get("sourceUuid"))
        if src not in sources:
            try:
                sources[src] = (self.get_source(src).get("metadata") or {}).get("name")
            except HttpApiError as e:
                if e.status != 404:
                    raise
                sources[src] = None
        t = side.get("table") or {}
        if not t.get("tableName"):
            raise LightupError(f"compare metric side {src} names no table (type {t.get('type')!r} is not supported)")
        return LightupTable(src, sources[src], t.get("schemaName"), t["tableName"])

    def compare_context(self, incident: Mapping[str, Any]) -> CompareContext:
        """Resolve an incident to its compare metric, table pair and metric pairs.

        Raises:
            LightupError: the incident's monitor watches a metric that is not a compare metric, or
                the metric has no usable pair.
            HttpApiError: API failures.
        """
        inc = validate_incident(dict(incident))
        monitor = self.get_monitor(inc["filter_uuid"])
        metrics = (monitor.get("config") or {}).get("metrics") or []
        if not metrics:
            raise LightupError(f"monitor {inc['filter_uuid']} of incident {inc['uuid']} watches no metric")
        metric = self.get_metric(metrics[0])
        cfg = metric.get("config") or {}
        name = (metric.get("metadata") or {}).get("name") or metrics[0]
        if cfg.get("configType") != COMPARE_CONFIG:
            raise LightupError(f"incident {inc['uuid']}: metric {name!r} is a {cfg.get('configType')}, "
                               f"not a compare metric ({COMPARE_CONFIG})")
        sources: dict[str, str | None] = {}
        pairs = []
        for p in cfg.get("compares") or []:
            s, t = p.get("sourceMetricUuid"), p.get("targetMetricUuid")
            if not s or not t:
                continue
            agg = ((self.get_metric(s).get("config") or {}).get("aggregation") or {}).get("type", "unknown")
            pairs.append((s, t, agg))
        if not pairs:
            raise LightupError(f"compare metric {name!r} has no source/target metric pair")
        return CompareContext(incident_uuid=inc["uuid"], monitor_uuid=inc["filter_uuid"], metric_uuid=metrics[0],
                              metric_name=name, source=self._table(cfg.get("sourceTable") or {}, sources),
                              target=self._table(cfg.get("targetTable") or {}, sources), pairs=tuple(pairs))

    def compare_gaps(self, ctx: CompareContext, slice: Mapping[str, Any] | None, start_ts: float, end_ts: float) -> list[CompareGap]:
        """Per metric pair, source and target values summed over [start_ts, end_ts) for ``slice``."""
        out = []
        for s_uuid, t_uuid, agg in ctx.pairs:
            sp = self.datapoints(s_uuid, start_ts, end_ts, slice)
            tp = self.datapoints(t_uuid, start_ts, end_ts, slice)
            out.append(CompareGap(aggregation=agg, slice=dict(slice or {}), start_ts=start_ts, end_ts=end_ts,
                                  source_value=float(sum(Decimal(str(p.get("value") or 0)) for p in sp)),
                                  target_value=float(sum(Decimal(str(p.get("value") or 0)) for p in tp)),
                                  datapoints=len(sp) + len(tp)))
        return out

    def recheck(self, ctx: CompareContext, slice: Mapping[str, Any] | None, start_ts: float, end_ts: float,
                user_defined_id: str | None = None, timeout_s: float = 300.0) -> list[CompareGap]:
        """After a repair: trigger collection of both sides' metrics and the compare metric, wait
        for it, and re-read the gaps (the caller checks they are 0).

        Raises:
            TimeoutError: the trigger did not complete.
            HttpApiError: API failures.
        """
        by_source: dict[str, list[str]] = {}
        for s_uuid, t_uuid, _ in ctx.pairs:
            by_source.setdefault(ctx.source.source_uuid, []).append(s_uuid)
            by_source.setdefault(ctx.target.source_uuid, []).append(t_uuid)
        by_source.setdefault(ctx.target.source_uuid, []).append(ctx.metric_uuid)
        for src, mids in by_source.items():
            t = self.trigger(src, list(dict.fromkeys(mids)), user_defined_id)
            self.wait_for_trigger(src, t["triggerUuid"], timeout_s=timeout_s)
        return self.compare_gaps(ctx, slice, start_ts, end_ts)


@public
class LightupResource(dg.ConfigurableResource):
    """Lightup API access for sensors and ops.

    Credentials, first match wins: ``server`` + ``refresh_token`` (pass ``dg.EnvVar``), the
    ``credential_file`` (``lightup-api-credential.json``), then the environment variables
    ``LIGHTUP_SERVER`` + ``LIGHTUP_REFRESH_TOKEN``, then ``LIGHTUP_CREDENTIAL_FILE``.

    Attributes:
        credential_file: path of the credential file downloaded from Lightup.
        server: cluster base URL.
        refresh_token: the refresh token.
        workspace: workspace UUID or name (default: ``$LIGHTUP_WORKSPACE``, else the first one).
        timeout_s: per-request timeout (seconds).
        attempts: tries per request on 429/5xx/timeouts.
        ui_url: base URL for links to incidents in Lightup's UI (default: the server).
    """

    credential_file: str | None = Field(default=None, description="Path of lightup-api-credential.json.")
    server: str | None = Field(default=None, description="Lightup cluster URL, e.g. https://app.acme.lightup.ai.")
    refresh_token: str | None = Field(default=None, description="Lightup refresh token (use dg.EnvVar).")
    workspace: str | None = Field(default=None, description="Workspace UUID or name.")
    timeout_s: float = Field(default=10.0, description="Per-request timeout, seconds.")
    attempts: int = Field(default=4, description="Tries per request on 429, 5xx and timeouts.")
    base_wait_s: float = Field(default=0.5, description="First back-off wait, seconds (doubles, jittered).")
    ui_url: str | None = Field(default=None, description="Base URL of Lightup's UI for incident links.")

    _client: LightupClient | None = PrivateAttr(default=None)

    def credential(self) -> LightupCredential:
        """The credential this resource resolves to.

        Raises:
            LightupCredentialError: nothing configured, or the file is missing/malformed/expired.
        """
        if self.server and self.refresh_token:
            return LightupCredential(self.server.rstrip("/"), self.refresh_token)
        if self.credential_file:
            return read_credential_file(self.credential_file)
        if os.environ.get(SERVER_ENV) and os.environ.get(REFRESH_TOKEN_ENV):
            return LightupCredential(os.environ[SERVER_ENV].rstrip("/"), os.environ[REFRESH_TOKEN_ENV])
        if os.environ.get(CREDENTIAL_FILE_ENV):
            return read_credential_file(os.environ[CREDENTIAL_FILE_ENV])
        raise LightupCredentialError(
            f"no Lightup credential: set credential_file, or server + refresh_token, or ${CREDENTIAL_FILE_ENV}, "
            f"or ${SERVER_ENV} + ${REFRESH_TOKEN_ENV}")

    def get_client(self) -> LightupClient:
        """A client for the configured workspace (one per resource instance, reused)."""
        if self._client is None:
            self._client = LightupClient(
                self.credential(), self.workspace or os.environ.get(WORKSPACE_ENV),
                RetryPolicy(attempts=self.attempts, timeout_s=self.timeout_s, base_wait_s=self.base_wait_s))
        return self._client

    def incident_url(self, incident_uuid: str) -> str:
        """A link to the incident in Lightup's UI (``/#/ws/<ws>/incidents/<uuid>``)."""
        client = self.get_client()
        base = (self.ui_url or client.credential.server).rstrip("/")
        return f"{base}/#/ws/{client.workspace}/incidents/{incident_uuid}"
