"""A protocol-accurate fake of Lightup's REST API, on loopback, for the tests and the demo.

Shapes follow ``shared/reference/lightup_api.md`` (Lightup's published OpenAPI document
"Lightup Dashboard API", the ``lightctl`` client and ``lightscript``):

- ``POST /api/v1/token/refresh/`` ``{"refresh"}`` → ``{"access"}``; access tokens are HS256 JWTs
  with an ``exp`` claim (TTL configurable); an expired or unknown token gets
  ``401 {"detail", "code": "token_not_valid", "messages"}`` as Django REST framework
  simplejwt answers;
- ``GET /api/v1/workspaces/`` wrapped in ``data``; ``GET /api/v0/ws/{ws}/incidents/`` with the
  ``start_ts``/``end_ts`` (overlap), ``start_updated_ts``/``end_updated_ts``, ``status_list``,
  ``metric_uuids``, ``monitor_uuids`` filters, wrapped in ``data`` with ``metadata{total,unread,accepted}``;
  ``GET``/``PATCH /api/v0/ws/{ws}/incidents/{uuid}``; ``GET``/``POST .../comments`` (OAS
  "Incident comments": GET ``{"comments": [{"id", "comment", "createdTs", "ownedBy"}]}`` oldest
  first, POST ``{"comment"}`` → 201 with the comment; Lightup has no other comment search, so a
  client looks for its own comment by reading this list);
- ``GET /api/v1/ws/{ws}/metrics/`` (bare list), ``/metrics/{uuid}``, ``/metrics/{uuid}/datapoints``
  (bare list of ``{eventTs, recordedTs, slice, value, metricUuid}``; ``slice`` as a JSON object in
  the query string); ``/monitors/`` (bare list, or wrapped in ``data`` as lightctl reads it: a
  switch), ``/monitors/{uuid}``, ``/monitors/{uuid}/slices``; ``/sources/``, ``/sources/{uuid}``,
  ``POST``/``GET /sources/{uuid}/trigger``; ``GET /api/v1/ws/{ws}/integrations/`` and
  ``/integrations/{uuid}`` (alert channels: ``{uuid, name, type, config}``, secrets left out; a monitor
  routes to them by ``config.alertConfig.channels[].channelId``); ``GET /api/v0/healthz/``.

Incident objects are snake_case with integer ``status`` and ``direction``; metric, monitor and
source objects camelCase; timestamps epoch seconds. Unknown workspace → 403.

What the fake adds, marked as such: a source's ``config.connection`` may be
``{"type": "dwUrl", "url": "duckdb:///..."}``; the fake then *collects* its metrics for real
(row count or sum per day and slice, pushed down as SQL through :mod:`dw_dagster.databases`),
computes each compare metric's value as (source − target) / source × 100 % per day and slice
(Lightup does not publish how it computes it), and runs manual-threshold monitors over those
values, opening one incident per (monitor, slice, run of anomalous days), extending it, or
closing it (``ongoing`` false) when the values come back inside the bound. Collection runs on
``POST .../trigger`` and on ``POST /_fake/collect`` (standing in for the schedule).

Test controls under ``/_fake/``: ``faults`` (expire tokens, N responses with status 429/500 on a
``path`` regex and optional ``method``,
slow responses, malformed JSON, wrapper shapes, and ``{"after_apply": true, "delay_s": 2 |
"status": 500, "count": 1, "path": <regex>, "method": "POST"}``: the request is handled, its
effect stays, and only the answer is delayed or replaced, e.g. a comment that lands while the
client times out), ``incidents`` (inject raw incidents, including malformed ones), ``state``,
``collect``.

Run on its own: ``dw-dagster fake-lightup --port 8765 --credential-file cred.json`` (or
``python -m dw_dagster_dev.fakes.lightup_server``).
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
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

DAY = 86400


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_jwt(claims: dict[str, Any], key: bytes) -> str:
    """An HS256 JWT (header.payload.signature), the token format Lightup's simplejwt backend issues."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    sig = _b64(hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


def _verify_jwt(token: str, key: bytes) -> dict[str, Any] | None:
    try:
        head, body, sig = token.split(".")
        want = _b64(hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(want, sig):
            return None
        return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, json.JSONDecodeError):
        return None


@dataclass
class Faults:
    """Switchable faults; counts go down by one per affected response."""

    expire_tokens: bool = False
    status: int | None = None
    status_count: int = 0
    status_path: str | None = None
    status_method: str | None = None
    delay_s: float = 0.0
    delay_count: int = 0
    malformed_count: int = 0
    malformed_path: str | None = None
    wrap_monitors: bool = False
    wrap_lists: bool = False
    outage: bool = False
    # applied after the handler ran (its effect stays): delay and/or replace the answer
    after_count: int = 0
    after_status: int | None = None
    after_delay_s: float = 0.0
    after_path: str | None = None
    after_method: str | None = None


