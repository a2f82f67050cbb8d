"""The cost guide's snippets run: docs/snippets/cost/definitions.py, draft.py, domains.yaml, dbt_project.yml."""

import datetime as dt
import json
import runpy
from pathlib import Path

import dagster as dg
import yaml

SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets"


def test_definitions_snippet_builds_a_code_location(monkeypatch):
    monkeypatch.setenv("DW_COST_URL", "snowflake://u:p@acct/ANALYTICS")
    defs = runpy.run_path(str(SNIPPETS / "cost/definitions.py"))["defs"]
    assert defs.resolve_job_def("dw_cost_observations").partitions_def is not None
    assert defs.resolve_sensor_def("dw_warehouse_remediation_sensor") is not None
    assert defs.resolve_job_def("dw_step_warehouse_setting") is not None
    specs = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"warehouse/LOAD_WH", "dw_cost/snowflake"} <= specs


def test_domains_snippet_gives_warehouses_owners():
    from dw_dagster.core.domains import load_domains

    d = load_domains(SNIPPETS / "cost/domains.yaml")
    assert d.for_warehouse("load_wh").approvers == ["priya.raman@grocer.example"]


def test_dbt_query_comment_snippet_is_what_the_mapping_reads():
    """append: true puts dbt's default comment at the end, where Snowflake keeps it; the node id is read
    from it whatever the key order."""
    import re

    from dw_dagster.cost.mapping import comment_pattern

    cfg = yaml.safe_load((SNIPPETS / "cost/dbt_project.yml").read_text())
    assert cfg["query-comment"] == {"append": True, "job-label": True}
    text = 'create table x as select 1\n/* ' + json.dumps({"node_id": "model.shop.orders", "app": "dbt"}) + " */"
    assert re.search(comment_pattern("node_id"), text).group(1) == "model.shop.orders"


def test_draft_snippet_proposes_to_the_owners(tmp_path, monkeypatch):
    """Drafted from a week of the workload in a DuckDB copy of the views; SHOW WAREHOUSES (which DuckDB does
    not have) answered with the workload's settings."""
    import dw_dagster.cost.warehouse as wh
    from dw_dagster.cost.snowflake import SnowflakeCost
    from dw_dagster.databases import LocalDuckDB
    from dw_dagster_dev import cost_workload as cw

    ns = runpy.run_path(str(SNIPPETS / "cost/draft.py"))
    wl = cw.generate(dt.date(2026, 10, 1), 7, bi_per_hour=2)
    db = LocalDuckDB()
    db.execute("CREATE SCHEMA au")
    cw.load_parquet(db, "au", wl, tmp_path, tuple(cw.TABLES))
    source = SnowflakeCost(db, account_usage="au")  # the views' layout, in DuckDB

    class _Cost:  # the snippet takes a CostResource; this one's source is the DuckDB copy of the views
        def source(self, instance):
            return source

    settings = {w.name: wh.Settings(w.name, w.size, w.auto_suspend, 1, w.max_cluster_count, w.scaling_policy)
                for w in cw.DEFAULT_WAREHOUSES}
    monkeypatch.setattr(wh, "show_warehouse", lambda _db, name: settings[name])
    with dg.instance_for_test() as inst:
        ids = ns["draft_and_propose"](inst, _Cost(), str(SNIPPETS / "cost/domains.yaml"), dt.date(2026, 10, 8))
        assert ids and all(i.startswith("cs-") for i in ids)
        from dw_dagster.core import records

        assert {cs.target_asset[1] for cs in records.change_sets(inst)} >= {"LOAD_WH"}
