"""dw_dagster's database resources tag every statement they issue in a Dagster step, and the cost
report reads the same tag back (Snowflake on fakesnow, BigQuery on bqemulator)."""


import datetime as dt
import json

import dagster as dg
import pytest

from dw_dagster.databases.tags import COMMENT_START, bigquery_labels, tagged, with_comment

DAILY = dg.DailyPartitionsDefinition(start_date="2026-10-01", end_date="2026-10-05")


def test_nothing_is_added_outside_a_dagster_step():
    assert tagged("select 1") == ("select 1", None)


def test_the_comment_is_appended_once_and_cannot_end_early():
    tag = {"app": "dw_dagster", "dagster_run_id": "r1", "asset_key": "a/b", "partition": "x*/drop table t"}
    once = with_comment("select 1;", tag)
    assert once.startswith("select 1\n/* {") and once.endswith(" */") and once.count("*/") == 1
    assert with_comment(once, tag) == once
    body = once[once.index("/* ") + 3:-3]
    assert json.loads(body)["partition"] == "x*/drop table t"
    assert COMMENT_START in once


def test_bigquery_labels_are_sanitised():
    labels = bigquery_labels({"app": "dw_dagster", "dagster_run_id": "AB-12", "asset_key": "Raw/POS/sales line" + "x" * 80})
    assert labels["dagster_run_id"] == "ab-12" and "app" not in labels
    assert labels["asset_key"].startswith("raw__pos__sales_line") and len(labels["asset_key"]) == 63


def _asset(make_db, sql_text: str, out: list):
    @dg.asset(partitions_def=DAILY, key=["raw", "pos", "sales_line"])
    def sales_line(context: dg.AssetExecutionContext) -> None:
        out.append((context.run_id, make_db().fetch_all(sql_text)))

    return sales_line


def test_snowflake_statements_carry_the_query_tag_and_the_comment(fakesnow_server, monkeypatch):
    import snowflake.connector.cursor as sc

    from dw_dagster.databases.snowflake import SnowflakeDatabase

    sent, original = [], sc.SnowflakeCursor.execute

    def recording(self, command, *args, **kwargs):
        sent.append((command, kwargs.get("_statement_params")))
        return original(self, command, *args, **kwargs)

    monkeypatch.setattr(sc.SnowflakeCursor, "execute", recording)
    out: list = []
    result = dg.materialize([_asset(lambda: SnowflakeDatabase(**fakesnow_server), "SELECT 41 + 1 AS x", out)],
                            partition_key="2026-10-03")
    assert result.success and out[0][1] == [(42,)]
    command, params = next(s for s in sent if s[0].startswith("SELECT 41"))
    tag = json.loads(params["QUERY_TAG"])
    assert tag == {"app": "dw_dagster", "dagster_run_id": result.run_id, "asset_key": "raw/pos/sales_line",
                   "partition": "2026-10-03"}
    assert command.endswith("/* " + json.dumps(tag) + " */")


def test_a_range_run_is_tagged_with_its_partition_range(fakesnow_server, monkeypatch):
    import snowflake.connector.cursor as sc

    from dw_dagster.databases.snowflake import SnowflakeDatabase

    sent, original = [], sc.SnowflakeCursor.execute
    monkeypatch.setattr(sc.SnowflakeCursor, "execute",
                        lambda self, command, *a, **k: (sent.append(k.get("_statement_params")), original(self, command, *a, **k))[1])
    out: list = []

    @dg.asset(partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run())
    def ranged(context: dg.AssetExecutionContext) -> None:
        out.append(SnowflakeDatabase(**fakesnow_server).fetch_all("SELECT 1"))

    job = dg.define_asset_job("ranged_job", [ranged], partitions_def=DAILY)
    defs = dg.Definitions(assets=[ranged], jobs=[job])
    res = defs.resolve_job_def("ranged_job").execute_in_process(
        tags={"dagster/asset_partition_range_start": "2026-10-01", "dagster/asset_partition_range_end": "2026-10-03"})
    assert res.success
    assert json.loads(next(p for p in sent if p)["QUERY_TAG"])["partition"] == "2026-10-01..2026-10-03"


