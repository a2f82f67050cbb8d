"""Lightup compare-metric incidents → Dagster asset check evaluations, ledger incidents and diagnosis runs.

:func:`build_lightup_incident_sensor` polls ``GET /api/v0/ws/{ws}/incidents/`` by
``updated_ts`` with the cursor of :mod:`dw_dagster.core.cursors` (``PUBLIC_CASES.md`` C20/C21) and picks
up every incident version exactly once:

- **one answer, one incident**: an answer that lists an incident twice (the same version, or an
  older one next to the newest) is de-duplicated by uuid, keeping the newest ``updated_ts``; a
  version older than one already handled is skipped;
- **late visibility**: every poll re-reads ``overlap_seconds`` (default 300 s) below the
  watermark, because an incident may be listed only some time after its ``updated_ts`` (after
  later-stamped incidents were read); the cursor's handled set skips what was done, and entries
  older than the window are pruned, so the cursor never grows with the history;
- **the ledger knows every incident**: "have I seen this Lightup incident" is one indexed lookup,
  ``incident_by_external("lightup", uuid)``; nothing reads the event log, so a tick's cost does
  not grow with it;
- **no incident pins the cursor**: a version that fails (its monitor gone, its datapoints
  erroring, its table unmapped...) is retried on the next ticks; after ``max_attempts`` tries it
  is quarantined (see :func:`quarantine_lightup_incident`) and the cursor moves past it. A tick in
  which Lightup does not answer (the list fails, or a 5xx/timeout while ``GET /api/v0/healthz/``
  fails too) counts as a try for no incident and leaves the cursor where it was.

For each new version it

1. resolves the incident to its compare metric and table pair (:meth:`LightupClient.compare_context`),
2. maps the target table to a Dagster asset (``table_assets``; an unmapped table is an error
   naming the table, retried on the next ticks in case the mapping is fixed),
3. computes the gap per metric pair from the source and target datapoints for the incident's
   slice and window,
4. reports an ``AssetCheckEvaluation`` of ``check_name`` on the target asset (failed while the
   incident is ongoing, passed once Lightup closes it), with the numbers as metadata, and
5. for an ongoing incident the ledger does not know yet (and a ``diagnosis_job_name``), records a
   :class:`~dw_dagster.core.models.Incident` (``source="lightup"``, the uuid as external id) and shows
   it with a ``dw/incident`` observation. When the asset already has an open incident, the new
   one is recorded *linked* to it (observation "linked to incident X") and not diagnosed; when
   that incident closes (:func:`~dw_dagster.receipts.job.close_incident`) it becomes an
   incident of its own and this sensor launches its diagnosis
   (:func:`~dw_dagster.detection.incidents.rediagnosis_requests` over the mapped assets; a new
   Lightup incident on an asset whose incident's diagnosis failed, or whose change set ended
   unrepaired, asks for that incident's diagnosis again, launched by the sensor that owns its
   source). Otherwise it requests a run of the diagnosis job (none in an L0 domain). Run keys are
   the incident's (:func:`~dw_dagster.detection.incidents.diagnosis_run_key`): ``lu-<hash of the
   uuid>`` for its first diagnosis.

A malformed incident (missing ``uuid``, ``updated_ts``, ``filter_uuid``...) is reported once in
the tick's log and skip reason, listed in the ledger's quarantine and skipped. The tick itself
never raises. The ledger record is written during the tick and the run is requested by its
result; when that result is lost (the process dies in between, or the tick was only evaluated:
the UI's "Test sensor"), every later tick requests the diagnosis of each Lightup incident still
waiting for it again, under the same run key, so the daemon launches it once
(:func:`~dw_dagster.detection.incidents.rediagnosis_requests`).

:func:`build_lightup_compare_check` declares the same check on the asset so the UI lists it and
it can run on demand (it reads Lightup's open incidents for the compare metrics).
"""

import contextlib
import datetime as dt
import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
import httpx

from dw_dagster.core import keys as c
from dw_dagster.checks.metadata import metadata_table
from dw_dagster.core.cursors import UpdatedTsCursor
from dw_dagster.core.domains import DomainsSource, domain_for, resolve_domains
from dw_dagster.core.http import HttpApiError
from dw_dagster.integrations.lightup import (
    CompareContext,
    CompareGap,
    LightupCredentialError,
    LightupError,
    LightupResource,
    validate_incident,
)
from dw_dagster.core.ledger import QUARANTINED, asset_str, ledger_for
from dw_dagster.core.models import Incident, SliceGap, utcnow
from dw_dagster.core import records
from dw_dagster.guard.stop import CONTROL_ASSET
from dw_dagster.detection.incidents import (
    diagnosis_request,
    diagnosis_run_key,
    incident_observation,
    record_unless_open,
    rediagnosis_requests,
    unshown_incident_observations,
)
from dw_dagster.dagster_private import public

