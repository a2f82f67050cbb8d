"""Schema change: snapshots from the catalog, kept as dw/schema metadata, classified, read back as a cause."""

import datetime as dt
import uuid

import dagster as dg
import pytest

from dw_dagster.databases import DatabaseError, DatabaseResource
from dw_dagster.diagnosis.causes.schema_change import (
    ColumnInfo,
    build_schema_snapshot_check,
    diagnose_schema_change,
    diff_schemas,
    schema_history,
    schema_metadata,
    schema_snapshot,
    take_schema_snapshot,
)


def C(name, ty, nullable=True, pos=1):
    return ColumnInfo(name=name, data_type=ty, nullable=nullable, position=pos)


def test_snapshot_duckdb(duck):
    duck.execute("CREATE SCHEMA analytics")
    duck.execute("CREATE TABLE analytics.orders (order_id BIGINT NOT NULL, shipping_country VARCHAR, amount DECIMAL(18,2))")
    cols = schema_snapshot(duck, "analytics.orders")
    assert [(c.name, c.data_type, c.nullable, c.position) for c in cols] == [
        ("order_id", "BIGINT", False, 1), ("shipping_country", "VARCHAR", True, 2), ("amount", "DECIMAL(18,2)", True, 3)]
    assert schema_snapshot(duck, "ANALYTICS.Orders") == cols  # case-insensitive names
    with pytest.raises(DatabaseError, match="not found"):
        schema_snapshot(duck, "analytics.nope")


def test_snapshot_postgres_carries_precision_and_length(postgres):
    schema = f"sc_{uuid.uuid4().hex[:8]}"
    postgres.execute(f"CREATE SCHEMA {schema}")
    try:
        postgres.execute(f"CREATE TABLE {schema}.orders (order_id BIGINT NOT NULL, country VARCHAR(2), amount NUMERIC(18,2))")
        before = take_schema_snapshot(postgres, f"{schema}.orders")
        assert [(c.name, c.data_type, c.nullable) for c in before.columns] == [
            ("order_id", "BIGINT", False), ("country", "CHARACTER VARYING(2)", True), ("amount", "NUMERIC(18,2)", True)]
        postgres.execute(f"ALTER TABLE {schema}.orders ALTER COLUMN amount TYPE NUMERIC(20,2)")
        postgres.execute(f"ALTER TABLE {schema}.orders ALTER COLUMN country SET NOT NULL")
        postgres.execute(f"ALTER TABLE {schema}.orders RENAME COLUMN order_id TO id")
        after = take_schema_snapshot(postgres, f"{schema}.orders")
        assert after.hash != before.hash and "information_schema.columns" in after.sql
        assert [(ch.kind, ch.column, ch.new_column) for ch in diff_schemas(before.columns, after.columns)] == [
            ("renamed", "order_id", "id"), ("retyped", "amount", None), ("nullability_tightened", "country", None)]
    finally:
        postgres.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_diff_classifies_every_kind():
    before = [C("id", "BIGINT", False, 1), C("a", "VARCHAR", True, 2), C("b", "INTEGER", True, 3), C("c", "DATE", False, 4),
              C("d", "VARCHAR", True, 5)]
    after = [C("id", "BIGINT", False, 1), C("a2", "VARCHAR", True, 2), C("b", "BIGINT", True, 3), C("c", "DATE", True, 4),
             C("d", "VARCHAR", False, 5), C("e", "BOOLEAN", True, 6)]
    got = [(ch.kind, ch.column, ch.new_column) for ch in diff_schemas(before, after)]
    assert got == [("renamed", "a", "a2"), ("retyped", "b", None), ("nullability_tightened", "d", None),
                   ("nullability_relaxed", "c", None), ("added", "e", None)]
    assert diff_schemas(before, before) == []


def test_rename_needs_same_type_nullability_and_position():
    before = [C("id", "BIGINT", False, 1), C("a", "VARCHAR", True, 2)]
    # same type, other position: a drop and an add, not a rename
    moved = [C("id", "BIGINT", False, 1), C("x", "INTEGER", True, 2), C("a2", "VARCHAR", True, 3)]
    assert sorted((ch.kind, ch.column) for ch in diff_schemas(before, moved)) == [("added", "a2"), ("added", "x"), ("dropped", "a")]
    # same position, other type: a drop and an add
    retyped = [C("id", "BIGINT", False, 1), C("a2", "INTEGER", True, 2)]
    assert [ch.kind for ch in diff_schemas(before, retyped)] == ["dropped", "added"]
    # a column dropped: the positions after it shift, which is not a change
    shifted = diff_schemas([C("a", "INT", True, 1), C("b", "INT", True, 2), C("c", "INT", True, 3)],
                           [C("a", "INT", True, 1), C("c", "INT", True, 2)])
    assert [(ch.kind, ch.column) for ch in shifted] == [("dropped", "b")]


def _defs(duck_path, table="analytics.orders"):
    @dg.asset(key="orders")
    def orders():
        return None

    check = build_schema_snapshot_check(asset="orders", table=table, resource_key="warehouse")
    return orders, check, {"warehouse": DatabaseResource(url=f"duckdb:///{duck_path}")}


