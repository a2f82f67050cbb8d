"""The ``dbt_build`` step: build one dbt model of the merged project after its contract changed.

A schema change upstream of a dbt model with an enforced contract is fixed in the model's
properties file (:func:`dw_dagster.diagnosis.fixes.propose_contract_fix`); once the owner merged
that diff, this step runs ``dbt build --select <model>`` in the project (the contract is enforced
by that build, the model's own tests run with it). A failing build refuses the step with dbt's
summary line, so nothing after it runs.
"""

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from dw_dagster.core.models import ChangeSet, ChangeStep
from dw_dagster.databases import Database
from dw_dagster.changes.steps import StepRefused, StepRunner


def _dbt() -> str:
    local = Path(sys.executable).parent / "dbt"
    return str(local) if local.exists() else (shutil.which("dbt") or "dbt")


def dbt_build_runner(*, pipeline_root: Callable[[], Path] | str | Path, profiles_dir: str | Path | None = None,
                     target: str | None = None, timeout_s: float = 600.0, env: dict | None = None) -> StepRunner:
    """The runner of ``dbt_build`` steps (pass it to ``build_step_jobs`` as ``{"dbt_build": ...}``).

    Args:
        pipeline_root: the pipeline repository the step's ``project_dir`` is relative to.
        profiles_dir: dbt's profiles folder (default the project's).
        target: the dbt target (default the profile's).
        timeout_s: the longest the build may take.
        env: extra environment variables for dbt.
    """
    def run(context: dg.OpExecutionContext, cs: ChangeSet, step: ChangeStep, db: Database) -> dict:
        import os

        root = Path(pipeline_root() if callable(pipeline_root) else pipeline_root)
        project = root / step.spec["project_dir"]
        args = [_dbt(), "build", "--select", step.spec["select"], "--project-dir", str(project),
                "--profiles-dir", str(profiles_dir or project)] + (["--target", target] if target else [])
        context.log.info(" ".join(args[1:]))
        res = subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=timeout_s,
                             env={**os.environ, **(env or {})})
        tail = [line for line in res.stdout.splitlines() if line.strip()][-6:]
        if res.returncode:
            raise StepRefused(f"dbt build --select {step.spec['select']} failed: {' | '.join(tail)[-600:]}",
                              {"returncode": res.returncode, "output": tail})
        return {"command": " ".join(["dbt", *args[1:]]), "output": tail}

    return run


__all__ = ["dbt_build_runner"]
