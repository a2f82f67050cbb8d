"""The step jobs: each runs one approved step of a change set as a stage of its repair.

A step job (:func:`build_step_jobs`) has one op (``dw_apply_<kind>_step``, config :class:`StepConfig`)
that takes the stage its run's ticket names (:func:`dw_dagster.guard.admission.hold_stage`: no ticket,
no step), runs the kind's runner (:mod:`dw_dagster.changes.steps`: what a step is, its runners and
their refusals) against the step's database resource, records the stage's end with its result in
the ledger and shows it as an ``AssetObservation`` with ``dw/step_result`` (JSON) on the change
set's target asset. A runner that refuses raises :class:`~dw_dagster.changes.steps.StepRefused`:
the refusal is recorded with ``refused: true`` and the run fails, so the stages after it never run.
"""

from collections.abc import Mapping, Sequence

import dagster as dg
from pydantic import Field

from dw_dagster.core import keys as c
from dw_dagster.core.models import ChangeSet, ChangeStep, utcnow
from dw_dagster.changes.steps import (
    MIGRATION,
    MIGRATION_ROLLBACK,
    STEP_JOB_PREFIX,
    STEP_RESULT_KEY,
    StepRefused,
    StepRunner,
    run_migration_rollback_step,
    run_migration_step,
    step_op_name,
    step_stage,
)
from dw_dagster.dagster_private import public


class StepConfig(dg.Config):
    """Config of a step job's op (the remediation sensor fills it in)."""

    change_set_id: str = Field(description="the approved change set")
    step_index: int = Field(description="which of its steps to apply (0-based)")


def _result_event(cs: ChangeSet, stage: str, step: ChangeStep, data: dict, description: str) -> dg.AssetObservation:
    return dg.AssetObservation(asset_key=dg.AssetKey(cs.target_asset), description=description[:1000],
                               metadata={STEP_RESULT_KEY: dg.MetadataValue.json(data), c.CHANGE_SET_ID_KEY: cs.id,
                                         c.STEP_STAGE_KEY: stage, c.STEP_KIND_KEY: step.kind})


def _step_op_fn(kind: str, runner: StepRunner):
    def _apply(context: dg.OpExecutionContext, config: StepConfig) -> None:
        from dw_dagster.guard.admission import hold_stage

        held = hold_stage(context, change_set_id=config.change_set_id)
        cs, approval = held.change_set, held.approval
        if not 0 <= config.step_index < len(cs.steps):
            raise dg.Failure(description=f"change set {cs.id} has no step {config.step_index}")
        step = cs.steps[config.step_index]
        stage = step_stage(config.step_index, step)
        if held.stage != stage:
            raise dg.Failure(description=f"the run's ticket is for stage {held.stage}, not {stage}")
        if step.kind != kind:
            raise dg.Failure(description=f"step {config.step_index} of {cs.id} is a {step.kind} step, this job runs {kind}")
        db = getattr(context.resources, step.resource_key).get_database()
        started = utcnow()
        base = {"change_set_id": cs.id, "change_set_version": cs.version, "approval_id": approval.id, "stage": stage,
                "kind": kind, "change_class": step.change_class, "step_index": config.step_index,
                "started_at": started.isoformat(), "run_id": context.run_id}
        try:
            result = runner(context, cs, step, db)
        except StepRefused as e:
            data = {**base, "refused": True, "reason": str(e), "details": e.details, "finished_at": utcnow().isoformat()}
            held.complete(context.instance, context.run_id, success=False, result=data)
            context.log_event(_result_event(cs, stage, step, data, f"{stage} of change set {cs.id} REFUSED: {e}"))
            raise dg.Failure(description=f"{stage} of change set {cs.id} refused: {e}",
                             metadata={c.REFUSAL_KEY: dg.MetadataValue.json(data)}) from e
        data = {**base, "refused": False, **result, "finished_at": utcnow().isoformat()}
        held.complete(context.instance, context.run_id, success=True, result=data)
        context.log_event(_result_event(cs, stage, step, data, f"{stage} of change set {cs.id}: {step.summary}"))

    _apply.__name__ = step_op_name(kind)
    return _apply


def build_step_job(kind: str, runner: StepRunner, resource_keys: Sequence[str], name: str | None = None,
                   executor: dg.ExecutorDefinition | None = None) -> dg.JobDefinition:
    """One job that applies ``kind`` steps (op :func:`step_op_name`, config :class:`StepConfig`).

    Args:
        kind: the step kind it runs.
        runner: ``(context, change set, step, database) -> dict``; raise :class:`StepRefused` to refuse.
        resource_keys: the database resources steps may name.
        name: the job name (default ``dw_step_<kind>``).
        executor: runs the job's step (default the guarded in-process executor).
    """
    op = dg.op(name=step_op_name(kind), required_resource_keys=set(resource_keys), tags={"kind": "dw"},
               description=f"Apply one approved {kind} step of a dw_dagster change set.")(_step_op_fn(kind, runner))

    from dw_dagster.guard.admission import guarded_executor

    @dg.job(name=name or f"{STEP_JOB_PREFIX}{kind}", tags={c.KIND_KEY: c.STEP_KIND, c.STEP_KIND_KEY: kind},
            executor_def=executor or guarded_executor(dg.in_process_executor),
            description=f"Apply an approved {kind} step of a dw_dagster change set (run by the remediation sensor).")
    def _job():
        op()

    return _job


@public
def build_step_jobs(runners: Mapping[str, StepRunner] | None = None, *, resource_keys: Sequence[str] = ("warehouse",),
                    include_migration: bool = True, executor: dg.ExecutorDefinition | None = None,
                    ) -> dict[str, dg.JobDefinition]:
    """The step jobs to pass to :func:`~dw_dagster.repair.sensor.build_remediation_sensor` (``step_jobs``).

    Args:
        runners: step kind → runner (e.g. ``{"replay": run_replay_step}``).
        resource_keys: the database resources the steps name.
        include_migration: add the ``migration`` and ``migration_rollback`` runners unless given.
        executor: runs the jobs' steps (default the guarded in-process executor).

    Returns:
        Step kind → job (add the jobs to your ``Definitions``).
    """
    all_runners: dict[str, StepRunner] = (
        {MIGRATION: run_migration_step, MIGRATION_ROLLBACK: run_migration_rollback_step} if include_migration else {})
    all_runners.update(runners or {})
    return {kind: build_step_job(kind, r, resource_keys, executor=executor) for kind, r in all_runners.items()}


__all__ = ["StepConfig", "build_step_job", "build_step_jobs"]
