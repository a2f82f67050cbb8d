"""Column migrations (dw_dagster.changes.migrations): rendering per dialect, lossy retypes, hostile names,
guards, and forward-then-rollback round trips on DuckDB.

The same round trips on Snowflake (fakesnow) and BigQuery (bqemulator) are in
``test_migrations_warehouses.py``, which imports the helpers below.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import pydantic
import pytest
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.databases import Database, DatabaseError, DuckDBDatabase
from dw_dagster.changes.migrations import generate_migration
from dw_dagster.changes.migrations import apply_migration, verify_migration
from dw_dagster.changes.migrations import (
    AddColumn,
    DropColumn,
    LossyRetypeError,
    Migration,
    MigrationError,
    MigrationRefused,
    RenameColumn,
    RetypeColumn,
    SetNullability,
)
from dw_dagster.changes.migrations import classify_retype, type_info
from dw_dagster.databases.catalog import CatalogError, ColumnSpec, TableSchema, read_table_schema
from dw_dagster.databases.sql import UnsafeIdentifierError

# -- helpers (also used by test_migrations_warehouses.py) --------------------------------------

#: the orders table of the orders-stream scenario (DuckDB type names; NOT NULL where False)
ORDERS_COLUMNS: list[tuple[str, str, bool]] = [
    ("order_id", "BIGINT", False),
    ("shipping_country", "VARCHAR", False),
    ("amount", "DECIMAL(18,2)", True),
    ("qty", "INTEGER", True),
    ("placed", "DATE", True),
]
ORDERS_ROWS: list[tuple] = [
    (1, "DE", Decimal("12.50"), 1, dt.date(2026, 11, 1)),
    (2, "FR", Decimal("99.99"), 3, dt.date(2026, 11, 1)),
    (3, "US", None, 2, dt.date(2026, 11, 2)),
    (4, "GB", Decimal("-5.25"), 7, None),
    (5, "DE", Decimal("123456789012.34"), 1, dt.date(2026, 11, 3)),
]


def _typed(value: object, dtype: exp.DataType) -> exp.Expression:
    lit = sql.literal(str(value) if isinstance(value, Decimal) else value)
    return lit if isinstance(lit, (exp.Cast, exp.Null)) else exp.cast(lit, dtype.copy())


def create_table(db: Database, name: str, columns: Sequence[tuple[str, str, bool]], rows: Sequence[Sequence[object]]) -> str:
    """Create ``name`` with ``(column, DuckDB type, nullable)`` columns on ``db`` and insert ``rows``.

    NOT NULL columns are REQUIRED on BigQuery. Built with sqlglot and rendered for ``db.dialect``.
    """
    types = {c: exp.DataType.build(t, dialect="duckdb") for c, t, _ in columns}
    defs = [
        exp.ColumnDef(this=sql.identifier(c), kind=types[c].copy(),
                      constraints=None if nullable else [exp.ColumnConstraint(kind=exp.NotNullColumnConstraint())])
        for c, _, nullable in columns
    ]
    db.execute(exp.Create(kind="TABLE", this=exp.Schema(this=sql.table(name), expressions=defs)).sql(dialect=db.dialect))
    if rows:
        insert_rows(db, name, [c for c, _, _ in columns], rows, types)
    return name


def insert_rows(db: Database, table: str, columns: Sequence[str], rows: Sequence[Sequence[object]],
                types: dict[str, exp.DataType] | None = None) -> None:
    types = types or {}
    values = exp.values([
        exp.tuple_(*(_typed(v, types[c]) if c in types else sql.literal(v) for v, c in zip(row, columns, strict=True)))
        for row in rows
    ])
    db.execute(exp.insert(values, sql.table(table), columns=[sql.identifier(c) for c in columns]).sql(dialect=db.dialect))


def delete_where(db: Database, table: str, condition: exp.Expression) -> None:
    db.execute(exp.delete(sql.table(table), where=condition).sql(dialect=db.dialect))


def schema_snapshot(db: Database, table: str, ordered: bool = True,
                    reader: Callable[[Database, str], TableSchema] = read_table_schema) -> list[tuple[str, Any, bool]]:
    """``(column name lower-cased, TypeInfo, nullable)`` per column, in table order or sorted by name."""
    cols = [(c.name.lower(), type_info(c.type, db.dialect), c.nullable) for c in reader(db, table).columns]
    return cols if ordered else sorted(cols, key=lambda c: c[0])


def _text(column: str, decimal: bool) -> exp.Expression:
    text = exp.Cast(this=exp.column(sql.identifier(column)), to=exp.DataType.build("VARCHAR"))
    if decimal:
        # compare decimals by value: trailing zeros after the point are trimmed (12.500 -> 12.5),
        # because bqemulator stores a rebuilt NUMERIC column as DuckDB DECIMAL(18,3) (see
        # emulators.py on NUMERIC), which prints 12.50 as 12.500
        trimmed = exp.Anonymous(this="RTRIM", expressions=[
            exp.Anonymous(this="RTRIM", expressions=[text.copy(), exp.Literal.string("0")]), exp.Literal.string(".")])
        text = exp.Case(ifs=[exp.If(this=exp.Like(this=text.copy(), expression=exp.Literal.string("%.%")), true=trimmed)],
                        default=text)
    return exp.Coalesce(this=text, expressions=[exp.Literal.string("<null>")])


def checksum(db: Database, table: str, columns: Sequence[str], decimals: Sequence[str] = ("amount",)) -> tuple[int, int]:
    """``(row count, sum of a hash of each row's canonical text)``, computed in the database.

    The canonical text joins the columns (sorted by name, so column order does not matter) cast
    to text, NULL spelled ``<null>``; ``decimals`` are compared by value (trailing zeros
    trimmed). The hash is DuckDB/fakesnow ``hash``, Snowflake ``HASH``, BigQuery
    ``FARM_FINGERPRINT``, reduced modulo a prime so that the sum cannot overflow.
    """
    parts: list[exp.Expression] = []
    for i, c in enumerate(sorted(columns, key=str.lower)):
        if i:
            parts.append(exp.Literal.string("|"))
        parts.append(_text(c, c in decimals))
    text = exp.Concat(expressions=parts)
    fn = {"duckdb": "hash", "snowflake": "HASH", "bigquery": "FARM_FINGERPRINT"}[db.dialect]
    h = exp.Mod(this=exp.Anonymous(this=fn, expressions=[text]), expression=exp.Literal.number(1_000_000_007))
    q = exp.select(exp.Count(this=exp.Star()), exp.Sum(this=h)).from_(sql.table(table))
    ((n, s),) = db.fetch_all(q.sql(dialect=db.dialect))
    return int(n), int(s or 0)


def assert_round_trip(db: Database, table: str, m: Migration, start_schema: list, start_sum: tuple[int, int],
                      *, compare_nullability: bool = True,
                      reader: Callable[[Database, str], TableSchema] = read_table_schema) -> None:
    """After the rollback: the same columns, types, nullability (and order when the migration
    restores it) and the same data checksum as at the start."""
    now = schema_snapshot(db, table, ordered=m.rollback_restores_column_order, reader=reader)
    want = start_schema if m.rollback_restores_column_order else sorted(start_schema, key=lambda c: c[0])
    if not compare_nullability:
        now, want = [c[:2] for c in now], [c[:2] for c in want]
    assert now == want
    assert checksum(db, table, [c[0] for c in start_schema]) == start_sum


BQ_ORDERS_SCHEMA = TableSchema(
    table="analytics.orders",
    columns=[
        ColumnSpec(name="order_id", type="INT64", nullable=False),
        ColumnSpec(name="shipping_country", type="STRING", nullable=False),
        ColumnSpec(name="amount", type="NUMERIC(18, 2)"),
        ColumnSpec(name="placed", type="DATE"),
    ],
    partition_column="placed",
    cluster_columns=["order_id"],
)


@pytest.fixture
def orders(duck: DuckDBDatabase) -> str:
    duck.execute("CREATE SCHEMA analytics")
    return create_table(duck, "analytics.orders", ORDERS_COLUMNS, ORDERS_ROWS)


# -- rendering ---------------------------------------------------------------------------------


def test_orders_relax_on_bigquery_renders_drop_not_null_and_a_rebuild_rollback():
    m = generate_migration(SetNullability(table="analytics.orders", column="shipping_country", nullable=True),
                           "bigquery", current_schema=BQ_ORDERS_SCHEMA)
    assert m.forward == ["ALTER TABLE analytics.orders ALTER COLUMN shipping_country DROP NOT NULL"]
    assert m.rollback == [
        "CREATE OR REPLACE TABLE analytics.orders (order_id INT64 NOT NULL, shipping_country STRING NOT NULL, "
        "amount NUMERIC(18, 2), placed DATE) PARTITION BY placed CLUSTER BY order_id "
        "AS SELECT order_id, shipping_country, amount, placed FROM analytics.orders"
    ]
    (guard,) = m.rollback_guards
    assert guard.sql == "SELECT COUNT(*) FROM analytics.orders WHERE shipping_country IS NULL"
    assert "REQUIRED to NULLABLE" in m.summary
    assert any("no ALTER COLUMN SET NOT NULL" in n and "managing-table-schemas" in n for n in m.notes)
    assert m.checks[0].nullable is True and "INFORMATION_SCHEMA.COLUMNS" in m.checks[0].sql
    assert m.rollback_restores_column_order


def test_bigquery_relax_rollback_needs_the_current_schema():
    with pytest.raises(MigrationError, match="current_schema=read_table_schema"):
        generate_migration(SetNullability(table="analytics.orders", column="shipping_country", nullable=True), "bigquery")


def test_bigquery_rebuild_refused_when_it_would_drop_table_features():
    blocked = BQ_ORDERS_SCHEMA.model_copy(update={"rebuild_blockers": ["range partitioning"]})
    with pytest.raises(MigrationError, match="would drop: range partitioning"):
        generate_migration(SetNullability(table="analytics.orders", column="shipping_country", nullable=True),
                           "bigquery", current_schema=blocked)


def test_bigquery_rebuild_keeps_timestamp_partitioning_granularity():
    sch = TableSchema(table="d.t", columns=[ColumnSpec(name="k", type="INT64"), ColumnSpec(name="ts", type="TIMESTAMP")],
                      partition_column="ts", partition_granularity="HOUR")
    m = generate_migration(SetNullability(table="d.t", column="k", nullable=False), "bigquery", current_schema=sch)
    assert "PARTITION BY TIMESTAMP_TRUNC(ts, HOUR)" in m.forward[0]
    assert m.rollback == ["ALTER TABLE d.t ALTER COLUMN k DROP NOT NULL"]


@pytest.mark.parametrize("dialect", ["duckdb", "snowflake"])
def test_nullability_in_place_on_duckdb_and_snowflake(dialect):
    m = generate_migration(SetNullability(table="analytics.orders", column="shipping_country", nullable=True), dialect)
    assert m.forward == ["ALTER TABLE analytics.orders ALTER COLUMN shipping_country DROP NOT NULL"]
    assert m.rollback == ["ALTER TABLE analytics.orders ALTER COLUMN shipping_country SET NOT NULL"]


def test_each_kind_renders_on_each_dialect():
    schemas = {
        "duckdb": [("k", "BIGINT", False), ("c", "VARCHAR", False), ("n", "DECIMAL(18,2)", True)],
        "snowflake": [("K", "NUMBER(38,0)", False), ("C", "VARCHAR(16777216)", False), ("N", "NUMBER(18,2)", True)],
        "bigquery": [("k", "INT64", False), ("c", "STRING", False), ("n", "NUMERIC(18, 2)", True)],
    }
    changes = [
        AddColumn(table="s.t", column="z", type="VARCHAR", default="x"),
        DropColumn(table="s.t", column="c", key_columns=["k"]),
        RenameColumn(table="s.t", column="c", new_name="c2"),
        RetypeColumn(table="s.t", column="n", from_type="DECIMAL(18,2)", to_type="DECIMAL(20,4)"),
        SetNullability(table="s.t", column="n", nullable=False),
    ]
    for d, cols in schemas.items():
        sch = TableSchema(table="s.t", columns=[ColumnSpec(name=n, type=t, nullable=nl) for n, t, nl in cols])
        for ch in changes:
            m = generate_migration(ch, d, current_schema=sch)
            assert m.forward and m.rollback and m.checks and m.rollback_checks, (d, ch.kind)
            assert m.dialect == d and m.summary


def test_snowflake_scale_change_swaps_the_column():
    sch = TableSchema(table="s.t", columns=[ColumnSpec(name="K", type="NUMBER(38,0)", nullable=False),
                                            ColumnSpec(name="N", type="NUMBER(18,2)", nullable=False)])
    m = generate_migration(RetypeColumn(table="s.t", column="n", from_type="NUMBER(18,2)", to_type="NUMBER(20,4)"),
                           "snowflake", current_schema=sch)
    tmp = m.forward[0].split()[4]
    assert tmp.startswith("n__dw_retype_")
    assert m.forward[1:] == [
        f"UPDATE s.t SET {tmp} = CAST(n AS DECIMAL(20, 4)) WHERE TRUE",
        "ALTER TABLE s.t DROP COLUMN n",
        f"ALTER TABLE s.t RENAME COLUMN {tmp} TO n",
        "ALTER TABLE s.t ALTER COLUMN n SET NOT NULL",
    ]
    assert not m.rollback_restores_column_order
    # a precision change at the same scale is done in place
    m2 = generate_migration(RetypeColumn(table="s.t", column="n", from_type="NUMBER(18,2)", to_type="NUMBER(20,2)"), "snowflake")
    assert m2.forward == ["ALTER TABLE s.t ALTER COLUMN n SET DATA TYPE DECIMAL(20, 2)"]
    assert m2.rollback == ["ALTER TABLE s.t ALTER COLUMN n SET DATA TYPE DECIMAL(18, 2)"]


def test_bigquery_widening_in_place_and_its_rollback_rebuilds():
    m = generate_migration(RetypeColumn(table="analytics.orders", column="order_id", from_type="INT64", to_type="NUMERIC"),
                           "bigquery", current_schema=BQ_ORDERS_SCHEMA)
    assert m.forward == ["ALTER TABLE analytics.orders ALTER COLUMN order_id SET DATA TYPE NUMERIC"]
    assert m.rollback[0].startswith("CREATE OR REPLACE TABLE analytics.orders (order_id INT64 NOT NULL,")
    assert "CAST(order_id AS INT64) AS order_id" in m.rollback[0]
    assert m.rollback_guards and "SAFE_CAST" in m.rollback_guards[0].sql


def test_bigquery_cannot_add_a_required_column():
    with pytest.raises(MigrationError, match="cannot add a REQUIRED column"):
        generate_migration(AddColumn(table="a.t", column="z", type="INT64", nullable=False, default=0), "bigquery")


def test_drop_needs_type_and_nullability_or_a_schema():
    with pytest.raises(MigrationError, match="type= and nullable="):
        generate_migration(DropColumn(table="s.t", column="c", key_columns=["k"]), "duckdb")


def test_change_is_checked_against_the_current_schema():
    with pytest.raises(MigrationError, match="has no column nope"):
        generate_migration(RenameColumn(table="analytics.orders", column="nope", new_name="x"), "bigquery",
                           current_schema=BQ_ORDERS_SCHEMA)
    with pytest.raises(MigrationError, match="is INT64, not from_type STRING"):
        generate_migration(RetypeColumn(table="analytics.orders", column="order_id", from_type="STRING", to_type="BYTES",
                                        allow_lossy=True, key_columns=["placed"]), "bigquery", current_schema=BQ_ORDERS_SCHEMA)
    with pytest.raises(MigrationError, match="already nullable"):
        generate_migration(SetNullability(table="analytics.orders", column="amount", nullable=True), "bigquery",
                           current_schema=BQ_ORDERS_SCHEMA)


def test_unsupported_dialect_refused():
    with pytest.raises(MigrationError, match="unsupported dialect 'postgres'"):
        generate_migration(RenameColumn(table="s.t", column="a", new_name="b"), "postgres")


# -- lossy retypes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("from_type", "to_type", "dialect", "reason"),
    [
        ("INTEGER", "BIGINT", "duckdb", None),
        ("BIGINT", "INTEGER", "duckdb", "narrowing"),
        ("BIGINT", "INTEGER", "snowflake", None),  # both NUMBER(38,0) on Snowflake
        ("DECIMAL(10,4)", "DECIMAL(12,2)", "duckdb", "decimal scale reduction"),
        ("DECIMAL(10,2)", "DECIMAL(9,2)", "snowflake", "narrowing"),
        ("DECIMAL(10,2)", "DECIMAL(12,4)", "snowflake", None),
        ("VARCHAR", "INTEGER", "duckdb", "string to number"),
        ("STRING", "DATE", "bigquery", "string to date"),
        ("VARCHAR(20)", "VARCHAR(10)", "snowflake", "narrowing"),
        ("VARCHAR(10)", "VARCHAR(20)", "snowflake", None),
        ("VARCHAR(20)", "VARCHAR(10)", "duckdb", None),  # DuckDB does not enforce VARCHAR(n)
        ("INT64", "NUMERIC", "bigquery", None),
        ("INT64", "BIGNUMERIC", "bigquery", None),
        ("INT64", "FLOAT64", "bigquery", "2**53"),
        ("INTEGER", "DOUBLE", "duckdb", None),
        ("NUMERIC(10, 2)", "FLOAT64", "bigquery", None),
        ("DECIMAL(18,2)", "DOUBLE", "duckdb", "precision"),
        ("DOUBLE", "DECIMAL(38,10)", "duckdb", "float to decimal"),
        ("DATE", "TIMESTAMP", "duckdb", None),
        ("TIMESTAMP", "DATE", "duckdb", "drops the time of day"),
        ("TIMESTAMP", "TIMESTAMPTZ", "duckdb", "time zone"),
        ("INTEGER", "VARCHAR", "duckdb", None),
        ("DECIMAL(18,2)", "DECIMAL(18,0)", "bigquery", "decimal scale reduction"),
        ("BOOLEAN", "INTEGER", "duckdb", None),
    ],
)
def test_classify_retype(from_type, to_type, dialect, reason):
    r = classify_retype(from_type, to_type, dialect)
    if reason is None:
        assert not r.lossy, r.reasons
    else:
        assert r.lossy and any(reason in x for x in r.reasons), r.reasons


def test_lossy_retype_refused_unless_allowed_with_keys():
    change = RetypeColumn(table="s.t", column="amount", from_type="DECIMAL(18,2)", to_type="DECIMAL(18,0)")
    with pytest.raises(LossyRetypeError, match="lossy: decimal scale reduction") as e:
        generate_migration(change, "duckdb")
    assert e.value.reasons == ["decimal scale reduction: 2 to 0 digits after the point rounds values"]
    with pytest.raises(LossyRetypeError, match="string to number"):
        generate_migration(RetypeColumn(table="s.t", column="c", from_type="VARCHAR", to_type="INTEGER"), "snowflake")
    with pytest.raises(MigrationError, match="needs key_columns"):
        generate_migration(change.model_copy(update={"allow_lossy": True}), "duckdb")
    m = generate_migration(change.model_copy(update={"allow_lossy": True, "key_columns": ["k"]}), "duckdb")
    assert m.backup_table and m.forward[0].startswith(f"CREATE TABLE {m.backup_table} AS SELECT k, amount FROM s.t")
    assert m.cleanup == [f"DROP TABLE IF EXISTS {m.backup_table}"]


def test_same_type_is_not_a_retype():
    with pytest.raises(MigrationError, match="same type on bigquery"):
        generate_migration(RetypeColumn(table="d.t", column="c", from_type="INTEGER", to_type="INT64"), "bigquery")


# -- hostile identifiers -----------------------------------------------------------------------

HOSTILE = ["a`b", "x\\y", "line\nbreak", "nul\x00", "", "a" * 300]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_identifiers_refused(name):
    with pytest.raises(pydantic.ValidationError, match="not a usable SQL identifier|1 to 3 dot-separated"):
        AddColumn(table="s.t", column=name, type="INT")
    with pytest.raises(pydantic.ValidationError):
        SetNullability(table=f"s.{name}", column="c", nullable=True)
    with pytest.raises(pydantic.ValidationError):
        RenameColumn(table="s.t", column="c", new_name=name)
    with pytest.raises(pydantic.ValidationError):
        DropColumn(table="s.t", column="c", key_columns=[name])
    # models built without validation are refused by the generator itself
    with pytest.raises(UnsafeIdentifierError):
        generate_migration(RenameColumn.model_construct(table="s.t", column=name, new_name="x"), "duckdb")


@pytest.mark.parametrize("bad_type", ["INT; DROP TABLE victim", "INT) ; DROP TABLE victim; --", "VARCHAR(10) NOT NULL",
                                      "no_such_type", "INT DEFAULT 1"])
def test_hostile_or_unknown_types_refused(bad_type):
    with pytest.raises(MigrationError, match="type"):
        generate_migration(AddColumn(table="s.t", column="c", type=bad_type), "duckdb")


def test_quotable_odd_names_are_quoted_not_executed(duck):
    duck.execute("CREATE SCHEMA s")
    create_table(duck, "s.victim", [("k", "INTEGER", True)], [(1,)])
    create_table(duck, "s.t", [("k", "INTEGER", False)], [(1,), (2,)])
    odd = 'x"; DROP TABLE s.victim; --'
    odd2 = "y'); DROP TABLE s.victim; --"
    start = schema_snapshot(duck, "s.t"), checksum(duck, "s.t", ["k"])
    for change in (AddColumn(table="s.t", column=odd, type="VARCHAR", default="v"),):
        m = generate_migration(change, "duckdb")
        assert '"x""; DROP TABLE s.victim; --"' in m.forward[0]
        apply_migration(duck, m)
        assert verify_migration(duck, m) == []
        r = generate_migration(RenameColumn(table="s.t", column=odd, new_name=odd2), "duckdb")
        apply_migration(duck, r)
        assert verify_migration(duck, r) == []
        apply_migration(duck, r, "rollback")
        apply_migration(duck, m, "rollback")
        assert_round_trip(duck, "s.t", m, *start)
    assert duck.fetch_all("SELECT COUNT(*) FROM s.victim") == [(1,)]


# -- DuckDB round trips and guards -------------------------------------------------------------


def test_relax_then_rollback_refused_while_nulls_then_restored(duck, orders):
    start = schema_snapshot(duck, orders), checksum(duck, orders, [c for c, _, _ in ORDERS_COLUMNS])
    m = generate_migration(SetNullability(table=orders, column="shipping_country", nullable=True), "duckdb")
    apply_migration(duck, m)
    assert verify_migration(duck, m) == []
    insert_rows(duck, orders, ["order_id", "shipping_country"], [(6, None), (7, None)])  # gift cards: no country
    with pytest.raises(MigrationRefused) as e:
        apply_migration(duck, m, "rollback")
    assert str(e.value) == (
        "refused: 2 row(s) of analytics.orders hold NULL in shipping_country (written after the relax); "
        "NOT NULL cannot be re-imposed while NULLs exist. Backfill or delete those rows first."
    )
    assert e.value.rows == 2
    assert verify_migration(duck, m) == []  # nothing ran
    delete_where(duck, orders, exp.column("order_id").isin(6, 7))
    apply_migration(duck, m, "rollback")
    assert verify_migration(duck, m, "rollback") == []
    assert_round_trip(duck, orders, m, *start)
    with pytest.raises(DatabaseError, match="NOT NULL constraint"):
        insert_rows(duck, orders, ["order_id", "shipping_country"], [(8, None)])


def test_check_sql_runs_and_returns_the_column(duck, orders):
    m = generate_migration(SetNullability(table=orders, column="shipping_country", nullable=True), "duckdb")
    assert duck.fetch_all(m.checks[0].sql) == [("shipping_country", "VARCHAR", "NO")]
    apply_migration(duck, m)
    assert duck.fetch_all(m.checks[0].sql) == [("shipping_country", "VARCHAR", "YES")]


def test_verify_reports_what_did_not_happen(duck, orders):
    m = generate_migration(RenameColumn(table=orders, column="qty", new_name="quantity"), "duckdb")
    assert verify_migration(duck, m) == [
        "qty no longer exists: analytics.orders.qty still exists",
        "quantity exists: analytics.orders.quantity does not exist",
    ]


def test_drop_refused_when_keys_do_not_identify_rows(duck, orders):
    m = generate_migration(DropColumn(table=orders, column="qty", key_columns=["shipping_country"]), "duckdb",
                           current_schema=read_table_schema(duck, orders))
    with pytest.raises(MigrationRefused, match=r"1 key value\(s\) are duplicated or NULL"):
        apply_migration(duck, m)
    assert read_table_schema(duck, orders).column("qty", "duckdb") is not None


def test_drop_of_a_not_null_column_refuses_rollback_for_rows_written_since(duck, orders):
    start = schema_snapshot(duck, orders), checksum(duck, orders, [c for c, _, _ in ORDERS_COLUMNS])
    m = generate_migration(DropColumn(table=orders, column="shipping_country", key_columns=["order_id"]), "duckdb",
                           current_schema=read_table_schema(duck, orders))
    apply_migration(duck, m)
    assert verify_migration(duck, m) == []
    insert_rows(duck, orders, ["order_id"], [(9,)])
    with pytest.raises(MigrationRefused, match=r"1 row\(s\) of analytics.orders were written after shipping_country was dropped"):
        apply_migration(duck, m, "rollback")
    delete_where(duck, orders, exp.column("order_id").eq(9))
    apply_migration(duck, m, "rollback")
    assert verify_migration(duck, m, "rollback") == []
    assert not m.rollback_restores_column_order
    assert_round_trip(duck, orders, m, *start)
    assert duck.fetch_all(f"SELECT COUNT(*) FROM information_schema.tables WHERE table_name = '{m.backup_table.split('.')[-1]}'") == [(0,)]


def test_retype_rollback_refused_when_new_values_do_not_fit(duck, orders):
    m = generate_migration(RetypeColumn(table=orders, column="qty", from_type="INTEGER", to_type="BIGINT"), "duckdb")
    apply_migration(duck, m)
    assert verify_migration(duck, m) == []
    insert_rows(duck, orders, ["order_id", "shipping_country", "qty"], [(10, "NL", 2**40)])
    with pytest.raises(MigrationRefused, match=r"1 value\(s\) of analytics.orders.qty written since the retype do not fit INTEGER"):
        apply_migration(duck, m, "rollback")


def test_lossy_retype_forward_refused_when_values_cannot_be_cast(duck, orders):
    m = generate_migration(RetypeColumn(table=orders, column="shipping_country", from_type="VARCHAR", to_type="INTEGER",
                                        allow_lossy=True, key_columns=["order_id"]), "duckdb")
    with pytest.raises(MigrationRefused, match=r"5 value\(s\) of analytics.orders.shipping_country cannot be cast to INTEGER"):
        apply_migration(duck, m)


def test_apply_refuses_a_migration_for_another_dialect(duck, orders):
    m = generate_migration(RenameColumn(table=orders, column="qty", new_name="q"), "snowflake")
    with pytest.raises(MigrationError, match="for snowflake, the database is duckdb"):
        apply_migration(duck, m)


def test_read_table_schema_of_a_missing_table(duck):
    with pytest.raises(CatalogError, match="not found"):
        read_table_schema(duck, "main.nope")


def test_guard_message_with_braces_in_names(duck):
    duck.execute("CREATE SCHEMA s")
    create_table(duck, "s.t", [("k", "INTEGER", False), ("c{0}", "VARCHAR", False)], [(1, "a")])
    m = generate_migration(SetNullability(table="s.t", column="c{0}", nullable=True), "duckdb")
    apply_migration(duck, m)
    insert_rows(duck, "s.t", ["k", "c{0}"], [(2, None)])
    with pytest.raises(MigrationRefused, match=r"^refused: 1 row\(s\) of s.t hold NULL in c\{0\} \(written after the relax\)"):
        apply_migration(duck, m, "rollback")
