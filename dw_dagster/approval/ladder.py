"""The escalation ladder: an unanswered request is reminded, escalated to people who may decide, then denied.

Each domain may set, in the domains file (:class:`~dw_dagster.core.domains.Domain`)::

    remind_after: 2h                                   # remind the approvers
    escalate_after: 6h                                 # ask these people; they may decide from now on
    escalation_approvers: [head-of-data@grocer.example]
    deny_after: 24h                                    # the request ends expired: never granted

:func:`climb` walks every ladder one tick at a time. Two kinds of subject climb:

- **a request**: the latest version of a change set waiting for a decision (ledger state
  ``proposed``, no active decision), timed from its ``created_at``; its ``deny`` step is the
  version's recorded expiry (``expires_at``, which proposing again never renews): the version
  becomes ``expired`` and is never granted.
- **a repair** that ended without a verified receipt (failed at a stage, halted, applied but not
  verified), timed from the end of its receipt stage, while nobody acted on it (no newer version,
  no undo proposed, the incident not closed), in a domain that sets a ladder. Its ``deny`` step
  ends a halted version (``expired``: the remaining stages never run) and, for a failed one, says
  that nobody acted and the incident stays open.

Every step is one ledger transition (:meth:`~dw_dagster.core.ledger.Ledger.record_ladder_step`,
a unique key: recorded once whoever tries, however often) and one ``dw/escalation`` observation
on the change set's target asset, which the notification sensor carries to the right people by
every channel they have (a Slack DM, the domain's channel, the page, email, the Jira issue or
ServiceNow incident). A tick that finds several steps due at once (the sensor was off) records the
earlier ones as skipped and tells only the latest. Escalation approvers decide through the same
:func:`~dw_dagster.approval.job.decide` as approvers (verified, bound to the version), once
``escalate_after`` has passed (:meth:`~dw_dagster.core.domains.Domain.may_decide`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from dw_dagster.core.links import describe
from dw_dagster.core import keys as c
from dw_dagster.core.domains import Domain, Domains, duration_text
from dw_dagster.core.ledger import APPLIED, EXPIRED, FAILED, HALTED, PROPOSED, SUCCEEDED, Ledger, ledger_for
from dw_dagster.core.ledger_incidents import CLOSED
from dw_dagster.core.ledger_ladder import DENY, ESCALATE, REMIND, REPAIR, REQUEST, ladder_subject
from dw_dagster.core.models import ChangeSet, utcnow
from dw_dagster.core.records import parse_change_set, quarantine

#: how far back a repair that ended without a verified receipt is still climbed (the longest ladder)
REPAIR_HORIZON = dt.timedelta(days=15)
_WORDS = {REMIND: "reminded", ESCALATE: "escalated", DENY: "denied"}


@dataclass
class LadderTick:
    """What one climb did: the steps told (``dw/escalation`` payloads), the ones skipped, problems."""

    told: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        told = [f"{s['change_set_id']} {s['kind']} {s['step']} → {', '.join(s['to']) or 'nobody listed'}" for s in self.told]
        parts = ([f"told: {'; '.join(told)}"] if told else []) + ([f"skipped: {', '.join(self.skipped)}"]
                                                                    if self.skipped else []) + self.problems
        return "; ".join(parts) or "no ladder step due"


def _people(domain: Domain | None, step: str, kind: str) -> tuple[list[str], list[str], list[str]]:
    """(who is asked or told, who is copied, who may decide after this step)."""
    if domain is None:
        return [], [], []
    approvers, esc = list(domain.approvers), list(domain.escalation_approvers)
    if step == REMIND:
        return approvers, [], approvers
    if step == ESCALATE:
        return esc, approvers + [x for x in domain.escalation if x not in esc], approvers + esc
    cc = [x for x in domain.escalation if x not in approvers + esc]
    return approvers + [x for x in esc if x not in approvers], cc, []


def _text(kind: str, step: str, cs: ChangeSet, domain: Domain | None, what: str) -> str:
    who = ", ".join(_people(domain, step, kind)[0]) or "nobody listed"
    if kind == REQUEST:
        if step == REMIND:
            return f"Reminder: change set {cs.id} ({what}) still waits for a decision by {who}."
        if step == ESCALATE:
            return (f"Escalated: change set {cs.id} ({what}) had no decision after "
                    f"{duration_text(domain.escalate_after)}; {who} may now decide it.")
        return f"Denied: change set {cs.id} ({what}) expired without a decision. Nothing was applied; it was never granted."
    if step == REMIND:
        return f"Reminder: the repair of change set {cs.id} ended {what}; nobody acted yet ({who})."
    if step == ESCALATE:
        return (f"Escalated: the repair of change set {cs.id} ended {what} and nobody acted after "
                f"{duration_text(domain.escalate_after)}; {who} may now decide (undo, continue or a new version).")
    return f"Ladder ended: nobody acted on the repair of change set {cs.id} ({what}); the incident stays open."


class _Climb:
    """One tick over every ladder (see the module docstring)."""

    def __init__(self, instance: dg.DagsterInstance, domains: Domains | None, now: dt.datetime) -> None:
        self.instance, self.domains, self.now = instance, domains, now
        self.led: Ledger = ledger_for(instance)
        self.out = LadderTick()

    def domain(self, cs: ChangeSet) -> Domain | None:
        if self.domains is None:
            return None
        try:
            return self.domains.get(cs.domain)
        except KeyError:
            return None

    def parse(self, row) -> ChangeSet | None:
        try:
            return parse_change_set(row.body)
        except Exception as e:  # noqa: BLE001 - a tampered record climbs nothing; it is quarantined
            quarantine(self.instance, f"change_set:{row.change_set_id}:{row.version}", "change_set", row.target_asset, str(e))
            return None

    def requests(self) -> None:
        for row in self.led.change_set_rows(states=[PROPOSED]):
            if self.led.active_decision(row.change_set_id, row.version) is not None:
                continue
            cs = self.parse(row)
            if cs is None:
                continue
            domain = self.domain(cs)
            plan = [(s, cs.created_at + after) for s, after in (domain.ladder()[:-1] if domain else [])]
            plan.append((DENY, cs.expires_at))
            self.climb(REQUEST, cs, domain, plan, f"proposed {cs.created_at:%Y-%m-%d %H:%M UTC}: {cs.summary}")
        # a version a tick marked expired but ended before recording the step (a crash between the two)
        since = (self.now - REPAIR_HORIZON).timestamp()
        expired = self.led.change_set_rows(states=[EXPIRED], updated_after=since)
        done = self.led.ladder_done(ladder_subject(REQUEST, r.change_set_id, r.version) for r in expired)
        for row in expired:
            if DENY in done[ladder_subject(REQUEST, row.change_set_id, row.version)]:
                continue
            if "expired without a decision" not in (row.note or "") or self.led.active_decision(
                    row.change_set_id, row.version) is not None:
                continue
            cs = self.parse(row)
            if cs is not None:
                self.climb(REQUEST, cs, self.domain(cs), [(DENY, cs.expires_at)],
                           f"proposed {cs.created_at:%Y-%m-%d %H:%M UTC}: {cs.summary}", expired=True)

    def repairs(self) -> None:
        since = (self.now - REPAIR_HORIZON).timestamp()
        rows = self.led.change_set_rows(states=[APPLIED, FAILED, HALTED], updated_after=since)
        stages = self.led.stages_of_many([(r.change_set_id, r.version) for r in rows])
        for row in rows:
            st = stages.get((row.change_set_id, row.version), {})
            receipt = st.get("receipt-halt") if row.state == HALTED else st.get("receipt")
            receipt = receipt or st.get("receipt") or st.get("receipt-halt")
            if receipt is None or receipt.state != SUCCEEDED or (receipt.result or {}).get("verified") is not False:
                continue
            if self.led.change_set_row(f"{row.change_set_id}-undo") is not None:
                continue  # someone acted: an undo was proposed
            inc = self.led.incident(row.incident_id)
            if inc is not None and inc.state == CLOSED:
                continue
            cs = self.parse(row)
            domain = self.domain(cs) if cs is not None else None
            if cs is None or domain is None or not (domain.remind_after or domain.escalate_after or domain.deny_after):
                continue
            ended = dt.datetime.fromtimestamp(receipt.finished_at or row.updated_at, dt.timezone.utc)
            plan = [(s, ended + after) for s, after in domain.ladder()]
            outcome = str((receipt.result or {}).get("outcome") or row.state)
            self.climb(REPAIR, cs, domain, plan, f"{row.state}: {outcome}"[:500], halted=row.state == HALTED)

    def climb(self, kind: str, cs: ChangeSet, domain: Domain | None, plan: list[tuple[str, dt.datetime]],
              what: str, *, halted: bool = False, expired: bool = False) -> None:
        subject = ladder_subject(kind, cs.id, cs.version)
        due = [(s, at) for s, at in plan if self.now >= at]
        if not due:
            return
        done = self.led.ladder_done([subject])[subject]
        for step, at in due[:-1]:  # earlier steps due at once: recorded as skipped, told no one
            if step not in done and self.led.record_ladder_step(
                    kind=kind, change_set_id=cs.id, version=cs.version, incident_id=cs.incident_id, step=step,
                    body={"skipped": True, "due_at": at.isoformat(), "reason": f"{due[-1][0]} was due too"}):
                self.led.mark_ladder_shown(subject, step)
                self.out.skipped.append(f"{cs.id} {kind} {step}")
        step, at = due[-1]
        if step in done:
            return
        if step == DENY and kind == REQUEST and not expired and not self.led.set_change_set_state(
                cs.id, cs.version, EXPIRED, from_states=[PROPOSED], note="expired without a decision (ladder: denied)"):
            return  # decided (or superseded) meanwhile
        if step == DENY and halted:
            self.led.set_change_set_state(cs.id, cs.version, EXPIRED, from_states=[HALTED],
                                          note="halted and nobody continued it (ladder: denied)")
        to, cc, deciders = _people(domain, step, kind)
        payload = {"kind": kind, "step": step, "change_set_id": cs.id, "version": cs.version,
                   "incident_id": cs.incident_id, "domain": cs.domain, "target_asset": list(cs.target_asset),
                   "to": to, "cc": cc, "may_decide": deciders, "due_at": at.isoformat(), "at": self.now.isoformat(),
                   "text": _text(kind, step, cs, domain, what), "summary": cs.summary,
                   "slack_channel": domain.slack_channel if domain else None}
        if not self.led.record_ladder_step(kind=kind, change_set_id=cs.id, version=cs.version,
                                           incident_id=cs.incident_id, step=step, body=payload):
            return  # another process took this step first
        self.show(payload)
        self.out.told.append(payload)

    def show(self, payload: dict[str, Any]) -> None:
        """The step's ``dw/escalation`` observation (and ``dw/change_set_expired`` for a denied request)."""
        md: dict[str, Any] = {c.ESCALATION_KEY: dg.MetadataValue.json(payload), c.CHANGE_SET_ID_KEY: payload["change_set_id"]}
        if payload["kind"] == REQUEST and payload["step"] == DENY:
            md[c.EXPIRED_KEY] = dg.MetadataValue.json({
                "change_set_id": payload["change_set_id"], "version": payload["version"],
                "expired_at": payload["due_at"], "escalated_to": (payload["cc"] or [None])[0],
                "told": payload["to"], "notified": False})
        who = ", ".join(payload["to"]) or "nobody listed"
        desc = f"change set {payload['change_set_id']}: {payload['kind']} {_WORDS[payload['step']]} ({who}): {payload['text']}"
        self.instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=dg.AssetKey(payload["target_asset"]), description=describe(desc, change_set_id=payload["change_set_id"]),
            metadata=md))
        self.led.mark_ladder_shown(ladder_subject(payload["kind"], payload["change_set_id"], payload["version"]),
                                   payload["step"])

    def unshown(self) -> None:
        """Show again the steps recorded by a tick that ended before it showed them."""
        for row in self.led.ladder_steps(shown=False):
            if row.body.get("skipped"):
                self.led.mark_ladder_shown(row.subject, row.step)
            elif "target_asset" in row.body:
                self.show(row.body)
                self.out.told.append(row.body)


