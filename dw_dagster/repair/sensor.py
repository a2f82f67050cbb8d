"""Repair: the remediation sensor runs approved change sets through their stages.

``build_remediation_sensor`` walks every change set version the ledger holds as approved or
running through its stages, one run request at a time, each only after the previous stage
*completed in the ledger* (recorded by the stage's own code, never inferred from run tags):

1. ``snapshot`` - when undo is configured, the window's rows are kept first;
2. ``window-<n>`` - one run per contiguous range of the approved partitions (range tags), after the
   owner merged the change set's diff (files in the pipeline repository match the proposal);
3. ``<kind>-<n>`` - one run per :class:`~dw_dagster.core.models.ChangeStep` of the change set, in order;
4. ``rebuild`` - the downstream dbt models, in one run;
5. ``verify`` - the verification checks (a checks-only job);
6. ``receipt`` - the receipt job, which writes ``dw/receipt`` on every touched asset.

For each stage the sensor issues one ticket in the ledger (:mod:`dw_dagster.repair.guard`) and
puts it in the run's ``dw/ticket`` tag; the run that presents it first holds the stage. Run keys are
``<change set>:<version>:<stage>``. A stage that failed, or whose run vanished (deleted runs replay
nothing), ends the repair: the receipt stage runs and says what happened. When the decision that
let a repair run stops counting mid-way (autonomy lowered, the approver removed from the domain),
the stage in flight finishes, no further stage is dispatched, a ``receipt-halt`` receipt says what
was done and what was not, and the version waits for a person's decision to continue.

A new version recorded while an earlier one is being repaired (a re-diagnosis mid-repair) does not
orphan it: the earlier version is walked to its end under its own decision (or halted with its
``receipt-halt`` receipt, then superseded), its window stays held meanwhile, and the new version
waits for its own decision and, once approved, for that repair to end before its first stage. A
version that ends without a repair that proved itself (rejected, expired, failed, a receipt that
does not verify) releases its incident (``unrepaired``: diagnosed again on new evidence).
"""


import datetime as dt
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import dagster as dg

from dw_dagster.core.links import describe
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
from dw_dagster.repair.control import active_stop, record_autonomous_approval
from dw_dagster.repair.guard import TICKET_TAG, run_shape, run_started, stage_run_ended
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
from dw_dagster.repair.steps import step_op_name, step_stages
from dw_dagster.core.windows import window_run_request
from dw_dagster.dagster_private import public

RECEIPT_OP = "dw_write_receipts"
HALT_RECEIPT = "receipt-halt"
VERSION_TAG = c.CHANGE_SET_VERSION_KEY


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


#: stages that change data: each waits for the owner's merge of the change set's files
def _changes_data(stage: str, steps: Mapping[str, int]) -> bool:
    return stage.startswith("window-") or stage in ("snapshot", "restore") or stage in steps


IN_PROCESS, DAEMON, DRY_RUN = "in_process", "daemon", "dry_run"


def sensor_evaluation(context: dg.SensorEvaluationContext) -> tuple[str, str | None, str | None, str | None]:
    """How this evaluation of the sensor runs: ``(mode, code location, repository, daemon tick id)``.

    - ``daemon``: a tick of the sensor daemon. The daemon creates the tick (status started) before it
      asks the code server to evaluate, and passes its id in the log key; the tick is read back from
      the instance and must be this sensor's. Tickets issued now bind only runs the daemon reserves
      in this tick (:func:`dw_dagster.repair.guard.admit_run`).
    - ``dry_run``: evaluated in a code server outside a daemon tick: the UI's "Test sensor" (GraphQL
      ``sensorDryRun``), which anyone who can open the UI may press. Nothing is issued: the dry run
      shows what would be dispatched without a ticket.
    - ``in_process``: evaluated without a code location (``build_sensor_context``, the
      :class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon`): tickets bind runs made in process.
    """
    origin = getattr(context, "code_location_origin", None)
    if origin is None:
        return IN_PROCESS, None, None, None
    location, repository = origin.location_name, context.repository_name
    log_key = list(context.log_key or [])
    tick_id = str(log_key[-1]) if log_key else ""
    if tick_id.isdigit() and context.instance_ref is not None:
        from dw_dagster.dagster_private import InstigatorSelector
        from dw_dagster.dagster_private import TickStatus

        try:
            tick = context.instance.schedule_storage.get_tick(int(tick_id))
        except Exception:  # noqa: BLE001 - no such tick: not the daemon
            tick = None
        selector = InstigatorSelector(location_name=location, repository_name=repository, name=context.sensor_name)
        if (tick is not None and tick.status == TickStatus.STARTED and tick.instigator_name == context.sensor_name
                and tick.selector_id in (None, selector.get_id())):
            return DAEMON, location, repository, tick_id
    return DRY_RUN, location, repository, None


