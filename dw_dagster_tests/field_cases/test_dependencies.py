"""Field cases of objects that depend on what a change touches: a column migration on a table a
view reads (DuckDB files, the migrations' engine in this suite; the view is real and is queried
before and after)."""

import pytest

from dw_dagster.changes.migrations import (
    DropColumn,
    MigrationRefused,
    RenameColumn,
    RetypeColumn,
    apply_migration,
    generate_migration,
    read_table_schema,
)
from dw_dagster_tests.field_cases.kinds import kind

A = "dw_dagster/changes/migrations/apply.py"
KINDS = [
    kind("dep-drop-column-view", "dependencies", "dropping a column a view reads", "https://github.com/stripe/pg-schema-diff/issues/181",
         A, "test_drop_of_a_column_a_view_reads_is_refused", True),
    kind("dep-rename-column-view", "dependencies", "renaming a column a view reads (including through SELECT *)",
         "https://github.com/cockroachdb/cockroach/pull/17280", A, "test_rename_of_a_column_a_view_reads_is_refused", True),
    kind("dep-retype-column-view", "dependencies", "retyping a column a view compares to another family of types",
         "https://github.com/stripe/pg-schema-diff/issues/280", A, "test_retype_across_families_under_a_view_is_refused", True),
    kind("dep-bigquery-dataset-views", "dependencies", "views of a BigQuery table (no unqualified information_schema there)",
         "https://cloud.google.com/bigquery/docs/information-schema-views", A,
         "test_bigquery_lists_views_from_the_tables_dataset", True),
]


@pytest.fixture
def orders(tmp_path):
    from dw_dagster.databases import DuckDBDatabase

    db = DuckDBDatabase(tmp_path / "m.duckdb")
    db.execute("CREATE TABLE orders (id INTEGER, amount INTEGER, note VARCHAR)")
    db.execute("INSERT INTO orders VALUES (1, 10, 'a'), (2, 3, 'b')")
    db.execute("CREATE VIEW big_orders AS SELECT id, amount FROM orders WHERE amount > 5")
    return db


def _migrate(db, change, **kw):
    m = generate_migration(change, "duckdb", current_schema=read_table_schema(db, "orders"))
    apply_migration(db, m, **kw)
    return m


def test_drop_of_a_column_a_view_reads_is_refused(orders):
    """pg-schema-diff #181 (https://github.com/stripe/pg-schema-diff/issues/181): dropping a column
    a view uses. PostgreSQL refuses; DuckDB (and Snowflake, BigQuery) drop it and the view breaks
    the next time anyone reads it. Right answer: refused before anything runs, naming the view;
    the table and the view are as they were; a column no view reads is dropped."""
    before = orders.fetch_all("SELECT * FROM big_orders ORDER BY id")
    with pytest.raises(MigrationRefused, match=r"1 view\(s\) read orders.amount.*main.big_orders"):
        _migrate(orders, DropColumn(table="orders", column="amount", key_columns=["id"]))
    assert orders.fetch_all("SELECT * FROM big_orders ORDER BY id") == before == [(1, 10)]
    _migrate(orders, DropColumn(table="orders", column="note", key_columns=["id"]))
    assert [c.name for c in read_table_schema(orders, "orders").columns] == ["id", "amount"]


def test_rename_of_a_column_a_view_reads_is_refused(orders):
    """cockroach PR #17280 (https://github.com/cockroachdb/cockroach/pull/17280): schema changes
    under a view left it broken (dropping, and renaming, columns it depends on). A view over
    ``SELECT *`` depends on every column. Right answer: refused, naming both views; with
    ``allow_breaking_views`` it runs (and the view is then the user's to fix)."""
    orders.execute("CREATE VIEW all_orders AS SELECT * FROM orders")
    change = RenameColumn(table="orders", column="note", new_name="comment")
    with pytest.raises(MigrationRefused, match=r"read orders.note.*main.all_orders"):
        _migrate(orders, change)
    _migrate(orders, change, allow_breaking_views=True)
    assert "comment" in [c.name for c in read_table_schema(orders, "orders").columns]


def test_retype_across_families_under_a_view_is_refused(orders):
    """pg-schema-diff #280 (https://github.com/stripe/pg-schema-diff/issues/280): changing the type
    of a column a view depends on. On DuckDB ``amount`` INTEGER → VARCHAR succeeds and the view's
    ``amount > 5`` then fails (or, on engines that cast, compares text). Right answer: refused,
    naming the view; INTEGER → BIGINT (same family) runs and the view answers the same rows."""
    with pytest.raises(MigrationRefused, match="main.big_orders"):
        _migrate(orders, RetypeColumn(table="orders", column="amount", from_type="INTEGER", to_type="VARCHAR",
                                      key_columns=["id"], allow_lossy=True))
    before = orders.fetch_all("SELECT * FROM big_orders ORDER BY id")
    _migrate(orders, RetypeColumn(table="orders", column="amount", from_type="INTEGER", to_type="BIGINT", key_columns=["id"]))
    assert orders.fetch_all("SELECT * FROM big_orders ORDER BY id") == before


def test_bigquery_lists_views_from_the_tables_dataset():
    """BigQuery has no unqualified ``information_schema.views`` (a query naming it fails, and the
    migration then ran as if no view existed): the views of the table's dataset are read from
    ``project.dataset.INFORMATION_SCHEMA.VIEWS``
    (https://cloud.google.com/bigquery/docs/information-schema-views). The query must parse as BigQuery SQL."""
    import sqlglot

    from dw_dagster.changes.migrations.apply import _views_query

    class _BQ:
        dialect, project, dataset = "bigquery", "acme-dw", "sales"

    assert _views_query(_BQ(), "orders").endswith("FROM `acme-dw`.`sales`.INFORMATION_SCHEMA.VIEWS")
    assert _views_query(_BQ(), "shop.orders").endswith("FROM `acme-dw`.`shop`.INFORMATION_SCHEMA.VIEWS")
    assert _views_query(_BQ(), "p2.shop.orders").endswith("FROM `p2`.`shop`.INFORMATION_SCHEMA.VIEWS")
    for q in (_views_query(_BQ(), "orders"), _views_query(_BQ(), "p2.shop.orders")):
        sqlglot.parse_one(q, read="bigquery")
