"""The catalog reader: a table's columns in order, with their types and nullability, on every engine.

DuckDB, Snowflake, PostgreSQL, MySQL/MariaDB and other engines with a standard catalog are read
from ``information_schema.columns``; BigQuery from its tables API (``tables.get``), which shows a
schema change at once where ``INFORMATION_SCHEMA`` may lag (`managing table schemas`_).

.. _managing table schemas: https://cloud.google.com/bigquery/docs/managing-table-schemas
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

import sqlglot
from pydantic import BaseModel, ConfigDict, Field
from sqlglot import exp
from sqlglot.errors import ErrorLevel

from dw_dagster.databases import Database, DatabaseError, sql
from dw_dagster.errors import DwDagsterError
from dw_dagster.dagster_private import public


@public
class CatalogError(DwDagsterError, ValueError):
    """A table is not in the catalog, or its name cannot be read there (the message names it)."""


class ColumnSpec(BaseModel):
    """One column of a table: its name, its type in the table's dialect, and whether it takes NULL."""

    model_config = ConfigDict(frozen=True)

    name: str
    type: str
    nullable: bool = True


@public
class TableSchema(BaseModel):
    """A table's columns in order, plus what a BigQuery rebuild must keep.

    Attributes:
        table: the table name as given to :func:`read_table_schema`.
        columns: the columns, in table order.
        partition_column: BigQuery: the column the table is time-partitioned on.
        partition_granularity: BigQuery: ``HOUR``, ``DAY``, ``MONTH`` or ``YEAR``.
        cluster_columns: BigQuery: the clustering columns, in order.
        rebuild_blockers: what a ``CREATE OR REPLACE TABLE`` rebuild could not carry over
            (range or ingestion-time partitioning, nested or repeated fields, default value
            expressions, policy tags, required partition filter); a migration that needs a
            rebuild is refused while this is not empty.
    """

    table: str
    columns: list[ColumnSpec]
    partition_column: str | None = None
    partition_granularity: Literal["HOUR", "DAY", "MONTH", "YEAR"] | None = None
    cluster_columns: list[str] = Field(default_factory=list)
    rebuild_blockers: list[str] = Field(default_factory=list)

    def column(self, name: str, dialect: str) -> ColumnSpec | None:
        """The column called ``name`` under the dialect's rules for matching names, or None."""
        return next((c for c in self.columns if _same_name(c.name, name, dialect)), None)


def _catalog_name(name: str, dialect: str, quoted: bool = False) -> str:
    """The name the catalog stores for ``name`` written without quotes (Snowflake upper-cases it, PostgreSQL
    lower-cases it: :data:`_FOLDING`); ``quoted`` (written in double quotes) or a name sqlglot must quote: as it is."""
    fold = _FOLDING.get(dialect)
    if fold is None or quoted or sql.identifier(name).quoted:
        return name
    return fold(name)


def _same_name(reported: str, given: str, dialect: str) -> bool:
    """Whether a name reported by the catalog is the column ``given`` in a statement.

    Snowflake: names that need no quotes compare upper-cased (``c``, ``C``), others exactly.
    DuckDB and BigQuery column names are case-insensitive.
    """
    if dialect == "snowflake":
        return _catalog_name(reported, dialect) == _catalog_name(given, dialect)
    return reported.lower() == given.lower()


