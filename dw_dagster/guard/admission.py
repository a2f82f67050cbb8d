"""Nothing else runs a repair: the ticket check every door of Dagster passes through.

The remediation sensor is the only dispatcher of repair stages. For each stage it issues a
single-use **ticket** in the ledger (:meth:`dw_dagster.core.ledger.Ledger.issue_ticket`) and puts it in
the run request's ``dw/ticket`` tag. :func:`admit_run` is the one check, applied wherever a run
can be seen before it changes anything:

- :class:`GuardedRunCoordinator` (``dagster.yaml``): every run submitted by the webserver (the
  Launchpad, GraphQL ``launchRun``, re-execution, a backfill) or the daemon (sensors, schedules);
- :func:`guarded_executor`: every run a run worker, ``dagster job execute`` or ``dagster asset
  materialize`` executes with the job's executor;
- dw_dagster's own data-changing ops (steps, undo snapshot and restore), which check their ticket
  themselves, so an in-process ``execute_in_process`` of those jobs is held too;
- :class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon`, the in-process stand-in for the daemon.

The rules:

1. A run of a dw_dagster repair job needs a ticket the sensor issued, for that job, not yet taken
   by another run. The first run presenting it binds it (its run id is recorded); a copied tag, a
   re-executed run or a second launch is refused ("a stage runs once"). What a job is comes from
   its *definition* (its ``dw/kind`` job tag in :data:`REPAIR_KINDS`, read from the job snapshot
   or the job definition the door holds), never from the run's tags: Dagster lets a launch
   override a job's tags, so a run whose ``dw/kind`` tag is missing or differs from its job's is
   refused, and a run that merely *claims* a repair kind is treated as one.
2. Any other run that would materialize partitions of an asset inside the window of an approved
   change set still being repaired is refused, unless a verified person lifted that hold
   (:func:`lift_hold`, recorded in the ledger's audit). The hold starts at the approval (a
   proposal holds nothing) and lasts until that version's repair ends, even when a newer version
   of the change set was recorded meanwhile.
3. A run without dw_dagster tags and outside every held window is not touched.

What it cannot see: code that runs without any of these (a Python ``execute_in_process`` or
``materialize()`` of a user's own asset job, a shell with the code and the warehouse
credentials). Whoever holds those is trusted (README, threat model).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import dagster as dg

from dw_dagster.core.ledger import STARTED, Ledger, LedgerError, asset_str, ledger_for
from dw_dagster.errors import DwDagsterError
from dw_dagster.core import keys as c
from dw_dagster.dagster_private import public

TICKET_TAG = c.TICKET_TAG
KIND_TAG = c.KIND_KEY
#: ``dw/kind`` job tags of the jobs that change data or write receipts: they need a ticket (the
#: checks-only verify job reads and may run any time; only the run the sensor dispatched counts)
REPAIR_KINDS = c.REPAIR_KINDS
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
PARTITION_TAG = "dagster/partition"
HOLD_LIFT = "hold_lifted"


class RunRefused(DwDagsterError, dg.Failure):
    """The run may not proceed; the message says which rule refused it."""


@dataclass(frozen=True)
class RunFacts:
    """What the guard needs to know about a run, from whichever door sees it.

    ``asset_keys`` are the assets it will materialize (for the hold); ``asset_selection`` and
    ``run_config`` are what it asked for (for a ticket's shape, :func:`run_shape`). ``job_tags``
    are the tags of the run's *job definition* (:func:`job_tags_of`), which a launch cannot
    change; None when the door could not read them (the run's own tags are then all there is).
    """

    run_id: str
    job_name: str
    tags: dict[str, str]
    asset_keys: tuple[str, ...] = ()
    asset_selection: tuple[str, ...] | None = None
    run_config: dict | None = field(default=None)
    check_selection: tuple[str, ...] | None = None
    op_selection: tuple[str, ...] | None = None
    job_tags: Mapping[str, str] | None = None
    skipped_steps: tuple[str, ...] | None = ()
    plan_snapshot_id: str | None = None
    location: str | None = None
    repository: str | None = None

    @classmethod
    def of_run(cls, run: dg.DagsterRun, asset_keys: Iterable[str] | None = None,
               job_tags: Mapping[str, str] | None = None, plan=None) -> RunFacts:
        """``plan``: the run's execution plan or its snapshot, to see which steps it skips (without
        it, a run that names its steps counts as skipping some, unknown which)."""
        selection = tuple(sorted(asset_str(k) for k in run.asset_selection)) if run.asset_selection else None
        keys = tuple(asset_keys) if asset_keys is not None else (selection or ())
        checks = (tuple(sorted(k.to_user_string() for k in run.asset_check_selection))
                  if run.asset_check_selection is not None else None)
        ops = tuple(sorted(run.op_selection)) if run.op_selection else None
        location, repository = run_origin(run)
        return cls(run_id=run.run_id, job_name=run.job_name, tags=dict(run.tags), asset_keys=keys,
                   asset_selection=selection, run_config=dict(run.run_config or {}), check_selection=checks,
                   op_selection=ops, job_tags=dict(job_tags) if job_tags is not None else None,
                   skipped_steps=skipped_steps(run, plan), plan_snapshot_id=run.execution_plan_snapshot_id,
                   location=location, repository=repository)


def run_origin(run: dg.DagsterRun) -> tuple[str | None, str | None]:
    """``(code location, repository)`` a run was created from, or ``(None, None)`` for a run made in
    process (``execute_in_process``, ``dagster job execute``), which has no code location."""
    origin = getattr(run, "remote_job_origin", None) or getattr(run, "external_job_origin", None)
    if origin is None:
        return None, None
    repo = origin.repository_origin
    return repo.code_location_origin.location_name, repo.repository_name


def skipped_steps(run: dg.DagsterRun, plan=None) -> tuple[str, ...] | None:
    """The steps of ``run``'s execution plan it will not execute (``()`` for a whole-plan run, None
    when it names steps and no plan is at hand to compare with).

    Args:
        run: the run.
        plan: its ``ExecutionPlan`` or ``ExecutionPlanSnapshot``, or None.
    """
    chosen = None
    if plan is not None:
        chosen = getattr(plan, "step_keys_to_execute", None)
    if chosen is None:
        chosen = run.step_keys_to_execute
    if chosen is None:
        return ()
    if plan is None:
        return None
    every = {s.key for s in plan.steps}
    return tuple(sorted(every - set(chosen)))


def job_tags_of(job) -> dict[str, str]:
    """The tags a job's *definition* carries (both come from the code, never from a launch).

    Args:
        job: a ``JobDefinition``, or the ``JobSnap`` stored with a run.

    Returns:
        Its run tags overlaid with its tags (``{}`` when it has none).
    """
    return {**(getattr(job, "run_tags", None) or {}), **(getattr(job, "tags", None) or {})}


def run_job_tags(instance: dg.DagsterInstance, run: dg.DagsterRun) -> dict[str, str] | None:
    """The job-definition tags of ``run``, from the job snapshot stored with it.

    The webserver and the daemon write that snapshot from the code location's job when they create
    the run; the tags a launch typed are in ``run.tags``, not in it.

    Returns:
        :func:`job_tags_of` the snapshot, or None when the run has no snapshot (then only its own
        tags say what it is).
    """
    if not run.job_snapshot_id:
        return None
    snap = instance.get_job_snapshot(run.job_snapshot_id)
    return job_tags_of(snap) if snap is not None else None


def repair_kind(facts: RunFacts) -> str | None:
    """The repair kind of the run's job (``window``, ``rebuild``, ...), or None when it is no repair job.

    The job definition decides (``facts.job_tags``); a run whose tags claim a repair kind is
    treated as one too (it asked to be).

    Raises:
        RunRefused: the job is a repair job and the run's ``dw/kind`` tag is missing or differs
            (a launch that overrode the job's own tag, e.g. ``--tags '{"dw/kind": "manual"}'``).
    """
    tagged = facts.tags.get(KIND_TAG)
    job_kind = (facts.job_tags or {}).get(KIND_TAG)
    if job_kind in REPAIR_KINDS:
        if tagged != job_kind:
            said = "has no dw/kind tag" if tagged is None else f"is tagged dw/kind={tagged!r}"
            raise RunRefused(description=(
                f"dw_dagster refused run {facts.run_id[:8]} of {facts.job_name}: it {said}, but {facts.job_name} is a "
                f"dw_dagster {job_kind} job (its definition says so); a launch's tags never change what a job does, "
                "and a repair job runs only when the remediation sensor dispatches it for an approved change set"))
        return job_kind
    return tagged if tagged in REPAIR_KINDS else None


def run_shape(job_name: str, tags: dict, asset_selection, run_config: dict | None, *,
              check_selection=None, op_selection=None, skipped_steps=(), location: str | None = None,
              repository: str | None = None) -> dict:
    """What a run will do, as a ticket binds it: the code location and repository it runs in (every
    location built with ``build_dw_definitions`` has jobs of the same names, each on its own
    warehouse), the job, every partition tag (:func:`partition_tags`),
    its asset selection and asset-check selection (sorted key strings, or None for the whole job),
    its op selection, the steps of its execution plan it would skip (``stepKeys`` of a GraphQL
    launch: the sensor's runs skip none, so a run that would skip the stage's own ops is another
    run), and the SHA-256 of its run config (the ``loggers`` section, which changes no data, left out).

    Args:
        job_name: the job.
        tags: the run's tags (only the partition tags count).
        asset_selection: ``AssetKey`` s or key strings, or None.
        run_config: the run config as a dict, or None.
        check_selection: ``AssetCheckKey`` s or their strings, or None.
        op_selection: op names, or None.
        skipped_steps: the plan's step keys the run would not execute; None when unknown.
        location: the code location's name (None for a run made in process).
        repository: the repository's name within it.
    """
    import hashlib
    import json

    selection = None if not asset_selection else sorted(
        k if isinstance(k, str) else asset_str(k) for k in asset_selection)
    checks = None if check_selection is None else sorted(
        k if isinstance(k, str) else k.to_user_string() for k in check_selection)
    config = {k: v for k, v in (run_config or {}).items() if k != "loggers"}
    return {"location": location, "repository": repository,
            "job": job_name, "partitions": partition_tags(tags), "assets": selection, "checks": checks,
            "ops": sorted(op_selection) if op_selection else None,
            "skipped_steps": sorted(skipped_steps) if skipped_steps is not None else None,
            "config": hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()}


def partition_tags(tags: dict[str, str]) -> dict[str, str]:
    """Every tag that chooses a run's partitions: ``dagster/partition``, the range tags and any
    ``dagster/partition/<dimension>`` (which Dagster 1.13 reads *first*, for any partitioned asset);
    ``dagster/partition_set`` names a set and chooses nothing."""
    return {k: v for k, v in tags.items() if k.startswith(("dagster/partition", "dagster/asset_partition"))
            and k != "dagster/partition_set"}


def _partition_bounds(tags: dict[str, str]) -> tuple[str, str] | None:
    """The run's partitions as (first, last), or None for "the whole asset" (no partition tag, or a
    tag this guard does not read exactly, such as a multi-dimensional one: held as if whole)."""
    chosen = partition_tags(tags)
    if any(k.startswith("dagster/partition/") for k in chosen):
        return None
    if PARTITION_TAG in chosen:
        return chosen[PARTITION_TAG], chosen[PARTITION_TAG]
    if RANGE_START_TAG in chosen and RANGE_END_TAG in chosen:
        return chosen[RANGE_START_TAG], chosen[RANGE_END_TAG]
    return None


_ORDERED = re.compile(r"^\d{4}-\d{2}(-\d{2}(-\d{2}:\d{2})?)?$")  # Dagster's time partition key formats


def _overlaps(bounds: tuple[str, str], window: Sequence[str]) -> list[str]:
    """The window's keys the run's partition(s) reach. Time keys compare as text; a single other key by
    membership; a range of other (static) keys reaches the whole window."""
    lo, hi = bounds
    if lo == hi:
        return [k for k in window if k == lo]
    if all(_ORDERED.match(k) for k in (lo, hi, *window)):
        return [k for k in window if lo <= k <= hi]
    return list(window)  # a range of static keys: their order is the definition's, unknown here; held whole


def held_partitions(led: Ledger, facts: RunFacts) -> list[tuple[str, str, list[str]]]:
    """``(change set id, asset, partitions)`` the run would touch inside held windows (lifted holds excluded).

    A run with no partition tags is a whole-asset run: it touches the whole window of every
    held asset it materializes.
    """
    from dw_dagster.core.records import parse_change_set

    bounds = _partition_bounds(facts.tags)
    out = []
    wanted = set(facts.asset_keys)
    if not wanted:
        return out
    open_rows: dict[str, list] = {}
    for row in led.open_windows():  # few: only repairs under way (any version, latest or not), one query
        if row.target_asset in wanted:
            open_rows.setdefault(row.target_asset, []).append(row)
    for asset, rows in sorted(open_rows.items()):
        for row in rows:
            try:
                window = parse_change_set(row.body).window
            except Exception:  # noqa: BLE001 - a tampered record holds nothing; it is reported elsewhere
                continue
            hit = list(window) if bounds is None else _overlaps(bounds, window)
            if hit and not led.audit_entries(HOLD_LIFT, f"{row.change_set_id}:{row.version}:{asset}"):
                out.append((row.change_set_id, asset, hit))
    return out


def admit_run(instance: dg.DagsterInstance, facts: RunFacts) -> None:
    """Apply the rules of the module docstring to one run; binds its ticket when it presents one.

    Raises:
        RunRefused: the run may not proceed (the message names the rule and what to do instead).
    """
    led = ledger_for(instance)
    kind = repair_kind(facts)
    ticket = facts.tags.get(TICKET_TAG)
    if ticket and facts.skipped_steps is None and facts.plan_snapshot_id:  # steps named: compare with the plan stored
        snap = instance.get_execution_plan_snapshot(facts.plan_snapshot_id)
        if snap is not None and snap.step_keys_to_execute is not None:
            facts = replace(facts, skipped_steps=tuple(sorted({s.key for s in snap.steps} - set(snap.step_keys_to_execute))))
    if ticket:
        from dw_dagster.guard.stop import active_stop

        stop = active_stop(instance)
        known = led.stage_by_ticket(ticket)
        if stop is not None and (known is None or known.run_id != facts.run_id):
            raise RunRefused(description=f"dw_dagster refused run {facts.run_id[:8]} of {facts.job_name}: an org-wide stop "
                             f"by {stop.by} is in force; no repair stage starts until a verified operator resumes")
        if known is not None and known.run_id != facts.run_id:
            _dispatched_run_or_refuse(instance, known, facts)
        try:
            led.bind_ticket(ticket, facts.run_id, facts.job_name,
                            run_shape(facts.job_name, facts.tags, facts.asset_selection, facts.run_config,
                                      check_selection=facts.check_selection, op_selection=facts.op_selection,
                                      skipped_steps=facts.skipped_steps, location=facts.location,
                                      repository=facts.repository))
        except LedgerError as e:
            raise RunRefused(description=f"dw_dagster refused run {facts.run_id[:8]} of {facts.job_name}: {e}") from e
        return
    if kind is not None:
        raise RunRefused(description=(
            f"dw_dagster refused run {facts.run_id[:8]} of {facts.job_name}: a repair job runs only when the remediation "
            "sensor dispatches it for an approved change set (no dw/ticket); approve the change set instead "
            "(`dw-dagster approve`)"))
    held = held_partitions(led, facts)
    if held:
        cs_id, asset, parts = held[0]
        raise RunRefused(description=(
            f"dw_dagster refused run {facts.run_id[:8]} of {facts.job_name}: partitions {', '.join(parts)} of {asset} are "
            f"held by change set {cs_id}, whose approved repair is in progress; wait for its receipt, or a verified "
            f"approver can lift the hold (`dw-dagster holds lift {cs_id} --asset {asset}`)"))


def _dispatched_run_or_refuse(instance: dg.DagsterInstance, row, facts: RunFacts) -> None:
    """Refuse a run presenting a ticket it was not dispatched with: a run of another code location or
    repository than the sensor that issued the ticket, or (for a ticket the daemon dispatched) a run
    whose id the daemon did not reserve in one of the ticks that dispatched it. A ticket read from a
    run's tags, a tick's requests or anywhere else then launches nothing, from any location."""
    if row.dispatch is None:  # issued in process: its shape (location None) admits only runs made in process
        return
    where = row.dispatch
    if (facts.location, facts.repository) != (where.get("location"), where.get("repository")):
        got = f"code location {facts.location}, repository {facts.repository}" if facts.location else "no code location (made in process)"
        raise RunRefused(description=(
            f"dw_dagster refused run {facts.run_id[:8]} of {facts.job_name}: the ticket of stage {row.stage} of "
            f"{row.change_set_id} is for a run of code location {where.get('location')}, repository "
            f"{where.get('repository')} (where the remediation sensor that issued it runs), and this run has {got}: "
            "a job of the same name in another location is another run"))
    if row.run_id is not None:  # taken already: the ledger refuses it, naming the run that holds the stage
        return
    ticks = [t for t in where.get("ticks") or [] if str(t).isdigit()]
    for t in ticks:
        try:
            tick = instance.schedule_storage.get_tick(int(t))
        except Exception:  # noqa: BLE001 - a tick gone (purged) admits nothing
            continue
        if facts.run_id in set(tick.tick_data.reserved_run_ids or ()) | set(tick.run_ids or ()):
            return
    raise RunRefused(description=(
        f"dw_dagster refused run {facts.run_id[:8]} of {facts.job_name}: the ticket of stage {row.stage} of "
        f"{row.change_set_id} binds only the run the daemon created for it in the remediation sensor's tick "
        f"{', '.join(ticks) or '(none yet)'}; this run was launched otherwise (a copied ticket is another run)"))


@dataclass(frozen=True)
class HeldStage:
    """The stage an op's run holds: the ledger row, the change set version and the decision it runs under."""

    row: object
    change_set: object
    approval: object

    @property
    def stage(self) -> str:
        return self.row.stage

    def complete(self, instance: dg.DagsterInstance, run_id: str, *, success: bool, result: dict | None = None) -> bool:
        """Record the stage's end, by its own op (the authoritative completion)."""
        return ledger_for(instance).complete_stage(self.row.ticket, run_id, success=success, result=result)


