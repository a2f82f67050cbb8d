"""Decisions on change sets: who may decide, proven how, on which content, once.

A decision (approve or reject) is recorded by :func:`decide` and nowhere else. The approval job
(``dw_approve_change_set``, from the Launchpad or ``dw-dagster approve``), the Slack interaction
endpoint and the review page (``dw-dagster approvals serve``) all call it. It enforces
``shared/design/DESIGN.md`` §4 before anything is recorded:

- **a verified person**: the approver is the email of a :class:`~dw_dagster.approval.identity.VerifiedIdentity`
  (an OIDC ID token verified against the provider's JWKS and bound to this decision by its
  ``nonce``, or a signed Slack interaction), never typed text, unless the domain opted into
  ``identity: unverified``;
- **listed now**: the email is among the domain's approvers in the domains file as it is now
  (not the copy in the change set), and is not the proposer;
- **the content**: the change set's version is the hash of its content; a record that does not
  hash to its version is refused as tampered; the decision names the version it was shown;
- **in time**: before the change set's expiry (which re-proposing the same content never renews);
- **once**: the ledger (:mod:`dw_dagster.core.ledger`) holds one active decision per version, taken
  atomically, and each credential is accepted once; a rejection ends the version.

A decision is signed with HMAC-SHA256 under the deployment's key (``$DW_APPROVAL_SIGNING_KEY``
or the file named by ``$DW_APPROVAL_SIGNING_KEY_FILE``), recorded in the ledger and shown as an
``AssetObservation`` with ``dw/approval`` metadata on the change set's target asset. A refused
attempt is shown as ``dw/approval_refused`` (who, why) and changes nothing; the approval job's run
then ends *successfully* with the tags ``dw/decision: refused`` and ``dw/refusal_reason`` (a refusal is
an outcome the rules produced, not a failure of dw_dagster), and a decision recorded tags its run
``dw/decision: approved`` or ``rejected``.
"""



import datetime as dt
import enum
import uuid
from dataclasses import dataclass

import dagster as dg
from pydantic import Field, ValidationError

from dw_dagster.core.links import describe
from dw_dagster.core import keys as c
from dw_dagster.core.domains import Domain, Domains, DomainsFileError, DomainsSource, duration_text, resolve_domains
from dw_dagster.core.identity import IdentityError, VerifiedIdentity, canonical_email, decision_nonce
from dw_dagster.core.ledger import APPLIED, EXPIRED, FAILED, REJECTED, SUPERSEDED, Ledger, LedgerError, ledger_for
from dw_dagster.proposals.change_sets import record_proposal
from dw_dagster.core.records import load_change_set, parse_change_set
from dw_dagster.core.models import Approval, ChangeSet, TamperedRecord, utcnow
from dw_dagster.core.signing import ApprovalRefused, signature_valid, signed, signing_key
from dw_dagster.dagster_private import public

APPROVAL_JOB_NAME = c.APPROVAL_JOB
PAST = {"approve": "approved", "reject": "rejected"}
AUTONOMY_PREFIX = "dw-dagster/autonomy:"


# -- identities -------------------------------------------------------------------------------------

_verifiers: dict[str, object] = {}


def oidc_verifier(domains: Domains):
    """The (cached) :class:`~dw_dagster.approval.identity.oidc.OidcVerifier` of the domains file's OIDC provider.

    Raises:
        ApprovalRefused: the domains file names no OIDC provider.
    """
    from dw_dagster.approval.identity.oidc import OidcVerifier

    settings = domains.identity.oidc
    if settings is None:
        raise ApprovalRefused("the domains file names no OIDC provider (identity.oidc): an ID token cannot be checked")
    key = settings.model_dump_json()
    if key not in _verifiers:
        _verifiers[key] = OidcVerifier(settings)
    return _verifiers[key]


