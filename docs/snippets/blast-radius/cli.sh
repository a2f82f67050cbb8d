dw-dagster blast-radius --manifest target/manifest.json --select fct_store_sales_daily [--json]
