"""The verify stage runs the test a fix added: the ``dw_new_tests`` asset check.

A change set's ``new_tests`` are singular tests (:mod:`dw_dagster.proposals.regression_tests`) that
travel in its diff. Once the owner merged the diff, the files are in the pipeline repository; the
check reads each from there and runs it against the warehouse resource (its rows are failures).
In a repair's verify run (the remediation sensor tags it with the change set) it runs exactly
the change set's new tests, so the receipt names them and says whether they passed; in any other
run (CI, a person) it runs every ``dw_*.sql`` test of the tests folder. A test that is missing
(the diff is not merged) or does not run fails the check with the reason.
"""


from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core.records import load_change_set
from dw_dagster.core.table_names import table_slug
from dw_dagster.proposals.regression_tests import DEFAULT_TESTS_DIR, runnable_sql

NEW_TESTS_CHECK, NEW_TESTS_KEY = c.NEW_TESTS_CHECK, c.NEW_TESTS_KEY


def run_test_file(db, root: Path, path: str) -> dict:
    """Run one singular test file; ``{test, passed, failing_rows | error}``."""
    file = root / path
    if not file.exists():
        return {"test": path, "passed": False, "error": f"{path} is not in the pipeline repository (is the diff merged?)"}
    try:
        query = runnable_sql(file.read_text())
        (n,), = db.fetch_all(f"SELECT COUNT(*) FROM ({query}) AS dw_test")
    except Exception as e:  # noqa: BLE001 - a test that does not run fails, with the reason
        return {"test": path, "passed": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"test": path, "passed": int(n) == 0, "failing_rows": int(n)}


def build_new_tests_check(asset: dg.AssetKey | Sequence[str] | str, *, resource_key: str,
                          pipeline_root: Callable[[], Path] | str | Path, tests_dir: str = DEFAULT_TESTS_DIR,
                          name: str = NEW_TESTS_CHECK) -> dg.AssetChecksDefinition:
    """The check that runs the tests a change set added (module docstring).

    Args:
        asset: the repaired asset the check is on (a change set's ``target_asset``).
        resource_key: the ``DatabaseResource`` the tests query.
        pipeline_root: the pipeline repository (or a callable returning it) the merged tests are in.
        tests_dir: the tests folder, relative to it, for runs outside a repair.
        name: the check's name.
    """
    key = asset if isinstance(asset, dg.AssetKey) else dg.AssetKey(asset)

    @dg.asset_check(asset=key, name=name, required_resource_keys={resource_key},
                    description="The tests dw_dagster fixes added (singular SQL tests from the pipeline repository).")
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        root = Path(pipeline_root() if callable(pipeline_root) else pipeline_root)
        cs_id = context.run.tags.get(c.CHANGE_SET_TAG)
        version = context.run.tags.get(c.CHANGE_SET_VERSION_TAG)
        if cs_id:
            cs = load_change_set(context.instance, cs_id, version)
            paths = list(cs.new_tests) if cs is not None else []
        else:
            folder = root / tests_dir
            paths = sorted(p.relative_to(root).as_posix() for p in folder.glob("dw_*.sql")) if folder.exists() else []
        db = getattr(context.resources, resource_key).get_database()
        results = [run_test_file(db, root, p) for p in paths]
        failed = [r["test"] for r in results if not r["passed"]]
        return dg.AssetCheckResult(
            passed=not failed,
            description=(f"{len(results) - len(failed)} of {len(results)} new test(s) passed"
                         + (f"; failing: {', '.join(failed)}" if failed else "")),
            metadata={NEW_TESTS_KEY: dg.MetadataValue.json(results), c.NEW_TESTS_RUN_KEY: len(results)})

    return _check


def table_tests(root: Path, tests_dir: str, table: str) -> list[str]:
    """The tests a fix added for ``table`` in the tests folder (``dw_<kind>__<schema>__<table>.sql``), sorted."""
    folder = root / tests_dir
    suffix = "__" + table_slug(table) + ".sql"
    return sorted(p.relative_to(root).as_posix() for p in folder.glob("dw_*.sql")
                  if p.name.lower().endswith(suffix)) if folder.exists() else []


@dataclass(frozen=True)
class NewTestsTarget:
    """One asset whose fixes may add tests: its table, the database resource the tests query, the
    pipeline repository (or a callable returning it) the merged tests are in, and their folder."""

    asset: dg.AssetKey
    table: str
    resource_key: str
    pipeline_root: Callable[[], Path] | Path
    tests_dir: str = DEFAULT_TESTS_DIR


def build_new_tests_checks(targets: Sequence[NewTestsTarget], *, name: str = NEW_TESTS_CHECK) -> dg.AssetChecksDefinition:
    """The ``name`` check on each target, in one op that evaluates only where there are tests to run,
    so a verify job can always hold it: in a repair's verify run, the change set's ``new_tests`` on
    its target asset when its ``verify_checks`` name this check (a change set without new tests, or
    whose test is a dbt test run by dbt, records no evaluation of it, and its receipt lists the
    same checks as without it); in any other run, each selected asset's ``dw_*__<table>.sql``
    tests of its tests folder, when it has any.
    """
    by_key = {t.asset: t for t in targets}
    specs = [dg.AssetCheckSpec(name, asset=t.asset, description="The tests dw_dagster fixes added (singular SQL tests "
                               "from the pipeline repository), run when there are any.") for t in targets]

    @dg.multi_asset_check(specs=specs, name=name, can_subset=True,
                          required_resource_keys={t.resource_key for t in targets})
    def _checks(context: dg.AssetCheckExecutionContext):
        cs_id = context.run.tags.get(c.CHANGE_SET_TAG)
        cs = load_change_set(context.instance, cs_id, context.run.tags.get(c.CHANGE_SET_VERSION_TAG)) if cs_id else None
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.to_user_string()):
            t = by_key[key.asset_key]
            root = Path(t.pipeline_root() if callable(t.pipeline_root) else t.pipeline_root)
            if cs_id:
                wanted = cs is not None and [*key.asset_key.path, key.name] in [list(k) for k in cs.verify_checks]
                paths = list(cs.new_tests) if wanted else []
            else:
                paths = table_tests(root, t.tests_dir, t.table)
            if not paths:
                continue  # nothing to run here: no evaluation (the check is skipped in this run)
            db = getattr(context.resources, t.resource_key).get_database()
            results = [run_test_file(db, root, p) for p in paths]
            failed = [r["test"] for r in results if not r["passed"]]
            yield dg.AssetCheckResult(
                asset_key=key.asset_key, check_name=key.name, passed=not failed,
                description=(f"{len(results) - len(failed)} of {len(results)} new test(s) passed"
                             + (f"; failing: {', '.join(failed)}" if failed else "")),
                metadata={NEW_TESTS_KEY: dg.MetadataValue.json(results), c.NEW_TESTS_RUN_KEY: len(results)})

    return _checks


__all__ = ["NEW_TESTS_CHECK", "NEW_TESTS_KEY", "NewTestsTarget", "build_new_tests_check", "build_new_tests_checks",
           "run_test_file", "table_tests"]
