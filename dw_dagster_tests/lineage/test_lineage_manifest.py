"""The dbt manifest graph on the manifests people really have: partial child_map, children outside
``nodes``, multi-parent tests, isolated and disabled nodes, unit tests, the semantic layer; and
dbt's selector rules (``select_nodes``)."""

import copy

import pytest

from dw_dagster.lineage import (
    UnknownNodeError,
    blast_radius,
    dbt_ls,
    dbt_selector,
    downstream,
    manifest_graph,
    resolve_node,
    select_nodes,
    source_for_asset_key,
)


def _n(uid, deps=(), **kw):
    rt, pkg, *rest = uid.split(".")
    name = kw.pop("name", rest[-1] if rt != "unit_test" else rest[-1])
    fqn = kw.pop("fqn", [pkg, *kw.pop("dirs", []), name])
    return {"unique_id": uid, "name": name, "resource_type": rt, "package_name": pkg, "fqn": fqn,
            "depends_on": {"nodes": list(deps)}, "config": {"enabled": True, **kw.pop("config", {})}, **kw}


def big_manifest():
    """A realistic hand-written manifest: sources, seed, snapshot, models, tests, unit test,
    exposures (Tableau, Lightdash), semantic model, metrics, saved query, analysis, disabled nodes."""
    nodes = [
        _n("seed.shop.country_codes"),
        _n("model.shop.stg_orders", ["source.shop.raw.orders"], dirs=["staging"]),
        _n("model.shop.stg_customers", ["source.shop.raw.customers"], dirs=["staging"]),
        _n("snapshot.shop.customers_snapshot", ["model.shop.stg_customers"], dirs=["snapshots"]),
        _n("model.shop.orders", ["model.shop.stg_orders", "seed.shop.country_codes"], dirs=["marts"],
           config={"meta": {"owner": "ana@shop.example"}, "group": "finance"}),
        _n("model.shop.customers", ["model.shop.stg_customers", "snapshot.shop.customers_snapshot"], dirs=["marts"]),
        _n("model.shop.lonely", dirs=["marts"]),
        _n("model.shop.eph", ["model.shop.orders"], dirs=["marts"], config={"materialized": "ephemeral"}),
        _n("model.shop.orders_daily", ["model.shop.eph"], dirs=["marts"],
           config={"meta": {"dagster": {"asset_key": ["finance", "orders_daily"], "owners": ["team:finance"]}}}),
        _n("test.shop.not_null_orders_id.abc", ["model.shop.orders"], name="not_null_orders_id", fqn=["shop", "marts", "not_null_orders_id"]),
        _n("test.shop.relationships_orders_customer_id__id__ref_customers_.def", ["model.shop.orders", "model.shop.customers"],
           name="relationships_orders_customer_id__id__ref_customers_", fqn=["shop", "marts", "relationships_orders_customer_id__id__ref_customers_"]),
        _n("test.shop.source_not_null_raw_orders_id.123", ["source.shop.raw.orders"], name="source_not_null_raw_orders_id",
           fqn=["shop", "staging", "source_not_null_raw_orders_id"]),
        _n("analysis.shop.adhoc", ["model.shop.orders"], dirs=["analysis"]),
        _n("model.shop.off_in_nodes", ["model.shop.orders"], config={"enabled": False}),
    ]
    sources = {
        "source.shop.raw.orders": {"unique_id": "source.shop.raw.orders", "name": "orders", "source_name": "raw", "resource_type": "source",
                                   "package_name": "shop", "fqn": ["shop", "staging", "raw", "orders"],
                                   "config": {"enabled": True, "meta": {"dagster": {"asset_key": ["pos", "orders_landed"]}}}},
        "source.shop.raw.customers": {"unique_id": "source.shop.raw.customers", "name": "customers", "source_name": "raw",
                                      "resource_type": "source", "package_name": "shop", "fqn": ["shop", "staging", "raw", "customers"],
                                      "config": {"enabled": True}},
    }
    exposures = {
        "exposure.shop.revenue": _n("exposure.shop.revenue", ["model.shop.orders_daily"], label="Revenue", type="dashboard",
                                    url="https://tableau.shop.example/revenue", owner={"name": "Bo", "email": "bo@shop.example"}),
        "exposure.shop.churn": _n("exposure.shop.churn", ["model.shop.customers", "metric.shop.order_count"], label="Churn",
                                  type="dashboard", url="https://lightdash.shop.example/churn", owner={"name": "Cy"}),
    }
    semantic = {"semantic_model.shop.sm_orders": _n("semantic_model.shop.sm_orders", ["model.shop.orders"])}
    metrics = {
        "metric.shop.order_count": _n("metric.shop.order_count", ["semantic_model.shop.sm_orders"]),
        "metric.shop.order_count_x2": _n("metric.shop.order_count_x2", ["metric.shop.order_count"]),
    }
    saved = {"saved_query.shop.sq_orders": _n("saved_query.shop.sq_orders", ["metric.shop.order_count"])}
    unit = {"unit_test.shop.orders.ut_orders": _n("unit_test.shop.orders.ut_orders", ["model.shop.orders"], name="ut_orders",
                                                  fqn=["shop", "marts", "orders", "ut_orders"])}
    disabled = {"model.shop.old_orders": [_n("model.shop.old_orders", ["model.shop.orders"], config={"enabled": False})]}
    m = {
        "metadata": {"dbt_schema_version": "https://schemas.getdbt.com/dbt/manifest/v12.json"},
        "nodes": {n["unique_id"]: n for n in nodes}, "sources": sources, "exposures": exposures, "metrics": metrics,
        "semantic_models": semantic, "saved_queries": saved, "unit_tests": unit, "disabled": disabled,
        "groups": {"group.shop.finance": {"name": "finance", "owner": {"email": "fin-lead@shop.example"}}},
    }
    child_map: dict[str, list[str]] = {}
    for section in ("nodes", "sources", "exposures", "metrics", "semantic_models", "saved_queries", "unit_tests"):
        for uid, node in m[section].items():
            child_map.setdefault(uid, [])
            for p in node.get("depends_on", {}).get("nodes", []):
                child_map.setdefault(p, []).append(uid)
    m["child_map"] = child_map
    return m


