-- Month-to-date totals per region.
select
    region,
    date_trunc('month', sale_date) as sales_month,
    max(sale_date) as through_date,
    sum(line_count) as line_count,
    sum(net_sales) as net_sales
from {{ ref('region_sales_daily') }}
group by region, date_trunc('month', sale_date)
