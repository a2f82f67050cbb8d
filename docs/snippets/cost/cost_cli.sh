export DW_COST_URL="snowflake://user:pw@acme-xy12345/ANALYTICS?warehouse=OPS_WH"
dw-dagster cost --json --since=2026-10-01 --until=2026-11-01   # the whole report, with its SQL
dw-dagster cost --by=warehouse --manifest=target/manifest.json  # credits and idle per warehouse
dw-dagster cost --by=run --url="bigquery://acme-dw?location=EU" --region=eu --price-per-tib=6.25
dw-dagster demo cost --json                                     # both engines and a warehouse change
