import json
import subprocess
import sys
from pathlib import Path

import pytest

from dw_dagster.lineage import blast_radius, manifest_graph, resolve_node, source_for_asset_key
from dw_dagster.lineage.dbt_manifest import UnknownNodeError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def example_manifest(tmp_path_factory):
    target = tmp_path_factory.mktemp("dbt_target")
    dbt = Path(sys.executable).parent / "dbt"
    subprocess.run([str(dbt), "parse", "--quiet", "--project-dir", str(REPO / "examples" / "dw_dagster_examples" / "dbt_project"), "--profiles-dir",
                    str(REPO / "examples" / "dw_dagster_examples" / "dbt_project"), "--target-path", str(target), "--log-path", str(target / "logs")], check=True,
                   env={"DW_WAREHOUSE_PATH": str(target / "w.duckdb"), "PATH": "/usr/bin:/bin", "HOME": str(target)})
    return json.loads((target / "manifest.json").read_text())


def test_example_blast_radius(example_manifest):
    g = manifest_graph(example_manifest)
    root = source_for_asset_key(g, ["store_sales_line"])
    assert root == "source.store_sales.pos.sales_line"
    br = blast_radius(g, [root])
    assert [(m.name, m.depth) for m in br.models] == [("fct_store_sales_daily", 1), ("region_sales_daily", 2), ("region_sales_mtd", 3)]
    assert {t.name.split("_")[0] for t in br.tests} == {"not", "accepted"}
    assert len(br.tests) == 6
    (exp,) = br.exposures
    assert (exp.label, exp.type, exp.owner_name, exp.owner_email) == ("Store P&L", "dashboard", "Priya Raman", "priya.raman@grocer.example")
    assert exp.url.startswith("https://tableau.")
    assert "priya.raman@grocer.example" in br.owners and "dana.ortiz@grocer.example" in br.owners


C15 = {
    "nodes": {
        "model.p.stg_orders": {"name": "stg_orders", "resource_type": "model", "depends_on": {"nodes": []}},
        "model.p.orders": {"name": "orders", "resource_type": "model", "depends_on": {"nodes": ["model.p.stg_orders"]}},
        "model.p.customers": {"name": "customers", "resource_type": "model", "depends_on": {"nodes": []}},
        "test.p.not_null_orders_id": {"name": "not_null_orders_id", "resource_type": "test", "depends_on": {"nodes": ["model.p.orders"]}},
        "test.p.rel_orders_customers": {"name": "rel_orders_customers", "resource_type": "test",
                                        "depends_on": {"nodes": ["model.p.orders", "model.p.customers"]}},
        "model.p.lonely": {"name": "lonely", "resource_type": "model", "depends_on": {"nodes": []}},
    },
    "exposures": {
        "exposure.p.revenue_dashboard": {"name": "revenue_dashboard", "resource_type": "exposure", "type": "dashboard",
                                         "owner": {"name": "Ann", "email": "ann@x.example"}, "url": "https://bi/rev",
                                         "depends_on": {"nodes": ["model.p.orders"]}},
    },
    "child_map": {"model.p.stg_orders": ["model.p.orders"],
                  "model.p.orders": ["exposure.p.revenue_dashboard", "test.p.not_null_orders_id"],
                  "exposure.p.revenue_dashboard": [], "test.p.not_null_orders_id": []},
}


@pytest.mark.parametrize("child_map", [True, False], ids=["with_child_map", "without_child_map"])
def test_c15_exposures_outside_nodes(child_map):
    m = dict(C15) if child_map else {k: v for k, v in C15.items() if k != "child_map"}
    br = blast_radius(manifest_graph(m), ["model.p.stg_orders"])
    assert [(x.name, x.depth) for x in br.models] == [("orders", 1)]
    assert [(e.name, e.depth, e.owner_email, e.url) for e in br.exposures] == [("revenue_dashboard", 2, "ann@x.example", "https://bi/rev")]
    # the relationships test is affected, but it is no path into `customers`
    assert {t.name for t in br.tests} == {"not_null_orders_id", "rel_orders_customers"}
    assert "customers" not in {x.name for x in br.models}


def test_resolve_node_by_name_and_errors():
    g = manifest_graph(C15)
    assert resolve_node(g, "orders") == "model.p.orders"
    assert blast_radius(g, [resolve_node(g, "lonely")]).models == []
    with pytest.raises(UnknownNodeError, match="did you mean"):
        resolve_node(g, "order")


