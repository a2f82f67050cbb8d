"""Issue 14 kind 9: a reconciliation check can compare only closed partitions (rows up to a cut-off
it states), so rows of the partition still loading are never reported as "rows short".

Real tables on DuckDB and PostgreSQL; an hourly America/Chicago definition so the cut-off is an
hour boundary off UTC midnight.
"""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.checks.reconcile import comparison_scope, reconcile
from dw_dagster.config import ReconciliationConfig
from dw_dagster.wiring.checks import partition_scope as _partition_scope
from dw_dagster.errors import DwDagsterError

HOURLY = dg.HourlyPartitionsDefinition(start_date="2026-11-30-00:00", timezone="America/Chicago")
NOW = dt.datetime(2026, 12, 1, 15, 40, tzinfo=dt.timezone.utc)  # 09:40 in Chicago


def _tables(db, schema):
    db.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    db.execute(f"CREATE SCHEMA {schema}")
    for t in ("src", "tgt"):
        db.execute(f"CREATE TABLE {schema}.{t} (id INTEGER, region VARCHAR(8), loaded_at TIMESTAMP, amount DECIMAL(12, 2))")
    rows = []
    t0 = dt.datetime(2026, 12, 1, 10)  # UTC: 04:00 Chicago
    for i in range(60):
        rows.append((i, "EU" if i % 3 else "US", t0 + dt.timedelta(minutes=6 * i), 1.5))
    values = ", ".join(f"({i}, '{r}', TIMESTAMP '{ts.isoformat(sep=' ')}', {a})" for i, r, ts, a in rows)
    db.execute(f"INSERT INTO {schema}.src VALUES {values}")
    # the target has everything of the closed hours, and only part of 09:00 Chicago (15:00 UTC), still loading
    db.execute(f"INSERT INTO {schema}.tgt SELECT * FROM {schema}.src WHERE loaded_at < TIMESTAMP '2026-12-01 15:20:00'")


def _check(db, schema):
    _tables(db, schema)
    everything = reconcile(db, db, f"{schema}.src", f"{schema}.tgt", ["region"], ["amount"], ["id"])
    assert not everything.passed and everything.gap_rows == 6  # 15:24 ... 15:54 UTC: the hour still loading
    where, scope = comparison_scope(HOURLY, "loaded_at", closed_only=True, now=NOW)
    assert scope == {"compared_up_to": "2026-12-01T15:00:00"}  # the start of 09:00 in Chicago
    closed = reconcile(db, db, f"{schema}.src", f"{schema}.tgt", ["region"], ["amount"], ["id"], where)
    assert closed.passed and sum(s.source_rows for s in closed.slices) == 50
    # a real shortfall in a closed hour is still found
    db.execute(f"DELETE FROM {schema}.tgt WHERE id = 3")
    short = reconcile(db, db, f"{schema}.src", f"{schema}.tgt", ["region"], ["amount"], ["id"], where)
    assert not short.passed and short.gap_rows == 1
    # only a repair's window: one hour
    where, scope = comparison_scope(HOURLY, "loaded_at", window=["2026-12-01-05:00"], now=NOW)
    one = reconcile(db, db, f"{schema}.src", f"{schema}.tgt", ["region"], ["amount"], ["id"], where)
    assert one.passed and sum(s.source_rows for s in one.slices) == 10 and scope["partitions"] == ["2026-12-01-05:00"]


def test_closed_partitions_only_on_duckdb(duck):
    _check(duck, "rs")


def test_closed_partitions_only_on_postgres(postgres):
    try:
        _check(postgres, "rs_scope")
    finally:
        postgres.execute("DROP SCHEMA IF EXISTS rs_scope CASCADE")


def test_the_configuration_says_it_too():
    base = {"source": {"database": "src", "table": "s.t"}, "slice_by": ["region"]}
    r = ReconciliationConfig(**base, partition_column="loaded_at", closed_partitions_only=True)
    assert _partition_scope(r, HOURLY) == {"partition_column": "loaded_at", "partitions_def": HOURLY,
                                           "closed_partitions_only": True}
    assert _partition_scope(ReconciliationConfig(**base), None) == {}
    with pytest.raises(DwDagsterError, match="needs partition_column"):
        _partition_scope(ReconciliationConfig(**base, closed_partitions_only=True), HOURLY)
    with pytest.raises(DwDagsterError, match="time-window partitions"):
        _partition_scope(ReconciliationConfig(**base, partition_column="loaded_at"), None)
