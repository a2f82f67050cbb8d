"""The public surface: what ``import dw_dagster`` offers is a decision, not an accident.

Adding a name here is a new public API (document it); removing one breaks users. About 45 names:
what a definitions file uses (the Component, build_dw_definitions, the factories, resources and
config models), the error root with its main subclasses and the record readers; the rest stays
importable from its submodule. The imports run one way: the library never imports the examples
or the demos' harness (``dw_dagster_examples``, ``dw_dagster_dev``: a distribution of their own,
outside the wheel; the command line adds their commands through entry points), and examples
never import each other.
"""

import ast
from pathlib import Path

import pytest

import dw_dagster

PACKAGE = Path(dw_dagster.__file__).parent
EXAMPLES_DIR = PACKAGE.parent / "examples" / "dw_dagster_examples"
OUTSIDE = ("dw_dagster_examples", "dw_dagster_dev")

PUBLIC = ['AccessSpec', 'CostResource', 'DataOpsComponent', 'DataOpsConfig', 'Database', 'DatabaseError', 'DatabaseResource', 'DwConfigError', 'DwDagsterError', 'EmailResource', 'GuardedRunCoordinator', 'IncrementalLoadSpec', 'JiraResource', 'LightupResource', 'LoadError', 'LoadResult', 'MageResource', 'MigrationError', 'OpsgenieResource', 'PagerDutyResource', 'PipelineRepoResource', 'ServiceNowResource', 'SinkColumn', 'SinkTable', 'SlackResource', 'VolumeTable', 'WatchedAssetConfig', '__version__', 'build_access_definitions', 'build_dead_letter_check', 'build_dw_definitions', 'build_freshness_check', 'build_lightup_compare_check', 'build_lightup_incident_sensor', 'build_notification_sensor', 'build_null_rate_check', 'build_reconciliation_checks', 'build_row_diff_check', 'build_volume_check', 'build_volume_sensor', 'database_from_url', 'dbt_incremental_build', 'guarded_executor', 'incident_history', 'load_dataops_config', 'load_metadata', 'load_partition', 'records', 'verify_receipts']