def _variants():
    full = big_manifest()
    no_cm = {k: v for k, v in full.items() if k != "child_map"}
    partial = copy.deepcopy(full)
    partial["child_map"] = {k: v for i, (k, v) in enumerate(full["child_map"].items()) if i % 3 == 0}
    empty_lists = copy.deepcopy(full)
    empty_lists["child_map"] = {k: [] for k in full["child_map"]}
    return {"full": full, "no_child_map": no_cm, "partial_child_map": partial, "empty_child_map": empty_lists}


@pytest.mark.parametrize("variant", ["full", "no_child_map", "partial_child_map", "empty_child_map"])
def test_child_map_missing_or_partial_changes_nothing(variant):
    g = manifest_graph(_variants()[variant])
    assert downstream(g, ["model.shop.stg_orders"]) == {
        "model.shop.stg_orders": 0, "model.shop.orders": 1, "test.shop.not_null_orders_id.abc": 2,
        "test.shop.relationships_orders_customer_id__id__ref_customers_.def": 2, "analysis.shop.adhoc": 2,
        "model.shop.eph": 2, "semantic_model.shop.sm_orders": 2, "unit_test.shop.orders.ut_orders": 2,
        "model.shop.orders_daily": 3, "metric.shop.order_count": 3, "exposure.shop.revenue": 4,
        "metric.shop.order_count_x2": 4, "saved_query.shop.sq_orders": 4, "exposure.shop.churn": 4,
    }