# PUBLIC_CASES.md C15, exactly as written there: the exposure is a child in child_map but lives in `exposures`
C15_CASE = {
    "nodes": {
        "model.p.stg_orders": {"name": "stg_orders", "resource_type": "model", "depends_on": {"nodes": []}},
        "model.p.orders": {"name": "orders", "resource_type": "model", "depends_on": {"nodes": ["model.p.stg_orders"]}},
        "test.p.not_null_orders_id": {"name": "not_null_orders_id", "resource_type": "test",
                                      "depends_on": {"nodes": ["model.p.orders"]}},
    },
    "exposures": {
        "exposure.p.revenue_dashboard": {"name": "revenue_dashboard", "resource_type": "exposure", "type": "dashboard",
                                         "owner": {"email": "fin@p.example"}, "url": "https://bi.p.example/revenue",
                                         "depends_on": {"nodes": ["model.p.orders"]}},
    },
    "child_map": {"model.p.stg_orders": ["model.p.orders"],
                  "model.p.orders": ["exposure.p.revenue_dashboard", "test.p.not_null_orders_id"],
                  "exposure.p.revenue_dashboard": [], "test.p.not_null_orders_id": []},
}


def test_c15_case_values():
    from dw_dagster.lineage import dbt_ls, select_nodes

    g = manifest_graph(C15_CASE)
    br = blast_radius(g, select_nodes(g, "stg_orders"))
    assert {m.name for m in br.models} == {"orders"} and [m.depth for m in br.models] == [1]
    assert [(e.unique_id, e.type, e.owner_email, e.url, e.depth) for e in br.exposures] == [
        ("exposure.p.revenue_dashboard", "dashboard", "fin@p.example", "https://bi.p.example/revenue", 2)]
    assert [(t.name, t.depth) for t in br.tests] == [("not_null_orders_id", 2)]
    assert br.owners == ["fin@p.example"]
    # resolution by key prefix, whatever section the node is in
    assert select_nodes(g, "exposure.p.revenue_dashboard") == ["exposure.p.revenue_dashboard"]
    assert blast_radius(g, ["exposure.p.revenue_dashboard"]).models == []
    assert dbt_ls(g, ["model.p.stg_orders"]) == ["exposure.p.revenue_dashboard", "model.p.orders", "model.p.stg_orders",
                                                 "test.p.not_null_orders_id"]


def _cli(*args):
    return subprocess.run([str(Path(sys.executable).parent / "dw-dagster"), "blast-radius", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_json_and_listing(example_manifest, tmp_path):
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps(example_manifest))
    proc = _cli("--manifest", str(m), "--select", "fct_store_sales_daily", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["nodes"] == ["model.store_sales.fct_store_sales_daily", "model.store_sales.region_sales_daily",
                            "model.store_sales.region_sales_mtd"]
    assert out["exposures"] == ["exposure.store_sales.store_pnl"] and len(out["tests"]) == 6
    assert out["owners"] == ["dana.ortiz@grocer.example", "priya.raman@grocer.example"]
    assert sorted(out["nodes"] + out["tests"] + out["exposures"]) == out["dbt_ls"]
    assert out["depth"]["exposure.store_sales.store_pnl"] == 1 and out["dbt_selector"] == "store_sales.marts.fct_store_sales_daily+"
    # a Dagster asset key reaches the source that carries it
    src = json.loads(_cli("--manifest", str(m), "--select", "store_sales_line", "--json").stdout)
    assert src["selected"] == ["source.store_sales.pos.sales_line"] and src["dbt_selector"] == "source:store_sales.pos.sales_line+"
    text = _cli("--manifest", str(m), "--select", "source:pos.sales_line").stdout
    assert "  model (3):\n    [1] model.store_sales.fct_store_sales_daily  owner dana.ortiz@grocer.example\n" in text
    assert "  exposure (1):\n    [2] exposure.store_sales.store_pnl  Store P&L (dashboard) owner Priya Raman <priya.raman@grocer.example> https://tableau." in text
    assert text.index("  source (1)") < text.index("  model (3)") < text.index("  exposure (1)") < text.index("  test (6)")
    bad = _cli("--manifest", str(m), "--select", "fct_store")
    assert bad.returncode == 2 and "did you mean" in bad.stderr
