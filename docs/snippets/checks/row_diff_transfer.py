import os

from dw_dagster import build_row_diff_check, database_from_url
from dw_dagster.checks.rowdiff import row_diff_across
from dw_dagster.databases import DuckDBDatabase

# As an asset check: the path is chosen each time it runs ("auto": a measured probe of the PostgreSQL side).
orders_diff = build_row_diff_check(
    asset="orders", source_asset=None, source_table="sales_src.orders", target_table="sales_src.orders",
    key_columns=["order_id"], source_resource_key="shop_pg", target_resource_key="warehouse",
    transfer="auto",  # or "stream" (a LAN: every row read once) / "bisect" (a WAN: only differing buckets' rows)
)

# Called directly, the result says which path ran and how many bytes crossed.
source, warehouse = database_from_url(os.environ["SHOP_PG_URL"]), DuckDBDatabase("warehouse.duckdb")
for transfer in ("stream", "bisect"):
    result = row_diff_across(source, warehouse, "sales_src.orders", "sales_src.orders", ["order_id"], transfer=transfer)
    print(result.transfer, result.bytes_fetched, result.missing, result.extra, result.changed)