def climb(instance: dg.DagsterInstance, domains: Domains | None, now: dt.datetime | None = None) -> LadderTick:
    """Take every ladder step that is due at ``now`` (default: the current time), once.

    Args:
        instance: the Dagster instance (its ledger holds the steps; the observations go there).
        domains: the domains as they are now (None: requests still expire, nothing else climbs).
        now: the time to climb at (tests pass a clock they control).

    Returns:
        What was told, what was skipped and what went wrong (one change set's problem never stops
        the others).
    """
    tick = _Climb(instance, domains, now or utcnow())
    tick.unshown()
    for part in (tick.requests, tick.repairs):
        try:
            part()
        except Exception as e:  # noqa: BLE001 - reported in the tick; retried next tick
            tick.out.problems.append(f"{part.__name__}: {type(e).__name__}: {e}")
    return tick.out


def ladder_history(instance: dg.DagsterInstance, *, change_set_id: str | None = None,
                   incident_id: str | None = None) -> list[dict[str, Any]]:
    """The ladder steps recorded for a change set or an incident, oldest first, for pages and the CLI:
    ``{subject, kind, step, at, skipped, to, cc, text}``."""
    out = []
    for row in ledger_for(instance).ladder_steps(change_set_id=change_set_id, incident_id=incident_id):
        b = row.body
        out.append({"subject": row.subject, "kind": row.kind, "step": row.step, "change_set_id": row.change_set_id,
                    "version": row.version, "at": dt.datetime.fromtimestamp(row.at, dt.timezone.utc).isoformat(),
                    "skipped": bool(b.get("skipped")), "to": b.get("to", []), "cc": b.get("cc", []),
                    "text": b.get("text") or b.get("reason", "")})
    return out


Clock = Callable[[], dt.datetime]

__all__ = ["Clock", "LadderTick", "climb", "ladder_history"]
