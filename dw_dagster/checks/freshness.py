"""Freshness: how old the newest timestamp in a table is, in UTC, with an optional daily deadline.

Timestamps are normalized to UTC before any arithmetic: a timezone-aware value is converted; a
naive value is taken to be in ``naive_timezone`` (UTC by contract unless configured). The result
does not depend on the database session's time zone. An empty table, or a column that is NULL
in every row, fails with "no timestamp observed" — never a silent pass (PUBLIC_CASES C14).

A newest timestamp later than now (beyond ``future_tolerance``, default 5 minutes of clock skew)
fails too: one row stamped in the future would otherwise make the table look fresh forever.

Two rules:

- ``max_lag`` alone: the newest timestamp must be at most ``max_lag`` old now.
- ``deadline`` (a local wall-clock time such as 06:00) in ``deadline_timezone``: at the most
  recent deadline before now, data up to ``deadline − max_lag`` must be there. The deadline is
  computed in local time with ``zoneinfo`` and converted to UTC, so it stays at 06:00 local on
  both sides of a daylight-saving change.

``max_lag`` is **absolute (elapsed) time**: ``timedelta(days=1)`` is 24 hours, also across a
23- or 25-hour day. For calendar days give ``max_lag_days=N``: the reference (the deadline, or
now) moved back N wall-clock days in ``deadline_timezone`` (06:00 on the day after spring-forward
→ 06:00 the day before, 23 hours earlier), then back by ``max_lag`` (default 0) if both are given.
"""

import datetime as dt
import decimal
from collections.abc import Callable, Sequence
from zoneinfo import ZoneInfo

import dagster as dg
from pydantic import BaseModel

from dw_dagster.databases import sql
from dw_dagster.databases import Database, DatabaseError
from dw_dagster.core import keys as c
from dw_dagster.dagster_private import public

FRESHNESS_KIND = "freshness"
UTC = dt.timezone.utc


class FreshnessResult(BaseModel):
    """Newest timestamp (UTC), its lag in seconds, the bound it was held to, and the verdict."""

    max_timestamp_utc: dt.datetime | None
    rows: int
    non_null_rows: int
    evaluated_at_utc: dt.datetime
    lag_seconds: float | None
    required_after_utc: dt.datetime
    deadline_utc: dt.datetime | None
    passed: bool
    reason: str


def to_utc(value, naive_timezone: str = "UTC") -> dt.datetime | None:
    """A database timestamp as an aware UTC datetime (naive values are in ``naive_timezone``)."""
    if value is None:
        return None
    if isinstance(value, (int, float, decimal.Decimal)):  # bool is an int too: refused the same way
        raise ValueError(f"the newest value is the number {value!r}, not a timestamp (an epoch in seconds? "
                         "milliseconds?): freshness reads a timestamp column; convert it in a view, e.g. "
                         "to_timestamp(n) for epoch seconds")
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time())
    if value.tzinfo is None:
        value = value.replace(tzinfo=ZoneInfo(naive_timezone))
    return value.astimezone(UTC)


def last_deadline(now_utc: dt.datetime, deadline: dt.time, timezone: str) -> dt.datetime:
    """The most recent local ``deadline`` at or before ``now_utc``, as UTC."""
    tz = ZoneInfo(timezone)
    local_now = now_utc.astimezone(tz)
    for back in (0, 1):
        day = local_now.date() - dt.timedelta(days=back)
        cand = dt.datetime.combine(day, deadline, tzinfo=tz).astimezone(UTC)
        if cand <= now_utc:
            return cand
    raise AssertionError("unreachable")


DEFAULT_FUTURE_TOLERANCE = dt.timedelta(minutes=5)


def calendar_days_before(t_utc: dt.datetime, days: int, timezone: str) -> dt.datetime:
    """The same wall-clock time ``days`` calendar days before ``t_utc`` in ``timezone``, as UTC
    (a local time that does not exist that day resolves forward, as ``zoneinfo`` does)."""
    tz = ZoneInfo(timezone)
    local = t_utc.astimezone(tz)
    back = dt.datetime.combine(local.date() - dt.timedelta(days=days), local.time(), tzinfo=tz).replace(fold=local.fold)
    return back.astimezone(UTC)


