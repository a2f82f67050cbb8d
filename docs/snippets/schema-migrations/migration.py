from dw_dagster import database_from_url
from dw_dagster.changes.migrations import SetNullability, apply_migration, generate_migration
from dw_dagster.databases.catalog import read_table_schema

db = database_from_url("duckdb:///warehouse.duckdb")  # or bigquery://acme-dw/analytics, snowflake://...
m = generate_migration(SetNullability(table="analytics.orders", column="shipping_country", nullable=True),
                       db.dialect, current_schema=read_table_schema(db, "analytics.orders"))
print(m.forward)   # ['ALTER TABLE analytics.orders ALTER COLUMN shipping_country DROP NOT NULL']
print(m.rollback)  # ['ALTER TABLE analytics.orders ALTER COLUMN shipping_country SET NOT NULL']
apply_migration(db, m)                # guards, then statements
apply_migration(db, m, "rollback")    # refused with a count while shipping_country holds NULLs