@dataclass
class FakeLightup:
    """The fake's whole state. Mutations hold :attr:`lock`."""

    workspace_uuid: str = field(default_factory=lambda: str(uuidlib.uuid4()))
    workspace_name: str = "store-sales"
    refresh_token: str = ""
    access_ttl_s: float = 300.0
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    sources: dict[str, dict] = field(default_factory=dict)
    metrics: dict[str, dict] = field(default_factory=dict)
    monitors: dict[str, dict] = field(default_factory=dict)
    incidents: dict[str, dict] = field(default_factory=dict)
    #: test control: raw incident objects the list answer carries besides the stored ones (an exact
    #: duplicate, or an older version of a stored incident, as a lagging replica answers); filters apply
    listed_extra: list[dict] = field(default_factory=list)
    comments: dict[str, list[dict]] = field(default_factory=dict)
    datapoints: dict[str, list[dict]] = field(default_factory=dict)
    triggers: dict[str, dict] = field(default_factory=dict)
    #: alert channels (``/api/v1/ws/{ws}/integrations/``); a monitor routes to them by ``alertConfig.channels``
    integrations: dict[str, dict] = field(default_factory=dict)
    #: what the alert channels did: ``{"integration", "incident", "status", "answer"}`` per ticket opened
    alerts_sent: list[dict] = field(default_factory=list)
    collect_start_ts: float | None = None
    collect_end_ts: float | None = None
    faults: Faults = field(default_factory=Faults)
    revoked_before: float = 0.0
    requests: list[str] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        if not self.refresh_token:
            self.refresh_token = make_jwt({"token_type": "refresh", "exp": int(time.time()) + 365 * DAY,
                                           "jti": secrets.token_hex(8)}, self.key)

    # -- credentials -------------------------------------------------------------------------
    def credential(self, server: str) -> dict[str, Any]:
        """The ``lightup-api-credential.json`` content for this fake (``apiCredential`` v1 format)."""
        claims = _verify_jwt(self.refresh_token, self.key) or {}
        return {"apiVersion": "v1", "type": "apiCredential",
                "data": {"server": server, "refresh": self.refresh_token, "expiredTs": claims.get("exp"), "active": True}}

    def issue_access(self) -> str:
        now = time.time()
        return make_jwt({"token_type": "access", "exp": now + self.access_ttl_s, "iat": now,
                         "jti": secrets.token_hex(8)}, self.key)

    def access_ok(self, token: str) -> bool:
        claims = _verify_jwt(token, self.key)
        if not claims or claims.get("token_type") != "access":
            return False
        if self.faults.expire_tokens and claims.get("iat", 0) <= self.revoked_before:
            return False
        return claims.get("exp", 0) > time.time()

    # -- model objects -----------------------------------------------------------------------
    def add_source(self, name: str, url: str | None = None, uuid: str | None = None) -> str:
        uid = uuid or str(uuidlib.uuid4())
        conn = {"type": "dwUrl", "url": url} if url else {"type": "postgres"}
        self.sources[uid] = {
            "apiVersion": "v1", "type": "source",
            "metadata": {"uuid": uid, "name": name, "workspaceId": self.workspace_uuid, "idSerial": len(self.sources) + 1, "tags": []},
            "config": {"connection": conn, "isLive": True, "pollingInterval": 300, "profiler": {"enabled": False}},
            "status": {"createdTs": time.time(), "lastScannedStatus": "success"},
        }
        return uid

    def add_metric(self, name: str, source_uuid: str, schema: str, table: str, aggregation: str,
                   timestamp_column: str, slice_by: list[str], value_column: str | None = None,
                   uuid: str | None = None) -> str:
        """A ``metricConfig`` metric: ``aggregation`` is ``rowCount`` or ``sum``, daily window, triggered collection."""
        uid = uuid or str(uuidlib.uuid4())
        self.metrics[uid] = {
            "apiVersion": "v1", "type": "metric", "mode": "published",
            "metadata": {"uuid": uid, "name": name, "workspaceId": self.workspace_uuid, "idSerial": len(self.metrics) + 1,
                         "creationType": "custom", "tags": [], "ownedBy": {"id": 1, "email": "dq@grocer.example", "username": "dq"}},
            "config": {
                "configType": "metricConfig", "sources": [source_uuid],
                "table": {"type": "table", "schemaName": schema, "tableName": table, "tableUuid": str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{source_uuid}/{schema}.{table}"))},
                "aggregation": {"type": aggregation, "aggregationWindow": "day"},
                "valueColumns": [{"type": "column", "columnName": value_column}] if value_column else [],
                "sliceByColumns": slice_by, "timestampColumn": timestamp_column,
                "synchronizationDelay": 0, "pollingInterval": 300, "queryTimezone": "UTC", "dataTimezone": "UTC",
                "collectionMode": {"type": "triggered"}, "isLive": True, "dimension": "completeness",
            },
            "status": {"createdTs": time.time(), "runStatus": "ok"},
        }
        return uid

    def add_compare_metric(self, name: str, source_metric: str, target_metric: str, uuid: str | None = None) -> str:
        """An ``aggregationCompareMetricConfig`` metric over one (source, target) metric pair."""
        uid = uuid or str(uuidlib.uuid4())
        s, t = self.metrics[source_metric]["config"], self.metrics[target_metric]["config"]
        self.metrics[uid] = {
            "apiVersion": "v1", "type": "metric", "mode": "published",
            "metadata": {"uuid": uid, "name": name, "workspaceId": self.workspace_uuid, "idSerial": len(self.metrics) + 1,
                         "creationType": "custom", "tags": []},
            "config": {
                "configType": "aggregationCompareMetricConfig",
                "sources": [s["sources"][0], t["sources"][0]],
                "sourceTable": {"sourceUuid": s["sources"][0], "table": s["table"]},
                "targetTable": {"sourceUuid": t["sources"][0], "table": t["table"]},
                "compares": [{"sourceMetricUuid": source_metric, "targetMetricUuid": target_metric}],
                "aggregationWindow": "day", "collectionMode": {"type": "triggered"}, "isLive": True,
                "synchronizationDelay": 0, "dimension": "accuracy",
            },
            "status": {"createdTs": time.time(), "runStatus": "ok"},
        }
        return uid

    def add_monitor(self, name: str, metric_uuid: str, upper_pct: float, uuid: str | None = None) -> str:
        """A manual-threshold monitor: anomalous when |value| > ``upper_pct``."""
        uid = uuid or str(uuidlib.uuid4())
        self.monitors[uid] = {
            "apiVersion": "v1", "type": "rule",
            "metadata": {"uuid": uid, "name": name, "workspaceId": self.workspace_uuid, "idSerial": len(self.monitors) + 1, "tags": []},
            "config": {"metrics": [metric_uuid], "isLive": True, "driftDuration": 0, "recoveryDuration": 0,
                       "alertConfig": {"channels": [], "isMuted": False},
                       "symptom": {"type": "manualThreshold",
                                   "bound": {"lower": -upper_pct, "upper": upper_pct}, "featureConfig": {"type": "value"}}},
            "status": {"displayStatus": "live", "runStatus": "ok", "training": {"isTrained": True, "status": "notApplicable"}},
        }
        return uid

    def add_integration(self, type: str, name: str, config: dict[str, Any], uuid: str | None = None) -> str:
        """An alert channel (``type``: jira, servicenow, slack, email, pagerduty, ...). What the fake adds:
        a jira channel's ``config`` is ``{"url", "projectKey", "email", "apiToken"}``, a servicenow one's
        ``{"instanceUrl", "username", "password"}``; a new incident of a monitor routed to it opens a ticket
        there over the vendor's REST API (Lightup does not publish how its channels word a ticket: the
        fake's summary names the monitor, the description holds the incident's uuid and link, and a
        ServiceNow incident's ``correlation_id`` is the Lightup incident's uuid)."""
        uid = uuid or str(uuidlib.uuid4())
        self.integrations[uid] = {"uuid": uid, "name": name, "type": type, "config": dict(config),
                                  "workspaceId": self.workspace_uuid, "createdTs": time.time()}
        return uid

    def route_monitor(self, monitor_uuid: str, integration_uuid: str) -> None:
        """Add the channel to the monitor's ``config.alertConfig.channels``."""
        self.monitors[monitor_uuid]["config"]["alertConfig"]["channels"].append({"channelId": integration_uuid})

    def _alert(self, inc: dict) -> None:
        import httpx

        mon = self.monitors.get(str(inc.get("filter_uuid") or ""))
        if mon is None:
            return
        link = f"https://fake.lightup.example/#/ws/{self.workspace_uuid}/incidents/{inc['uuid']}"
        text = (f"Lightup incident {inc['uuid']} on monitor {mon['metadata']['name']}, slice {json.dumps(inc.get('slice'))}: "
                f"{link}")
        for ch in mon["config"]["alertConfig"]["channels"]:
            integ = self.integrations.get(ch.get("channelId"))
            if integ is None or integ["type"] not in ("jira", "servicenow"):
                continue
            cfg = integ["config"]
            try:
                if integ["type"] == "jira":
                    r = httpx.post(f"{cfg['url'].rstrip('/')}/rest/api/3/issue", auth=(cfg["email"], cfg["apiToken"]),
                                   timeout=10, json={"fields": {
                                       "project": {"key": cfg["projectKey"]}, "issuetype": {"name": "Bug"},
                                       "summary": f"Lightup: {mon['metadata']['name']} {json.dumps(inc.get('slice'))}",
                                       "description": {"type": "doc", "version": 1, "content": [
                                           {"type": "paragraph", "content": [{"type": "text", "text": text}]}]},
                                       "labels": ["lightup"]}})
                else:
                    r = httpx.post(f"{cfg['instanceUrl'].rstrip('/')}/api/now/table/incident", timeout=10,
                                   auth=(cfg["username"], cfg["password"]),
                                   json={"short_description": f"Lightup: {mon['metadata']['name']}", "description": text,
                                         "correlation_id": inc["uuid"], "correlation_display": "Lightup"})
                self.alerts_sent.append({"integration": integ["uuid"], "incident": inc["uuid"], "status": r.status_code,
                                         "answer": r.json() if r.content else None})
            except httpx.HTTPError as e:
                self.alerts_sent.append({"integration": integ["uuid"], "incident": inc["uuid"], "status": None,
                                         "answer": f"{type(e).__name__}: {e}"})

    def add_incident(self, **fields: Any) -> dict:
        """Store an incident; missing fields get defaults (``uuid``, ``updated_ts`` now, status 1...); a
        monitor's Jira/ServiceNow alert channels open their tickets (:meth:`add_integration`)."""
        now = time.time()
        inc = {"uuid": str(uuidlib.uuid4()), "id": len(self.incidents) + 1, "incident_type": "anomalyIncident",
               "start_ts": now - DAY, "end_ts": now, "creation_ts": now, "updated_ts": now, "ongoing": True,
               "slice": {}, "direction": 2, "impact": 5, "status": 1,
               "validation": {"status": "unresolved", "lastRunTs": None, "errorCount": 0, "runStatusMessage": "ok"},
               "send_reminder": False}
        inc.update(fields)
        self.incidents[str(inc["uuid"])] = inc
        self._alert(inc)
        return inc

    # -- collection ------------------------------------------------------------------------------
    def _window(self) -> tuple[float, float]:
        end = self.collect_end_ts if self.collect_end_ts is not None else (time.time() // DAY) * DAY
        start = self.collect_start_ts if self.collect_start_ts is not None else end - 30 * DAY
        return start, end

    def _collect_metric(self, uid: str) -> None:
        from dw_dagster.databases import sql
        from dw_dagster.databases import database_from_url

        m = self.metrics[uid]["config"]
        conn = self.sources[m["sources"][0]]["config"]["connection"]
        if conn.get("type") != "dwUrl":
            return
        db = database_from_url(conn["url"])
        start, end = self._window()
        lo = dt.datetime.fromtimestamp(start, dt.timezone.utc).replace(tzinfo=None)
        hi = dt.datetime.fromtimestamp(end, dt.timezone.utc).replace(tzinfo=None)
        slices = m["sliceByColumns"]
        agg = m["aggregation"]["type"]
        value = "COUNT(*)" if agg == "rowCount" else f"SUM({sql.column(m['valueColumns'][0]['columnName']).sql(db.dialect)})"
        cols = ", ".join(sql.column(s).sql(db.dialect) for s in slices)
        q = sql.render(
            f"SELECT CAST(:ts AS DATE) AS d{', ' + cols if cols else ''}, {value} AS v FROM :t "
            f"WHERE :ts >= :lo AND :ts < :hi GROUP BY 1{''.join(f', {i + 2}' for i in range(len(slices)))}",
            db.dialect, ts=sql.column(m["timestampColumn"]), t=sql.table([m["table"]["schemaName"], m["table"]["tableName"]]),
            lo=lo, hi=hi)
        rows = db.fetch_all(q)
        now = time.time()
        points = []
        for row in rows:
            day = row[0]
            event_ts = dt.datetime.combine(day, dt.time(), dt.timezone.utc).timestamp()
            v = row[-1]
            points.append({"eventTs": event_ts, "recordedTs": now, "metricUuid": uid,
                           "slice": {s: row[1 + i] for i, s in enumerate(slices)},
                           "value": float(v) if isinstance(v, Decimal) else v})
        self.datapoints[uid] = sorted(points, key=lambda p: (p["eventTs"], json.dumps(p["slice"], sort_keys=True)))
        self.metrics[uid]["status"]["lastSampleTs"] = now

    def _collect_compare(self, uid: str) -> None:
        cfg = self.metrics[uid]["config"]
        pair = cfg["compares"][0]
        src = {(p["eventTs"], json.dumps(p["slice"], sort_keys=True)): p for p in self.datapoints.get(pair["sourceMetricUuid"], [])}
        tgt = {(p["eventTs"], json.dumps(p["slice"], sort_keys=True)): p for p in self.datapoints.get(pair["targetMetricUuid"], [])}
        now = time.time()
        out = []
        for k in sorted(set(src) | set(tgt)):
            s = (src.get(k) or {}).get("value") or 0
            t = (tgt.get(k) or {}).get("value") or 0
            pct = 0.0 if s == 0 and t == 0 else (100.0 if s == 0 else (s - t) / s * 100.0)
            out.append({"eventTs": k[0], "recordedTs": now, "metricUuid": uid, "slice": json.loads(k[1]), "value": round(pct, 6)})
        self.datapoints[uid] = out

    def _evaluate_monitor(self, mon_uid: str) -> int:
        """Open, extend or close incidents of one monitor; returns how many incidents changed."""
        mon = self.monitors[mon_uid]
        metric = mon["config"]["metrics"][0]
        upper = mon["config"]["symptom"]["bound"]["upper"]
        by_slice: dict[str, list[dict]] = {}
        for p in self.datapoints.get(metric, []):
            by_slice.setdefault(json.dumps(p["slice"], sort_keys=True), []).append(p)
        changed, now = 0, time.time()
        for skey, points in by_slice.items():
            runs: list[list[dict]] = []
            for p in sorted(points, key=lambda p: p["eventTs"]):
                if abs(p["value"]) > upper:
                    if runs and runs[-1][-1]["eventTs"] == p["eventTs"] - DAY:
                        runs[-1].append(p)
                    else:
                        runs.append([p])
            open_incs = [i for i in self.incidents.values()
                         if i.get("filter_uuid") == mon_uid and json.dumps(i.get("slice"), sort_keys=True) == skey and i.get("ongoing")]
            for inc in open_incs:
                match = [r for r in runs if r[0]["eventTs"] <= inc["end_ts"] and r[-1]["eventTs"] + DAY >= inc["start_ts"]]
                if not match:
                    inc.update(ongoing=False, close_ts=now, updated_ts=now)
                    changed += 1
                else:
                    r = match[0]
                    runs.remove(r)
                    new_end = r[-1]["eventTs"] + DAY
                    if new_end != inc["end_ts"]:
                        inc.update(end_ts=new_end, updated_ts=now)
                        changed += 1
            for r in runs:
                worst = max(abs(p["value"]) for p in r)
                self.add_incident(filter_uuid=mon_uid, slice=json.loads(skey), start_ts=r[0]["eventTs"],
                                  end_ts=r[-1]["eventTs"] + DAY, creation_ts=now, updated_ts=now,
                                  direction=2 if r[0]["value"] > 0 else 1, impact=min(10, max(1, round(worst))))
                changed += 1
        return changed

    def collect(self, metric_uuids: list[str] | None = None) -> int:
        """Collect the given metrics (all by default), their compare metrics and monitors; returns incidents changed."""
        with self.lock:
            wanted = set(metric_uuids or self.metrics)
            for uid in list(wanted):  # a compare metric pulls in its pair
                cfg = self.metrics.get(uid, {}).get("config", {})
                for pair in cfg.get("compares", []):
                    wanted |= {pair["sourceMetricUuid"], pair["targetMetricUuid"]}
            for uid in sorted(wanted):
                if self.metrics.get(uid, {}).get("config", {}).get("configType") == "metricConfig":
                    self._collect_metric(uid)
            compares = {uid for uid, m in self.metrics.items() if m["config"]["configType"] == "aggregationCompareMetricConfig"
                        and any(p["sourceMetricUuid"] in wanted or p["targetMetricUuid"] in wanted for p in m["config"]["compares"])}
            for uid in sorted(compares):
                self._collect_compare(uid)
            return sum(self._evaluate_monitor(m) for m, mon in self.monitors.items()
                       if mon["config"]["metrics"][0] in compares | wanted)


def seed_store_sales(state: FakeLightup, source_url: str | None, warehouse_url: str | None,
                     collect_start: dt.date = dt.date(2026, 11, 1), collect_end: dt.date = dt.date(2026, 11, 29)) -> dict[str, str]:
    """The store-sales workspace: POS source and warehouse, row-count and net_sales pairs by region,
    a compare metric per pair and a 0.5 % manual-threshold monitor on the row-count compare.

    Returns:
        Names → uuids (``pos_source``, ``warehouse``, ``rows_source``, ``rows_target``, ``rows_compare``,
        ``sales_source``, ``sales_target``, ``sales_compare``, ``rows_monitor``). UUIDs are stable
        (uuid5 of the name), so a restarted fake keeps them.
    """
    def u(name: str) -> str:
        return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"lightup-fake/store-sales/{name}"))

    with state.lock:
        state.workspace_uuid = u("workspace")
        ids = {"pos_source": state.add_source("pos-informix", source_url, u("pos")),
               "warehouse": state.add_source("warehouse", warehouse_url, u("warehouse"))}
        for side, src in (("source", ids["pos_source"]), ("target", ids["warehouse"])):
            ids[f"rows_{side}"] = state.add_metric(f"sales_line rows by region ({side})", src, "pos", "sales_line",
                                                   "rowCount", "sale_ts", ["region"], uuid=u(f"rows_{side}"))
            ids[f"sales_{side}"] = state.add_metric(f"sales_line net_sales by region ({side})", src, "pos", "sales_line",
                                                    "sum", "sale_ts", ["region"], value_column="net_sales", uuid=u(f"sales_{side}"))
        ids["rows_compare"] = state.add_compare_metric("pos vs warehouse: sales_line rows by region",
                                                       ids["rows_source"], ids["rows_target"], uuid=u("rows_compare"))
        ids["sales_compare"] = state.add_compare_metric("pos vs warehouse: net_sales by region",
                                                        ids["sales_source"], ids["sales_target"], uuid=u("sales_compare"))
        ids["rows_monitor"] = state.add_monitor("sales_line rows compare within 0.5 %", ids["rows_compare"], 0.5, uuid=u("rows_monitor"))
        state.collect_start_ts = dt.datetime.combine(collect_start, dt.time(), dt.timezone.utc).timestamp()
        state.collect_end_ts = dt.datetime.combine(collect_end, dt.time(), dt.timezone.utc).timestamp()
    return ids


