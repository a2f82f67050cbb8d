"""The documentation's code blocks, run: each test names the snippet files it runs (docs/snippets/).

Snippets that a capability's own test already runs are named there instead (e.g. ci/ci_defs.py in
e2e/test_ci_gate.py, ci/github_review.yaml and concepts/domains.yaml in lineage/test_review_cli.py,
adopt/sales_asset.py in components/test_readme_asset.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"
BIN = Path(sys.executable).parent


def snippet(rel: str) -> str:
    return (SNIPPETS / rel).read_text(encoding="utf-8")


def run_snippet(rel: str, scope: dict | None = None) -> dict:
    scope = dict(scope or {})
    exec(compile(snippet(rel), f"docs/snippets/{rel}", "exec", dont_inherit=True), scope)  # noqa: S102 - the docs' own code
    return scope


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    """A project laid out like a `dg` project, built from the adoption page's snippets only."""
    root = tmp_path_factory.mktemp("shop")
    defs_dir = root / "src" / "shop_data" / "defs" / "dataops"
    defs_dir.mkdir(parents=True)
    (root / "pipelines").mkdir()
    shutil.copytree(ROOT / "examples" / "dw_dagster_examples" / "dbt_project", root / "dbt_project", ignore=shutil.ignore_patterns("target", "logs"))
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    attributes = yaml.safe_load(snippet("adopt/defs.yaml"))["attributes"]
    (defs_dir / "dataops.yaml").write_text(yaml.safe_dump(attributes))
    (defs_dir / "domains.yaml").write_text(snippet("concepts/domains.yaml"))
    (root / "pipelines" / "sales.yaml").write_text(snippet("adopt/pipeline_sales.yaml"))
    (root / "src" / "shop_data" / "__init__.py").write_text("")
    (root / "src" / "shop_data" / "assets.py").write_text(snippet("adopt/sales_asset.py"))
    env = {"SALES_SOURCE_URL": f"duckdb:///{root / 'source.duckdb'}", "SALES_WAREHOUSE": str(root / "wh.duckdb")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.syspath_prepend(str(root / "src"))
        yield root, defs_dir
    for name in [m for m in sys.modules if m == "shop_data" or m.startswith("shop_data.")]:
        del sys.modules[name]


def test_adoption_snippets_build_the_loop(shop, monkeypatch):
    """adopt/defs.yaml + concepts/domains.yaml + adopt/pipeline_sales.yaml + adopt/sales_asset.py, then
    adopt/python_definitions.py: the whole loop's Definitions load."""
    root, defs_dir = shop
    monkeypatch.chdir(defs_dir)
    defs = run_snippet("adopt/python_definitions.py")["defs"]
    dg.Definitions.validate_loadable(defs)
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"dw_diagnose_incident", "dw_approve_change_set"} <= jobs
    checks = {k.name for k in defs.resolve_asset_graph().asset_check_keys}
    assert "reconciliation" in checks and any("volume" in name for name in checks), checks
    assert (root / "dbt_project" / "target" / "manifest.json").is_file()


@pytest.mark.parametrize("fragment", ["adopt/recorded_load.yaml", "adopt/dbt_incremental.yaml"])
def test_pipeline_fragments_are_valid_config(shop, fragment, tmp_path):
    """The pipeline shapes' YAML fragments, put into the adoption page's dataops file, validate."""
    from dw_dagster import load_dataops_config

    _, defs_dir = shop
    doc = yaml.safe_load((defs_dir / "dataops.yaml").read_text())
    part = yaml.safe_load(snippet(fragment))
    if "pipeline" in part:
        doc["assets"][0]["pipeline"] = part["pipeline"]
    else:
        doc.update(part)
    doc["domains"] = str(defs_dir / "domains.yaml")
    (tmp_path / "dataops.yaml").write_text(yaml.safe_dump(doc))
    config = load_dataops_config(tmp_path / "dataops.yaml")
    kinds = [a.pipeline.model_dump(exclude_none=True) for a in config.assets if a.pipeline]
    assert any(k for k in kinds), kinds


def test_dbt_incremental_assets_snippet(shop, monkeypatch):
    """adopt/dbt_incremental_assets.py builds @dbt_assets over the project's manifest."""
    root, _ = shop
    manifest = root / "dbt_project" / "target" / "manifest.json"
    if not manifest.is_file():  # the adoption test made it; alone, parse once
        subprocess.run([str(BIN / "dbt"), "parse", "--project-dir", str(root / "dbt_project"),
                        "--profiles-dir", str(root / "dbt_project")], check=True, capture_output=True)
    monkeypatch.chdir(root)
    shop_dbt = run_snippet("adopt/dbt_incremental_assets.py")["shop_dbt"]
    names = {k.path[-1] for k in shop_dbt.keys}
    models = {n["name"] for n in json.loads(manifest.read_text())["nodes"].values() if n["resource_type"] == "model"}
    assert names == models


def test_checks_definitions_snippet(tmp_path, monkeypatch):
    """checks/checks_definitions.py: the two checks run against real tables and find the short region."""
    from dw_dagster.databases import DuckDBDatabase

    src, wh = DuckDBDatabase(tmp_path / "pos_source.duckdb"), DuckDBDatabase(tmp_path / "warehouse.duckdb")
    for db, n in ((src, 40), (wh, 38)):
        db.execute("CREATE SCHEMA pos")
        db.execute("CREATE TABLE pos.sales_line (sales_line_id INT, region VARCHAR, sale_ts TIMESTAMP, net_sales DECIMAL(12,2))")
        db.execute(f"INSERT INTO pos.sales_line SELECT i, CASE WHEN i % 2 = 0 THEN 'West' ELSE 'Southwest' END, "
                   f"TIMESTAMP '2026-11-01' + INTERVAL (i) HOUR, 1.25 FROM range({n}) t(i)")
    monkeypatch.setenv("POS_SOURCE_URL", f"duckdb:///{src.path}")
    monkeypatch.chdir(tmp_path)
    defs = run_snippet("checks/checks_definitions.py")["defs"]
    checks = [c for c in defs.asset_checks]
    assets = [dg.AssetSpec("store_sales_line"), dg.AssetSpec(["pos_source", "sales_line"])]
    result = dg.materialize(assets + checks, resources=defs.resources, raise_on_error=False,
                            selection=dg.AssetSelection.all_asset_checks())
    evals = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evals["region_compare"].passed is False
    assert "Southwest" in str(evals["region_compare"].metadata)


