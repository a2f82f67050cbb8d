"""``monitor_metrics``: score a daily series against the volume check's own baseline.

The assistant brings a series (rows per day), or names an asset whose volume check
(:func:`dw_dagster.checks.volume.build_volume_check`) recorded its counts; each of the latest
``evaluate_days`` days is scored by :func:`~dw_dagster.checks.volume.score_days` — the same
function, the same same-weekday baseline, band and defaults the check uses — so the verdict is the
one the check would give on those counts. Days missing from a series between its first and last
day count as 0 (the calendar spine), never dropped. The answer carries the band of each day, the
verdict, and the SQL that counts such a series in the warehouse (for a table and timestamp column
the caller names; for an asset, the query its check ran).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.checks.volume import DayScore, daily_counts_sql, score_days
from dw_dagster.core.check_results import latest_run_evaluation
from dw_dagster.mcp.state import DwState, fail, parse_asset_key, shown
from dw_dagster.core import keys as c


#: the check evaluations read for an asset's recorded counts, newest first
RECORDS = 400


class MetricDay(BaseModel):
    """One scored day: its count, its baseline band and status (ok, low, high, no_rows, insufficient_history)."""

    day: dt.date
    rows: int
    baseline_days: int
    mean: float | None
    lower: float | None
    upper: float | None
    deviation_pct: float | None
    z_score: float | None
    status: str


class MetricsVerdict(BaseModel):
    """A series scored against its own baseline, as the volume check scores it."""

    verdict: str = Field(description="ok (every scored day inside its band), anomalous (a day outside it), or "
                         "insufficient_history (too few baseline days to score)")
    scored: list[MetricDay] = Field(description="the latest evaluate_days days, oldest first")
    out_of_band: list[str] = Field(description="the scored days outside their band")
    method: str
    sensitivity: float
    training_days: int
    min_band_pct: float
    series_days: int = Field(description="days in the series, zero days of the spine included")
    source: str = Field(description="'series' (brought by the caller) or the check whose recorded counts were read")
    sql: str | None = Field(description="the query that counts such a series per UTC day in the warehouse")


def _series(points: list[dict[str, Any]]) -> dict[dt.date, int]:
    counts: dict[dt.date, int] = {}
    for i, p in enumerate(points):
        try:
            day = dt.date.fromisoformat(str(p["day"])[:10])
            rows = int(p["rows"])
        except (KeyError, TypeError, ValueError) as e:
            raise fail(f"series point {i} is not {{\"day\": \"YYYY-MM-DD\", \"rows\": N}} ({type(e).__name__}: "
                       f"{shown(p, 80)})") from e
        if rows < 0:
            raise fail(f"series point {i} ({day}) has {rows} rows; a count is never negative")
        if day in counts:
            raise fail(f"series point {i}: day {day} appears twice; give one count per day")
        counts[day] = rows
    if not counts:
        raise fail("the series is empty; give at least one {\"day\", \"rows\"} point per day")
    first, last = min(counts), max(counts)
    if (last - first).days > 3660:
        raise fail(f"the series spans {(last - first).days} days; give at most ten years of daily counts")
    return {first + dt.timedelta(days=i): counts.get(first + dt.timedelta(days=i), 0) for i in range((last - first).days + 1)}


def _recorded(state: DwState, asset: str | list[str], check: str) -> tuple[dict[dt.date, int], str | None, str]:
    """The daily counts the asset's volume check recorded over its runs (each run records the days it
    scored, ``dw/days_json``; a later run's count of a day wins), and the query its latest run ran."""
    key = parse_asset_key(asset)  # a checked asset need not have materialized: its check's record decides
    ck = dg.AssetCheckKey(key, check)
    if latest_run_evaluation(state.instance(), ck).latest is None:
        raise fail(f"no run evaluated the check {shown(check)} of {key.to_user_string()}; run it "
                   "(run_quality_check) or bring the series")
    counts: dict[str, int] = {}
    sql = None
    for rec in reversed(state.instance().event_log_storage.get_asset_check_execution_history(ck, limit=RECORDS)):
        ev = rec.event.dagster_event if rec.event is not None else None
        if ev is None or not rec.run_id or ev.event_type_value != "ASSET_CHECK_EVALUATION":
            continue  # only evaluations a run wrote (an evaluation reported through the API is not a count)
        md = ev.event_specific_data.metadata or {}
        days = getattr(md.get(c.DAYS_JSON_KEY), "value", None)
        if isinstance(days, list):
            counts.update({str(d["day"]): int(d["rows"]) for d in days})
            query = getattr(md.get(c.QUERY_KEY), "value", None)
            sql = str(query).removeprefix("```sql\n").removesuffix("\n```") if query else sql
    if not counts:
        raise fail(f"the check {shown(check)} of {key.to_user_string()} recorded no daily counts (dw/days_json): it is not "
                   "a volume check; name the asset's volume check, or bring the series")
    return _series([{"day": d, "rows": n} for d, n in counts.items()]), sql, f"{key.to_user_string()}:{check}"


def monitor_metrics(state: DwState, *, series: list[dict] | None = None, asset: str | list[str] | None = None,
                    check: str = c.VOLUME_CHECK, table: str | None = None, timestamp_column: str | None = None,
                    dialect: str = "duckdb", evaluate_days: int = 1, training_days: int = 28, sensitivity: float = 3.0,
                    min_band_pct: float = 2.0, min_history: int = 3, method: str = "zscore") -> MetricsVerdict:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    if (series is None) == (asset is None):
        raise fail("give either series (rows per day) or asset (whose volume check recorded its counts), not both")
    if method not in ("zscore", "mad"):
        raise fail(f"method must be 'zscore' or 'mad', got {shown(method)}")
    if series is not None:
        counts, sql, source = _series(series), None, "series"
        if table and timestamp_column:
            last = max(counts)
            try:
                sql = daily_counts_sql(table, timestamp_column, min(counts), last, dialect)
            except ValueError as e:
                raise fail(f"cannot build the counting query: {e}") from e
    else:
        counts, sql, source = _recorded(state, asset, check)
    last = max(counts)
    evaluate = [last - dt.timedelta(days=i) for i in reversed(range(min(evaluate_days, len(counts))))]
    scores: list[DayScore] = score_days(counts, evaluate, training_days=training_days, sensitivity=sensitivity,
                                        min_history=min_history, min_band_pct=min_band_pct, method=method)
    bad = [s for s in scores if not s.passed]
    verdict = ("ok" if not bad else "insufficient_history" if all(s.status == "insufficient_history" for s in bad)
               else "anomalous")
    return MetricsVerdict(
        verdict=verdict, scored=[MetricDay(**s.model_dump(exclude={"stddev"})) for s in scores],
        out_of_band=[s.day.isoformat() for s in bad if s.status != "insufficient_history"], method=method,
        sensitivity=sensitivity, training_days=training_days, min_band_pct=min_band_pct, series_days=len(counts),
        source=source, sql=sql)


__all__ = ["MetricDay", "MetricsVerdict", "monitor_metrics"]
