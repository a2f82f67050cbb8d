-- Daily totals per region, as the Store P&L workbook shows them.
select
    region,
    sale_date,
    count(*) as store_count,
    sum(line_count) as line_count,
    sum(net_sales) as net_sales
from {{ ref('fct_store_sales_daily') }}
group by region, sale_date
