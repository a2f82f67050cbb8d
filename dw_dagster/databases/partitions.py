"""The rows of a set of partitions, from the asset's own ``PartitionsDefinition``, as one SQL predicate.

A partition key is never parsed: a time-window key's rows are the half-open range
``col >= start AND col < end`` of ``partitions_def.time_window_for_partition_key(key)`` (its
timezone, format and period: an hour, a day in any zone including the 23- and 25-hour days, a
week, a month); a static or dynamic key's rows are ``col = key``; a multi-dimensional key's rows
are each dimension's condition, joined with ``AND`` (the time dimension on the partition column,
each other dimension on its own column: ``dimension_columns``, default the dimension's name).

The bounds follow the column's type (read from the catalog): a naive ``TIMESTAMP`` holds UTC
wall-clock time (the contract of :func:`dw_dagster.core.windows.partition_window_utc`); an aware
one is compared with aware UTC literals (whatever the session's zone); a ``DATE`` holds the
definition's own calendar days (a daily partition in ``America/New_York`` is the date itself, not
a UTC range), and a ``DATE`` column cannot hold partitions shorter than a day. Neighbouring keys
are merged into one range, so a 48-hour window is one comparison, not 48. Every literal and name
is built with sqlglot and written in the warehouse's dialect.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import dagster as dg
from pydantic import BaseModel, Field
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.databases.base import Database, DatabaseError

#: column kinds the bounds are written for
DATE, NAIVE, AWARE, OTHER = "date", "naive", "aware", "other"


class PartitionError(DatabaseError, ValueError):
    """The partitions cannot be turned into a predicate (a key not in the definition, a DATE column
    for hourly partitions...); the message says which and why."""


class PartitionSlice(BaseModel):
    """The rows of one partition (or of neighbouring ones, merged): a time range and/or equalities.

    ``start``/``end`` are naive UTC; ``local_start``/``local_end`` the same instants on the
    definition's own wall clock (what a ``DATE`` column holds). ``equals`` maps a column to the value
    its rows hold (a static or dynamic dimension).
    """

    keys: list[str]
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    local_start: dt.datetime | None = None
    local_end: dt.datetime | None = None
    equals: dict[str, str] = Field(default_factory=dict)


class PartitionFilter(BaseModel):
    """Which rows of a table belong to a set of partition keys (see the module docstring)."""

    time_column: str | None = None
    slices: list[PartitionSlice]

    @property
    def keys(self) -> list[str]:
        return [k for s in self.slices for k in s.keys]


def _time_slice(pdef: dg.TimeWindowPartitionsDefinition, key: str) -> PartitionSlice:
    try:
        tw = pdef.time_window_for_partition_key(key)
        canonical = pdef.get_partition_key_for_timestamp(tw.start.timestamp())
    except Exception as e:  # noqa: BLE001 - Dagster raises several kinds for a key not in its format
        raise PartitionError(f"{key!r} is not a partition key of this {type(pdef).__name__} "
                             f"(format {pdef.fmt!r}, timezone {pdef.timezone}): {e}") from e
    if canonical != key:
        raise PartitionError(f"{key!r} is not a partition key of this {type(pdef).__name__} (format {pdef.fmt!r}, "
                             f"timezone {pdef.timezone}; it reads as partition {canonical!r})")
    utc = dt.timezone.utc
    return PartitionSlice(keys=[key], start=tw.start.astimezone(utc).replace(tzinfo=None),
                          end=tw.end.astimezone(utc).replace(tzinfo=None),
                          local_start=tw.start.replace(tzinfo=None), local_end=tw.end.replace(tzinfo=None))


def _slice(pdef: dg.PartitionsDefinition, key: str, column: str, dimension_columns: Mapping[str, str]) -> PartitionSlice:
    if isinstance(pdef, dg.TimeWindowPartitionsDefinition):
        return _time_slice(pdef, key)
    if isinstance(pdef, dg.MultiPartitionsDefinition):
        try:
            mkey = pdef.get_partition_key_from_str(key) if isinstance(key, str) else key
        except Exception as e:  # noqa: BLE001
            raise PartitionError(f"{key!r} is not a key of this multi-partitions definition "
                                 f"(dimensions {', '.join(d.name for d in pdef.partitions_defs)}): {e}") from e
        out = PartitionSlice(keys=[str(key)])
        for dim in pdef.partitions_defs:
            part = mkey.keys_by_dimension[dim.name]
            if isinstance(dim.partitions_def, dg.TimeWindowPartitionsDefinition):
                t = _time_slice(dim.partitions_def, part)
                out = out.model_copy(update={k: getattr(t, k) for k in ("start", "end", "local_start", "local_end")})
            else:
                out.equals[dimension_columns.get(dim.name, dim.name)] = part
        return out
    if isinstance(pdef, (dg.StaticPartitionsDefinition, dg.DynamicPartitionsDefinition)):
        return PartitionSlice(keys=[key], equals={column: key})
    raise PartitionError(f"no rows can be told apart for a {type(pdef).__name__}; supported: time windows (hourly, "
                         "daily, weekly, monthly, cron), static, dynamic, and multi-partitions of these")


def partition_filter(partitions_def: dg.PartitionsDefinition, keys: Sequence[str], column: str,
                     dimension_columns: Mapping[str, str] | None = None) -> PartitionFilter:
    """The rows of ``keys`` of ``partitions_def`` (``column``: the time column, or the static/dynamic one).

    Raises:
        PartitionError: no keys, a key not of the definition, or a definition with no rows to tell apart.
    """
    if not keys:
        raise PartitionError("a window needs at least one partition key")
    slices = [_slice(partitions_def, k, column, dimension_columns or {}) for k in keys]
    timed = any(s.start is not None for s in slices)
    return PartitionFilter(time_column=column if timed else None, slices=_merged(slices))


def _merged(slices: list[PartitionSlice]) -> list[PartitionSlice]:
    """Neighbouring time ranges with the same equalities as one range (order kept otherwise)."""
    out: list[PartitionSlice] = []
    for s in sorted(slices, key=lambda s: (sorted(s.equals.items()), s.start or dt.datetime.min)):
        last = out[-1] if out else None
        if last is not None and s.start is not None and last.equals == s.equals and last.end == s.start:
            out[-1] = last.model_copy(update={"keys": last.keys + s.keys, "end": s.end, "local_end": s.local_end})
        else:
            out.append(s)
    return out


def column_kind(data_type: str | None) -> str:
    """``date``, ``aware`` (a timestamp with a time zone), ``naive`` (a timestamp without) or ``other``."""
    ty = (data_type or "").upper()
    if ty == "DATE":
        return DATE
    if "WITH TIME ZONE" in ty or any(ty.startswith(t) for t in ("TIMESTAMPTZ", "TIMESTAMP_TZ", "TIMESTAMP_LTZ")):
        return AWARE
    if ty.startswith(("TIMESTAMP", "DATETIME")):
        return NAIVE
    return OTHER


def _bound(value: dt.datetime, kind: str, column: str) -> exp.Expression:
    if kind == DATE:
        if value.time() != dt.time(0):
            raise PartitionError(f"column {column} is a DATE but a partition starts or ends at {value.isoformat()}: "
                                 "a DATE column holds whole days only (use a TIMESTAMP column for shorter partitions)")
        return sql.literal(value.date())
    if kind == AWARE:
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ") + "+00:00"), exp.DataType.build("TIMESTAMPTZ"))
    return sql.literal(value)


def predicate(filt: PartitionFilter, kind: str = NAIVE) -> exp.Expression:
    """The predicate of ``filt`` (a sqlglot expression; ``.sql(dialect)`` writes it): ``kind`` is the
    time column's :func:`column_kind` (naive UTC when it is not a date or an aware timestamp)."""
    ors = []
    for s in filt.slices:
        conds: list[exp.Expression] = []
        if s.start is not None and filt.time_column:
            col = sql.column(filt.time_column)
            lo, hi = (s.local_start, s.local_end) if kind == DATE else (s.start, s.end)
            conds += [exp.GTE(this=col, expression=_bound(lo, kind, filt.time_column)),
                      exp.LT(this=col.copy(), expression=_bound(hi, kind, filt.time_column))]
        conds += [exp.EQ(this=sql.column(c), expression=exp.Literal.string(v)) for c, v in sorted(s.equals.items())]
        ors.append(exp.and_(*conds) if conds else exp.true())
    return exp.or_(*ors) if len(ors) > 1 else ors[0]