def identity_from_token(domains: Domains, id_token: str, *, change_set_id: str, version: str, decision: str) -> VerifiedIdentity:
    """Verify an OIDC ID token for one decision (its ``nonce`` must bind it to this decision).

    Raises:
        ApprovalRefused: no OIDC provider configured, or the token is refused (the reason named).
    """
    verifier = oidc_verifier(domains)
    try:
        return verifier.verify(id_token.strip(), nonce=decision_nonce(change_set_id, version, decision))
    except IdentityError as e:
        raise ApprovalRefused(f"ID token refused: {e}") from e


def unverified_identity(email: str) -> VerifiedIdentity:
    """Typed text as an identity, labelled unverified (accepted only by ``identity: unverified`` domains).

    Raises:
        ApprovalRefused: not an email address.
    """
    try:
        return VerifiedIdentity(email=canonical_email(email), method="unverified", verified_at=utcnow(),
                                detail="typed text, not verified")
    except IdentityError as e:
        raise ApprovalRefused(str(e)) from e


# -- the rules --------------------------------------------------------------------------------------

def _domain(domains: Domains | None, cs: ChangeSet) -> Domain:
    if domains is None:
        raise ApprovalRefused("no domains file is configured: who is listed for the domain now cannot be checked "
                              "(set $DW_DOMAINS_FILE or pass --domains)")
    try:
        domain = domains.get(cs.domain)
    except KeyError as e:
        raise ApprovalRefused(f"domain {cs.domain!r} of change set {cs.id} is not in the domains file") from e
    if cs.target_asset:  # ownership moved since the proposal: the new owner never decided
        try:
            owner = domains.for_asset(cs.target_asset)
        except KeyError:
            owner = None  # owned through a selection only (needs the asset graph) or by no domain: as proposed
        if owner is not None and owner.name != domain.name:
            raise ApprovalRefused(f"asset {'/'.join(cs.target_asset)} of change set {cs.id} belongs to domain "
                                  f"{owner.name!r} now, not {domain.name!r} as when it was proposed: a decision in "
                                  f"{domain.name!r} does not count for it; propose it again for {owner.name!r}")
    return domain


def person_may_decide(domain: Domain, cs: ChangeSet, identity: VerifiedIdentity,
                      now: dt.datetime | None = None) -> str | None:
    """Why ``identity`` may not decide on ``cs`` in ``domain`` as it is now (at ``now``), or None when it may.

    A listed approver may decide at any time before the expiry; an escalation approver from the
    moment ``escalate_after`` has passed since the change set was proposed (the domain's ladder).
    """
    email = identity.email
    now = now or utcnow()
    if email == cs.proposer.strip().lower():
        return f"{email} proposed change set {cs.id} and cannot approve it"
    if email in {e.strip().lower() for e in cs.excluded_approvers}:
        return f"{email} benefits from change set {cs.id} (it is for them) and cannot approve it"
    if identity.method == "autonomy":
        return "an autonomous approval is not a person's decision"
    if not domain.may_decide(email, cs.created_at, now):
        if domain.may_escalate(email) and domain.escalate_after is not None:
            opens = cs.created_at + domain.escalate_after
            return (f"{email} is an escalation approver of domain {domain.name!r}: they may decide from "
                    f"{opens.isoformat()} (escalate_after after the proposal), not before")
        return (f"{email} is not an approver of domain {domain.name!r} (listed now: {', '.join(domain.approvers)}"
                + (f"; escalation approvers after {duration_text(domain.escalate_after)}: "
                   f"{', '.join(domain.escalation_approvers)}"
                   if domain.escalation_approvers else "") + ")")
    if not identity.verified and domain.identity != "unverified":
        return (f"domain {domain.name!r} needs a verified identity (an OIDC ID token or a Slack interaction); "
                f"{email} was typed, not verified")
    return None


def content_fits(domain: Domain, cs: ChangeSet) -> str | None:
    """Why ``cs`` no longer fits ``domain``'s limits (window cap), or None."""
    if len(cs.window) > domain.max_window_partitions:
        return (f"change set {cs.id} reruns {len(cs.window)} partitions; domain {domain.name!r} allows "
                f"{domain.max_window_partitions}")
    return None


