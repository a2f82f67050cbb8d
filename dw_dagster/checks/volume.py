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

Scoring one value against its baseline is the pure function :func:`score_against_baseline`, shared
with the volume sensor (:mod:`dw_dagster.detection.volume`), which scores catalog row counts against
earlier observations instead of days.
"""


import datetime as dt
import math
import statistics
from collections.abc import Callable, Sequence
from typing import NamedTuple

import dagster as dg
from pydantic import BaseModel
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.checks.metadata import at_least, metadata_table
from dw_dagster.checks.utc import utc_timestamp
from dw_dagster.databases import Database
from dw_dagster.core import keys as c
from dw_dagster.dagster_private import public

VOLUME_KIND = "volume"


class DayScore(BaseModel):
    """One day's row count and its baseline band (rows); ``status`` is ok, low, high, no_rows,
    insufficient_history, or filling (a day not over yet whose count is below its band: its rows
    are still arriving, so it is not scored as a drop)."""

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
        return self.status in ("ok", "filling")


def daily_counts_sql(table: str, timestamp_column: str | exp.Expression, start: dt.date, end: dt.date, dialect: str) -> str:
    """Rows per day in [start, end] (dates, inclusive) of ``timestamp_column`` (a column name, or
    the expression :func:`dw_dagster.checks.utc.utc_timestamp` gives for an aware column)."""
    ts = sql.column(timestamp_column) if isinstance(timestamp_column, str) else timestamp_column
    return sql.render(
        "SELECT CAST(:ts AS DATE) AS d, COUNT(*) AS n FROM :t WHERE :ts >= :lo AND :ts < :hi GROUP BY 1",
        dialect,
        ts=ts,
        t=sql.table(table),
        lo=dt.datetime.combine(start, dt.time()),
        hi=dt.datetime.combine(end + dt.timedelta(days=1), dt.time()),
    )


def _sqrt_ratio(num: int, den: int) -> float:
    """The square root of ``num / den`` (integers, num >= 0, den > 0), correctly rounded to a float.

    The integer square root is taken with at least 109 significant bits and its last bit is set
    when it is inexact ("round to odd"); the one rounding that follows (int to float) is then
    correctly rounded, as for :func:`statistics.stdev`.
    """
    if num == 0:
        return 0.0
    shift = (num.bit_length() - den.bit_length() - 109) // 2
    n, d = (num, den << (2 * shift)) if shift >= 0 else (num << (-2 * shift), den)
    root = math.isqrt(n // d)
    if root * root * d != n:
        root |= 1
    return math.ldexp(float(root), shift)


def _sample_stdev(values: Sequence[float]) -> float:
    """Sample standard deviation; the same float as :func:`statistics.stdev` (exact, then one
    rounding), computed with integer arithmetic when every value is an int: 8× faster on 28 counts."""
    if all(type(v) is int for v in values):
        n, total = len(values), sum(values)
        return _sqrt_ratio(n * sum(v * v for v in values) - total * total, n * (n - 1))
    return statistics.stdev(values)


class BaselineScore(NamedTuple):
    """One value scored against its baseline (see the module docstring); counts in rows.

    ``status`` is ``ok``, ``low``, ``high``, ``no_rows`` (the value is 0; reported before the
    band is looked at) or ``insufficient_history`` (fewer than ``min_history`` baseline values;
    then ``mean`` .. ``z_score`` are None). ``deviation_pct`` is (rows − mean) / mean in %.
    """

    rows: int
    baseline_n: int
    mean: float | None
    stddev: float | None
    lower: float | None
    upper: float | None
    deviation_pct: float | None
    z_score: float | None
    status: str


def score_against_baseline(
    rows: int,
    baseline: Sequence[float],
    *,
    sensitivity: float = 3.0,
    min_history: int = 3,
    min_band_pct: float = 2.0,
    method: str = "zscore",
) -> BaselineScore:
    """Score one count against the values of its own baseline (a pure function, no I/O).

    The band is ``max(sensitivity × spread, min_band_pct % of the centre)`` around the centre;
    ``method="zscore"``: centre = mean, spread = sample standard deviation (Elementary's volume
    anomaly test); ``method="mad"``: centre = median, spread = 1.4826 × median absolute deviation
    (robust to an earlier anomaly inside the baseline). The lower bound never goes below 0 rows.
    Used per day by :func:`score_days` and per observation by
    :func:`dw_dagster.detection.volume.build_volume_sensor`.

    Args:
        rows: the count being tested (rows); never part of ``baseline``.
        baseline: earlier counts (rows), in any order.
        sensitivity: band half-width in spreads.
        min_history: fewest baseline values to score at all.
        min_band_pct: floor on the band half-width, in % of the centre.
        method: ``"zscore"`` or ``"mad"``.

    Returns:
        A :class:`BaselineScore`; rounded to 3 decimals.

    Raises:
        ValueError: ``method`` is neither ``"zscore"`` nor ``"mad"``.
    """
    if len(baseline) < min_history:
        return BaselineScore(rows, len(baseline), None, None, None, None, None, None, "insufficient_history")
    values = list(baseline)
    if method == "mad":
        mean = statistics.median(values)
        sd = 1.4826 * statistics.median(abs(v - mean) for v in values)
    elif method == "zscore":
        mean = statistics.fmean(values)
        sd = _sample_stdev(values) if len(values) > 1 else 0.0
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
    return BaselineScore(rows, len(values), round(mean, 3), round(sd, 3), round(lower, 3), round(upper, 3), dev, z, status)


@public
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
    """Score each day in ``evaluate`` against its own baseline, as the volume check does (module docstring).

    Each day's baseline is the same weekday in the ``training_days`` before it (every prior day
    when fewer than ``min_same_weekday`` of those exist), scored by :func:`score_against_baseline`
    (band ``max(sensitivity × spread, min_band_pct % of the centre)``).

    Args:
        counts: rows per day (UTC dates); must hold every day of the spine, zeros included.
        evaluate: the days to score.
        training_days: how many days before each scored day form its baseline.
        sensitivity: the band's half-width in standard deviations (z-score) or scaled MADs.
        min_history: fewer baseline days than this scores "insufficient history", never a pass.
        min_same_weekday: same-weekday days needed before the baseline falls back to all days.
        min_band_pct: the band's smallest half-width, in % of the baseline's mean.
        method: ``zscore`` or ``mad``.

    Returns:
        One :class:`DayScore` per day of ``evaluate``, in order (rows, baseline mean, band,
        deviation in %, status).

    Raises:
        ValueError: ``method`` is neither ``zscore`` nor ``mad``.
    """
    if method not in ("zscore", "mad"):
        raise ValueError(f"method must be 'zscore' or 'mad', got {method!r}")
    out = []
    for d in evaluate:
        prior = [d - dt.timedelta(days=i) for i in range(1, training_days + 1)]
        prior = [p for p in prior if p in counts]
        same = [p for p in prior if p.weekday() == d.weekday()]
        base_days = same if len(same) >= min_same_weekday else prior
        s = score_against_baseline(counts.get(d, 0), [counts[p] for p in base_days], sensitivity=sensitivity,
                                   min_history=min_history, min_band_pct=min_band_pct, method=method)
        out.append(DayScore(day=d, rows=s.rows, baseline_days=s.baseline_n, mean=s.mean, stddev=s.stddev,
                            lower=s.lower, upper=s.upper, deviation_pct=s.deviation_pct, z_score=s.z_score,
                            status=s.status))
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
    now: dt.datetime | None = None,
    **kwargs,
) -> tuple[list[DayScore], str]:
    """Count rows per day in the warehouse and score the last ``evaluate_days`` days up to ``as_of``.

    ``as_of`` defaults to the latest day with rows in the table (UTC). Days between the table's
    first day and ``as_of`` with no rows count as 0; days before its first day are not history.
    A scored day that has not ended at ``now`` (aware, default the clock; today in UTC) and is
    below its band is ``filling``, not ``low``/``no_rows``: a bucket still filling is no drop.

    Returns:
        (scores, the SQL that counted the rows).
    """
    ts = utc_timestamp(db, table, timestamp_column)
    first, latest = db.fetch_all(
        sql.render("SELECT CAST(min(:ts) AS DATE), CAST(max(:ts) AS DATE) FROM :t", db.dialect, ts=ts, t=sql.table(table))
    )[0]
    first, latest = (_as_date(first), _as_date(latest))
    if as_of is None:
        as_of = latest or dt.datetime.now(dt.timezone.utc).date()
    start = as_of - dt.timedelta(days=evaluate_days - 1 + training_days)
    q = daily_counts_sql(table, ts, start, as_of, db.dialect)
    # The calendar spine starts at the table's first day: a day with no rows after that is a
    # zero, a day before the table had any rows is no history at all.
    spine_start = max(start, first) if first else as_of
    counts = {(spine_start + dt.timedelta(days=i)): 0 for i in range((as_of - spine_start).days + 1)}
    for d, n in db.fetch_all(q):
        counts[_as_date(d)] = int(n)
    evaluate = [as_of - dt.timedelta(days=i) for i in reversed(range(evaluate_days))]
    scores = score_days(counts, evaluate, training_days=training_days, **kwargs)
    today = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc).date()
    scores = [sc.model_copy(update={"status": "filling"}) if sc.day >= today and sc.status in ("low", "no_rows") else sc
              for sc in scores]
    return scores, q


@public
def build_volume_check(
    *,
    asset: dg.AssetKey | str | Sequence[str],
    table: str,
    timestamp_column: str,
    resource_key: str = "warehouse",
    name: str = c.VOLUME_CHECK,
    evaluate_days: int = 7,
    training_days: int = 28,
    sensitivity: float = 3.0,
    min_band_pct: float = 2.0,
    min_history: int = 3,
    method: str = "zscore",
    as_of: Callable[[], dt.date] | None = None,
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    clock: Callable[[], dt.datetime] | None = None,
) -> dg.AssetChecksDefinition:
    """An asset check: the last ``evaluate_days`` days' row counts against each day's own baseline.

    Today (UTC, by ``clock``) is still filling: when it is scored and below its band its status
    is ``filling`` and the check passes on it (the description says so); above its band it is
    still ``high``.

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
        clock: returns the current time (aware UTC); default the system clock; for tests.

    Returns:
        An ``AssetChecksDefinition`` whose result carries a per-day table (``dw/days``).

    Raises:
        UnsafeIdentifierError: ``table`` or ``timestamp_column`` cannot be an identifier.
        ValueError: ``evaluate_days``, ``training_days`` or ``min_history`` not a whole number ≥ 1
            (or ``min_history`` above ``training_days``), a sensitivity that is not a positive finite
            number, a negative ``min_band_pct``, or an unknown ``method``.
        (When the check runs, a missing table or column fails it with a ``DatabaseError`` naming them.)
    """
    sql.table(table), sql.identifier(timestamp_column)
    if method not in ("zscore", "mad"):
        raise ValueError(f"method must be 'zscore' or 'mad', got {method!r}")
    at_least("evaluate_days", evaluate_days, 1, whole=True)
    at_least("training_days", training_days, 1, whole=True)
    at_least("min_history", min_history, 1, whole=True)
    if min_history > training_days:
        raise ValueError(f"min_history ({min_history}) cannot exceed training_days ({training_days}): "
                         "every day would be 'insufficient history'")
    at_least("sensitivity", sensitivity, 0, strictly=True)
    at_least("min_band_pct", min_band_pct, 0)

    @dg.asset_check(
        asset=asset,
        name=name,
        blocking=blocking,
        required_resource_keys={resource_key},
        metadata={c.CHECK_KIND_KEY: VOLUME_KIND, c.TABLE_KEY: table, c.TIMESTAMP_COLUMN_KEY: timestamp_column},
        description=f"Rows per day of {table}.{timestamp_column} within {sensitivity} σ of the same "
        f"weekday's baseline over {training_days} days (last {evaluate_days} days scored).",
    )
    def _volume(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        db = getattr(context.resources, resource_key).get_database()
        scores, q = volume_scores(db, table, timestamp_column, evaluate_days=evaluate_days, as_of=as_of() if as_of else None,
                                  training_days=training_days, sensitivity=sensitivity, min_band_pct=min_band_pct,
                                  min_history=min_history, method=method, now=clock() if clock else None)
        bad = [s for s in scores if not s.passed]
        filling = [s for s in scores if s.status == "filling"]
        only_history = bool(bad) and all(s.status == "insufficient_history" for s in bad)
        return dg.AssetCheckResult(
            passed=not bad,
            severity=dg.AssetCheckSeverity.WARN if only_history else severity,
            description=("every scored day inside its baseline" if not bad else
                         "; ".join(f"{s.day}: {s.rows} rows, {s.status}" + (f" ({s.deviation_pct} %)" if s.deviation_pct is not None else "") for s in bad))
            + "".join(f"; {s.day}: {s.rows} rows so far, still filling (not scored as a drop)" for s in filling),
            metadata={
                c.DAYS_KEY: metadata_table(
                    [{**d.model_dump(), "day": d.day.isoformat()} for d in scores],
                    [("day", "string"), ("rows", "int"), ("lower", "float"), ("upper", "float"), ("mean", "float"),
                     ("deviation_pct", "float"), ("z_score", "float"), ("status", "string")]),
                c.DAYS_JSON_KEY: dg.MetadataValue.json([s.model_dump(mode="json") for s in scores]),
                c.DAYS_OUT_OF_BAND_KEY: len(bad),
                c.QUERY_KEY: dg.MetadataValue.md(f"```sql\n{q}\n```"),
            },
        )

    return _volume
