-- One row per store and sale date: line count and exact net sales.
select
    store_id,
    region,
    cast(sale_ts as date) as sale_date,
    count(*) as line_count,
    sum(net_sales) as net_sales
from {{ source('pos', 'sales_line') }}
group by store_id, region, cast(sale_ts as date)
