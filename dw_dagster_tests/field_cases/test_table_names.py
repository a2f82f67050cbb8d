"""Field cases of table names written with SQL quotes: a part in double quotes is that name exactly, its dots,
hyphens, spaces and case included. Before, a name string was split on every dot and a quoted part kept its
quotes as part of the name, so ``'"my-dw".main."Order Lines"'`` was found by neither diff path."""

import uuid

import pytest
import sqlalchemy as sa

from dw_dagster.checks.rowdiff import row_diff, row_diff_across
from dw_dagster.databases import DuckDBDatabase, SqlAlchemyDatabase, sql
from dw_dagster.databases.sql import UnsafeIdentifierError
from dw_dagster.databases.catalog import read_table_schema
from dw_dagster_tests.conftest import POSTGRES_URL
from dw_dagster_tests.field_cases.kinds import kind

S = "dw_dagster/databases/sql.py"
KINDS = [
    kind("rd-quoted-table-name", "vendors", "a table named with quoted parts (a catalog with a hyphen, a schema with a "
         "dot, a table with a space) in a diff", "https://github.com/pavlospt/rust-pgdatadiff/issues/69", S,
         "test_quoted_table_names_diff_on_every_path", True),
    kind("rd-quoted-mixed-case-snowflake", "vendors", "a mixed-case table created quoted on Snowflake, looked up "
         "upper-cased in the catalog and reported missing", "https://github.com/datafold/data-diff/issues/640",
         "dw_dagster/databases/catalog.py", "test_a_quoted_mixed_case_snowflake_table_is_found_as_written", True),
]


@pytest.fixture
def files(tmp_path):
    source, target = DuckDBDatabase(tmp_path / "my-dw.duckdb"), DuckDBDatabase(tmp_path / "copy.duckdb")
    for db, n in ((source, 100), (target, 99)):
        db.execute('CREATE SCHEMA "Sales.EU"')
        db.execute(f'CREATE TABLE "Sales.EU"."Order Lines" AS SELECT range AS id, range * 2 AS v FROM range({n})')
    return source, target


@pytest.fixture
def pg_schema():
    name = f"Sales.EU {uuid.uuid4().hex[:6]}"
    engine = sa.create_engine(POSTGRES_URL)
    with engine.begin() as c:
        c.exec_driver_sql(f'CREATE SCHEMA "{name}"')
        c.exec_driver_sql(f'CREATE TABLE "{name}"."Order Lines" AS SELECT g AS id, g * 2 AS v FROM generate_series(0, 99) g')
    yield name
    with engine.begin() as c:
        c.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')
    engine.dispose()


def test_quoted_table_names_diff_on_every_path(files, pg_schema):
    """rust-pgdatadiff #69 (https://github.com/pavlospt/rust-pgdatadiff/issues/69): a table with a dash reported
    as missing; here a catalog with a hyphen, a schema
    with a dot and a table with a space, on the in-database diff, DuckDB to DuckDB, and PostgreSQL to DuckDB
    on the stream and the bisect paths: one key missing, every time."""
    source, target = files
    full = '"my-dw"."Sales.EU"."Order Lines"'
    assert row_diff(source, full, '"Sales.EU"."Order Lines"', ["id"]).missing == 0
    assert row_diff_across(source, target, full, '"Sales.EU"."Order Lines"', ["id"]).missing == 1
    pg = SqlAlchemyDatabase(POSTGRES_URL)
    for transfer in ("stream", "bisect"):
        result = row_diff_across(pg, target, f'"{pg_schema}"."Order Lines"', '"Sales.EU"."Order Lines"', ["id"],
                                 transfer=transfer)
        assert (result.missing, result.extra, result.transfer) == (1, 0, transfer)


def test_quotes_that_do_not_make_whole_parts_are_part_of_the_name(tmp_path):
    """A name such as ``a"b`` (a table literally named so) is split on its dots as written, as before; only
    double quotes that open and close whole parts are SQL quoting."""
    assert sql.split_table('"a""b".c') == [('a"b', True), ("c", False)]
    assert sql.split_table('a"b.c') == [('a"b', False), ("c", False)]
    assert sql.split_table('"a"b.c') == [('"a"b', False), ("c", False)]
    db = DuckDBDatabase(tmp_path / "odd.duckdb")
    db.execute('CREATE TABLE "a""b" AS SELECT range AS id FROM range(3)')
    assert row_diff(db, 'a"b', '"a""b"', ["id"]).missing == 0
    with pytest.raises(UnsafeIdentifierError):
        sql.table('"a".')


def test_a_quoted_mixed_case_snowflake_table_is_found_as_written(fakesnow_server):
    """data-diff #640 (https://github.com/datafold/data-diff/issues/640): with dbt's quoting on, Snowflake tables named ``"DimUser"`` were looked up as
    ``DIMUSER`` in ``information_schema`` and reported as having no columns."""
    from dw_dagster.databases.snowflake import SnowflakeDatabase
    from dw_dagster_tests.harness.emulators import FAKESNOW_DATABASE

    db = SnowflakeDatabase(**fakesnow_server, database=FAKESNOW_DATABASE)
    schema = f"T_{uuid.uuid4().hex[:8].upper()}"
    db.execute(f"CREATE SCHEMA {schema}")
    try:
        db.execute(f'CREATE TABLE {schema}."DimUser" ("UserId" INT, name VARCHAR)')
        found = read_table_schema(db, f'{schema}."DimUser"')
        assert [c.name for c in found.columns] == ["UserId", "NAME"]
    finally:
        db.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_the_dedupe_repair_runs_on_a_quoted_table_name(files):
    """The repair after the diff: a dedupe of a window of ``"Sales.EU"."Order Lines"`` keeps its copy beside the
    table (``Order Lines__dw_dedupe_<id>`` in ``Sales.EU``) and removes the second load, not the table's name."""
    import types

    import dagster as dg

    from dw_dagster.changes.dedupe import dedupe_step, run_dedupe_step

    db, _ = files
    table = '"Sales.EU"."Order Lines"'
    db.execute(f"ALTER TABLE {table} ADD COLUMN day DATE DEFAULT DATE '2026-11-02'")
    db.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE id < 10")
    step = dedupe_step(table=table, key_columns=["id"], partition_column="day", window=["2026-11-02"],
                       resource_key="warehouse", dialect="duckdb")
    out = run_dedupe_step(dg.build_op_context(), types.SimpleNamespace(id="cs-q1", undo_plan=None), step, db)
    assert (out["rows_before"], out["rows_after"], out["removed_rows"]) == (110, 100, 10)
    assert db.fetch_all(f"SELECT COUNT(*), COUNT(DISTINCT id) FROM {table}") == [(100, 100)]


