"""Snowflake credits per query, reconciled to metering, on fakesnow with seeded account usage tables.

fakesnow has no ``SNOWFLAKE.ACCOUNT_USAGE``; the module seeds stand-in tables (same names and
columns) from a generated workload (:mod:`dw_dagster_dev.cost_workload`) and compares the report
with an attribution computed on its own in :mod:`dw_dagster_tests.cost.expected`.
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlglot

from dw_dagster.cost.models import CostError, Period
from dw_dagster.cost.snowflake import SnowflakeCost
from dw_dagster_dev import cost_workload as cw
from dw_dagster_tests.cost.expected import expected

SINCE = dt.date(2026, 10, 1)
DAYS = 3
NODE_ASSETS = {f"model.{cw.PROJECT}.{m}": m for m in cw.MODELS}


@pytest.fixture(scope="module")
def workload():
    return cw.generate(SINCE, DAYS, bi_per_hour=6)


@pytest.fixture(scope="module")
def snow(fakesnow_server, workload):
    """A SnowflakeDatabase on fakesnow whose SNOWFLAKE.ACCOUNT_USAGE holds the workload's rows."""
    from dw_dagster.databases.snowflake import SnowflakeDatabase

    SnowflakeDatabase(**fakesnow_server).execute("CREATE DATABASE IF NOT EXISTS SNOWFLAKE")
    db = SnowflakeDatabase(**fakesnow_server, database="SNOWFLAKE")
    db.execute("CREATE SCHEMA IF NOT EXISTS SNOWFLAKE.ACCOUNT_USAGE")
    cw.create_tables(db, "SNOWFLAKE.ACCOUNT_USAGE", workload)
    return db


class _Counting:
    """A database that counts the statements it is given."""

    def __init__(self, db):
        self.db, self.statements = db, []
        self.dialect, self.name = db.dialect, db.name

    def fetch_all(self, text):
        self.statements.append(text)
        return self.db.fetch_all(text)


def _period(days=DAYS, start=SINCE):
    return Period(since=start, until=start + dt.timedelta(days=days))


@pytest.fixture(scope="module")
def report(snow):
    counting = _Counting(snow)
    r = SnowflakeCost(counting, node_assets=NODE_ASSETS).report(_period())
    return r, counting.statements


def _close(a, b, tol=1e-6):
    return abs(a - b) <= tol


def test_one_pushed_down_statement(report):
    r, statements = report
    assert len(statements) == 1 and statements[0] == r.sql
    assert len(sqlglot.parse(r.sql, read="snowflake")) == 1
    for view in ("QUERY_HISTORY", "WAREHOUSE_METERING_HISTORY", "METERING_DAILY_HISTORY", "QUERY_ATTRIBUTION_HISTORY"):
        assert f"SNOWFLAKE.ACCOUNT_USAGE.{view}" in r.sql


def test_totals_reconcile_to_metering(report, workload):
    r, _ = report
    e = expected(workload, SINCE, SINCE + dt.timedelta(days=DAYS), NODE_ASSETS)
    assert r.reconciled and abs(r.difference()) <= 1e-6
    assert _close(r.metered, e.metered)
    assert _close(r.attributed + r.idle + r.unattributed, r.metered)
    assert "metered" in r.reconciliation and f"{r.metered:.9g}" in r.reconciliation


def test_allocation_matches_the_independent_computation(report, workload):
    r, _ = report
    e = expected(workload, SINCE, SINCE + dt.timedelta(days=DAYS), NODE_ASSETS)
    assert set(r.by_model) == set(e.by_model)
    for node, credits in e.by_model.items():
        assert _close(r.by_model[node], credits), node
    assert set(r.by_run) == set(e.by_run)
    for run, credits in e.by_run.items():
        assert _close(r.by_run[run], credits), run
    for asset, credits in e.by_asset.items():
        assert _close(r.by_asset[asset], credits), asset
    assert {(a, p) for a, ps in r.by_partition.items() for p in ps} == set(e.by_partition)
    for (asset, partition), credits in e.by_partition.items():
        assert _close(r.by_partition[asset][partition], credits), (asset, partition)
    assert _close(r.unattributed_detail["queries_mapping_to_nothing"], e.untagged)
    assert _close(r.unattributed_detail["cloud_services_billed_not_in_queries"], e.cs_billed_not_in_queries)
    assert _close(r.unattributed_detail["compute_not_in_hourly_metering"], e.compute_not_in_hours)
    assert abs(r.unattributed_detail["allocation_remainder"]) < 1e-9