DEFAULT_CHECK = c.LIGHTUP_CHECK
LIGHTUP_ID_KEY = c.LIGHTUP_ID_KEY
LIGHTUP_TAG = c.LIGHTUP_ID_KEY
QUARANTINED_KEY = c.QUARANTINED_KEY
HEALTH_PATH = "/api/v0/healthz/"
#: the ledger's external id column holds 255 characters; a longer "uuid" is malformed
MAX_UUID_LENGTH = 255
#: Seconds every poll re-reads below the watermark. Lightup stamps ``updated_ts`` when a monitor
#: run changes an incident, but does not document when the change becomes visible in the list; a
#: run that stamps incidents as it goes and commits at its end makes them visible late, after
#: incidents stamped later may already have been read. Monitors are evaluated every
#: ``pollingInterval`` (300 s by default in Lightup's OpenAPI document), so one interval covers a
#: run that takes all of it. The handled set makes re-reading free of repeats; the window bounds
#: how many entries the cursor holds.
DEFAULT_OVERLAP_SECONDS = 300.0
#: ticks an incident version may fail before it is quarantined
DEFAULT_MAX_ATTEMPTS = 5


class UnmappedTableError(LightupError):
    """A Lightup table has no Dagster asset in ``table_assets``."""


def _asset_key(value: Any) -> dg.AssetKey:
    if isinstance(value, dg.AssetKey):
        return value
    if isinstance(value, str):
        return dg.AssetKey.from_user_string(value)
    return dg.AssetKey(list(value))


def map_table(table_assets: Mapping[str, dg.AssetKey], table: Any) -> dg.AssetKey:
    """The asset of a :class:`~dw_dagster.integrations.lightup.LightupTable`, by ``"<source uuid or name>:<schema.table>"``
    or plain ``"<schema.table>"``.

    Raises:
        UnmappedTableError: no key matches; the message lists the keys tried.
    """
    tried = [*table.keys(), table.name]
    for k in tried:
        if k in table_assets:
            return table_assets[k]
    raise UnmappedTableError(f"Lightup table {table.name} (datasource {table.source_name or table.source_uuid}) "
                             f"is not mapped to a Dagster asset; add one of {tried} to table_assets")


def _utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(float(ts), dt.timezone.utc)


def _slice_gap(gaps: Sequence[CompareGap], slice_: dict) -> SliceGap:
    rows = next((g for g in gaps if g.aggregation in ("rowCount", "count", "volume")), gaps[0])
    sums = [g for g in gaps if g is not rows]
    return SliceGap(
        slice=slice_, source_rows=int(rows.source_value), target_rows=int(rows.target_value),
        gap_rows=int(rows.gap), gap_pct=round(rows.gap_pct, 4),
        source_sums={g.aggregation: f"{g.source_value:.2f}" for g in sums},
        target_sums={g.aggregation: f"{g.target_value:.2f}" for g in sums},
        sum_gaps={g.aggregation: f"{g.gap:.2f}" for g in sums}, passed=rows.gap == 0,
    )


def lightup_incident_id(incident_uuid: str) -> str:
    """The dw_dagster incident id for a Lightup incident (stable across its updates)."""
    return "lu-" + hashlib.sha256(incident_uuid.encode()).hexdigest()[:12]