def hold_stage(context, *, expect: Iterable[str] | None = None, change_set_id: str | None = None) -> HeldStage:
    """For a dw_dagster op about to act: take the stage its run's ticket names (binding it to this
    run), and load the change set version and the decision it was dispatched under.

    Args:
        context: the op's execution context.
        expect: stage names this op may run (e.g. ``["snapshot"]``); None for any.
        change_set_id: the change set the op's config names; refused when the ticket is for another.

    Raises:
        RunRefused: no ticket, an unknown or taken ticket, another stage or change set than the
            op's config names, a tampered record, or a decision that does not verify.
    """
    from dw_dagster.core.models import Approval
    from dw_dagster.core.records import load_change_set
    from dw_dagster.core.signing import signature_valid

    run = context.run
    ticket = run.tags.get(TICKET_TAG)
    if not ticket:
        raise RunRefused(description=f"{run.job_name} changes data only when the remediation sensor dispatches it for an "
                         "approved change set (this run has no dw/ticket)")
    admit_run(context.instance, RunFacts.of_run(run, job_tags=job_tags_of(context.job_def)))
    led = ledger_for(context.instance)
    row = led.stage_by_ticket(ticket)
    if expect is not None and row.stage not in set(expect):
        raise RunRefused(description=f"the run's ticket is for stage {row.stage}, not {'/'.join(expect)}")
    if change_set_id is not None and change_set_id != row.change_set_id:
        raise RunRefused(description=f"the run's ticket is for change set {row.change_set_id}, not {change_set_id}")
    try:
        cs = load_change_set(led, row.change_set_id, row.version)
    except Exception as e:  # noqa: BLE001 - TamperedRecord
        raise RunRefused(description=f"{e}; nothing runs") from e
    decision = led.decision(row.approval_id)
    approval = Approval.model_validate_json(decision["body"]) if decision is not None else None
    if approval is None or approval.decision != "approve" or not signature_valid(approval):
        raise RunRefused(description=f"stage {row.stage} of {row.change_set_id} was dispatched under decision "
                         f"{row.approval_id}, which does not verify; nothing runs")
    return HeldStage(row, cs, approval)


