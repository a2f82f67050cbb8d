import dagster as dg
from dw_dagster import DatabaseResource, build_reconciliation_checks, build_volume_check

region_compare = build_reconciliation_checks(
    name="region_compare", asset="store_sales_line", source_asset=["pos_source", "sales_line"],
    source_table="pos.sales_line", target_table="pos.sales_line",
    slice_by=["region"], measures=["net_sales"], key_columns=["sales_line_id"],
    source_resource_key="pos_source", target_resource_key="warehouse", blocking=True,
)
daily_volume = build_volume_check(asset="store_sales_line", table="pos.sales_line", timestamp_column="sale_ts")

defs = dg.Definitions(
    asset_checks=[region_compare, daily_volume],
    resources={"pos_source": DatabaseResource(url=dg.EnvVar("POS_SOURCE_URL")),
               "warehouse": DatabaseResource(url="duckdb:///warehouse.duckdb")},
)
