"""Org-wide stop, autonomous approvals and expiry: the controls around the remediation sensor.

**Org-wide stop.** One action halts every automatic dispatch of a change: ``dw-dagster stop`` (or
the ``dw_stop`` job from the Launchpad) records ``dw/stop`` on the ``dw_control`` asset, visible on
its page in the Dagster UI, and cancels repair runs that are queued but not started. While it
holds, the remediation sensor launches nothing and skips with the stop's reason, and no
autonomous approval is made; approvals given during the stop are recorded and wait.
``dw-dagster resume`` (or ``dw_resume``) lifts it.

**Autonomous approvals** (L3/L4, :meth:`dw_dagster.domains.Domain.autonomous`): the remediation
sensor records an :class:`~dw_dagster.models.Approval` signed like a person's, with approver
``dw-dagster/autonomy:L3`` (or L4). It counts only while the domains file still allows it: lowering
the level revokes the pending ones.

**Expiry and escalation.** :func:`build_expiry_sensor` marks every change set that reached its
``expires_at`` without a decision as expired (``dw/change_set_expired``) and tells the domain's
next escalation contact (Slack when configured); it never grants anything.
"""

import datetime as dt
import uuid

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster import constants as c
from dw_dagster.domains import Domain, domain_for
from dw_dagster.models import Approval, ChangeSet, utcnow
from dw_dagster.remediation import records

CONTROL_ASSET = dg.AssetKey(["dw_control"])
STOP_KEY = "dw/stop"
EXPIRED_KEY = "dw/change_set_expired"
AUTONOMY_PREFIX = "dw-dagster/autonomy:"


class StopState(BaseModel):
    """The org-wide stop as last recorded."""

    stopped: bool
    by: str
    reason: str = ""
    at: dt.datetime
    cancelled_runs: list[str] = Field(default_factory=list)


def control_asset_spec() -> dg.AssetSpec:
    """The ``dw_control`` asset whose events show the org-wide stop in the UI; add it to your Definitions."""
    return dg.AssetSpec(CONTROL_ASSET, group_name="dw", kinds={"dw"},
                        description="dw_dagster's controls: org-wide stop and resume (see Events).")


def stop_state(instance: dg.DagsterInstance) -> StopState | None:
    """The latest stop/resume record, or None when there has never been one."""
    for rec in records.iter_observations(instance, CONTROL_ASSET):
        data = records.metadata_json(rec.asset_observation.metadata, STOP_KEY)
        if data is not None:
            return StopState.model_validate(data)
    return None


def active_stop(instance: dg.DagsterInstance) -> StopState | None:
    """The stop in force, or None."""
    s = stop_state(instance)
    return s if s is not None and s.stopped else None


def _queued_repair_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]))
    return [r for r in runs if c.CHANGE_SET_TAG in r.tags]


def stop_observation(state: StopState) -> dg.AssetObservation:
    verb = "STOPPED" if state.stopped else "resumed"
    return dg.AssetObservation(asset_key=CONTROL_ASSET, description=f"org-wide {verb} by {state.by}: {state.reason}"[:1000],
                               metadata={STOP_KEY: dg.MetadataValue.json(state.model_dump(mode="json")),
                                         "dw/stopped": state.stopped})


def set_stop(instance: dg.DagsterInstance, stopped: bool, by: str, reason: str = "") -> StopState:
    """Record a stop (cancelling queued repair runs) or a resume; returns the new state.

    Raises:
        ValueError: ``by`` is empty (a stop names who pulled it).
    """
    if not by.strip():
        raise ValueError("a stop or resume names who did it (by)")
    cancelled = []
    if stopped:
        for run in _queued_repair_runs(instance):
            instance.report_run_canceled(run, message=f"dw_dagster org-wide stop by {by}: {reason}")
            cancelled.append(run.run_id)
    state = StopState(stopped=stopped, by=by.strip().lower(), reason=reason, at=utcnow(), cancelled_runs=cancelled)
    instance.report_runless_asset_event(stop_observation(state))
    return state


class StopConfig(dg.Config):
    by: str = Field(description="who stops or resumes (email)")
    reason: str = Field(default="", description="why")


@dg.op(name="dw_set_stop", tags={"kind": "dw"})
def _stop_op(context: dg.OpExecutionContext, config: StopConfig) -> None:
    state = set_stop(context.instance, True, config.by, config.reason)
    context.log.warning(f"Org-wide stop by {state.by}; cancelled {len(state.cancelled_runs)} queued repair run(s).")


@dg.op(name="dw_lift_stop", tags={"kind": "dw"})
def _resume_op(context: dg.OpExecutionContext, config: StopConfig) -> None:
    state = set_stop(context.instance, False, config.by, config.reason)
    context.log.info(f"Org-wide stop lifted by {state.by}.")


@dg.job(name="dw_stop", tags={"dw/kind": "control"}, description="Org-wide stop: halt every automatic dw_dagster repair.")
def stop_job():
    _stop_op()


@dg.job(name="dw_resume", tags={"dw/kind": "control"}, description="Lift the org-wide stop.")
def resume_job():
    _resume_op()


def build_control_definitions() -> dg.Definitions:
    """The ``dw_control`` asset and the ``dw_stop`` / ``dw_resume`` jobs, to merge into a code location."""
    return dg.Definitions(assets=[control_asset_spec()], jobs=[stop_job, resume_job])


