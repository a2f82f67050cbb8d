"""Volume against the table's own baseline, per day, with a calendar spine.

Method (z-score band, as Elementary's volume anomaly test; defaults from its
``get_config_var.sql``: sensitivity 3, sample standard deviation):

- Rows per UTC day are counted in the warehouse (``GROUP BY CAST(ts AS DATE)``); days with no
  rows are filled in as 0 from a calendar spine, never dropped.
- Each evaluated day is scored against the days strictly before it inside the training window:
  the same weekday when at least ``min_same_weekday`` such days exist (weekly seasonality),
  else all prior days. The tested day is never part of its own baseline.
- Band = max(sensitivity × sample stddev, ``min_band_pct`` % of the mean) around the mean; the
  lower bound never goes below 0 rows. ``method="mad"`` uses the median and 1.4826 × the median
  absolute deviation instead (robust to an earlier anomaly inside the baseline). The floor on the band width follows Soda's
  ``min_confidence_interval_ratio`` idea, so near-constant series do not alert on noise.
- Fewer than ``min_history`` baseline days gives an explicit "insufficient history" result.
"""


import datetime as dt
import statistics
from collections.abc import Callable, Sequence

import dagster as dg
from pydantic import BaseModel

from dw_dagster import sql
from dw_dagster.checks.metadata import metadata_table
from dw_dagster.databases import Database

VOLUME_KIND = "volume"


class DayScore(BaseModel):
    """One day's row count and its baseline band (rows); ``status`` is ok, low, high, no_rows or insufficient_history."""

    day: dt.date
    rows: int
    baseline_days: int
    mean: float | None
    stddev: float | None
    lower: float | None
    upper: float | None
    deviation_pct: float | None
    z_score: float | None = None
    status: str

    @property
    def passed(self) -> bool:
        return self.status in ("ok",)


def daily_counts_sql(table: str, timestamp_column: str, start: dt.date, end: dt.date, dialect: str) -> str:
    """Rows per day in [start, end] (dates, inclusive) of ``timestamp_column``."""
    return sql.render(
        "SELECT CAST(:ts AS DATE) AS d, COUNT(*) AS n FROM :t WHERE :ts >= :lo AND :ts < :hi GROUP BY 1",
        dialect,
        ts=sql.column(timestamp_column),
        t=sql.table(table),
        lo=dt.datetime.combine(start, dt.time()),
        hi=dt.datetime.combine(end + dt.timedelta(days=1), dt.time()),
    )


def score_days(
    counts: dict[dt.date, int],
    evaluate: Sequence[dt.date],
    *,
    training_days: int = 28,
    sensitivity: float = 3.0,
    min_history: int = 3,
    min_same_weekday: int = 3,
    min_band_pct: float = 2.0,
    method: str = "zscore",
) -> list[DayScore]:
    """Score each day in ``evaluate`` against its own baseline (see the module docstring).

    ``counts`` must already hold every day of the spine (zeros included).
    """
    out = []
    for d in evaluate:
        prior = [d - dt.timedelta(days=i) for i in range(1, training_days + 1)]
        prior = [p for p in prior if p in counts]
        same = [p for p in prior if p.weekday() == d.weekday()]
        base_days = same if len(same) >= min_same_weekday else prior
        rows = counts.get(d, 0)
        if len(base_days) < min_history:
            out.append(DayScore(day=d, rows=rows, baseline_days=len(base_days), mean=None, stddev=None,
                                lower=None, upper=None, deviation_pct=None, status="insufficient_history"))
            continue
        values = [counts[p] for p in base_days]
        if method == "mad":
            mean = statistics.median(values)
            sd = 1.4826 * statistics.median(abs(v - mean) for v in values)
        elif method == "zscore":
            mean = statistics.fmean(values)
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
        else:
            raise ValueError(f"method must be 'zscore' or 'mad', got {method!r}")
        band = max(sensitivity * sd, mean * min_band_pct / 100)
        lower, upper = max(0.0, mean - band), mean + band
        dev = round((rows - mean) / mean * 100, 3) if mean else None
        z = round((rows - mean) / sd, 3) if sd else None
        if rows == 0:
            status = "no_rows"
        elif rows < lower:
            status = "low"
        elif rows > upper:
            status = "high"
        else:
            status = "ok"
        out.append(DayScore(day=d, rows=rows, baseline_days=len(base_days), mean=round(mean, 3),
                            stddev=round(sd, 3), lower=round(lower, 3), upper=round(upper, 3),
                            deviation_pct=dev, z_score=z, status=status))
    return out


def _as_date(v) -> dt.date | None:
    if v is None or isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return v
    return v.date() if isinstance(v, dt.datetime) else dt.date.fromisoformat(str(v)[:10])


