"""Replace a duplicated load's partitions: one row per merge key, guarded by the distinct-key count.

A partition loaded twice by an append-only pipeline (or a MERGE that matched nothing) holds each
key twice. The repair is a ``dedupe`` step (:func:`dedupe_step`, runner :func:`run_dedupe_step`)
that, for the change set's partitions only, keeps one row per key and deletes the rest, in one
transaction (delete the window's rows, insert its distinct rows back). Its guards:

- *before*: every duplicated key's copies are the same row (identical in every column). When the
  copies of a key differ, no row can be chosen safely: the step refuses, naming how many keys and
  a sample, and a person decides;
- *after*: the window's row count equals its distinct-key count measured before. Otherwise the
  step refuses (the window is put back from the copy the ``snapshot`` stage kept: ``dw-dagster
  change-sets undo``).

The window's rows are the partitions' own (:mod:`dw_dagster.databases.partitions`): a daily
partition in ``America/New_York`` is the New York day (05:00 to 05:00 UTC in winter, 23- and
25-hour days included), whatever the column's type (a naive UTC ``TIMESTAMP``, an aware one, a
``DATE`` of the definition's own days). The step records the window's filter; a step recorded
without one (or a change set without a partitions definition) reads UTC days.

The change set keeps the window's rows first, as every window repair does (its undo plan and the
``snapshot`` stage), and holds the window while the step runs; the window is not rerun
(``hold_only``), since rerunning an append-only load would append again.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
from sqlglot import exp

from dw_dagster.core import keys as c
from dw_dagster.core.domains import RERUN_WINDOW
from dw_dagster.core.models import ChangeSet, ChangeStep
from dw_dagster.databases import Database, sql
from dw_dagster.databases.catalog import read_table_schema
from dw_dagster.databases.partitions import (PartitionFilter, legacy_daily_filter, partition_filter, predicate,
                                             time_column_kind)
from dw_dagster.changes.steps import StepRefused

DEDUPE = c.DEDUPE_STEP


def _filter(spec: dict) -> PartitionFilter:
    """The window's rows as recorded in the step (UTC days for a step recorded without a filter)."""
    if spec.get("filter"):
        return PartitionFilter.model_validate(spec["filter"])
    return legacy_daily_filter(spec["partition_column"], spec["window"])


def _where(db: Database, table: str, spec: dict) -> exp.Expression:
    """The window's predicate, its bounds typed as the partition column is in ``db``."""
    filt = _filter(spec)
    return predicate(filt, time_column_kind(db, table, filt))


def dedupe_step(*, table: str, key_columns: Sequence[str], partition_column: str, window: Sequence[str],
                resource_key: str, dialect: str, expected_surplus: int | None = None,
                partitions_def: dg.PartitionsDefinition | None = None) -> ChangeStep:
    """The ``dedupe`` step replacing ``window``'s partitions of ``table`` by one row per key.

    Args:
        table: the loaded table; key_columns: its merge key; partition_column: the column the
            partitions are read on; window: the partition keys to replace.
        resource_key: the database resource; dialect: its sqlglot dialect (the SQL shown is in it).
        expected_surplus: the surplus rows the diagnosis counted (shown; the guard is the key count).
        partitions_def: the asset's partitions (their timezone and period decide the rows); None: UTC days.
    """
    t = sql.table(table)
    filt = (partition_filter(partitions_def, list(window), partition_column) if partitions_def is not None
            else legacy_daily_filter(partition_column, window))
    where = predicate(filt)
    return ChangeStep(
        kind=DEDUPE, change_class=RERUN_WINDOW, resource_key=resource_key,
        summary=(f"replace partitions {', '.join(window)} of {table} by one row per {', '.join(key_columns)} "
                 f"(guard: rows after = distinct keys before{'; ' + str(expected_surplus) + ' surplus row(s) counted' if expected_surplus is not None else ''})"),
        spec={"table": table, "key_columns": list(key_columns), "partition_column": partition_column,
              "window": list(window), "dialect": dialect, "filter": filt.model_dump(mode="json")},
        sql=[exp.delete(t.copy(), where=where.copy()).sql(dialect=dialect),
             f"INSERT INTO {t.sql(dialect=dialect)} SELECT DISTINCT * FROM <the window's rows kept aside>"],
        expected_rows=None,
        rollback_sql=[f"-- restore partitions {', '.join(window)} from the undo snapshot: dw-dagster change-sets undo <id>"],
    )


