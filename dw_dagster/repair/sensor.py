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

For each stage the sensor issues one ticket in the ledger (:mod:`dw_dagster.guard.admission`) and
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

from collections.abc import Callable, Mapping
from pathlib import Path

import dagster as dg

from dw_dagster.core.domains import DomainsSource
from dw_dagster.core import keys as c
from dw_dagster.core.models import ChangeSet
from dw_dagster.repair.tick import RemediationJobs, RemediationTick
from dw_dagster.dagster_private import public


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
    name: str = c.REMEDIATION_SENSOR,
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
    jobs = RemediationJobs(
        verify_job=verify_job, receipt_job=receipt_job, window_job=window_job, rebuild_job=rebuild_job,
        undo_jobs=undo_jobs, step_jobs=dict(step_jobs or {}), partitions_def=partitions_def, partitions_of=partitions_of,
        pipeline_root=pipeline_root, domains=domains, stage_gates=dict(stage_gates or {}), accepts=accepts,
        reissue_after_s=reissue_after_seconds if reissue_after_seconds is not None else max(120.0, 4.0 * minimum_interval_seconds))

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status, jobs=jobs.all(),
               description="Launches the repair stages of approved dw_dagster change sets, one after the other.")
    def _sensor(context: dg.SensorEvaluationContext):
        return RemediationTick.evaluate(context, jobs)

    return _sensor
