"""Lightup compare-metric incidents → Dagster asset check evaluations and diagnosis runs.

:func:`build_lightup_incident_sensor` polls ``GET /api/v0/ws/{ws}/incidents/`` by
``updated_ts`` with the cursor of :mod:`dw_dagster.cursors` (``PUBLIC_CASES.md`` C20/C21): every
incident version is handled exactly once, one incident's failure never blocks the others, and the
cursor never moves past an incident that was not handled. For each incident version it

1. resolves the incident to its compare metric and table pair (:meth:`LightupClient.compare_context`),
2. maps the target table to a Dagster asset (``table_assets``; an unmapped table is an error
   naming the table, retried on the next tick once the mapping is fixed),
3. computes the gap per metric pair from the source and target datapoints for the incident's
   slice and window,
4. reports an ``AssetCheckEvaluation`` of ``check_name`` on the target asset (failed while the
   incident is ongoing, passed once Lightup closes it), with the numbers as metadata, and
5. for an ongoing incident with no open dw_dagster incident on the asset, records a
   :class:`~dw_dagster.models.Incident` (``source="lightup"``) and requests a run of the diagnosis
   job. Run keys are ``lightup:<incident uuid>:<updated_ts>``.

A malformed incident (missing ``uuid``, ``updated_ts``, ``filter_uuid``...) is reported once in
the tick's log and skip reason and then skipped. An API outage leaves the cursor where it was. The
tick itself never raises.

:func:`build_lightup_compare_check` declares the same check on the asset so the UI lists it and
it can run on demand (it reads Lightup's open incidents for the compare metrics).
"""

import datetime as dt
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from dw_dagster import constants as c
from dw_dagster.checks.metadata import metadata_table
from dw_dagster.cursors import UpdatedTsCursor
from dw_dagster.domains import domain_for
from dw_dagster.http import HttpApiError
from dw_dagster.lightup import (
    CompareContext,
    CompareGap,
    LightupCredentialError,
    LightupError,
    LightupResource,
    validate_incident,
)
from dw_dagster.models import Incident, SliceGap, utcnow
from dw_dagster.remediation.sensors import DIAGNOSE_OP, open_incident

DEFAULT_CHECK = "lightup_compare"
LIGHTUP_ID_KEY = "dw/lightup_incident"


class UnmappedTableError(LightupError):
    """A Lightup table has no Dagster asset in ``table_assets``."""


def _asset_key(value: Any) -> dg.AssetKey:
    if isinstance(value, dg.AssetKey):
        return value
    if isinstance(value, str):
        return dg.AssetKey.from_user_string(value)
    return dg.AssetKey(list(value))


