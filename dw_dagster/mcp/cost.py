"""Cost tools: ``get_cost``, and the cost part of ``explain_table``.

Both answer from the Dagster instance: the daily reports the cost observation job recorded
(``dw_cost/<engine>``, :mod:`dw_dagster.cost.observe`) when there are any for the period, else
the Dagster step and dbt node seconds of the period's runs (what the embedded DuckDB default
meters), else, with ``$DW_COST_URL`` set, one live report from that warehouse. ``source`` says which.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.core import keys as c
from dw_dagster.cost.models import CostError, CostReport, Period
from dw_dagster.cost.observe import AMOUNT_KEY, combine, latest_reports
from dw_dagster.mcp.state import DwState, fail

ENGINES = ("snowflake", "bigquery", "duckdb")


class CostRow(BaseModel):
    key: str
    amount: float
    queries: int
    share_pct: float


class CostAnswer(BaseModel):
    """A cost report (metered = attributed + idle + unattributed) and its top rows for ``by``."""

    source: str = Field(description="recorded daily reports, Dagster step timings, or a live warehouse report")
    by: str
    top: list[CostRow]
    report: dict[str, Any] = Field(description="the CostReport (period, engine, unit, metered, attributed, idle, "
                                   "unattributed, by_model, by_asset, by_run, by_warehouse, reconciliation, sql ...)")


class AssetCost(BaseModel):
    """What one asset cost over a period."""

    engine: str
    unit: str
    since: str
    until: str
    amount: float
    queries: int
    days_recorded: int
    source: str


def _report(state: DwState, period: Period, engine: str | None) -> tuple[CostReport | None, str]:
    inst = state.instance()
    for e in ([engine] if engine else list(ENGINES)):
        combined = combine(latest_reports(inst, e, period), period)
        if combined is not None:
            return combined, f"recorded daily reports of dw_cost/{e}"
    if engine in (None, "duckdb"):
        from dw_dagster.cost.timings import DagsterTimingCost

        report = DagsterTimingCost(inst).report(period)
        if report.metered or engine == "duckdb":
            return report, "Dagster step and dbt node seconds of the period's runs"
    from dw_dagster.cost.sources import make_source, url_from_env

    url = url_from_env()
    if url and engine in (None, "snowflake", "bigquery"):
        return make_source(url, instance=inst, period=period).report(period), "a live report from $DW_COST_URL"
    return None, ""


def get_cost(state: DwState, since: str | None, until: str | None, by: str, engine: str | None, top: int) -> CostAnswer:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    try:
        period = Period.parse(since, until, default_days=7, include_today=True)
        report, source = _report(state, period, engine)
    except CostError as e:
        raise fail(str(e)) from e
    if report is None:
        raise fail(f"no cost recorded for {period.since}..{period.until}: run the {c.COST_JOB_NAME} job, or set "
                   "$DW_COST_URL for a live report")
    rows = report.by(by)
    counts = report.queries_by.get(by, {})
    out = [CostRow(key=k, amount=v, queries=int(counts.get(k, 0)),
                   share_pct=round(100.0 * v / report.metered, 3) if report.metered else 0.0)
           for k, v in list(rows.items())[:top]]
    return CostAnswer(source=source, by=by, top=out, report=report.to_json_dict())


def asset_cost(state: DwState, key: dg.AssetKey, days: int = 30) -> AssetCost | None:
    """The asset's cost over the last ``days`` days: its recorded daily cost observations, else the seconds
    of the runs that materialized it in that time (only those runs are read); None when neither exists."""
    inst = state.instance()
    period = Period.last_days(days, dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1))
    start = period.start.replace(tzinfo=dt.timezone.utc).timestamp()
    # the answer changes only with a new observation or materialization of the asset (or another period):
    # two one-record reads say whether the last answer still holds
    flt = dg.AssetRecordsFilter(asset_key=key, after_timestamp=start)
    stamp = (key, period.since, period.until, *(tuple(r.storage_id for r in fetch(flt, limit=1).records)
                                                for fetch in (inst.fetch_observations, inst.fetch_materializations)))
    cached = state.answers.get(("asset_cost", stamp))
    if cached is not None:
        return cached[0]
    answer, final = _asset_cost(state, inst, key, period, start, days)
    if final:  # not while a run that materialized it is still going (its steps' seconds still change)
        state.answers.put(("asset_cost", stamp), (answer,))
    return answer


def _asset_cost(state: DwState, inst, key: dg.AssetKey, period: Period, start: float,
                days: int) -> tuple[AssetCost | None, bool]:
    res = inst.fetch_observations(dg.AssetRecordsFilter(asset_key=key, after_timestamp=start), limit=4 * days)
    by_day: dict[str, dict] = {}
    for rec in res.records:  # newest first: the latest observation of each day
        md = rec.asset_observation.metadata if rec.asset_observation else {}
        day = getattr(md.get(c.COST_DAY_KEY), "value", md.get(c.COST_DAY_KEY))
        if day and day not in by_day and c.COST_ENGINE_KEY in md:
            by_day[day] = md
    if by_day:
        first = next(iter(by_day.values()))
        engine = getattr(first[c.COST_ENGINE_KEY], "value", first[c.COST_ENGINE_KEY])
        unit_key = next((k for k in AMOUNT_KEY.values() if k in first), c.COST_SECONDS_KEY)
        unit = next(u for u, k in AMOUNT_KEY.items() if k == unit_key)
        amount = sum(float(getattr(md.get(unit_key), "value", md.get(unit_key)) or 0) for md in by_day.values())
        queries = sum(int(getattr(md.get(c.COST_QUERIES_KEY), "value", md.get(c.COST_QUERIES_KEY)) or 0) for md in by_day.values())
        return AssetCost(engine=str(engine), unit=unit, since=period.since.isoformat(), until=period.until.isoformat(),
                         amount=amount, queries=queries, days_recorded=len(by_day),
                         source="recorded daily cost observations"), True
    mats = inst.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, after_timestamp=start), limit=200)
    run_ids = sorted({r.run_id for r in mats.records if r.run_id})
    if not run_ids:
        return None, True
    from dw_dagster.cost.timings import report_from_timings

    runs = list(inst.get_runs(filters=dg.RunsFilter(run_ids=run_ids)))
    report = report_from_timings(state.run_timings.read(inst, runs), period)
    name = key.to_user_string()
    return AssetCost(engine="duckdb", unit="seconds", since=period.since.isoformat(), until=period.until.isoformat(),
                     amount=report.by_asset.get(name, 0.0), queries=int(report.queries_by.get("asset", {}).get(name, 0)),
                     days_recorded=0, source=f"step and dbt node seconds of the {len(runs)} run(s) that materialized it"), \
        all(r.is_finished for r in runs)


By = Literal["model", "asset", "run", "warehouse"]
Engine = Literal["snowflake", "bigquery", "duckdb"]

__all__ = ["AssetCost", "By", "CostAnswer", "CostRow", "Engine", "asset_cost", "get_cost"]