def time_column_kind(db: Database, table: str, filt: PartitionFilter) -> str:
    """The :func:`column_kind` of ``filt``'s time column in ``table`` (from the catalog; ``naive`` with none)."""
    if not filt.time_column:
        return NAIVE
    from dw_dagster.databases.catalog import resolve_column, table_columns

    cols = table_columns(db, table)
    name = resolve_column([n for n, _ in cols], filt.time_column, db.dialect, table)
    if name is None:
        raise PartitionError(f"{db.name}: column {filt.time_column} is not in {table} "
                             f"(columns: {', '.join(n for n, _ in cols)})")
    return column_kind(dict(cols)[name])


def where_sql(db: Database, table: str, filt: PartitionFilter) -> str:
    """``filt``'s predicate for ``table`` in ``db``'s dialect, its bounds typed as the time column is."""
    return predicate(filt, time_column_kind(db, table, filt)).sql(dialect=db.dialect)


def legacy_daily_filter(column: str, keys: Sequence[str]) -> PartitionFilter:
    """The filter of ``YYYY-MM-DD`` keys of a UTC daily definition (undo plans recorded before the
    definition was looked up; new code passes the asset's own definition to :func:`partition_filter`).

    Raises:
        PartitionError: a key is not a ``YYYY-MM-DD`` day.
    """
    days = sorted(keys)
    try:
        pdef = dg.DailyPartitionsDefinition(start_date=days[0])
    except Exception as e:  # noqa: BLE001
        raise PartitionError(f"without the asset's partitions definition only UTC days (YYYY-MM-DD) are read; got "
                             f"{', '.join(days[:3])}: {e}") from e
    return partition_filter(pdef, keys, column)


__all__ = ["PartitionError", "PartitionFilter", "PartitionSlice", "column_kind", "legacy_daily_filter",
           "partition_filter", "predicate", "time_column_kind", "where_sql"]
