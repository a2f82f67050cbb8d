"""The remediation sensor's tick as a class: one evaluation walks each active change set one stage further.

:func:`dw_dagster.repair.sensor.build_remediation_sensor` builds the :class:`RemediationJobs` once and
calls :meth:`RemediationTick.evaluate` on each evaluation (the module docstring of
:mod:`dw_dagster.repair.sensor` describes the stages).
"""

import datetime as dt
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from dw_dagster.approval.job import approval_status, parse_change_set
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.asset_graph import asset_graph_of
from dw_dagster.core.domains import ACCESS_GRANT, DomainsFileError, DomainsSource, resolve_domains
from dw_dagster.core.ledger import (
    ABANDONED,
    ACTIVE_STATES,
    APPLIED,
    APPROVED,
    FAILED,
    HALTED,
    ISSUED,
    PROPOSED,
    RUNNING,
    STAGE_FAILED,
    STARTED,
    SUCCEEDED,
    SUPERSEDED,
    Ledger,
    LedgerError,
    ledger_for,
)
from dw_dagster.core.models import Approval, ChangeSet, TamperedRecord, utcnow
from dw_dagster.guard.stop import active_stop
from dw_dagster.approval.autonomy import record_autonomous_approval
from dw_dagster.guard.admission import TICKET_TAG, run_shape, run_started, stage_run_ended
from dw_dagster.repair.liveness import (
    MAX_ATTEMPTS,
    NO_STEP_ATTEMPTS,
    backoff_seconds,
    executed_a_step,
    finish_or_undo,
    infrastructure_failure,
    may_retry,
    stale_assets,
)
from dw_dagster.changes.steps import step_op_name, step_stages
from dw_dagster.core.windows import window_run_request
from dw_dagster.repair.stages import (
    DAEMON,
    DRY_RUN,
    HALT_RECEIPT,
    VERSION_TAG,
    changes_data,
    contiguous_ranges,
    receipt_config,
    sensor_evaluation,
    stage_plan,
    unmerged_files,
    window_stage_assets,
    withdrawal_observation,
)


@dataclass(frozen=True)
class RemediationJobs:
    """What a remediation sensor was built with (see :func:`~dw_dagster.repair.sensor.build_remediation_sensor`)."""

    verify_job: dg.JobDefinition
    receipt_job: dg.JobDefinition
    window_job: dg.JobDefinition | None = None
    rebuild_job: dg.JobDefinition | None = None
    undo_jobs: tuple[dg.JobDefinition, dg.JobDefinition] | None = None
    step_jobs: Mapping[str, dg.JobDefinition] = field(default_factory=dict)
    partitions_def: dg.PartitionsDefinition | None = None
    partitions_of: dg.AssetKey | None = None
    pipeline_root: str | Path | None = None
    domains: DomainsSource = None
    reissue_after_s: float = 120.0
    stage_gates: Mapping[str, Callable[[dg.DagsterInstance, ChangeSet], str | None]] = field(default_factory=dict)
    accepts: Callable[[ChangeSet], bool] | None = None

    def all(self) -> list[dg.JobDefinition]:
        """Every job the sensor may request."""
        return [j for j in (self.window_job, self.rebuild_job, self.verify_job, self.receipt_job, *(self.undo_jobs or ()),
                            *self.step_jobs.values()) if j is not None]


