"""The source interface against a real PostgreSQL server on loopback, as an on-premises POS database would be."""

import datetime as dt

import pytest

from dw_dagster.checks.reconcile import reconcile
from dw_dagster.databases import DuckDBDatabase
from dw_dagster.diagnosis.causes.watermark import PartitionLoad, diagnose_late_rows
from dw_dagster_examples.store_sales import generator as g
from dw_dagster.pipelines.incremental import IncrementalLoadSpec, load_partition

SCALE = 0.0005
SPEC = dict(source_table="pos.sales_line", target_table="pos.sales_line", merge_key="sales_line_id",
            partition_column="sale_ts", watermark_column="sale_ts", lookback_hours=0, arrival_column="posted_ts",
            columns=["sales_line_id", "store_id", "region", "sale_ts", "posted_ts", "net_sales"])


@pytest.fixture
def pg_source(postgres):
    postgres.execute("DROP SCHEMA IF EXISTS pos CASCADE")
    yield postgres
    postgres.execute("DROP SCHEMA IF EXISTS pos CASCADE")


def _day(i: int) -> tuple[str, dt.datetime, dt.datetime]:
    d = g.FIRST_DAY + dt.timedelta(days=i)
    start = dt.datetime.combine(d, dt.time())
    return d.isoformat(), start, start + dt.timedelta(days=1)


def test_load_diagnose_and_repair_from_postgres(pg_source, tmp_path):
    assert pg_source.dialect == "postgres"
    wh = DuckDBDatabase(tmp_path / "warehouse.duckdb")
    spec = IncrementalLoadSpec(**SPEC)
    g.post_lines(pg_source, SCALE, g.BEFORE_RECOVERY)
    loads = {}
    for i in range(g.DAYS - 1):
        pk, start, end = _day(i)
        loads[pk] = load_partition(pg_source, wh, spec, pk, start, end, batch_rows=500)
    g.post_lines(pg_source, SCALE, g.AFTER_RECOVERY)
    pk, start, end = _day(g.DAYS - 1)
    loads[pk] = last = load_partition(pg_source, wh, spec, pk, start, end)
    assert last.watermark_low == dt.datetime(2026, 11, 27, 21, 59, 59)

    before = reconcile(pg_source, wh, "pos.sales_line", "pos.sales_line", ["region"], ["net_sales"])
    by = {s.slice["region"]: s for s in before.slices}
    late = round(212_400 * SCALE)
    assert by["Southwest"].gap_rows == late and not by["Southwest"].passed
    assert all(s.passed for r, s in by.items() if r != "Southwest")
    assert by["Southwest"].sum_gaps["net_sales"] != "0.00"

    finding = diagnose_late_rows(
        pg_source, wh, source_table="pos.sales_line", target_table="pos.sales_line", key_column="sales_line_id",
        partition_column="sale_ts", watermark_column="sale_ts", arrival_column="posted_ts",
        loads=[PartitionLoad(k, r.partition_start, r.partition_end, r.source_snapshot_ts) for k, r in loads.items()],
        high_watermark=last.watermark_low, gap_rows=before.gap_rows, group_by=["store_id"])
    assert finding.window == ["2026-11-26", "2026-11-27"]
    assert finding.explained_rows == late and finding.unexplained_rows == 0
    assert finding.details["tied_with_watermark_rows"] == 19
    assert len(finding.details["groups"]) == 19
    assert finding.details["proposed_lookback_hours"] == 72

    fixed = IncrementalLoadSpec(**{**SPEC, "watermark_column": "posted_ts", "lookback_hours": 72})
    for pk in finding.window:
        i = (dt.date.fromisoformat(pk) - g.FIRST_DAY).days
        _, start, end = _day(i)
        load_partition(pg_source, wh, fixed, pk, start, end)
    after = reconcile(pg_source, wh, "pos.sales_line", "pos.sales_line", ["region"], ["net_sales"])
    assert after.passed and after.gap_rows == 0
    assert wh.fetch_all("SELECT count(*) - count(DISTINCT sales_line_id) FROM pos.sales_line")[0][0] == 0



def test_postgres_catalog_types_and_no_guessed_target(pg_source, tmp_path):
    """The target is created with the source's own types, and refused when a type would be a guess."""
    from dw_dagster.pipelines.incremental import LoadError
    from dw_dagster.databases.catalog import read_table_schema

    pg_source.execute("CREATE SCHEMA pos")
    pg_source.execute("CREATE TABLE pos.t (id BIGINT NOT NULL, name VARCHAR(20), code CHAR(3), amount NUMERIC(12,2), "
                      "ts TIMESTAMP, loose NUMERIC)")
    schema = read_table_schema(pg_source, "pos.t")
    assert [(c.name, c.type, c.nullable) for c in schema.columns] == [
        ("id", "bigint", False), ("name", "VARCHAR(20)", True), ("code", "CHAR(3)", True),
        ("amount", "DECIMAL(12,2)", True), ("ts", "timestamp without time zone", True), ("loose", "numeric", True)]
    wh = DuckDBDatabase(tmp_path / "warehouse.duckdb")
    base = dict(source_table="pos.t", target_table="pos.t", merge_key="id", partition_column="ts",
                watermark_column="ts", lookback_hours=0)
    start = dt.datetime(2026, 11, 1)
    with pytest.raises(LoadError, match="'numeric' of column loose has no exact DuckDB equivalent"):
        load_partition(pg_source, wh, IncrementalLoadSpec(**base, columns=["id", "ts", "loose"]),
                       "2026-11-01", start, start + dt.timedelta(days=1))
    assert not wh.fetch_all("SELECT * FROM information_schema.tables WHERE table_name = 't'")
    load_partition(pg_source, wh, IncrementalLoadSpec(**base, columns=["id", "name", "code", "amount", "ts"]),
                   "2026-11-01", start, start + dt.timedelta(days=1))
    types = dict(wh.fetch_all("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 't'"))
    assert types == {"id": "BIGINT", "name": "VARCHAR", "code": "VARCHAR", "amount": "DECIMAL(12,2)", "ts": "TIMESTAMP"}