@public
def decide(instance: dg.DagsterInstance, change_set_id: str, decision: str, identity: VerifiedIdentity, *,
           domains: Domains | None, comment: str = "", run_id: str | None = None, version: str | None = None,
           now: dt.datetime | None = None) -> tuple[Approval, dg.AssetObservation]:
    """Record one decision on the latest version of a change set (every rule in the module docstring).

    Args:
        instance: the Dagster instance (its ledger holds the decision).
        change_set_id: e.g. ``cs-1a2b3c4d5e``.
        decision: ``approve`` or ``reject``.
        identity: who decides, as verified (:func:`identity_from_token`, the Slack endpoint, or
            :func:`unverified_identity` for ``identity: unverified`` domains).
        domains: the domains as they are now.
        comment: why.
        run_id: the approval run, when decided in one.
        version: the version the person was shown; refused when the change set changed since.

    Returns:
        The signed :class:`Approval` and the ``dw/approval`` observation to log.

    Raises:
        ApprovalRefused: a rule is broken (the message names it); nothing was recorded.
    """
    now = now or utcnow()
    if decision not in PAST:
        raise ApprovalRefused(f"decision must be 'approve' or 'reject', got {decision!r}")
    led = ledger_for(instance)
    try:
        cs = load_change_set(led, change_set_id)
    except TamperedRecord as e:
        raise ApprovalRefused(f"{e}: refused as tampering") from e
    if cs is None:
        raise ApprovalRefused(f"no change set {change_set_id!r} in this Dagster instance")
    if version is not None and version != cs.version:
        raise ApprovalRefused(f"change set {cs.id} changed since you read it (version {version[:12]}… is now "
                              f"{cs.version[:12]}…): review the new version")
    domain = _domain(domains, cs)
    why = person_may_decide(domain, cs, identity, now) or (content_fits(domain, cs) if decision == "approve" else None)
    if why:
        raise ApprovalRefused(why)
    row = led.change_set_row(cs.id, cs.version)
    finishing = row.state == FAILED and decision == "approve" and row.latest
    if row.state in (REJECTED, APPLIED, EXPIRED, SUPERSEDED) or (row.state == FAILED and not finishing):
        raise ApprovalRefused(f"change set {cs.id} version {cs.version[:12]}… is {row.state}; a new proposal is needed")
    if now >= cs.expires_at:
        raise ApprovalRefused(f"change set {cs.id} expired at {cs.expires_at.isoformat()}; ask for a new proposal")
    signing_key()
    approval = signed(dict(id=f"ap-{uuid.uuid4().hex[:12]}", change_set_id=cs.id, change_set_version=cs.version,
                            decision=decision, approver=identity.email, decided_at=now, comment=comment,
                            run_id=run_id, identity=identity))
    if finishing:  # the repair failed half-way: this approval finishes it (the stages that succeeded stay done)
        try:
            led.record_finishing_decision(approval_id=approval.id, change_set_id=cs.id, version=cs.version,
                                          approver=identity.email, method=identity.method, decided_at=now.timestamp(),
                                          body=approval.model_dump_json(), credential_id=identity.credential_id,
                                          credential_purpose=f"finish {cs.id} {cs.version}")
        except LedgerError as e:
            raise ApprovalRefused(str(e)) from e
        return approval, approval_observation(cs, approval)
    try:
        ok = led.record_decision(approval_id=approval.id, change_set_id=cs.id, version=cs.version, decision=decision,
                                 approver=identity.email, method=identity.method, decided_at=now.timestamp(),
                                 body=approval.model_dump_json(), credential_id=identity.credential_id,
                                 credential_purpose=f"{decision} {cs.id} {cs.version}")
    except LedgerError as e:
        raise ApprovalRefused(str(e)) from e
    if not ok:
        current = active_decision(led, cs)
        who = f"{PAST[current.decision]} by {current.approver} at {current.decided_at.isoformat()}" if current else "decided"
        raise ApprovalRefused(f"change set {cs.id} version {cs.version[:12]}… was already decided ({who}); "
                              "a decision is single-use")
    return approval, approval_observation(cs, approval)


