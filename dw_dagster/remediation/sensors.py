"""Sensors: failing checks become incidents (detect), approved change sets become runs (repair).

``build_check_incident_sensor`` turns each new failing evaluation of a watched asset check into
exactly one :class:`~dw_dagster.models.Incident` (an ``AssetObservation`` with ``dw/incident``)
and one run of the diagnosis job; while an asset has an open incident (no receipt yet), later
failures on it do not open another.

``build_remediation_sensor`` walks every change set that has a valid approval through its stages,
one run request at a time, each only after the previous run succeeded:

1. ``window`` - one run per contiguous range of the approved partitions (range tags), after the
   owner merged the change set's diff (files in the pipeline repository match the proposal);
2. ``<kind>-<n>`` - one run per :class:`~dw_dagster.models.ChangeStep` of the change set, in its
   order (e.g. ``migration-1`` then ``replay-2``), each by the step job for its kind
   (:mod:`dw_dagster.remediation.steps`); change sets without steps have no such stage;
3. ``rebuild`` - the downstream dbt models, in one run (Dagster orders them);
4. ``verify`` - the verification checks (a checks-only job);
5. ``receipt`` - the receipt job, which writes ``dw/receipt`` on every touched asset.

Run keys are ``<change set>:<approval>:<stage>``, so a second approved change set for the same
partitions runs again (``PUBLIC_CASES.md`` C22) and a tick never launches a stage twice.
"""


import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import dagster as dg

from dw_dagster import constants as c
from dw_dagster.models import ChangeSet, Incident, SliceGap, stable_hash, utcnow
from dw_dagster.remediation import records
from dw_dagster.domains import domain_for
from dw_dagster.remediation.approval import counted, valid_approval
from dw_dagster.remediation.control import active_stop, approval_observation, autonomous_approval, expired_ids
from dw_dagster.remediation.ranges import window_run_request
from dw_dagster.remediation.steps import step_op_name, step_stages

DIAGNOSE_OP = "dw_diagnose"
RECEIPT_OP = "dw_write_receipts"


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
    """The newest incident on ``asset_key`` that no receipt has closed."""
    closed = {r.incident_id for r in records.receipts(instance, asset_key)}
    for inc in records.incidents(instance, [asset_key]):
        if inc.id not in closed:
            return inc
    return None


