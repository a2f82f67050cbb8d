"""``dw-dagster cost``: the JSON shape, the text breakdowns, the DuckDB default and the errors."""

import datetime as dt
import json

import dagster as dg
import pytest
from click.testing import CliRunner

from dw_dagster.cli.main import main
from dw_dagster_dev import cost_workload as cw

SCHEMA = "SNOWFLAKE.AU_CLI"
KEYS = {"period", "engine", "metered", "attributed", "idle", "unattributed", "by_model", "by_asset", "by_run",
        "by_warehouse", "sql"}
ARGS = ["--account-usage", SCHEMA, "--since", "2026-10-01", "--until", "2026-10-04"]


@pytest.fixture(scope="module")
def url(fakesnow_server, tmp_path_factory):
    from dw_dagster.databases import database_from_url
    from dw_dagster_dev.cost_demo import schema_url

    base = (f"snowflake://fake:snow@fakesnow/SNOWFLAKE?host=127.0.0.1&port={fakesnow_server['port']}&protocol=http"
            "&login_timeout=20&network_timeout=20")
    database_from_url(base.replace("/SNOWFLAKE?", "/?")).execute("CREATE DATABASE IF NOT EXISTS SNOWFLAKE")
    database_from_url(base).execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    wl = cw.generate(dt.date(2026, 10, 1), 3, bi_per_hour=4)
    cw.load_parquet(database_from_url(schema_url(base, "AU_CLI")), SCHEMA, wl, tmp_path_factory.mktemp("au"),
                    tuple(cw.TABLES))
    return base


def run(args, env=None, code=0):
    res = CliRunner().invoke(main, args, env={"DW_COST_URL": "", "DAGSTER_HOME": "", **(env or {})})
    assert res.exit_code == code, res.output
    return res.output


def test_json_has_the_shape_and_reconciles(url):
    out = json.loads(run(["cost", "--json", "--url", url, *ARGS]))
    assert KEYS <= set(out)
    assert out["engine"] == "snowflake" and out["period"] == {"since": "2026-10-01", "until": "2026-10-04"}
    assert abs(out["attributed"] + out["idle"] + out["unattributed"] - out["metered"]) <= 1e-6 and out["reconciled"]
    assert out["sql"].startswith("WITH ") and "SNOWFLAKE.AU_CLI.QUERY_HISTORY" in out["sql"]
    assert set(out["by_warehouse"]) >= {"LOAD_WH", "TRANSFORM_WH", "BI_WH"}
    assert any(k.startswith("test.shop.") for k in out["by_model"]) and out["by_asset"] == {
        "raw/pos/sales_line": pytest.approx(out["by_asset"]["raw/pos/sales_line"])}


def test_the_url_comes_from_the_environment_and_a_manifest_maps_nodes_to_assets(url, tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"nodes": {f"model.shop.{m}": {"resource_type": "model", "name": m, "config": {}}
                                              for m in cw.MODELS}}))
    out = json.loads(run(["cost", "--json", "--manifest", str(manifest), *ARGS], env={"DW_COST_URL": url}))
    assert set(cw.MODELS) <= set(out["by_asset"])
    assert out["by_asset"]["orders"] == pytest.approx(out["by_model"]["model.shop.orders"])


@pytest.mark.parametrize("by, expect", [("warehouse", "LOAD_WH"), ("model", "model.shop.fct_revenue_daily"),
                                        ("asset", "raw/pos/sales_line"), ("run", "queries")])
def test_text_breakdowns(url, by, expect):
    out = run(["cost", "--by", by, "--url", url, *ARGS])
    assert f"by {by} (top" in out and expect in out and "reconciled: attributed" in out
    if by == "warehouse":
        assert "(idle " in out


def test_the_embedded_default_reports_seconds_from_the_dagster_home(tmp_path):
    @dg.asset
    def nightly() -> None:
        pass

    with dg.DagsterInstance.local_temp(str(tmp_path)) as inst:
        run_id = dg.materialize([nightly], instance=inst).run_id
    today = dt.datetime.now(dt.timezone.utc).date()
    out = json.loads(run(["cost", "--json", "--since", today.isoformat(), "--until", str(today + dt.timedelta(days=1))],
                         env={"DAGSTER_HOME": str(tmp_path)}))
    assert out["engine"] == "duckdb" and out["unit"] == "seconds" and set(out["by_run"]) == {run_id}
    assert out["by_asset"].keys() == {"nightly"} and out["reconciled"]


def test_errors_say_what_to_do(url):
    assert "no warehouse URL" in run(["cost", "--json"], code=1)
    assert "YYYY-MM-DD" in run(["cost", "--url", url, "--since", "October"], code=1)
    assert "must be after since" in run(["cost", "--url", url, "--since", "2026-10-04", "--until", "2026-10-01"], code=1)
    assert "NOPE" in run(["cost", "--url", url, "--account-usage", "SNOWFLAKE.NOPE"], code=1)
    assert "no billing" in run(["cost", "--url", "duckdb:///:memory:"], code=1)


def test_the_daily_observation_job_on_snowflake(url):
    """Credits per asset per day as numbers, from the account usage views."""
    from dw_dagster.core import keys as c
    from dw_dagster.cost.observe import build_cost_observation_job
    from dw_dagster.cost.sources import CostResource

    job, spec, _ = build_cost_observation_job(engine="snowflake", start_date="2026-10-01")
    defs = dg.Definitions(assets=[spec], jobs=[job], resources={"dw_cost": CostResource(url=url, account_usage=SCHEMA)})
    with dg.instance_for_test() as inst:
        res = defs.resolve_job_def(c.COST_JOB_NAME).execute_in_process(instance=inst, partition_key="2026-10-02")
        assert res.success
        md = inst.fetch_observations(dg.AssetKey(["raw", "pos", "sales_line"]), limit=1).records[0].asset_observation.metadata
    day = json.loads(run(["cost", "--json", "--url", url, "--account-usage", SCHEMA, "--since", "2026-10-02",
                          "--until", "2026-10-03"]))
    assert md[c.COST_CREDITS_KEY].value == pytest.approx(day["by_asset"]["raw/pos/sales_line"])
    assert md[c.COST_QUERIES_KEY].value == day["queries_by"]["asset"]["raw/pos/sales_line"]
