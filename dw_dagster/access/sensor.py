"""The access sensor: approvals in, the grant out, a reminder, and the revoke at ``expires_at`` exactly once.

Each tick reads the ledger's live access requests (indexed on state and expiry; never the event log):

- **pending**: every domain's change set is checked with the approval rules as they are now
  (:func:`dw_dagster.access.jobs.all_approved`); all approved → ``approved``; one rejected →
  ``rejected`` (the others superseded); one expired (the expiry sensor marks and escalates it) or
  the grant's own end reached → ``expired``. A domain that allows autonomous access gets its
  autonomous approval here, only for a part of the grant that opens no sensitive column.
- **approved**: the grant stage's ticket is issued on the first domain's change set and one run of
  ``dw_access_grant`` is requested (run key ``<request>:grant:<ticket>``).
- **active**: at ``expires_at - remind_before`` the requester's reminder is claimed once and sent
  (:mod:`dw_dagster.access.notify`); at ``expires_at`` the revoke stage ``revoke-<n>`` gets its
  ticket and one run of ``dw_access_revoke`` is requested. A revoke that failed (incident open) is
  tried again as ``revoke-<n+1>`` at ``next_revoke_at``; a grant that failed is revoked the same way.

Exactly once across ticks, restarts and two daemons: a stage's ticket is issued once (the ledger's
primary key), the state moves by compare-and-set, the reminder is claimed once. A ticket that no
run took (a dry run of this sensor showed it) is replaced after ``reissue_after_seconds``; a stage
whose run ended without completing it (crashed, deleted) counts as a failed attempt.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import dagster as dg

from dw_dagster.access.jobs import AccessConfig, all_approved
from dw_dagster.access.models import AccessRequest
from dw_dagster.access.notify import Notifier, reminder_text
from dw_dagster.access.request import event
from dw_dagster.core import keys as c
from dw_dagster.core.domains import DomainsFileError, DomainsSource, resolve_domains
from dw_dagster.core.ledger import (
    ABANDONED, EXPIRED as CS_EXPIRED, ISSUED, REJECTED as CS_REJECTED, STAGE_FAILED, STARTED, SUPERSEDED as CS_SUPERSEDED,
    LedgerError, ledger_for,
)
from dw_dagster.core.ledger_access import (
    ACTIVE, APPROVED, EXPIRED, GRANT_FAILED, GRANTING, PENDING, REJECTED, REVOKE_FAILED, REVOKING,
)
from dw_dagster.core.models import utcnow
from dw_dagster.core.records import load_change_set
from dw_dagster.guard.stop import active_stop
from dw_dagster.approval.autonomy import record_autonomous_approval
from dw_dagster.guard.admission import TICKET_TAG, run_shape, run_started, stage_run_ended


def build_access_sensor(*, grant_job: dg.JobDefinition, revoke_job: dg.JobDefinition, domains: DomainsSource = None,
                        notifiers: Sequence[Notifier] = (), name: str = c.ACCESS_SENSOR, minimum_interval_seconds: int = 30,
                        reissue_after_seconds: float | None = None,
                        default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED) -> dg.SensorDefinition:
    """The access sensor (module docstring).

    Args:
        grant_job, revoke_job: from :func:`dw_dagster.access.jobs.build_access_jobs`.
        domains: the domains as they are now; default ``$DW_DOMAINS_FILE``. Unreadable: nothing is
            granted (revokes still go ahead).
        notifiers: where reminders go (:class:`~dw_dagster.access.notify.EmailNotifier`,
            :class:`~dw_dagster.access.notify.SlackNotifier`); none: the reminder is only an event.
        minimum_interval_seconds: the tick interval (the revoke happens at the first tick at or
            after ``expires_at``).
        reissue_after_seconds: replace a ticket no run took after this long (default four
            intervals, at least 120 s).
    """
    reissue_after = reissue_after_seconds if reissue_after_seconds is not None else max(120.0, 4.0 * minimum_interval_seconds)

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               jobs=[grant_job, revoke_job],
               description="Grants approved dw_dagster access requests, reminds, and revokes them at their expiry.")
    def _sensor(context: dg.SensorEvaluationContext):
        tick = _Tick(context, domains, notifiers, reissue_after, grant_job.name, revoke_job.name)
        tick.run()
        if tick.requests or tick.events:
            return dg.SensorResult(run_requests=tick.requests, asset_events=tick.events,
                                   skip_reason=None if tick.requests else ("; ".join(tick.notes)[:1000] or None))
        return dg.SkipReason("; ".join(tick.notes)[:1000] or "no access request waits, and no grant ends")

    return _sensor


class _Tick:
    def __init__(self, context, domains: DomainsSource, notifiers, reissue_after: float, grant_job: str,
                 revoke_job: str) -> None:
        self.context, self.instance = context, context.instance
        self.led = ledger_for(self.instance)
        self.domains_source, self.notifiers, self.reissue_after = domains, list(notifiers), reissue_after
        self.grant_job, self.revoke_job = grant_job, revoke_job
        self.requests: list[dg.RunRequest] = []
        self.events: list[dg.AssetObservation] = []
        self.notes: list[str] = []
        self.now = utcnow()

    def run(self) -> None:
        try:
            self.doms = resolve_domains(self.domains_source)
        except DomainsFileError as e:
            self.doms = None
            self.notes.append(f"domains file unreadable, nothing granted: {e}"[:300])
        stopped = active_stop(self.instance)
        if stopped is not None:
            self.notes.append(f"org-wide stop by {stopped.by}: no grant is dispatched (revokes go ahead)")
        horizon = self.now.timestamp() + (self.doms.access.remind_before_minutes * 60 if self.doms else 3600)
        rows = self.led.access_rows(states=[PENDING, APPROVED, GRANTING, REVOKING, GRANT_FAILED, REVOKE_FAILED])
        rows += self.led.access_rows(states=[ACTIVE], due_before=horizon)
        for row in sorted(rows, key=lambda r: r.expires_at):
            try:
                req = AccessRequest.model_validate_json(row.body)
                self.one(row, req, stopped is None and self.doms is not None)
            except Exception as e:  # noqa: BLE001 - one request's problem never stops the others (or a revoke)
                self.context.log.exception(f"access sensor failed on {row.request_id}")
                self.notes.append(f"{row.request_id}: {type(e).__name__}: {e}"[:300])

    def one(self, row, req: AccessRequest, may_grant: bool) -> None:
        if row.state == PENDING:
            self.pending(row, req)
        elif row.state in (APPROVED, GRANTING):
            if row.state == APPROVED and not may_grant:
                return
            if self.now >= req.expires_at and row.state == APPROVED:
                if self.led.move_access(req.id, EXPIRED, from_states=[APPROVED], note="the grant's end came before it was granted"):
                    self.events.append(event(req.id, "expired", f"access request {req.id} ended before it was granted"))
                return
            self.stage(row, req, "grant", self.grant_job, from_states=[APPROVED, GRANTING], to=GRANTING)
        elif row.state == ACTIVE:
            self.remind(row, req)
            if self.now.timestamp() >= row.expires_at:
                self.revoke(row, req)
        elif row.state in (GRANT_FAILED, REVOKE_FAILED):
            if row.next_revoke_at is None or self.now.timestamp() >= row.next_revoke_at:
                self.revoke(row, req)
        elif row.state == REVOKING:
            self.stage(row, req, f"revoke-{row.revoke_attempts}", self.revoke_job, from_states=[REVOKING], to=REVOKING)

    # -- pending -----------------------------------------------------------------------------------

    def pending(self, row, req: AccessRequest) -> None:
        from dw_dagster.proposals.change_sets import propose
        from dw_dagster.access.request import change_sets_for

        sets = []
        for cs_id in req.change_sets:
            cs = load_change_set(self.led, cs_id)
            if cs is None and self.doms is not None:  # recorded before its change sets (a crash between): propose again
                cs = next((x for x in change_sets_for(req, self.doms, req.requested_at) if x.id == cs_id), None)
                if cs is not None:
                    cs = propose(self.instance, cs)[0]
            if cs is not None:
                sets.append(cs)
        for cs in sets:
            st = self.led.change_set_row(cs.id, cs.version).state
            if st == CS_REJECTED:
                d = self.led.active_decision(cs.id, cs.version)
                return self.end(req, REJECTED, f"rejected in domain {cs.domain}" + (f" ({d[0]})" if d else ""), sets)
            if st in (CS_EXPIRED, CS_SUPERSEDED) or (self.now >= cs.expires_at and self.led.active_decision(cs.id, cs.version) is None):
                return self.end(req, EXPIRED, f"domain {cs.domain} did not decide by {cs.expires_at.isoformat()}", sets)
        if self.now >= req.expires_at:
            return self.end(req, EXPIRED, "the grant's end came before every domain approved", sets)
        if self.doms is None:
            return
        for cs in sets:
            domain = self.doms.get(cs.domain) if cs.domain in {d.name for d in self.doms.domains} else None
            part = next((d for d in req.dry_run.domains if d.domain == cs.domain), None)
            if (domain is not None and domain.autonomous_access == "non_sensitive" and part is not None and not part.sensitive
                    and domain.autonomous(cs.change_classes) and self.led.active_decision(cs.id, cs.version) is None):
                made = record_autonomous_approval(self.instance, cs, domain)
                if made is not None:
                    self.events.append(made[1])
        approvals, why = all_approved(self.instance, req, self.doms)
        if why:
            self.notes.append(f"{req.id}: waiting ({why})")
            return
        if self.led.move_access(req.id, APPROVED, from_states=[PENDING]):
            self.events.append(event(req.id, "approved", f"access request {req.id} approved by "
                                     f"{', '.join(a.approver for a in approvals)} (every domain)",
                                     {"approvers": [a.approver for a in approvals]}))

    def end(self, req: AccessRequest, state: str, why: str, sets) -> None:
        if not self.led.move_access(req.id, state, from_states=[PENDING], note=why):
            return
        for cs in sets:
            self.led.set_change_set_state(cs.id, cs.version, CS_SUPERSEDED, from_states=["proposed", "approved", "halted"],
                                          note=f"access request {req.id} {state}: {why}")
        self.events.append(event(req.id, state, f"access request {req.id} {state}: {why}", {"reason": why}))

    # -- stages ------------------------------------------------------------------------------------

    def anchor(self, req: AccessRequest):
        cs = load_change_set(self.led, req.change_sets[0])
        d = self.led.active_decision(cs.id, cs.version)
        return cs, (d[0] if d else None)

    def stage(self, row, req: AccessRequest, stage: str, job: str, *, from_states, to: str) -> None:
        """Dispatch ``stage`` once: issue its ticket (or replace a ticket no run took), or settle a
        stage whose run ended without recording its end."""
        cs, approval_id = self.anchor(req)
        st = self.led.stages(cs.id, cs.version).get(stage)
        if st is None:
            if approval_id is None:
                self.notes.append(f"{req.id}: no decision on {cs.id} to dispatch {stage} under")
                return
            config = {"ops": {c.ACCESS_GRANT_OP if stage == "grant" else c.ACCESS_REVOKE_OP: {
                "config": AccessConfig(request_id=req.id).model_dump()}}}
            try:
                ticket = self.led.issue_ticket(cs.id, cs.version, stage, approval_id, job, run_shape(job, {}, None, config))
            except LedgerError as e:
                self.notes.append(f"{req.id}: {e}")
                return
            if ticket is None:
                self.notes.append(f"{req.id}: stage {stage} was issued by another tick")
                return
            self.led.move_access(req.id, to, from_states=from_states)
            self.dispatch(req, cs, stage, job, ticket, config)
            return
        if st.state == ISSUED and time.time() - st.issued_at >= self.reissue_after:
            live = [r for r in self.instance.get_runs(filters=dg.RunsFilter(tags={TICKET_TAG: st.ticket})) if not r.is_finished]
            if not live:
                new = self.led.rotate_ticket(st.ticket)
                if new:
                    config = {"ops": {c.ACCESS_GRANT_OP if stage == "grant" else c.ACCESS_REVOKE_OP: {
                        "config": AccessConfig(request_id=req.id).model_dump()}}}
                    self.dispatch(req, cs, stage, job, new, config)
            return
        if st.state == STARTED:
            ended = stage_run_ended(self.led, self.instance, st)
            if ended is None:
                return
            run = self.instance.get_run_by_id(st.run_id) if st.run_id else None
            if run is None and time.time() - (st.started_at or st.issued_at) < self.reissue_after:
                # bound a moment ago by a run another daemon is still creating: not vanished yet
                self.notes.append(f"{req.id}: stage {stage} is starting (run {str(st.run_id)[:8]})")
                return
            if run is not None and run.status == dg.DagsterRunStatus.CANCELED and not run_started(self.instance, run.run_id):
                self.led.reissue_ticket(st.ticket, st.run_id)
                return
            if run is None:
                self.led.abandon_stage(st.ticket, ended[1])
            else:
                self.led.complete_stage(st.ticket, st.run_id, success=ended[0], result={"reconciled": ended[1]})
            if not ended[0]:
                self.settle_failed(req, stage, ended[1])
            return
        if st.state in (STAGE_FAILED, ABANDONED):
            self.settle_failed(req, stage, str((st.result or {}).get("reason") or st.state))

    def settle_failed(self, req: AccessRequest, stage: str, why: str) -> None:
        """A stage whose run ended without its op recording the outcome: a failed grant (revoked
        next) or a failed revoke attempt (tried again)."""
        retry = (self.doms.access.revoke_retry_minutes if self.doms else 5.0) * 60
        if stage == "grant":
            moved = self.led.move_access(req.id, GRANT_FAILED, from_states=[GRANTING], note=f"grant run ended: {why}",
                                         next_revoke_at=self.now.timestamp())
        else:
            moved = self.led.move_access(req.id, REVOKE_FAILED, from_states=[REVOKING], note=f"revoke run ended: {why}",
                                         next_revoke_at=self.now.timestamp() + retry)
        if moved:
            self.events.append(event(req.id, f"{stage}_ended", f"{stage} of access {req.id} ended without completing: {why}"))

    def revoke(self, row, req: AccessRequest) -> None:
        attempt = row.revoke_attempts + 1
        if self.led.move_access(req.id, REVOKING, from_states=[row.state], revoke_attempts=attempt):
            self.stage(row, req, f"revoke-{attempt}", self.revoke_job, from_states=[REVOKING], to=REVOKING)

    def dispatch(self, req: AccessRequest, cs, stage: str, job: str, ticket: str, config: dict) -> None:
        tags = {TICKET_TAG: ticket, c.CHANGE_SET_TAG: cs.id, c.STAGE_TAG: stage, c.ACCESS_REQUEST_TAG: req.id}
        self.requests.append(dg.RunRequest(run_key=f"{req.id}:{stage}:{ticket[:10]}", job_name=job, run_config=config,
                                           tags=tags))

    # -- reminder ----------------------------------------------------------------------------------

    def remind(self, row, req: AccessRequest) -> None:
        before = min((self.doms.access.remind_before_minutes if self.doms else 60) * 60, req.spec.duration_s / 2)
        if row.reminded_at is not None or self.now.timestamp() < row.expires_at - before or self.now.timestamp() >= row.expires_at:
            return
        if not self.led.claim_reminder(req.id):
            return
        ref = f"dw:access:{req.id}:reminder"
        text = reminder_text(req)
        earlier = (row.result.get("reminder") or {}).get("channels") or {}  # channels a failed attempt already reached
        done: dict[str, str] = dict(earlier)
        try:
            for i, n in enumerate(self.notifiers):
                if str(i) not in done:
                    done[str(i)] = n.remind(req, ref=ref, text=text)
        except Exception as e:  # noqa: BLE001 - the claim is freed; the next tick tries the channels not reached
            self.led.finish_reminder(req.id, False, {"error": f"{type(e).__name__}: {e}"[:500], "channels": done})
            self.notes.append(f"{req.id}: reminder not sent ({type(e).__name__}); tried again next tick")
            self.context.log.warning(f"reminder of access {req.id} not sent, tried again next tick: {type(e).__name__}: {e}")
            return
        sent = [done[k] for k in sorted(done)]
        self.led.finish_reminder(req.id, True, {"channels": done, "sent": sent, "at": utcnow().isoformat(), "text": text})
        self.events.append(event(req.id, "reminded", f"reminded {req.requester}: access {req.id} ends at "
                                 f"{req.expires_at.isoformat()}", {"to": req.requester, "channels": sent, "text": text}))


__all__ = ["build_access_sensor"]
