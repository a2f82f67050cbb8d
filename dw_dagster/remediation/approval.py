"""The approval job: a Dagster job whose one op records an owner's decision on a change set.

Launched from the Launchpad (typed config: change set id, decision, approver) or by
``dw-dagster approve``. The op enforces ``shared/design/DESIGN.md`` §4 before it records anything:

- only an approver listed for the change set's domain, and never the proposer;
- only before the change set expires;
- only for the change set's current version (the approval names it);
- once: a change set with a recorded decision cannot be decided again; a rejection ends it
  (only decisions whose signature verifies with this deployment's key count).

A valid decision is recorded as an ``AssetObservation`` with ``dw/approval`` metadata on the
change set's target asset, signed with HMAC-SHA256 using the key in ``$DW_APPROVAL_SIGNING_KEY``.
A refused attempt is recorded as ``dw/approval_refused`` (who, why) and fails the run with a
message that says why. Nothing is ever granted by default.
"""


import hashlib
import enum
import hmac
import json
import os
import uuid

import dagster as dg
from pydantic import Field

from dw_dagster import constants as c
from dw_dagster.domains import DOMAINS_FILE_ENV, DomainsFileError, load_domains
from dw_dagster.models import Approval, ChangeSet, utcnow
from dw_dagster.remediation import records

APPROVAL_JOB_NAME = "dw_approve_change_set"
PAST = {"approve": "approved", "reject": "rejected"}


class ApprovalRefused(Exception):
    """The decision breaks a rule; the message names the rule."""


def _key() -> bytes:
    key = os.environ.get(c.SIGNING_KEY_ENV, "")
    if len(key) < 16:
        raise ApprovalRefused(f"${c.SIGNING_KEY_ENV} must hold a signing key of at least 16 characters")
    return key.encode()