def finish_run_stage(instance: dg.DagsterInstance, run_id: str, ticket: str | None, success: bool,
                     result: dict | None = None) -> bool:
    """Record the end of the stage a run holds (the executor's or the in-process runner's part);
    True when it moved. A stage already completed by its own op is left as it is."""
    if not ticket:
        return False
    return ledger_for(instance).complete_stage(ticket, run_id, success=success, result=result or {"run_id": run_id})


def lift_hold(instance: dg.DagsterInstance, change_set_id: str, asset: str, identity, reason: str) -> None:
    """Let other runs materialize ``asset`` inside ``change_set_id``'s held window (recorded, by a verified person).

    Every held version of the change set on ``asset`` is lifted (an earlier version still being
    repaired after a newer one was recorded included).

    Raises:
        LedgerError: no version of the change set holds a window on ``asset``.
    """
    led = ledger_for(instance)
    rows = [r for r in led.open_windows(asset) if r.change_set_id == change_set_id]
    if not rows:
        raise LedgerError(f"change set {change_set_id} holds no window on {asset}")
    for row in rows:
        led.audit(HOLD_LIFT, f"{row.change_set_id}:{row.version}:{asset}", identity.email,
                  {"identity": identity.model_dump(mode="json"), "reason": reason})


# -- the executor ----------------------------------------------------------------------------------