def _info_schema_columns(table: str, dialect: str, column: str | None = None) -> exp.Select:
    """``information_schema`` query for the columns of ``table`` (or just ``column``), in order.

    Rows: ``column_name, data_type, is_nullable`` and, except on DuckDB and BigQuery,
    ``numeric_precision, numeric_scale, character_maximum_length`` (the standard catalog's
    ``data_type`` has no parameters). PostgreSQL, MySQL/MariaDB and other engines with the SQL
    standard's ``information_schema`` are read there: an unqualified name means the current schema
    (``current_schema()``; ``DATABASE()`` on MySQL).
    """
    split = sql.split_table(table)
    parts = [part for part, _ in split]
    name = parts[-1]
    schema = parts[-2] if len(parts) >= 2 else None
    catalog = parts[-3] if len(parts) == 3 else None
    stored = [_catalog_name(part, dialect, quoted) for part, quoted in split]  # as the catalog stores each part
    written = sql.table(table).args  # the parts as nodes, quoted where the name quoted them
    cols = ["column_name", "data_type", "is_nullable"]
    if dialect not in ("duckdb", "bigquery"):
        cols += ["numeric_precision", "numeric_scale", "character_maximum_length"]
    lower = lambda e: exp.Lower(this=e)  # noqa: E731
    ident = exp.to_identifier
    if dialect == "duckdb":
        src = exp.Table(this=ident("columns"), db=ident("information_schema"))
        conds = [
            exp.EQ(this=lower(exp.column("table_name")), expression=sql.literal(name.lower())),
            exp.EQ(this=lower(exp.column("table_schema")),
                   expression=sql.literal(schema.lower()) if schema else lower(exp.func("current_schema"))),
        ]
        if catalog:
            conds.append(exp.EQ(this=lower(exp.column("table_catalog")), expression=sql.literal(catalog.lower())))
        if column:
            conds.append(exp.EQ(this=lower(exp.column("column_name")), expression=sql.literal(column.lower())))
    elif dialect == "snowflake":
        src = exp.Table(this=ident("COLUMNS"), db=ident("INFORMATION_SCHEMA"),
                        catalog=written["catalog"].copy() if catalog else None)
        conds = [
            exp.EQ(this=exp.column("table_name"), expression=sql.literal(stored[-1])),
            exp.EQ(this=exp.column("table_schema"),
                   expression=sql.literal(stored[-2]) if schema else exp.func("CURRENT_SCHEMA")),
        ]
        if column:
            conds.append(exp.EQ(this=exp.column("column_name"), expression=sql.literal(_catalog_name(column, dialect))))
    elif dialect == "bigquery":
        if schema is None:
            raise CatalogError(f"name BigQuery tables with their dataset (dataset.table), got {table!r}")
        # sqlglot's own form of `project.dataset.INFORMATION_SCHEMA.COLUMNS`
        src = exp.Table(this=exp.Identifier(this="INFORMATION_SCHEMA.COLUMNS", quoted=True),
                        db=written["db"].copy(), catalog=written["catalog"].copy() if catalog else None)
        conds = [exp.EQ(this=exp.column("table_name"), expression=sql.literal(name))]
        if column:
            conds.append(exp.EQ(this=lower(exp.column("column_name")), expression=sql.literal(column.lower())))
    else:
        src = exp.Table(this=ident("columns"), db=ident("information_schema"))
        current = exp.func("DATABASE") if dialect == "mysql" else exp.func("current_schema")
        conds = [  # as the engine stores them: PostgreSQL folds a name written without quotes to lower case
            exp.EQ(this=exp.column("table_name"), expression=sql.literal(stored[-1])),
            exp.EQ(this=exp.column("table_schema"), expression=sql.literal(stored[-2]) if schema else current),
        ]
        if catalog:
            conds.append(exp.EQ(this=exp.column("table_catalog"), expression=sql.literal(stored[-3])))
        if column:
            conds.append(exp.EQ(this=lower(exp.column("column_name")), expression=sql.literal(column.lower())))
    q = exp.select(*cols).from_(src).where(exp.and_(*conds))
    return q.order_by("ordinal_position")


def _catalog_type(row: Sequence[Any], dialect: str) -> str:
    """A type string in ``dialect`` from one ``information_schema.columns`` row."""
    data_type = str(row[1])
    if dialect in ("duckdb", "bigquery"):
        return data_type
    precision, scale, length = row[3], row[4], row[5]
    upper = data_type.upper()
    if upper in ("NUMBER", "DECIMAL", "NUMERIC") and precision is not None:
        return f"{'NUMBER' if dialect == 'snowflake' else 'DECIMAL'}({int(precision)},{int(scale or 0)})"
    if upper in ("TEXT", "VARCHAR", "STRING", "CHARACTER VARYING", "CHAR", "CHARACTER") and length is not None:
        if dialect == "snowflake" or upper in ("VARCHAR", "CHARACTER VARYING"):
            return f"VARCHAR({int(length)})"
        if upper in ("CHAR", "CHARACTER"):
            return f"CHAR({int(length)})"
    return data_type


# BigQuery tables API legacy names -> GoogleSQL names
_BQ_API_TYPES = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}


