-- Month-to-date GMV per currency, as finance closes it.
select
    date_trunc('month', order_date) as gmv_month,
    currency,
    max(order_date) as through_date,
    sum(order_count) as order_count,
    sum(gmv) as gmv
from {{ ref('fct_daily_gmv') }}
group by date_trunc('month', order_date), currency