def approval_observation(cs: ChangeSet, a: Approval) -> dg.AssetObservation:
    """The ``dw/approval`` observation that shows a decision on the change set's target asset."""
    how = a.identity.describe() if a.identity is not None else a.approver
    return dg.AssetObservation(asset_key=dg.AssetKey(cs.target_asset),
                               description=describe(f"change set {cs.id} {PAST[a.decision]} by {how}", change_set_id=cs.id),
                               metadata={c.APPROVAL_KEY: dg.MetadataValue.json(a.model_dump(mode="json")),
                                         c.CHANGE_SET_ID_KEY: cs.id})


def refusal_observation(change_set_id: str, target_asset: list[str], who: str, decision: str, reason: str,
                        run_id: str | None) -> dg.AssetObservation:
    """The ``dw/approval_refused`` observation (who tried, why it was refused)."""
    return dg.AssetObservation(
        asset_key=dg.AssetKey(target_asset), description=describe(f"approval refused: {reason}", change_set_id=change_set_id),
        metadata={c.APPROVAL_REFUSED_KEY: dg.MetadataValue.json({
            "change_set_id": change_set_id, "approver": who, "decision": decision, "reason": reason,
            "at": utcnow().isoformat(), "run_id": run_id}), c.CHANGE_SET_ID_KEY: change_set_id})


# -- what lets a change set run ---------------------------------------------------------------------

def active_decision(led: Ledger, cs: ChangeSet) -> Approval | None:
    """The version's active decision as recorded (signature not yet checked), or None."""
    found = led.active_decision(cs.id, cs.version)
    if found is None:
        return None
    try:
        return Approval.model_validate_json(found[1])
    except ValidationError:
        return None


def is_autonomous_approval(a: Approval) -> bool:
    return a.approver.startswith(AUTONOMY_PREFIX)


@dataclass(frozen=True)
class ApprovalStatus:
    """Whether a change set version may run now.

    ``approval`` is the decision that lets it run (None otherwise); ``reason`` says why not;
    ``withdraw`` is set when the active decision no longer counts and should be withdrawn so a
    listed approver can decide (approver removed, autonomy lowered).
    """

    approval: Approval | None
    reason: str
    decision: Approval | None = None
    withdraw: bool = False


def approval_status(led: Ledger, cs: ChangeSet, domains: Domains | None, *, decision: Approval | None | type = ...,
                    now: dt.datetime | None = None) -> ApprovalStatus:
    """Check the version's active decision against the rules as they are now (see the module docstring)."""
    d = active_decision(led, cs) if decision is ... else decision
    if d is None:
        return ApprovalStatus(None, f"waiting for approval by {', '.join(cs.approvers)}")
    if d.change_set_version != cs.version or not signature_valid(d):
        return ApprovalStatus(None, f"decision {d.id} does not verify with this deployment's key "
                              f"${c.SIGNING_KEY_ENV}: it counts for nothing", d)
    if d.decision == "reject":
        return ApprovalStatus(None, f"rejected by {d.approver}", d)
    try:
        domain = _domain(domains, cs)
    except ApprovalRefused as e:
        return ApprovalStatus(None, str(e), d)
    if is_autonomous_approval(d):
        level = d.approver[len(AUTONOMY_PREFIX):]
        if domain.autonomy == level and domain.autonomous(cs.change_classes):
            return ApprovalStatus(d, "autonomous", d)
        return ApprovalStatus(None, f"autonomy {level} was withdrawn (domain {domain.name} is {domain.autonomy} now)",
                              d, withdraw=True)
    identity = d.identity or VerifiedIdentity(email=d.approver, method="unverified", verified_at=d.decided_at)
    why = person_may_decide(domain, cs, identity, d.decided_at) or content_fits(domain, cs)
    if why:
        return ApprovalStatus(None, f"approval {d.id} no longer counts: {why}", d, withdraw=True)
    if d.decided_at >= cs.expires_at:
        return ApprovalStatus(None, f"approval {d.id} was given after the expiry", d)
    return ApprovalStatus(d, "approved", d)