# -- HTTP layer ------------------------------------------------------------------------------------

def _err(status: int, detail: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status)


def _csv(value: str | None) -> list[str] | None:
    if value is None:
        return None
    out: list[str] = []
    for part in value.split(","):
        part = part.strip().strip("[]").strip('"')
        if part:
            out.append(part)
    return out


def _float(q: Any, name: str) -> float | None:
    v = q.get(name)
    if v is None or v == "":
        return None
    return float(v)


def _helpers(state: FakeLightup) -> SimpleNamespace:
    """The request guard every route goes through (faults, auth, workspace, body), the answer's JSON and lists."""

    def _fault_response(request: Request) -> Response | None:
        f = state.faults
        path = request.url.path
        if path.startswith("/_fake"):
            return None
        if f.outage:
            return _err(503, "Service Unavailable")
        if (f.status and f.status_count > 0 and (not f.status_path or re.search(f.status_path, path))
                and (not f.status_method or f.status_method == request.method)):
            f.status_count -= 1
            headers = {"Retry-After": "0"} if f.status == 429 else None
            return JSONResponse({"detail": "Request was throttled." if f.status == 429 else "Server Error"},
                                status_code=f.status, headers=headers)
        return None

    def _auth(request: Request) -> Response | None:
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            return _err(401, "Authentication credentials were not provided.")
        if not state.access_ok(header[len("Bearer "):]):
            return _err(401, "Given token not valid for any token type", code="token_not_valid",
                        messages=[{"token_class": "AccessToken", "token_type": "access", "message": "Token is invalid or expired"}])
        return None

    def _ws(ws: str) -> Response | None:
        if ws != state.workspace_uuid:
            return _err(403, "You do not have permission to perform this action.")
        return None

    async def _delay() -> None:
        import asyncio

        f = state.faults
        if f.delay_s and f.delay_count > 0:
            f.delay_count -= 1
            await asyncio.sleep(f.delay_s)

    def _json(request: Request, data: Any, status: int = 200) -> Response:
        f = state.faults
        if f.malformed_count > 0 and (not f.malformed_path or re.search(f.malformed_path, request.url.path)):
            f.malformed_count -= 1
            return Response('{"data": [ {"uuid": "trunc', status_code=status, media_type="application/json")
        return JSONResponse(data, status_code=status)

    def guarded(handler, auth: bool = True, ws: bool = True):
        async def endpoint(request: Request) -> Response:
            state.requests.append(f"{request.method} {request.url.path}")
            await _delay()
            with state.lock:
                bad = _fault_response(request)
                if bad is None and auth:
                    bad = _auth(request)
                if bad is None and ws and "ws" in request.path_params:
                    bad = _ws(request.path_params["ws"])
            if bad is not None:
                return bad
            body = None
            if request.method in ("POST", "PATCH", "PUT"):
                raw = await request.body()
                try:
                    body = json.loads(raw) if raw else {}
                except json.JSONDecodeError:
                    return _err(400, "JSON parse error")
            with state.lock:
                result = handler(request, body)
                f = state.faults
                after = (f.after_count > 0 and (not f.after_path or re.search(f.after_path, request.url.path))
                         and (not f.after_method or f.after_method == request.method))
                if after:
                    f.after_count -= 1
                    delay, status_after = f.after_delay_s, f.after_status
            if after:  # the request took effect; only the answer is late or lost
                import asyncio

                if delay:
                    await asyncio.sleep(delay)
                if status_after is not None:
                    return JSONResponse({"detail": "Server Error"}, status_code=status_after)
            if isinstance(result, Response):
                return result
            data, status = result if isinstance(result, tuple) else (result, 200)
            return _json(request, data, status)
        return endpoint

    def _list(data: list, wrap: bool = False) -> Any:
        return {"data": data} if wrap or state.faults.wrap_lists else data

    return SimpleNamespace(_fault_response=_fault_response, _auth=_auth, _ws=_ws, _delay=_delay, _json=_json,
                           guarded=guarded, _list=_list)


