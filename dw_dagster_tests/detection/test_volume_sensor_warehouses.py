"""The volume sensor's catalog queries on Snowflake (fakesnow) and BigQuery (bqemulator), and its
``COUNT(*)`` batches on PostgreSQL (the server on loopback).

What is tested where:

* Snowflake, fakesnow server on loopback: row counts from one ``information_schema.tables`` query
  (``row_count``), no ``COUNT(*)`` unless a partition is asked for, missing tables, a sensor tick.
  Not tested: exactness after ``DELETE`` - fakesnow fills ``row_count`` from DuckDB's
  ``estimated_size``, which keeps deleted rows (Snowflake's ``row_count`` is exact).
* BigQuery, bqemulator: it has no ``__TABLES__`` (404) and its ``INFORMATION_SCHEMA.TABLES``
  fails, so with ``row_counts="metadata"`` the catalog query fails there and the tick reports
  those tables as skipped while partition counts (``COUNT(*) ... WHERE``) still work; with
  ``row_counts="count"`` every count works. The ``__TABLES__`` query itself (one ``UNION ALL``
  over datasets) and the reading of its rows are tested against a recording stand-in.
"""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.detection.volume import build_volume_sensor
from dw_dagster.detection.volume import VolumeTable, fetch_row_counts

DAY = dt.date(2026, 3, 1)


class Spy:
    """Records every statement sent through ``fetch_all``; everything else is the wrapped database's."""

    def __init__(self, inner) -> None:
        self.inner, self.statements = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def dialect(self):
        return self.inner.dialect

    def fetch_all(self, statement):
        self.statements.append(statement)
        return self.inner.fetch_all(statement)


def make(warehouse):
    warehouse.make_table("orders", {"id": "BIGINT"}, [(i,) for i in range(3)])
    warehouse.make_table("events", {"id": "BIGINT", "ts": "TIMESTAMP"},
                         [(i, dt.datetime(2026, 3, 1 + i % 2, 10)) for i in range(5)])  # 3 on 03-01, 2 on 03-02
    s = warehouse.schema
    return [VolumeTable(f"{s}.orders", "orders", database="wh"), VolumeTable(f"{s}.gone", "gone", database="wh"),
            VolumeTable(f"{s}.events", "events", database="wh", partition_column="ts", partition=DAY)]


@pytest.mark.parametrize("warehouse", ["snowflake"], indirect=True)
def test_snowflake_counts_come_from_information_schema_in_one_query(warehouse):
    specs = make(warehouse)
    spy = Spy(warehouse.db)
    found = fetch_row_counts(spy, specs[:2])
    assert len(spy.statements) == 1
    (q,) = spy.statements
    assert "information_schema.tables" in q and "row_count" in q and "COUNT(" not in q.upper()
    orders, gone = found.counts.values()
    assert (orders.rows, orders.source) == (3, "information_schema.tables.row_count")
    assert gone.missing and gone.rows is None

    spy.statements.clear()
    found = fetch_row_counts(spy, specs)
    assert len(spy.statements) == 2 and "COUNT(*)" in spy.statements[1] and "WHERE" in spy.statements[1]
    events = found.counts[specs[2].id]
    assert (events.rows, events.partition, events.source) == (3, "2026-03-01", "count(*) where partition")


@pytest.mark.parametrize("warehouse", ["snowflake"], indirect=True)
def test_snowflake_sensor_tick_records_catalog_counts(warehouse):
    specs = make(warehouse)
    clock = [dt.datetime(2026, 3, 2, 6, tzinfo=dt.timezone.utc)]
    sensor = build_volume_sensor(tables=specs, databases={"wh": warehouse.db}, clock=lambda: clock[0])
    instance = dg.DagsterInstance.ephemeral()
    daemon = LocalSensorDaemon(dg.Definitions(sensors=[sensor]), instance, log_level="WARNING")
    tick = daemon.tick("dw_volume_sensor")
    assert tick.asset_events == 2 and f"missing tables: wh:{warehouse.schema}.gone" in tick.skip_reason
    warehouse.db.execute(f"INSERT INTO {warehouse.schema}.orders (id) VALUES (10), (11)")
    clock[0] += dt.timedelta(minutes=5)
    tick = daemon.tick("dw_volume_sensor")
    assert tick.asset_events == 1  # orders changed; events' partition did not
    (rec,) = instance.fetch_observations(dg.AssetKey("orders"), limit=1).records
    md = rec.asset_observation.metadata
    assert (md["dagster/row_count"].value, md["dw/volume_change"].value, md["dw/volume_source"].value) == (
        5, 2, "information_schema.tables.row_count")


