"""The public surface: what ``import dw_dagster`` offers is a decision, not an accident.

Adding a name here is a new public API (document it); removing one breaks users. The imports
run one way: no product module imports the examples (they are code locations built on the
public API; the command line runs their demos by module name), examples never import each
other, and an example imports from dw_dagster only the public API (``from dw_dagster import
...``) and the demo harness (``dw_dagster.testing``).
"""

import ast
from pathlib import Path

import pytest

import dw_dagster

PACKAGE = Path(dw_dagster.__file__).parent

PUBLIC = ['AccessRequest', 'AccessSpec', 'AddColumn', 'Approval', 'BlastRadius', 'CatalogError', 'CauseFinding', 'ChangeSet', 'ChangeStep', 'CostReport', 'CostResource', 'DataOpsComponent', 'DataOpsConfig', 'Database', 'DatabaseError', 'DatabaseResource', 'DeadLetterTable', 'Diagnosis', 'Domain', 'Domains', 'DropColumn', 'DuckDBDatabase', 'DwConfigError', 'DwDagsterError', 'EmailNotifier', 'EmailResource', 'GuardedRunCoordinator', 'IdentityError', 'Incident', 'IncrementalLoadDiagnoser', 'IncrementalLoadSpec', 'JiraResource', 'Ledger', 'LedgerError', 'LightupClient', 'LightupResource', 'LoadError', 'LoadResult', 'LossyRetypeError', 'MageClient', 'MageResource', 'Migration', 'MigrationError', 'MigrationRefused', 'OpsgenieResource', 'Pager', 'PagerDutyResource', 'PipelineRepoResource', 'Receipt', 'RenameColumn', 'RetypeColumn', 'Review', 'ServiceNowResource', 'SetNullability', 'SinkColumn', 'SinkTable', 'SlackNotifier', 'SlackResource', 'StepRefused', 'TableSchema', 'VerifiedIdentity', 'VolumeTable', 'WatchedAssetConfig', '__version__', 'apply_migration', 'approval_request_message', 'approve_in_process', 'blast_radius', 'build_access_definitions', 'build_approval_job', 'build_check_incident_sensor', 'build_cost_observation_job', 'build_dead_letter_check', 'build_diagnosis_job', 'build_dw_definitions', 'build_freshness_check', 'build_lightup_compare_check', 'build_lightup_incident_sensor', 'build_notification_sensor', 'build_null_rate_check', 'build_rebuild_job', 'build_receipt_job', 'build_reconciliation_checks', 'build_remediation_sensor', 'build_replay_checks', 'build_row_diff_check', 'build_schema_snapshot_check', 'build_step_jobs', 'build_verify_job', 'build_volume_check', 'build_volume_sensor', 'build_warehouse_change_definitions', 'build_window_job', 'canonical_email', 'classify_retype', 'combine_findings', 'database_from_url', 'days_ago', 'dbt_executable', 'dbt_incremental_build', 'dbt_ls', 'decide', 'decision_nonce', 'dedup_key_for', 'diagnose_duplicates', 'diagnose_required_nulls', 'diagnose_schema_change', 'diagnose_upstream', 'diff_schemas', 'draft_warehouse_changes', 'generate_migration', 'guarded_executor', 'incident_history', 'ledger_for', 'lineage_graph', 'load_dataops_config', 'load_domains', 'load_metadata', 'load_partition', 'manifest_graph', 'migration_step', 'page_incident', 'partition_window_utc', 'prepare_manifest', 'propose', 'read_table_schema', 'record_schema_snapshot', 'records', 'request_access', 'request_nonce', 'review_manifests', 'row_diff', 'row_diff_across', 'run_migration_step', 'schema_metadata', 'schema_snapshot', 'score_days', 'select_nodes', 'sql', 'step_results', 'step_stage', 'take_schema_snapshot', 'verify_migration', 'verify_receipts']


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
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("examples/"):
            continue
        if any(m == "dw_dagster.examples" or m.startswith("dw_dagster.examples.") for m in _imports(path)):
            offenders.append(rel)
    assert offenders == []


EXAMPLES = ("store_sales", "orders", "access", "migration")


def test_examples_do_not_import_each_other():
    for example in EXAMPLES:
        for other in (e for e in EXAMPLES if e != example):
            for path in sorted((PACKAGE / "examples" / example).rglob("*.py")):
                bad = [m for m in _imports(path) if m.startswith(f"dw_dagster.examples.{other}")]
                assert not bad, (path.name, bad)


def _allowed_in_example(module: str, example: str) -> bool:
    """The public API, the demo harness, and the example's own modules."""
    return (module == "dw_dagster" or module.startswith("dw_dagster.testing")
            or module == f"dw_dagster.examples.{example}" or module.startswith(f"dw_dagster.examples.{example}."))


def test_examples_import_only_the_public_api_and_the_demo_harness():
    offenders = []
    for example in EXAMPLES:
        for path in sorted((PACKAGE / "examples" / example).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                offenders += [f"{example}/{path.name}:{node.lineno} imports {m}" for m in mods
                              if (m == "dw_dagster" or m.startswith("dw_dagster.")) and not _allowed_in_example(m, example)]
                if isinstance(node, ast.ImportFrom) and node.module == "dw_dagster":
                    offenders += [f"{example}/{path.name}:{node.lineno} imports dw_dagster.{a.name} (not public)"
                                  for a in node.names if a.name not in PUBLIC]
    assert offenders == []


def test_the_demo_harness_names_exist():
    """What the examples take from dw_dagster.testing exists (a rename there breaks them at import)."""
    import importlib

    for example in EXAMPLES:
        for path in sorted((PACKAGE / "examples" / example).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dw_dagster.testing"):
                    mod = importlib.import_module(node.module)
                    for a in node.names:
                        assert hasattr(mod, a.name), f"{path.name}: {node.module}.{a.name}"


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
        if own in ("__init__", "examples"):
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
    """No product module over 750 lines (the fake vendor servers, one protocol each, aside)."""
    big = {path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
           for path in PACKAGE.rglob("*.py") if "testing/fakes" not in path.as_posix()}
    assert {k: n for k, n in big.items() if n > 750} == {}


def test_every_error_has_one_root():
    """Catching :class:`dw_dagster.DwDagsterError` catches every error dw_dagster raises on purpose."""
    import importlib
    import inspect
    import pkgutil

    from dw_dagster.errors import DwDagsterError

    outside = []
    for info in pkgutil.walk_packages(dw_dagster.__path__, "dw_dagster."):
        if ".examples" in info.name or ".testing" in info.name:
            continue
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
    library is a constant there. The examples and the demo harness, which leave the wheel, are not
    yet held to it."""
    offenders = [hit for path in sorted(PACKAGE.rglob("*.py"))
                 if not path.relative_to(PACKAGE).as_posix().startswith(("core/keys.py", "examples/", "testing/"))
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