def _account_handlers(state: FakeLightup, h: SimpleNamespace) -> dict[str, Callable[..., Any]]:
    """Health, token refresh, workspaces, incidents and their comments."""
    # handlers -----------------------------------------------------------------------------------
    def healthz(request, body):
        return {"status": "ok"}

    def token_refresh(request, body):
        if not isinstance(body, dict) or not body.get("refresh"):
            return _err(400, "refresh: This field is required.")
        claims = _verify_jwt(body["refresh"], state.key)
        if not claims or claims.get("token_type") != "refresh" or claims.get("exp", 0) < time.time():
            return _err(401, "Token is invalid or expired", code="token_not_valid")
        return {"access": state.issue_access()}

    def workspaces(request, body):
        return {"data": [{"uuid": state.workspace_uuid, "name": state.workspace_name, "description": "",
                          "created_at": 1761955200, "active": True, "icon_id": 1, "config": {}}]}

    def incidents(request, body):
        q = request.query_params
        start, end = _float(q, "start_ts"), _float(q, "end_ts")
        su, eu = _float(q, "start_updated_ts"), _float(q, "end_updated_ts")
        statuses = [int(s) for s in (_csv(q.get("status_list")) or [])]
        monitors = set(_csv(q.get("monitor_uuids")) or [])
        metrics = set(_csv(q.get("metric_uuids")) or [])
        out = []
        for inc in [*state.incidents.values(), *state.listed_extra]:
            if not isinstance(inc, dict):  # a malformed list item: listed as is
                out.append(inc)
                continue
            try:
                if start is not None and float(inc.get("end_ts") or 0) < start:
                    continue
                if end is not None and float(inc.get("start_ts") or 0) > end:
                    continue
                if su is not None and float(inc.get("updated_ts") or 0) < su:
                    continue
                if eu is not None and float(inc.get("updated_ts") or 0) > eu:
                    continue
            except (TypeError, ValueError):
                pass  # a malformed stored incident is listed as is (the client must cope)
            if statuses and inc.get("status") not in statuses:
                continue
            if monitors and inc.get("filter_uuid") not in monitors:
                continue
            if metrics:
                mon = state.monitors.get(inc.get("filter_uuid") or "")
                if not mon or mon["config"]["metrics"][0] not in metrics:
                    continue
            out.append(inc)
        def _get(i: Any, k: str) -> Any:
            return i.get(k) if isinstance(i, dict) else None

        out.sort(key=lambda i: (str(_get(i, "updated_ts")), str(_get(i, "uuid"))))
        return {"data": out, "metadata": {"total": len(out), "unread": sum(1 for i in out if _get(i, "status") == 1),
                                          "accepted": sum(1 for i in out if _get(i, "status") == 2)}, "ref": {}}

    def incident(request, body):
        uid = request.path_params["uuid"]
        inc = state.incidents.get(uid)
        if inc is None:
            return _err(404, "Not found.")
        if request.method == "GET":
            return inc
        if not isinstance(body, dict):
            return _err(400, "Invalid body")
        if "status" in body:
            if body["status"] not in (1, 2, 3, 4, 5):
                return _err(400, f"status: \"{body['status']}\" is not a valid choice.")
            inc["status"] = body["status"]
        if "validation" in body:
            st = (body["validation"] or {}).get("status")
            if st not in ("running", "canceling"):
                return _err(400, "validation.status must be running or canceling")
            inc["validation"] = {**inc.get("validation", {}), "status": st, "lastRunTs": time.time()}
        inc["updated_ts"] = time.time()
        return Response(status_code=204)

    def comments(request, body):
        uid = request.path_params["uuid"]
        if uid not in state.incidents:
            return _err(404, "Not found.")
        if request.method == "GET":
            return {"comments": state.comments.get(uid, [])}
        if not isinstance(body, dict) or not isinstance(body.get("comment"), str) or not body["comment"].strip():
            return _err(400, "comment: This field is required.")
        c = {"id": sum(len(v) for v in state.comments.values()) + 1, "comment": body["comment"],
             "createdTs": time.time(), "ownedBy": {"id": 7, "email": "dw-dagster@grocer.example", "username": "dw-dagster"}}
        state.comments.setdefault(uid, []).append(c)
        return c, 201

    return {"healthz": healthz, "token_refresh": token_refresh, "workspaces": workspaces, "incidents": incidents,
            "incident": incident, "comments": comments}