def test_the_public_surface_is_exactly_the_listed_names():
    assert sorted(dw_dagster.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(dw_dagster, name) is not None, name


def test_the_component_is_exported_at_the_top_level_for_dg():
    from dw_dagster.components import DataOpsComponent

    assert dw_dagster.DataOpsComponent is DataOpsComponent


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_no_product_module_imports_the_examples():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(m == o or m.startswith(f"{o}.") for m in _imports(path) for o in OUTSIDE):
            offenders.append(path.relative_to(PACKAGE).as_posix())
    assert offenders == []


def test_the_wheel_is_the_library():
    """No example, fake server or dbt project inside the package (they are ``examples/``'s)."""
    assert not (PACKAGE / "examples").exists() and not (PACKAGE / "testing" / "fakes").exists()
    assert sorted(p.name for p in (PACKAGE / "testing").glob("*.py")) == ["__init__.py", "local_daemon.py"]
    assert not list(PACKAGE.rglob("dbt_project.yml"))


EXAMPLES = ("store_sales", "orders", "access", "migration")


def test_examples_do_not_import_each_other():
    for example in EXAMPLES:
        for other in (e for e in EXAMPLES if e != example):
            for path in sorted((EXAMPLES_DIR / example).rglob("*.py")):
                bad = [m for m in _imports(path) if m.startswith(f"dw_dagster_examples.{other}")]
                assert not bad, (path.name, bad)


def test_examples_import_public_names_from_the_top_level():
    """What an example takes from ``dw_dagster`` itself is public (the rest from its submodule)."""
    offenders = []
    for path in sorted(EXAMPLES_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "dw_dagster":
                offenders += [f"{path.name}:{node.lineno} imports dw_dagster.{a.name} (not public)"
                              for a in node.names if a.name not in PUBLIC]
    assert offenders == []


def test_what_the_examples_import_from_the_library_and_the_harness_exists():
    """What the examples take from dw_dagster's submodules and dw_dagster_dev exists (a rename breaks them at import)."""
    import importlib
    import importlib.util

    for path in sorted(EXAMPLES_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("dw_dagster.", "dw_dagster_dev")):
                mod = importlib.import_module(node.module)
                for a in node.names:
                    assert hasattr(mod, a.name) or importlib.util.find_spec(f"{node.module}.{a.name}"), \
                        f"{path.name}: {node.module}.{a.name}"


#: The packages from the bottom up: a package may import only those before it (and itself). The
#: loop's stages build on one another: a proposal is made of core records and windows; an approval
#: decides a proposal; a repair runs what was approved; a receipt records a repair; a diagnoser
#: proposes a repair with its steps; a detection starts a diagnosis and reads the stop switch.
LAYERS = ["dagster_private", "errors", "version", "core", "databases", "pipelines", "lineage", "checks", "changes", "proposals",
          "approval", "guard", "integrations", "repair", "cost", "receipts", "access", "diagnosis", "detection", "migration", "mcp", "config", "wiring", "definitions", "components",
          "testing", "cli"]


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_imports_run_one_way_between_the_packages():
    """Every import (lazy ones included) goes down the layers; none goes up, so there is no cycle."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        own = rel.parts[0].removesuffix(".py")
        if own == "__init__":
            continue
        assert own in rank, f"{rel}: a package the layer list does not place"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for m in mods:
                if not m.startswith("dw_dagster.") or _package_of(m) == own:
                    continue
                if rank.get(_package_of(m), len(LAYERS)) > rank[own]:
                    upward.append(f"{rel.as_posix()}:{node.lineno} imports {m}")
    assert upward == []


def test_diagnosis_proposals_and_mcp_take_the_change_vocabulary_from_changes():
    """The change vocabulary (migrations, steps, replay plans, manual steps) lives in ``changes/`` and
    run admission in ``guard/``: diagnosis, proposals and MCP import nothing from ``repair/``."""
    reaching = []
    for own in ("diagnosis", "proposals", "mcp"):
        for path in sorted((PACKAGE / own).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                reaching += [f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno} imports {m}" for m in mods
                             if m == "dw_dagster.repair" or m.startswith("dw_dagster.repair.")]
    assert reaching == []


def test_no_module_is_a_grab_bag():
    """No product module over 750 lines."""
    big = {path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {k: n for k, n in big.items() if n > 750} == {}


def test_every_error_has_one_root():
    """Catching :class:`dw_dagster.DwDagsterError` catches every error dw_dagster raises on purpose."""
    import importlib
    import inspect
    import pkgutil

    from dw_dagster.errors import DwDagsterError

    outside = []
    for info in pkgutil.walk_packages(dw_dagster.__path__, "dw_dagster."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
                    and not name.startswith("_") and not issubclass(obj, DwDagsterError)):
                outside.append(f"{info.name}.{name}")
    assert outside == []


def _code_strings(path: Path) -> list[ast.Constant]:
    """The string literals of ``path``'s code (docstrings aside)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def _dw_literals(path: Path) -> list[str]:
    """``"dw/…"`` string literals in ``path``'s code (docstrings aside)."""
    return [f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno} {node.value!r}" for node in _code_strings(path)
            if node.value.startswith("dw/")]


def test_every_dw_key_and_tag_is_a_constant_of_core_keys():
    """A metadata key or run tag typed as a string outside ``core/keys.py`` can drift from the one the
    reader expects (renaming one silently changes who may run a repair): every ``dw/`` literal of the
    library is a constant there (the examples and the demos' harness, outside the wheel, are not held to it)."""
    offenders = [hit for path in sorted(PACKAGE.rglob("*.py"))
                 if not path.relative_to(PACKAGE).as_posix().startswith("core/keys.py")
                 for hit in _dw_literals(path)]
    assert offenders == []


#: check names that are also a word with another meaning (the check's kind, a config section, a step
#: kind): their builders take the constant, but the word itself may appear elsewhere
_ALSO_A_KIND = {"reconciliation", "row_diff", "null_rate", "freshness", "dead_letter", "schema_change", "mage_rerun"}


def _definition_names() -> dict[str, str]:
    """Name -> constant of every op, job, sensor and asset-check name ``core/keys.py`` defines
    (the constants named ``*_JOB``, ``*_OP``, ``*_SENSOR``, ``*_CHECK`` and ``*_JOB_NAME``, ``*_OP_NAME``)."""
    from dw_dagster.core import keys

    return {v: k for k, v in vars(keys).items() if k.isupper() and isinstance(v, str) and v not in _ALSO_A_KIND
            and k.endswith(("_JOB", "_OP", "_SENSOR", "_CHECK", "_JOB_NAME", "_OP_NAME"))}


def test_every_op_job_sensor_and_check_name_is_a_constant_of_core_keys():
    """An op, job, sensor or asset-check name typed as a string outside ``core/`` can drift from the one
    the sensor configures or the guard admits (a renamed op or job silently changes who may run a
    repair): each is a constant of ``core/keys.py`` and used from there. The demo harness
    (``testing/``) is held to it too; the examples, which use only the public API, are not."""
    names = _definition_names()
    assert {"dw_diagnose", "dw_diagnose_incident", "dw_write_receipts", "dw_receipts", "dw_approve_change_set",
            "dw_record_decision", "dw_remediation_sensor", "dw_stop", "dw_resume"} <= set(names)
    offenders = [f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno} {node.value!r} (core.keys.{names[node.value]})"
                 for path in sorted(PACKAGE.rglob("*.py"))
                 if not path.relative_to(PACKAGE).as_posix().startswith(("core/", "examples/"))
                 for node in _code_strings(path) if node.value in names]
    assert offenders == []


def test_every_public_name_is_marked_public_and_the_library_is_registered():
    """Each exported class and function carries ``@public`` (Dagster's marker, which its docs tooling
    and API checks read); ``dw-dagster`` is in Dagster's library registry with its version."""
    import inspect

    from dagster._annotations import is_public
    from dagster._core.libraries import DagsterLibraryRegistry

    # a Protocol is left unmarked: the marker, a class attribute, would become a member every
    # implementation must have (isinstance of a runtime-checkable protocol then fails)
    unmarked = [n for n in PUBLIC if not (inspect.ismodule(o := getattr(dw_dagster, n)) or isinstance(o, str)
                                          or getattr(o, "_is_protocol", False)) and not is_public(o)]
    assert unmarked == []
    assert DagsterLibraryRegistry.get()["dw-dagster"] == dw_dagster.__version__
