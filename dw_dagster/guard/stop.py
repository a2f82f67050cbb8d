"""The org-wide stop: one action halts every automatic dispatch of a change.

``dw-dagster stop`` (or the ``dw_stop`` job from the Launchpad) records the stop in the ledger and
as ``dw/stop`` on the ``dw_control`` asset (visible on its page in the Dagster UI), and cancels
repair runs that are queued but not started. Anyone may pull the stop. While it holds, the
remediation sensor issues no ticket and skips with the stop's reason, and no autonomous approval
is made (:mod:`dw_dagster.approval.autonomy`); approvals given during the stop are recorded and
wait. Only a **verified** operator lifts it (``dw-dagster resume --id-token ...`` or ``dw_resume``
with an ID token bound to the resume; the domains file's ``operators``, default every approver):
typed names are refused.
"""

import datetime as dt
import uuid

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.core import keys as c
from dw_dagster.core.domains import DomainsSource, resolve_domains
from dw_dagster.core.identity import VerifiedIdentity, decision_nonce
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import utcnow
from dw_dagster.core.signing import ApprovalRefused
from dw_dagster.approval.job import oidc_verifier, unverified_identity

CONTROL_ASSET = dg.AssetKey([c.CONTROL_ASSET_NAME])
STOP_KEY = c.STOP_KEY
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

    @dg.op(name=c.RESUME_OP, tags={"kind": "dw"})
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

    stop_op = dg.op(name=c.STOP_OP, tags={"kind": "dw"})(_stop_fn)

    @dg.job(name=c.STOP_JOB, tags={c.KIND_KEY: c.CONTROL_KIND}, description="Org-wide stop: halt every automatic dw_dagster repair.")
    def stop_job():
        stop_op()

    @dg.job(name=c.RESUME_JOB, tags={c.KIND_KEY: c.CONTROL_KIND}, description="Lift the org-wide stop (a verified operator).")
    def resume_job():
        _resume_op()

    return stop_job, resume_job


stop_job, resume_job = build_control_jobs()


def build_control_definitions(domains: DomainsSource = None) -> dg.Definitions:
    """The ``dw_control`` asset and the ``dw_stop`` / ``dw_resume`` jobs, to merge into a code location."""
    return dg.Definitions(assets=[control_asset_spec()], jobs=list(build_control_jobs(domains)))


__all__ = ["CONTROL_ASSET", "STOP_KEY", "StopState", "active_stop", "build_control_definitions", "build_control_jobs",
           "control_asset_spec", "resume_job", "resume_nonce", "set_stop", "stop_job", "stop_state"]