def evaluate_incident(
    lightup: LightupResource, raw: Mapping[str, Any], table_assets: Mapping[str, dg.AssetKey], check_name: str,
    *, seen: dict[str, Any] | None = None,
) -> tuple[dg.AssetCheckEvaluation, Incident, CompareContext]:
    """Turn one Lightup incident version into a check evaluation and a dw_dagster incident.

    Args:
        lightup: the Lightup resource.
        raw: the incident object as listed.
        table_assets: Lightup table → asset key (see :func:`map_table`).
        check_name: the check the evaluation is of.
        seen: filled with what was resolved before a failure (``"asset"``: the target asset once
            mapped), so a caller can say where a failing incident belongs.

    Raises:
        LightupError: malformed incident, not a compare metric, unmapped table.
        HttpApiError: API failures while resolving it.
    """
    inc = validate_incident(dict(raw))
    client = lightup.get_client()
    ctx = client.compare_context(inc)
    target = map_table(table_assets, ctx.target)
    if seen is not None:
        seen["asset"] = target
    slice_ = dict(inc.get("slice") or {})
    gaps = client.compare_gaps(ctx, slice_, inc["start_ts"], inc["end_ts"])
    sg = _slice_gap(gaps, slice_)
    ongoing = bool(inc.get("ongoing", True))
    url = lightup.incident_url(inc["uuid"])
    where = ", ".join(f"{k}={v}" for k, v in slice_.items()) or "whole table"
    window = f"{_utc(inc['start_ts']):%Y-%m-%d %H:%M}..{_utc(inc['end_ts']):%Y-%m-%d %H:%M} UTC"
    summary = (f"Lightup incident on {ctx.metric_name} ({where}, {window}): target {sg.gap_words()}" + ("" if ongoing else "; closed by Lightup"))
    incident = Incident(
        id=lightup_incident_id(inc["uuid"]), asset_key=list(target.path), source="lightup", check_name=check_name,
        detected_at=utcnow(), summary=summary, slices=[sg], gap_rows=sg.gap_rows, gap_pct=sg.gap_pct,
        external_id=inc["uuid"], external_url=url, window_start=_utc(inc["start_ts"]), window_end=_utc(inc["end_ts"]),
    )
    rows = [{"metric": g.aggregation, "slice": where, "source": g.source_value, "target": g.target_value,
             "gap": g.gap, "gap_pct": round(g.gap_pct, 4), "datapoints": g.datapoints} for g in gaps]
    evaluation = dg.AssetCheckEvaluation(
        asset_key=target, check_name=check_name, passed=not ongoing, severity=dg.AssetCheckSeverity.ERROR,
        description=summary[:1000],
        metadata={
            LIGHTUP_ID_KEY: inc["uuid"], c.LIGHTUP_URL_KEY: dg.MetadataValue.url(url),
            c.LIGHTUP_UPDATED_TS_KEY: float(inc["updated_ts"]), c.LIGHTUP_ONGOING_KEY: ongoing,
            c.LIGHTUP_STATUS_KEY: int(inc.get("status") or 1), c.COMPARE_METRIC_KEY: ctx.metric_name,
            c.SOURCE_TABLE_KEY: f"{ctx.source.source_name or ctx.source.source_uuid}:{ctx.source.name}",
            c.TARGET_TABLE_KEY: f"{ctx.target.source_name or ctx.target.source_uuid}:{ctx.target.name}",
            c.WINDOW_START_KEY: _utc(inc["start_ts"]).isoformat(), c.WINDOW_END_KEY: _utc(inc["end_ts"]).isoformat(),
            c.GAP_ROWS_KEY: sg.gap_rows, c.GAP_PCT_KEY: sg.gap_pct,
            c.SLICES_JSON_KEY: dg.MetadataValue.json([sg.model_dump(mode="json")]),
            c.GAPS_KEY: metadata_table(rows, [("metric", "text"), ("slice", "text"), ("source", "float"), ("target", "float"),
                                             ("gap", "float"), ("gap_pct", "float"), ("datapoints", "int")]),
        },
    )
    return evaluation, incident, ctx


def _version(raw: Any) -> tuple[str, float] | None:
    """``(uuid, updated_ts)`` of a raw incident when both are usable, else None."""
    if not isinstance(raw, dict):
        return None
    uid, ts = raw.get("uuid"), raw.get("updated_ts")
    if not isinstance(uid, str) or not uid.strip() or len(uid) > MAX_UUID_LENGTH:
        return None
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return None
    return uid, float(ts)


def _parse(raw: Any) -> tuple[str, float, dict | LightupError]:
    """``(id, updated_ts, incident or the reason it is malformed)`` of one raw list item.

    A malformed item without a usable uuid and ``updated_ts`` gets the id ``malformed-<hash of its
    content>`` and the time 0 (below any watermark, so it is reported once).
    """
    version = _version(raw)
    problem: LightupError | None = None
    if version is None:
        try:
            text = json.dumps(raw, sort_keys=True, default=str)
        except (TypeError, ValueError, RecursionError):
            text = repr(raw)
        version = ("malformed-" + hashlib.sha256(text.encode()).hexdigest()[:12], 0.0)
        uid = raw.get("uuid") if isinstance(raw, dict) else None
        problem = LightupError(f"malformed incident {str(uid)[:60]!r}: missing or mistyped uuid or updated_ts "
                               f"(a string of at most {MAX_UUID_LENGTH} characters and a finite number)")
    else:
        try:
            validate_incident(raw)
        except LightupError as e:
            problem = e
    return version[0], version[1], (problem if problem is not None else raw)