class RemediationTick:
    """One evaluation of the remediation sensor: walks every active change set one step further.

    Holds what the tick decided (run requests, asset events, why each change set waits); the sensor
    returns them (:meth:`evaluate`).
    """

    def __init__(self, context: dg.SensorEvaluationContext, jobs: RemediationJobs, led: Ledger, doms, ordered: list[str],
                 pdef: dg.PartitionsDefinition | None = None) -> None:
        self.context, self.jobs, self.led, self.doms, self.ordered = context, jobs, led, doms, ordered
        self.instance = context.instance
        self.pdef = pdef  # the repaired asset's partitions definition (a multi-partition window is checked)
        self.mode, self.location, self.repository, self.tick_id = sensor_evaluation(context)
        self.dry_run = self.mode == DRY_RUN
        self.requests: list[dg.RunRequest] = []
        self.events: list[dg.AssetObservation] = []
        self.waiting: list[str] = []
        self.earlier: dict[str, str] = {}  # change set id -> an earlier version whose repair is under way

    @classmethod
    def evaluate(cls, context: dg.SensorEvaluationContext, jobs: RemediationJobs):
        """The tick: a ``SkipReason`` (why nothing is dispatched) or a ``SensorResult``."""
        instance = context.instance
        stop = active_stop(instance)
        if stop is not None:  # org-wide stop: nothing is dispatched, approvals wait
            return dg.SkipReason(f"org-wide stop by {stop.by} since {stop.at.isoformat()}: {stop.reason or 'no reason given'}; "
                                 "nothing is dispatched until a verified operator resumes (`dw-dagster resume`)")
        try:
            doms = resolve_domains(jobs.domains)
        except DomainsFileError as e:  # a broken domains file never grants anything
            return dg.SkipReason(f"domains file unreadable, nothing dispatched: {e}"[:1000])
        led = ledger_for(instance)
        pdef = jobs.partitions_def
        if pdef is None and jobs.partitions_of is not None:
            graph = asset_graph_of(context)
            key = dg.AssetKey(jobs.partitions_of) if not isinstance(jobs.partitions_of, dg.AssetKey) else jobs.partitions_of
            pdef = graph.get(key).partitions_def if graph is not None and graph.has(key) else None
        ordered = pdef.get_partition_keys(dynamic_partitions_store=instance) if pdef is not None else []
        # the latest version of every change set waiting or under way, and any earlier version whose
        # repair is under way (a newer version was recorded mid-repair): it is walked to its end
        rows = led.change_set_rows(states=ACTIVE_STATES, latest_only=False)
        keys = [(r.change_set_id, r.version) for r in rows]
        decisions = led.active_decisions(keys)
        all_stages = led.stages_of_many(keys)
        now = utcnow()
        plan = cls(context, jobs, led, doms, ordered, pdef)
        plan.earlier = {r.change_set_id: r.version for r in rows if not r.latest and all_stages.get((r.change_set_id, r.version))
                        and r.state != HALTED}
        for row in rows:
            if not row.latest and (row.state == HALTED or not all_stages.get((row.change_set_id, row.version))):
                # recorded before this dw_dagster superseded such versions itself: nothing of it runs any more
                try:
                    led.set_change_set_state(row.change_set_id, row.version, SUPERSEDED, from_states=[row.state],
                                             note="a newer version was recorded before its repair went on")
                except Exception as e:  # noqa: BLE001 - retried next tick; never stops the others
                    plan.waiting.append(f"{row.change_set_id}: {type(e).__name__}: {e}")
                continue
            try:
                cs = parse_change_set(row.body)
            except TamperedRecord as e:
                records.quarantine(instance, f"change_set:{row.change_set_id}:{row.version}", "change_set",
                                   row.target_asset, f"{e}: refused as tampering")
                plan.waiting.append(f"{row.change_set_id}: quarantined ({e})")
                continue
            if ACCESS_GRANT in cs.change_classes:  # an access request's approval: the access sensor runs it
                continue
            if jobs.accepts is not None and not jobs.accepts(cs):
                continue
            try:
                plan.walk(cs, row.state, decisions.get((cs.id, cs.version)), all_stages.get((cs.id, cs.version), {}), now,
                          plan=stage_plan(cs, ordered, undo=jobs.undo_jobs is not None), latest=row.latest)
            except Exception as e:  # noqa: BLE001 - one change set's problem never stops the others
                context.log.exception(f"remediation sensor failed on {cs.id}")
                plan.waiting.append(f"{cs.id}: {type(e).__name__}: {e}")
        if not plan.requests:
            if plan.events:
                return dg.SensorResult(asset_events=plan.events, skip_reason="; ".join(plan.waiting)[:1000] or None)
            return dg.SkipReason("; ".join(plan.waiting)[:1000] or "no approved change set is waiting")
        return dg.SensorResult(run_requests=plan.requests, asset_events=plan.events)


    def _reconcile(self, stages: dict) -> dict:
        """Stages whose bound run ended without its code completing them: complete (or abandon) from the
        run; a run that never executed a step gives its stage a fresh ticket (:mod:`.liveness`)."""
        for name, st in list(stages.items()):
            ended = stage_run_ended(self.led, self.instance, st)
            if ended is None:
                continue
            ok, how = ended
            run = self.instance.get_run_by_id(st.run_id) if st.run_id else None
            if run is not None and not ok and not executed_a_step(self.instance, run.run_id):
                self._again_no_step(name, st, run, how)
            elif ok:
                self.led.complete_stage(st.ticket, st.run_id, success=True, result={"reconciled": how})
            elif run is None:
                self.led.abandon_stage(st.ticket, how)
            else:
                infra = infrastructure_failure(self.instance, run.run_id) if run.status == dg.DagsterRunStatus.FAILURE else None
                self.led.complete_stage(st.ticket, st.run_id, success=False,
                                        result={"reconciled": how, **({"infrastructure": infra} if infra else {})})
        return stages

    def _again_no_step(self, name: str, st, run, how: str) -> None:
        """The stage's run ended before any step (cancelled while queued, its worker or the daemon killed,
        its start timed out): nothing ran, so a fresh ticket, under the same approval, a few times."""
        quiet = run.status == dg.DagsterRunStatus.CANCELED and not run_started(self.instance, run.run_id)
        attempts = int((st.result or {}).get("attempts", 1))
        if not quiet and attempts >= NO_STEP_ATTEMPTS:
            self.led.complete_stage(st.ticket, st.run_id, success=False, result={
                "reconciled": how, "reason": f"{attempts} runs ended before executing a step (last: {how})"})
            return
        if self.led.reissue_ticket(st.ticket, st.run_id, count=not quiet, why=how):
            self.waiting.append(f"{st.change_set_id}: stage {name}'s run {run.run_id[:8]} ended before its first "
                                f"step ({how}); issued again under the same approval")

    def walk(self, cs: ChangeSet, state: str, decision_body: str | None, stages: dict, now: dt.datetime, *,
             plan: list[str], latest: bool = True) -> None:
        decision = Approval.model_validate_json(decision_body) if decision_body else None
        if any(s.state == STARTED for s in stages.values()):
            stages = self._reconcile(stages)
            stages = self.led.stages(cs.id, cs.version)
        if decision is None and state == PROPOSED and not stages and now < cs.expires_at:
            domain = self._domain(cs)
            if domain is not None and domain.autonomous(cs.change_classes):
                made = record_autonomous_approval(self.instance, cs, domain)
                if made is not None:
                    decision = made[0]
                    self.events.append(made[1])
        status = approval_status(self.led, cs, self.doms, decision=decision, now=now)
        if status.withdraw and status.decision is not None and self.led.withdraw_decision(status.decision.id, status.reason):
            self.events.append(withdrawal_observation(cs, status.decision, status.reason))
            self.waiting.append(f"{cs.id}: {status.reason}")
        if status.approval is None:
            self._without_approval(cs, state, status, stages, latest)
            return
        running = self.earlier.get(cs.id) if latest else None
        if running is not None and not stages:
            self.waiting.append(f"{cs.id}: approved; waits until the repair of its earlier version {running[:12]}… ends")
            return
        self._advance(cs, status.approval, stages, plan)

    def _domain(self, cs: ChangeSet):
        if self.doms is None:
            return None
        try:
            return self.doms.get(cs.domain)
        except KeyError:
            return None

    def _without_approval(self, cs: ChangeSet, state: str, status, stages: dict, latest: bool = True) -> None:
        """No decision counts now. Before any stage: wait. Mid-repair: let the stage in flight
        finish, then a halt receipt; then wait for a person (an earlier version, which nobody
        can decide any more, is superseded once its halt receipt is written)."""
        if not stages or state == HALTED:
            self.waiting.append(f"{cs.id}: {status.reason}")
            return
        # a ticket no run took dies with the decision (a held copy of it, e.g. from a dry run of this
        # sensor, must not start the stage now); a later approval issues the stage anew
        revoked = [n for n, s in stages.items() if n != HALT_RECEIPT and s.state == ISSUED
                   and self.led.revoke_ticket(s.ticket)]
        if revoked:
            stages = self.led.stages(cs.id, cs.version)
            if not stages:
                self.waiting.append(f"{cs.id}: {status.reason}; the issued stage {', '.join(revoked)} was taken back")
                return
        if any(s.state in (ISSUED, STARTED) for n, s in stages.items() if n != HALT_RECEIPT):
            self.waiting.append(f"{cs.id}: {status.reason}; the stage in flight finishes first")
            return
        halt = stages.get(HALT_RECEIPT)
        if halt is None:
            # the decision the repair ran under: the one that stopped counting now, or (withdrawn on an
            # earlier tick, e.g. while a stage was in flight) the one the latest stage was dispatched under
            ran_under = max(stages.values(), key=lambda st: st.issued_at).approval_id
            approval_id = status.decision.id if status.decision is not None else ran_under
            self._dispatch(cs, approval_id, HALT_RECEIPT, self.jobs.receipt_job, run_config=receipt_config(cs))
            self.waiting.append(f"{cs.id}: repair halted ({status.reason}); writing a receipt of what was done")
        elif halt.state in (ISSUED,):
            self._dispatch(cs, halt.approval_id, HALT_RECEIPT, self.jobs.receipt_job, run_config=receipt_config(cs), ticket=halt.ticket)
        elif self._retry_receipt(cs, halt):
            return
        elif halt.state in (SUCCEEDED, STAGE_FAILED, ABANDONED) and not latest:
            self.led.set_change_set_state(cs.id, cs.version, SUPERSEDED, from_states=[RUNNING, APPROVED, PROPOSED],
                                          note=f"halted ({status.reason}); a newer version waits for its own decision")
            self.waiting.append(f"{cs.id}: version {cs.version[:12]}… halted ({status.reason}); its newer version waits")
        elif halt.state in (SUCCEEDED, STAGE_FAILED, ABANDONED):
            self.led.set_change_set_state(cs.id, cs.version, HALTED, from_states=[RUNNING, APPROVED, PROPOSED],
                                          note=status.reason)
            self.waiting.append(f"{cs.id}: halted ({status.reason}); a listed approver may approve to continue")

    def _advance(self, cs: ChangeSet, approval: Approval, stages: dict, plan: list[str]) -> None:
        steps = step_stages(cs)
        ranges = contiguous_ranges(self.ordered, cs.window)
        missing = sorted(set(cs.window) - set(self.ordered))
        if missing and not (cs.undo_plan is not None and cs.undo_plan.of_change_set):
            self.waiting.append(f"{cs.id}: window partitions {', '.join(missing[:5])} are not partitions of this "
                                "sensor's partitions definition; nothing dispatched (a window is never dropped)")
            return
        for stage in plan:
            st = stages.get(stage)
            if st is not None and st.state == SUCCEEDED:
                continue
            if st is not None and st.state in (STAGE_FAILED, ABANDONED):
                if stage == "receipt" and self._retry_receipt(cs, st):
                    return
                if self._retry_infrastructure(cs, stage, st, steps, ranges):
                    return
                self._failed(cs, approval, stages, stage, st)
                return
            if st is not None and st.state == STARTED:
                self.waiting.append(f"{cs.id}: stage {stage} is running (run {st.run_id[:8]})")
                return
            if st is not None and st.state == ISSUED:
                st = self._fresh(cs, stage, st)
            root = self.jobs.pipeline_root
            if changes_data(stage, steps) and root is not None and (missing := unmerged_files(cs, root)):
                self.waiting.append(f"{cs.id}: waiting for the owner to merge {', '.join(missing)}")
                return
            gate = self.jobs.stage_gates.get(stage)
            why = gate(self.instance, cs) if gate is not None else None
            if why:
                self.waiting.append(f"{cs.id}: stage {stage} {why}")
                return
            job, run_config, extra = self._job_for(cs, stage, steps, ranges)
            if job is None:
                self.waiting.append(f"{cs.id}: {run_config}")
                return
            self._dispatch(cs, approval.id, stage, job, run_config=run_config, extra=extra,
                           ticket=st.ticket if st is not None else None)
            return
        if self.led.set_change_set_state(cs.id, cs.version, APPLIED, from_states=[RUNNING, APPROVED]):
            receipt = stages.get("receipt")
            if not ((receipt.result or {}).get("verified") is True if receipt is not None else False):
                self.led.release_incident(cs.id, cs.version, f"change set {cs.id} applied, but its receipt is not verified")

    def _retry_receipt(self, cs: ChangeSet, st) -> bool:
        """A receipt stage whose run ended before its op recorded the end (terminated, crashed,
        deleted, or its op failed) is dispatched again: a receipt changes no data, and each attempt
        appends its own receipts to the chain. Up to three attempts, then the change set fails."""
        if self.dry_run:  # shown, not retried: a dry run changes no stage
            if st.state not in (STAGE_FAILED, ABANDONED):
                return False
            self._dispatch(cs, st.approval_id, st.stage, self.jobs.receipt_job, run_config=receipt_config(cs), ticket=st.ticket)
            return True
        ticket = self.led.retry_stage(st.ticket)
        if ticket is None:
            return False
        self._dispatch(cs, st.approval_id, st.stage, self.jobs.receipt_job, run_config=receipt_config(cs), ticket=ticket)
        self.waiting.append(f"{cs.id}: the {st.stage} run ended before it wrote the receipts; dispatched again")
        return True

    def _retry_infrastructure(self, cs: ChangeSet, stage: str, st, steps, ranges) -> bool:
        """A stage whose run failed on the infrastructure (storage unreachable, a dead worker) and that
        may run again safely is dispatched again after a backoff, a few times (:mod:`.liveness`)."""
        if st.state != STAGE_FAILED or not st.run_id or stage == "receipt":
            return False
        result = st.result or {}
        infra = result.get("infrastructure")
        if infra is None and "reason" not in result and "reconciled" not in result:  # completed by the executor
            run = self.instance.get_run_by_id(st.run_id)
            if run is not None and run.status == dg.DagsterRunStatus.FAILURE:  # a terminated run is no crash
                infra = infrastructure_failure(self.instance, st.run_id)
        attempts = int(result.get("attempts", 1))
        if not infra or not may_retry(stage, attempts):
            return False
        wait = (st.finished_at or 0) + backoff_seconds(attempts) - time.time()
        if wait > 0:
            self.waiting.append(f"{cs.id}: stage {stage} failed on the infrastructure ({infra}); run "
                                f"{attempts + 1} of {MAX_ATTEMPTS} in {wait:.0f} s")
            return True
        job, run_config, extra = self._job_for(cs, stage, steps, ranges)
        if job is None:
            return False
        ticket = st.ticket if self.dry_run else self.led.retry_stage(st.ticket, MAX_ATTEMPTS)
        if ticket is None:
            return False
        self._dispatch(cs, st.approval_id, stage, job, run_config=run_config, extra=extra, ticket=ticket)
        self.waiting.append(f"{cs.id}: stage {stage} failed on the infrastructure ({infra}); dispatched again "
                            f"(run {attempts + 1} of {MAX_ATTEMPTS})")
        return True

    def _fresh(self, cs: ChangeSet, stage: str, st):
        """An issued ticket no run took for a while, and that no live run carries (a dry run of
        this sensor showed it, or another run took its run key): rotate it, so the old one is
        dead and the new request has a new run key."""
        if self.dry_run or time.time() - st.issued_at < self.jobs.reissue_after_s:
            return st
        live = [r for r in self.instance.get_runs(filters=dg.RunsFilter(tags={TICKET_TAG: st.ticket}))
                if not r.is_finished]
        if live:
            return st
        new = self.led.rotate_ticket(st.ticket)
        if new is None:
            return self.led.stage_by_ticket(st.ticket) or st
        self.waiting.append(f"{cs.id}: stage {stage}'s ticket was not taken for {self.jobs.reissue_after_s:.0f} s; issued anew")
        return self.led.stage_by_ticket(new)

    def _failed(self, cs: ChangeSet, approval: Approval, stages: dict, stage: str, st) -> None:
        """A stage failed or its run vanished: end with a receipt saying so, never a replay."""
        why = (st.result or {}).get("reason") or (st.result or {}).get("reconciled") or st.state
        receipt = stages.get("receipt")
        if stage == "receipt" or (receipt is not None and receipt.state in (SUCCEEDED, STAGE_FAILED, ABANDONED)):
            failed = next((n for n, s in stages.items() if s.state in (STAGE_FAILED, ABANDONED)
                           and not n.startswith("receipt")), stage)
            advice = finish_or_undo(cs.id, stale_assets(cs.target_asset, cs.rebuild_assets, stages), failed)
            self.led.set_change_set_state(cs.id, cs.version, FAILED, from_states=[RUNNING, APPROVED],
                                          note=f"stage {stage} {st.state}: {why}; {advice}"[:4000])
            self.waiting.append(f"{cs.id}: stage {stage} {st.state} ({why}); {advice}")
            return
        if receipt is not None and receipt.state == STARTED:
            self.waiting.append(f"{cs.id}: writing the receipt of the failed repair")
            return
        self._dispatch(cs, approval.id, "receipt", self.jobs.receipt_job, run_config=receipt_config(cs),
                       ticket=receipt.ticket if receipt is not None else None)
        self.waiting.append(f"{cs.id}: stage {stage} {st.state} ({why}); writing a receipt of what happened")

    def _job_for(self, cs: ChangeSet, stage: str, steps, ranges):
        """(job, run config, extra request fields) of a stage; (None, why, None) when it cannot run here."""
        if stage in steps:
            step = cs.steps[steps[stage]]
            job = self.jobs.step_jobs.get(step.kind)
            if job is None:
                return None, f"stage {stage} needs a job for {step.kind} steps (build_remediation_sensor(step_jobs=...))", None
            return job, {"ops": {step_op_name(step.kind): {"config": {"change_set_id": cs.id, "step_index": steps[stage]}}}}, {}
        if stage.startswith("window-"):
            if self.jobs.window_job is None:
                return None, f"stage {stage} needs a window job (build_remediation_sensor(window_job=...))", None
            index, assets = window_stage_assets(cs, stage)
            return self.jobs.window_job, None, {"window": ranges[index], "assets": assets}
        if stage == "rebuild":
            if self.jobs.rebuild_job is None:
                return None, "stage rebuild needs a rebuild job (build_remediation_sensor(rebuild_job=...))", None
            return self.jobs.rebuild_job, None, {"asset_selection": [dg.AssetKey(k) for k in cs.rebuild_assets]}
        if stage in ("snapshot", "restore"):
            job = self.jobs.undo_jobs[0] if stage == "snapshot" else self.jobs.undo_jobs[1]
            op_name = c.SNAPSHOT_OP if stage == "snapshot" else c.RESTORE_OP
            return job, {"ops": {op_name: {"config": {"change_set_id": cs.id}}}}, {}
        if stage == "verify":
            return self.jobs.verify_job, None, {}
        return self.jobs.receipt_job, receipt_config(cs), {}

    def _dispatch(self, cs: ChangeSet, approval_id: str, stage: str, job: dg.JobDefinition, *, run_config=None,
                  extra=None, ticket: str | None = None) -> None:
        extra = extra or {}
        base = {c.CHANGE_SET_TAG: cs.id, VERSION_TAG: cs.version, c.APPROVAL_TAG: approval_id, c.STAGE_TAG: stage}
        run_key = f"{cs.id}:{cs.version[:16]}:{stage}"  # + the ticket's first digits, below: unpredictable
        if "window" in extra:
            request = window_run_request(run_key=run_key, job_name=job.name,
                                         assets=extra.get("assets") or [dg.AssetKey(cs.target_asset)],
                                         partition_keys=extra["window"], tags=base,
                                         ordered_keys=self.ordered, partitions_def=self.pdef)
        else:
            request = dg.RunRequest(run_key=run_key, job_name=job.name, tags=base, run_config=run_config or {},
                                    asset_selection=extra.get("asset_selection"))
        if self.dry_run:  # "Test sensor": what would be dispatched, with no ticket (nothing issued, none shown)
            self.requests.append(request.with_replaced_attrs(run_key=f"{run_key}:dry-run"))
            self.waiting.append(f"{cs.id}: stage {stage} would be dispatched (a dry run issues no ticket)")
            return
        # the ticket binds this run's shape: its code location, partitions, asset selection and run config
        shape = run_shape(job.name, request.tags, request.asset_selection, request.run_config,
                          location=self.location, repository=self.repository)
        dispatch = ({"location": self.location, "repository": self.repository, "ticks": [self.tick_id]}
                    if self.mode == DAEMON else None)
        try:
            if ticket is not None and self.mode == DAEMON:
                self.led.note_dispatch(ticket, self.tick_id)
            ticket = ticket or self.led.issue_ticket(cs.id, cs.version, stage, approval_id, job.name, shape, dispatch)
        except LedgerError as e:  # superseded (or ended) meanwhile: nothing of it runs
            self.waiting.append(f"{cs.id}: {e}")
            return
        if ticket is None:  # issued by a concurrent tick: it dispatches
            self.waiting.append(f"{cs.id}: stage {stage} was issued by another tick")
            return
        self.requests.append(request.with_replaced_attrs(run_key=f"{run_key}:{ticket[:10]}",
                                                         tags={**request.tags, TICKET_TAG: ticket}))

