-- Added by dw-dagster change set cs-3f9a1c0d2e (unique_merge_key): every id of app.orders is held by one row.
-- A singular test: it passes when the query returns no row.
SELECT
  id,
  COUNT(*) AS copies
FROM app.orders
GROUP BY
  id
HAVING
  COUNT(*) > 1
