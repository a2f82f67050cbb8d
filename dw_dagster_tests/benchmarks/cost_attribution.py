"""``cost_attribution_1m_queries``: Snowflake credits per query for a month of 1,000,000 queries.

Setup (not timed, in a child process): the generated workload (:mod:`dw_dagster_dev.cost_workload`)
over 30 days on 3 warehouses with ~1M ``QUERY_HISTORY`` rows (dashboards at ~4,160 queries per
business hour, the nightly dbt build, dw_dagster's tagged loads, metadata queries), its hourly and
daily metering and ``QUERY_ATTRIBUTION_HISTORY``, in a DuckDB file with the account usage layout
(schema ``account_usage``, the views' names and columns).

Timed (median of ``repeat``): ours, :class:`~dw_dagster.cost.snowflake.SnowflakeCost` ``.report`` (the
sqlglot-built statement rendered for DuckDB, run, and folded into the report), against the peer:
the same allocation written by hand as one bare DuckDB statement (hourly credits split by each
query's execution milliseconds after queueing and compilation, idle hours per warehouse, cloud
services in the billed proportion of each day, dbt node / Dagster run / asset from the same tag
patterns, QUERY_ATTRIBUTION_HISTORY beside), returning the same breakdowns. Both run in the same
process on the same file, DuckDB with 2 threads and a 1 GB memory limit. The two results are
compared (``identical``: every credit figure within 1e-6). Goal: ours / peer ≤ 1.2.

Usage: ``python -m dw_dagster_tests.benchmarks.run --only cost_attribution_1m_queries``
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import statistics
import time
from pathlib import Path

SINCE = dt.date(2026, 10, 1)
DAYS = 30
BI_PER_HOUR = 4160  # 30 × (54 + 8 × 4160) = 1,000,020 queries
GOAL = 1.2

BARE = r"""
WITH hours AS (
  SELECT warehouse_name AS wh, start_time AS h_start, start_time + INTERVAL 1 HOUR AS h_end,
         CAST(credits_used_compute AS DOUBLE) AS credits
  FROM account_usage.warehouse_metering_history
  WHERE start_time >= TIMESTAMP '2026-10-01' AND start_time < TIMESTAMP '2026-10-31' AND credits_used_compute <> 0
), q AS (
  SELECT query_id, warehouse_name AS wh, end_time, CAST(start_time AS DATE) AS day,
         start_time + TO_MILLISECONDS(COALESCE(queued_provisioning_time, 0) + COALESCE(queued_repair_time, 0)
                                      + COALESCE(queued_overload_time, 0) + COALESCE(compilation_time, 0)) AS exec_start,
         CASE WHEN start_time >= TIMESTAMP '2026-10-01' THEN CAST(COALESCE(credits_used_cloud_services, 0) AS DOUBLE) ELSE 0 END AS cs,
         NULLIF(regexp_extract(query_text, '/[*][^*]*"node_id": *"([^"]*)"', 1), '') AS node_id,
         COALESCE(NULLIF(regexp_extract(query_tag, '"dagster_run_id": *"([^"]*)"', 1), ''),
                  NULLIF(regexp_extract(query_text, '/[*][^*]*"dagster_run_id": *"([^"]*)"', 1), '')) AS run_id,
         COALESCE(NULLIF(regexp_extract(query_tag, '"asset_key": *"([^"]*)"', 1), ''),
                  NULLIF(regexp_extract(query_text, '/[*][^*]*"asset_key": *"([^"]*)"', 1), '')) AS asset
  FROM account_usage.query_history
  WHERE start_time >= TIMESTAMP '2026-09-29' AND start_time < TIMESTAMP '2026-10-31' AND end_time > TIMESTAMP '2026-10-01'
), qh AS (
  SELECT q.query_id, h.wh, h.h_start, h.credits,
         GREATEST(0, date_diff('millisecond', GREATEST(q.exec_start, h.h_start), LEAST(q.end_time, h.h_end))) AS ms
  FROM q JOIN hours h ON h.wh = q.wh AND q.exec_start < h.h_end AND q.end_time > h.h_start
), alloc AS (
  SELECT query_id, SUM(CASE WHEN hour_ms > 0 THEN credits * ms / hour_ms ELSE 0 END) AS compute
  FROM (SELECT *, SUM(ms) OVER (PARTITION BY wh, h_start) AS hour_ms FROM qh) GROUP BY query_id
), busy AS (SELECT DISTINCT wh, h_start FROM qh WHERE ms > 0),
idle AS (
  SELECT h.wh, SUM(h.credits) AS credits FROM hours h ANTI JOIN busy b ON b.wh = h.wh AND b.h_start = h.h_start GROUP BY h.wh
), daily AS (
  SELECT usage_date AS day, SUM(credits_used_compute)::DOUBLE AS compute, SUM(credits_used_cloud_services)::DOUBLE AS cs_used,
         SUM(credits_adjustment_cloud_services)::DOUBLE AS cs_adj, SUM(credits_billed)::DOUBLE AS billed
  FROM account_usage.metering_daily_history
  WHERE service_type = 'WAREHOUSE_METERING' AND usage_date >= DATE '2026-10-01' AND usage_date < DATE '2026-10-31'
  GROUP BY usage_date
), per_query AS (
  SELECT q.query_id, q.wh, q.node_id, q.run_id, q.asset,
         COALESCE(a.compute, 0) + q.cs * CASE WHEN d.cs_used > 0 THEN (d.cs_used + d.cs_adj) / d.cs_used ELSE 0 END AS credits,
         qa.credits AS qah
  FROM q LEFT JOIN alloc a USING (query_id) LEFT JOIN daily d USING (day)
    LEFT JOIN (SELECT query_id, SUM(credits_attributed_compute + credits_used_query_acceleration)::DOUBLE AS credits
               FROM account_usage.query_attribution_history
               WHERE start_time >= TIMESTAMP '2026-09-29' AND start_time < TIMESTAMP '2026-10-31' GROUP BY query_id) qa
      USING (query_id)
)
SELECT 'model' AS dim, node_id AS key, SUM(credits) AS credits FROM per_query WHERE node_id IS NOT NULL GROUP BY node_id
UNION ALL SELECT 'asset', asset, SUM(credits) FROM per_query WHERE asset IS NOT NULL GROUP BY asset
UNION ALL SELECT 'run', run_id, SUM(credits) FROM per_query WHERE run_id IS NOT NULL GROUP BY run_id
UNION ALL SELECT 'warehouse', wh, SUM(credits) FROM per_query GROUP BY wh
UNION ALL SELECT 'mapped', CASE WHEN node_id IS NULL AND run_id IS NULL AND asset IS NULL THEN 'unattributed'
                                ELSE 'attributed' END, SUM(credits) FROM per_query GROUP BY 2
