"""Autonomous approvals and expiry: the decisions dw_dagster makes or lets lapse on its own.

**Autonomous approvals** (L3/L4, :meth:`dw_dagster.core.domains.Domain.autonomous`): the remediation
sensor records, in the ledger, a decision signed like a person's with approver
``dw-dagster/autonomy:L3`` (or L4), only for a version nobody decided before. It counts only while
the domains file still allows it; when the level is lowered it is withdrawn, so the owner can decide
(:mod:`dw_dagster.repair.sensor` says what happens to a repair already under way). No autonomous
approval is made during an org-wide stop (:mod:`dw_dagster.guard.stop`).

**Expiry and escalation.** :func:`build_expiry_sensor` climbs each domain's escalation ladder
(:mod:`dw_dagster.approval.ladder`): it reminds, escalates to people who may then decide, and
marks a version that reached its ``expires_at`` without a decision expired (in the ledger and as
``dw/change_set_expired``); it never grants anything.
"""

import datetime as dt
import uuid
from collections.abc import Callable

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core.domains import Domain, DomainsFileError, DomainsSource, resolve_domains
from dw_dagster.core.identity import VerifiedIdentity
from dw_dagster.core.ledger import EXPIRED, LedgerError, ledger_for
from dw_dagster.core.models import Approval, ChangeSet, utcnow
from dw_dagster.core.signing import signed
from dw_dagster.approval.job import AUTONOMY_PREFIX, approval_observation, is_autonomous_approval

EXPIRED_KEY = c.EXPIRED_KEY


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
    return signed(dict(id=f"ap-{uuid.uuid4().hex[:12]}", change_set_id=cs.id, change_set_version=cs.version,
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
    name: str = c.EXPIRY_SENSOR,
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


__all__ = ["EXPIRED_KEY", "autonomous_approval", "build_expiry_sensor", "expired_ids", "is_autonomous_approval",
           "record_autonomous_approval"]