def volume_scores(
    db: Database,
    table: str,
    timestamp_column: str,
    *,
    evaluate_days: int = 7,
    as_of: dt.date | None = None,
    training_days: int = 28,
    **kwargs,
) -> tuple[list[DayScore], str]:
    """Count rows per day in the warehouse and score the last ``evaluate_days`` days up to ``as_of``.

    ``as_of`` defaults to the latest day with rows in the table (UTC). Days between the table's
    first day and ``as_of`` with no rows count as 0; days before its first day are not history.

    Returns:
        (scores, the SQL that counted the rows).
    """
    first, latest = db.fetch_all(
        sql.render("SELECT CAST(min(:ts) AS DATE), CAST(max(:ts) AS DATE) FROM :t", db.dialect,
                   ts=sql.column(timestamp_column), t=sql.table(table))
    )[0]
    first, latest = (_as_date(first), _as_date(latest))
    if as_of is None:
        as_of = latest or dt.datetime.now(dt.timezone.utc).date()
    start = as_of - dt.timedelta(days=evaluate_days - 1 + training_days)
    q = daily_counts_sql(table, timestamp_column, start, as_of, db.dialect)
    # The calendar spine starts at the table's first day: a day with no rows after that is a
    # zero, a day before the table had any rows is no history at all.
    spine_start = max(start, first) if first else as_of
    counts = {(spine_start + dt.timedelta(days=i)): 0 for i in range((as_of - spine_start).days + 1)}
    for d, n in db.fetch_all(q):
        counts[_as_date(d)] = int(n)
    evaluate = [as_of - dt.timedelta(days=i) for i in reversed(range(evaluate_days))]
    return score_days(counts, evaluate, training_days=training_days, **kwargs), q


def build_volume_check(
    *,
    asset: dg.AssetKey | str | Sequence[str],
    table: str,
    timestamp_column: str,
    resource_key: str = "warehouse",
    name: str = "daily_volume",
    evaluate_days: int = 7,
    training_days: int = 28,
    sensitivity: float = 3.0,
    min_band_pct: float = 2.0,
    min_history: int = 3,
    method: str = "zscore",
    as_of: Callable[[], dt.date] | None = None,
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
) -> dg.AssetChecksDefinition:
    """An asset check: the last ``evaluate_days`` days' row counts against each day's own baseline.

    Args:
        asset: the asset whose table is counted.
        table: ``schema.table`` in the warehouse.
        timestamp_column: the column whose UTC date buckets the rows.
        resource_key: key of a :class:`~dw_dagster.databases.DatabaseResource`.
        evaluate_days: how many of the latest days are scored.
        training_days: how many days before each scored day form its baseline (default 28:
            four same-weekday points).
        sensitivity: band half-width in sample standard deviations (default 3, Elementary's).
        min_band_pct: floor on the band half-width in % of the mean (default 2 %).
        method: ``"zscore"`` (mean and sample stddev, Elementary's) or ``"mad"`` (median and
            scaled median absolute deviation).
        min_history: fewest baseline days to score a day; fewer gives "insufficient history",
            reported as a failed result with WARN severity (never a silent pass).
        as_of: returns the last day to score (e.g. the newest partition); default the latest
            day with rows.

    Returns:
        An ``AssetChecksDefinition`` whose result carries a per-day table (``dw/days``).
    """
    sql.table(table), sql.identifier(timestamp_column)
    if method not in ("zscore", "mad"):
        raise ValueError(f"method must be 'zscore' or 'mad', got {method!r}")

    @dg.asset_check(
        asset=asset,
        name=name,
        blocking=blocking,
        required_resource_keys={resource_key},
        metadata={"dw/check_kind": VOLUME_KIND, "dw/table": table, "dw/timestamp_column": timestamp_column},
        description=f"Rows per day of {table}.{timestamp_column} within {sensitivity} σ of the same "
        f"weekday's baseline over {training_days} days (last {evaluate_days} days scored).",
    )
    def _volume(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        db = getattr(context.resources, resource_key).get_database()
        scores, q = volume_scores(db, table, timestamp_column, evaluate_days=evaluate_days, as_of=as_of() if as_of else None,
                                  training_days=training_days, sensitivity=sensitivity, min_band_pct=min_band_pct,
                                  min_history=min_history, method=method)
        bad = [s for s in scores if not s.passed]
        only_history = bool(bad) and all(s.status == "insufficient_history" for s in bad)
        return dg.AssetCheckResult(
            passed=not bad,
            severity=dg.AssetCheckSeverity.WARN if only_history else severity,
            description="every scored day inside its baseline" if not bad else
            "; ".join(f"{s.day}: {s.rows} rows, {s.status}" + (f" ({s.deviation_pct} %)" if s.deviation_pct is not None else "") for s in bad),
            metadata={
                "dw/days": metadata_table(
                    [{**d.model_dump(), "day": d.day.isoformat()} for d in scores],
                    [("day", "string"), ("rows", "int"), ("lower", "float"), ("upper", "float"), ("mean", "float"),
                     ("deviation_pct", "float"), ("z_score", "float"), ("status", "string")]),
                "dw/days_json": dg.MetadataValue.json([s.model_dump(mode="json") for s in scores]),
                "dw/days_out_of_band": len(bad),
                "dw/query": dg.MetadataValue.md(f"```sql\n{q}\n```"),
            },
        )

    return _volume
