"""A check factory refuses a configuration that would silently do the wrong thing, when it is built."""

import datetime as dt

import pytest

from dw_dagster import (
    build_dead_letter_check,
    build_freshness_check,
    build_null_rate_check,
    build_reconciliation_checks,
    build_row_diff_check,
    build_volume_check,
)

REC = dict(asset="t", source_asset="s", source_table="s", target_table="t")


@pytest.mark.parametrize("build,kwargs,message", [
    (build_reconciliation_checks, dict(REC, slice_by="region"), "slice_by must be a list of column names, got the string 'region'"),
    (build_reconciliation_checks, dict(REC, slice_by=["region"], measures="amount"), "measures must be a list"),
    (build_reconciliation_checks, dict(REC, slice_by=[], key_columns="id"), "key_columns must be a list"),
    (build_row_diff_check, dict(REC, key_columns="id"), "key_columns must be a list"),
    (build_row_diff_check, dict(REC, key_columns=[]), "key_columns must name at least one column"),
    (build_null_rate_check, dict(asset="t", table="t", columns="region"), "columns must be a list"),
    (build_null_rate_check, dict(asset="t", table="t", columns=[]), "columns must name at least one column"),
    (build_null_rate_check, dict(asset="t", table="t", columns=["c"], baseline_days=0), "baseline_days must be ≥ 1"),
    (build_volume_check, dict(asset="t", table="t", timestamp_column="ts", evaluate_days=0), "evaluate_days must be ≥ 1, got 0"),
    (build_volume_check, dict(asset="t", table="t", timestamp_column="ts", evaluate_days=-1), "evaluate_days must be ≥ 1"),
    (build_volume_check, dict(asset="t", table="t", timestamp_column="ts", sensitivity=-3), "sensitivity must be > 0"),
    (build_volume_check, dict(asset="t", table="t", timestamp_column="ts", sensitivity=float("nan")), "sensitivity must be a finite number"),
    (build_volume_check, dict(asset="t", table="t", timestamp_column="ts", sensitivity=float("inf")), "sensitivity must be a finite number"),
    (build_volume_check, dict(asset="t", table="t", timestamp_column="ts", training_days=2.5), "training_days must be a whole number"),
    (build_volume_check, dict(asset="t", table="t", timestamp_column="ts", evaluate_days="7"), "evaluate_days must be a whole number"),
    (build_volume_check, dict(asset="t", table="t", timestamp_column="ts", training_days=2, min_history=3), "cannot exceed training_days"),
    (build_row_diff_check, dict(REC, key_columns=["id"], timestamp_precision="fortnight"), "timestamp_precision must be one of"),
    (build_row_diff_check, dict(REC, key_columns=["id"], timestamp_precision="second', x) --"), "timestamp_precision must be one of"),
    (build_row_diff_check, dict(REC, key_columns=["id"], rel_tolerance=float("nan")), "rel_tolerance must be a finite number"),
    (build_row_diff_check, dict(REC, key_columns=["id"], abs_tolerance=-1), "abs_tolerance must be a finite number ≥ 0"),
    (build_row_diff_check, dict(REC, key_columns=["id", "ID"]), "names a column twice"),
    (build_row_diff_check, dict(REC, key_columns=["id"], max_download_rows=0), "max_download_rows must be ≥ 1"),
    (build_freshness_check, dict(asset="t", table="t", timestamp_column="ts", max_lag=3600), "max_lag must be a datetime.timedelta"),
    (build_freshness_check, dict(asset="t", table="t", timestamp_column="ts", max_lag=dt.timedelta(hours=1), deadline="06:00"),
     "deadline must be a datetime.time"),
    (build_freshness_check, dict(asset="t", table="t", timestamp_column="ts", max_lag=dt.timedelta(hours=1), deadline_timezone="Mars/Base"),
     "deadline_timezone must be an IANA time zone name"),
    (build_volume_check, dict(asset="t", table="t", timestamp_column="ts", training_days=0), "training_days must be ≥ 1"),
    (build_dead_letter_check, dict(asset="t", table="d", timestamp_column="ts", reason_column="r", lookback_hours=0),
     "lookback_hours must be > 0"),
    (build_dead_letter_check, dict(asset="t", table="d", timestamp_column="ts", reason_column="r", max_rows=-1), "max_rows must be ≥ 0"),
    (build_freshness_check, dict(asset="t", table="t", timestamp_column="ts", max_lag=dt.timedelta(hours=-1)),
     "max_lag must not be negative"),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_refused_when_built(build, kwargs, message):
    with pytest.raises(ValueError) as e:
        build(**kwargs)
    assert message in str(e.value)


def test_lists_and_tuples_are_fine():
    build_reconciliation_checks(**REC, slice_by=("region",), measures=["amount"], key_columns=("id",))
    build_volume_check(asset="t", table="t", timestamp_column="ts", evaluate_days=1, sensitivity=0.5)