@pytest.mark.parametrize("warehouse", ["snowflake"], indirect=True)
def test_snowflake_many_watched_tables_read_the_schema_without_naming_them(warehouse, monkeypatch):
    """Above SNOWFLAKE_NAME_FILTER_MAX watched tables the catalog branch filters on the schema only
    (fakesnow took 4.2 s to match 100 names among 5,000 tables, and never answered for 5,000):
    still one query, tables the schema holds but nobody watches are ignored, a missing one is missing."""
    import dw_dagster.detection.volume.counts as counts

    s = warehouse.schema
    for i, name in enumerate(("a1", "a2", "a3", "unwatched")):
        warehouse.make_table(name, {"id": "BIGINT"}, [(j,) for j in range(i + 1)])
    specs = [VolumeTable(f"{s}.{n}", n, database="wh") for n in ("a1", "a2", "a3", "gone")]
    spy = Spy(warehouse.db)
    monkeypatch.setattr(counts, "SNOWFLAKE_NAME_FILTER_MAX", 3)
    found = fetch_row_counts(spy, specs)
    (q,) = spy.statements
    assert "information_schema.tables" in q and "table_name IN" not in q and "table_schema IN" in q
    assert [found.counts[sp.id].rows for sp in specs] == [1, 2, 3, None]
    assert found.counts[specs[3].id].missing and not any(found.counts[sp.id].missing for sp in specs[:3])

    spy.statements.clear()
    monkeypatch.setattr(counts, "SNOWFLAKE_NAME_FILTER_MAX", 4)  # four names: named in the query
    found = fetch_row_counts(spy, specs)
    (q,) = spy.statements
    assert "table_name IN" in q and "UNWATCHED" not in q.upper()
    assert [found.counts[sp.id].rows for sp in specs] == [1, 2, 3, None]


@pytest.mark.parametrize("warehouse", ["bigquery"], indirect=True)
def test_bigquery_emulator_has_no_tables_catalog_partition_counts_still_work(warehouse):
    specs = make(warehouse)
    spy = Spy(warehouse.db)
    found = fetch_row_counts(spy, specs)
    assert "__TABLES__" in spy.statements[0]
    assert found.error and "__TABLES__" in found.error  # the emulator's gap: 404 Not found
    orders, gone, events = (found.counts[s.id] for s in specs)
    assert orders.rows is None and orders.error.startswith("catalog query failed")
    assert (events.rows, events.partition) == (3, "2026-03-01")


@pytest.mark.parametrize("warehouse", ["bigquery"], indirect=True)
def test_bigquery_emulator_count_mode_counts_every_table(warehouse):
    specs = make(warehouse)
    found = fetch_row_counts(warehouse.db, specs, row_counts="count")
    orders, gone, events = (found.counts[s.id] for s in specs)
    assert (orders.rows, orders.source) == (3, "count(*)")
    assert gone.missing and gone.rows is None
    assert events.rows == 3
    # one failing batch (the missing table), then one statement per table to isolate it
    assert len(found.queries) == 1 + 3


class FakeBigQuery:
    """Answers the ``__TABLES__`` query the way BigQuery does; records it."""

    dialect = "bigquery"
    name = "bigquery:acme-dw/pos"
    dataset = "pos"

    def __init__(self) -> None:
        self.statements = []

    def fetch_all(self, statement):
        self.statements.append(statement)
        # (k, table_id, row_count, type): k is the UNION ALL branch (one per dataset)
        return [(0, "sales_line", 11_800_000, 1), (0, "sales_view", 0, 2), (1, "orders", 42, 1)]


def test_bigquery_tables_query_is_one_union_over_datasets():
    db = FakeBigQuery()
    specs = [VolumeTable("pos.sales_line", "a"), VolumeTable("sales_view", "b"), VolumeTable("pos.gone", "c"),
             VolumeTable("acme-ops.ops.orders", "d")]
    found = fetch_row_counts(db, specs)
    (q,) = db.statements
    assert q.count("UNION ALL") == 1
    assert "FROM pos.__TABLES__ WHERE table_id IN ('gone', 'sales_line', 'sales_view')" in q
    assert "FROM `acme-ops`.ops.__TABLES__ WHERE table_id IN ('orders')" in q
    a, b, c, d = (found.counts[s.id] for s in specs)
    assert (a.rows, a.source) == (11_800_000, "__TABLES__.row_count")
    assert b.rows is None and "not a native table" in b.error
    assert c.missing
    assert d.rows == 42


def test_postgres_counts_in_batches_of_25_tables(postgres):
    """PostgreSQL has no exact catalog row count: COUNT(*) batches, POSTGRES_COUNT_BATCH (25) tables each
    by default (100-table UNION ALLs cost 5-8 times as much there), no catalog query; batch_size still wins."""
    import uuid

    from dw_dagster.detection.volume.counts import POSTGRES_COUNT_BATCH

    schema = f"t_{uuid.uuid4().hex[:10]}"
    n = 2 * POSTGRES_COUNT_BATCH + 3
    postgres.execute(f"CREATE SCHEMA {schema}; " + "; ".join(
        f"CREATE TABLE {schema}.t{i} AS SELECT g AS id FROM generate_series(1, {i}) AS g" for i in range(n)))
    try:
        specs = [VolumeTable(f"{schema}.t{i}", f"t{i}", database="pg") for i in range(n)]
        spy = Spy(postgres)
        found = fetch_row_counts(spy, specs)
        assert len(spy.statements) == 3 and all("information_schema" not in q and "pg_" not in q for q in spy.statements)
        assert [q.count("COUNT(*)") for q in spy.statements] == [25, 25, 3]
        assert [found.counts[s.id].rows for s in specs] == list(range(n))
        assert {found.counts[s.id].source for s in specs} == {"count(*)"}
        spy.statements.clear()
        fetch_row_counts(spy, specs, batch_size=100)
        assert len(spy.statements) == 1
    finally:
        postgres.execute(f"DROP SCHEMA {schema} CASCADE")
