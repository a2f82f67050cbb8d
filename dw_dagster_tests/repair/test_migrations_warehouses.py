"""Column migrations applied forward and rolled back on DuckDB, Snowflake (fakesnow over loopback)
and BigQuery (bqemulator over loopback).

Each test starts from the orders table of the orders-stream scenario, records its schema
(column names, types, nullability from the catalog) and a data checksum computed in the
database, applies the forward, checks that it did what it should, applies the rollback and
compares schema and checksum with the start.

Where bqemulator differs from BigQuery, only the affected assertion is skipped or narrowed,
citing the gap:

* GAP_ALTER_SCHEMA (seen here; ``emulators.py`` documents the DROP NOT NULL case of it): the
  tables API keeps the schema a table was created with and ignores every ``ALTER TABLE`` (ADD,
  DROP, RENAME COLUMN, SET DATA TYPE, DROP NOT NULL), although the data follows them; and
  ``CREATE OR REPLACE TABLE t (c ... NOT NULL) AS SELECT`` records every column NULLABLE. On
  BigQuery the tests therefore read a table's columns from the schema of ``SELECT * ... LIMIT
  0`` (names, order, types), which has no modes: nullability is not compared on BigQuery once a
  table has changed. The module itself reads BigQuery through the tables API
  (:func:`read_table_schema`), checked on a freshly created table in ``test_read_table_schema``.
* GAP_NULLS (documented in ``emulators.py``): NULL is accepted into a REQUIRED column, so "a
  NULL insert now fails" cannot be observed on BigQuery.
* GAP_PARAMS (seen here): no precision, scale or max length for parameterized types, in the
  tables API or in query results (``NUMERIC(18, 2)`` reads back as ``NUMERIC``); types compare
  by their base type there, and the schema passed to :func:`generate_migration` gets the
  declared ``NUMERIC(18, 2)`` back (else a rebuild would re-declare a bare ``NUMERIC``).
* GAP_INFO_SCHEMA (seen here): ``INFORMATION_SCHEMA.COLUMNS`` queries fail with HTTP 500, so the
  checks' SQL is not run on BigQuery (BigQuery's own INFORMATION_SCHEMA may lag schema changes,
  which is why the module reads the tables API).

fakesnow answers a NOT NULL violation with HTTP 500, which the connector retries until
``network_timeout``; the "NULL insert now fails" assertions use a connection with a 3 s timeout.
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.databases import DatabaseError
from dw_dagster.changes.migrations import generate_migration
from dw_dagster.changes.migrations import apply_migration, verify_migration
from dw_dagster.changes.migrations import (
    AddColumn,
    DropColumn,
    MigrationError,
    MigrationRefused,
    RenameColumn,
    RetypeColumn,
    SetNullability,
)
from dw_dagster.changes.migrations import type_info
from dw_dagster.databases.catalog import CatalogError, ColumnSpec, TableSchema, read_table_schema
from dw_dagster_tests.harness.emulators import FAKESNOW_DATABASE
from dw_dagster_tests.repair.test_migrations import (
    ORDERS_COLUMNS,
    ORDERS_ROWS,
    assert_round_trip,
    checksum,
    create_table,
    delete_where,
    insert_rows,
    schema_snapshot,
)

COLUMNS = [c for c, _, _ in ORDERS_COLUMNS]
# verify_migration failures that only bqemulator's gaps cause (see the module docstring)
GAP_NO_MODES = re.compile(r"is nullable, expected NOT NULL$")  # GAP_ALTER_SCHEMA: query schemas carry no modes
GAP_PARAMS = re.compile(r"is (NUMERIC|BIGNUMERIC|STRING|BYTES), expected \w+\(")
_BQ_LEGACY = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}


def query_schema(db, table: str) -> TableSchema:
    """BigQuery: the columns of ``SELECT * FROM table LIMIT 0`` (GAP_ALTER_SCHEMA); every column reads nullable."""
    q = exp.select("*").from_(sql.table(table)).limit(0).sql(dialect="bigquery")
    with db.client() as client:
        fields = client.query(q, project=db.project).result().schema
    return TableSchema(table=table, columns=[
        ColumnSpec(name=f.name, type=_BQ_LEGACY.get(f.field_type, f.field_type), nullable=True) for f in fields])


def reader(warehouse):
    return query_schema if warehouse.kind == "bigquery" else read_table_schema


def current_schema(warehouse, table: str) -> TableSchema:
    """The schema to pass to generate_migration: :func:`read_table_schema`, on BigQuery with the
    declared parameters of NUMERIC columns put back (GAP_PARAMS)."""
    schema = read_table_schema(warehouse.db, table)
    if warehouse.kind != "bigquery":
        return schema
    declared = {c: exp.DataType.build(t, dialect="duckdb").sql(dialect="bigquery") for c, t, _ in ORDERS_COLUMNS}
    return schema.model_copy(update={"columns": [
        c.model_copy(update={"type": declared[c.name]}) if c.type == "NUMERIC" and c.name in declared else c
        for c in schema.columns]})


def snapshot(warehouse, table, ordered=True):
    """Columns, types and nullability as the test reads them (nullability unknown on BigQuery)."""
    snap = schema_snapshot(warehouse.db, table, ordered, reader=reader(warehouse))
    return [(n, t, None) for n, t, _ in snap] if warehouse.kind == "bigquery" else snap


def start(warehouse):
    """Create the orders table; return its name, schema snapshot and checksum."""
    t = create_table(warehouse.db, warehouse.table("orders"), ORDERS_COLUMNS, ORDERS_ROWS)
    return t, snapshot(warehouse, t), checksum(warehouse.db, t, COLUMNS)


def verify(warehouse, m, direction="forward"):
    """:func:`verify_migration`, reading schemas as the test does; on BigQuery the failures only
    the gaps cause (no modes, no type parameters) are dropped."""
    failures = verify_migration(warehouse.db, m, direction, read_schema=reader(warehouse))
    if warehouse.kind == "bigquery":
        failures = [f for f in failures if not (GAP_NO_MODES.search(f) or GAP_PARAMS.search(f))]
    return failures


def round_trip(warehouse, table, m, schema0, sum0):
    """Schema (order too when the migration restores it) and checksum equal the start's."""
    assert_round_trip(warehouse.db, table, m, schema0, sum0, compare_nullability=warehouse.kind != "bigquery",
                      reader=reader(warehouse))


