"""Daily cost observations: what each asset cost yesterday, as numeric metadata the Dagster UI plots.

The job ``dw_cost_observations`` is daily-partitioned; each run reports its day (one statement,
:mod:`dw_dagster.cost.sources`) and logs

- on every asset the day's report attributes something to: ``dw/cost_credits`` (Snowflake),
  ``dw/cost_bytes_billed``, ``dw/cost_usd`` and ``dw/cost_slot_ms`` (BigQuery) or ``dw/cost_seconds``
  (DuckDB and engines without billing), ``dw/cost_queries``, ``dw/cost_day`` and ``dw/cost_engine``;
  the asset's Plots tab shows them day by day;
- on ``dw_cost/<engine>`` (a daily-partitioned asset of the job's code location) the whole report
  as ``dw/cost_report`` with the totals as numbers: what ``get_cost`` (MCP) and ``explain_table`` read.

Rerunning a day records it again; readers take the latest record of each day.
"""

from dw_dagster.dagster_private import public
import datetime as dt
from collections.abc import Iterator
from typing import Any

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.cost.models import CostReport, Period
from dw_dagster.core.keys import KIND_KEY as KIND_TAG

#: the first day the job's partitions cover by default
DEFAULT_START = "2026-01-01"
AMOUNT_KEY = {"credits": c.COST_CREDITS_KEY, "bytes_billed": c.COST_BYTES_BILLED_KEY, "seconds": c.COST_SECONDS_KEY}


def report_asset_key(engine: str) -> dg.AssetKey:
    """``dw_cost/<engine>``: where each day's whole report is observed."""
    return dg.AssetKey([c.COST_REPORT_ASSET_PREFIX, engine])


def asset_metadata(report: CostReport, asset: str) -> dict[str, Any]:
    """The numeric metadata of one asset's day (what the UI plots)."""
    amount = report.by_asset.get(asset, 0.0)
    md: dict[str, Any] = {
        AMOUNT_KEY[report.unit]: dg.MetadataValue.int(int(amount)) if report.unit == "bytes_billed"
        else dg.MetadataValue.float(float(amount)),
        c.COST_QUERIES_KEY: dg.MetadataValue.int(int(report.queries_by.get("asset", {}).get(asset, 0))),
        c.COST_DAY_KEY: report.period.since.isoformat(),
        c.COST_ENGINE_KEY: report.engine,
    }
    if report.unit == "bytes_billed":
        md[c.COST_USD_KEY] = dg.MetadataValue.float(float(report.extra.get("usd_by_asset", {}).get(asset, 0.0)))
        md[c.COST_SLOT_MS_KEY] = dg.MetadataValue.int(int(report.extra.get("slot_ms_by_asset", {}).get(asset, 0)))
    return md


def report_observation(report: CostReport) -> dg.AssetObservation:
    """The whole day's report on ``dw_cost/<engine>`` (partition = the day)."""
    return dg.AssetObservation(
        asset_key=report_asset_key(report.engine), partition=report.period.since.isoformat(),
        description=f"{report.engine} cost of {report.period.since}: metered {report.metered:.6g} {report.unit}, "
                    f"attributed {report.attributed:.6g}, idle {report.idle:.6g}, unattributed {report.unattributed:.6g}",
        metadata={c.COST_REPORT_KEY: dg.MetadataValue.json(report.to_json_dict()),
                  c.COST_METERED_KEY: dg.MetadataValue.float(report.metered),
                  c.COST_ATTRIBUTED_KEY: dg.MetadataValue.float(report.attributed),
                  c.COST_IDLE_KEY: dg.MetadataValue.float(report.idle),
                  c.COST_UNATTRIBUTED_KEY: dg.MetadataValue.float(report.unattributed),
                  c.COST_DAY_KEY: report.period.since.isoformat(), c.COST_ENGINE_KEY: report.engine})


def observations(report: CostReport) -> Iterator[dg.AssetObservation]:
    """One observation per attributed asset, then the report's own."""
    for asset in report.by_asset:
        yield dg.AssetObservation(asset_key=dg.AssetKey.from_user_string(asset),
                                  description=f"{report.engine} cost of {report.period.since}",
                                  metadata=asset_metadata(report, asset))
    yield report_observation(report)


