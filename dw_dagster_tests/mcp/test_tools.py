"""Every MCP tool on the store-sales demo's instance, through the SDK's in-process client (``mcp.Client(server)``).

The answers are compared with what the command line prints for the same instance (``dw-dagster
incidents --json``, ``blast-radius --json``, ``receipts``) and with the records themselves.
"""

import json
import re

import dagster as dg
import pytest
from click.testing import CliRunner

from dw_dagster_tests.mcp.client import assert_clear_error, call

pytestmark = pytest.mark.anyio

EXPECTED_TOOLS = {"get_migration_status", "list_incidents", "get_incident", "diagnose_incident", "get_root_cause", "blast_radius_analysis",
                  "trace_cross_platform_lineage", "get_incident_history", "run_quality_check", "get_quality_score",
                  "explain_table", "get_audit_trail", "generate_migration", "remediate", "request_access", "get_cost",
                  "monitor_metrics"}
MODELS = {"fct_store_sales_daily", "region_sales_daily", "region_sales_mtd"}
OWNER, EXPOSURE_OWNER = "dana.ortiz@grocer.example", "priya.raman@grocer.example"


def cli(args, demo):
    from dw_dagster.cli.main import main

    res = CliRunner().invoke(main, args, env={"DAGSTER_HOME": str(demo.home), "DW_APPROVAL_SIGNING_KEY": demo.key},
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def unwrap(value):
    """An answer with every untrusted value replaced by the value it carries (to compare with the CLI's)."""
    if isinstance(value, dict):
        if set(value) == {"untrusted_data", "origin"}:
            return value["untrusted_data"]
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


async def incident_id(server) -> str:
    out, err = await call(server, "list_incidents")
    assert err is None, err
    return out["incidents"][0]["incident_id"]


async def test_the_tool_list_is_exactly_these_and_none_decides_or_repairs(server):
    from mcp import Client

    async with Client(server) as c:
        tools = (await c.list_tools()).tools
    names = {t.name for t in tools}
    assert names == EXPECTED_TOOLS
    assert not [n for n in names if re.search(r"approve|reject|merge|resume|repair|apply|execute|launch|materialize|undo", n)]
    for t in tools:
        assert t.output_schema and t.output_schema.get("type") == "object", t.name  # structured (pydantic) results
        assert t.description and "Returns:" in t.description and "Raises:" in t.description, t.name
        for prop, schema in t.input_schema.get("properties", {}).items():
            assert schema.get("description"), (t.name, prop)  # every argument documented in the schema
        ro = t.annotations.read_only_hint if t.annotations else None
        assert ro is (t.name not in ("run_quality_check", "remediate", "request_access")), t.name


async def test_list_incidents_equals_the_cli(server, demo_env):
    out, err = await call(server, "list_incidents")
    assert err is None, err
    assert unwrap(out["incidents"]) == json.loads(cli(["incidents", "--json"], demo_env))
    (inc,) = out["incidents"]
    assert inc["cause_kind"] == "late_rows_behind_watermark" and inc["source"] == "lightup"
    assert inc["summary"]["origin"].startswith("an upstream system")  # Lightup's words, marked
    assert inc["status"] == "fixed (verified)" and inc["decision"] == "approved" and inc["approver"]["untrusted_data"] == OWNER
    assert inc["window"] == ["2026-11-26", "2026-11-27"] and inc["gap_rows"] > 0
    filtered, _ = await call(server, "list_incidents", {"asset": "store_sales_line", "status": "fixed", "since": "2026-01-01"})
    assert [e["incident_id"] for e in filtered["incidents"]] == [inc["incident_id"]]
    none, _ = await call(server, "list_incidents", {"status": "rejected"})
    assert none["incidents"] == [] and none["total"] == 0


async def test_get_incident_has_source_cause_decision_and_verified_receipts(server):
    iid = await incident_id(server)
    out, err = await call(server, "get_incident", {"incident_id": iid})
    assert err is None, err
    assert out["incident"]["source"] == "lightup" and out["detected_by"].startswith("a Lightup incident")
    assert out["incident"]["external_id"]["untrusted_data"] and out["incident"]["external_id"]["untrusted_data"] not in \
        out["detected_by"]
    assert out["outcome"]["cause_kind"] == "late_rows_behind_watermark"
    (cs,) = out["change_sets"]
    assert cs["state"] == "applied" and cs["approvers"] == [OWNER]
    (d,) = out["decisions"]
    assert (d["decision"], d["approver"], d["method"], d["signature_valid"], d["active"]) == ("approve", OWNER, "oidc", True, True)
    assert "verified by OIDC issuer http://127.0.0.1:" in d["verified_by"]
    assert out["refused_approvals"] == 3
    assert sorted("/".join(r["asset_key"]) for r in out["receipts"]) == sorted(MODELS | {"store_sales_line"})
    assert all(r["verifies_now"] is True and r["verified_when_written"] and not r["problems"] for r in out["receipts"])


async def test_diagnose_incident_returns_the_recorded_cause_with_its_evidence(server, demo_env):
    from dw_dagster.core import records

    iid = await incident_id(server)
    out, err = await call(server, "diagnose_incident", {"incident_id": iid})
    assert err is None, err
    p = out["primary"]
    assert out["diagnosed"] and p["kind"] == "late_rows_behind_watermark" and p["confidence"] == 1.0
    assert p["explained_rows"] == out["gap_rows"] > 0 and out["unexplained_rows"] == 0
    assert p["window"] == ["2026-11-26", "2026-11-27"] and p["details"]["untrusted_data"]["watermark_column"] == "sale_ts"
    sqls = [e["sql"]["untrusted_data"] for e in p["evidence"]]
    assert all(q.strip() for q in sqls) and all(e["database"] for e in p["evidence"])
    assert any(q.lstrip().upper().startswith("SELECT") and "pos.sales_line" in q for q in sqls)
    recorded = records.diagnoses(dg.DagsterInstance.from_config(str(demo_env.home)))[0]
    assert out["diagnosis_id"] == recorded.id and len(recorded.primary.details["explained_keys"]) == p["explained_rows"]
    assert p["cut"]["details.explained_keys"] == p["explained_rows"]
    assert len(p["details"]["untrusted_data"]["explained_keys"]) == 20
    assert "late_rows_behind_watermark" in out["markdown"]["untrusted_data"] and {m["name"] for m in out["blast_radius"]["models"]} == MODELS
    by_check, _ = await call(server, "diagnose_incident", {"asset": "store_sales_line", "check": "lightup_compare"})
    assert by_check["diagnosis_id"] == out["diagnosis_id"]
    none, err = await call(server, "diagnose_incident", {"asset": "store_sales_line", "check": "region_compare"})
    assert err is None and none["diagnosed"] is False and "dw_check_incident_sensor" in none["next_step"]


async def test_get_root_cause_walks_from_lightup_to_the_runs_and_the_rows(server, demo_env):
    iid = await incident_id(server)
    out, err = await call(server, "get_root_cause", {"incident_id": iid})
    assert err is None, err
    chain = out["chain"]
    assert out["cause_kind"] == "late_rows_behind_watermark" and chain[0]["system"] == "lightup"
    run_link = next(link for link in chain if link["system"] == "dagster run")
    loads = run_link["data"]["loads"]["untrusted_data"]
    assert [x["partition"] for x in loads] == ["2026-11-26", "2026-11-27"]
    instance = dg.DagsterInstance.from_config(str(demo_env.home))
    for x in loads:  # the runs that loaded the partitions before the incident, as recorded
        run = instance.get_run_by_id(x["run_id"])
        assert run is not None and x["watermark_column"] == "sale_ts"
        assert "dw/stage" not in run.tags  # the nightly loads, not the repair
    assert any(link["system"].startswith("database duckdb:pos_source") and "posted_ts" in link["data"]["sql"]["untrusted_data"]
               for link in chain)
    assert chain[-1]["system"] == "dw_dagster diagnosis" and "applied" in out["fix"] and "verified" in out["fix"]


async def test_blast_radius_equals_the_cli_and_dbt_ls(server, demo_env):
    from dw_dagster_examples.store_sales import home as h

    out, err = await call(server, "blast_radius_analysis", {"node": "store_sales_line"})
    assert err is None, err
    manifest = h.dbt_dir(demo_env.store_sales) / "target" / "manifest.json"
    expected = json.loads(cli(["blast-radius", "--manifest", str(manifest), "--select", "store_sales_line", "--json"], demo_env))
    for k in ("nodes", "tests", "exposures", "owners", "depth", "selected", "dbt_selector", "dbt_ls"):
        assert out[k] == expected[k], k
    assert {n.split(".")[-1] for n in out["nodes"] if n.startswith("model.")} == MODELS
    (exp,) = out["exposure_details"]
    assert (exp["label"], exp["type"], exp["owner_name"], exp["owner_email"]) == ("Store P&L", "dashboard", "Priya Raman",
                                                                                  EXPOSURE_OWNER)
    assert EXPOSURE_OWNER in out["owners"] and out["depth"]["exposure.store_sales.store_pnl"] == 2
    col, err = await call(server, "blast_radius_analysis", {"node": "fct_store_sales_daily", "change_type": "drop_column",
                                                            "column": "line_count"})
    assert err is None, err
    impact = {c["unique_id"]: c["how"] for c in col["column_impact"]}
    assert "documented column" in impact["model.store_sales.fct_store_sales_daily"]
    assert impact["test.store_sales.not_null_fct_store_sales_daily_line_count.b419e28463"] == ["tests this column"]
    assert "test.store_sales.not_null_region_sales_daily_region.f56a83fe4e" not in impact
    _, err = await call(server, "blast_radius_analysis", {"node": "fct_store_sales_daily", "change_type": "drop_column"})
    assert_clear_error(err, "give column")


async def test_trace_cross_platform_lineage_names_each_platform(server):
    out, err = await call(server, "trace_cross_platform_lineage", {"asset": "store_sales_line"})
    assert err is None, err
    nodes = {n["id"]: n for n in out["nodes"]}
    src = nodes["asset:pos_source/sales_line"]
    assert (src["platform"], src["kinds"], src["direction"], src["depth"]) == ("dagster", ["informix"], "upstream", 1)
    root = nodes[out["root"][0]]
    assert root["asset_key"] == ["store_sales_line"] and root["direction"] == "root"
    for m in MODELS:
        assert nodes[f"model.store_sales.{m}"]["platform"] == "dbt" and nodes[f"model.store_sales.{m}"]["asset_key"] == [m]
    assert nodes["exposure.store_sales.store_pnl"]["platform"] == "dashboard"
    assert ["asset:pos_source/sales_line", out["root"][0]] in [list(e) for e in out["edges"]]
    up, _ = await call(server, "trace_cross_platform_lineage", {"asset": "fct_store_sales_daily", "direction": "upstream",
                                                               "max_depth": 1})
    assert {n["direction"] for n in up["nodes"]} == {"root", "upstream"} and up["truncated"] is True


async def test_incident_history_counts_causes_and_time_to_receipt(server):
    iid = await incident_id(server)
    out, err = await call(server, "get_incident_history", {"asset": "store_sales_line"})
    assert err is None, err
    (e,) = out["incidents"]
    assert e["incident_id"] == iid and 0 < e["hours_to_receipt"] < 1
    assert out["by_cause"] == [{"cause_kind": "late_rows_behind_watermark", "incidents": 1, "repeat": False}]
    assert (out["fixed_verified"], out["open"]) == (1, 0)
    similar, _ = await call(server, "get_incident_history", {"asset": "store_sales_line", "similar_to": iid})
    assert similar["incidents"] == [] and similar["cause_kind"] == "late_rows_behind_watermark"
    _, err = await call(server, "get_incident_history", {"asset": "store_sales_line", "similar_to": "cosmic_rays"})
    assert_clear_error(err, "causes seen: late_rows_behind_watermark")


async def test_run_quality_check_runs_the_checks_and_changes_no_data(server, demo_env):
    instance = dg.DagsterInstance.from_config(str(demo_env.home))
    key = dg.AssetKey(["store_sales_line"])
    before = instance.fetch_materializations(key, limit=1000).records
    out, err = await call(server, "run_quality_check", {"asset": "store_sales_line", "checks": ["region_compare"]})
    assert err is None, err
    assert out["status"] == "SUCCESS" and [c["check"] for c in out["checks"]] == ["region_compare"]
    rc = out["checks"][0]
    assert rc["passed"] is True and rc["numbers"]["dw/gap_rows"] == 0
    assert rc["numbers"]["dw/source_rows"] == rc["numbers"]["dw/target_rows"] > 0
    run = instance.get_run_by_id(out["run_id"])
    assert run.tags["dw/launched_by"] == "dw-dagster mcp run_quality_check"
    assert not instance.all_logs(out["run_id"], of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    assert len(instance.fetch_materializations(key, limit=1000).records) == len(before)
    score, _ = await call(server, "get_quality_score", {"asset": "store_sales_line"})
    assert next(c for c in score["checks"] if c["check"] == "region_compare")["run_id"] == out["run_id"]
    _, err = await call(server, "run_quality_check", {"asset": "store_sales_line", "checks": ["nope"]})
    assert_clear_error(err, "daily_volume", "null_rate", "region_compare")


async def test_quality_score_states_its_formula(server):
    out, err = await call(server, "get_quality_score", {"asset": "store_sales_line"})
    assert err is None, err
    # dw_new_tests runs the tests cause fixes add (none in this demo: the watermark fix's test is a dbt
    # test), so no run evaluated it and it is not in the score
    assert {c["check"] for c in out["checks"]} == {"region_compare", "daily_volume", "null_rate", "dw_new_tests"}
    assert [c["passed"] for c in out["checks"] if c["check"] == "dw_new_tests"] == [None]
    assert all(c["passed"] is True for c in out["checks"] if c["check"] != "dw_new_tests") and out["open_incidents"] == []
    assert (out["score"], out["checks_score"], out["incident_penalty"]) == (100.0, 100.0, 0.0)
    assert "25 × open incidents" in out["formula"] and "weight 2 for severity ERROR" in out["formula"]


async def test_explain_table(server):
    out, err = await call(server, "explain_table", {"asset": "store_sales_line"})
    assert err is None, err
    assert out["owners"] == [OWNER] and out["table"] == "warehouse.pos.sales_line" and out["location"] == "store_sales"
    d = out["domain"]
    assert (d["name"], d["autonomy"], d["approvers"], d["max_window_partitions"]) == ("store_sales", "L2", [OWNER], 7)
    p = out["partitions"]
    assert (p["kind"], p["count"], p["first"], p["last"]) == ("DailyPartitionsDefinition", 28, "2026-11-01", "2026-11-28")
    assert out["upstream"] == [["pos_source", "sales_line"]] and out["downstream"] == [["fct_store_sales_daily"]]
    assert any("Store P&L" in e and EXPOSURE_OWNER in e for e in out["downstream_exposures"])
    assert {c["check"] for c in out["checks"]} == {"region_compare", "daily_volume", "null_rate", "dw_new_tests"}
    (r,) = out["receipts"]
    assert r["verifies_now"] is True and r["applied"] is True and r["outcome"]["untrusted_data"] == "applied"
    model, _ = await call(server, "explain_table", {"asset": "fct_store_sales_daily"})
    assert {c["name"] for c in model["columns"]} >= {"store_id", "line_count"}
    assert model["columns_from"] == "dagster/column_schema"  # dagster-dbt puts the documented columns there
    cost = out["cost"]  # no cost job ran on the demo: the seconds of the runs that materialized it
    assert cost["unit"] == "seconds" and cost["amount"] > 0 and cost["queries"] >= 1 and "run(s)" in cost["source"]


async def test_get_cost_reconciles_and_names_the_assets_and_runs(server):
    out, err = await call(server, "get_cost", {"since": "2020-01-01", "by": "asset"})
    assert err is None, err
    r = out["report"]
    assert r["engine"] == "duckdb" and r["unit"] == "seconds" and r["reconciled"]
    assert abs(r["attributed"] + r["idle"] + r["unattributed"] - r["metered"]) <= 1e-6
    assert {"store_sales_line", "fct_store_sales_daily"} <= {row["key"] for row in out["top"]}
    assert any(k.startswith("test.store_sales.") for k in r["by_model"])  # dbt tests are nodes of their own
    runs, _ = await call(server, "get_cost", {"since": "2020-01-01", "by": "run", "top": 3})
    assert len(runs["top"]) == 3 and runs["top"][0]["amount"] >= runs["top"][1]["amount"]
    _, err = await call(server, "get_cost", {"since": "last week"})
    assert_clear_error(err, "YYYY-MM-DD")


async def test_audit_trail_has_the_refusals_the_approval_and_four_verified_receipts(server):
    iid = await incident_id(server)
    inc, _ = await call(server, "get_incident", {"incident_id": iid})
    cs_id = inc["change_sets"][0]["id"]
    out, err = await call(server, "get_audit_trail", {"change_set_id": cs_id})
    assert err is None, err
    ev = out["events"]
    refused = [e for e in ev if e["kind"] == "approval_refused"]
    assert {e["actor"] for e in refused} == {"a Dagster user (not verified)"}  # a refused name was typed by someone
    typed = {e["untrusted"]["actor"]["untrusted_data"] for e in refused}
    assert typed == {"dw-dagster", OWNER, "sam.lee@grocer.example"}
    people = [e for e in refused if e["untrusted"]["actor"]["untrusted_data"] != "dw-dagster"]  # typed email, not listed
    assert len(people) == 2 and any("verified identity" in e["untrusted"]["reason"]["untrusted_data"] for e in people)
    (ok,) = [e for e in ev if e["kind"] == "approved"]
    assert ok["actor"] == OWNER and ok["verified"] is True
    receipts = [e for e in ev if e["kind"] == "receipt"]
    assert len(receipts) == 4 and all(e["verified"] is True for e in receipts)
    kinds = [e["kind"] for e in ev]
    assert kinds.index("proposed") < kinds.index("approval_refused") < kinds.index("approved") < kinds.index("stage_started")
    assert kinds.index("stage_started") < kinds.index("receipt")
    assert [e["at"] for e in ev] == sorted(e["at"] for e in ev)
    assert any(e["kind"] == "notified" and "approval_request" in e["untrusted"]["action"]["untrusted_data"] for e in ev)
    by_asset, _ = await call(server, "get_audit_trail", {"asset": "store_sales_line"})
    assert by_asset["change_set_ids"] == [cs_id] and by_asset["counts"] == out["counts"]


async def test_generate_migration_for_the_tables_dialect(server):
    from dw_dagster.changes.migrations import SetNullability, generate_migration

    out, err = await call(server, "generate_migration", {"table": "store_sales_line",
                                                         "change": {"kind": "nullability", "column": "region", "nullable": False}})
    assert err is None, err
    assert (out["table"], out["dialect"], out["applied"]) == ("warehouse.pos.sales_line", "duckdb", False)
    assert "resource warehouse" in out["dialect_from"]
    expected = generate_migration(SetNullability(table="warehouse.pos.sales_line", column="region", nullable=False), "duckdb")
    assert out["migration"] == expected.model_dump(mode="json")
    assert out["migration"]["forward"] == ["ALTER TABLE warehouse.pos.sales_line ALTER COLUMN region SET NOT NULL"]
    snow, _ = await call(server, "generate_migration", {"table": "pos.sales_line", "dialect": "snowflake", "change": {
        "kind": "rename", "column": "region", "new_name": "sales_region"}})
    assert snow["migration"]["rollback"] and snow["dialect_from"] == "given"
    _, err = await call(server, "generate_migration", {"table": "store_sales_line", "change": {
        "kind": "retype", "column": "net_sales", "from_type": "DECIMAL(18,2)", "to_type": "INTEGER"}})
    assert_clear_error(err, "allow_lossy")
    hostile, err = await call(server, "generate_migration", {"table": "store_sales_line", "change": {
        "kind": "nullability", "column": "region; DROP TABLE pos.sales_line", "nullable": True}})
    assert err is None and hostile["migration"]["forward"] == [  # one quoted identifier, never a second statement
        'ALTER TABLE warehouse.pos.sales_line ALTER COLUMN "region; DROP TABLE pos.sales_line" DROP NOT NULL']
    _, err = await call(server, "generate_migration", {"table": "store_sales_line", "change": {
        "kind": "add", "column": "channel", "type": "VARCHAR", "nullable": False}})
    assert_clear_error(err, "needs a default")


async def test_remediate_on_a_repaired_incident_records_nothing(server, demo_env):
    from dw_dagster.core.ledger import ledger_for

    instance = dg.DagsterInstance.from_config(str(demo_env.home))
    runs = len(instance.get_run_records())
    rows = ledger_for(instance).change_set_rows(latest_only=False)
    out, err = await call(server, "remediate", {"incident_id": await incident_id(server)})
    assert err is None, err
    assert out["proposed_now"] is False and out["change_set"]["state"] == "applied" and out["diagnosis_run_id"] is None
    assert "posted_ts" in out["diff"] and out["window"] == ["2026-11-26", "2026-11-27"]
    assert [list(k) for k in out["rebuild_order"]] == [[m] for m in ("fct_store_sales_daily", "region_sales_daily",
                                                                     "region_sales_mtd")]
    assert ledger_for(instance).change_set_rows(latest_only=False) == rows and len(instance.get_run_records()) == runs