def dedupe_incidents(raw_incidents: Sequence[Any]) -> tuple[list[tuple[str, float, dict | LightupError]], list[tuple[str, float]]]:
    """One entry per incident of one list answer, oldest ``(updated_ts, id)`` first.

    Lightup's answer may carry an incident twice (the same version, or an older one next to the
    newest, as a lagging replica answers): the newest version is kept (on a tie a well-formed copy).

    Returns:
        ``(id, updated_ts, incident or why it is malformed)`` per incident, and the ``(id,
        updated_ts)`` of the older versions dropped (to be marked handled).
    """
    best: dict[str, tuple[float, dict | LightupError]] = {}
    dropped: set[tuple[str, float]] = set()
    for raw in raw_incidents:
        ident, ts, item = _parse(raw)
        cur = best.get(ident)
        if cur is None:
            best[ident] = (ts, item)
            continue
        if (ts, isinstance(item, dict)) > (cur[0], isinstance(cur[1], dict)):
            if cur[0] != ts:
                dropped.add((ident, cur[0]))
            best[ident] = (ts, item)
        elif ts != cur[0]:
            dropped.add((ident, ts))
    entries = sorted(((i, ts, item) for i, (ts, item) in best.items()), key=lambda e: (e[1], e[0]))
    return entries, sorted(dropped, key=lambda d: (d[1], d[0]))


#: how a per-incident failure is counted (see :func:`_failure_kind`)
PERMANENT, TRANSIENT, AUTH = "permanent", "transient", "auth"


def _failure_kind(e: BaseException) -> str:
    """``auth`` (the session, not the incident: stop the tick), ``transient`` (5xx, 429, 408, no
    answer: counted only while Lightup answers otherwise) or ``permanent`` (the incident itself: a
    4xx on its monitor or metric, a malformed answer, not a compare metric, an unmapped table...)."""
    if isinstance(e, LightupCredentialError):
        return AUTH
    if isinstance(e, HttpApiError):
        if e.status == 401:
            return AUTH
        if e.status is None or e.status in (408, 429) or e.status >= 500:
            return TRANSIENT
        return PERMANENT
    if isinstance(e, (httpx.HTTPError, OSError, TimeoutError)):
        return TRANSIENT
    return PERMANENT


def _window(raw: Mapping[str, Any]) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The incident's ``start_ts``/``end_ts`` as UTC datetimes, None where unusable."""
    out = []
    for k in ("start_ts", "end_ts"):
        v = raw.get(k)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 1e11
        out.append(_utc(v) if ok else None)
    return out[0], out[1]


def _incident_event(incident: Incident, description: str, uid: str) -> dg.AssetObservation:
    """The ``dw/incident`` observation of a Lightup incident (with its Lightup uuid)."""
    obs = incident_observation(incident, description)
    return dg.AssetObservation(asset_key=obs.asset_key, description=obs.description,
                               metadata={**obs.metadata, LIGHTUP_ID_KEY: uid})


def quarantine_lightup_incident(instance: dg.DagsterInstance, raw: Mapping[str, Any], *, uid: str, updated_ts: float,
                                tries: int, error: BaseException, asset: dg.AssetKey | None, check_name: str,
                                url: str | None = None) -> dg.AssetObservation:
    """Give up on one Lightup incident version that failed ``tries`` times.

    Records it in the ledger as an incident of its own in state ``quarantined`` (source
    ``lightup``, the uuid as external id, a summary naming the error; unless the ledger already
    holds an incident for that uuid), adds a ``ledger.quarantine`` entry
    ``lightup:<uuid>:<updated_ts>`` and returns the observation that shows it on ``asset`` (the
    ``dw_control`` asset when the incident never reached an asset, e.g. an unmapped table).

    Raises:
        Exception: the ledger refused the writes (the caller retries on the next tick).
    """
    target = asset or CONTROL_ASSET
    led = ledger_for(instance)
    what = f"{type(error).__name__}: {error}"
    reason = f"Lightup incident {uid} (updated_ts {updated_ts!r}) not handled after {tries} tries: {what}"
    start, end = _window(raw)
    inc = Incident(id=lightup_incident_id(uid), asset_key=list(target.path), source="lightup", check_name=check_name,
                   detected_at=utcnow(), summary=f"quarantined: {reason}"[:2000], external_id=uid, external_url=url,
                   window_start=start, window_end=end)
    new = led.record_incident(incident_id=inc.id, asset_key=asset_str(target), source="lightup", external_id=uid,
                              body=inc.model_dump_json(), state=QUARANTINED)
    incident_id = inc.id if new else getattr(led.incident_by_external("lightup", uid), "incident_id", inc.id)
    led.quarantine(f"lightup:{uid}:{updated_ts!r}", "lightup_incident", asset_str(target), reason)
    detail = {"ref": f"lightup:{uid}:{updated_ts!r}", "kind": "lightup_incident", "asset": asset_str(target),
              "reason": reason[:4000], "incident_id": incident_id, "lightup_incident": uid, "updated_ts": updated_ts,
              "tries": tries, "recorded_as_quarantined": new}
    return dg.AssetObservation(
        asset_key=target,
        description=(f"Lightup incident {uid} quarantined after {tries} tries (incident {incident_id}"
                     f"{'' if new else ', already recorded'}): {what}")[:1000],
        metadata={QUARANTINED_KEY: dg.MetadataValue.json(detail), c.INCIDENT_ID_KEY: incident_id, LIGHTUP_ID_KEY: uid,
                  c.LIGHTUP_UPDATED_TS_KEY: updated_ts, **({c.LIGHTUP_URL_KEY: dg.MetadataValue.url(url)} if url else {})})