@public
def build_cost_observation_job(*, engine: str = "duckdb", resource_key: str = "dw_cost", start_date: str = DEFAULT_START,
                               name: str = c.COST_JOB_NAME, end_offset: int = 0,
                               ) -> tuple[dg.JobDefinition, dg.AssetSpec, dg.ScheduleDefinition]:
    """The daily cost observation job, the ``dw_cost/<engine>`` asset it observes and its schedule.

    Args:
        engine: the engine the :class:`~dw_dagster.cost.sources.CostResource` reads (names the report asset).
        resource_key: the :class:`~dw_dagster.cost.sources.CostResource`.
        start_date: the first day.
        end_offset: 1 adds today's partition (a report of the day so far); 0, days once they are over.

    Returns:
        ``(job, report asset spec, schedule)``; the schedule runs each day shortly after midnight UTC for
        the day before (STOPPED by default: start it where the warehouse is reachable).
    """
    daily = dg.DailyPartitionsDefinition(start_date=start_date, timezone="UTC", end_offset=end_offset)
    spec = dg.AssetSpec(report_asset_key(engine), partitions_def=daily, group_name=c.COST_REPORT_ASSET_PREFIX,
                        description=f"What each day cost on {engine}, reconciled to the meter (dw-dagster cost).")

    @dg.op(name=c.COST_OP_NAME, required_resource_keys={resource_key}, tags={"kind": "dw"})
    def observe_cost(context: dg.OpExecutionContext) -> None:
        day = dt.date.fromisoformat(context.partition_key)
        period = Period(since=day, until=day + dt.timedelta(days=1))
        report = getattr(context.resources, resource_key).report(context.instance, period)
        for obs in observations(report):
            context.log_event(obs)
        context.log.info(report.reconciliation)

    job = dg.JobDefinition(graph_def=dg.GraphDefinition(name=name, node_defs=[observe_cost]), partitions_def=daily,
                           tags={KIND_TAG: c.COST_KIND},
                           description="Observe what each asset cost per day (credits, bytes billed or seconds).")
    schedule = dg.build_schedule_from_partitioned_job(job, hour_of_day=1, minute_of_hour=15,
                                                      default_status=dg.DefaultScheduleStatus.STOPPED)
    return job, spec, schedule


def latest_reports(instance: dg.DagsterInstance, engine: str, period: Period) -> list[CostReport]:
    """The latest recorded report of each day of ``period`` (days not observed are absent)."""
    from dw_dagster.core import records

    wanted = {(period.since + dt.timedelta(days=i)).isoformat() for i in range(period.days)}
    seen: dict[str, CostReport] = {}
    key = report_asset_key(engine)
    start = period.start.replace(tzinfo=dt.timezone.utc).timestamp()
    cursor = None
    while True:  # newest first, in pages; reruns of a day keep only its latest record
        res = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=key, after_timestamp=start - 86400 * 7),
                                          limit=500, cursor=cursor)
        for rec in res.records:
            obs = rec.asset_observation
            if obs is None or obs.partition in seen or obs.partition not in wanted:
                continue
            data = records.metadata_json(obs.metadata or {}, c.COST_REPORT_KEY)
            if data:
                seen[obs.partition] = CostReport.model_validate(data)
        if not res.has_more or len(seen) == len(wanted):
            break
        cursor = res.cursor
    return [seen[d] for d in sorted(seen)]


def combine(reports: list[CostReport], period: Period) -> CostReport | None:
    """Recorded daily reports of one engine summed into one report over ``period`` (None without any)."""
    if not reports:
        return None
    first = reports[0]

    def add(maps: list[dict[str, float]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for mp in maps:
            for k, v in mp.items():
                out[k] = out.get(k, 0) + v
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    days = [r.period.since.isoformat() for r in reports]
    total = CostReport(
        period=period, engine=first.engine, unit=first.unit, metered=sum(r.metered for r in reports),
        attributed=sum(r.attributed for r in reports), idle=sum(r.idle for r in reports),
        unattributed=sum(r.unattributed for r in reports),
        **{f"by_{d}": add([getattr(r, f"by_{d}") for r in reports]) for d in ("model", "asset", "run", "warehouse")},
        idle_by_warehouse=add([r.idle_by_warehouse for r in reports]),
        by_partition={a: add([r.by_partition.get(a, {}) for r in reports])
                      for a in sorted({a for r in reports for a in r.by_partition})},
        queries={k: sum(r.queries.get(k, 0) for r in reports) for k in ("total", "attributed", "unattributed")},
        queries_by={d: add([r.queries_by.get(d, {}) for r in reports]) for d in ("model", "asset", "run", "warehouse")},
        unattributed_detail=add([r.unattributed_detail for r in reports]),
        notes=[f"summed from {len(reports)} recorded daily reports ({days[0]}..{days[-1]}); "
               f"days without one: {period.days - len(reports)}"],
        sql=first.sql)
    return total.sealed()


__all__ = ["AMOUNT_KEY", "asset_metadata", "build_cost_observation_job", "combine", "latest_reports", "observations",
           "report_asset_key", "report_observation"]
