"""BigQuery bytes billed and slot time per query, from a seeded ``INFORMATION_SCHEMA.JOBS`` copy on bqemulator.

bqemulator has no INFORMATION_SCHEMA.JOBS; the view is configurable, so the report reads a table
with the view's columns, seeded here with jobs whose expected attribution is written out by hand.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
import sqlglot

from dw_dagster.cost.bigquery import TIB, BigQueryCost
from dw_dagster.cost.models import Period

MB = 2 ** 20
PERIOD = Period(since=dt.date(2026, 10, 1), until=dt.date(2026, 10, 2))
RUN = "5f0c6d1e-8a1b-4c2d-9e3f-0a1b2c3d4e5f"
NODE_ASSETS = {"model.shop.orders": "orders", "model.shop.customers": "customers",
               "test.shop.not_null_orders_order_id.abc12": "orders"}


def _comment(d: dict) -> str:
    return "/* " + json.dumps(d) + " */"


def _job(job_id, *, billed, slot=100, processed=None, query="select 1", labels=None, st="SELECT", cache=False,
         parent=None, at="2026-10-01T03:00:00Z", job_type="QUERY", project="dw-test"):
    return {"job_id": job_id, "parent_job_id": parent, "creation_time": at, "statement_type": st, "cache_hit": cache,
            "total_bytes_billed": billed, "total_bytes_processed": processed if processed is not None else billed - 1000,
            "total_slot_ms": slot, "query": query, "project_id": project, "job_type": job_type,
            "labels": [{"key": k, "value": v} for k, v in (labels or {}).items()]}


JOBS = [
    # dbt's comment in the text (appended) and its invocation label
    _job("m1", billed=100 * MB, slot=5000, query="create table orders as select 1\n" + _comment(
        {"app": "dbt", "node_id": "model.shop.orders"}), labels={"dbt_invocation_id": "inv-1"}),
    # job-label only (query-comment: {job-label: true}): dbt's sanitised node id, matched back to the manifest
    _job("m2", billed=40 * MB, slot=2000, labels={"dbt_invocation_id": "inv-1", "node_id": "model_shop_customers"}),
    # a dbt test is a node of its own
    _job("t1", billed=10 * MB, slot=50, query="select count(*) from orders\n" + _comment(
        {"node_id": "test.shop.not_null_orders_order_id.abc12", "app": "dbt"})),
    # a cache hit bills nothing, whatever the row's bytes say
    _job("m3", billed=999 * MB, slot=0, cache=True, query="select 1\n" + _comment({"app": "dbt", "node_id": "model.shop.orders"})),
    # a script: the parent repeats its children's sum and carries dw_dagster's labels; children are counted once
    _job("s0", billed=30 * MB, slot=700, st="SCRIPT", query="begin select 1; select 2; end\n" + _comment(
        {"app": "dw_dagster", "dagster_run_id": RUN, "asset_key": "raw/pos/sales_line", "partition": "2026-10-01"}),
        labels={"dagster_run_id": RUN, "asset_key": "raw__pos__sales_line"}, cache=None),
    _job("s1", billed=20 * MB, slot=400, parent="s0"),
    _job("s2", billed=10 * MB, slot=300, parent="s0"),
    # untagged dashboard query
    _job("bi", billed=70 * MB, slot=900, query="select region, sum(x) from marts.sales group by 1"),
    # outside the period, and not a query job: neither is counted
    _job("old", billed=5000 * MB, at="2026-09-30T23:59:59Z"),
    _job("load", billed=5000 * MB, job_type="LOAD"),
]


@pytest.fixture(scope="module")
def bq(bqemulator_server):
    from google.cloud import bigquery

    from dw_dagster.databases.bigquery import BigQueryDatabase
    from dw_dagster_tests.harness.emulators import bigquery_client

    client = bigquery_client(bqemulator_server)
    client.create_dataset("cost_ops", exists_ok=True)
    f = bigquery.SchemaField
    schema = [f("job_id", "STRING"), f("parent_job_id", "STRING"), f("creation_time", "TIMESTAMP"),
              f("statement_type", "STRING"), f("cache_hit", "BOOLEAN"), f("total_bytes_billed", "INTEGER"),
              f("total_bytes_processed", "INTEGER"), f("total_slot_ms", "INTEGER"), f("query", "STRING"),
              f("project_id", "STRING"), f("job_type", "STRING"),
              f("labels", "RECORD", mode="REPEATED", fields=[f("key", "STRING"), f("value", "STRING")])]
    table = client.create_table(bigquery.Table("dw-test.cost_ops.jobs", schema=schema), exists_ok=True)
    assert client.insert_rows_json(table, JOBS) == []
    yield BigQueryDatabase(client)
    client.delete_dataset("cost_ops", delete_contents=True, not_found_ok=True)


@pytest.fixture(scope="module")
def report(bq):
    return BigQueryCost(bq, jobs_view="cost_ops.jobs", node_assets=NODE_ASSETS,
                        invocation_runs={"inv-1": "run-of-dbt"}).report(PERIOD)


def test_bytes_billed_per_node_asset_and_run(report):
    r = report
    assert r.unit == "bytes_billed" and r.engine == "bigquery"
    assert r.by_model == {"model.shop.orders": 100 * MB, "model.shop.customers": 40 * MB,
                          "test.shop.not_null_orders_order_id.abc12": 10 * MB}
    assert r.by_asset == {"orders": 110 * MB, "customers": 40 * MB, "raw/pos/sales_line": 30 * MB}
    assert r.by_run == {"run-of-dbt": 140 * MB, RUN: 30 * MB}
    assert r.by_partition == {"raw/pos/sales_line": {"2026-10-01": 30 * MB}}  # the script's children, by its tag
    assert r.queries_by["model"]["model.shop.orders"] == 2  # the cache hit counts as a query, for 0 bytes


def test_cache_hits_bill_zero_and_a_script_is_counted_once(report):
    """doitintl/bigquery-optimization-queries#4: a script's parent repeats its children's slots and bytes."""
    r = report
    assert r.metered == (100 + 40 + 10 + 0 + 20 + 10 + 70) * MB
    assert r.queries["total"] == 7  # s0 left out, old and load not counted
    assert r.extra["slot_ms"] == 5000 + 2000 + 50 + 0 + 400 + 300 + 900


