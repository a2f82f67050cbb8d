-- Orders per day and payment method, with each method's share of the day's orders
-- (the "payment mix" tile of the Daily GMV dashboard).
select
    order_date,
    payment_method,
    sum(order_count) as order_count,
    round(100.0 * sum(order_count) / sum(sum(order_count)) over (partition by order_date), 3) as order_share_pct
from {{ ref('fct_daily_gmv') }}
group by order_date, payment_method