def _bigquery_ref(db: Any, table: str) -> str:
    parts = sql.table_parts(table)
    if len(parts) == 3:
        return ".".join(parts)
    if len(parts) == 2:
        return ".".join([db.project, *parts])
    if not getattr(db, "dataset", None):
        raise CatalogError(f"name BigQuery tables with their dataset (dataset.table), got {table!r}")
    return ".".join([db.project, db.dataset, *parts])


def _read_bigquery_schema(db: Any, table: str) -> TableSchema:
    sql.table(table)
    try:
        with db.client() as client:
            t = client.get_table(_bigquery_ref(db, table))
    except Exception as e:
        if type(e).__name__ == "NotFound":
            raise CatalogError(f"{db.name}: table {table} not found") from None
        raise DatabaseError(f"{db.name}: reading the schema of {table} failed: {type(e).__name__}: {e}") from e
    columns, blockers = [], []
    for f in t.schema:
        ftype = _BQ_API_TYPES.get(f.field_type.upper(), f.field_type.upper())
        if ftype in ("RECORD", "STRUCT") or f.mode == "REPEATED":
            blockers.append(f"column {f.name} is nested or repeated")
        if getattr(f, "default_value_expression", None):
            blockers.append(f"column {f.name} has a default value expression")
        if getattr(f, "policy_tags", None) and list(getattr(f.policy_tags, "names", []) or []):
            blockers.append(f"column {f.name} has policy tags")
        if ftype in ("NUMERIC", "BIGNUMERIC") and f.precision is not None:
            ftype = f"{ftype}({f.precision}, {f.scale or 0})"
        elif ftype in ("STRING", "BYTES") and f.max_length is not None:
            ftype = f"{ftype}({f.max_length})"
        columns.append(ColumnSpec(name=f.name, type=ftype, nullable=f.mode != "REQUIRED"))
    part_col = part_gran = None
    if t.range_partitioning is not None:
        blockers.append("range partitioning")
    if t.time_partitioning is not None:
        if t.time_partitioning.field is None:
            blockers.append("ingestion-time partitioning")
        part_col, part_gran = t.time_partitioning.field, (t.time_partitioning.type_ or "DAY").upper()
    if t.require_partition_filter:
        blockers.append("require_partition_filter")
    return TableSchema(table=table, columns=columns, partition_column=part_col, partition_granularity=part_gran,
                       cluster_columns=list(t.clustering_fields or []), rebuild_blockers=blockers)


@public
def read_table_schema(db: Database, table: str) -> TableSchema:
    """Read ``table``'s columns in order, with their types and nullability.

    DuckDB, Snowflake, PostgreSQL, MySQL/MariaDB and other engines with a standard catalog: from
    ``information_schema.columns``. BigQuery: from the tables API
    (``tables.get``), which shows schema changes at once where ``INFORMATION_SCHEMA`` may lag
    (`managing table schemas`_), with partitioning, clustering and what a rebuild cannot keep.

    Args:
        db: any :class:`~dw_dagster.databases.Database`.
        table: ``schema.table`` (``dataset.table``), or a one-part name in the current schema.

    Returns:
        A :class:`TableSchema`; type strings are in the database's dialect.

    Raises:
        CatalogError: the table does not exist (no columns).
        dw_dagster.databases.sql.UnsafeIdentifierError: a part of ``table`` is hostile.
        dw_dagster.databases.DatabaseError: the query or the API call failed.
    """
    dialect = db.dialect
    if hasattr(db, "table_schema"):  # an engine with its own catalog (Informix: systables/syscolumns)
        schema = db.table_schema(table)
    elif dialect == "bigquery":
        schema = _read_bigquery_schema(db, table)
    else:
        q = _info_schema_columns(table, dialect).sql(dialect=dialect, unsupported_level=ErrorLevel.RAISE)
        rows = db.fetch_all(q)
        schema = TableSchema(
            table=table,
            columns=[ColumnSpec(name=r[0], type=_catalog_type(r, dialect), nullable=str(r[2]).upper() == "YES") for r in rows],
        )
    if not schema.columns:
        raise CatalogError(f"{db.name}: table {table} not found (no columns in the catalog)")
    return schema