def evaluate_freshness(max_ts_utc: dt.datetime | None, rows: int, non_null: int, now_utc: dt.datetime,
                       max_lag: dt.timedelta | None, deadline: dt.time | None = None, deadline_timezone: str = "UTC",
                       future_tolerance: dt.timedelta | None = DEFAULT_FUTURE_TOLERANCE,
                       max_lag_days: int | None = None) -> FreshnessResult:
    """Apply the rule in the module docstring (no non-NULL value means no timestamp, whatever MAX said).

    ``max_lag`` is elapsed time; ``max_lag_days`` calendar days in ``deadline_timezone`` (both:
    the days first, then the elapsed time). ``future_tolerance=None`` accepts timestamps in the
    future (a table of scheduled events)."""
    if non_null == 0:
        max_ts_utc = None
    dl = last_deadline(now_utc, deadline, deadline_timezone) if deadline else None
    required = dl or now_utc
    if max_lag_days:
        required = calendar_days_before(required, max_lag_days, deadline_timezone)
    required -= max_lag or dt.timedelta(0)
    lag = (now_utc - max_ts_utc).total_seconds() if max_ts_utc else None
    if max_ts_utc is None:
        passed, reason = False, "no timestamp observed" + (" (table is empty)" if rows == 0 else f" ({rows} rows, all NULL)")
    elif future_tolerance is not None and max_ts_utc > now_utc + future_tolerance:
        passed, reason = False, (f"newest {max_ts_utc.isoformat()} is in the future (now {now_utc.isoformat()}, "
                                 f"tolerance {future_tolerance.total_seconds() / 60:g} min): clock skew or a bad row")
    elif max_ts_utc >= required:
        passed, reason = True, f"newest {max_ts_utc.isoformat()} is after {required.isoformat()}"
        if max_ts_utc > now_utc:
            reason += f" (it is {(max_ts_utc - now_utc).total_seconds() / 3600:.2f} h in the future)"
    else:
        passed, reason = False, f"newest {max_ts_utc.isoformat()} is before {required.isoformat()} (lag {lag / 3600:.2f} h)"
    return FreshnessResult(max_timestamp_utc=max_ts_utc, rows=rows, non_null_rows=non_null, evaluated_at_utc=now_utc,
                           lag_seconds=lag, required_after_utc=required, deadline_utc=dl, passed=passed, reason=reason)


def freshness(db: Database, table: str, timestamp_column: str, *, max_lag: dt.timedelta | None,
              now_utc: dt.datetime | None = None,
              naive_timezone: str = "UTC", deadline: dt.time | None = None, deadline_timezone: str = "UTC",
              future_tolerance: dt.timedelta | None = DEFAULT_FUTURE_TOLERANCE,
              max_lag_days: int | None = None) -> tuple[FreshnessResult, str]:
    """Query ``MAX``/``COUNT`` of the column and judge it; returns (result, the SQL run)."""
    from dw_dagster.checks.utc import catalog_column

    ts = catalog_column(db, table, timestamp_column)  # as the catalog spells it ("LoadedAt" stays itself)
    q = sql.render("SELECT MAX(:ts), COUNT(*), COUNT(:ts) FROM :t", db.dialect, ts=ts, t=sql.table(table))
    mx, rows, nn = db.fetch_all(q)[0]
    now = (now_utc or dt.datetime.now(UTC)).astimezone(UTC)
    try:
        newest = to_utc(mx, naive_timezone)
    except ValueError as e:
        raise DatabaseError(f"freshness of {table}.{timestamp_column}: {e}") from e
    return evaluate_freshness(newest, int(rows), int(nn), now, max_lag, deadline, deadline_timezone,
                              future_tolerance, max_lag_days), q