@public
def build_remediation_sensor(
    *,
    partitions_def: dg.PartitionsDefinition | None = None,
    partitions_of: "dg.AssetKey | None" = None,
    window_job: "dg.JobDefinition | None" = None,
    rebuild_job: "dg.JobDefinition | None" = None,
    verify_job: "dg.JobDefinition",
    receipt_job: dg.JobDefinition,
    pipeline_root: str | Path | None = None,
    undo_jobs: "tuple[dg.JobDefinition, dg.JobDefinition] | None" = None,
    step_jobs: "Mapping[str, dg.JobDefinition] | None" = None,
    domains: DomainsSource = None,
    name: str = "dw_remediation_sensor",
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
    reissue_after_seconds: float | None = None,
    stage_gates: "Mapping[str, Callable[[dg.DagsterInstance, ChangeSet], str | None]] | None" = None,
    accepts: "Callable[[ChangeSet], bool] | None" = None,
) -> dg.SensorDefinition:
    """A sensor that runs approved change sets, stage by stage (see the module docstring).

    Args:
        partitions_def: the partitions definition of the repaired assets (orders the window);
            None when the location's change sets never rerun partitions.
        partitions_of: without ``partitions_def``, the asset whose partitions order the window,
            read from the code location at each tick.
        window_job: a partitioned asset job holding the repaired asset; None likewise (a change
            set with a window then waits, naming the missing job).
        rebuild_job: an asset job holding the downstream assets to rebuild; each run selects the
            change set's subset.
        verify_job: a checks-only asset job running the verification checks.
        receipt_job: the job built by :func:`dw_dagster.receipts.job.build_receipt_job`.
        pipeline_root: the pipeline repository the change set's diff applies to; when given, the
            stages that change data wait until every proposed file is merged.
        undo_jobs: ``(snapshot_job, restore_job)`` from :func:`dw_dagster.repair.undo.build_undo_jobs`;
            when given, windows are kept before they rerun and undo change sets can run.
        step_jobs: step kind → job, from :func:`dw_dagster.repair.steps.build_step_jobs`;
            a change set with a step of a kind that has no job waits, naming it.
        domains: the domains as they are now (approvers, autonomy); default ``$DW_DOMAINS_FILE``.
            A domains file that cannot be read dispatches nothing.
        reissue_after_seconds: an issued ticket no run took after this long, carried by no live run,
            is replaced (a dry run of the sensor showed it, or another run took its run key);
            default four tick intervals, at least 120 s.
        stage_gates: stage name → ``gate(instance, change_set)``: a reason to wait (the stage is not
            dispatched yet, the reason is shown) or None. E.g. a warehouse change's ``verify`` waits
            for the next period's metering (:func:`dw_dagster.cost.warehouse_apply.saving_gate`).
        accepts: only change sets for which this is true are walked (default all); several
            sensors on one instance must not both walk a change set.

    Returns:
        A ``SensorDefinition`` (STOPPED by default). A tick reads only the ledger's active
        change sets (indexed), never the event log. Nothing runs without a valid approval.
    """
    reissue_after_s = reissue_after_seconds if reissue_after_seconds is not None else max(120.0, 4.0 * minimum_interval_seconds)
    jobs = [j for j in (window_job, rebuild_job, verify_job, receipt_job, *(undo_jobs or ()),
                        *(step_jobs or {}).values()) if j is not None]

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status, jobs=jobs,
               description="Launches the repair stages of approved dw_dagster change sets, one after the other.")
    def _sensor(context: dg.SensorEvaluationContext):
        instance = context.instance
        stop = active_stop(instance)
        if stop is not None:  # org-wide stop: nothing is dispatched, approvals wait
            return dg.SkipReason(f"org-wide stop by {stop.by} since {stop.at.isoformat()}: {stop.reason or 'no reason given'}; "
                                 "nothing is dispatched until a verified operator resumes (`dw-dagster resume`)")
        try:
            doms = resolve_domains(domains)
        except DomainsFileError as e:  # a broken domains file never grants anything
            return dg.SkipReason(f"domains file unreadable, nothing dispatched: {e}"[:1000])
        led = ledger_for(instance)
        pdef = partitions_def
        if pdef is None and partitions_of is not None:
            graph = asset_graph_of(context)
            key = dg.AssetKey(partitions_of) if not isinstance(partitions_of, dg.AssetKey) else partitions_of
            pdef = graph.get(key).partitions_def if graph is not None and graph.has(key) else None
        ordered = pdef.get_partition_keys(dynamic_partitions_store=instance) if pdef is not None else []
        # the latest version of every change set waiting or under way, and any earlier version whose
        # repair is under way (a newer version was recorded mid-repair): it is walked to its end
        rows = led.change_set_rows(states=ACTIVE_STATES, latest_only=False)
        keys = [(r.change_set_id, r.version) for r in rows]
        decisions = led.active_decisions(keys)
        all_stages = led.stages_of_many(keys)
        now = utcnow()
        plan = _Tick(instance, led, doms, ordered, context, sensor_evaluation(context))
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
            if accepts is not None and not accepts(cs):
                continue
            try:
                plan.walk(cs, row.state, decisions.get((cs.id, cs.version)), all_stages.get((cs.id, cs.version), {}), now,
                          plan=stage_plan(cs, ordered, undo=undo_jobs is not None), latest=row.latest)
            except Exception as e:  # noqa: BLE001 - one change set's problem never stops the others
                context.log.exception(f"remediation sensor failed on {cs.id}")
                plan.waiting.append(f"{cs.id}: {type(e).__name__}: {e}")
        if not plan.requests:
            if plan.events:
                return dg.SensorResult(asset_events=plan.events, skip_reason="; ".join(plan.waiting)[:1000] or None)
            return dg.SkipReason("; ".join(plan.waiting)[:1000] or "no approved change set is waiting")
        return dg.SensorResult(run_requests=plan.requests, asset_events=plan.events)

    class _Tick:
        def __init__(self, instance, led: Ledger, doms, ordered, context, evaluation) -> None:
            self.instance, self.led, self.doms, self.ordered, self.context = instance, led, doms, ordered, context
            self.mode, self.location, self.repository, self.tick_id = evaluation
            self.dry_run = self.mode == DRY_RUN
            self.requests: list[dg.RunRequest] = []
            self.events: list[dg.AssetObservation] = []
            self.waiting: list[str] = []
            self.earlier: dict[str, str] = {}  # change set id -> an earlier version whose repair is under way

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
                self.events.append(_withdrawal_observation(cs, status.decision, status.reason))
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
                self._dispatch(cs, approval_id, HALT_RECEIPT, receipt_job, run_config=_receipt_config(cs))
                self.waiting.append(f"{cs.id}: repair halted ({status.reason}); writing a receipt of what was done")
            elif halt.state in (ISSUED,):
                self._dispatch(cs, halt.approval_id, HALT_RECEIPT, receipt_job, run_config=_receipt_config(cs), ticket=halt.ticket)
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
                if _changes_data(stage, steps) and pipeline_root is not None and (missing := unmerged_files(cs, pipeline_root)):
                    self.waiting.append(f"{cs.id}: waiting for the owner to merge {', '.join(missing)}")
                    return
                gate = (stage_gates or {}).get(stage)
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
                self._dispatch(cs, st.approval_id, st.stage, receipt_job, run_config=_receipt_config(cs), ticket=st.ticket)
                return True
            ticket = self.led.retry_stage(st.ticket)
            if ticket is None:
                return False
            self._dispatch(cs, st.approval_id, st.stage, receipt_job, run_config=_receipt_config(cs), ticket=ticket)
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
            if self.dry_run or time.time() - st.issued_at < reissue_after_s:
                return st
            live = [r for r in self.instance.get_runs(filters=dg.RunsFilter(tags={TICKET_TAG: st.ticket}))
                    if not r.is_finished]
            if live:
                return st
            new = self.led.rotate_ticket(st.ticket)
            if new is None:
                return self.led.stage_by_ticket(st.ticket) or st
            self.waiting.append(f"{cs.id}: stage {stage}'s ticket was not taken for {reissue_after_s:.0f} s; issued anew")
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
            self._dispatch(cs, approval.id, "receipt", receipt_job, run_config=_receipt_config(cs),
                           ticket=receipt.ticket if receipt is not None else None)
            self.waiting.append(f"{cs.id}: stage {stage} {st.state} ({why}); writing a receipt of what happened")

        def _job_for(self, cs: ChangeSet, stage: str, steps, ranges):
            """(job, run config, extra request fields) of a stage; (None, why, None) when it cannot run here."""
            if stage in steps:
                step = cs.steps[steps[stage]]
                job = (step_jobs or {}).get(step.kind)
                if job is None:
                    return None, f"stage {stage} needs a job for {step.kind} steps (build_remediation_sensor(step_jobs=...))", None
                return job, {"ops": {step_op_name(step.kind): {"config": {"change_set_id": cs.id, "step_index": steps[stage]}}}}, {}
            if stage.startswith("window-"):
                if window_job is None:
                    return None, f"stage {stage} needs a window job (build_remediation_sensor(window_job=...))", None
                return window_job, None, {"window": ranges[int(stage.split("-")[1]) - 1]}
            if stage == "rebuild":
                if rebuild_job is None:
                    return None, "stage rebuild needs a rebuild job (build_remediation_sensor(rebuild_job=...))", None
                return rebuild_job, None, {"asset_selection": [dg.AssetKey(k) for k in cs.rebuild_assets]}
            if stage in ("snapshot", "restore"):
                job = undo_jobs[0] if stage == "snapshot" else undo_jobs[1]
                op_name = "dw_snapshot_window" if stage == "snapshot" else "dw_restore_window"
                return job, {"ops": {op_name: {"config": {"change_set_id": cs.id}}}}, {}
            if stage == "verify":
                return verify_job, None, {}
            return receipt_job, _receipt_config(cs), {}

        def _dispatch(self, cs: ChangeSet, approval_id: str, stage: str, job: dg.JobDefinition, *, run_config=None,
                      extra=None, ticket: str | None = None) -> None:
            extra = extra or {}
            base = {c.CHANGE_SET_TAG: cs.id, VERSION_TAG: cs.version, c.APPROVAL_TAG: approval_id, c.STAGE_TAG: stage}
            run_key = f"{cs.id}:{cs.version[:16]}:{stage}"  # + the ticket's first digits, below: unpredictable
            if "window" in extra:
                request = window_run_request(run_key=run_key, job_name=job.name, assets=[dg.AssetKey(cs.target_asset)],
                                             partition_keys=extra["window"], tags=base,
                                             ordered_keys=self.ordered)
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

    return _sensor


def _receipt_config(cs: ChangeSet) -> dict:
    return {"ops": {RECEIPT_OP: {"config": {"change_set_id": cs.id}}}}


def _withdrawal_observation(cs: ChangeSet, d: Approval, reason: str) -> dg.AssetObservation:
    return dg.AssetObservation(asset_key=dg.AssetKey(cs.target_asset),
                               description=describe(f"approval {d.id} of change set {cs.id} withdrawn: {reason}", change_set_id=cs.id),
                               metadata={c.APPROVAL_WITHDRAWN_KEY: dg.MetadataValue.json(
                                   {"change_set_id": cs.id, "version": cs.version, "approval_id": d.id,
                                    "approver": d.approver, "reason": reason, "at": utcnow().isoformat()}),
                                   c.CHANGE_SET_ID_KEY: cs.id})
