"""Dead-letter growth: rows parked in a dead-letter table since a point in time, by failure reason.

A sink that rejects rows and keeps going leaves the stream green while the target goes short;
the dead-letter table is where that shows. The check counts rows whose ``timestamp_column``
(when the row was parked) is at or after ``since`` (default: ``lookback_hours`` before now,
UTC), grouped by ``reason_column``, and fails when more than ``max_rows`` were parked.
"""

import datetime as dt
from collections.abc import Callable, Sequence

import dagster as dg
from pydantic import BaseModel

from dw_dagster.databases import sql
from dw_dagster.checks.metadata import at_least, metadata_table
from dw_dagster.databases import Database
from dw_dagster.core import keys as _keys
from dw_dagster.dagster_private import public

DEAD_LETTER_KIND = "dead_letter"


class ParkedReason(BaseModel):
    reason: str | None
    rows: int
    first_parked: dt.datetime | None
    last_parked: dt.datetime | None


def parked_rows(db: Database, table: str, timestamp_column: str, reason_column: str,
                since: dt.datetime) -> tuple[list[ParkedReason], str]:
    """Rows parked at or after ``since`` (naive UTC), per reason, most first; returns (rows, SQL)."""
    # (DuckDB reads ``SELECT :x`` as a prefix alias, so the select list is built from quoted
    # identifiers; only the literal goes through a placeholder.)
    from dw_dagster.checks.utc import catalog_column, utc_timestamp

    # names resolved against the catalog and quoted as it spells them (a "Reason" created quoted stays itself);
    # an aware parking time read as its UTC wall clock, so ``since`` (naive UTC) means the same instant in any
    # session time zone
    reason = catalog_column(db, table, reason_column).sql("duckdb")
    ts = utc_timestamp(db, table, timestamp_column).sql("duckdb")
    q = sql.render(
        f"SELECT {reason} AS reason, COUNT(*) AS n, MIN({ts}) AS first_ts, MAX({ts}) AS last_ts "
        f"FROM {sql.table(table).sql('duckdb')} WHERE {ts} >= :since GROUP BY {reason} ORDER BY n DESC, reason",
        db.dialect, since=since)
    return [ParkedReason(reason=None if r[0] is None else str(r[0]), rows=int(r[1]), first_parked=r[2], last_parked=r[3])
            for r in db.fetch_all(q)], q


@public
def build_dead_letter_check(
    *,
    asset: dg.AssetKey | str | Sequence[str],
    table: str,
    timestamp_column: str,
    reason_column: str,
    resource_key: str = "warehouse",
    name: str = _keys.DEAD_LETTER_CHECK,
    lookback_hours: float = 24,
    max_rows: int = 0,
    since: Callable[[], dt.datetime] | None = None,
    prepare: Callable[[Database], None] | None = None,
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
) -> dg.AssetChecksDefinition:
    """An asset check that fails when more than ``max_rows`` rows were parked in ``table`` since a time.

    Args:
        asset: the asset the dead-letter rows belong to (usually the sink's target).
        table: the dead-letter table.
        timestamp_column: when a row was parked.
        reason_column: the failure reason.
        lookback_hours: the window when ``since`` is not given (hours before now, UTC).
        max_rows: rows allowed in the window (default 0).
        since: returns the start of the window (UTC); overrides ``lookback_hours``.
        prepare: called with the database before counting (e.g. to create a view of the rows
            still waiting, :func:`dw_dagster.changes.replay.ensure_replay_tables`).

    Returns:
        An ``AssetChecksDefinition``; metadata ``dw/parked_rows`` (rows), ``dw/reasons`` (table).

    Raises:
        UnsafeIdentifierError: a table or column name cannot be an identifier.
        ValueError: ``lookback_hours`` not positive or ``max_rows`` negative.
        (When the check runs, a missing table or column fails it with a ``DatabaseError`` naming them.)
    """
    sql.table(table), sql.identifier(timestamp_column), sql.identifier(reason_column)
    at_least("lookback_hours", lookback_hours, 0, strictly=True)
    at_least("max_rows", max_rows, 0, whole=True)

    @dg.asset_check(asset=asset, name=name, blocking=blocking, required_resource_keys={resource_key},
                    metadata={_keys.CHECK_KIND_KEY: DEAD_LETTER_KIND, _keys.TABLE_KEY: table},
                    description=f"At most {max_rows} rows parked in {table} in the last {lookback_hours} h, by {reason_column}.")
    def _dead_letter(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        db = getattr(context.resources, resource_key).get_database()
        if prepare is not None:
            prepare(db)
        start = since() if since else dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=lookback_hours)
        start = start.astimezone(dt.timezone.utc).replace(tzinfo=None) if start.tzinfo else start
        reasons, q = parked_rows(db, table, timestamp_column, reason_column, start)
        total = sum(r.rows for r in reasons)
        return dg.AssetCheckResult(
            passed=total <= max_rows, severity=severity,
            description=f"{total} rows parked since {start.isoformat()} UTC" + (
                ": " + "; ".join(f"{r.rows} × {r.reason!r}" for r in reasons[:5]) if reasons else ""),
            metadata={
                _keys.PARKED_ROWS_KEY: total,
                _keys.SINCE_UTC_KEY: start.isoformat(),
                _keys.REASONS_KEY: metadata_table(
                    [{"reason": r.reason or "(null)", "rows": r.rows, "first_parked": str(r.first_parked),
                      "last_parked": str(r.last_parked)} for r in reasons],
                    [("reason", "string"), ("rows", "int"), ("first_parked", "string"), ("last_parked", "string")]),
                _keys.REASONS_JSON_KEY: dg.MetadataValue.json([r.model_dump(mode="json") for r in reasons]),
                _keys.QUERY_KEY: dg.MetadataValue.md(f"```sql\n{q}\n```"),
            },
        )

    return _dead_letter