@public
def build_freshness_check(
    *,
    asset: dg.AssetKey | str | Sequence[str],
    table: str,
    timestamp_column: str,
    max_lag: dt.timedelta | None = None,
    resource_key: str = "warehouse",
    name: str = c.FRESHNESS_CHECK,
    naive_timezone: str = "UTC",
    deadline: dt.time | None = None,
    deadline_timezone: str = "UTC",
    now: Callable[[], dt.datetime] | None = None,
    future_tolerance: dt.timedelta | None = DEFAULT_FUTURE_TOLERANCE,
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    max_lag_days: int | None = None,
) -> dg.AssetChecksDefinition:
    """An asset check on the age of the newest ``timestamp_column`` value (see the module docstring).

    Args:
        asset: the asset whose table is checked.
        table: ``schema.table`` in the warehouse.
        timestamp_column: the column whose newest value is the table's age (UTC; see ``naive_timezone``).
        resource_key: key of a :class:`~dw_dagster.databases.DatabaseResource`.
        name: the check name.
        max_lag: the largest allowed age (or, with ``deadline``, how far before the deadline data
            must reach), as **absolute elapsed time**: ``timedelta(days=1)`` is 24 h, also on a
            23- or 25-hour DST day.
        max_lag_days: the same in **calendar days** of ``deadline_timezone``: the reference time
            moved back this many wall-clock days (23 h across spring-forward, 25 h across
            fall-back); with ``max_lag`` too, that is subtracted after. One of the two is needed.
        naive_timezone: the zone of a column without time zone (default UTC, by contract).
        deadline, deadline_timezone: a daily local deadline, e.g. ``time(6)`` in ``"America/New_York"``.
        now: the clock (UTC), for tests; default the current time.
        future_tolerance: how far past now the newest value may be (clock skew) before the check
            fails with "in the future"; ``None`` allows any future timestamp.

    Returns:
        An ``AssetChecksDefinition``; metadata ``dw/max_timestamp_utc`` (null when none),
        ``dw/lag_seconds``, ``dw/required_after_utc``, ``dw/reason``.

    Raises:
        UnsafeIdentifierError: ``table`` or ``timestamp_column`` cannot be an identifier.
        ValueError: ``max_lag`` or ``future_tolerance`` negative or not a ``timedelta``, neither
            ``max_lag`` nor ``max_lag_days`` given, ``max_lag_days`` not a whole number ≥ 0,
            ``deadline`` not a ``datetime.time``, or an unknown time zone name.
        (When the check runs, a missing table or column fails it with a ``DatabaseError`` naming them.)
    """
    sql.table(table), sql.identifier(timestamp_column)
    for arg, zone in (("naive_timezone", naive_timezone), ("deadline_timezone", deadline_timezone)):
        try:
            ZoneInfo(zone)
        except Exception as e:  # ZoneInfoNotFoundError, ValueError, TypeError
            raise ValueError(f"{arg} must be an IANA time zone name such as 'America/New_York', got {zone!r}") from e
    for arg, v in (("max_lag", max_lag), ("future_tolerance", future_tolerance)):
        if v is not None and not isinstance(v, dt.timedelta):
            raise ValueError(f"{arg} must be a datetime.timedelta, got {v!r}")
    if deadline is not None and not isinstance(deadline, dt.time):
        raise ValueError(f"deadline must be a datetime.time such as time(6), got {deadline!r}")
    if max_lag is None and max_lag_days is None:
        raise ValueError("give max_lag (elapsed time) or max_lag_days (calendar days in deadline_timezone)")
    if max_lag is not None and max_lag < dt.timedelta(0):
        raise ValueError(f"max_lag must not be negative, got {max_lag}")
    if max_lag_days is not None and (isinstance(max_lag_days, bool) or not isinstance(max_lag_days, int) or max_lag_days < 0):
        raise ValueError(f"max_lag_days must be a whole number of days >= 0, got {max_lag_days!r}")
    lag_words = " + ".join(([f"{max_lag_days} calendar day(s) in {deadline_timezone}"] if max_lag_days is not None else [])
                           + ([f"{max_lag} elapsed"] if max_lag is not None else []))
    if future_tolerance is not None and future_tolerance < dt.timedelta(0):
        raise ValueError(f"future_tolerance must not be negative, got {future_tolerance}")

    @dg.asset_check(asset=asset, name=name, blocking=blocking, required_resource_keys={resource_key},
                    metadata={c.CHECK_KIND_KEY: FRESHNESS_KIND, c.TABLE_KEY: table, c.TIMESTAMP_COLUMN_KEY: timestamp_column},
                    description=f"Newest {table}.{timestamp_column} at most {lag_words} old"
                    + (f" at {deadline.isoformat('minutes')} {deadline_timezone}" if deadline else "") + ".")
    def _freshness(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        db = getattr(context.resources, resource_key).get_database()
        r, q = freshness(db, table, timestamp_column, max_lag=max_lag, now_utc=now() if now else None,
                         naive_timezone=naive_timezone, deadline=deadline, deadline_timezone=deadline_timezone,
                         future_tolerance=future_tolerance, max_lag_days=max_lag_days)
        return dg.AssetCheckResult(passed=r.passed, severity=severity, description=r.reason, metadata={
            c.MAX_TIMESTAMP_UTC_KEY: dg.MetadataValue.text(r.max_timestamp_utc.isoformat()) if r.max_timestamp_utc else dg.MetadataValue.null(),
            c.LAG_SECONDS_KEY: dg.MetadataValue.float(r.lag_seconds) if r.lag_seconds is not None else dg.MetadataValue.null(),
            c.REQUIRED_AFTER_UTC_KEY: r.required_after_utc.isoformat(),
            c.ROWS_KEY: r.rows,
            c.REASON_KEY: r.reason,
            c.MAX_LAG_KEY: lag_words,
            c.QUERY_KEY: dg.MetadataValue.md(f"```sql\n{q}\n```"),
        })

    return _freshness