def test_lineage_snippet(capsys):
    """blast-radius/lineage.py on a Definitions with a downstream chain."""
    @dg.asset(name="store_sales_line")
    def a(): ...

    @dg.asset(deps=[a], owners=["team:finance"])
    def fct_store_sales_daily(): ...

    run_snippet("blast-radius/lineage.py", {"defs": dg.Definitions(assets=[a, fct_store_sales_daily])})
    out = capsys.readouterr().out
    assert "fct_store_sales_daily" in out


def test_volume_sensor_snippet():
    """volume/volume_sensor.py builds one sensor over its three table specs."""
    volume = run_snippet("volume/volume_sensor.py")["volume"]
    assert isinstance(volume, dg.SensorDefinition)


def test_integrations_snippet(monkeypatch):
    """integrations/resources_and_sensors.py: resources and sensors load (credentials read at run time)."""
    scope = run_snippet("integrations/resources_and_sensors.py", {"dg": dg})
    assert set(scope["resources"]) == {"lightup", "pager", "slack"}
    assert all(isinstance(s, dg.SensorDefinition) for s in scope["sensors"])


def test_celery_snippet(shop, monkeypatch):
    """deploy/celery_executor.py: every job of the loop runs on the celery executor, behind the guard."""
    _, defs_dir = shop
    monkeypatch.chdir(defs_dir)
    defs = run_snippet("deploy/celery_executor.py")["defs"]
    job = defs.resolve_job_def("dw_verify")
    assert "celery" in repr(job.executor_def.executor_creation_fn).lower() or "celery" in job.executor_def.name


def test_schema_migration_snippet(tmp_path, monkeypatch, capsys):
    """schema-migrations/migration.py: forward applied, rollback refused while NULLs exist."""
    from dw_dagster.databases import DuckDBDatabase
    from dw_dagster.changes.migrations.models import MigrationRefused

    db = DuckDBDatabase(tmp_path / "warehouse.duckdb")
    db.execute("CREATE SCHEMA analytics")
    db.execute("CREATE TABLE analytics.orders (order_id INT NOT NULL, shipping_country VARCHAR NOT NULL)")
    db.dispose() if hasattr(db, "dispose") else None
    monkeypatch.chdir(tmp_path)
    script = snippet("schema-migrations/migration.py").replace(
        'apply_migration(db, m, "rollback")',
        'db.execute("INSERT INTO analytics.orders VALUES (1, NULL)")\napply_migration(db, m, "rollback")')
    with pytest.raises(MigrationRefused):
        exec(compile(script, "docs/snippets/schema-migrations/migration.py", "exec", dont_inherit=True), {})  # noqa: S102
    out = capsys.readouterr().out
    assert "DROP NOT NULL" in out and "SET NOT NULL" in out


def test_mcp_json_snippet_starts_our_server():
    """mcp/mcp.json: the dw-dagster entry names a command and arguments the CLI accepts."""
    entry = json.loads(snippet("mcp/mcp.json"))["mcpServers"]["dw-dagster"]
    assert entry["command"].endswith("dw-dagster") and entry["args"][0] == "mcp"
    r = subprocess.run([str(BIN / "dw-dagster"), *entry["args"][:1], "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "-w" in r.stdout


def _output_keys(rel: str) -> set[str]:
    """Top-level keys of a documented JSON output (first line a `// call` comment, '…' placeholders)."""
    text = "\n".join(l for l in snippet(rel).splitlines() if not l.lstrip().startswith("//"))
    return {k for k in json.loads(text) if k != "…"}


@pytest.mark.parametrize("rel,module,model", [("mcp/diagnose_incident_output.txt", "diagnosis", "DiagnosisAnswer"),
                                              ("mcp/blast_radius_output.txt", "lineage", "BlastRadiusAnswer")])
def test_documented_mcp_outputs_match_the_tools_models(rel, module, model):
    """The documented outputs name only fields the tools' result models have."""
    import importlib

    cls = getattr(importlib.import_module(f"dw_dagster.mcp.{module}"), model)
    assert _output_keys(rel) <= set(cls.model_fields), _output_keys(rel) - set(cls.model_fields)


def test_demo_json_keys_of_the_orders_page_exist():
    """orders/demo_json.txt names only fields of the orders demo's JSON result."""
    from dataclasses import fields

    from dw_dagster_examples.orders.demo import OrdersDemoResult

    keys = set(json.loads("{" + snippet("orders/demo_json.txt").strip().rstrip(",") + "}"))
    assert keys <= {f.name for f in fields(OrdersDemoResult)}


def test_orders_mage_snippet_is_valid_config():
    """orders/mage.yaml: the `mage:` of an asset and `integrations.mage` validate."""
    from dw_dagster.config import MageConfig, MageSourceConfig

    doc = yaml.safe_load(snippet("orders/mage.yaml").replace("    ...\n", ""))
    assert MageSourceConfig.model_validate(doc["assets"][0]["mage"]).writes == "orders_stream"
    assert MageConfig.model_validate(doc["integrations"]["mage"]).rerun_timeout_s == 1800