def test_idle_hours_are_reported_per_warehouse_never_spread(report, workload):
    """LOAD_WH suspends 1800 s after a load at :45, so the next hour holds credits and no query."""
    r, _ = report
    e = expected(workload, SINCE, SINCE + dt.timedelta(days=DAYS))
    assert e.idle_by_warehouse["LOAD_WH"] > 0
    assert set(r.idle_by_warehouse) == {k for k, v in e.idle_by_warehouse.items() if v}
    for wh, credits in e.idle_by_warehouse.items():
        assert _close(r.idle_by_warehouse[wh], credits)
    assert _close(r.idle, sum(e.idle_by_warehouse.values()))
    # the warehouse total holds its idle; the queries' credits do not
    runs_on_load = sum(v for k, v in r.by_run.items())
    assert runs_on_load < r.by_warehouse["LOAD_WH"] - r.idle_by_warehouse["LOAD_WH"] + 1e-6


def test_a_query_spanning_hours_gets_a_share_of_each_whatever_the_period(snow, report):
    """A query's credits do not move with the report's period (CodyAustinDavis/dbsql_sme#11: allocated
    dollars changed with the selected start and end)."""
    r3, _ = report
    one_day = SnowflakeCost(snow, node_assets=NODE_ASSETS).report(_period(1, SINCE + dt.timedelta(days=1)))
    assert one_day.reconciled
    day2_runs = {k: v for k, v in one_day.by_run.items()}
    assert day2_runs and all(_close(r3.by_run[k], v) for k, v in day2_runs.items())
    # fct_revenue_daily runs 02:4x -> 03:0x and past: credits from two metered hours
    assert one_day.queries_by["model"][f"model.{cw.PROJECT}.fct_revenue_daily"] == 1


def test_cloud_services_count_only_in_the_billed_proportion(report, workload):
    """Cloud services are billed only above 10 % of the day's compute (get-select/dbt-snowflake-monitoring#127)."""
    r, _ = report
    e = expected(workload, SINCE, SINCE + dt.timedelta(days=DAYS))
    heavy, light = SINCE, SINCE + dt.timedelta(days=1)
    assert e.cs_ratio[heavy] > 0 and e.cs_ratio[light] == 0.0
    cs = r.extra["cloud_services"]
    assert cs["adjustment"] < 0 and _close(cs["billed"], cs["used"] + cs["adjustment"])
    assert 0 < cs["billed_in_queries"] < cs["used"]


def test_query_attribution_history_is_beside_never_instead(report):
    """dbt Cost Insights reads QUERY_ATTRIBUTION_HISTORY, which leaves out short queries, so its totals
    fall below the bill (dbt-labs/docs.getdbt.com#9580); here it is reported beside."""
    r, _ = report
    qah = r.beside["query_attribution_history"]
    assert qah["queries_not_in_view"] > 0 and qah["credits"] < r.metered
    assert r.queries["total"] == qah["queries"] + qah["queries_not_in_view"]
    assert r.attributed + r.idle + r.unattributed == pytest.approx(r.metered, abs=1e-6)


def test_untagged_queries_are_unattributed_with_their_credits(report):
    r, _ = report
    assert r.queries["unattributed"] > 0
    assert r.unattributed_detail["queries_mapping_to_nothing"] > 0
    assert r.by_warehouse["BI_WH"] >= r.unattributed_detail["queries_mapping_to_nothing"] - r.by_warehouse.get("(no warehouse)", 0)


def test_dbt_tests_are_nodes_of_their_own(report):
    r, _ = report
    tests = [k for k in r.by_model if k.startswith("test.")]
    assert len(tests) == DAYS * len(cw.TESTS)
    assert all(r.queries_by["model"][t] == 1 for t in tests)


def test_a_dbt_comment_in_any_key_order_maps(report, workload):
    """get-select/dbt-snowflake-monitoring#147: a comment whose first key is not "app" was not parsed."""
    r, _ = report
    first = [q for q in workload.queries if q.truth and q.truth[0] == "model" and '/* {"node_id"' in q.text]
    assert first and all(q.truth[1] in r.by_model for q in first)


def test_dw_dagster_comment_maps_without_a_query_tag(report, workload):
    """fakesnow refuses ALTER SESSION SET QUERY_TAG; the appended comment alone maps a query to its run."""
    r, _ = report
    comment_only = [q for q in workload.queries if q.truth and q.truth[0] == "asset" and not q.tag]
    assert comment_only and all(q.truth[1] in r.by_run for q in comment_only)


