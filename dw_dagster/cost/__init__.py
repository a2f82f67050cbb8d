"""What each model, asset, run and repair costs: Snowflake credits, BigQuery bytes billed, seconds.

:class:`~dw_dagster.cost.models.CostReport` is one period on one engine, reconciled to its meter
(attributed + idle + unattributed = metered). Sources: :class:`~dw_dagster.cost.snowflake.SnowflakeCost`
(account usage views), :class:`~dw_dagster.cost.bigquery.BigQueryCost` (``INFORMATION_SCHEMA.JOBS``),
:class:`~dw_dagster.cost.timings.DagsterTimingCost` (Dagster step and dbt node timings, for DuckDB and
engines without billing). See ``docs/guides/cost.md``.
"""

from dw_dagster.cost.models import DIMENSIONS, TOLERANCE, CostError, CostReport, Period

__all__ = ["DIMENSIONS", "TOLERANCE", "CostError", "CostReport", "Period"]
