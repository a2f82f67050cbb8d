"""Wiring the fix of each diagnosed cause (:mod:`dw_dagster.diagnosis.fixes`) into a location that
:func:`~dw_dagster.definitions.build_dw_definitions` builds from its configuration.

An asset loaded incrementally (``incremental_load``, ``recorded_load``) may be diagnosed with an
upstream that failed or went stale, a duplicated load or a schema change; the change set of each
adds a test (a singular SQL test in the pipeline repository) that the verify stage runs. Here:

- where that test goes (``tests_dir``: configured, else the dbt project's first ``test-paths``
  folder when the project is inside the pipeline repository, else ``tests``) and which table an
  upstream asset is (``upstream_tables``: configured, else the other watched assets and the check
  sources in the asset's database), passed to the diagnoser;
- the ``dw_new_tests`` check on each such asset (:func:`~dw_dagster.repair.new_tests.build_new_tests_checks`),
  held by the verify job: it evaluates only for a change set that carries new tests, so the
  receipts of every other change set list the same checks as before;
- the step runners: ``dedupe`` (a duplicated load's partitions replaced) and, with a dbt project,
  ``dbt_build`` (a model built after its contract changed);
- the upstream assets named under ``upstream_tables``, which an upstream fix reruns in the window job.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from dw_dagster.config import DataOpsConfig, WatchedAssetConfig
from dw_dagster.core import keys as c
from dw_dagster.errors import DwConfigError

#: where the tests go without a configured folder or a dbt project inside the pipeline repository
FALLBACK_TESTS_DIR = "tests"


def dbt_test_paths(project_dir: Path) -> list[str]:
    """The dbt project's ``test-paths`` (``dbt_project.yml``; dbt's default ``["tests"]``)."""
    import yaml

    file = project_dir / "dbt_project.yml"
    try:
        doc = yaml.safe_load(file.read_text()) if file.exists() else {}
    except yaml.YAMLError as e:
        raise DwConfigError(f"dbt.project_dir: {file} is not YAML: {e}") from e
    paths = (doc or {}).get("test-paths") or ["tests"]
    return [str(p) for p in paths] if isinstance(paths, list) else [str(paths)]


def tests_dir_for(configured: str | None, repo: Path, dbt_project_dir: Path | None) -> str:
    """The folder of the pipeline repository ``repo`` the tests a fix adds go to (module docstring)."""
    if configured:
        return configured.strip("/")
    if dbt_project_dir is not None:
        try:
            rel = dbt_project_dir.resolve().relative_to(repo.resolve())
        except ValueError:
            return FALLBACK_TESTS_DIR
        return (rel / dbt_test_paths(dbt_project_dir)[0]).as_posix().removeprefix("./")
    return FALLBACK_TESTS_DIR


def upstream_tables_for(cfg: DataOpsConfig, a: WatchedAssetConfig, configured: dict[str, str]) -> dict[str, str]:
    """Upstream asset key → table for ``a``'s upstream fix: the other watched assets and the check
    sources that name an asset, in ``a``'s database, then what is configured (which wins)."""
    out = {o.key: o.table for o in cfg.assets if o.key != a.key and o.database == a.database}
    for _, check in a.checks.configured():
        src = getattr(check, "source", None)
        if src is not None and src.asset and src.database == a.database:
            out.setdefault(src.asset, src.table)
    return {**out, **configured}


@dataclass
class CauseFixes:
    """What the location's cause fixes add, collected asset by asset (module docstring)."""

    targets: list = field(default_factory=list)
    upstream_assets: list[dg.AssetKey] = field(default_factory=list)

    def diagnoser_settings(self, p, *, cfg: DataOpsConfig, a: WatchedAssetConfig, key: dg.AssetKey, repo: Path,
                           dbt_project_dir: Path | None) -> dict[str, Any]:
        """The fix settings of the diagnoser of ``a`` (``p``: its incremental or recorded load
        configuration); records its ``dw_new_tests`` target and its configured upstream assets."""
        from dw_dagster.repair.new_tests import NewTestsTarget

        tests_dir = tests_dir_for(p.tests_dir, repo, dbt_project_dir)
        self.targets.append(NewTestsTarget(asset=key, table=a.table, resource_key=a.database,
                                           pipeline_root=lambda r=repo: r, tests_dir=tests_dir))
        for k in p.upstream_tables:
            up = dg.AssetKey.from_user_string(k)
            if up != key and up not in self.upstream_assets:
                self.upstream_assets.append(up)
        max_age = dt.timedelta(hours=p.upstream_max_age_hours) if p.upstream_max_age_hours else None
        return {"tests_dir": tests_dir, "upstream_tables": upstream_tables_for(cfg, a, dict(p.upstream_tables)),
                "upstream_max_age": max_age}

    def checks(self) -> list[dg.AssetChecksDefinition]:
        """The ``dw_new_tests`` checks (one op), or none without a target."""
        from dw_dagster.repair.new_tests import build_new_tests_checks

        return [build_new_tests_checks(self.targets)] if self.targets else []

    def verify_keys(self) -> list[dg.AssetCheckKey]:
        """The ``dw_new_tests`` check keys the verify job holds."""
        return [dg.AssetCheckKey(t.asset, c.NEW_TESTS_CHECK) for t in self.targets]

    def step_runners(self, *, pipeline_root: Path | None, dbt_project_dir: Path | None,
                     dbt_profiles_dir: Path | None) -> dict[str, Any]:
        """``dedupe`` when an asset's fixes may replace a duplicated load; ``dbt_build`` with a dbt
        project inside the pipeline repository."""
        if not self.targets:
            return {}
        from dw_dagster.changes.dedupe import DEDUPE, run_dedupe_step

        runners: dict[str, Any] = {DEDUPE: run_dedupe_step}
        if pipeline_root is not None and dbt_project_dir is not None:
            from dw_dagster.repair.dbt_build import dbt_build_runner

            runners[c.DBT_BUILD_STEP] = dbt_build_runner(pipeline_root=lambda: pipeline_root, profiles_dir=dbt_profiles_dir)
        return runners


__all__ = ["FALLBACK_TESTS_DIR", "CauseFixes", "dbt_test_paths", "tests_dir_for", "upstream_tables_for"]