def test_bigquery_jobs_carry_labels_and_the_comment(bqemulator_server, monkeypatch):
    from dw_dagster.databases.bigquery import BigQueryDatabase
    from dw_dagster_tests.harness.emulators import bigquery_client

    client = bigquery_client(bqemulator_server)
    labels, original = [], client.query

    def recording(sql_text, *args, **kwargs):
        labels.append(dict(kwargs["job_config"].labels or {}))
        return original(sql_text, *args, **kwargs)

    monkeypatch.setattr(client, "query", recording)
    out: list = []
    result = dg.materialize([_asset(lambda: BigQueryDatabase(client), "SELECT 7 AS x", out)], partition_key="2026-10-02")
    assert result.success and out[0][1] == [(7,)]
    assert labels[-1] == {"dagster_run_id": result.run_id, "asset_key": "raw__pos__sales_line", "partition": "2026-10-02"}
    texts = [j.query for j in client.list_jobs() if j.query and result.run_id in j.query]
    assert texts and texts[0].startswith("SELECT 7 AS x\n/* {")


def test_the_tag_the_resource_sets_is_the_tag_the_report_reads(fakesnow_server, monkeypatch):
    """A statement issued by SnowflakeDatabase in a step, as QUERY_HISTORY would keep it (text with the
    comment; QUERY_TAG as sent), lands on its run and asset in the report."""
    import snowflake.connector.cursor as sc

    from dw_dagster.cost.models import Period
    from dw_dagster.cost.snowflake import SnowflakeCost
    from dw_dagster.databases.snowflake import SnowflakeDatabase
    from dw_dagster_dev import cost_workload as cw

    sent, original = [], sc.SnowflakeCursor.execute
    monkeypatch.setattr(sc.SnowflakeCursor, "execute",
                        lambda self, command, *a, **k: (sent.append((command, k.get("_statement_params"))),
                                                        original(self, command, *a, **k))[1])
    result = dg.materialize([_asset(lambda: SnowflakeDatabase(**fakesnow_server), "SELECT 1 AS x", [])],
                            partition_key="2026-10-01")
    command, params = next(s for s in sent if s[0].startswith("SELECT 1 AS x"))
    monkeypatch.undo()
    wl = cw.generate(dt.date(2026, 10, 1), 1, bi_per_hour=1, loads_per_day=1)
    q = next(q for q in wl.queries if q.warehouse == "BI_WH")
    q.text, q.tag = command, params["QUERY_TAG"]
    SnowflakeDatabase(**fakesnow_server).execute("CREATE DATABASE IF NOT EXISTS SNOWFLAKE")
    db = SnowflakeDatabase(**fakesnow_server, database="SNOWFLAKE")
    db.execute("CREATE SCHEMA IF NOT EXISTS SNOWFLAKE.AU_TAGS")
    cw.create_tables(db, "SNOWFLAKE.AU_TAGS", wl, tables=("QUERY_HISTORY", "WAREHOUSE_METERING_HISTORY", "METERING_DAILY_HISTORY"))
    r = SnowflakeCost(db, account_usage="SNOWFLAKE.AU_TAGS", query_attribution=False).report(
        Period(since=dt.date(2026, 10, 1), until=dt.date(2026, 10, 2)))
    assert r.queries_by["run"][result.run_id] == 1 and r.by_run[result.run_id] > 0
    assert r.queries_by["asset"]["raw/pos/sales_line"] >= 1


@pytest.mark.parametrize("text, found", [
    ('{"app": "dw_dagster", "dagster_run_id": "r-1"}', "r-1"),
    ('{"dagster_run_id":"r-2"}', "r-2"),                       # compact JSON
    ('{"dagster_run_id": 5}', None),                            # not a string: not guessed
    ('{"dagster_run_id": "r-3', None),                          # truncated tag
    ('{"other_dagster_run_id": "x"}', None),                    # another key that ends the same
    ("dagster_run_id=r-4", None),                               # not JSON
])
def test_a_malformed_query_tag_maps_to_nothing_never_to_a_guess(text, found):
    """Query tags are free text anyone can set (dbt's query_tag config, a BI tool): only a JSON string value
    of the exact key maps; anything else is unattributed. The same pattern runs on Snowflake, BigQuery and DuckDB."""
    import re

    from dw_dagster.cost.mapping import json_pattern
    from dw_dagster.databases import LocalDuckDB

    pattern = json_pattern("dagster_run_id")
    m = re.search(pattern, text)
    assert (m.group(1) if m else None) == found
    db = LocalDuckDB()
    (row,) = db.fetch_all(f"SELECT NULLIF(regexp_extract('{text}', '{pattern}', 1), '')")
    assert row[0] == found