def _metric_handlers(state: FakeLightup, h: SimpleNamespace) -> dict[str, Callable[..., Any]]:
    """Metrics, datapoints, monitors, sources and their collection triggers."""
    _list = h._list

    def metrics(request, body):
        q = request.query_params
        wanted = set(_csv(q.get("metric_uuids")) or [])
        out = [m for uid, m in state.metrics.items() if not wanted or uid in wanted]
        off, lim = int(q.get("offset") or 0), int(q.get("limit") or 1000)
        return _list(out[off:off + lim])

    def metric(request, body):
        m = state.metrics.get(request.path_params["uuid"])
        return m if m is not None else _err(404, "Not found.")

    def datapoints(request, body):
        uid = request.path_params["uuid"]
        if uid not in state.metrics:
            return _err(404, "Not found.")
        q = request.query_params
        start, end = _float(q, "start_ts"), _float(q, "end_ts")
        want = None
        if q.get("slice"):
            try:
                want = json.loads(q["slice"])
            except json.JSONDecodeError:
                return _err(400, "slice: expected a JSON object")
        out = [p for p in state.datapoints.get(uid, [])
               if (start is None or p["eventTs"] >= start) and (end is None or p["eventTs"] < end)
               and (want is None or p["slice"] == want)]
        return out

    def monitors(request, body):
        q = request.query_params
        wanted = set(_csv(q.get("monitor_uuids")) or [])
        by_metric = set(_csv(q.get("metric_uuids")) or [])
        out = [m for uid, m in state.monitors.items()
               if (not wanted or uid in wanted) and (not by_metric or m["config"]["metrics"][0] in by_metric)]
        return _list(out, wrap=state.faults.wrap_monitors)

    def monitor(request, body):
        m = state.monitors.get(request.path_params["uuid"])
        return m if m is not None else _err(404, "Not found.")

    def monitor_slices(request, body):
        m = state.monitors.get(request.path_params["uuid"])
        if m is None:
            return _err(404, "Not found.")
        seen = {json.dumps(p["slice"], sort_keys=True) for p in state.datapoints.get(m["config"]["metrics"][0], [])}
        return {"sliceList": [json.loads(s) for s in sorted(seen)]}

    def sources(request, body):
        return _list(list(state.sources.values()))

    def source(request, body):
        s = state.sources.get(request.path_params["uuid"])
        return s if s is not None else _err(404, "Not found.")

    def trigger(request, body):
        src = request.path_params["uuid"]
        if src not in state.sources:
            return _err(404, "Not found.")
        if request.method == "GET":
            q = request.query_params
            for t in state.triggers.values():
                if t["triggerUuid"] == q.get("triggerUuid") or (q.get("userDefinedId") and t["userDefinedId"] == q.get("userDefinedId")):
                    return t
            return _err(404, "Not found.")
        body = body if isinstance(body, dict) else {}
        mids = list(body.get("metricUuids") or [])
        tables = list(body.get("tableUuids") or [])
        for uid, m in state.metrics.items():
            if m["config"].get("table", {}).get("tableUuid") in tables:
                mids.append(uid)
        unknown = [m for m in mids if m not in state.metrics]
        if unknown or not mids:
            return _err(400, f"metricUuids: unknown or empty {unknown}")
        try:
            changed = state.collect(mids)
            status, error = "completed", None
        except Exception as e:  # the fake's own collection failed: report like a failed monitor run
            changed, status, error = 0, "completed", str(e)
        t = {"triggerUuid": str(uuidlib.uuid4()), "userDefinedId": body.get("userDefinedId"), "metricUuids": mids,
             "tableUuids": tables, "config": {}, "triggerStatus": {
                 "status": status, "incidentsCount": changed if error is None else 0,
                 "summary": {"numMonitorsPassed": 0 if error else len(state.monitors), "numMonitorsFailed": 1 if error else 0,
                             "numMonitorsPaused": 0, "numMonitorsPending": 0},
                 "metricStatuses": [{"metricUuid": m, "status": status, "incidentsCount": 0, "summary": {}, "monitorStatuses": []} for m in mids],
                 **({"error": error} if error else {})}}
        state.triggers[t["triggerUuid"]] = t
        return t, 201

    return {"metrics": metrics, "metric": metric, "datapoints": datapoints, "monitors": monitors,
            "monitor": monitor, "monitor_slices": monitor_slices, "sources": sources, "source": source,
        "trigger": trigger}