def sign(approval_payload: dict) -> str:
    """HMAC-SHA256 (hex) of the canonical JSON of an approval's signed fields."""
    msg = json.dumps(approval_payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hmac.new(_key(), msg, hashlib.sha256).hexdigest()


def signature_valid(approval: Approval) -> bool:
    """Whether ``approval.signature`` matches its content under the current signing key."""
    try:
        expected = sign(approval.signing_payload())
    except ApprovalRefused:
        return False
    return hmac.compare_digest(expected, approval.signature)


def approved_change_set(instance: dg.DagsterInstance, change_set_id: str, consequence: str) -> tuple[ChangeSet, Approval]:
    """The change set and its valid approval, for an op about to act on it.

    Raises:
        dagster.Failure: no such change set, or no valid approval (the message ends with
            ``consequence``, e.g. "no receipt without one").
    """
    cs = records.find_change_set(instance, change_set_id)
    if cs is None:
        raise dg.Failure(description=f"no change set {change_set_id!r}")
    approval = valid_approval(instance, cs)
    if approval is None:
        raise dg.Failure(description=f"change set {cs.id} has no valid approval; {consequence}")
    return cs, approval


def counted(decisions: list[Approval]) -> list[Approval]:
    """The decisions that count: those whose signature verifies with this deployment's key.

    A decision signed with another key (a wrong ``$DW_APPROVAL_SIGNING_KEY``, a copy from another
    deployment) is ignored everywhere: it neither approves, nor rejects, nor uses up the change
    set's single decision, so nobody without the key can block the owner's approval.
    """
    return [d for d in decisions if signature_valid(d)]


def valid_approval(instance: dg.DagsterInstance, cs: ChangeSet, decided: list[Approval] | None = None) -> Approval | None:
    """The approval that lets ``cs`` run: signed, for this version, decision approve, by a non-proposer.

    ``decided`` is the change set's recorded decisions when the caller already read them.
    """
    from dw_dagster.remediation.control import autonomy_still_allows, is_autonomous_approval

    for a in decided if decided is not None else records.approvals(instance, cs.id):
        if a.decision != "approve" or a.change_set_version != cs.version or not signature_valid(a):
            continue
        if is_autonomous_approval(a):
            if autonomy_still_allows(cs, a):
                return a
        elif a.approver != cs.proposer and a.approver in cs.approvers:
            return a
    return None


def check_decision(instance: dg.DagsterInstance, change_set_id: str, approver: str, now=None) -> ChangeSet:
    """Apply every rule; return the change set, or raise :class:`ApprovalRefused` naming the rule."""
    now = now or utcnow()
    approver = approver.strip().lower()
    cs = records.find_change_set(instance, change_set_id)
    if cs is None:
        raise ApprovalRefused(f"no change set {change_set_id!r} in this Dagster instance")
    if approver == cs.proposer.lower():
        raise ApprovalRefused(f"{approver} proposed change set {cs.id} and cannot approve it")
    if approver not in cs.approvers:
        raise ApprovalRefused(
            f"{approver} is not an approver of domain {cs.domain!r}; listed approvers: {', '.join(cs.approvers)}"
        )
    if os.environ.get(DOMAINS_FILE_ENV):
        # The domains file as it is now wins over the approvers copied into the change set.
        try:
            domain = load_domains().get(cs.domain)
        except (DomainsFileError, KeyError) as e:
            raise ApprovalRefused(f"cannot read domain {cs.domain!r}: {e}") from e
        if not domain.may_approve(approver):
            raise ApprovalRefused(f"{approver} is no longer an approver of domain {cs.domain!r}")
    if now >= cs.expires_at:
        raise ApprovalRefused(f"change set {cs.id} expired at {cs.expires_at.isoformat()}; ask for a new proposal")
    _key()
    decided = counted(records.approvals(instance, cs.id))
    if decided:
        d = decided[0]
        raise ApprovalRefused(
            f"change set {cs.id} was already decided ({d.decision} by {d.approver} at {d.decided_at.isoformat()}); "
            "a decision is single-use"
        )
    return cs


class Decision(enum.Enum):
    approve = "approve"
    reject = "reject"


class ApprovalDecision(dg.Config):
    """Launchpad config of the approval job."""

    change_set_id: str = Field(description="the change set to decide, e.g. cs-1a2b3c4d5e")
    approver: str = Field(description="your email, as listed in the domain's approvers")
    decision: Decision = Field(default=Decision.approve, description="approve or reject")
    comment: str = Field(default="", description="why")


@dg.op(name="dw_record_decision", tags={"kind": "dw"})
def record_decision_op(context: dg.OpExecutionContext, config: ApprovalDecision) -> None:
    """Check the rules and record the decision (see the module docstring)."""
    decision = config.decision.value
    approver = config.approver.strip().lower()
    try:
        if not approver:
            raise ApprovalRefused("an approver is required")
        cs = check_decision(context.instance, config.change_set_id, approver)
    except ApprovalRefused as e:
        cs = records.find_change_set(context.instance, config.change_set_id)
        if cs is not None:
            context.log_event(dg.AssetObservation(
                asset_key=dg.AssetKey(cs.target_asset),
                description=f"approval refused: {e}",
                metadata={c.APPROVAL_REFUSED_KEY: dg.MetadataValue.json({
                    "change_set_id": cs.id, "approver": approver, "decision": decision, "reason": str(e),
                    "at": utcnow().isoformat(), "run_id": context.run_id}),
                    c.CHANGE_SET_ID_KEY: cs.id},
            ))
        raise dg.Failure(description=f"Approval refused: {e}") from e
    fields = dict(
        id=f"ap-{uuid.uuid4().hex[:12]}",
        change_set_id=cs.id,
        change_set_version=cs.version,
        decision=decision,
        approver=approver,
        decided_at=utcnow(),
        comment=config.comment,
    )
    unsigned = Approval(**fields, signature="")
    approval = Approval(**fields, run_id=context.run_id, signature=sign(unsigned.signing_payload()))
    context.log_event(dg.AssetObservation(
        asset_key=dg.AssetKey(cs.target_asset),
        description=f"change set {cs.id} {PAST[decision]} by {approver}",
        metadata={c.APPROVAL_KEY: dg.MetadataValue.json(approval.model_dump(mode="json")), c.CHANGE_SET_ID_KEY: cs.id},
    ))
    context.log.info(f"Recorded: change set {cs.id} (version {cs.version}) {PAST[decision]} by {approver}.")


@dg.job(name=APPROVAL_JOB_NAME, tags={"dw/kind": "approval"},
        description="Approve or reject a dw_dagster change set. Only listed approvers; never the proposer.")
def approval_job():
    record_decision_op()


def build_approval_job() -> dg.JobDefinition:
    """The approval job (one op, typed config :class:`ApprovalDecision`)."""
    return approval_job


def approve_in_process(instance: dg.DagsterInstance, change_set_id: str, approver: str,
                       decision: str = "approve", comment: str = "") -> tuple[bool, str]:
    """Run the approval job in this process against ``instance`` (what ``dw-dagster approve`` does).

    Returns:
        (recorded, message): message is the refusal reason when not recorded.
    """
    if decision not in ("approve", "reject"):
        return False, f"decision must be 'approve' or 'reject', got {decision!r}"
    result = approval_job.execute_in_process(
        instance=instance,
        run_config={"ops": {"dw_record_decision": {"config": {
            "change_set_id": change_set_id, "approver": approver, "decision": decision, "comment": comment}}},
            # a refusal is an expected outcome, reported by the return value, not a stack trace
            "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}},
        tags={c.CHANGE_SET_TAG: change_set_id},
        raise_on_error=False,
    )
    if result.success:
        return True, f"{PAST[decision]} change set {change_set_id} as {approver.strip().lower()}"
    failure = next((e for e in result.all_events if e.is_step_failure), None)
    msg = failure.event_specific_data.error.message if failure and failure.event_specific_data.error else "failed"
    msg = msg.strip()
    return False, msg[msg.index("Approval refused: ") + len("Approval refused: "):] if "Approval refused: " in msg else msg