def writer(warehouse, request):
    """The database for a write that must fail: on fakesnow a connection with a 3 s network timeout."""
    if warehouse.kind != "snowflake":
        return warehouse.db
    from dw_dagster.databases.snowflake import SnowflakeDatabase

    kwargs = dict(request.getfixturevalue("fakesnow_server"))
    kwargs.update(network_timeout=3, login_timeout=10)
    return SnowflakeDatabase(**kwargs, database=FAKESNOW_DATABASE)


def assert_null_rejected(warehouse, request, table, column):
    if warehouse.kind == "bigquery":
        return  # GAP_NULLS: bqemulator accepts NULL into REQUIRED columns
    row = {"order_id": 99, "shipping_country": "XX", column: None}
    with pytest.raises(DatabaseError):
        insert_rows(writer(warehouse, request), table, list(row), [tuple(row.values())])


def test_read_table_schema(warehouse):
    """The module's own schema reader on a fresh table (the tables API on BigQuery)."""
    t = create_table(warehouse.db, warehouse.table("orders"), ORDERS_COLUMNS, ORDERS_ROWS)
    got = [(c.name.lower(), type_info(c.type, warehouse.kind).family, c.nullable)
           for c in read_table_schema(warehouse.db, t).columns]
    integer = "decimal" if warehouse.kind == "snowflake" else "int"  # Snowflake integers are NUMBER(38,0)
    assert got == [("order_id", integer, False), ("shipping_country", "text", False), ("amount", "decimal", True),
                   ("qty", integer, True), ("placed", "date", True)]
    with pytest.raises(CatalogError, match="not found"):
        read_table_schema(warehouse.db, warehouse.table("no_such_table"))