def test_a_leading_comment_dropped_by_snowflake_leaves_only_the_query_tag(fakesnow_server, snow):
    """Snowflake drops a leading comment from QUERY_TEXT (dbt-core#2138), and dbt did not append its
    comment to full-refresh and merge statements (dbt-snowflake#140): such a query maps through its
    query tag, and without one it is unattributed, never guessed."""
    from dw_dagster.databases.snowflake import SnowflakeDatabase

    wl = cw.generate(SINCE, 1, bi_per_hour=1, loads_per_day=1)
    for q in wl.queries:
        if q.truth and q.truth[0] == "model":
            q.text = q.text.split("\n/*")[0]  # what Snowflake keeps of a prepended comment
    db = SnowflakeDatabase(**fakesnow_server, database="SNOWFLAKE")
    db.execute("CREATE SCHEMA IF NOT EXISTS SNOWFLAKE.AU_DROPPED")
    cw.create_tables(db, "SNOWFLAKE.AU_DROPPED", wl, tables=("QUERY_HISTORY", "WAREHOUSE_METERING_HISTORY",
                                                                "METERING_DAILY_HISTORY"))
    r = SnowflakeCost(db, account_usage="SNOWFLAKE.AU_DROPPED", query_attribution=False).report(_period(1))
    tagged = {q.truth[1] for q in wl.queries if q.truth and q.truth[0] == "model" and q.tag}
    untagged = {q.truth[1] for q in wl.queries if q.truth and q.truth[0] == "model" and not q.tag}
    assert tagged and untagged
    assert tagged <= set(r.by_model) and not (untagged & set(r.by_model))
    assert r.reconciled and "query_attribution_history" not in r.beside


def test_an_inconsistent_meter_is_not_reconciled(fakesnow_server, snow):
    """CREDITS_BILLED that is not compute + cloud services + adjustment makes the report say so."""
    from dw_dagster.databases.snowflake import SnowflakeDatabase

    wl = cw.generate(SINCE, 1, bi_per_hour=1, loads_per_day=1)
    st, day, comp, cs, used, adj, billed = wl.daily[0]
    wl.daily[0] = (st, day, comp + 0.5, cs, used, adj, billed + 0.75)  # compute not in the hours; billed off by 0.25
    db = SnowflakeDatabase(**fakesnow_server, database="SNOWFLAKE")
    db.execute("CREATE SCHEMA IF NOT EXISTS SNOWFLAKE.AU_BAD")
    cw.create_tables(db, "SNOWFLAKE.AU_BAD", wl, tables=("QUERY_HISTORY", "WAREHOUSE_METERING_HISTORY",
                                                           "METERING_DAILY_HISTORY"))
    r = SnowflakeCost(db, account_usage="SNOWFLAKE.AU_BAD", query_attribution=False).report(_period(1))
    assert _close(r.unattributed_detail["compute_not_in_hourly_metering"], 0.5)
    assert not r.reconciled and _close(r.difference(), 0.25)


def test_a_missing_view_is_a_clear_error(snow):
    with pytest.raises(CostError, match="NOPE"):
        SnowflakeCost(snow, account_usage="SNOWFLAKE.NOPE").report(_period(1))


def test_the_same_statement_on_duckdb_gives_the_same_report(report, workload):
    """The statement rendered for DuckDB over the same layout (the benchmark's engine) agrees with fakesnow."""
    from dw_dagster.databases import LocalDuckDB

    r, _ = report
    db = LocalDuckDB()
    db.execute("CREATE SCHEMA account_usage")
    cw.create_tables(db, "account_usage", workload, batch=2000)
    d = SnowflakeCost(db, account_usage="account_usage", node_assets=NODE_ASSETS).report(_period())
    assert d.reconciled
    for field in ("metered", "attributed", "idle", "unattributed"):
        assert _close(getattr(d, field), getattr(r, field)), field
    assert d.by_model.keys() == r.by_model.keys() and d.by_run.keys() == r.by_run.keys()


def test_dbt_invocations_map_to_the_dagster_runs_that_ran_them(snow, workload):
    """A dbt query tag carrying invocation_id maps to the Dagster run dagster-dbt recorded it in."""
    import json

    tagged = [q for q in workload.queries if q.truth and q.truth[0] == "model" and q.tag and q.start.date() == SINCE]
    inv = json.loads(tagged[0].tag)["invocation_id"]
    r = SnowflakeCost(snow, node_assets=NODE_ASSETS, invocation_runs={inv: "dagster-run-of-dbt"}).report(_period(1))
    assert r.queries_by["run"]["dagster-run-of-dbt"] == len(tagged)
    assert r.by_run["dagster-run-of-dbt"] == pytest.approx(sum(r.by_model[q.truth[1]] for q in tagged), abs=1e-9)
