"""Steps: warehouse changes a change set applies as stages of their own (schema migrations, replays).

A partition rerun is not the only repair. When rows were rejected by the target (a REQUIRED
column receiving NULLs, the orders stream), the repair is a schema migration with its rollback,
then a guarded replay of the parked rows. A change set lists those as
:class:`~dw_dagster.core.models.ChangeStep` s; the remediation sensor runs each as one stage, in
order, after the window stages and before the rebuild (:func:`dw_dagster.repair.stages.stage_plan`),
each only after the previous succeeded, all under the change set's valid approval.

This module is the vocabulary: a step's stage name (:func:`step_stage`), its op's name, the
constructor of a ``migration`` step (:func:`migration_step`) and the runners of ``migration`` and
``migration_rollback`` steps (``(context, change_set, step, database) -> dict``; a runner that
refuses raises :class:`StepRefused`). The jobs that run them under a ticket are
:func:`dw_dagster.repair.steps.build_step_jobs`; other kinds (``replay``, ``dedupe``) bring their own
runners (:mod:`dw_dagster.changes.replay`, :mod:`dw_dagster.changes.dedupe`).
"""

import datetime as dt
from collections.abc import Callable
from typing import Any

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.databases import Database
from dw_dagster.core.domains import SCHEMA_MIGRATION
from dw_dagster.core.models import ChangeSet, ChangeStep
from dw_dagster.errors import DwDagsterError
from dw_dagster.dagster_private import public

STEP_OP_PREFIX = c.STEP_OP_PREFIX
STEP_RESULT_KEY = c.STEP_RESULT_KEY
STEP_JOB_PREFIX = c.STEP_JOB_PREFIX
MIGRATION = "migration"

#: ``(context, change set, step, database) -> result`` (a JSON-serializable dict)
StepRunner = Callable[[dg.OpExecutionContext, ChangeSet, ChangeStep, Database], dict]