def test_blast_radius_groups_owners_urls_and_depths():
    g = manifest_graph(big_manifest())
    br = blast_radius(g, select_nodes(g, "stg_orders"))
    assert br.root == "model.shop.stg_orders" and br.max_depth == 4
    assert [(m.name, m.depth) for m in br.models] == [("orders", 1), ("eph", 2), ("orders_daily", 3)]
    assert {m.name: m.owners for m in br.models} == {"orders": ["ana@shop.example", "fin-lead@shop.example"], "eph": [],
                                                     "orders_daily": ["team:finance"]}
    # ephemeral models are no Dagster assets; meta.dagster.asset_key wins over the name
    assert br.dagster_assets == [["orders"], ["finance", "orders_daily"]]
    assert [(e.name, e.depth, e.owner_email, e.owner_name, e.url) for e in br.exposures] == [
        ("churn", 4, None, "Cy", "https://lightdash.shop.example/churn"),
        ("revenue", 4, "bo@shop.example", "Bo", "https://tableau.shop.example/revenue")]
    # the relationships test is affected, but it is no path into `customers`
    assert {(t.name, t.resource_type) for t in br.tests} == {
        ("not_null_orders_id", "test"), ("relationships_orders_customer_id__id__ref_customers_", "test"), ("ut_orders", "unit_test")}
    assert "customers" not in {m.name for m in br.models}
    assert {(o.resource_type, o.depth) for o in br.other} == {
        ("analysis", 2), ("semantic_model", 2), ("metric", 3), ("metric", 4), ("saved_query", 4)}
    assert br.owners == ["Cy", "ana@shop.example", "bo@shop.example", "fin-lead@shop.example", "team:finance"]


def test_disabled_nodes_are_ignored():
    g = manifest_graph(big_manifest())
    assert "model.shop.old_orders" not in g and "model.shop.off_in_nodes" not in g
    assert not any("old_orders" in u or "off_in_nodes" in u for u in downstream(g, ["model.shop.orders"]))
    with pytest.raises(UnknownNodeError):
        select_nodes(g, "old_orders")


def test_dbt_ls_rule_hides_analyses_and_lists_the_selected_node():
    g = manifest_graph(big_manifest())
    ls = dbt_ls(g, ["model.shop.orders"])
    assert "model.shop.orders" in ls and "analysis.shop.adhoc" not in ls
    assert "unit_test.shop.orders.ut_orders" in ls and "exposure.shop.churn" in ls and "saved_query.shop.sq_orders" in ls
    assert ls == sorted(ls)
    # an isolated model: itself only
    assert dbt_ls(g, select_nodes(g, "lonely")) == ["model.shop.lonely"]
    assert blast_radius(g, ["model.shop.lonely"]).models == []
    # a test selected by name lists only itself: nothing depends on a test
    assert dbt_ls(g, select_nodes(g, "not_null_orders_id")) == ["test.shop.not_null_orders_id.abc"]


def test_select_nodes_follows_dbt_rules():
    g = manifest_graph(big_manifest())
    # fqn leaf; a model and a source may share a name: dbt's bare name never selects a source
    assert select_nodes(g, "orders") == ["model.shop.orders"]
    assert select_nodes(g, "orders+") == ["model.shop.orders"]
    assert select_nodes(manifest_graph({"nodes": {"model.p.m00042": _n("model.p.m00042")}}), "m00042+") == ["model.p.m00042"]
    # a full fqn is also a prefix: the unit test's fqn (shop.marts.orders.ut_orders) starts with it, as in dbt
    assert select_nodes(g, "shop.marts.orders") == ["model.shop.orders", "unit_test.shop.orders.ut_orders"]
    # a directory prefix selects everything under it (with or without the package)
    assert set(select_nodes(g, "staging")) == {"model.shop.stg_orders", "model.shop.stg_customers",
                                               "test.shop.source_not_null_raw_orders_id.123"}
    assert select_nodes(g, "shop.staging") == select_nodes(g, "staging")
    assert select_nodes(g, "stg_*") == ["model.shop.stg_customers", "model.shop.stg_orders"]
    assert select_nodes(g, "source:raw.orders") == ["source.shop.raw.orders"]
    assert select_nodes(g, "source:shop.raw.orders") == ["source.shop.raw.orders"]
    assert select_nodes(g, "source:raw") == ["source.shop.raw.customers", "source.shop.raw.orders"]
    assert select_nodes(g, "exposure:revenue") == ["exposure.shop.revenue"]
    assert select_nodes(g, "metric:shop.order_*") == ["metric.shop.order_count", "metric.shop.order_count_x2"]
    assert select_nodes(g, "semantic_model:sm_orders") == ["semantic_model.shop.sm_orders"]
    assert select_nodes(g, "saved_query:sq_orders") == ["saved_query.shop.sq_orders"]
    assert select_nodes(g, "unit_test:ut_orders") == ["unit_test.shop.orders.ut_orders"]
    # unique ids, of any section
    for uid in ("exposure.shop.churn", "metric.shop.order_count", "source.shop.raw.orders", "seed.shop.country_codes"):
        assert select_nodes(g, uid) == [uid]
    # past dbt's rules: source_name.table, then a Dagster asset key
    assert select_nodes(g, "raw.orders") == ["source.shop.raw.orders"]
    assert select_nodes(g, "pos/orders_landed") == ["source.shop.raw.orders"]
    assert select_nodes(g, "finance/orders_daily") == ["model.shop.orders_daily"]
    assert source_for_asset_key(g, ["pos", "orders_landed"]) == "source.shop.raw.orders"
    with pytest.raises(UnknownNodeError, match="did you mean"):
        select_nodes(g, "stg_order")
    with pytest.raises(UnknownNodeError, match="no dbt node 'nope'"):
        select_nodes(g, "nope")
    for bad in ("+orders", "@orders", "orders+2", "2+orders", "orders customers", "orders,customers", ""):
        with pytest.raises(UnknownNodeError):
            select_nodes(g, bad)
    with pytest.raises(UnknownNodeError, match="ambiguous"):
        resolve_node(g, "staging")
    assert resolve_node(g, "orders") == "model.shop.orders"