def map_table(table_assets: Mapping[str, dg.AssetKey], table: Any) -> dg.AssetKey:
    """The asset of a :class:`~dw_dagster.lightup.LightupTable`, by ``"<source uuid or name>:<schema.table>"``
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
    lightup: LightupResource, raw: Mapping[str, Any], table_assets: Mapping[str, dg.AssetKey], check_name: str
) -> tuple[dg.AssetCheckEvaluation, Incident, CompareContext]:
    """Turn one Lightup incident version into a check evaluation and a dw_dagster incident.

    Raises:
        LightupError: malformed incident, not a compare metric, unmapped table.
        HttpApiError: API failures while resolving it.
    """
    inc = validate_incident(dict(raw))
    client = lightup.get_client()
    ctx = client.compare_context(inc)
    target = map_table(table_assets, ctx.target)
    slice_ = dict(inc.get("slice") or {})
    gaps = client.compare_gaps(ctx, slice_, inc["start_ts"], inc["end_ts"])
    sg = _slice_gap(gaps, slice_)
    ongoing = bool(inc.get("ongoing", True))
    url = lightup.incident_url(inc["uuid"])
    where = ", ".join(f"{k}={v}" for k, v in slice_.items()) or "whole table"
    window = f"{_utc(inc['start_ts']):%Y-%m-%d %H:%M}..{_utc(inc['end_ts']):%Y-%m-%d %H:%M} UTC"
    summary = (f"Lightup incident on {ctx.metric_name} ({where}, {window}): target {sg.gap_rows:+,} rows vs "
               f"source ({sg.gap_pct:+.2f} %)" + ("" if ongoing else "; closed by Lightup"))
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
            LIGHTUP_ID_KEY: inc["uuid"], "dw/lightup_url": dg.MetadataValue.url(url),
            "dw/lightup_updated_ts": float(inc["updated_ts"]), "dw/lightup_ongoing": ongoing,
            "dw/lightup_status": int(inc.get("status") or 1), "dw/compare_metric": ctx.metric_name,
            "dw/source_table": f"{ctx.source.source_name or ctx.source.source_uuid}:{ctx.source.name}",
            "dw/target_table": f"{ctx.target.source_name or ctx.target.source_uuid}:{ctx.target.name}",
            "dw/window_start": _utc(inc["start_ts"]).isoformat(), "dw/window_end": _utc(inc["end_ts"]).isoformat(),
            "dw/gap_rows": sg.gap_rows, "dw/gap_pct": sg.gap_pct,
            "dw/slices_json": dg.MetadataValue.json([sg.model_dump(mode="json")]),
            "dw/gaps": metadata_table(rows, [("metric", "text"), ("slice", "text"), ("source", "float"), ("target", "float"),
                                             ("gap", "float"), ("gap_pct", "float"), ("datapoints", "int")]),
        },
    )
    return evaluation, incident, ctx


def _known_lightup_incident(instance: dg.DagsterInstance, asset_key: dg.AssetKey, incident_id: str) -> bool:
    from dw_dagster.remediation import records

    return any(i.id == incident_id for i in records.incidents(instance, [asset_key]))


def build_lightup_incident_sensor(
    *,
    table_assets: Mapping[str, Any],
    diagnosis_job_name: str | None = None,
    check_name: str = DEFAULT_CHECK,
    resource_key: str = "lightup",
    metric_uuids: Sequence[str] | None = None,
    name: str = "dw_lightup_incident_sensor",
    minimum_interval_seconds: int = 60,
    overlap_seconds: float = 0.0,
    initial_lookback_seconds: float = 7 * 86400,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor that picks up Lightup compare-metric incidents (see the module docstring).

    Args:
        table_assets: Lightup table → Dagster asset key (``AssetKey``, ``"a/b"`` or a list of
            parts). Keys are ``"<datasource uuid or name>:<schema>.<table>"`` or ``"<schema>.<table>"``.
        diagnosis_job_name: the job built by :func:`dw_dagster.diagnosis.build_diagnosis_job`;
            None reports check evaluations only.
        check_name: the asset check the incidents are reported as (declare it with
            :func:`build_lightup_compare_check`).
        resource_key: key of the :class:`~dw_dagster.lightup.LightupResource`.
        metric_uuids: only incidents of these compare metrics (``metric_uuids`` filter); None = all.
        minimum_interval_seconds: seconds between ticks.
        overlap_seconds: seconds re-read below the cursor on every poll, for incidents that become
            visible late (handled versions are still skipped).
        initial_lookback_seconds: how far back the first tick reads (seconds; default 7 days,
            the Lightup MCP tools' default lookback).
        default_status: STOPPED unless told otherwise.

    Returns:
        A ``SensorDefinition`` whose cursor is JSON ``{"updated_ts", "last_id", "handled"}``; an
        unreadable cursor is logged ("Starting from scratch") and replaced.
    """
    mapping = {k: _asset_key(v) for k, v in table_assets.items()}

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               required_resource_keys={resource_key},
               job_name=diagnosis_job_name,
               description="Reports Lightup compare-metric incidents as asset check evaluations and launches "
               "their diagnosis; never loses or repeats an incident.")
    def _sensor(context: dg.SensorEvaluationContext):
        lightup: LightupResource = getattr(context.resources, resource_key)
        cursor = UpdatedTsCursor.loads(context.cursor, overlap_s=overlap_seconds, warn=context.log.warning)
        now = time.time()
        try:
            raw_incidents = lightup.get_client().list_incidents(
                start_updated_ts=cursor.poll_from(now - initial_lookback_seconds), end_updated_ts=now,
                metric_uuids=metric_uuids)
        except LightupCredentialError as e:  # configuration, not an outage: said as such
            context.log.error(f"Lightup credentials unusable: {e}")
            return dg.SkipReason(f"Lightup credentials unusable (fix the configuration); cursor kept: {e}"[:1000])
        except (HttpApiError, LightupError) as e:  # an outage: try again next tick, cursor unchanged
            context.log.warning(f"Lightup not reachable: {e}")
            return dg.SkipReason(f"Lightup not reachable; cursor kept: {e}"[:1000])

        def order(i: Any) -> tuple:
            return (float(i.get("updated_ts") or 0) if isinstance(i, dict) and isinstance(i.get("updated_ts"), (int, float)) else 0.0,
                    str(i.get("uuid")) if isinstance(i, dict) else "")

        events, requests, done, failed, problems = [], [], [], [], []
        for raw in sorted(raw_incidents, key=order):
            try:
                inc = validate_incident(raw)
            except LightupError as e:  # permanent: report once, skip, never block the others
                ident = (raw.get("uuid") if isinstance(raw, dict) and isinstance(raw.get("uuid"), str) else None) or \
                    "malformed-" + hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:12]
                ts = order(raw)[0]
                if not cursor.is_handled(ident, ts):
                    problems.append(str(e))
                    context.log.error(f"Skipping a malformed Lightup incident: {e}")
                    done.append((ident, ts))
                continue
            uid, ts = inc["uuid"], float(inc["updated_ts"])
            if cursor.is_handled(uid, ts):
                continue
            try:
                evaluation, incident, _ = evaluate_incident(lightup, inc, mapping, check_name)
                events.append(evaluation)
                asset = evaluation.asset_key
                if (inc.get("ongoing", True) and diagnosis_job_name
                        and not _known_lightup_incident(context.instance, asset, incident.id)):
                    existing = open_incident(context.instance, asset)
                    domain = domain_for(list(asset.path))
                    if domain is not None and not domain.diagnoses:
                        events.append(dg.AssetObservation(
                            asset_key=asset, description=f"incident {incident.id}: {incident.summary}"[:1000],
                            metadata={c.INCIDENT_KEY: dg.MetadataValue.json(incident.model_dump(mode="json")),
                                      c.INCIDENT_ID_KEY: incident.id, LIGHTUP_ID_KEY: uid}))
                        context.log.info(f"Lightup incident {uid} recorded; domain {domain.name} is at L0: no diagnosis")
                    elif existing is not None:
                        context.log.info(f"Lightup incident {uid}: {asset.to_user_string()} already has open "
                                         f"incident {existing.id}; reported, not diagnosed again")
                    else:
                        events.append(dg.AssetObservation(
                            asset_key=asset, description=f"incident {incident.id}: {incident.summary}"[:1000],
                            metadata={c.INCIDENT_KEY: dg.MetadataValue.json(incident.model_dump(mode="json")),
                                      c.INCIDENT_ID_KEY: incident.id, LIGHTUP_ID_KEY: uid}))
                        requests.append(dg.RunRequest(
                            run_key=f"lightup:{uid}:{ts!r}", job_name=diagnosis_job_name,
                            run_config={"ops": {DIAGNOSE_OP: {"config": {"incident_json": incident.model_dump_json()}}}},
                            tags={c.INCIDENT_TAG: incident.id, "dw/lightup_incident": uid}))
                done.append((uid, ts))
            except Exception as e:  # noqa: BLE001 - one incident's failure never blocks the others
                failed.append((uid, ts))
                problems.append(f"{uid}: {e}")
                context.log.error(f"Lightup incident {uid} not handled (retried next tick): {type(e).__name__}: {e}")
        cursor.advance(done, failed)
        if not events and not requests:
            reason = "; ".join(problems) if problems else "no new Lightup incidents"
            return dg.SensorResult(skip_reason=reason[:1000], cursor=cursor.dumps())
        return dg.SensorResult(run_requests=requests, asset_events=events, cursor=cursor.dumps())

    return _sensor


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
        resource_key: key of the :class:`~dw_dagster.lightup.LightupResource`.
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
            metadata={"dw/ongoing_incidents": len(incidents), "dw/incidents": metadata_table(
                rows, [("incident", "text"), ("slice", "text"), ("start", "text"), ("end", "text"), ("impact", "int")])})

    return _check
