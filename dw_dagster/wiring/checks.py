"""The asset checks :func:`~dw_dagster.definitions.build_dw_definitions` puts on each watched asset, as configured."""

from __future__ import annotations

import datetime as dt
from typing import Any

import dagster as dg

from dw_dagster.config import WatchedAssetConfig
from dw_dagster.errors import DwConfigError


def asset_key(s: str) -> dg.AssetKey:
    return dg.AssetKey.from_user_string(s)


def check_key(s: str) -> dg.AssetCheckKey:
    asset, sep, name = s.rpartition(":")
    if not sep or not asset or not name:
        raise DwConfigError(f"{s!r} is not asset/key:check_name")
    return dg.AssetCheckKey(asset_key(asset), name)


def _day(text: str | None):
    """``as_of`` of a check: a callable returning the configured day, or None (today)."""
    if not text:
        return None
    try:
        day = dt.date.fromisoformat(text)
    except ValueError as e:
        raise DwConfigError(f"as_of: {text!r} is not a YYYY-MM-DD date") from e
    return lambda: day


def partition_scope(r, partitions_def) -> dict[str, Any]:
    """The reconciliation check's partition scope from its configuration (none without a partition column)."""
    if r.partition_column is None:
        if r.closed_partitions_only:
            raise DwConfigError(f"checks.reconciliation {r.name}: closed_partitions_only needs partition_column")
        return {}
    if partitions_def is None:
        raise DwConfigError(f"checks.reconciliation {r.name}: partition_column needs the asset's time-window partitions")
    return {"partition_column": r.partition_column, "partitions_def": partitions_def,
            "closed_partitions_only": r.closed_partitions_only}


def checks_for(a: WatchedAssetConfig, sink_view: str | None, prepare=None,
                partitions_def: dg.PartitionsDefinition | None = None) -> list[dg.AssetChecksDefinition]:
    from dw_dagster.checks import (
        build_dead_letter_check,
        build_freshness_check,
        build_null_rate_check,
        build_reconciliation_checks,
        build_row_diff_check,
        build_volume_check,
    )

    key, c = asset_key(a.key), a.checks
    out = []
    if c.reconciliation is not None:
        r = c.reconciliation
        out.append(build_reconciliation_checks(
            asset=key, source_asset=asset_key(r.source.asset) if r.source.asset else None, source_table=r.source.table,
            target_table=a.table, slice_by=r.slice_by, measures=r.measures, key_columns=r.key_columns,
            source_resource_key=r.source.database, target_resource_key=a.database, name=r.name,
            **partition_scope(r, partitions_def)))
    if c.row_diff is not None:
        r = c.row_diff
        out.append(build_row_diff_check(
            asset=key, source_asset=asset_key(r.source.asset) if r.source.asset else None, source_table=r.source.table,
            target_table=a.table, key_columns=r.key_columns, compare_columns=r.compare_columns,
            source_resource_key=r.source.database, target_resource_key=a.database, name=r.name,
            timestamp_precision=r.timestamp_precision, timestamp_rounding=r.timestamp_rounding,
            case_insensitive_keys=r.case_insensitive_keys, trim_trailing_blanks=r.trim_trailing_blanks,
            source_char_columns=r.source_char_columns, target_char_columns=r.target_char_columns))
    if c.volume is not None:
        v = c.volume
        out.append(build_volume_check(
            asset=key, table=a.table, timestamp_column=v.timestamp_column, resource_key=a.database, name=v.name,
            evaluate_days=v.evaluate_days, training_days=v.training_days, sensitivity=v.sensitivity,
            min_band_pct=v.min_band_pct, method=v.method, as_of=_day(v.as_of)))
    if c.null_rate is not None:
        n = c.null_rate
        out.append(build_null_rate_check(
            asset=key, table=a.table, columns=n.columns, timestamp_column=n.timestamp_column, resource_key=a.database,
            name=n.name, tolerance_pct=n.tolerance_pct, as_of=_day(n.as_of)))
    if c.freshness is not None:
        f = c.freshness
        out.append(build_freshness_check(
            asset=key, table=a.table, timestamp_column=f.timestamp_column,
            max_lag=dt.timedelta(hours=f.max_lag_hours) if f.max_lag_hours is not None else None,
            max_lag_days=f.max_lag_days, deadline_timezone=f.deadline_timezone,
            resource_key=a.database, name=f.name, naive_timezone=f.naive_timezone))
    if c.dead_letter is not None:
        d = c.dead_letter
        out.append(build_dead_letter_check(
            asset=key, table=d.table or sink_view, timestamp_column=d.timestamp_column, reason_column=d.reason_column,
            resource_key=a.database, name=d.name, lookback_hours=d.lookback_hours, max_rows=d.max_rows,
            prepare=prepare if d.table is None else None))
    return out


class SinkRef:
    """A sink's tables and key; the columns are read from the target's catalog when it is diagnosed."""

    def __init__(self, *, table: str, dead_letter_table: str, key: str) -> None:
        from dw_dagster.databases.sql import check_name, check_table_name

        self.table, self.dead_letter_table, self.key = (check_table_name(table), check_table_name(dead_letter_table),
                                                        check_name(key, "key column"))

    def __call__(self, db):
        """The :class:`~dw_dagster.pipelines.sink.SinkTable` as ``db``'s catalog has the target now."""
        from dw_dagster.pipelines.sink import sink_table_from_catalog

        return sink_table_from_catalog(db, self.table, self.dead_letter_table, self.key)

    def prepare(self, db) -> None:
        """Create the replay ledger and the view of the rows still parked, when missing."""
        from dw_dagster.changes.replay import ReplaySpec, ensure_replay_tables

        ensure_replay_tables(db, ReplaySpec.for_sink_table(self(db), expected_rows=0))