def test_a_migration_keeps_its_backup_in_the_schema_of_a_quoted_table(files):
    """A column dropped from ``"Sales.EU"."Order Lines"`` is kept in ``"Sales.EU"."Order Lines__dw_backup_<id>"``,
    beside the table: before, the backup's name joined the parts with dots again and named a schema ``Sales``."""
    from dw_dagster.changes.migrations import DropColumn, apply_migration, generate_migration, verify_migration
    from dw_dagster.core.table_names import split_table

    db, _ = files
    table = '"Sales.EU"."Order Lines"'
    m = generate_migration(DropColumn(table=table, column="v", key_columns=["id"]), "duckdb",
                           current_schema=read_table_schema(db, table))
    assert [p for p, _ in split_table(m.backup_table)][:1] == ["Sales.EU"]
    apply_migration(db, m)
    assert verify_migration(db, m) == []
    assert db.fetch_all(f"SELECT COUNT(*) FROM {m.backup_table}") == [(100,)]
    apply_migration(db, m, "rollback")
    assert db.fetch_all(f"SELECT SUM(v) FROM {table}") == [(9900,)]
    assert db.fetch_all("SELECT table_schema, table_name FROM information_schema.tables ORDER BY 2") == [
        ("Sales.EU", "Order Lines")]


def test_postgres_folds_a_name_written_without_quotes(pg_schema):
    """PostgreSQL stores ``Orders_MC`` written without quotes as ``orders_mc``, and the statements dw_dagster builds
    read it so: the catalog lookup folds it the same way, and a table created quoted (``"Orders_Q"``) is that
    table only when named quoted (as in data-diff #640, with PostgreSQL's folding)."""
    pg = SqlAlchemyDatabase(POSTGRES_URL)
    pg.execute(f'CREATE TABLE "{pg_schema}".orders_mc (id INT); CREATE TABLE "{pg_schema}"."Orders_Q" (Id INT, "Qty" INT)')
    assert [c.name for c in read_table_schema(pg, f'"{pg_schema}".Orders_MC').columns] == ["id"]
    assert [c.name for c in read_table_schema(pg, f'"{pg_schema}"."Orders_Q"').columns] == ["id", "Qty"]
    with pytest.raises(Exception, match="not found"):
        read_table_schema(pg, f'"{pg_schema}".Orders_Q')


def test_a_table_has_the_same_owner_however_its_name_is_quoted():
    """A domain's table patterns are read part by part: quoting a part that needs no quotes, or naming the
    catalog of a schema with a dot, does not take a table out of its owner's domain (and so out of the
    owner's approval)."""
    from dw_dagster.core.domains import Domain

    sales = Domain(name="sales", tables=["sales.*"], approvers=["owner@example.com"])
    eu = Domain(name="eu", tables=['"Sales.EU".*'], approvers=["owner@example.com"])
    for name in ("dw.sales.orders", 'dw."sales".orders', '"SALES".orders', '"dw"."sales"."orders"'):
        assert sales.owns_table(name), name
    assert not sales.owns_table("dw.other.sales")
    assert eu.owns_table('"my-dw"."Sales.EU"."Order Lines"') and eu.owns_table('"Sales.EU".t')
    assert not eu.owns_table("sales.eu")


def test_a_bigquery_view_lookup_reads_the_project_the_catalog_reads():
    """The migration's dependent-view guard and the catalog agree on a quoted project (it looked in a project
    literally named with its quotes and found no views, so the guard was skipped without a word)."""
    import types

    from dw_dagster.changes.migrations.apply import _views_query

    db = types.SimpleNamespace(dialect="bigquery", project="other", dataset=None)
    assert _views_query(db, '"my-proj".sales.orders').endswith("`my-proj`.`sales`.INFORMATION_SCHEMA.VIEWS")


def test_a_regression_test_file_of_a_quoted_table_is_named_by_its_parts(tmp_path):
    """The dbt test a fix adds for ``"Sales.EU"."Order Lines"`` is ``dw_<kind>__sales_eu__order_lines.sql`` (no quote,
    space or dot in the file's name, which dbt makes the test's name), and the new-tests check finds it again."""
    from dw_dagster.core.table_names import table_slug
    from dw_dagster.repair.new_tests import table_tests

    assert table_slug("analytics.orders") == "analytics__orders"
    assert table_slug('"Sales.EU"."Order Lines"') == "sales_eu__order_lines"
    assert table_slug("my-dw.main.t") == "my-dw__main__t"
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / f"dw_not_null__{table_slug(chr(34) + 'Sales.EU' + chr(34) + '.t')}.sql").write_text("select 1")
    assert table_tests(tmp_path, "tests", '"Sales.EU".t') == ["tests/dw_not_null__sales_eu__t.sql"]
