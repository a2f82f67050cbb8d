dw-dagster migration plan --source-url duckdb:///pos_source.duckdb --schema pos --manifest dbt_project/target/manifest.json --budget-mb 2048 --domain store_sales