def _count(db: Database, query: exp.Expression) -> int:
    (n,), = db.fetch_all(query.sql(dialect=db.dialect))
    return int(n or 0)


def run_dedupe_step(context: dg.OpExecutionContext, cs: ChangeSet, step: ChangeStep, db: Database) -> dict:
    """Apply a ``dedupe`` step (module docstring).

    Returns:
        ``{table, window, rows_before, distinct_keys_before, rows_after, removed_rows}``.

    Raises:
        StepRefused: copies of a key differ, or the count after is not the distinct-key count before.
    """
    s = step.spec
    if getattr(cs, "undo_plan", None) is not None:  # the window is kept before it is replaced, as every repair's
        from dw_dagster.core.ledger import SUCCEEDED, ledger_for

        kept = ledger_for(context.instance).stages(cs.id, cs.version).get("snapshot")
        if kept is None or kept.state != SUCCEEDED:
            raise StepRefused(f"no copy of {', '.join(s['window'])} of {s['table']} was kept (the snapshot stage did not "
                              "run: give the remediation sensor undo_jobs); nothing was changed", {"snapshot": None})
    table, keys, window = s["table"], [sql.column(k) for k in s["key_columns"]], s["window"]
    t = sql.table(table)
    where = _where(db, table, s)
    rows_before = _count(db, exp.select(exp.Count(this=exp.Star())).from_(t.copy()).where(where.copy()))
    distinct_keys = _count(db, exp.select(exp.Count(this=exp.Star())).from_(
        exp.select(*keys).distinct().from_(t.copy()).where(where.copy()).subquery("k")))
    rows = exp.select("*").distinct().from_(t.copy()).where(where.copy()).subquery("r")
    differing = exp.select(*[k.copy() for k in keys]).from_(rows).group_by(*[k.copy() for k in keys]).having(
        exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(1)))
    conflicts = db.fetch_all(differing.limit(5).sql(dialect=db.dialect))
    if conflicts:
        n = _count(db, exp.select(exp.Count(this=exp.Star())).from_(differing.subquery("d")))
        raise StepRefused(
            f"{n} key(s) of {table} in {', '.join(window)} have copies that differ in other columns (e.g. "
            f"{', '.join(str(list(r)) for r in conflicts)}); no copy can be chosen safely: a person must decide which "
            "row to keep (nothing was changed)", {"differing_keys": n, "sample": [[str(v) for v in r] for r in conflicts]})
    columns = [sql.column(col.name) for col in read_table_schema(db, table).columns]
    parts = sql.table_parts(table)  # a quoted part keeps its dots
    kept = [*parts[:-1], f"{parts[-1]}__dw_dedupe_{cs.id.replace('-', '_')}"[:60]]
    keep = exp.select(*columns).distinct().from_(t.copy()).where(where.copy())
    tmp = sql.table(kept).sql(dialect=db.dialect)
    db.execute(f"CREATE TABLE {tmp} AS {keep.sql(dialect=db.dialect)}")
    try:
        insert = exp.insert(exp.select(*[col.copy() for col in columns]).from_(sql.table(kept)), t.copy(),
                            columns=[sql.identifier(col.name) for col in read_table_schema(db, table).columns])
        db.execute(f"BEGIN TRANSACTION; {exp.delete(t.copy(), where=where.copy()).sql(dialect=db.dialect)}; "
                   f"{insert.sql(dialect=db.dialect)}; COMMIT")
    finally:
        db.execute(f"DROP TABLE IF EXISTS {tmp}")
    rows_after = _count(db, exp.select(exp.Count(this=exp.Star())).from_(t.copy()).where(where.copy()))
    result = {"table": table, "window": list(window), "rows_before": rows_before, "distinct_keys_before": distinct_keys,
              "rows_after": rows_after, "removed_rows": rows_before - rows_after}
    if rows_after != distinct_keys:
        raise StepRefused(f"after the replacement {table} holds {rows_after} row(s) in {', '.join(window)}, not the "
                          f"{distinct_keys} distinct key(s) counted before; put the window back with "
                          f"`dw-dagster change-sets undo {cs.id}` (the snapshot stage kept it)", result)
    context.log.info(f"replaced {', '.join(window)} of {table}: {rows_before} → {rows_after} rows")
    return result


__all__ = ["DEDUPE", "dedupe_step", "run_dedupe_step"]