class ColumnTypes(dict):
    """Column name (lower case) → upper-case data type, in table order; ``names`` maps each lower-case
    name back to the column's own spelling (``"Net Sales"``), for quoting it where case matters."""

    def __init__(self, types: dict[str, str] | None = None, names: dict[str, str] | None = None) -> None:
        super().__init__(types or {})
        self.names = dict(names or {n: n for n in self})


def _spelling(name: str) -> str:
    """How to name a column back: a plain name in one case (``NET_SALES`` as Snowflake folds it, or
    ``net_sales``) in lower case, anything else (``Net Sales``, ``NetSales``) as the catalog spells it."""
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None
    return name.lower() if plain and name in (name.lower(), name.upper()) else name


def table_columns(db: Database, table: str) -> list[tuple[str, str]]:
    """``(name, TYPE)`` of each column of ``table`` in table order, the names exactly as the
    engine's catalog stores them (``Amount`` and ``amount`` stay two columns on PostgreSQL;
    Snowflake reports unquoted names upper case). A database that knows its schemas better
    (BigQuery's tables API, case-insensitive names) provides ``column_types``.

    A name without a schema means the session's current schema; when no table of that name is
    there and exactly one schema has one, that one.

    Raises:
        DatabaseError: the table does not exist (or has no visible columns), or an unqualified name
            is in several schemas none of which is the current one.
    """
    if hasattr(db, "column_types"):
        found = db.column_types(table)
        names = getattr(found, "names", {})
        return [(names.get(n, n), str(ty).upper()) for n, ty in found.items()]
    t = sql.table(table)
    schema = t.args.get("db")
    cond = f"LOWER(table_name) = {sql.literal(t.name.lower()).sql('duckdb')}"
    if schema is not None:
        cond += f" AND LOWER(table_schema) = {sql.literal(schema.name.lower()).sql('duckdb')}"
    src = "information_schema.columns"
    q = sqlglot.transpile(f"SELECT column_name, data_type, table_schema, CURRENT_SCHEMA() FROM {src} WHERE {cond} "
                          "ORDER BY table_schema, ordinal_position", read="duckdb", write=db.dialect)[0]
    rows = db.fetch_all(q)
    if not rows:
        raise DatabaseError(f"{db.name}: table {table} not found (no columns in information_schema)")
    schemas = list(dict.fromkeys(str(r[2]) for r in rows))
    if len(schemas) > 1:
        exact = [s for s in schemas if s == (schema.name if schema is not None else None)]
        current = exact or [s for s in schemas if rows[0][3] is not None and s.lower() == str(rows[0][3]).lower()]
        if not current:
            raise DatabaseError(f"{db.name}: table {table} is in several schemas ({', '.join(schemas)}); name one")
        rows = [r for r in rows if str(r[2]) == current[0]]
    out = [(str(n), str(ty).upper()) for n, ty, *_ in rows]
    if db.dialect == "duckdb":  # DuckDB's information_schema calls its 4-byte REAL "FLOAT"
        out = [(n, "REAL" if ty == "FLOAT" else ty) for n, ty in out]
    if db.dialect == "mysql":
        out = _mariadb_json(db, t.name, str(rows[0][2]), out)
    return out


