"""Org-wide stop, autonomous approvals and expiry: the controls around the remediation sensor.

**Org-wide stop.** One action halts every automatic dispatch of a change: ``dw-dagster stop`` (or
the ``dw_stop`` job from the Launchpad) records the stop in the ledger and as ``dw/stop`` on the
``dw_control`` asset (visible on its page in the Dagster UI), and cancels repair runs that are
queued but not started. Anyone may pull the stop. While it holds, the remediation sensor issues
no ticket and skips with the stop's reason, and no autonomous approval is made; approvals given
during the stop are recorded and wait. Only a **verified** operator lifts it (``dw-dagster
resume --id-token ...`` or ``dw_resume`` with an ID token bound to the resume; the domains file's
``operators``, default every approver): typed names are refused.

**Autonomous approvals** (L3/L4, :meth:`dw_dagster.core.domains.Domain.autonomous`): the remediation
sensor records, in the ledger, a decision signed like a person's with approver
``dw-dagster/autonomy:L3`` (or L4), only for a version nobody decided before. It counts only while
the domains file still allows it; when the level is lowered it is withdrawn, so the owner can decide
(:mod:`dw_dagster.repair.sensor` says what happens to a repair already under way).

**Expiry and escalation.** :func:`build_expiry_sensor` climbs each domain's escalation ladder
(:mod:`dw_dagster.approval.ladder`): it reminds, escalates to people who may then decide, and
marks a version that reached its ``expires_at`` without a decision expired (in the ledger and as
``dw/change_set_expired``); it never grants anything.
"""

import datetime as dt
import uuid
from collections.abc import Callable

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.core import keys as c
from dw_dagster.core.domains import Domain, DomainsFileError, DomainsSource, resolve_domains
from dw_dagster.core.identity import VerifiedIdentity, decision_nonce
from dw_dagster.core.ledger import EXPIRED, LedgerError, asset_str, ledger_for
from dw_dagster.core.models import Approval, ChangeSet, utcnow
from dw_dagster.approval.job import (
    AUTONOMY_PREFIX,
    ApprovalRefused,
    _signed,
    approval_observation,
    identity_from_token,
    is_autonomous_approval,
    oidc_verifier,
    parse_change_set,
    unverified_identity,
)

CONTROL_ASSET = dg.AssetKey(["dw_control"])
STOP_KEY = c.STOP_KEY
EXPIRED_KEY = c.EXPIRED_KEY
STOP_CONTROL = "org_wide_stop"


class StopState(BaseModel):
    """The org-wide stop as last recorded (``verified_by`` says how a resume's author was verified)."""

    stopped: bool
    by: str
    reason: str = ""
    at: dt.datetime
    cancelled_runs: list[str] = Field(default_factory=list)
    id: str = ""
    verified_by: str = ""


def control_asset_spec() -> dg.AssetSpec:
    """The ``dw_control`` asset whose events show the org-wide stop in the UI; add it to your Definitions."""
    return dg.AssetSpec(CONTROL_ASSET, group_name="dw", kinds={"dw"},
                        description="dw_dagster's controls: org-wide stop and resume, quarantined records (see Events).")


def stop_state(instance: dg.DagsterInstance) -> StopState | None:
    """The latest stop/resume record (from the ledger), or None when there has never been one."""
    data = ledger_for(instance).control(STOP_CONTROL)
    return StopState.model_validate(data) if data is not None else None


def active_stop(instance: dg.DagsterInstance) -> StopState | None:
    """The stop in force, or None."""
    s = stop_state(instance)
    return s if s is not None and s.stopped else None


def _queued_repair_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]))
    return [r for r in runs if c.CHANGE_SET_TAG in r.tags]


def stop_observation(state: StopState) -> dg.AssetObservation:
    verb = "STOPPED" if state.stopped else "resumed"
    how = f" ({state.verified_by})" if state.verified_by else ""
    return dg.AssetObservation(asset_key=CONTROL_ASSET,
                               description=f"org-wide {verb} by {state.by}{how}: {state.reason}"[:1000],
                               metadata={STOP_KEY: dg.MetadataValue.json(state.model_dump(mode="json")),
                                         c.STOPPED_KEY: state.stopped})