def test_dbt_selector_round_trips():
    g = manifest_graph(big_manifest())
    for uid in ("model.shop.orders", "source.shop.raw.orders", "exposure.shop.churn", "metric.shop.order_count",
                "semantic_model.shop.sm_orders", "saved_query.shop.sq_orders", "seed.shop.country_codes",
                "snapshot.shop.customers_snapshot", "test.shop.not_null_orders_id.abc"):
        got = select_nodes(g, dbt_selector(g, uid))
        assert uid in got and all(u == uid or u.startswith(f"unit_test.shop.{g.nodes[uid]['name']}.") for u in got), uid
    assert dbt_selector(g, "source.shop.raw.orders") == "source:shop.raw.orders"
    assert dbt_selector(g, "model.shop.orders") == "shop.marts.orders"


def test_versioned_model_selection():
    m = {"nodes": {
        "model.p.dim_customers.v1": _n("model.p.dim_customers.v1", name="dim_customers", version=1,
                                       fqn=["p", "dim_customers", "v1"]),
        "model.p.dim_customers.v2": _n("model.p.dim_customers.v2", name="dim_customers", version=2,
                                       fqn=["p", "dim_customers", "v2"]),
    }}
    g = manifest_graph(m)
    assert select_nodes(g, "dim_customers") == ["model.p.dim_customers.v1", "model.p.dim_customers.v2"]
    assert select_nodes(g, "dim_customers_v2") == ["model.p.dim_customers.v2"]
    assert select_nodes(g, "dim_customers.v1") == ["model.p.dim_customers.v1"]


def test_unknown_root_and_odd_entries():
    g = manifest_graph({"nodes": {"model.p.a": {"name": "a", "resource_type": "model",
                                                "depends_on": {"nodes": ["model.p.missing", "model.p.a"]}}},
                        "child_map": {"model.p.a": ["model.p.ghost"], "model.p.ghost": ["model.p.a"]}})
    assert list(g.nodes) == ["model.p.a"] and g.number_of_edges() == 0
    with pytest.raises(UnknownNodeError):
        downstream(g, ["model.p.ghost"])


def test_several_projects_link_across_manifests():
    """dbt Mesh: project `b` refs a public model of `a`; the order the manifests come in does not matter."""
    from dw_dagster.lineage import lineage_graph

    a = {"nodes": {"model.a.orders": _n("model.a.orders")}}
    b = {"nodes": {"model.b.revenue": _n("model.b.revenue", ["model.a.orders"]),
                   "test.b.not_null_revenue_id.1": _n("test.b.not_null_revenue_id.1", ["model.b.revenue"], name="not_null_revenue_id")}}
    for order in ([a, b], [b, a]):
        g = lineage_graph(manifests=order)
        assert dbt_ls(g, ["model.a.orders"]) == ["model.a.orders", "model.b.revenue", "test.b.not_null_revenue_id.1"]
        assert g.graph["asset_index"][("orders",)] == ["model.a.orders"]