def valid_approval(instance: dg.DagsterInstance, cs: ChangeSet, domains: DomainsSource = None) -> Approval | None:
    """The approval that lets ``cs`` run now, or None (see :func:`approval_status`)."""
    try:
        doms = resolve_domains(domains)
    except DomainsFileError:
        return None
    return approval_status(ledger_for(instance), cs, doms).approval


def approved_change_set(instance: dg.DagsterInstance, change_set_id: str, consequence: str,
                        version: str | None = None) -> tuple[ChangeSet, Approval]:
    """The change set and the decision recorded for it, for an op about to act on a stage it holds.

    The remediation sensor checked the approval against the domains when it issued the stage's
    ticket; this re-checks what the op can check alone: the record's content hash, the active
    decision and its signature.

    Raises:
        dagster.Failure: no such change set, a tampered record, or no signed approval (the
            message ends with ``consequence``, e.g. "no receipt without one").
    """
    led = ledger_for(instance)
    try:
        cs = load_change_set(led, change_set_id, version)
    except TamperedRecord as e:
        raise dg.Failure(description=f"{e}; {consequence}") from e
    if cs is None:
        raise dg.Failure(description=f"no change set {change_set_id!r} in this instance's ledger; {consequence}")
    d = active_decision(led, cs)
    if d is None or d.decision != "approve" or not signature_valid(d):
        raise dg.Failure(description=f"change set {cs.id} has no valid approval; {consequence}")
    return cs, d


# -- the approval job ---------------------------------------------------------------------------------

class Decision(enum.Enum):
    approve = "approve"
    reject = "reject"


class ApprovalDecision(dg.Config):
    """Launchpad config of the approval job."""

    change_set_id: str = Field(description="the change set to decide, e.g. cs-1a2b3c4d5e")
    decision: Decision = Field(default=Decision.approve, description="approve or reject")
    id_token: str = Field(default="", description=(
        "an ID token from your identity provider bound to this decision (`dw-dagster approvals token CS` prints one); "
        "it proves who you are, is good for this decision only and is accepted once"))
    approver: str = Field(default="", description="your email; accepted only by a domain with identity: unverified")
    comment: str = Field(default="", description="why")


def _identity_for(domains: Domains | None, config: ApprovalDecision, cs: ChangeSet | None) -> VerifiedIdentity:
    if config.id_token.strip():
        if domains is None or cs is None:
            raise ApprovalRefused("an ID token cannot be checked without the domains file and the change set")
        return identity_from_token(domains, config.id_token, change_set_id=cs.id, version=cs.version,
                                   decision=config.decision.value)
    if config.approver.strip():
        if cs is not None and config.approver.strip().lower() == cs.proposer.lower():
            raise ApprovalRefused(f"{cs.proposer} proposed change set {cs.id} and cannot approve it")
        return unverified_identity(config.approver)
    raise ApprovalRefused("an ID token is required (id_token): `dw-dagster approvals token CHANGE_SET` gets one bound "
                          "to this decision")