def set_stop(instance: dg.DagsterInstance, stopped: bool, by: str | VerifiedIdentity, reason: str = "", *,
             domains: DomainsSource = None) -> StopState:
    """Record a stop (cancelling queued repair runs) or a resume; returns the new state.

    Args:
        by: who stops (any name: stopping is always allowed) or, to resume, a
            :class:`~dw_dagster.approval.identity.VerifiedIdentity` of an operator.
        domains: the domains file (operators) for a resume.

    Raises:
        ValueError: a stop names nobody, or a resume is not by a verified operator (the message says why).
    """
    if stopped:
        name = by.email if isinstance(by, VerifiedIdentity) else str(by).strip().lower()
        if not name:
            raise ValueError("a stop or resume names who did it (by)")
        cancelled = []
        for run in _queued_repair_runs(instance):
            instance.report_run_canceled(run, message=f"dw_dagster org-wide stop by {name}: {reason}")
            cancelled.append(run.run_id)
        state = StopState(stopped=True, by=name, reason=reason, at=utcnow(), cancelled_runs=cancelled,
                          id=f"stop-{uuid.uuid4().hex[:10]}",
                          verified_by=by.describe() if isinstance(by, VerifiedIdentity) else "")
    else:
        if not isinstance(by, VerifiedIdentity):
            raise ValueError("only a verified operator lifts an org-wide stop (an ID token, not a typed name)")
        doms = resolve_domains(domains)
        if doms is None:
            raise ValueError("no domains file: who may lift the stop cannot be checked")
        if not by.verified and not all(d.identity == "unverified" for d in doms.domains):
            raise ValueError(f"{by.email} is not verified; lifting the stop needs a verified identity")
        if not doms.may_operate(by.email):
            raise ValueError(f"{by.email} is not an operator (operators, else every domain's approvers)")
        current = stop_state(instance)
        if by.credential_id is not None and not ledger_for(instance).use_credential(by.credential_id, "resume"):
            raise ValueError("this ID token was already used; each is accepted once")
        state = StopState(stopped=False, by=by.email, reason=reason, at=utcnow(),
                          id=current.id if current else "", verified_by=by.describe())
    ledger_for(instance).set_control(STOP_CONTROL, state.model_dump(mode="json"))
    instance.report_runless_asset_event(stop_observation(state))
    return state


def resume_nonce(instance: dg.DagsterInstance) -> str:
    """The OIDC nonce an ID token must carry to lift the current stop (bound to that stop)."""
    current = stop_state(instance)
    return decision_nonce(current.id if current else "none", "stop", "resume")


class StopConfig(dg.Config):
    by: str = Field(default="", description="who stops (email); for a resume, accepted only by identity: unverified domains")
    reason: str = Field(default="", description="why")
    id_token: str = Field(default="", description="to resume: an ID token bound to lifting this stop "
                          "(`dw-dagster approvals token --resume` prints one)")


def _stop_fn(context: dg.OpExecutionContext, config: StopConfig) -> None:
    state = set_stop(context.instance, True, config.by, config.reason)
    context.log.warning(f"Org-wide stop by {state.by}; cancelled {len(state.cancelled_runs)} queued repair run(s).")


def build_control_jobs(domains: DomainsSource = None) -> tuple[dg.JobDefinition, dg.JobDefinition]:
    """The ``dw_stop`` and ``dw_resume`` jobs (resume verifies its ID token against ``domains``' provider)."""

    @dg.op(name="dw_lift_stop", tags={"kind": "dw"})
    def _resume_op(context: dg.OpExecutionContext, config: StopConfig) -> None:
        try:
            doms = resolve_domains(domains)
            if doms is None:
                raise ApprovalRefused("no domains file: who may lift the stop cannot be checked")
            if config.id_token.strip():
                identity = oidc_verifier(doms).verify(config.id_token.strip(), nonce=resume_nonce(context.instance))
            elif config.by.strip():
                identity = unverified_identity(config.by)
            else:
                raise ApprovalRefused("an ID token is required to lift the stop")
            state = set_stop(context.instance, False, identity, config.reason, domains=doms)
        except (ApprovalRefused, ValueError, Exception) as e:  # IdentityError included
            raise dg.Failure(description=f"Resume refused: {e}") from e
        context.log.info(f"Org-wide stop lifted by {state.by} ({state.verified_by}).")

    stop_op = dg.op(name="dw_set_stop", tags={"kind": "dw"})(_stop_fn)

    @dg.job(name="dw_stop", tags={c.KIND_KEY: "control"}, description="Org-wide stop: halt every automatic dw_dagster repair.")
    def stop_job():
        stop_op()

    @dg.job(name="dw_resume", tags={c.KIND_KEY: "control"}, description="Lift the org-wide stop (a verified operator).")
    def resume_job():
        _resume_op()

    return stop_job, resume_job


stop_job, resume_job = build_control_jobs()


