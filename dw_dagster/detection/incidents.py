"""Detect: each new failing evaluation of a watched asset check becomes exactly one incident and one diagnosis run.

``build_check_incident_sensor`` turns each new failing evaluation of a watched asset check into
exactly one :class:`~dw_dagster.core.models.Incident` (recorded in the ledger and shown as an
``AssetObservation`` with ``dw/incident``) and one run of the diagnosis job. While an asset has an
open incident, later failures on it do not open another; when that incident's diagnosis *failed*,
or its change set ended without a proven repair (rejected, expired, the repair failed or its receipt
did not verify: ``unrepaired``), a new failure is new evidence and the incident is diagnosed again
(as is an incident a person asked to re-diagnose with ``dw-dagster incidents rediagnose``).

A diagnosis request is owed until the diagnosis starts: every tick requests it again, with a run
key that depends only on the ledger (:func:`diagnosis_run_key`), for each incident still waiting
(:func:`rediagnosis_requests`). A tick whose run requests were lost, or a "Test sensor" evaluation
that recorded the incident without launching anything, is made good by the next tick; the daemon
de-duplicates run keys per sensor, so each diagnosis is launched once.
"""

import datetime as dt
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import dagster as dg

from dw_dagster.core.links import describe
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.domains import DomainsSource, domain_for
from dw_dagster.core.ledger import (
    DIAGNOSIS_FAILED,
    OPEN,
    OPEN_INCIDENT_STATES,
    REDIAGNOSE,
    UNREPAIRED,
    IncidentRow,
    asset_str,
    ledger_for,
)
from dw_dagster.core.models import Incident, SliceGap, stable_hash, utcnow
from dw_dagster.dagster_private import public

DIAGNOSE_OP = c.DIAGNOSE_OP
#: incident sources whose diagnosis the check-incident sensor requests (Lightup and the volume
#: sensor request their own: the daemon de-duplicates run keys per sensor)
CHECK_SOURCES = ("dw_check", "manual")
#: incident states that new evidence sends back to diagnosis: its diagnosis failed, or its change set
#: ended without a proven repair (rejected, expired, failed, not verified)
REDIAGNOSABLE = (DIAGNOSIS_FAILED, UNREPAIRED)


def _parse_cursor(context: dg.SensorEvaluationContext) -> dict[str, int]:
    if not context.cursor:
        return {}
    try:
        data = json.loads(context.cursor)
        if isinstance(data, dict) and all(isinstance(v, int) for v in data.values()):
            return data
    except ValueError:
        pass
    context.log.warning(f"Failed to interpret cursor {context.cursor[:80]!r}. Starting from scratch.")
    return {}