def test_unattributed_is_what_maps_to_nothing_and_totals_reconcile(report):
    r = report
    assert r.unattributed == 70 * MB and r.idle == 0.0
    assert r.reconciled and r.attributed + r.idle + r.unattributed == r.metered


def test_bytes_processed_is_beside_and_usd_uses_the_price_setting(bq, report):
    """dbt-labs/dbt-bigquery#560: bytes processed is not what is billed (10 MB minimum, rounding)."""
    r = report
    assert r.beside["bytes_processed"] != r.metered
    assert r.extra["usd"] == pytest.approx(r.metered / TIB * 6.25)
    dear = BigQueryCost(bq, jobs_view="cost_ops.jobs", price_per_tib=12.5).report(PERIOD)
    assert dear.extra["usd"] == pytest.approx(2 * r.extra["usd"])
    assert dear.by_model == {"model.shop.orders": 100 * MB, "test.shop.not_null_orders_order_id.abc12": 10 * MB,
                             "model_shop_customers": 40 * MB}  # without a manifest the label is shown as dbt wrote it


def test_the_default_view_is_the_region_qualified_jobs_view(bq):
    text = BigQueryCost(bq, region="EU", project="acme-dw").statement(PERIOD)
    assert "`acme-dw`.`region-eu`.`INFORMATION_SCHEMA.JOBS`" in text
    assert len(sqlglot.parse(text, read="bigquery")) == 1
    from dw_dagster.cost.models import CostError

    with pytest.raises(CostError):
        BigQueryCost(bq, region="us`; drop").statement(PERIOD)
