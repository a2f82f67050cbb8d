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
from pathlib import Path
from typing import Callable

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core.records import load_change_set
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


__all__ = ["NEW_TESTS_CHECK", "NEW_TESTS_KEY", "build_new_tests_check", "run_test_file"]