class _GuardedExecutor(dg.Executor):
    def __init__(self, inner: dg.Executor) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        # Executors whose execution loop reads its settings back from the run's executor (dagster-celery
        # calls ``plan_context.executor.app_args()``) find them on the wrapped executor.
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    @property
    def retries(self):
        return self._inner.retries

    def execute(self, plan_context, execution_plan):
        run = plan_context.dagster_run
        instance = plan_context.instance
        keys = sorted({asset_str(o.properties.asset_key) for s in execution_plan.get_steps_to_execute_in_topo_order()
                       for o in s.step_outputs if o.properties is not None and o.properties.asset_key is not None
                       and o.properties.is_asset})
        admit_run(instance, RunFacts.of_run(run, keys if not run.asset_selection else None,
                                            job_tags=job_tags_of(plan_context.job.get_definition()), plan=execution_plan))
        failed = False
        for event in self._inner.execute(plan_context, execution_plan):
            if event.is_step_failure:
                failed = True
            yield event
        finish_run_stage(instance, run.run_id, run.tags.get(TICKET_TAG), not failed)


@public
def guarded_executor(base: dg.ExecutorDefinition = dg.multi_or_in_process_executor) -> dg.ExecutorDefinition:
    """``base`` (default Dagster's multiprocess-or-in-process executor) behind :func:`admit_run`.

    Set it as the ``executor`` of your ``Definitions`` (every asset job, the implicit one that
    ``dagster asset materialize`` uses included) so a run that would bypass an approval is
    refused before its first step, whatever launched it. It has ``base``'s config schema.
    """

    return dg.ExecutorDefinition(
        name=f"{c.GUARDED_EXECUTOR_PREFIX}{base.name}", config_schema=base.config_schema,
        requirements=getattr(base, "_requirements_fn", None),
        executor_creation_fn=lambda init_context: _GuardedExecutor(base.executor_creation_fn(init_context)),
        description=f"{base.name} behind dw_dagster's approval guard (dw_dagster.guarded_executor)")