def _fake_handlers(state: FakeLightup, h: SimpleNamespace) -> dict[str, Callable[..., Any]]:
    """The fake's controls (faults, incidents, state, collection) and the integrations."""
    _list = h._list

    # fake controls ------------------------------------------------------------------------------
    def fake_faults(request, body):
        body = body or {}
        f = state.faults
        if body.get("reset"):
            state.faults = f = Faults()
        if body.get("after_apply"):
            f.after_count = int(body.get("count", 1))
            f.after_status = int(body["status"]) if body.get("status") is not None else None
            f.after_delay_s = float(body.get("delay_s") or 0.0)
            f.after_path, f.after_method = body.get("path"), (body.get("method") or "").upper() or None
            return {"faults": f.__dict__}
        if "expire_tokens" in body:
            f.expire_tokens = bool(body["expire_tokens"])
            state.revoked_before = time.time()
        if "status" in body:
            f.status, f.status_count, f.status_path = int(body["status"]), int(body.get("count", 1)), body.get("path")
            f.status_method = (body.get("method") or "").upper() or None
        if "delay_s" in body:
            f.delay_s, f.delay_count = float(body["delay_s"]), int(body.get("count", 1))
        if "malformed" in body:
            f.malformed_count, f.malformed_path = int(body["malformed"]), body.get("path")
        for flag in ("wrap_monitors", "wrap_lists", "outage"):
            if flag in body:
                setattr(f, flag, bool(body[flag]))
        return {"faults": f.__dict__}

    def fake_incidents(request, body):
        if request.method == "GET":
            return list(state.incidents.values())
        items = body if isinstance(body, list) else [body]
        return [state.add_incident(**(i or {})) for i in items], 201

    def fake_state(request, body):
        return {"workspace_uuid": state.workspace_uuid, "incidents": list(state.incidents.values()),
                "comments": state.comments, "triggers": list(state.triggers.values()),
                "metrics": sorted(state.metrics), "monitors": sorted(state.monitors), "requests": len(state.requests)}

    def fake_collect(request, body):
        return {"incidents_changed": state.collect((body or {}).get("metricUuids"))}

    def _public(integ: dict) -> dict:
        secret = {"apiToken", "password", "token", "routingKey", "webHookUrl"}
        return {**integ, "config": {k: v for k, v in integ["config"].items() if k not in secret}}

    def integrations(request, body):
        return _list([_public(i) for i in state.integrations.values()])

    def integration(request, body):
        i = state.integrations.get(request.path_params["uuid"])
        return _public(i) if i is not None else _err(404, "Not found.")

    return {"fake_faults": fake_faults, "fake_incidents": fake_incidents, "fake_state": fake_state,
            "fake_collect": fake_collect, "integrations": integrations, "integration": integration}