# -- autonomy ------------------------------------------------------------------------------------

def is_autonomous_approval(a: Approval) -> bool:
    return a.approver.startswith(AUTONOMY_PREFIX)


def autonomous_approval(cs: ChangeSet, domain: Domain) -> Approval:
    """A signed approval recorded by dw_dagster itself for an L3/L4 domain.

    Raises:
        ValueError: the domain does not allow ``cs`` to run unasked.
    """
    from dw_dagster.remediation.approval import sign

    if not domain.autonomous(cs.change_classes):
        raise ValueError(f"domain {domain.name} ({domain.autonomy}) does not allow {cs.change_classes} unasked")
    fields = dict(id=f"ap-{uuid.uuid4().hex[:12]}", change_set_id=cs.id, change_set_version=cs.version,
                  decision="approve", approver=f"{AUTONOMY_PREFIX}{domain.autonomy}", decided_at=utcnow(),
                  comment=f"autonomy {domain.autonomy}: {', '.join(sorted(set(cs.change_classes)))} "
                          f"within {domain.name}'s allowed classes; pipeline code still merged by its owner")
    unsigned = Approval(**fields, signature="")
    return Approval(**fields, signature=sign(unsigned.signing_payload()))


def autonomy_still_allows(cs: ChangeSet, a: Approval) -> bool:
    """An autonomous approval counts only while the domains file still allows it at that level."""
    domain = domain_for(cs.target_asset)
    return domain is not None and a.approver == f"{AUTONOMY_PREFIX}{domain.autonomy}" and domain.autonomous(cs.change_classes)


def approval_observation(cs: ChangeSet, a: Approval) -> dg.AssetObservation:
    return dg.AssetObservation(asset_key=dg.AssetKey(cs.target_asset),
                               description=f"change set {cs.id} approved by {a.approver}",
                               metadata={c.APPROVAL_KEY: dg.MetadataValue.json(a.model_dump(mode="json")),
                                         c.CHANGE_SET_ID_KEY: cs.id})


# -- expiry and escalation -------------------------------------------------------------------------

def expired_ids(instance: dg.DagsterInstance) -> set[str]:
    return {d["change_set_id"] for _, d, _ in records._records(instance, EXPIRED_KEY)}


def build_expiry_sensor(
    *,
    slack_resource_key: str | None = None,
    slack_channel: str | None = None,
    name: str = "dw_expiry_sensor",
    minimum_interval_seconds: int = 300,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """Mark unanswered change sets expired and tell the next escalation contact; never grants.

    Args:
        slack_resource_key: a :class:`~dw_dagster.slack.SlackResource` key to notify through, or None
            (the escalation is then only recorded).
        slack_channel: the channel for escalations (default: the resource's).

    Returns:
        A ``SensorDefinition`` (STOPPED by default) emitting ``dw/change_set_expired`` observations:
        ``{change_set_id, version, expired_at, escalated_to, notified}``.
    """
    keys = {slack_resource_key} if slack_resource_key else set()

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               required_resource_keys=keys,
               description="Marks change sets that expired without a decision and escalates to the next contact.")
    def _sensor(context: dg.SensorEvaluationContext):
        instance = context.instance
        now = utcnow()
        done = expired_ids(instance)
        from dw_dagster.remediation.approval import counted

        decided = {a.change_set_id for a in counted(records.approvals(instance))}
        slack = getattr(context.resources, slack_resource_key) if slack_resource_key else None
        events, seen = [], set()
        for cs in records.change_sets(instance):
            if cs.id in seen:
                continue
            seen.add(cs.id)
            if cs.id in done or cs.id in decided or now < cs.expires_at:
                continue
            try:
                domain = domain_for(cs.target_asset)
            except Exception as e:  # noqa: BLE001 - a bad domains file is reported, the expiry still recorded
                context.log.error(f"cannot read the domains file: {e}")
                domain = None
            contact = (domain.escalation[0] if domain and domain.escalation else None)
            notified = False
            if slack is not None and contact:
                try:
                    from dw_dagster.slack import SlackMessage

                    text = (f"Escalation to {contact}: change set {cs.id} on {'/'.join(cs.target_asset)} expired at "
                            f"{cs.expires_at.isoformat()} without a decision by {', '.join(cs.approvers)}. Nothing was "
                            f"applied. {cs.summary}. A new proposal is needed to act.")
                    slack.post_message(SlackMessage(text=text, blocks=[]), channel=slack_channel)
                    notified = True
                except Exception as e:  # noqa: BLE001 - recorded; the expiry itself still stands
                    context.log.error(f"escalation message for {cs.id} failed: {e}")
            events.append(dg.AssetObservation(
                asset_key=dg.AssetKey(cs.target_asset),
                description=f"change set {cs.id} expired without a decision; escalated to {contact or 'nobody listed'}",
                metadata={EXPIRED_KEY: dg.MetadataValue.json({
                    "change_set_id": cs.id, "version": cs.version, "expired_at": cs.expires_at.isoformat(),
                    "escalated_to": contact, "notified": notified}), c.CHANGE_SET_ID_KEY: cs.id}))
        if not events:
            return dg.SkipReason("no change set expired since the last tick")
        return dg.SensorResult(asset_events=events)

    return _sensor