# -- the run coordinator -----------------------------------------------------------------------------

try:  # dagster's queued coordinator, wrapped
    from dagster import QueuedRunCoordinator as _Queued
    from dagster import SubmitRunContext
except ImportError:  # pragma: no cover - dagster moved it
    _Queued, SubmitRunContext = object, object


@public
class GuardedRunCoordinator(_Queued):
    """Dagster's ``QueuedRunCoordinator`` that refuses, at submission, the runs :func:`admit_run` refuses.

    Set it in ``dagster.yaml``::

        run_coordinator:
          module: dw_dagster.guard
          class: GuardedRunCoordinator
          config: {max_concurrent_runs: 10}     # QueuedRunCoordinator's own settings

    A refused run is marked failed at once with the reason as its failure message (it never
    reaches a worker). It takes every setting of the queued coordinator.
    """

    def submit_run(self, context: SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        try:
            plan = (self._instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
                    if run.execution_plan_snapshot_id else None)
            admit_run(self._instance, RunFacts.of_run(run, _planned_assets(run, plan),
                                                      job_tags=run_job_tags(self._instance, run), plan=plan))
        except RunRefused as e:
            self._instance.report_run_failed(run, message=e.description)
            return self._instance.get_run_by_id(run.run_id)
        return super().submit_run(context)


def _planned_assets(run: dg.DagsterRun, snap) -> list[str] | None:
    """The assets a run will materialize: its asset selection, else what its execution plan
    snapshot ``snap`` (None: the run has none) outputs."""
    if run.asset_selection:
        return None
    if snap is None:
        return []
    keys = set()
    for step in snap.steps:
        for out in step.outputs:
            props = getattr(out, "properties", None)
            if props is not None and getattr(props, "asset_key", None) is not None and getattr(props, "is_asset", False):
                # materialized assets, not check results
                keys.add(asset_str(props.asset_key))
    return sorted(keys)


def stage_run_ended(led: Ledger, instance: dg.DagsterInstance, row) -> tuple[bool, str] | None:
    """For a started stage whose own code did not complete it: (succeeded, how) from its bound run,
    or None while the run is still going. A bound run that no longer exists ended the stage as
    abandoned (never replayed)."""
    if row.state != STARTED or not row.run_id:
        return None
    run = instance.get_run_by_id(row.run_id)
    if run is None:
        return False, f"its run {row.run_id[:8]} was deleted before it recorded an end"
    if not run.is_finished:
        return None
    return run.status == dg.DagsterRunStatus.SUCCESS, f"run {row.run_id[:8]} {run.status.value}"


def run_started(instance: dg.DagsterInstance, run_id: str) -> bool:
    """Whether a run ever started executing (its record has a start time)."""
    rec = instance.get_run_record_by_id(run_id)
    return rec is not None and rec.start_time is not None


def utc(ts: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc) if ts is not None else None


__all__ = ["GuardedRunCoordinator", "REPAIR_KINDS", "RunFacts", "RunRefused", "TICKET_TAG", "admit_run",
           "finish_run_stage", "guarded_executor", "held_partitions", "job_tags_of", "lift_hold", "repair_kind",
           "run_job_tags", "run_origin"]