def _volume_days(md: dict) -> tuple[int, float, dt.datetime | None, dt.datetime | None]:
    """From a volume check's ``dw/days_json``: rows under (or over) the baseline mean on the days out
    of band (rounded), the worst deviation in %, and the half-open UTC window of those days."""

    days = [d for d in (records.metadata_json(md, "dw/days_json") or [])
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
    slices = [SliceGap.model_validate(s) for s in (records.metadata_json(md, "dw/slices_json") or [])]
    failing = [s for s in slices if not s.passed]
    gap = sum(s.gap_rows for s in slices)
    worst = max(failing, key=lambda s: abs(s.gap_pct), default=None)
    summary = evaluation.description or f"check {check_key.name} failed"
    if not slices and "dw/days_json" in md:
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


def build_check_incident_sensor(
    *,
    check_keys: Sequence[dg.AssetCheckKey],
    diagnosis_job_name: str,
    name: str = "dw_check_incident_sensor",
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor that opens one incident per new failing evaluation of ``check_keys`` and diagnoses it.

    Args:
        check_keys: the asset checks to watch (reconciliation, volume...).
        diagnosis_job_name: the job built by :func:`dw_dagster.diagnosis.build_diagnosis_job`.
        name: sensor name.
        minimum_interval_seconds: seconds between ticks.
        default_status: STOPPED unless told otherwise (remediation is opt-in).

    Returns:
        A ``SensorDefinition``. Its cursor is JSON ``{check key: last evaluation storage id}``;
        an unreadable cursor is logged and the sensor starts from scratch (incidents are still
        de-duplicated by their ids and by the open-incident rule). Two watched checks of one asset
        failing in the same tick (volume and dead letter) open one incident, from the first
        check in ``check_keys``; the other is noted as belonging to it.
    """
    keys = list(check_keys)

    @dg.sensor(name=name, job_name=diagnosis_job_name, minimum_interval_seconds=minimum_interval_seconds,
               default_status=default_status,
               description="Opens a dw_dagster incident for each new failing evaluation of the watched checks "
               "and launches its diagnosis.")
    def _sensor(context: dg.SensorEvaluationContext):
        cursor = _parse_cursor(context)
        events, requests, errors = [], [], []
        opened: dict[dg.AssetKey, Incident] = {}  # incidents this tick opened (not in the instance until it returns)
        for key in keys:
            skey = key.to_user_string()
            try:
                rec = context.instance.get_latest_asset_check_evaluation_record(key)
                if rec is None or rec.id <= cursor.get(skey, 0) or rec.event is None:
                    continue
                evaluation = rec.event.dagster_event.event_specific_data
                if not isinstance(evaluation, dg.AssetCheckEvaluation):
                    # planned or still running: the same record is updated with the evaluation
                    # later, so the cursor must not move past it (it would skip the result)
                    continue
                if evaluation.passed:
                    cursor[skey] = rec.id
                    continue
                existing = opened.get(key.asset_key) or open_incident(context.instance, key.asset_key)
                if existing is not None:
                    context.log.info(f"{skey} failed again; incident {existing.id} is still open")
                    cursor[skey] = rec.id
                    continue
                inc = incident_from_evaluation(key, evaluation, rec.id)
                opened[key.asset_key] = inc
                domain = domain_for(inc.asset_key)
                events.append(dg.AssetObservation(
                    asset_key=key.asset_key,
                    description=f"incident {inc.id}: {inc.summary}"[:1000],
                    metadata={c.INCIDENT_KEY: dg.MetadataValue.json(inc.model_dump(mode="json")), c.INCIDENT_ID_KEY: inc.id},
                ))
                cursor[skey] = rec.id
                if domain is not None and not domain.diagnoses:
                    context.log.info(f"incident {inc.id} recorded; domain {domain.name} is at L0 (checks only): no diagnosis")
                    continue
                requests.append(dg.RunRequest(
                    run_key=inc.id,
                    job_name=diagnosis_job_name,
                    run_config={"ops": {DIAGNOSE_OP: {"config": {"incident_json": inc.model_dump_json()}}}},
                    tags={c.INCIDENT_TAG: inc.id},
                ))
                cursor[skey] = rec.id
            except Exception as e:  # one check's failure never blocks the others, nor moves its cursor
                errors.append(f"{skey}: {type(e).__name__}: {e}")
                context.log.exception(f"incident sensor failed on {skey}")
        if errors and not requests:
            return dg.SensorResult(skip_reason="; ".join(errors)[:1000], cursor=json.dumps(cursor, sort_keys=True))
        return dg.SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(cursor, sort_keys=True))

    return _sensor


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def unmerged_files(cs: ChangeSet, repo_root: str | Path) -> list[str]:
    """Files of ``cs`` whose content in ``repo_root`` is not the proposed content yet."""
    root = Path(repo_root)
    return [f.path for f in cs.files if _sha256(root / f.path) != f.after_sha256]


def contiguous_ranges(ordered_keys: Sequence[str], window: Sequence[str]) -> list[list[str]]:
    """Split ``window`` into runs of consecutive keys of ``ordered_keys`` (the partitions definition's order)."""
    index = {k: i for i, k in enumerate(ordered_keys)}
    pos = sorted(index[k] for k in window if k in index)
    out: list[list[str]] = []
    for p in pos:
        if out and index[out[-1][-1]] == p - 1:
            out[-1].append(ordered_keys[p])
        else:
            out.append([ordered_keys[p]])
    return out


def stage_plan(cs: ChangeSet, ordered_keys: Sequence[str], undo: bool = False) -> list[str]:
    """The stage names of a change set's repair, in order.

    With ``undo`` (the undo jobs are configured) a change set with an undo plan first keeps its
    window (``snapshot``); an undo change set restores it (``restore``) instead of rerunning.
    The change set's steps (``cs.steps``) come after the windows and before the rebuild, one stage
    each (``migration-1``, ``replay-2``, ...); a change set without steps gets exactly the stages
    it got before steps existed.
    """
    rebuild = ["rebuild"] if cs.rebuild_assets else []
    if undo and cs.undo_plan is not None and cs.undo_plan.of_change_set:
        return ["restore", *rebuild, "verify", "receipt"]
    n = len(contiguous_ranges(ordered_keys, cs.window))
    snapshot = ["snapshot"] if undo and cs.undo_plan is not None else []
    steps = list(step_stages(cs))
    return snapshot + [f"window-{i + 1}" for i in range(n)] + steps + rebuild + ["verify", "receipt"]


def build_remediation_sensor(
    *,
    partitions_def: dg.PartitionsDefinition | None = None,
    window_job: "dg.JobDefinition | None" = None,
    rebuild_job: "dg.JobDefinition",
    verify_job: "dg.JobDefinition",
    receipt_job: dg.JobDefinition,
    pipeline_root: str | Path | None = None,
    undo_jobs: "tuple[dg.JobDefinition, dg.JobDefinition] | None" = None,
    step_jobs: "Mapping[str, dg.JobDefinition] | None" = None,
    name: str = "dw_remediation_sensor",
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor that runs approved change sets, stage by stage (see the module docstring).

    Args:
        partitions_def: the partitions definition of the repaired assets (orders the window);
            None when the location's change sets never rerun partitions.
        window_job: a partitioned asset job holding the repaired asset; None likewise (a change
            set with a window then waits, naming the missing job).
        rebuild_job: an asset job holding the downstream assets to rebuild; each run selects the
            change set's subset.
        verify_job: a checks-only asset job running the verification checks.
        receipt_job: the job built by :func:`dw_dagster.remediation.receipts.build_receipt_job`.
        pipeline_root: the pipeline repository the change set's diff applies to; when given, the
            window waits until every proposed file is merged.
        undo_jobs: ``(snapshot_job, restore_job)`` from :func:`dw_dagster.remediation.undo.build_undo_jobs`;
            when given, windows are kept before they rerun and undo change sets can run.
        step_jobs: step kind → job, from :func:`dw_dagster.remediation.steps.build_step_jobs`;
            a change set with a step of a kind that has no job waits, naming it.

    Returns:
        A ``SensorDefinition`` (STOPPED by default). Nothing runs without a valid approval.
    """

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               jobs=[j for j in (window_job, rebuild_job, verify_job, receipt_job, *(undo_jobs or ()),
                                 *(step_jobs or {}).values()) if j is not None],
               description="Launches the repair stages of approved dw_dagster change sets, one after the other.")
    def _sensor(context: dg.SensorEvaluationContext):
        instance = context.instance
        stop = active_stop(instance)
        if stop is not None:  # org-wide stop: nothing is dispatched, approvals wait
            return dg.SkipReason(f"org-wide stop by {stop.by} since {stop.at.isoformat()}: {stop.reason or 'no reason given'}; "
                                 "nothing is dispatched until `dw-dagster resume`")
        ordered = partitions_def.get_partition_keys() if partitions_def is not None else []
        requests, waiting, events = [], [], []
        all_approvals = records.approvals(instance)  # read once per tick, not once per change set
        expired = expired_ids(instance)
        seen: set[str] = set()
        for cs in records.change_sets(instance):
            if cs.id in seen:
                continue  # only the newest version of each change set counts
            seen.add(cs.id)
            recorded = [a for a in all_approvals if a.change_set_id == cs.id]
            decided = counted(recorded)
            if len(decided) < len(recorded):
                waiting.append(f"{cs.id}: {len(recorded) - len(decided)} decision(s) ignored: signed with another key "
                               f"than this deployment's ${c.SIGNING_KEY_ENV}")
            if any(a.decision == "reject" for a in decided):
                continue  # a rejection ends the change set
            approval = valid_approval(instance, cs, decided)
            if approval is None and not decided and cs.id not in expired and utcnow() < cs.expires_at:
                try:
                    domain = domain_for(cs.target_asset)
                except Exception as e:  # noqa: BLE001 - a broken domains file never grants anything
                    waiting.append(f"{cs.id}: domains file unreadable, waiting for a person: {e}")
                    domain = None
                if domain is not None and domain.autonomous(cs.change_classes):
                    approval = autonomous_approval(cs, domain)
                    events.append(approval_observation(cs, approval))
            if approval is None:
                approves = [a for a in decided if a.decision == "approve"]
                if approves:
                    waiting.append(f"{cs.id}: approval {approves[0].id} is not valid for version {cs.version} "
                                   "(edited since, signed with another deployment's key, or autonomy withdrawn)")
                else:
                    waiting.append(f"{cs.id}: waiting for approval by {', '.join(cs.approvers)}")
                continue
            base_tags = {c.CHANGE_SET_TAG: cs.id, c.APPROVAL_TAG: approval.id}
            runs = {r.tags.get(c.STAGE_TAG): r for r in instance.get_runs(filters=dg.RunsFilter(tags=base_tags))}
            ranges = contiguous_ranges(ordered, cs.window)
            steps = step_stages(cs)
            for stage in stage_plan(cs, ordered, undo=undo_jobs is not None):
                run = runs.get(stage)
                if run is not None:
                    if run.status == dg.DagsterRunStatus.SUCCESS:
                        continue
                    if run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
                        waiting.append(f"{cs.id}: stage {stage} {run.status.value}; needs a new change set")
                    else:
                        waiting.append(f"{cs.id}: stage {stage} is {run.status.value}")
                    break
                tags = {**base_tags, c.STAGE_TAG: stage}
                run_key = f"{cs.id}:{approval.id}:{stage}"
                if (stage.startswith("window-") or stage == "snapshot" or stage in steps) and pipeline_root is not None \
                        and (missing := unmerged_files(cs, pipeline_root)):
                    waiting.append(f"{cs.id}: waiting for the owner to merge {', '.join(missing)}")
                    break
                if stage in steps:
                    step = cs.steps[steps[stage]]
                    job = (step_jobs or {}).get(step.kind)
                    if job is None:
                        waiting.append(f"{cs.id}: stage {stage} needs a job for {step.kind} steps "
                                       "(build_remediation_sensor(step_jobs=...))")
                        break
                    requests.append(dg.RunRequest(run_key=run_key, job_name=job.name, tags=tags, run_config={
                        "ops": {step_op_name(step.kind): {"config": {"change_set_id": cs.id, "step_index": steps[stage]}}}}))
                elif stage.startswith("window-") and window_job is None:
                    waiting.append(f"{cs.id}: stage {stage} needs a window job (build_remediation_sensor(window_job=...))")
                    break
                elif stage.startswith("window-"):
                    keys = ranges[int(stage.split("-")[1]) - 1]
                    requests.append(window_run_request(run_key=run_key, job_name=window_job.name,
                                                       assets=[dg.AssetKey(cs.target_asset)], partition_keys=keys, tags=tags))
                elif stage == "rebuild":
                    requests.append(dg.RunRequest(run_key=run_key, job_name=rebuild_job.name,
                                                  asset_selection=[dg.AssetKey(k) for k in cs.rebuild_assets], tags=tags))
                elif stage in ("snapshot", "restore"):
                    job = undo_jobs[0] if stage == "snapshot" else undo_jobs[1]
                    op_name = "dw_snapshot_window" if stage == "snapshot" else "dw_restore_window"
                    requests.append(dg.RunRequest(run_key=run_key, job_name=job.name, tags=tags,
                                                  run_config={"ops": {op_name: {"config": {"change_set_id": cs.id}}}}))
                elif stage == "verify":
                    requests.append(dg.RunRequest(run_key=run_key, job_name=verify_job.name, tags=tags))
                else:
                    requests.append(dg.RunRequest(run_key=run_key, job_name=receipt_job.name, tags=tags,
                                                  run_config={"ops": {RECEIPT_OP: {"config": {"change_set_id": cs.id}}}}))
                break
        if not requests:
            if events:
                return dg.SensorResult(asset_events=events, skip_reason="; ".join(waiting)[:1000] or None)
            return dg.SkipReason("; ".join(waiting) or "no approved change set is waiting")
        return dg.SensorResult(run_requests=requests, asset_events=events)

    return _sensor