def test_check_records_snapshots_and_the_cause_reads_them(duck, tmp_path):
    duck.execute("CREATE SCHEMA analytics")
    duck.execute("CREATE TABLE analytics.orders (order_id BIGINT, shipping_country VARCHAR, amount DECIMAL(18,2))")
    orders, check, resources = _defs(duck.path)
    key = dg.AssetKey("orders")
    with dg.instance_for_test() as instance:
        r1 = dg.materialize([orders, check], instance=instance, resources=resources)
        (ev1,) = r1.get_asset_check_evaluations()
        assert ev1.passed and "first snapshot" in ev1.description
        not_yet = diagnose_schema_change(instance, [key], gap_rows=5)
        assert not_yet.details["tested"] is False and not_yet.confidence == 0.0
        # a snapshot recorded by the loader itself (an observation), same schema
        instance.report_runless_asset_event(dg.AssetObservation(
            "orders", metadata=schema_metadata(take_schema_snapshot(duck, "analytics.orders"))))
        same = diagnose_schema_change(instance, [key], gap_rows=5)
        assert same.details["tested"] and same.confidence == 0.0 and "no schema change" in same.summary
        t_change = dt.datetime.now(dt.timezone.utc)
        # the release: shipping_country becomes REQUIRED (DuckDB: rebuild the table), a column is added
        duck.execute("CREATE TABLE analytics.orders2 (order_id BIGINT, shipping_country VARCHAR NOT NULL, "
                     "amount DECIMAL(18,2), gift_card BOOLEAN)")
        duck.execute("DROP TABLE analytics.orders")
        duck.execute("ALTER TABLE analytics.orders2 RENAME TO orders")
        r3 = dg.materialize([orders, check], instance=instance, resources=resources)
        (ev3,) = r3.get_asset_check_evaluations()
        assert not ev3.passed and "shipping_country NULLABLE → REQUIRED" in ev3.description
        assert [c["kind"] for c in ev3.metadata["dw/schema_changes"].value] == ["nullability_tightened", "added"]
        assert len(schema_history(instance, key, "analytics.orders")) == 3  # two checks, one loader
        f = diagnose_schema_change(instance, [key], gap_rows=3912)
        assert f.kind == "schema_change" and f.confidence == 0.5
        assert (f.explained_rows, f.unexplained_rows) == (0, 3912)  # counts no rows by itself
        (chg,) = f.details["changes"]
        assert [c["kind"] for c in chg["changes"]] == ["nullability_tightened", "added"]
        assert chg["changed_after"] < t_change.isoformat() < chg["changed_by"]
        assert f.details["columns_tightened"] == ["shipping_country"]
        assert "shipping_country NULLABLE → REQUIRED" in f.summary and "gift_card added" in f.summary
        assert any("information_schema.columns" in e.sql for e in f.evidence)
        # an incident detected before the change is not explained by it
        early = diagnose_schema_change(instance, [key], as_of=t_change, gap_rows=3912)
        assert early.confidence == 0.0 and early.details["changes"] == []
        # only additive changes: a low prior
        duck.execute("ALTER TABLE analytics.orders ADD COLUMN note VARCHAR")
        instance.report_runless_asset_event(dg.AssetObservation(
            "orders", metadata=schema_metadata(take_schema_snapshot(duck, "analytics.orders"))))
        add = diagnose_schema_change(instance, [key])
        assert add.confidence == 0.1 and add.details["breaking_kinds"] == []


def test_snapshot_on_a_materialization(duck):
    duck.execute("CREATE TABLE t (id INT)")

    def landed():  # what a loader puts on its materialization (MaterializeResult(metadata=...) in an asset)
        return dg.AssetMaterialization("t_asset", metadata={"dagster/row_count": 0, **schema_metadata(take_schema_snapshot(duck, "t"))})

    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(landed())
        duck.execute("ALTER TABLE t ADD COLUMN v VARCHAR")
        duck.execute("ALTER TABLE t DROP COLUMN id")
        instance.report_runless_asset_event(landed())
        f = diagnose_schema_change(instance, [dg.AssetKey("t_asset")], tables=["T"])
        assert [c["kind"] for c in f.details["changes"][0]["changes"]] == ["dropped", "added"]
        assert f.confidence == 0.5 and "id dropped" in f.summary


def test_snapshot_on_every_warehouse(warehouse):
    """DuckDB and Snowflake (fakesnow) through information_schema, BigQuery (bqemulator) through the tables API."""
    db, s = warehouse.db, warehouse.schema
    if warehouse.kind == "bigquery":
        db.execute(f"CREATE TABLE {s}.orders (order_id INT64 NOT NULL, country STRING, amount NUMERIC)")
    else:
        db.execute(f"CREATE TABLE {s}.orders (order_id BIGINT NOT NULL, country VARCHAR(2), amount DECIMAL(18,2))")
    cols = schema_snapshot(db, f"{s}.orders")
    assert [(c.name.lower(), c.nullable, c.position) for c in cols] == [
        ("order_id", False, 1), ("country", True, 2), ("amount", True, 3)]
    expected = {"duckdb": ["BIGINT", "VARCHAR", "DECIMAL(18,2)"], "snowflake": ["NUMBER(38,0)", "TEXT(2)", "NUMBER(18,2)"],
                "bigquery": ["INTEGER", "STRING", "NUMERIC"]}[warehouse.kind]
    assert [c.data_type for c in cols] == expected