@public
class StepRefused(DwDagsterError, RuntimeError):
    """A step's guard found the data not as the change set expected; nothing (more) was changed.

    Attributes:
        details: JSON-serializable facts behind the refusal (counts, expected values).
    """

    def __init__(self, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


def step_op_name(kind: str) -> str:
    """The op of the ``kind`` step job: ``dw_apply_<kind>_step`` (op names are unique in a code location)."""
    return f"{STEP_OP_PREFIX}{kind}_step"


@public
def step_stage(index: int, step: ChangeStep) -> str:
    """The stage name of the ``index``-th step (0-based): ``<kind>-<index + 1>``, e.g. ``migration-1``."""
    return f"{step.kind}-{index + 1}"


def step_stages(cs: ChangeSet) -> dict[str, int]:
    """Stage name → step index, in the change set's order."""
    return {step_stage(i, s): i for i, s in enumerate(cs.steps)}


@public
def migration_step(migration: Any, *, resource_key: str, summary: str | None = None,
                   change_class: str = SCHEMA_MIGRATION) -> ChangeStep:
    """A ``migration`` step from a :class:`~dw_dagster.changes.migrations.Migration`.

    Args:
        migration: from :func:`~dw_dagster.changes.migrations.generate_migration` (its dialect must be
            the one of the database behind ``resource_key``).
        resource_key: the database resource the migration runs on.
        summary: the owner's sentence (default: the migration's own summary).
        change_class: the domain class it belongs to.

    Returns:
        A :class:`~dw_dagster.core.models.ChangeStep` whose ``sql`` / ``rollback_sql`` are the
        migration's forward and rollback statements and whose ``spec`` holds the migration.
    """
    return ChangeStep(kind=MIGRATION, change_class=change_class, summary=summary or migration.summary,
                      resource_key=resource_key, spec={"migration": migration.model_dump(mode="json")},
                      sql=list(migration.forward), rollback_sql=list(migration.rollback))


def _apply_direction(db: Database, m, direction: str) -> bool:
    """Run one direction of a migration unless the catalog already shows it; True when it already did (nothing ran).

    Raises:
        StepRefused: a guard counted rows, or the catalog does not show the change once it ran.
    """
    from dw_dagster.changes.migrations import apply_migration, verify_migration
    from dw_dagster.changes.migrations import MigrationRefused

    if not verify_migration(db, m, direction):
        return True
    try:
        apply_migration(db, m, direction)
    except MigrationRefused as e:
        raise StepRefused(str(e), {"guard": e.guard.description, "rows": e.rows}) from e
    after = verify_migration(db, m, direction)
    if after:
        what = "migration" if direction == "forward" else "rollback"
        raise StepRefused(f"the {what} ran but the catalog does not show it: {'; '.join(after)}", {"failures": after})
    return False


@public
def run_migration_step(context: dg.OpExecutionContext, cs: ChangeSet, step: ChangeStep, db: Database) -> dict:
    """Apply a ``migration`` step forward: guards, statements, then the catalog checks.

    Idempotent: when the catalog already shows the forward's effect (a re-run after a crash,
    or someone applied it by hand), nothing is run and ``already_applied`` is true.

    Returns:
        ``{dialect, summary, already_applied, statements, rollback, notes}``.

    Raises:
        StepRefused: a forward guard counted rows (with the count), or the catalog does not show
            the change once it ran.
        dw_dagster.databases.DatabaseError: a statement failed.
    """
    from dw_dagster.changes.migrations import Migration

    m = Migration.model_validate(step.spec["migration"])
    already = _apply_direction(db, m, "forward")
    context.log.info(f"{m.summary} ({'already applied' if already else 'applied'})")
    return {"dialect": m.dialect, "summary": m.summary, "already_applied": already,
            "statements": [] if already else list(m.forward), "rollback": list(m.rollback), "notes": list(m.notes)}


MIGRATION_ROLLBACK = "migration_rollback"


def run_migration_rollback_step(context: dg.OpExecutionContext, cs: ChangeSet, step: ChangeStep, db: Database) -> dict:
    """Apply a ``migration_rollback`` step: the rollback direction of the migration in ``step.spec``
    (an undo change set's step, :func:`dw_dagster.repair.undo.propose_undo`).

    Idempotent like :func:`run_migration_step`: when the catalog already shows the rollback, nothing runs.

    Returns:
        ``{dialect, summary, already_applied, statements}``.

    Raises:
        StepRefused: a rollback guard counted rows (e.g. NULLs written since a relax: REQUIRED cannot
            be re-imposed), or the catalog does not show the rollback once it ran.
    """
    from dw_dagster.changes.migrations import Migration

    m = Migration.model_validate(step.spec["migration"])
    already = _apply_direction(db, m, "rollback")
    context.log.info(f"rolled back: {m.summary} ({'already' if already else 'now'})")
    return {"dialect": m.dialect, "summary": f"rollback of: {m.summary}", "already_applied": already,
            "statements": [] if already else list(m.rollback)}


def steps_markdown(cs: ChangeSet) -> str:
    """The change set's steps as markdown: per stage its summary, expected rows, forward and rollback SQL.

    Empty for a change set without steps. (For the asset page next to
    :func:`~dw_dagster.proposals.watermark.change_set_markdown`, which shows the diff.)
    """
    if not cs.steps:
        return ""
    lines = [f"### Steps of change set {cs.id} (version {cs.version}), run in this order after approval"]
    for i, st in enumerate(cs.steps):
        lines += ["", f"**{step_stage(i, st)}** ({st.change_class}, on resource `{st.resource_key}`): {st.summary}"]
        if st.expected_rows is not None:
            lines.append(f"- expected rows: {st.expected_rows:,} (any other count refuses the step)")
        if st.sql:
            lines += ["- forward:", "```sql", *[f"{x};" for x in st.sql], "```"]
        if st.rollback_sql:
            lines += ["- rollback:", "```sql", *[f"{x};" for x in st.rollback_sql], "```"]
    stages = [step_stage(i, st) for i, st in enumerate(cs.steps)]
    tail = (["rebuild"] if cs.rebuild_assets else []) + ["verify", "receipt"]
    lines += ["", "Stages: " + " → ".join(stages + tail)]
    if cs.manual_steps:
        from dw_dagster.changes.manual_steps import manual_steps_markdown

        lines += ["", manual_steps_markdown(cs)]
    return "\n".join(lines)


@public
def step_results(instance: dg.DagsterInstance, change_set: ChangeSet) -> list[dict]:
    """The results of ``change_set``'s steps as their ops recorded them in the ledger, in step order
    (each ``{stage, step_index, refused, started_at, ...}``); steps that did not end are absent."""
    from dw_dagster.core.ledger import SUCCEEDED, STAGE_FAILED, ledger_for

    stages = ledger_for(instance).stages(change_set.id, change_set.version)
    out = []
    for name, index in step_stages(change_set).items():
        st = stages.get(name)
        if st is not None and st.state in (SUCCEEDED, STAGE_FAILED) and st.result and "step_index" in st.result:
            out.append(st.result)
    return out


def first_step_started(instance: dg.DagsterInstance, change_set: ChangeSet) -> dt.datetime | None:
    """When the change set's first step started (aware UTC), or None when no step has run."""
    times = [dt.datetime.fromisoformat(r["started_at"]) for r in step_results(instance, change_set) if r.get("started_at")]
    return min(times) if times else None


__all__ = [
    "MIGRATION", "MIGRATION_ROLLBACK", "STEP_JOB_PREFIX", "STEP_OP_PREFIX", "STEP_RESULT_KEY", "StepRefused", "StepRunner",
    "first_step_started", "migration_step", "run_migration_step", "step_op_name", "step_results",
    "step_stage", "step_stages", "steps_markdown",
]
