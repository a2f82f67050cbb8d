"""Timestamp columns as UTC wall-clock time, whatever the database session's time zone.

Day buckets (``CAST(ts AS DATE)``) and comparisons with naive literals are taken in the
session's time zone when the column is time-zone aware (``TIMESTAMPTZ``, ``TIMESTAMP WITH TIME
ZONE``, Snowflake's ``TIMESTAMP_TZ``/``TIMESTAMP_LTZ``). The checks therefore read an aware column
as ``CAST(ts AT TIME ZONE 'UTC' AS TIMESTAMP)`` — the UTC wall clock, naive — and a naive column as
it is (UTC by contract). BigQuery's ``TIMESTAMP`` already buckets and compares in UTC.
"""

from sqlglot import exp

from dw_dagster.databases import Database, DatabaseError

AWARE_TYPES = ("TIMESTAMPTZ", "TIMESTAMP_TZ", "TIMESTAMP_LTZ")


def is_aware(data_type: str | None) -> bool:
    """Whether a column type (as ``information_schema`` spells it, any case) carries a time zone."""
    ty = (data_type or "").upper()
    return "WITH TIME ZONE" in ty or any(ty == t or ty.startswith(t + "(") for t in AWARE_TYPES)


def utc_timestamp(db: Database, table: str, column: str) -> exp.Expression:
    """``column`` of ``table`` as a naive UTC timestamp expression (see the module docstring).

    The name is resolved against the engine's catalog (exact, then its folding rule, then a
    unique case-insensitive match) and quoted as the catalog spells it, so a mixed-case column
    created quoted (``"LoadedAt"`` on PostgreSQL) is read, not folded away.

    Raises:
        DatabaseError: the table does not exist or has no such column.
        CatalogError: the name matches two columns differing only in case.
    """
    col, ty = resolved_column(db, table, column)
    if is_number(ty):
        raise DatabaseError(f"{table}.{column} is {ty}, a number, not a timestamp (epoch seconds? milliseconds?): "
                            "give a timestamp column, or a view that converts it (e.g. to_timestamp(n) for epoch seconds)")
    if is_aware(ty):
        return exp.cast(exp.AtTimeZone(this=col, zone=exp.Literal.string("UTC")), exp.DataType.build("TIMESTAMP"))
    return col


_NUMBERS = ("TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT", "INT2", "INT4", "INT8", "INT64", "UBIGINT",
            "UINTEGER", "DECIMAL", "NUMERIC", "NUMBER", "DOUBLE", "FLOAT", "REAL", "FLOAT8", "FLOAT64", "DOUBLE PRECISION")


def is_number(data_type: str | None) -> bool:
    """Whether a column type is a number (an epoch column given where a timestamp is read)."""
    ty = (data_type or "").upper()
    return any(ty == t or ty.startswith(t + "(") or ty.startswith(t + " ") for t in _NUMBERS)


def resolved_column(db: Database, table: str, column: str) -> tuple[exp.Column, str]:
    """``column`` of ``table`` resolved against the engine's catalog (exact, then its folding rule,
    then a unique case-insensitive match) and quoted as the catalog spells it, with its type.

    Returns:
        (the quoted column expression, its catalog type as text).

    Raises:
        DatabaseError: the table does not exist or has no such column.
        CatalogError: the name matches two columns differing only in case.
    """
    from dw_dagster.databases.catalog import quoted, resolve_column, table_columns

    cols = table_columns(db, table)
    name = resolve_column([n for n, _ in cols], column, db.dialect, table)
    if name is None:
        raise DatabaseError(f"{db.name}: column {column} is not in {table} (columns: {', '.join(n for n, _ in cols)})")
    return exp.Column(this=quoted(name)), dict(cols)[name]


def catalog_column(db: Database, table: str, column: str) -> exp.Column:
    """``column`` as the engine will find it: on DuckDB and BigQuery (which match names in any case)
    the name as given; elsewhere resolved against the catalog and quoted (:func:`resolved_column`).

    Raises:
        DatabaseError: the table does not exist or has no such column (catalog engines).
        CatalogError: the name matches two columns differing only in case.
    """
    from dw_dagster.databases import sql
    from dw_dagster.databases.catalog import CASE_INSENSITIVE_DIALECTS, quoted, resolve_columns

    if db.dialect in CASE_INSENSITIVE_DIALECTS:  # quoted: a column named like a keyword (at, order) stays a column;
        sql.identifier(column)  # checked as any name; these engines match quoted names in any case
        return exp.Column(this=exp.to_identifier(column, quoted=True))
    return exp.Column(this=quoted(resolve_columns(db, table, [column])[0]))