@public
def build_lightup_incident_sensor(
    *,
    table_assets: Mapping[str, Any],
    diagnosis_job_name: str | None = None,
    check_name: str = DEFAULT_CHECK,
    resource_key: str = "lightup",
    metric_uuids: Sequence[str] | None = None,
    domains: DomainsSource = None,
    name: str = c.LIGHTUP_SENSOR,
    minimum_interval_seconds: int = 60,
    overlap_seconds: float = DEFAULT_OVERLAP_SECONDS,
    initial_lookback_seconds: float = 7 * 86400,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor that picks up Lightup compare-metric incidents exactly once (see the module docstring).

    Args:
        table_assets: Lightup table → Dagster asset key (``AssetKey``, ``"a/b"`` or a list of
            parts). Keys are ``"<datasource uuid or name>:<schema>.<table>"`` or ``"<schema>.<table>"``.
        diagnosis_job_name: the job built by :func:`dw_dagster.diagnosis.job.build_diagnosis_job`;
            None reports check evaluations only (no incident is recorded, except a quarantined one).
        check_name: the asset check the incidents are reported as (declare it with
            :func:`build_lightup_compare_check`).
        resource_key: key of the :class:`~dw_dagster.integrations.lightup.LightupResource`.
        metric_uuids: only incidents of these compare metrics (``metric_uuids`` filter); None = all.
        domains: the domains (autonomy L0 records incidents without diagnosing them); default
            ``$DW_DOMAINS_FILE``. Read once per tick; a broken file skips the tick (cursor kept).
        name: sensor name.
        minimum_interval_seconds: seconds between ticks.
        overlap_seconds: seconds re-read below the watermark on every poll, for incidents that
            become visible after later-stamped ones were read (already handled versions are
            skipped). Default :data:`DEFAULT_OVERLAP_SECONDS` (300 s, one Lightup polling
            interval); an incident that becomes visible more than this long after its
            ``updated_ts`` can still be missed.
        initial_lookback_seconds: how far back the first tick reads (seconds; default 7 days,
            the Lightup MCP tools' default lookback).
        max_attempts: ticks an incident version may fail before it is quarantined (recorded as a
            ``quarantined`` incident and a ledger quarantine entry, shown on its asset or on
            ``dw_control``) and the cursor moves past it. A tick in which Lightup does not answer
            counts for no incident.
        default_status: STOPPED unless told otherwise.

    Returns:
        A ``SensorDefinition`` whose cursor is JSON ``{"updated_ts", "last_id", "handled"}`` plus
        ``"attempts"`` while versions are failing; an unreadable cursor is logged ("Starting from
        scratch") and replaced (incidents are still recorded and diagnosed once: the ledger knows
        them by uuid).

    Raises:
        ValueError: ``max_attempts`` below 1 or a negative ``overlap_seconds``.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    if overlap_seconds < 0:
        raise ValueError(f"overlap_seconds must not be negative, got {overlap_seconds}")
    mapping = {k: _asset_key(v) for k, v in table_assets.items()}
    settings = _LightupSensorSettings(
        mapping=mapping, mapped_assets=sorted(set(mapping.values()), key=lambda k: k.to_user_string()),
        diagnosis_job_name=diagnosis_job_name, check_name=check_name, resource_key=resource_key,
        metric_uuids=metric_uuids, domains=domains, overlap_seconds=overlap_seconds,
        initial_lookback_seconds=initial_lookback_seconds, max_attempts=max_attempts)
    confirmed: set[str] = set()  # incidents whose dw/incident observation this process found stored

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               required_resource_keys={resource_key},
               job_name=diagnosis_job_name,
               description="Reports Lightup compare-metric incidents as asset check evaluations and launches "
               "their diagnosis; never loses or repeats an incident.")
    def _sensor(context: dg.SensorEvaluationContext):
        try:
            return _LightupTick(settings, context, confirmed).run()
        except Exception as e:  # noqa: BLE001 - a tick never raises; the cursor stays where it was
            context.log.exception("Lightup incident sensor tick failed")
            return dg.SkipReason(f"Lightup incident sensor failed; cursor kept: {type(e).__name__}: {e}"[:1000])

    return _sensor


@dataclass(frozen=True)
class _LightupSensorSettings:
    """What :func:`build_lightup_incident_sensor` was given, for each tick."""

    mapping: Mapping[str, dg.AssetKey]
    mapped_assets: Sequence[dg.AssetKey]
    diagnosis_job_name: str | None
    check_name: str
    resource_key: str
    metric_uuids: Sequence[str] | None
    domains: DomainsSource
    overlap_seconds: float
    initial_lookback_seconds: float
    max_attempts: int


class _LightupTick:
    """One tick of the Lightup incident sensor: read the incident versions since the cursor, report
    and record each new one (or count its failure, quarantining it after ``max_attempts``), advance
    the cursor past what is done, and ask for the re-diagnoses due."""

    def __init__(self, settings: _LightupSensorSettings, context: dg.SensorEvaluationContext,
                 confirmed: set[str] | None = None) -> None:
        self.s, self.context, self.instance = settings, context, context.instance
        self.confirmed = confirmed if confirmed is not None else set()
        self.events: list = []
        self.requests: list[dg.RunRequest] = []
        self.done: list[tuple[str, float]] = []
        self.failed: list[tuple[str, float]] = []
        self.problems: list[str] = []
        self.evidence: dict[str, str] = {}
        self.stopped: str | None = None
        self.probe: list[bool] = []  # Lightup's health, asked once per tick after a transient failure

    def run(self):
        s, context = self.s, self.context
        self.lightup: LightupResource = getattr(context.resources, s.resource_key)
        try:
            self.resolved = resolve_domains(s.domains) if s.diagnosis_job_name else None
        except Exception as e:  # noqa: BLE001 - configuration: every incident would fail the same way
            context.log.error(f"domains unusable: {e}")
            return dg.SkipReason(f"domains unusable (fix the domains file); cursor kept: {e}"[:1000])
        cursor = self.cursor = UpdatedTsCursor.loads(context.cursor, overlap_s=s.overlap_seconds, warn=context.log.warning)
        now = time.time()
        try:
            self.client = self.lightup.get_client()
            raw_incidents = self.client.list_incidents(
                start_updated_ts=cursor.poll_from(now - s.initial_lookback_seconds), end_updated_ts=now,
                metric_uuids=s.metric_uuids)
        except LightupCredentialError as e:  # configuration, not an outage: said as such
            context.log.error(f"Lightup credentials unusable: {e}")
            return dg.SkipReason(f"Lightup credentials unusable (fix the configuration); cursor kept: {e}"[:1000])
        except (HttpApiError, LightupError) as e:  # an outage: try again next tick, cursor unchanged
            context.log.warning(f"Lightup not reachable: {e}")
            return dg.SkipReason(f"Lightup not reachable; cursor kept: {e}"[:1000])
        entries, dropped = dedupe_incidents(raw_incidents if isinstance(raw_incidents, list) else [])
        self.done += dropped
        self.led = ledger_for(self.instance)
        for uid, ts, item in entries:
            self._handle(uid, ts, item)
        cursor.advance(self.done, self.failed, ceiling=now)
        if s.diagnosis_job_name:
            self._rediagnose()
        self._show_unshown()
        if not self.events and not self.requests:
            reason = "; ".join(self.problems) if self.problems else "no new Lightup incidents"
            return dg.SensorResult(skip_reason=reason[:1000], cursor=cursor.dumps())
        return dg.SensorResult(run_requests=self.requests, asset_events=self.events, cursor=cursor.dumps())

    def _answering(self) -> bool:
        if not self.probe:
            try:
                self.client.request("GET", HEALTH_PATH)
                self.probe.append(True)
            except Exception:  # noqa: BLE001 - any failure: not answering
                self.probe.append(False)
        return self.probe[0]

    def _handle(self, uid: str, ts: float, item) -> None:
        """One incident version: skipped, reported and recorded, or counted as failed."""
        cursor, context = self.cursor, self.context
        if cursor.is_handled(uid, ts):
            return
        if isinstance(item, LightupError):  # permanent: report once, skip, never block the others
            self.problems.append(str(item))
            context.log.error(f"Skipping a malformed Lightup incident: {item}")
            records.quarantine(self.instance, f"lightup:{uid}:{ts!r}", "lightup_incident", asset_str(CONTROL_ASSET), str(item))
            self.done.append((uid, ts))
            return
        newest = cursor.newest_handled(uid)
        if newest is not None and newest > ts:  # a stale copy of a version already superseded
            self.done.append((uid, ts))
            return
        if self.stopped is not None:  # Lightup stopped answering mid-tick: nothing more is tried
            self.failed.append((uid, ts))
            return
        seen: dict[str, Any] = {}
        try:
            evaluation, incident, _ = evaluate_incident(self.lightup, item, self.s.mapping, self.s.check_name, seen=seen)
        except Exception as e:  # noqa: BLE001 - one incident's failure never blocks the others
            self._not_evaluated(uid, ts, item, e, seen)
            return
        try:
            found = self._record(item, evaluation, incident, uid)
        except Exception as e:  # noqa: BLE001 - our own storage, not the incident: not counted as a try
            self.failed.append((uid, ts))
            self.problems.append(f"{uid}: not recorded: {e}")
            context.log.exception(f"Lightup incident {uid} could not be recorded (retried next tick)")
            return
        self.events.append(evaluation)
        self.events += found[0]
        self.requests += found[1]
        self.done.append((uid, ts))

    def _not_evaluated(self, uid: str, ts: float, item, e: Exception, seen: dict[str, Any]) -> None:
        """An incident version that could not be evaluated: Lightup down (the tick stops trying), a
        try counted, or quarantined after ``max_attempts``."""
        context, max_attempts = self.context, self.s.max_attempts
        kind = _failure_kind(e)
        if kind == AUTH or (kind == TRANSIENT and not self._answering()):
            self.stopped = (f"Lightup {'refused the session' if kind == AUTH else 'stopped answering'} "
                            f"while reading incident {uid}: {e}")
            self.failed.append((uid, ts))
            self.problems.append(self.stopped)
            context.log.warning(f"{self.stopped}; no incident counts this as a try, cursor kept")
            return
        tries = self.cursor.record_failure(uid, ts)
        if tries < max_attempts:
            self.failed.append((uid, ts))
            self.problems.append(f"{uid}: {e} (try {tries} of {max_attempts})")
            context.log.error(f"Lightup incident {uid} not handled (try {tries} of {max_attempts}, "
                              f"retried next tick): {type(e).__name__}: {e}")
            return
        try:
            url = None
            with contextlib.suppress(Exception):
                url = self.lightup.incident_url(uid)
            self.events.append(quarantine_lightup_incident(
                self.instance, item, uid=uid, updated_ts=ts, tries=tries, error=e, asset=seen.get("asset"),
                check_name=self.s.check_name, url=url))
            self.done.append((uid, ts))
            self.problems.append(f"{uid}: quarantined after {tries} tries: {e}")
            context.log.error(f"Lightup incident {uid} quarantined after {tries} tries: {type(e).__name__}: {e}")
        except Exception as qe:  # noqa: BLE001 - our storage: retried next tick
            self.failed.append((uid, ts))
            self.problems.append(f"{uid}: could not be quarantined: {qe}")
            context.log.exception(f"Lightup incident {uid} could not be quarantined")

    def _record(self, inc: Mapping[str, Any], evaluation: dg.AssetCheckEvaluation, incident: Incident,
                uid: str) -> tuple[list, list[dg.RunRequest]]:
        """The ledger side of one evaluated version: a new ongoing incident is recorded (linked to the
        asset's open incident if there is one) and, unless linked or at L0, diagnosed."""
        context, diagnosis_job_name = self.context, self.s.diagnosis_job_name
        asset = evaluation.asset_key
        known = self.led.incident_by_external("lightup", uid)
        if known is not None:
            if known.state == QUARANTINED:
                context.log.info(f"Lightup incident {uid} is quarantined as incident {known.incident_id}; "
                                 "its new version is reported, not diagnosed")
            return [], []
        if not inc.get("ongoing", True) or not diagnosis_job_name:
            return [], []
        recorded, existing = record_unless_open(context.instance, incident, link=True)
        if not recorded:
            return [], []
        if existing is not None:
            self.evidence[asset_str(asset)] = f"Lightup incident {uid} opened on the same asset"
            context.log.info(f"Lightup incident {uid} recorded as incident {incident.id}, linked to open incident "
                             f"{existing.id} on {asset.to_user_string()}: diagnosed when that one closes")
            return [_incident_event(incident, f"incident {incident.id} linked to incident {existing.id}: "
                                              f"{incident.summary}", uid)], []
        shown = [_incident_event(incident, f"incident {incident.id}: {incident.summary}", uid)]
        domain = domain_for(list(asset.path), self.resolved)
        if domain is not None and not domain.diagnoses:
            context.log.info(f"Lightup incident {uid} recorded; domain {domain.name} is at L0: no diagnosis")
            return shown, []
        return shown, [diagnosis_request(incident, diagnosis_run_key(incident.id, 0), diagnosis_job_name, {LIGHTUP_TAG: uid})]

    def _show_unshown(self) -> None:
        """Incidents recorded by a tick Dagster did not keep ("Test sensor"): their ``dw/incident`` observation
        now (one sensor ticks them; no other process stores a tick of it, so no grace is waited)."""
        shown_now = {str(getattr(e.metadata.get(c.INCIDENT_ID_KEY), "value", "")) for e in self.events
                     if isinstance(e, dg.AssetObservation) and c.INCIDENT_ID_KEY in e.metadata}
        try:
            for obs in unshown_incident_observations(self.instance, [asset_str(k) for k in self.s.mapped_assets],
                                                     ["lightup"], self.confirmed, skip=shown_now, grace_s=0.0):
                uid = (getattr(obs.metadata[c.INCIDENT_KEY], "value", None) or {}).get("external_id")
                self.events.append(dg.AssetObservation(asset_key=obs.asset_key, description=obs.description,
                                                       metadata={**obs.metadata, **({LIGHTUP_ID_KEY: uid} if uid else {})}))
        except Exception as e:  # noqa: BLE001 - never crash the tick
            self.problems.append(f"incidents never shown: {type(e).__name__}: {e}")
            self.context.log.exception("Lightup incident sensor: looking for incidents never shown failed")

    def _rediagnose(self) -> None:
        """The re-diagnoses due on the mapped assets (their domains diagnosing)."""
        try:
            assets = [asset_str(k) for k in self.s.mapped_assets
                      if (d := domain_for(list(k.path), self.resolved)) is None or d.diagnoses]
            again, notes = rediagnosis_requests(
                self.instance, assets, self.s.diagnosis_job_name, self.evidence, sources=["lightup"],
                already={r.run_key for r in self.requests},
                tags=lambda row: {LIGHTUP_TAG: row.external_id} if row.external_id else {})
            self.requests += again
            self.events += notes
        except Exception as e:  # noqa: BLE001 - never crash the tick
            self.problems.append(f"re-diagnosis: {type(e).__name__}: {e}")
            self.context.log.exception("Lightup incident sensor: re-diagnosis failed")


@public
def build_lightup_compare_check(
    *,
    asset: Any,
    compare_metric_uuids: Sequence[str],
    check_name: str = DEFAULT_CHECK,
    resource_key: str = "lightup",
    blocking: bool = False,
) -> dg.AssetChecksDefinition:
    """Declare ``check_name`` on ``asset``; run on demand it reads Lightup's ongoing incidents.

    The incident sensor reports the same check key from its ticks; running the check (UI, CI)
    asks Lightup directly: it fails while any incident of the compare metrics' monitors is
    ongoing, with one row per incident.

    Args:
        asset: the target asset (the compare metric's target table).
        compare_metric_uuids: the Lightup compare metrics watching it.
        check_name: the check name (the sensor's ``check_name``).
        resource_key: key of the :class:`~dw_dagster.integrations.lightup.LightupResource`.
        blocking: fail the run on a failed evaluation.

    Returns:
        An ``AssetChecksDefinition``.
    """
    key = _asset_key(asset)
    metrics = list(compare_metric_uuids)

    @dg.asset_check(asset=key, name=check_name, blocking=blocking, required_resource_keys={resource_key},
                    description="Lightup compare metrics between this asset and its source: fails while Lightup has "
                    "an ongoing incident on them.")
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        lightup: LightupResource = getattr(context.resources, resource_key)
        client = lightup.get_client()
        incidents = [i for i in client.list_incidents(start_ts=0, end_ts=time.time(), metric_uuids=metrics)
                     if isinstance(i, dict) and i.get("ongoing")]
        rows = [{"incident": i.get("uuid"), "slice": json.dumps(i.get("slice") or {}, sort_keys=True),
                 "start": _utc(i.get("start_ts") or 0).isoformat(), "end": _utc(i.get("end_ts") or 0).isoformat(),
                 "impact": i.get("impact")} for i in incidents]
        return dg.AssetCheckResult(
            passed=not incidents, severity=dg.AssetCheckSeverity.ERROR,
            description=f"{len(incidents)} ongoing Lightup incident(s) on {len(metrics)} compare metric(s)",
            metadata={c.ONGOING_INCIDENTS_KEY: len(incidents), c.INCIDENTS_KEY: metadata_table(
                rows, [("incident", "text"), ("slice", "text"), ("start", "text"), ("end", "text"), ("impact", "int")])})

    return _check