def build_control_definitions(domains: DomainsSource = None) -> dg.Definitions:
    """The ``dw_control`` asset and the ``dw_stop`` / ``dw_resume`` jobs, to merge into a code location."""
    return dg.Definitions(assets=[control_asset_spec()], jobs=list(build_control_jobs(domains)))


# -- autonomy ------------------------------------------------------------------------------------

def autonomous_approval(cs: ChangeSet, domain: Domain) -> Approval:
    """A signed approval made by dw_dagster itself for an L3/L4 domain (not yet recorded).

    Raises:
        ValueError: the domain does not allow ``cs`` to run unasked.
    """
    if not domain.autonomous(cs.change_classes):
        raise ValueError(f"domain {domain.name} ({domain.autonomy}) does not allow {cs.change_classes} unasked")
    identity = VerifiedIdentity(email=f"{AUTONOMY_PREFIX}{domain.autonomy}", method="autonomy", verified_at=utcnow(),
                                detail=f"autonomy {domain.autonomy} of domain {domain.name}")
    return _signed(dict(id=f"ap-{uuid.uuid4().hex[:12]}", change_set_id=cs.id, change_set_version=cs.version,
                        decision="approve", approver=identity.email, decided_at=utcnow(), identity=identity,
                        comment=f"autonomy {domain.autonomy}: {', '.join(sorted(set(cs.change_classes)))} "
                                f"within {domain.name}'s allowed classes; pipeline code still merged by its owner"))


def record_autonomous_approval(instance: dg.DagsterInstance, cs: ChangeSet, domain: Domain) -> tuple[Approval, dg.AssetObservation] | None:
    """Record an autonomous approval for a version no one decided yet; None when one exists or existed, or
    when the version ended since it was read (superseded, expired)."""
    led = ledger_for(instance)
    if any(d["version"] == cs.version for d in led.decisions(cs.id)):
        return None  # decided, or an earlier decision was withdrawn: only a person decides now
    a = autonomous_approval(cs, domain)
    try:
        ok = led.record_decision(approval_id=a.id, change_set_id=cs.id, version=cs.version, decision="approve",
                                 approver=a.approver, method="autonomy", decided_at=a.decided_at.timestamp(),
                                 body=a.model_dump_json())
    except LedgerError:  # the version ended since the tick read it (superseded, expired): nothing to approve
        return None
    return (a, approval_observation(cs, a)) if ok else None


# -- expiry and escalation -------------------------------------------------------------------------

def expired_ids(instance: dg.DagsterInstance) -> set[str]:
    """Ids of change sets whose latest version expired without a decision."""
    return {r.change_set_id for r in ledger_for(instance).change_set_rows(states=[EXPIRED])}


def build_expiry_sensor(
    *,
    domains: DomainsSource = None,
    clock: Callable[[], dt.datetime] | None = None,
    name: str = "dw_expiry_sensor",
    minimum_interval_seconds: int = 60,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """The escalation ladder's sensor: reminds, escalates and denies unanswered requests (and repairs
    that did not verify) as each domain's ladder says; never grants (:mod:`dw_dagster.approval.ladder`).

    Args:
        domains: the domains (ladders, approvers, escalation approvers); default ``$DW_DOMAINS_FILE``.
        clock: what "now" is (default: the current UTC time; tests pass a clock they control).
        name: the sensor's name (``dw_expiry_sensor`` keeps the name the expiry-only sensor had).

    Returns:
        A ``SensorDefinition`` (STOPPED by default). Each step is recorded in the ledger and shown at
        once as a ``dw/escalation`` observation on the change set's target asset (a denied request
        also as ``dw/change_set_expired``); the notification sensor tells the people. The tick's
        skip reason says what was told.
    """

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               description="The escalation ladder: reminds, escalates to people who may then decide, and denies "
               "(expires) unanswered change sets; never grants.")
    def _sensor(context: dg.SensorEvaluationContext):
        from dw_dagster.approval.ladder import climb

        try:
            doms = resolve_domains(domains)
        except DomainsFileError as e:  # reported; requests still expire at their recorded expiry
            context.log.error(f"cannot read the domains file: {e}")
            doms = None
        tick = climb(context.instance, doms, clock() if clock else None)
        for p in tick.problems:
            context.log.error(p)
        return dg.SkipReason(tick.summary()[:1000])

    return _sensor


__all__ = ["CONTROL_ASSET", "StopState", "active_stop", "autonomous_approval", "build_control_definitions",
           "build_control_jobs", "build_expiry_sensor", "control_asset_spec", "expired_ids", "is_autonomous_approval",
           "record_autonomous_approval", "resume_job", "resume_nonce", "set_stop", "stop_job", "stop_state",
           "asset_str", "identity_from_token"]
