from dw_dagster.checks.reconcile import slice_aggregate_sql
from dw_dagster.databases.informix_dialect import to_informix

# what the reconciliation sends to an Informix source, with and without DELIMIDENT
print(slice_aggregate_sql("pos.sales_line", ["region"], ["net_sales"], "informix", quote=True))
print(slice_aggregate_sql("pos.sales_line", ["region"], ["net_sales"], "informix, delimident=false", quote=True))
print(to_informix("SELECT sale_ts + INTERVAL 72 HOUR FROM pos.sales_line WHERE glob(region, 'South*') LIMIT 10"))
# SELECT FIRST 10 sale_ts + INTERVAL (72) HOUR(2) TO HOUR FROM pos.sales_line WHERE region MATCHES 'South*'