def open_incident(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> Incident | None:
    """The newest incident on ``asset_key`` that is still open (one indexed ledger lookup)."""
    row = ledger_for(instance).open_incident(asset_str(asset_key))
    if row is None:
        return None
    try:
        return Incident.model_validate_json(row.body)
    except ValueError as e:
        records.quarantine(instance, f"incident:{row.incident_id}", "incident", row.asset_key, str(e))
        return None


def incident_observation(inc: Incident, description: str | None = None) -> dg.AssetObservation:
    """The ``dw/incident`` observation that shows an incident on its asset."""
    return dg.AssetObservation(
        asset_key=dg.AssetKey(inc.asset_key), description=describe(description or f"incident {inc.id}: {inc.summary}", incident_id=inc.id),
        metadata={c.INCIDENT_KEY: dg.MetadataValue.json(inc.model_dump(mode="json")), c.INCIDENT_ID_KEY: inc.id})


def record_incident(instance: dg.DagsterInstance, inc: Incident, *, linked_to: str | None = None) -> bool:
    """Record ``inc`` in the ledger once (by id, and by its source's external id); True when new."""
    return ledger_for(instance).record_incident(
        incident_id=inc.id, asset_key=asset_str(inc.asset_key), source=inc.source, external_id=inc.external_id,
        body=inc.model_dump_json(), linked_to=linked_to)


def record_unless_open(instance: dg.DagsterInstance, inc: Incident, *,
                       link: bool = False) -> tuple[bool, Incident | None]:
    """Record ``inc`` unless an incident is open on its asset, atomically (the ledger's asset lock).

    Args:
        instance: the Dagster instance (its ledger).
        inc: the new incident.
        link: when one is open, record ``inc`` linked to it (True) or not at all (False).

    Returns:
        ``(recorded, open_incident)``: whether ``inc`` was recorded (False too when its id or
        external id is known), and the open incident found on the asset, None when there was none
        (or its stored body no longer parses: it is quarantined, as :func:`open_incident` does).
    """
    recorded, row = ledger_for(instance).record_incident_unless_open(
        incident_id=inc.id, asset_key=asset_str(inc.asset_key), source=inc.source, external_id=inc.external_id,
        body=inc.model_dump_json(), link=link)
    return recorded, _parsed(instance, row)


def record_all_unless_open(instance: dg.DagsterInstance, incs: Sequence[Incident]) -> list[tuple[bool, Incident | None]]:
    """:func:`record_unless_open` for many incidents (a tick's anomalies), 200 to a ledger transaction.

    Returns:
        ``(recorded, open_incident)`` per incident, in order; an incident whose asset an earlier one
        of ``incs`` names is not recorded and finds that one open.
    """
    rows = ledger_for(instance).record_incidents_unless_open([
        {"incident_id": inc.id, "asset_key": asset_str(inc.asset_key), "source": inc.source,
         "external_id": inc.external_id, "body": inc.model_dump_json()} for inc in incs])
    return [(recorded, _parsed(instance, row)) for recorded, row in rows]


def _parsed(instance: dg.DagsterInstance, row) -> Incident | None:
    """The incident a ledger row holds; None for no row, or a body that no longer parses (quarantined)."""
    if row is None:
        return None
    try:
        return Incident.model_validate_json(row.body)
    except ValueError as e:
        records.quarantine(instance, f"incident:{row.incident_id}", "incident", row.asset_key, str(e))
        return None


def incident_shown(instance: dg.DagsterInstance, incident_id: str, asset_key: dg.AssetKey, *, min_age_s: float = 0.0,
                   limit: int = 10_000) -> bool:
    """Whether the event log holds the ``dw/incident`` observation of ``incident_id`` on ``asset_key``.

    A detector records an incident in the ledger during its tick, but Dagster keeps the tick's
    observations only with its result: a "Test sensor" evaluation (or a daemon that died first)
    records the incident and shows nothing, and the next real tick finds it open. It shows the
    incident when this returns False (the notification sensor pages from that observation).

    Reads the asset's observations from the incident's ``opened_at`` (the ledger's clock, less 5 s)
    on, oldest first, 1,000 a query, until it is found, at most ``limit``: the incident's
    observation is stored with the tick that opened it, after that tick's other observations of
    the asset (one per table mapped to it: hundreds, for a table sharded by store), so the cost
    grows with the observations since it opened, never with the whole event log.

    Args:
        instance: the Dagster instance (its ledger and event log).
        incident_id: the incident.
        asset_key: the asset it is on.
        min_age_s: an incident opened less than this many seconds ago counts as shown (the tick of
            another process that opened it may still be storing its result).
        limit: observations read at most.

    Returns:
        True when found, when younger than ``min_age_s``, or when the incident is not in the ledger.
    """
    row = ledger_for(instance).incident(incident_id)
    if row is None or time.time() - row.opened_at < min_age_s:
        return True
    records_filter = dg.AssetRecordsFilter(asset_key=asset_key, after_timestamp=row.opened_at - 5.0)
    cursor, read = None, 0
    while read < limit:
        res = instance.fetch_observations(records_filter, limit=min(1000, limit - read), cursor=cursor, ascending=True)
        for rec in res.records:
            obs = rec.asset_observation
            v = obs.metadata.get(c.INCIDENT_ID_KEY) if obs is not None else None
            if getattr(v, "value", v) == incident_id:
                return True
        read += len(res.records)
        if not res.has_more or not res.records:
            break
        cursor = res.cursor
    return False


#: seconds after it opened during which an incident missing from the event log is not shown again: the
#: tick of another process that opened it may still be storing its result
SHOWN_GRACE_S = 120.0


def unshown_incident_observations(instance: dg.DagsterInstance, asset_keys: Iterable[str], sources: Sequence[str],
                                  confirmed: set[str], *, skip: Iterable[str] = (),
                                  kept: Callable[[IncidentRow], bool | None] | None = None,
                                  grace_s: float = SHOWN_GRACE_S) -> list[dg.AssetObservation]:
    """The ``dw/incident`` observations a detection sensor still owes, looked for on every tick.

    A tick records an incident in the ledger, but Dagster stores the tick's observation only with
    its result: an incident opened by a "Test sensor" evaluation (or a tick whose daemon died before
    storing it) is open with nothing shown, and the notification sensor never pages it. Each open,
    unlinked incident of ``sources`` on ``asset_keys`` is settled once: found in the event log
    (:func:`incident_shown`), or ``kept(row)`` says True (the tick that showed it was kept), and it
    is added to ``confirmed`` and never looked at again; missing, and either ``kept(row)`` says
    False (this process showed it in a tick that was not kept) or it opened more than ``grace_s``
    seconds ago (the ledger's clock), its observation is returned to be shown now (and confirmed the
    next time); missing, unknown to this process and younger, it is looked at again next tick. One ledger query per tick plus
    an event-log read per incident not settled yet.

    Args:
        instance: the Dagster instance (ledger and event log).
        asset_keys: the assets the sensor watches (ledger text form, ``a/b``).
        sources: the incident sources the sensor owns.
        confirmed: incident ids known to be shown (the sensor's memory; updated).
        skip: incidents this tick shows or looked at already.
        kept: for incidents this process showed: whether the tick that showed them was kept (True/False);
            None for the others.
        grace_s: see above.

    Returns:
        The observations to show, one per incident.
    """
    watched, skipped, out = set(asset_keys), set(skip), []
    for row in ledger_for(instance).incidents(states=OPEN_INCIDENT_STATES):
        if (row.source not in sources or row.linked_to is not None or row.asset_key not in watched
                or row.incident_id in confirmed or row.incident_id in skipped):
            continue
        key = dg.AssetKey(row.asset_key.split("/"))
        ours = kept(row) if kept is not None else None
        if ours or incident_shown(instance, row.incident_id, key):
            confirmed.add(row.incident_id)
            continue
        if ours is None and time.time() - row.opened_at < grace_s:
            continue  # another process opened it moments ago: its tick may still be storing the observation
        try:
            inc = Incident.model_validate_json(row.body)
        except ValueError as e:
            records.quarantine(instance, f"incident:{row.incident_id}", "incident", row.asset_key, str(e))
            continue
        out.append(incident_observation(inc, f"incident {inc.id}: {inc.summary} (the tick that opened it was not kept)"))
    return out


def diagnosis_run_key(incident_id: str, attempts: int) -> str:
    """The run key of an incident's current diagnosis.

    It depends only on what the ledger holds, so the request re-emitted on every tick while the
    incident waits (:func:`rediagnosis_requests`) carries the same key: the daemon, which
    de-duplicates run keys per sensor, launches it once.

    Args:
        incident_id: the incident (``inc-…``, ``lu-…``).
        attempts: how many times it was asked to be diagnosed again (the ledger's ``attempts``).

    Returns:
        ``incident_id`` for the first diagnosis, ``<incident_id>:diagnose:<attempts>`` after.
    """
    return incident_id if attempts <= 0 else f"{incident_id}:diagnose:{attempts}"


def diagnosis_request(inc: Incident, run_key: str, job_name: str, tags: Mapping[str, str] | None = None) -> dg.RunRequest:
    """The diagnosis run of ``inc`` (config ``incident_json``; tag ``dw/incident_id`` plus ``tags``)."""
    return dg.RunRequest(run_key=run_key, job_name=job_name, tags={c.INCIDENT_TAG: inc.id, **(tags or {})},
                         run_config={"ops": {DIAGNOSE_OP: {"config": {"incident_json": inc.model_dump_json()}}}})


def mark_new_evidence(instance: dg.DagsterInstance, evidence: Mapping[str, str]) -> list[str]:
    """Ask again for the diagnosis of the incidents on assets with new evidence.

    Incidents (not linked) whose diagnosis failed, or whose change set ended without a proven
    repair (``unrepaired``), move to ``rediagnose`` by compare-and-set, the note saying why; the
    sensor that owns their source launches it (:func:`rediagnosis_requests`).

    Args:
        instance: the Dagster instance (its ledger).
        evidence: asset (ledger text form, ``a/b``) → what is new, e.g. "compare failed again".

    Returns:
        The ids of the incidents moved.
    """
    led = ledger_for(instance)
    moved = []
    for asset, why in evidence.items():
        for row in led.incidents(asset_key=asset, states=REDIAGNOSABLE):
            if row.linked_to is None and led.set_incident_state(row.incident_id, REDIAGNOSE, from_states=[row.state],
                                                                note=f"new evidence: {why}"):
                moved.append(row.incident_id)
    return moved


def rediagnosis_requests(instance: dg.DagsterInstance, asset_keys: Sequence[str], job_name: str,
                         evidence: Mapping[str, str] | None = None, *, sources: Sequence[str] | None = None,
                         may_diagnose: Callable[[str], bool] | None = None, already: Iterable[str] = (),
                         tags: Callable[[IncidentRow], Mapping[str, str]] | None = None,
                         ) -> tuple[list[dg.RunRequest], list[dg.AssetObservation]]:
    """The diagnosis requests a detection sensor owes, on every tick, for the incidents of ``asset_keys``.

    1. Incidents on assets with new ``evidence`` whose diagnosis failed, or whose change set ended
       without a proven repair, are asked again (:func:`mark_new_evidence`), whichever sensor owns them.
    2. Incidents of ``sources`` asked again (state ``rediagnose``: new evidence, ``dw-dagster
       incidents rediagnose``, the incident they were linked to closed) move to ``open`` with one
       more attempt, and their diagnosis is requested (with an ``incident ... diagnosed again``
       observation).
    3. Incidents of ``sources`` still ``open`` (recorded, their diagnosis requested but never
       started: a tick whose run requests were lost, a "Test sensor" evaluation, a run still
       queued) are requested again, with the same run key (:func:`diagnosis_run_key`), so the daemon
       launches each once.

    Args:
        instance: the Dagster instance (its ledger).
        asset_keys: the assets the sensor watches (ledger text form, ``a/b``).
        job_name: the diagnosis job.
        evidence: asset → what is new this tick.
        sources: the incident sources this sensor owns (``dw_check``, ``lightup``, ``volume_sensor``);
            None for all. Each incident is requested by one sensor, since the daemon de-duplicates
            run keys per sensor.
        may_diagnose: asset → whether its domain diagnoses (L0 does not); None: every asset.
        already: run keys this tick requests already (not repeated).
        tags: extra run tags for an incident's request.

    Returns:
        ``(run requests, observations)``.
    """
    if evidence:
        mark_new_evidence(instance, evidence)
    led = ledger_for(instance)
    seen = set(already)
    requests, events = [], []
    for asset in asset_keys:
        if may_diagnose is not None and not may_diagnose(asset):
            continue
        for row in sorted(led.incidents(asset_key=asset, states=[REDIAGNOSE, OPEN]), key=lambda r: r.opened_at):
            if row.linked_to is not None or (sources is not None and row.source not in sources):
                continue
            attempts = row.attempts
            if row.state == REDIAGNOSE:
                if not led.set_incident_state(row.incident_id, OPEN, from_states=[REDIAGNOSE], attempts_delta=1):
                    continue
                attempts += 1
            key = diagnosis_run_key(row.incident_id, attempts)
            if key in seen:
                continue
            try:
                inc = Incident.model_validate_json(row.body)
            except ValueError as e:
                records.quarantine(instance, f"incident:{row.incident_id}", "incident", row.asset_key, str(e))
                continue
            seen.add(key)
            requests.append(diagnosis_request(inc, key, job_name, tags(row) if tags is not None else None))
            if row.state == REDIAGNOSE:
                events.append(incident_observation(inc, f"incident {inc.id} diagnosed again: {row.note or 'asked by a person'}"))
    return requests, events


def _volume_days(md: dict) -> tuple[int, float, dt.datetime | None, dt.datetime | None]:
    """From a volume check's ``dw/days_json``: rows under (or over) the baseline mean on the days out
    of band (rounded), the worst deviation in %, and the half-open UTC window of those days."""

    days = [d for d in (records.metadata_json(md, c.DAYS_JSON_KEY) or [])
            if d.get("status") in ("low", "high", "no_rows") and d.get("mean") is not None]
    if not days:
        return 0, 0.0, None, None
    gap = round(sum(d["mean"] - d["rows"] for d in days))
    worst = max(days, key=lambda d: abs(d.get("deviation_pct") or 0.0))
    dates = sorted(dt.date.fromisoformat(d["day"]) for d in days)
    start = dt.datetime.combine(dates[0], dt.time(), tzinfo=dt.timezone.utc)
    end = dt.datetime.combine(dates[-1] + dt.timedelta(days=1), dt.time(), tzinfo=dt.timezone.utc)
    return gap, float(worst.get("deviation_pct") or 0.0), start, end


def incident_from_evaluation(check_key: dg.AssetCheckKey, evaluation: dg.AssetCheckEvaluation, record_id: int) -> Incident:
    """An incident from a failed check evaluation (slices taken from ``dw/slices_json`` when present).

    A volume check's failure (``dw/days_json``, no slices) gives the incident its days out of band
    as ``window_start``/``window_end``, the rows between those days' counts and their baseline
    means as ``gap_rows`` (positive when short) and the worst day's deviation as ``gap_pct``.
    """
    md = evaluation.metadata or {}
    slices = [SliceGap.model_validate(s) for s in (records.metadata_json(md, c.SLICES_JSON_KEY) or [])]
    failing = [s for s in slices if not s.passed]
    gap = sum(s.gap_rows for s in slices)
    worst = max(failing, key=lambda s: abs(s.gap_pct), default=None)
    summary = evaluation.description or f"check {check_key.name} failed"
    if not slices and c.DAYS_JSON_KEY in md:
        vgap, vpct, start, end = _volume_days(md)
        return Incident(
            id="inc-" + stable_hash([check_key.to_user_string(), record_id], 12), asset_key=list(check_key.asset_key.path),
            source="dw_check", check_name=check_key.name, detected_at=utcnow(), summary=summary, gap_rows=vgap,
            gap_pct=vpct, evaluation_id=record_id, window_start=start, window_end=end)
    return Incident(
        id="inc-" + stable_hash([check_key.to_user_string(), record_id], 12),
        asset_key=list(check_key.asset_key.path),
        source="dw_check",
        check_name=check_key.name,
        detected_at=utcnow(),
        summary=summary,
        slices=slices,
        gap_rows=gap,
        gap_pct=worst.gap_pct if worst else 0.0,
        evaluation_id=record_id,
    )


def _inconclusive(evaluation: dg.AssetCheckEvaluation) -> bool:
    from dw_dagster.checks.reconcile import INCONCLUSIVE_KEY

    flag = (evaluation.metadata or {}).get(INCONCLUSIVE_KEY)
    return bool(getattr(flag, "value", flag))


@public
def build_check_incident_sensor(
    *,
    check_keys: Sequence[dg.AssetCheckKey],
    diagnosis_job_name: str,
    domains: DomainsSource = None,
    name: str = c.CHECK_INCIDENT_SENSOR,
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor that opens one incident per new failing evaluation of ``check_keys`` and diagnoses it.

    Args:
        check_keys: the asset checks to watch (reconciliation, volume...).
        diagnosis_job_name: the job built by :func:`dw_dagster.diagnosis.job.build_diagnosis_job`.
        domains: the domains (autonomy L0 records incidents without diagnosing); default ``$DW_DOMAINS_FILE``.
        name: sensor name.
        minimum_interval_seconds: seconds between ticks.
        default_status: STOPPED unless told otherwise (remediation is opt-in).

    Returns:
        A ``SensorDefinition``. Its cursor is JSON ``{check key: last evaluation storage id}``;
        an unreadable cursor is logged and the sensor starts from scratch (incidents are still
        recorded once: their ids come from the evaluation, and the ledger refuses a second
        record). Two watched checks of one asset failing in the same tick (volume and dead
        letter) open one incident, from the first check in ``check_keys``. A failure on an asset
        whose open incident's diagnosis failed diagnoses that incident again.
    """
    keys = list(check_keys)
    hwm_key = f"check_incident_sensor:{name}"
    confirmed: set[str] = set()  # incidents whose dw/incident observation this process found stored

    @dg.sensor(name=name, job_name=diagnosis_job_name, minimum_interval_seconds=minimum_interval_seconds,
               default_status=default_status,
               description="Opens a dw_dagster incident for each new failing evaluation of the watched checks "
               "and launches its diagnosis.")
    def _sensor(context: dg.SensorEvaluationContext):
        led = ledger_for(context.instance)
        # the high-water marks live in the ledger: a cursor set by hand (setSensorCursor) moves nothing;
        # without them (a first tick) the cursor is read, and a mark ahead of the event log is ignored
        cursor = led.control(hwm_key) or _parse_cursor(context)
        from_ledger = led.control(hwm_key) is not None
        events, requests, errors = [], [], []
        opened: dict[dg.AssetKey, Incident] = {}  # incidents this tick opened
        evidence: dict[str, str] = {}
        for key in keys:
            skey = key.to_user_string()
            try:
                mark = cursor.get(skey)
                if mark is not None and not from_ledger and mark > _latest_record_id(context.instance, key):
                    context.log.warning(f"{skey}: the cursor's mark {mark} is ahead of the event log; ignored")
                    mark = None
                for rec in _new_evaluations(context.instance, key, mark):
                    evaluation = rec.event.dagster_event.event_specific_data if rec.event is not None else None
                    if not isinstance(evaluation, dg.AssetCheckEvaluation):
                        # planned or still running: the same record is updated with the evaluation
                        # later, so the mark must not move past it (it would skip the result)
                        break
                    cursor[skey] = rec.id
                    if evaluation.passed:
                        continue
                    if _inconclusive(evaluation):  # a table changed while read: no evidence either way
                        context.log.info(f"{skey}: evaluation {rec.id} is inconclusive; no incident")
                        continue
                    if not rec.run_id:  # reported without a run (GraphQL reportAssetCheckEvaluations): not evidence
                        context.log.info(f"{skey}: a failing evaluation reported without a run (record {rec.id}) is "
                                         "not evidence for an incident")
                        continue
                    existing = opened.get(key.asset_key) or open_incident(context.instance, key.asset_key)
                    if existing is not None:
                        context.log.info(f"{skey} failed again; incident {existing.id} is still open")
                        evidence[asset_str(key.asset_key)] = f"{skey} failed again (evaluation {rec.id})"
                        continue
                    inc = incident_from_evaluation(key, evaluation, rec.id)
                    recorded, raced = record_unless_open(context.instance, inc)
                    if raced is not None:  # another process opened one on this asset a moment ago
                        opened[key.asset_key] = raced
                        evidence[asset_str(key.asset_key)] = f"{skey} failed again (evaluation {rec.id})"
                        continue
                    opened[key.asset_key] = inc
                    if not recorded:
                        continue  # known already; if it still waits for its diagnosis, it is requested below
                    events.append(incident_observation(inc))
                    domain = domain_for(inc.asset_key, domains)
                    if domain is not None and not domain.diagnoses:
                        context.log.info(f"incident {inc.id} recorded; domain {domain.name} is at L0 (checks only): "
                                         "no diagnosis")
                        continue
                    requests.append(diagnosis_request(inc, diagnosis_run_key(inc.id, 0), diagnosis_job_name))
            except Exception as e:  # one check's failure never blocks the others, nor moves its mark past it
                errors.append(f"{skey}: {type(e).__name__}: {e}")
                context.log.exception(f"incident sensor failed on {skey}")
        led.set_control(hwm_key, cursor)
        assets = sorted({asset_str(k.asset_key) for k in keys})
        try:
            again, notes = rediagnosis_requests(context.instance, assets, diagnosis_job_name, evidence,
                                                sources=CHECK_SOURCES, may_diagnose=lambda a: _diagnoses(a, domains),
                                                already={r.run_key for r in requests})
            requests += again
            events += notes
        except Exception as e:  # noqa: BLE001 - never crash the tick
            errors.append(f"re-diagnosis: {type(e).__name__}: {e}")
        try:  # incidents opened by a tick Dagster did not keep ("Test sensor"): shown now (one sensor ticks them;
            # no other process stores a tick of it, so no grace is waited)
            events += unshown_incident_observations(context.instance, assets, CHECK_SOURCES, confirmed,
                                                    skip=[i.id for i in opened.values()], grace_s=0.0)
        except Exception as e:  # noqa: BLE001 - never crash the tick
            errors.append(f"incidents never shown: {type(e).__name__}: {e}")
        if errors and not requests:
            return dg.SensorResult(skip_reason="; ".join(errors)[:1000], cursor=json.dumps(cursor, sort_keys=True),
                                   asset_events=events)
        return dg.SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(cursor, sort_keys=True))

    return _sensor


def _new_evaluations(instance: dg.DagsterInstance, key: dg.AssetCheckKey, after: int | None, page: int = 100,
                     most: int = 1000) -> list:
    """The check's execution records after storage id ``after``, oldest first (at most ``most``). With no
    mark yet, the newest record a run wrote and those after it: a new sensor does not replay the
    history, and a passing evaluation reported without a run does not hide the failure before it."""
    storage = instance.event_log_storage
    if after is None:
        recent = list(storage.get_asset_check_execution_history(key, limit=20))
        upto = next((i for i, rec in enumerate(recent) if rec.run_id), len(recent) - 1)
        return recent[: upto + 1][::-1]
    out, cursor = [], None
    while len(out) < most:
        records = storage.get_asset_check_execution_history(key, limit=page, cursor=cursor)
        for rec in records:
            if rec.id <= after:
                return out[::-1]
            out.append(rec)
        if len(records) < page:
            break
        cursor = records[-1].id
    return out[::-1]


def _latest_record_id(instance: dg.DagsterInstance, key: dg.AssetCheckKey) -> int:
    latest = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
    return latest[0].id if latest else 0


def _diagnoses(asset: str, domains: DomainsSource) -> bool:
    """Whether the domain of ``asset`` (ledger text form) diagnoses incidents (every level but L0)."""
    domain = domain_for(asset.split("/"), domains)
    return domain is None or domain.diagnoses