def build_app(state: FakeLightup) -> Starlette:
    """The Starlette app serving ``state``."""
    h = _helpers(state)
    guarded = h.guarded
    handlers = {**_account_handlers(state, h), **_metric_handlers(state, h), **_fake_handlers(state, h)}
    ws = "/api/v0/ws/{ws}"
    v1 = "/api/v1/ws/{ws}"
    routes = [
        Route("/api/v0/healthz/", guarded(handlers["healthz"], auth=False)),
        Route("/api/v1/token/refresh/", guarded(handlers["token_refresh"], auth=False), methods=["POST"]),
        Route("/api/v1/workspaces/", guarded(handlers["workspaces"])),
        Route(f"{ws}/incidents/", guarded(handlers["incidents"])),
        Route(f"{ws}/incidents/{{uuid}}", guarded(handlers["incident"]), methods=["GET", "PATCH"]),
        Route(f"{ws}/incidents/{{uuid}}/comments", guarded(handlers["comments"]), methods=["GET", "POST"]),
        Route(f"{v1}/metrics/", guarded(handlers["metrics"])),
        Route(f"{v1}/metrics/{{uuid}}", guarded(handlers["metric"])),
        Route(f"{v1}/metrics/{{uuid}}/datapoints", guarded(handlers["datapoints"])),
        Route(f"{v1}/monitors/", guarded(handlers["monitors"])),
        Route(f"{v1}/monitors/{{uuid}}", guarded(handlers["monitor"])),
        Route(f"{v1}/monitors/{{uuid}}/slices", guarded(handlers["monitor_slices"])),
        Route(f"{v1}/integrations/", guarded(handlers["integrations"])),
        Route(f"{v1}/integrations/{{uuid}}", guarded(handlers["integration"])),
        Route(f"{v1}/sources/", guarded(handlers["sources"])),
        Route(f"{v1}/sources/{{uuid}}", guarded(handlers["source"])),
        Route(f"{v1}/sources/{{uuid}}/trigger", guarded(handlers["trigger"]), methods=["GET", "POST"]),
        Route("/_fake/faults", guarded(handlers["fake_faults"], auth=False), methods=["POST"]),
        Route("/_fake/incidents", guarded(handlers["fake_incidents"], auth=False), methods=["GET", "POST"]),
        Route("/_fake/state", guarded(handlers["fake_state"], auth=False)),
        Route("/_fake/collect", guarded(handlers["fake_collect"], auth=False), methods=["POST"]),
    ]
    return Starlette(routes=routes)