@public
def build_approval_job(domains: DomainsSource = None, name: str = APPROVAL_JOB_NAME) -> dg.JobDefinition:
    """The approval job: one op (``dw_record_decision``, config :class:`ApprovalDecision`) that calls :func:`decide`.

    Args:
        domains: where the domains (approvers, identity providers) come from, read at each
            decision; default ``$DW_DOMAINS_FILE``.
        name: the job name.
    """

    @dg.op(name=c.APPROVAL_OP, tags={"kind": "dw"})
    def record_decision_op(context: dg.OpExecutionContext, config: ApprovalDecision) -> None:
        """Verify who decides and record the decision (see the module docstring)."""
        decision = config.decision.value
        cs = None
        who = config.approver.strip().lower() or "(ID token)"
        try:
            try:
                doms = resolve_domains(domains)
            except DomainsFileError as e:
                raise ApprovalRefused(f"cannot read the domains file: {e}") from e
            try:
                cs = load_change_set(context.instance, config.change_set_id)
            except TamperedRecord as e:
                raise ApprovalRefused(f"{e}: refused as tampering") from e
            identity = _identity_for(doms, config, cs)
            who = identity.email
            _, observation = decide(context.instance, config.change_set_id, decision, identity, domains=doms,
                                    comment=config.comment, run_id=context.run_id)
        except ApprovalRefused as e:
            # a refusal is the rules doing their job: recorded as a refusal (observation, run tags), the run
            # succeeds; a red failed run would read as "dw_dagster broke"
            if cs is not None:
                context.log_event(refusal_observation(cs.id, cs.target_asset, who, decision, str(e), context.run_id))
            context.instance.add_run_tags(context.run_id, {c.DECISION_TAG: "refused", c.REFUSAL_TAG: str(e)[:500]})
            context.log.warning(f"Approval refused (nothing recorded): {e}")
            return
        context.instance.add_run_tags(context.run_id, {c.DECISION_TAG: PAST[decision]})
        context.log_event(observation)
        context.log.info(f"Recorded: {observation.description}")

    @dg.job(name=name, tags={c.KIND_KEY: c.APPROVAL_KIND},
            description="Approve or reject a dw_dagster change set: a verified, listed approver; never the proposer.")
    def approval_job():
        record_decision_op()

    return approval_job


@public
def approve_in_process(instance: dg.DagsterInstance, change_set_id: str, *, id_token: str = "", approver: str = "",
                       decision: str = "approve", comment: str = "", domains: DomainsSource = None) -> tuple[bool, str]:
    """Run the approval job in this process against ``instance`` (what ``dw-dagster approve`` does).

    Args:
        id_token: an ID token bound to this decision (:func:`~dw_dagster.approval.identity.decision_nonce`).
        approver: a typed email, for ``identity: unverified`` domains only.
        domains: the domains file (default ``$DW_DOMAINS_FILE``).

    Returns:
        (recorded, message): message is the refusal reason when not recorded.
    """
    if decision not in PAST:
        return False, f"decision must be 'approve' or 'reject', got {decision!r}"
    result = build_approval_job(domains).execute_in_process(
        instance=instance,
        run_config={"ops": {c.APPROVAL_OP: {"config": {
            "change_set_id": change_set_id, "approver": approver, "id_token": id_token, "decision": decision,
            "comment": comment}}},
            # a refusal is an expected outcome, reported by the return value, not a stack trace
            "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}},
        tags={c.CHANGE_SET_TAG: change_set_id},
        raise_on_error=False,
    )
    run = instance.get_run_by_id(result.run_id)
    if result.success and run is not None and run.tags.get(c.DECISION_TAG) == "refused":
        return False, run.tags.get(c.REFUSAL_TAG, "refused")
    if result.success:
        obs = next((e.event_specific_data.asset_observation for e in result.all_events
                    if e.event_type_value == "ASSET_OBSERVATION"), None)
        return True, (obs.description if obs is not None else f"{PAST[decision]} change set {change_set_id}")
    failure = next((e for e in result.all_events if e.is_step_failure), None)
    msg = failure.event_specific_data.error.message if failure and failure.event_specific_data.error else "failed"
    msg = msg.strip()
    return False, msg[msg.index("Approval refused: ") + len("Approval refused: "):] if "Approval refused: " in msg else msg


approval_job = build_approval_job()


__all__ = [
    "APPROVAL_JOB_NAME", "ApprovalDecision", "ApprovalRefused", "ApprovalStatus", "approval_job", "approval_observation",
    "approval_status", "approve_in_process", "approved_change_set", "build_approval_job", "decide", "identity_from_token",
    "load_change_set", "parse_change_set", "record_proposal", "refusal_observation", "unverified_identity",
    "valid_approval",
]
