-- Gross merchandise value per order date, currency and payment method, from the orders stream
-- landed in analytics.orders (amounts in the order's currency; no conversion).
select
    cast(order_ts as date) as order_date,
    currency,
    payment_method,
    count(*) as order_count,
    sum(amount) as gmv
from {{ source('analytics', 'orders') }}
group by cast(order_ts as date), currency, payment_method
