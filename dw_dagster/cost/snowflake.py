"""Snowflake credits per query, reconciled to metering, in one pushed-down statement.

For each warehouse and hour, the hour's metered compute credits
(``WAREHOUSE_METERING_HISTORY.CREDITS_USED_COMPUTE``) are divided among the queries that executed
on that warehouse in that hour, in proportion to each query's execution milliseconds inside the
hour. Execution starts after the queued (provisioning, repair, overload) and compilation times
``QUERY_HISTORY`` reports and ends at ``END_TIME``; a query spanning hours gets a share of each
(so a query's share does not depend on the report's period, CodyAustinDavis/dbsql_sme#11). Hours
with credits and no query are *idle*, reported per warehouse and never spread. A query's cloud
services credits count only in the proportion billed that day
(``METERING_DAILY_HISTORY``: ``(CREDITS_USED_CLOUD_SERVICES + CREDITS_ADJUSTMENT_CLOUD_SERVICES) /
CREDITS_USED_CLOUD_SERVICES``; nothing is billed on a day under the 10 % allowance).
``QUERY_ATTRIBUTION_HISTORY``, which leaves out short queries (dbt-labs/docs.getdbt.com#9580), is
reported beside the allocation, never instead of it.

Reconciliation: metered is ``SUM(CREDITS_BILLED)`` of ``WAREHOUSE_METERING`` days in the period;
unattributed is the queries that map to nothing plus what the meter holds that no query explains:
daily compute the hourly rows do not hold, billed cloud services no query used, and the
allocation's floating-point remainder. Each part is in ``unattributed_detail``.

Times are compared as stored (naive): run with the session's ``TIMEZONE`` = ``UTC``
(``session_parameters={"TIMEZONE": "UTC"}``), as Snowflake asks for reconciling these views.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from dw_dagster.cost import mapping as m
from dw_dagster.cost import sqlbuild as sb
from dw_dagster.cost.models import CostError, CostReport, Period
from dw_dagster.databases import Database, DatabaseError, sql


def _rx(col: str, pattern: str) -> str:
    # NULLIF: DuckDB's regexp_extract gives '' where Snowflake's REGEXP_SUBSTR gives NULL
    return f"NULLIF(REGEXP_SUBSTR({col}, '{pattern}', 1, 1, 'e', 1), '')"


def _tag(key: str) -> str:
    """The tag's value first, then dw_dagster's (or dbt's) comment."""
    return f"COALESCE({_rx('query_tag', m.json_pattern(key))}, {_rx('query_text', m.comment_pattern(key))})"


_NODE = f"COALESCE({_rx('query_text', m.comment_pattern(m.KEYS['node']))}, {_rx('query_tag', m.json_pattern(m.KEYS['node']))})"
_INVOCATION = (f"COALESCE({_rx('query_tag', m.json_pattern(m.KEYS['invocation']))}, "
               f"{_rx('query_tag', m.json_pattern(m.KEYS['invocation_alt']))}, "
               f"{_rx('query_text', m.comment_pattern(m.KEYS['invocation_alt']))})")

#: the report statement (Snowflake dialect); ``na``, ``ir`` and ``qah`` are put in front of it
TEMPLATE = f"""
WITH hours AS (
  SELECT warehouse_name AS wh, start_time AS h_start, DATEADD(HOUR, 1, start_time) AS h_end,
         CAST(COALESCE(credits_used_compute, 0) AS DOUBLE) AS credits
  FROM :wmh
  WHERE start_time >= :since AND start_time < :until AND COALESCE(credits_used_compute, 0) <> 0
), q AS (
  SELECT query_id, warehouse_name AS wh, end_time,
         DATEADD(MILLISECOND, COALESCE(queued_provisioning_time, 0) + COALESCE(queued_repair_time, 0)
                 + COALESCE(queued_overload_time, 0) + COALESCE(compilation_time, 0), start_time) AS exec_start,
         TO_DATE(start_time) AS day,
         IFF(start_time >= :since, CAST(COALESCE(credits_used_cloud_services, 0) AS DOUBLE), 0) AS cs,
         {_NODE} AS node_raw, {_tag(m.KEYS['run'])} AS run_tag, {_tag(m.KEYS['asset'])} AS asset_tag,
         {_tag(m.KEYS['partition'])} AS partition_tag, {_INVOCATION} AS invocation
  FROM :qh
  WHERE start_time >= DATEADD(DAY, -2, :since) AND start_time < :until AND end_time > :since
), qh AS (
  SELECT q.query_id, h.wh, h.h_start, h.credits,
         GREATEST(0, TIMESTAMPDIFF(MILLISECOND, GREATEST(q.exec_start, h.h_start), LEAST(q.end_time, h.h_end))) AS ms
  FROM q JOIN hours AS h ON h.wh = q.wh AND q.exec_start < h.h_end AND q.end_time > h.h_start
), hq AS (
  SELECT query_id, wh, h_start, credits, ms, SUM(ms) OVER (PARTITION BY wh, h_start) AS hour_ms FROM qh
), qc AS (
  SELECT query_id, SUM(IFF(hour_ms > 0, credits * ms / hour_ms, 0)) AS compute FROM hq GROUP BY query_id
), busy AS (
  SELECT wh, h_start FROM hq WHERE hour_ms > 0 GROUP BY wh, h_start
), idle AS (
  SELECT h.wh, SUM(h.credits) AS credits, COUNT(*) AS hours
  FROM hours AS h LEFT JOIN busy AS b ON b.wh = h.wh AND b.h_start = h.h_start
  WHERE b.h_start IS NULL GROUP BY h.wh
), daily AS (
  SELECT usage_date AS day,
         SUM(CAST(COALESCE(credits_used_compute, 0) AS DOUBLE)) AS compute,
         SUM(CAST(COALESCE(credits_used_cloud_services, 0) AS DOUBLE)) AS cs_used,
         SUM(CAST(COALESCE(credits_adjustment_cloud_services, 0) AS DOUBLE)) AS cs_adj,
         SUM(CAST(COALESCE(credits_billed, 0) AS DOUBLE)) AS billed
  FROM :mdh
  WHERE service_type = 'WAREHOUSE_METERING' AND usage_date >= :since_day AND usage_date < :until_day
  GROUP BY usage_date
), ratio AS (
  SELECT day, IFF(cs_used > 0, (cs_used + cs_adj) / cs_used, 0) AS r FROM daily
), pm AS (
  SELECT q.query_id, q.wh, q.node_raw AS node_id, COALESCE(q.asset_tag, na.asset_key) AS asset,
         COALESCE(q.run_tag, ir.run_id) AS run_id, q.partition_tag AS part,
         COALESCE(qc.compute, 0) + q.cs * COALESCE(ratio.r, 0) AS credits,
         q.cs * COALESCE(ratio.r, 0) AS cs_billed, qah.credits AS qah_credits,
         IFF(q.node_raw IS NOT NULL OR q.asset_tag IS NOT NULL OR q.run_tag IS NOT NULL OR ir.run_id IS NOT NULL,
             'attributed', 'unattributed') AS mapped,
         IFF(qah.query_id IS NULL, 'missing', 'present') AS in_qah
  FROM q LEFT JOIN qc ON qc.query_id = q.query_id
    LEFT JOIN ratio ON ratio.day = q.day
    LEFT JOIN na ON na.node_id = q.node_raw
    LEFT JOIN ir ON ir.invocation_id = q.invocation
    LEFT JOIN qah ON qah.query_id = q.query_id
)
SELECT CASE WHEN GROUPING(part) = 0 THEN 'partition' WHEN GROUPING(node_id) = 0 THEN 'model'
            WHEN GROUPING(asset) = 0 THEN 'asset' WHEN GROUPING(run_id) = 0 THEN 'run'
            WHEN GROUPING(wh) = 0 THEN 'warehouse' WHEN GROUPING(mapped) = 0 THEN 'mapped' ELSE 'qah' END AS dim,
       CASE WHEN GROUPING(part) = 0 THEN asset || CHR(31) || part
            ELSE COALESCE(node_id, asset, run_id, wh, mapped, in_qah) END AS key,
       SUM(credits) AS amount, COUNT(*) AS queries, SUM(qah_credits) AS beside, SUM(cs_billed) AS cs
FROM pm GROUP BY GROUPING SETS ((node_id), (asset), (run_id), (wh), (mapped), (in_qah), (asset, part))
UNION ALL SELECT 'idle', wh, credits, hours, NULL, NULL FROM idle
UNION ALL SELECT 'total', 'metered', SUM(billed), COUNT(*), NULL, NULL FROM daily
UNION ALL SELECT 'total', 'compute_daily', SUM(compute), COUNT(*), NULL, NULL FROM daily
UNION ALL SELECT 'total', 'cs_used', SUM(cs_used), COUNT(*), NULL, NULL FROM daily
UNION ALL SELECT 'total', 'cs_adjustment', SUM(cs_adj), COUNT(*), NULL, NULL FROM daily
UNION ALL SELECT 'total', 'compute_hourly', SUM(credits), COUNT(*), NULL, NULL FROM hours
"""

_QAH = """
SELECT query_id, SUM(CAST(COALESCE(credits_attributed_compute, 0) AS DOUBLE)
                     + CAST(COALESCE(credits_used_query_acceleration, 0) AS DOUBLE)) AS credits
FROM :qah WHERE start_time >= DATEADD(DAY, -2, :since) AND start_time < :until GROUP BY query_id
"""


@dataclass
class SnowflakeCost:
    """Snowflake's account usage views as a cost source.

    Args:
        db: a :class:`~dw_dagster.databases.Database` on Snowflake (its role needs ``IMPORTED
            PRIVILEGES`` on the ``SNOWFLAKE`` database), or any database holding the same views
            (a stand-in schema on fakesnow, a DuckDB copy).
        account_usage: where the views are (default ``SNOWFLAKE.ACCOUNT_USAGE``).
        query_attribution: read ``QUERY_ATTRIBUTION_HISTORY`` beside the allocation (off for an
            account without the view).
        node_assets: dbt node id → Dagster asset key ``a/b`` (:func:`dw_dagster.cost.mapping.node_assets`).
        invocation_runs: dbt invocation id → Dagster run id (:func:`dw_dagster.cost.mapping.invocation_runs`).
    """

    db: Database
    account_usage: str = "SNOWFLAKE.ACCOUNT_USAGE"
    query_attribution: bool = True
    node_assets: Mapping[str, str] = field(default_factory=dict)
    invocation_runs: Mapping[str, str] = field(default_factory=dict)

    engine = "snowflake"
    unit = "credits"

    def view(self, name: str) -> exp.Table:
        """A view of ``account_usage`` as a quoted-if-needed table reference."""
        return sql.table(f"{self.account_usage}.{name}")

    def statement(self, period: Period) -> str:
        """The one statement behind :meth:`report`, for this source's dialect."""
        values = dict(since=period.start, until=period.end)
        qah = (sb.build(_QAH, "snowflake", qah=self.view("QUERY_ATTRIBUTION_HISTORY"), **values)
               if self.query_attribution else sb.lookup(["query_id", "credits"], [], ["VARCHAR", "DOUBLE"]))
        ctes = {"na": sb.lookup(["node_id", "asset_key"], sorted(self.node_assets.items())),
                "ir": sb.lookup(["invocation_id", "run_id"], sorted(self.invocation_runs.items())),
                "qah": qah}
        tree = sb.build(TEMPLATE, "snowflake", ctes=ctes, wmh=self.view("WAREHOUSE_METERING_HISTORY"),
                        qh=self.view("QUERY_HISTORY"), mdh=self.view("METERING_DAILY_HISTORY"),
                        since_day=period.since, until_day=period.until, **values)
        return tree.sql(dialect=self.db.dialect)

    def report(self, period: Period) -> CostReport:
        """Credits of ``period`` metered, attributed, idle and unattributed (one statement).

        Raises:
            CostError: a view is missing or unreadable (the message names the database's error).
        """
        text = self.statement(period)
        try:
            rows = self.db.fetch_all(text)
        except DatabaseError as e:
            raise CostError(f"the Snowflake cost report failed on {self.db.name} ({self.account_usage}): "
                            f"{str(e).splitlines()[0]}") from e
        return report_from_rows(rows, period=period, sql_text=text, query_attribution=self.query_attribution)


def report_from_rows(rows: list[tuple], *, period: Period, sql_text: str, query_attribution: bool = True,
                     engine: str = "snowflake") -> CostReport:
    """The :class:`CostReport` from the long result of :data:`TEMPLATE` (6 columns)."""
    parts = sb.rows_to_parts(r[:5] for r in rows)
    cs_of = {(str(r[0]), "" if r[1] is None else str(r[1])): float(r[5] or 0) for r in rows}
    total = {k: v[0] for k, v in parts.get("total", {}).items()}
    mapped = parts.get("mapped", {})
    attributed = mapped.get("attributed", (0.0, 0, None))
    untagged = mapped.get("unattributed", (0.0, 0, None))
    idle_by = sb.amounts(parts.get("idle", {}), skip_blank=False)
    idle = sum(idle_by.values())
    cs_in_queries = cs_of.get(("mapped", "attributed"), 0.0) + cs_of.get(("mapped", "unattributed"), 0.0)
    compute_in_queries = attributed[0] + untagged[0] - cs_in_queries
    detail = {
        "queries_mapping_to_nothing": untagged[0],
        "compute_not_in_hourly_metering": total.get("compute_daily", 0.0) - total.get("compute_hourly", 0.0),
        "cloud_services_billed_not_in_queries": total.get("cs_used", 0.0) + total.get("cs_adjustment", 0.0) - cs_in_queries,
        "allocation_remainder": total.get("compute_hourly", 0.0) - idle - compute_in_queries,
    }
    warehouses = sb.amounts(parts.get("warehouse", {}), skip_blank=False)
    by_wh = {(k or "(no warehouse)"): v for k, v in warehouses.items()}
    for wh, v in idle_by.items():
        by_wh[wh] = by_wh.get(wh, 0.0) + v
    qah = parts.get("qah", {})
    beside: dict[str, Any] = {}
    if query_attribution:
        present, missing = qah.get("present", (0.0, 0, 0.0)), qah.get("missing", (0.0, 0, None))
        beside["query_attribution_history"] = {
            "credits": (present[2] or 0.0), "queries": present[1],
            "queries_not_in_view": missing[1], "metered_credits_of_queries_not_in_view": missing[0],
            "note": "QUERY_ATTRIBUTION_HISTORY leaves out short queries (about 100 ms or less) and idle time; "
                    "shown beside the metered allocation, never instead of it"}
    extra = {"cloud_services": {"used": total.get("cs_used", 0.0), "adjustment": total.get("cs_adjustment", 0.0),
                                "billed": total.get("cs_used", 0.0) + total.get("cs_adjustment", 0.0),
                                "billed_in_queries": cs_in_queries},
             "compute": {"daily": total.get("compute_daily", 0.0), "hourly": total.get("compute_hourly", 0.0)}}
    report = CostReport(
        period=period, engine=engine, unit="credits", metered=total.get("metered", 0.0), attributed=attributed[0],
        idle=idle, unattributed=sum(detail.values()), by_model=sb.amounts(parts.get("model", {})),
        by_asset=sb.amounts(parts.get("asset", {})), by_run=sb.amounts(parts.get("run", {})),
        by_partition=sb.partitions(parts.get("partition", {})),
        by_warehouse=dict(sorted(by_wh.items(), key=lambda kv: (-kv[1], kv[0]))), idle_by_warehouse=idle_by,
        queries={"total": attributed[1] + untagged[1], "attributed": attributed[1], "unattributed": untagged[1]},
        queries_by={d: sb.counts(parts.get(d, {})) for d in ("model", "asset", "run", "warehouse")},
        unattributed_detail=detail, beside=beside, extra=extra, sql=sql_text,
        notes=["idle: warehouse hours with metered credits and no query executing; never spread over the queries",
               "cloud services count per query in the proportion billed that day (the 10 % daily allowance is not billed)"])
    return report.sealed()


def symptom_statement(source: SnowflakeCost, period: Period) -> str:
    """Per warehouse over ``period``: metered and idle credits, queries, execution, queued-overload and
    remote-spill totals, the share of queries under one second, and the size the queries ran on
    (the evidence the warehouse rules read, :mod:`dw_dagster.cost.warehouse`)."""
    tree = sb.build(SYMPTOMS, "snowflake", wmh=source.view("WAREHOUSE_METERING_HISTORY"),
                    qh=source.view("QUERY_HISTORY"), since=period.start, until=period.end)
    return tree.sql(dialect=source.db.dialect)


SYMPTOMS = """
WITH hours AS (
  SELECT warehouse_name AS wh, start_time AS h_start, DATEADD(HOUR, 1, start_time) AS h_end,
         CAST(COALESCE(credits_used_compute, 0) AS DOUBLE) AS credits
  FROM :wmh WHERE start_time >= :since AND start_time < :until AND COALESCE(credits_used_compute, 0) <> 0
), q AS (
  SELECT warehouse_name AS wh, warehouse_size AS size, end_time,
         DATEADD(MILLISECOND, COALESCE(queued_provisioning_time, 0) + COALESCE(queued_repair_time, 0)
                 + COALESCE(queued_overload_time, 0) + COALESCE(compilation_time, 0), start_time) AS exec_start,
         COALESCE(execution_time, 0) AS exec_ms, COALESCE(queued_overload_time, 0) AS overload_ms,
         COALESCE(bytes_spilled_to_remote_storage, 0) AS remote_spill
  FROM :qh WHERE start_time >= :since AND start_time < :until AND warehouse_name IS NOT NULL
), busy AS (
  SELECT DISTINCT h.wh, h.h_start FROM hours AS h JOIN q ON q.wh = h.wh AND q.exec_start < h.h_end AND q.end_time > h.h_start
), per_wh AS (
  SELECT wh, COUNT(*) AS queries, SUM(exec_ms) AS exec_ms, SUM(overload_ms) AS overload_ms,
         SUM(IFF(overload_ms > 0, 1, 0)) AS queued_queries, SUM(remote_spill) AS remote_spill,
         SUM(IFF(remote_spill > 0, 1, 0)) AS spilling_queries, SUM(IFF(exec_ms < 1000, 1, 0)) AS small_queries,
         MAX(exec_ms) AS max_exec_ms, MAX(size) AS size
  FROM q GROUP BY wh
), metered AS (
  SELECT h.wh, SUM(h.credits) AS credits, SUM(IFF(b.h_start IS NULL, h.credits, 0)) AS idle,
         SUM(IFF(b.h_start IS NULL, 1, 0)) AS idle_hours, COUNT(*) AS hours
  FROM hours AS h LEFT JOIN busy AS b ON b.wh = h.wh AND b.h_start = h.h_start GROUP BY h.wh
)
SELECT m.wh, m.credits, m.idle, m.idle_hours, m.hours, COALESCE(p.queries, 0), COALESCE(p.exec_ms, 0),
       COALESCE(p.overload_ms, 0), COALESCE(p.queued_queries, 0), COALESCE(p.remote_spill, 0),
       COALESCE(p.spilling_queries, 0), COALESCE(p.small_queries, 0), COALESCE(p.max_exec_ms, 0), p.size
FROM metered AS m LEFT JOIN per_wh AS p ON p.wh = m.wh
ORDER BY m.wh
"""

__all__ = ["SYMPTOMS", "TEMPLATE", "SnowflakeCost", "report_from_rows", "symptom_statement"]
