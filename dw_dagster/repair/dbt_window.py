"""The ``dbt_window`` step: a bounded rebuild of a dbt incremental model over the approved days.

A change set for late rows behind a dbt incremental model (:mod:`dw_dagster.proposals.dbt_incremental`)
carries one ``dbt_window`` step. Like every step it runs after approval, after the owner merged the
diff (the remediation sensor waits for it) and under a ticket (:mod:`dw_dagster.repair.steps`). It
runs, once per contiguous range of the approved days::

    dbt build --select <model> --vars '{"dw_window_start": "<start>", "dw_window_end": "<end>"}'

so the merged model re-reads its source rows of ``[start, end)`` on the window column, merged on
its ``unique_key`` (no ``--full-refresh``: only the window is re-read). The model's tests run with
it (``dbt build``); a failing build fails the step. The model's materializations and test results
are logged from the step's op with dagster-dbt's events (the asset keys of the translator given),
each materialization with its ``dw/incremental_run`` record, so the next diagnosis knows what the
rebuild read. The step refuses (nothing is run) when the model on disk has no bounded-rebuild
clause on the approved column.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
from sqlglot import exp

from dw_dagster.core.models import ChangeSet, ChangeStep
from dw_dagster.databases import Database, sql
from dw_dagster.pipelines.dbt_incremental import (
    DbtIncrementalError, incremental_model, read_incremental_filter, record_run, with_run_record)
from dw_dagster.proposals.dbt_incremental import DBT_WINDOW, window_vars
from dw_dagster.changes.steps import StepRefused, StepRunner


def _window_rows(db: Database, table: str, column: str, start: dt.datetime, end: dt.datetime) -> int:
    col = sql.column(column)
    q = (exp.select(exp.Count(this=exp.Star())).from_(sql.table(table))
         .where(exp.GTE(this=col, expression=sql.literal(start))).where(exp.LT(this=col.copy(), expression=sql.literal(end))))
    return int(db.fetch_all(q.sql(dialect=db.dialect))[0][0])


def dbt_window_runner(*, project_dir: str | Path, profiles_dir: str | Path | None, manifest_path: Callable[[], Path],
                      dbt_executable: str = "dbt", target: str | None = None, translator: Any = None) -> StepRunner:
    """The runner of ``dbt_window`` steps for one dbt project (pass it to ``build_step_jobs``).

    Args:
        project_dir: the dbt project (the merged working copy).
        profiles_dir: its ``profiles.yml`` folder (default: ``project_dir``).
        manifest_path: returns the project's ``manifest.json`` (maps the model to its asset key).
        dbt_executable: the ``dbt`` to run.
        target: the dbt target (default: the profile's).
        translator: the ``DagsterDbtTranslator`` of the project's ``@dbt_assets`` (default dagster-dbt's).

    Returns:
        ``(context, change set, step, database) -> result``; the result holds, per range, the dbt
        command, the rows of the window before and after, and the total rows the rebuild added.

    Raises (from the runner):
        StepRefused: the model file cannot be read as an incremental model, or has no
            bounded-rebuild clause on the step's window column (the diff is not merged).
        dagster.Failure: a dbt build failed (its tests included).
    """
    project = Path(project_dir)

    def run(context: dg.OpExecutionContext, cs: ChangeSet, step: ChangeStep, db: Database) -> dict:
        from dagster_dbt import DagsterDbtTranslator, DbtCliResource

        spec = step.spec
        if step.kind != DBT_WINDOW:
            raise StepRefused(f"a {step.kind} step is not a {DBT_WINDOW} step")
        manifest = json.loads(Path(manifest_path()).read_text())
        try:
            model = incremental_model(manifest, spec["model"])
            filt = read_incremental_filter((project / spec["model_file"]).read_text(), db.dialect)
        except (DbtIncrementalError, OSError) as e:
            raise StepRefused(f"model {spec['model']} cannot be rebuilt by window: {e}") from e
        if filt.window_column != spec["window_column"]:
            raise StepRefused(f"model {model.name} has no bounded-rebuild clause on {spec['window_column']} "
                              f"(found {filt.window_column}): the change set's diff is not what the model holds",
                              {"model_file": spec["model_file"]})
        tr = translator or DagsterDbtTranslator()
        key = tr.get_asset_spec(manifest, model.unique_id, None).key
        dbt = DbtCliResource(project_dir=str(project), profiles_dir=str(profiles_dir or project),
                             dbt_executable=dbt_executable, target=target)
        ranges, added = [], 0
        for start_s, end_s in spec["ranges"]:
            start, end = dt.datetime.fromisoformat(start_s), dt.datetime.fromisoformat(end_s)
            before = _window_rows(db, model.relation, spec["window_column"], start, end)
            record = record_run(db, model, filt, arrival_column=spec["arrival_column"], source_table=spec["source_table"],
                                window=(start, end))
            args = ["build", "--select", model.name, "--vars", window_vars(start, end)]
            context.log.info(f"dbt {' '.join(args)}")
            invocation = dbt.cli(args, manifest=manifest, dagster_dbt_translator=tr, raise_on_error=False)
            for event in invocation.stream():
                if isinstance(event, dg.AssetMaterialization) and event.asset_key == key:
                    event = with_run_record(event, record)
                if isinstance(event, (dg.AssetMaterialization, dg.AssetObservation, dg.AssetCheckEvaluation)):
                    context.log_event(event)
            if not invocation.is_successful():
                raise dg.Failure(description=f"dbt {' '.join(args)} failed; nothing after it ran (see the run's logs)")
            after = _window_rows(db, model.relation, spec["window_column"], start, end)
            added += after - before
            ranges.append({"start": start_s, "end": end_s, "command": f"dbt {' '.join(args)}", "rows_before": before,
                           "rows_after": after})
        return {"model": model.name, "asset_key": list(key.path), "window_column": spec["window_column"],
                "ranges": ranges, "rows_added": added}

    return run


__all__ = ["DBT_WINDOW", "dbt_window_runner"]
