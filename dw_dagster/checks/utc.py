"""Timestamp columns as UTC wall-clock time, whatever the database session's time zone.

Day buckets (``CAST(ts AS DATE)``) and comparisons with naive literals are taken in the
session's time zone when the column is time-zone aware (``TIMESTAMPTZ``, ``TIMESTAMP WITH TIME
ZONE``, Snowflake's ``TIMESTAMP_TZ``/``TIMESTAMP_LTZ``). The checks therefore read an aware column
as ``CAST(ts AT TIME ZONE 'UTC' AS TIMESTAMP)`` — the UTC wall clock, naive — and a naive column as
it is (UTC by contract). BigQuery's ``TIMESTAMP`` already buckets and compares in UTC.
"""

from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.databases import Database, DatabaseError

AWARE_TYPES = ("TIMESTAMPTZ", "TIMESTAMP_TZ", "TIMESTAMP_LTZ")


def is_aware(data_type: str | None) -> bool:
    """Whether a column type (as ``information_schema`` spells it, any case) carries a time zone."""
    ty = (data_type or "").upper()
    return "WITH TIME ZONE" in ty or any(ty == t or ty.startswith(t + "(") for t in AWARE_TYPES)


def utc_timestamp(db: Database, table: str, column: str) -> exp.Expression:
    """``column`` of ``table`` as a naive UTC timestamp expression (see the module docstring).

    Raises:
        DatabaseError: the table does not exist or has no such column.
    """
    from dw_dagster.databases.catalog import column_types

    types = column_types(db, table)
    if column.lower() not in types:
        raise DatabaseError(f"{db.name}: column {column} is not in {table} (columns: {', '.join(types)})")
    col = sql.column(column)
    if is_aware(types[column.lower()]):
        return exp.cast(exp.AtTimeZone(this=col, zone=exp.Literal.string("UTC")), exp.DataType.build("TIMESTAMP"))
    return col