# -- nullability -------------------------------------------------------------------------------


def test_relax_required_column_and_roll_back(warehouse, request):
    """The orders scenario: gift-card orders carry no shipping_country; relax it, with its rollback."""
    db = warehouse.db
    t, schema0, sum0 = start(warehouse)
    m = generate_migration(SetNullability(table=t, column="shipping_country", nullable=True), db.dialect,
                           current_schema=current_schema(warehouse, t))
    apply_migration(db, m)
    assert verify(warehouse, m) == []
    insert_rows(db, t, ["order_id", "shipping_country"], [(6, None)])  # the parked gift-card order lands now

    with pytest.raises(MigrationRefused, match=r"^refused: 1 row\(s\) of .*orders hold NULL in shipping_country "
                                               r"\(written after the relax\); (NOT NULL|REQUIRED) cannot be re-imposed"):
        apply_migration(db, m, "rollback")
    delete_where(db, t, exp.column("order_id").eq(6))

    apply_migration(db, m, "rollback")
    assert verify(warehouse, m, "rollback") == []
    round_trip(warehouse, t, m, schema0, sum0)
    assert_null_rejected(warehouse, request, t, "shipping_country")


def test_set_not_null_refused_while_nulls_then_applied_and_rolled_back(warehouse, request):
    db = warehouse.db
    t, schema0, sum0 = start(warehouse)
    m = generate_migration(SetNullability(table=t, column="qty", nullable=False), db.dialect,
                           current_schema=current_schema(warehouse, t))
    insert_rows(db, t, ["order_id", "shipping_country", "qty"], [(7, "IT", None)])
    with pytest.raises(MigrationRefused, match=r"^refused: 1 row\(s\) of .*orders hold NULL in qty;"):
        apply_migration(db, m)
    delete_where(db, t, exp.column("order_id").eq(7))

    apply_migration(db, m)
    assert verify(warehouse, m) == []
    assert_null_rejected(warehouse, request, t, "qty")
    apply_migration(db, m, "rollback")
    assert verify(warehouse, m, "rollback") == []
    round_trip(warehouse, t, m, schema0, sum0)
    insert_rows(db, t, ["order_id", "shipping_country", "qty"], [(8, "ES", None)])  # nullable again


# -- add, drop, rename -------------------------------------------------------------------------


def test_add_column_with_default_and_roll_back(warehouse):
    db = warehouse.db
    t, schema0, sum0 = start(warehouse)
    m = generate_migration(AddColumn(table=t, column="channel", type="VARCHAR", default="web"), db.dialect)
    apply_migration(db, m)
    assert verify(warehouse, m) == []
    q = exp.select(exp.Count(this=exp.Star())).from_(sql.table(t)).where(exp.column("channel").eq(exp.Literal.string("web")))
    assert db.fetch_all(q.sql(dialect=db.dialect)) == [(len(ORDERS_ROWS),)]
    apply_migration(db, m, "rollback")
    assert verify(warehouse, m, "rollback") == []
    round_trip(warehouse, t, m, schema0, sum0)


def test_add_not_null_column_and_roll_back(warehouse, request):
    db = warehouse.db
    t, schema0, sum0 = start(warehouse)
    change = AddColumn(table=t, column="priority", type="INTEGER", nullable=False, default=0)
    if warehouse.kind == "bigquery":
        with pytest.raises(MigrationError, match="cannot add a REQUIRED column"):
            generate_migration(change, "bigquery")
        return
    m = generate_migration(change, db.dialect)
    apply_migration(db, m)
    assert verify(warehouse, m) == []
    assert_null_rejected(warehouse, request, t, "priority")
    apply_migration(db, m, "rollback")
    round_trip(warehouse, t, m, schema0, sum0)