class FakeLightupServer:
    """The fake on a loopback port, served by uvicorn in a background thread.

    Use as a context manager; :attr:`url` is ``http://127.0.0.1:<port>``.
    """

    def __init__(self, state: FakeLightup | None = None, port: int = 0, host: str = "127.0.0.1") -> None:
        import socket

        import uvicorn

        self.state = state or FakeLightup()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(build_app(self.state), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def start(self) -> FakeLightupServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                        name="fake-lightup")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake Lightup server did not start within 10 s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread:
            self._thread.join(10)
        self._sock.close()

    def write_credential(self, path: str | Path) -> Path:
        """Write ``lightup-api-credential.json`` for this server; returns the path."""
        path = Path(path)
        path.write_text(json.dumps(self.state.credential(self.url), indent=2))
        return path

    def __enter__(self) -> FakeLightupServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(port: int, credential_file: str | None, source_url: str | None, warehouse_url: str | None,
          access_ttl_s: float = 300.0) -> None:
    """Run the fake seeded with the store-sales workspace until SIGINT/SIGTERM (prints its URL)."""
    import signal

    state = FakeLightup(access_ttl_s=access_ttl_s)
    seed_store_sales(state, source_url, warehouse_url)
    server = FakeLightupServer(state, port=port).start()
    if credential_file:
        server.write_credential(credential_file)
    print(json.dumps({"url": server.url, "workspace_uuid": state.workspace_uuid, "credential_file": credential_file}), flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    server.stop()


if __name__ == "__main__":  # pragma: no cover - exercised through the CLI
    import argparse

    ap = argparse.ArgumentParser(description="Fake Lightup REST API on loopback")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--credential-file")
    ap.add_argument("--source-url")
    ap.add_argument("--warehouse-url")
    a = ap.parse_args()
    serve(a.port, a.credential_file, a.source_url, a.warehouse_url)