UNION ALL SELECT 'qah', 'credits', SUM(qah) FROM per_query
UNION ALL SELECT 'idle', wh, credits FROM idle
UNION ALL SELECT 'total', 'metered', SUM(billed) FROM daily
"""


def _write(path: Path) -> int:
    from dw_dagster.databases import DuckDBDatabase
    from dw_dagster_dev import cost_workload as cw

    wl = cw.generate(SINCE, DAYS, bi_per_hour=BI_PER_HOUR)
    db = DuckDBDatabase(path)
    db.execute("CREATE SCHEMA account_usage")
    cw.load_parquet(db, "account_usage", wl, path.parent / "parquet", tuple(cw.TABLES))
    return len(wl.queries)


def _make(path: Path) -> None:
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_write, args=(path,))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"generating {path} failed (exit {p.exitcode})")


def _timed(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def bench_cost_attribution_1m(work: Path, repeat: int) -> dict:
    import resource

    from dw_dagster.cost.models import Period
    from dw_dagster.cost.snowflake import SnowflakeCost
    from dw_dagster.databases import DuckDBDatabase

    path = work / "usage.duckdb"  # not account_usage.duckdb: its catalog would shadow the schema
    _make(path)
    db = DuckDBDatabase(path, memory_limit="1GB")
    rows = db.fetch_all("SELECT COUNT(*) FROM account_usage.query_history")[0][0]
    period = Period(since=SINCE, until=SINCE + dt.timedelta(days=DAYS))
    source = SnowflakeCost(db, account_usage="account_usage")

    def ours():
        return source.report(period)

    def peer():
        return db.fetch_all(BARE)  # the same database object: one connection per call, 1 GB, DuckDB's threads (2 cores)

    ours()  # warm the file cache for both
    ours_s, report = _timed(ours, repeat)
    ours_peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    peer_s, bare = _timed(peer, repeat)
    got = {(d, k): v for d, k, v in bare}
    same = [abs(report.by_model.get(k, 0) - v) <= 1e-6 for (d, k), v in got.items() if d == "model"]
    same += [abs(report.by_run.get(k, 0) - v) <= 1e-6 for (d, k), v in got.items() if d == "run"]
    same += [abs(report.by_asset.get(k, 0) - v) <= 1e-6 for (d, k), v in got.items() if d == "asset"]
    same += [abs(report.idle_by_warehouse.get(k, 0) - v) <= 1e-6 for (d, k), v in got.items() if d == "idle"]
    same += [abs(report.metered - got[("total", "metered")]) <= 1e-6, abs(report.attributed - got[("mapped", "attributed")]) <= 1e-6]
    return {"name": "cost_attribution_1m_queries", "rows": int(rows), "ours_s": ours_s,
            "peer": "the same allocation as one bare DuckDB statement", "peer_s": peer_s, "goal": GOAL,
            "ours_peak_rss_mb": ours_peak, "identical": all(same), "reconciled": report.reconciled,
            "metered_credits": round(report.metered, 6), "warehouses": len(report.by_warehouse) - 1}


__all__ = ["BARE", "bench_cost_attribution_1m"]