def _mariadb_json(db: Database, table: str, schema: str, columns: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """MariaDB keeps a ``JSON`` column as ``LONGTEXT`` with a ``json_valid(col)`` check: such a
    column is reported as ``JSON`` (so compares treat it as JSON data). MySQL's real JSON type is
    reported as it is; an engine without the check table is left as it is."""
    q = ("SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = "
         f"{sql.literal(schema).sql('mysql')} AND TABLE_NAME = {sql.literal(table).sql('mysql')}")
    try:
        clauses = [str(r[0]) for r in db.fetch_all(q)]
    except Exception:  # MySQL's CHECK_CONSTRAINTS has no TABLE_NAME; no JSON alias to find there
        return columns
    found = {m.group(1).lower() for c in clauses for m in [re.match(r"^\s*json_valid\(`([^`]+)`\)\s*$", c, re.I)] if m}
    return [(n, "JSON" if n.lower() in found and ty in ("LONGTEXT", "TEXT") else ty) for n, ty in columns]


# How an engine folds a name written without quotes: PostgreSQL (and Redshift) to lower case,
# Snowflake and Oracle to upper case; DuckDB, BigQuery, MySQL and SQL Server match names
# case-insensitively (folding both to lower case models that).
_FOLDING = {"postgres": str.lower, "redshift": str.lower, "snowflake": str.upper, "oracle": str.upper}


def resolve_column(columns: Sequence[str], name: str, dialect: str, table: str = "") -> str | None:
    """The catalog's name for the configured column ``name``, or None when the table has none.

    Resolution: an exact match first; then the engine's folding rule (``amount`` is ``AMOUNT`` on
    Snowflake, ``Amount`` is ``amount`` on PostgreSQL); then a case-insensitive match when only
    one column has it (a mixed-case column created quoted, named in another case).

    Args:
        columns: the table's column names as the catalog stores them (:func:`table_columns`).
        name: the configured name.
        dialect: the sqlglot dialect of the engine.
        table: the table's name, for the error message.

    Raises:
        CatalogError: more than one column matches under the rule that found a match (two columns
            differing only in case, and ``name`` exactly neither of them).
    """
    if name in columns:
        return name
    fold = _FOLDING.get(dialect)
    if fold is not None and fold(name) in columns:
        return fold(name)
    same = [c for c in columns if c.lower() == name.lower()]
    if len(same) > 1:
        raise CatalogError(f"column {name!r} is ambiguous in {table or 'the table'}: the catalog holds "
                           f"{', '.join(repr(c) for c in same)}; name one of them exactly")
    return same[0] if same else None


def display_name(name: str, dialect: str) -> str:
    """How to show a catalog name back to a user: in lower case when that spelling, written
    unquoted, names the same column on the engine (``A`` on Snowflake, ``ID`` on DuckDB), else as
    the catalog spells it (``QTY`` next to ``Qty`` on PostgreSQL, ``Net Sales``)."""
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None
    if not plain or name == name.lower():
        return name
    fold = _FOLDING.get(dialect)
    if fold is not None:
        return name.lower() if fold(name.lower()) == name else name
    return name.lower() if name == name.upper() else name


# Engines that match a column name in any case themselves (quoted or not), where no two columns
# can differ only in case: a configured name needs no catalog read there.
CASE_INSENSITIVE_DIALECTS = ("duckdb", "bigquery")


def resolve_columns(db: Database, table: str, columns: Sequence[str]) -> list[str]:
    """The catalog's spelling of each configured column of ``table`` (:func:`resolve_column`), in
    order, from one catalog read; on engines that match any case themselves
    (:data:`CASE_INSENSITIVE_DIALECTS`) the names as configured, with no read.

    Raises:
        DatabaseError: the table does not exist, or a column is not in it (naming its columns).
        CatalogError: a name matches two columns differing only in case.
    """
    if db.dialect in CASE_INSENSITIVE_DIALECTS:
        return list(columns)
    names = [n for n, _ in table_columns(db, table)]
    out = []
    for c in columns:
        r = resolve_column(names, c, db.dialect, table)
        if r is None:
            raise DatabaseError(f"{db.name}: column {c} is not in {table} (columns: {', '.join(names)})")
        out.append(r)
    return out


def quoted(name: str) -> exp.Identifier:
    """A catalog name as an always-quoted identifier (its case kept on every engine).

    Raises:
        UnsafeIdentifierError: the name cannot be an identifier (see :func:`sql.identifier`).
    """
    ident = sql.identifier(name)
    ident.set("quoted", True)
    return ident


def column_types(db: Database, table: str) -> ColumnTypes:
    """Column name (lower case) → upper-case data type, in table order, from ``information_schema.columns``.

    See :func:`table_columns` (exact catalog names) for the rules; this view folds names to
    lower case and keeps the first of two columns differing only in case.

    Raises:
        DatabaseError: the table does not exist (or has no visible columns), or an unqualified name
            is in several schemas none of which is the current one.
    """
    if hasattr(db, "column_types"):
        found = db.column_types(table)
        return found if isinstance(found, ColumnTypes) else ColumnTypes(found)
    cols = table_columns(db, table)
    types, names = {}, {}
    for n, ty in cols:
        types.setdefault(n.lower(), ty)
        names.setdefault(n.lower(), _spelling(n))
    return ColumnTypes(types, names)
