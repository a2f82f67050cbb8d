"""One graph from the Dagster asset graph and the dbt manifest: a non-dbt asset upstream reaches the
dbt models through the source that carries its key; Dagster assets downstream of dbt models, asset
checks, owners, kinds and groups are in the blast radius."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster_dbt import DagsterDbtTranslator, DbtCliResource, dbt_assets

from dw_dagster.lineage import (
    asset_vertices,
    blast_radius,
    dbt_ls,
    downstream,
    lineage_graph,
    manifest_graph,
    select_nodes,
)

REPO = Path(__file__).resolve().parents[2]
DBT = Path(sys.executable).parent / "dbt"


@pytest.fixture(scope="module")
def example_manifest(tmp_path_factory):
    target = tmp_path_factory.mktemp("dbt_target")
    subprocess.run([str(DBT), "parse", "--quiet", "--project-dir", str(REPO / "examples" / "dw_dagster_examples" / "dbt_project"), "--profiles-dir",
                    str(REPO / "examples" / "dw_dagster_examples" / "dbt_project"), "--target-path", str(target), "--log-path", str(target / "logs")], check=True,
                   env={"DW_WAREHOUSE_PATH": str(target / "w.duckdb"), "PATH": "/usr/bin:/bin", "HOME": str(target)})
    return json.loads((target / "manifest.json").read_text())


def _defs(manifest, translator=None):
    pos = dg.AssetSpec(["pos_source", "sales_line"], kinds={"informix"}, owners=["team:pos"])

    @dg.asset(key=["store_sales_line"], deps=[pos.key], owners=["dana.ortiz@grocer.example"], kinds={"duckdb"},
              group_name="store_sales")
    def store_sales_line(): ...

    @dg.asset_check(asset=store_sales_line)
    def region_compare():
        return dg.AssetCheckResult(passed=True)

    tr = translator or DagsterDbtTranslator()

    @dbt_assets(manifest=manifest, dagster_dbt_translator=tr)
    def store_sales_dbt(context, dbt: DbtCliResource): ...

    mtd = tr.get_asset_key(manifest["nodes"]["model.store_sales.region_sales_mtd"])

    @dg.asset(deps=[mtd], owners=["team:finance"], kinds={"python"})
    def pnl_extract(): ...

    @dg.asset_check(asset=pnl_extract, additional_deps=[tr.get_asset_key(manifest["nodes"]["model.store_sales.fct_store_sales_daily"])])
    def pnl_ties_out():
        return dg.AssetCheckResult(passed=True)

    @dg.asset
    def weather(): ...

    return dg.Definitions(assets=[pos, store_sales_line, store_sales_dbt, pnl_extract, weather],
                          asset_checks=[region_compare, pnl_ties_out],
                          resources={"dbt": DbtCliResource(project_dir=str(REPO / "examples" / "dw_dagster_examples" / "dbt_project"), dbt_executable=str(DBT))})


def test_non_dbt_asset_reaches_dbt_models_through_the_source(example_manifest):
    g = lineage_graph(_defs(example_manifest))
    assert select_nodes(g, "store_sales_line") == ["source.store_sales.pos.sales_line"]
    src = g.nodes["source.store_sales.pos.sales_line"]
    assert (src["asset_key"], src["owners"], src["kinds"], src["group"]) == (("store_sales_line",), ["dana.ortiz@grocer.example"],
                                                                             ["duckdb"], "store_sales")
    br = blast_radius(g, select_nodes(g, "store_sales_line"))
    assert [(m.name, m.depth, m.asset_key) for m in br.models] == [
        ("fct_store_sales_daily", 1, ["fct_store_sales_daily"]), ("region_sales_daily", 2, ["region_sales_daily"]),
        ("region_sales_mtd", 3, ["region_sales_mtd"])]
    assert [(a.name, a.depth, a.owners, a.resource_type) for a in br.assets] == [("pnl_extract", 4, ["team:finance"], "asset")]
    checks = {t.unique_id: t.depth for t in br.tests if t.resource_type == "asset_check"}
    assert checks == {"check:store_sales_line:region_compare": 1, "check:pnl_extract:pnl_ties_out": 2}
    assert sum(t.resource_type == "test" for t in br.tests) == 6  # dbt tests once, not again as Dagster checks
    assert [(e.name, e.depth, e.owner_email) for e in br.exposures] == [("store_pnl", 2, "priya.raman@grocer.example")]
    assert br.owners == ["dana.ortiz@grocer.example", "priya.raman@grocer.example", "team:finance"]
    assert br.dagster_assets == [["fct_store_sales_daily"], ["region_sales_daily"], ["region_sales_mtd"], ["pnl_extract"]]


def test_upstream_dagster_asset_and_asset_key_strings(example_manifest):
    g = lineage_graph(_defs(example_manifest))
    assert select_nodes(g, "pos_source/sales_line") == ["asset:pos_source/sales_line"]
    assert select_nodes(g, "asset:pos_source/sales_line") == ["asset:pos_source/sales_line"]
    br = blast_radius(g, ["asset:pos_source/sales_line"])
    assert [(a.name, a.depth, a.resource_type) for a in br.assets] == [("store_sales_line", 1, "source"), ("pnl_extract", 5, "asset")]
    assert [(m.name, m.depth) for m in br.models][0] == ("fct_store_sales_daily", 2)
    assert "dana.ortiz@grocer.example" in br.owners and "team:pos" not in br.owners  # the root's owners are not "hit"
    fct = g.nodes["model.store_sales.fct_store_sales_daily"]
    assert fct["asset_key"] == ("fct_store_sales_daily",) and set(fct["kinds"]) == {"dbt", "duckdb"}
    assert asset_vertices(g, ["fct_store_sales_daily"]) == ["model.store_sales.fct_store_sales_daily"]
    # isolated Dagster asset; a dbt model's downstream on the combined graph keeps dbt's own set
    assert blast_radius(g, select_nodes(g, "weather")).max_depth == 0
    for uid in ("model.store_sales.fct_store_sales_daily", "source.store_sales.pos.sales_line"):
        assert dbt_ls(g, [uid]) == dbt_ls(manifest_graph(example_manifest), [uid])
    assert "asset:pnl_extract" in downstream(g, ["model.store_sales.region_sales_daily"])


def test_custom_translator_keys(example_manifest):
    class Prefixed(DagsterDbtTranslator):
        def get_asset_key(self, props):
            key = super().get_asset_key(props)
            return key if props["resource_type"] == "source" else key.with_prefix("analytics")

    g = lineage_graph(_defs(example_manifest, Prefixed()))
    assert select_nodes(g, "analytics/region_sales_mtd") == ["model.store_sales.region_sales_mtd"]
    br = blast_radius(g, select_nodes(g, "store_sales_line"))
    assert [m.asset_key for m in br.models][0] == ["analytics", "fct_store_sales_daily"]
    assert [(a.name, a.depth) for a in br.assets] == [("pnl_extract", 4)]


def test_manifest_only_and_extra_manifests(example_manifest, tmp_path):
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps(example_manifest))
    g = lineage_graph(manifests=[p])
    assert select_nodes(g, "store_sales_line") == ["source.store_sales.pos.sales_line"]
    assert not any(a.get("dagster") for _, a in g.nodes(data=True))
    with pytest.raises(TypeError):
        lineage_graph(defs=object())


def test_the_example_code_location(tmp_path):
    """The real store-sales code location (dbt parse, @dbt_assets, checks), built in a fresh child process."""
    script = (
        "import json\n"
        "from dw_dagster_examples.store_sales.definitions import build_definitions\n"
        "defs = build_definitions()\n"
        "from dw_dagster.lineage import lineage_graph, select_nodes, blast_radius\n"
        "g = lineage_graph(defs)\n"
        "br = blast_radius(g, select_nodes(g, 'pos_source/sales_line'))\n"
        "print(json.dumps({'assets': [(a.name, a.depth) for a in br.assets], 'models': [(m.name, m.depth) for m in br.models],\n"
        "                  'checks': sorted(t.name for t in br.tests if t.resource_type == 'asset_check'), 'owners': br.owners}))\n"
    )
    env = {**os.environ, "DW_STORE_SALES_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["assets"] == [["store_sales_line", 1]]
    assert out["models"] == [["fct_store_sales_daily", 2], ["region_sales_daily", 3], ["region_sales_mtd", 4]]
    assert out["checks"] == ["daily_volume", "dw_new_tests", "null_rate", "region_compare"]  # dw_new_tests: the tests a fix adds
    assert "dana.ortiz@grocer.example" in out["owners"] and "priya.raman@grocer.example" in out["owners"]