@pytest.mark.parametrize("column", ["amount", "shipping_country"])
def test_drop_column_and_roll_back_restores_its_data(warehouse, column):
    db = warehouse.db
    t, schema0, sum0 = start(warehouse)
    m = generate_migration(DropColumn(table=t, column=column, key_columns=["order_id"]), db.dialect,
                           current_schema=current_schema(warehouse, t))
    apply_migration(db, m)
    assert verify(warehouse, m) == []
    assert reader(warehouse)(db, t).column(column, db.dialect) is None
    apply_migration(db, m, "rollback")
    assert verify(warehouse, m, "rollback") == []
    round_trip(warehouse, t, m, schema0, sum0)
    with pytest.raises(CatalogError, match="not found"):  # the backup table is gone
        read_table_schema(db, m.backup_table)


def test_rename_column_and_roll_back(warehouse):
    db = warehouse.db
    t, schema0, sum0 = start(warehouse)
    m = generate_migration(RenameColumn(table=t, column="qty", new_name="quantity"), db.dialect)
    apply_migration(db, m)
    assert verify(warehouse, m) == []
    apply_migration(db, m, "rollback")
    assert verify(warehouse, m, "rollback") == []
    round_trip(warehouse, t, m, schema0, sum0)


# -- retype ------------------------------------------------------------------------------------

WIDENINGS = {
    "duckdb": [("qty", "INTEGER", "BIGINT"), ("amount", "DECIMAL(18,2)", "DECIMAL(20,4)")],
    # precision at the same scale: in place both ways; a scale change: the column is swapped
    "snowflake": [("amount", "DECIMAL(18,2)", "DECIMAL(20,2)"), ("amount", "DECIMAL(18,2)", "DECIMAL(20,4)")],
    # INT64 -> NUMERIC is a coercion (in place); its rollback NUMERIC -> INT64 rebuilds the table
    "bigquery": [("qty", "INT64", "NUMERIC")],
}


def test_widening_retype_and_roll_back(warehouse):
    db = warehouse.db
    t, schema0, sum0 = start(warehouse)
    for column, from_type, to_type in WIDENINGS[warehouse.kind]:
        m = generate_migration(RetypeColumn(table=t, column=column, from_type=from_type, to_type=to_type), db.dialect,
                               current_schema=current_schema(warehouse, t))
        apply_migration(db, m)
        assert verify(warehouse, m) == []
        apply_migration(db, m, "rollback")
        assert verify(warehouse, m, "rollback") == []
        round_trip(warehouse, t, m, schema0, sum0)
        schema0 = snapshot(warehouse, t)  # a swap moved the column to the end: the next case starts from here


def test_lossy_retype_with_backup_rounds_forward_and_restores_exact_values(warehouse):
    db = warehouse.db
    t, schema0, sum0 = start(warehouse)
    m = generate_migration(RetypeColumn(table=t, column="amount", from_type="DECIMAL(18,2)", to_type="DECIMAL(18,0)",
                                        allow_lossy=True, key_columns=["order_id"]), db.dialect,
                           current_schema=current_schema(warehouse, t))
    apply_migration(db, m)
    assert verify(warehouse, m) == []
    q = exp.select("order_id", "amount").from_(sql.table(t)).order_by("order_id")
    rounded = [(k, None if a is None else Decimal(a)) for k, a in db.fetch_all(q.sql(dialect=db.dialect))]
    assert rounded == [(1, Decimal(13)), (2, Decimal(100)), (3, None), (4, Decimal(-5)), (5, Decimal(123456789012))]
    apply_migration(db, m, "rollback")
    assert verify(warehouse, m, "rollback") == []
    round_trip(warehouse, t, m, schema0, sum0)
