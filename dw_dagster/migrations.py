"""Column migrations with rollback SQL for DuckDB, Snowflake and BigQuery.

A schema change (add, drop, rename, retype a column, or change its nullability) is described by
a pydantic model; :func:`generate_migration` turns it into a :class:`Migration` for one dialect:
the forward statements, the rollback statements, guard queries that must find nothing before a
direction may run, checks that show a direction took effect, and notes on the dialect's limits.
Every statement is a sqlglot expression rendered with ``.sql(dialect=...)``; table and column
names go through :mod:`dw_dagster.sql` (quoted when needed, refused when hostile) and values
through :func:`dw_dagster.sql.literal`. Nothing from a change is pasted into SQL as text.

:func:`apply_migration` runs one direction on a :class:`~dw_dagster.databases.Database`
(guards first, then the statements), :func:`verify_migration` compares the table's catalog with
the checks, and :func:`read_table_schema` reads a table's columns (name, type, nullability) from
``information_schema`` (DuckDB, Snowflake) or from the BigQuery tables API.

How each change rolls back:

* **add**: the rollback drops the column (values written into it since are dropped with it).
* **drop**: the forward first copies the key columns and the column into a backup table
  ``<table>__dw_backup_<id>`` in the same schema (``CREATE TABLE ... AS SELECT``), then drops the
  column. The rollback adds the column back, restores its values by key (``UPDATE ... FROM``),
  re-imposes NOT NULL if it had it, and drops the backup. Renaming the column aside was not
  chosen: the column would stay visible to ``SELECT *`` and keep rejecting writes that omit it.
  The forward refuses to run when the key columns do not identify rows (duplicates or NULLs).
* **rename**: renames back.
* **retype**: casts back. A lossy retype (see :func:`classify_retype`) is refused unless
  ``allow_lossy=True``; then ``key_columns`` are required and the original values are kept in a
  backup table so that the rollback restores them exactly.
* **nullability**: the opposite ``SET``/``DROP NOT NULL``. Re-imposing NOT NULL (a tighten, or the
  rollback of a relax) is refused while the column holds NULLs, with the count in the error.

Dialect limits (each also appears in the :attr:`Migration.notes` of the migrations it affects):

* BigQuery has ``ALTER COLUMN ... DROP NOT NULL`` but no ``SET NOT NULL``: a mode can only go
  from REQUIRED to NULLABLE (`managing table schemas`_, "Change a column's mode"), and a REQUIRED
  column cannot be added to an existing table (same page, "Add an empty column"). Re-imposing
  REQUIRED therefore rebuilds the table: ``CREATE OR REPLACE TABLE t (<columns with NOT NULL>)
  [PARTITION BY ...] [CLUSTER BY ...] AS SELECT ... FROM t``, which needs the table's current
  schema (``current_schema=read_table_schema(db, table)``) and rewrites every row.
* BigQuery ``ALTER COLUMN ... SET DATA TYPE`` only allows coercible changes: INT64 to
  NUMERIC, BIGNUMERIC or FLOAT64; NUMERIC to BIGNUMERIC or FLOAT64 (`BigQuery DDL`_, "ALTER
  COLUMN SET DATA TYPE"; the "Coerce to" column of `conversion rules`_), and a parameterized
  type to a less restrictive one (longer ``STRING(L)``, wider ``NUMERIC(P, S)``). Any other
  retype, including the rollback of a widening, rebuilds the table.
* BigQuery ``INFORMATION_SCHEMA.COLUMNS`` may lag a schema change (`managing table schemas`_:
  "call the tables.get method"); :func:`verify_migration` therefore reads BigQuery schemas
  through the tables API. The ``sql`` of each check is still given for people and tools.
* Snowflake supports ``ALTER COLUMN ... SET NOT NULL`` / ``DROP NOT NULL``; ``SET DATA TYPE``
  only to a synonymous type, a longer VARCHAR, or another NUMBER precision with the same scale
  (a lower one only if the values fit); not a scale change nor a change of type family
  (`Snowflake ALTER COLUMN`_). Other retypes swap the column: add ``<column>__dw_retype_<id>``,
  fill it with ``CAST``, drop the old column, rename the new one, re-impose NOT NULL. The column
  then moves to the end of the table and loses its default, comment and policies.
* DuckDB supports ``ALTER ... SET DATA TYPE ... USING``, ``SET``/``DROP NOT NULL``, ``RENAME``,
  ``ADD COLUMN ... DEFAULT`` (which fills existing rows) and ``DROP COLUMN`` (`DuckDB ALTER
  TABLE`_); a column that an index depends on cannot be altered or dropped.

A column re-added by a rollback (drop; Snowflake swap) comes back at the end of the table:
:attr:`Migration.rollback_restores_column_order` says whether the start's order is restored.

.. _managing table schemas: https://cloud.google.com/bigquery/docs/managing-table-schemas
.. _BigQuery DDL: https://cloud.google.com/bigquery/docs/reference/standard-sql/data-definition-language
.. _conversion rules: https://cloud.google.com/bigquery/docs/reference/standard-sql/conversion_rules
.. _Snowflake ALTER COLUMN: https://docs.snowflake.com/en/sql-reference/sql/alter-table-column
.. _DuckDB ALTER TABLE: https://duckdb.org/docs/stable/sql/statements/alter_table
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Annotated, Any, Literal, Union

import sqlglot
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlglot import exp
from sqlglot.errors import ErrorLevel

from dw_dagster import sql
from dw_dagster.databases import Database, DatabaseError

Dialect = Literal["duckdb", "snowflake", "bigquery"]
DIALECTS: tuple[str, ...] = ("duckdb", "snowflake", "bigquery")

#: Vendor documentation each dialect fact in this module comes from.
SOURCES: dict[str, str] = {
    "bigquery_schemas": "https://cloud.google.com/bigquery/docs/managing-table-schemas",
    "bigquery_ddl": "https://cloud.google.com/bigquery/docs/reference/standard-sql/data-definition-language",
    "bigquery_conversion": "https://cloud.google.com/bigquery/docs/reference/standard-sql/conversion_rules",
    "snowflake_alter_column": "https://docs.snowflake.com/en/sql-reference/sql/alter-table-column",
    "snowflake_alter_table": "https://docs.snowflake.com/en/sql-reference/sql/alter-table",
    "duckdb_alter_table": "https://duckdb.org/docs/stable/sql/statements/alter_table",
}

Literalish = Union[bool, int, Decimal, float, dt.datetime, dt.date, str]


# -- errors ------------------------------------------------------------------------------------


class MigrationError(ValueError):
    """A change cannot be turned into a migration for this dialect (the message says why and what to pass)."""


class LossyRetypeError(MigrationError):
    """A retype would lose information and ``allow_lossy`` was not set.

    Attributes:
        reasons: one sentence per way the retype loses information.
    """

    def __init__(self, message: str, reasons: Sequence[str]) -> None:
        super().__init__(message)
        self.reasons = list(reasons)


class MigrationRefused(RuntimeError):
    """A guard query found rows that make a direction unsafe; nothing was run.

    Attributes:
        guard: the :class:`Guard` that refused.
        rows: how many rows it found.
    """

    def __init__(self, guard: Guard, rows: int) -> None:
        super().__init__(guard.message.replace("{rows}", str(rows)))
        self.guard = guard
        self.rows = rows


# -- the changes -------------------------------------------------------------------------------


class _Change(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str = Field(description="`table`, `schema.table` or `catalog.schema.table` (`dataset.table` on BigQuery)")
    column: str = Field(description="the column the change is about")

    @field_validator("table")
    @classmethod
    def _table_is_usable(cls, v: str) -> str:
        sql.table(v)  # raises UnsafeIdentifierError (a ValueError) for hostile names
        return v

    @field_validator("column")
    @classmethod
    def _column_is_usable(cls, v: str) -> str:
        sql.identifier(v)
        return v


def _check_keys(keys: Sequence[str], column: str) -> list[str]:
    for k in keys:
        sql.identifier(k)
    if column in keys:
        raise ValueError(f"key_columns must not include the changed column {column!r}")
    if len(set(keys)) != len(keys):
        raise ValueError("key_columns has duplicates")
    return list(keys)


class AddColumn(_Change):
    """Add ``column`` of ``type``; the rollback drops it.

    ``type`` is read in the migration's dialect (``"BIGINT"``, ``"DECIMAL(18,2)"``,
    ``"VARCHAR"`` work everywhere; ``"INT64"``/``"STRING"`` on BigQuery). A NOT NULL column needs
    a ``default`` (existing rows get it). ``default`` is a Python value, rendered as a literal.
    """

    kind: Literal["add"] = "add"
    type: str
    nullable: bool = True
    default: Literalish | None = None

    @model_validator(mode="after")
    def _not_null_needs_default(self) -> AddColumn:
        if not self.nullable and self.default is None:
            raise ValueError("a NOT NULL column added to a table that has rows needs a default")
        return self


class DropColumn(_Change):
    """Drop ``column`` and keep its values in a backup table so that the rollback restores them.

    ``key_columns`` must identify rows (unique, not NULL); the forward refuses to run otherwise.
    ``type`` and ``nullable`` describe the column for the rollback; when omitted they are taken
    from ``current_schema`` given to :func:`generate_migration`.
    """

    kind: Literal["drop"] = "drop"
    key_columns: list[str] = Field(min_length=1)
    type: str | None = None
    nullable: bool | None = None

    @field_validator("key_columns")
    @classmethod
    def _keys(cls, v: list[str], info: Any) -> list[str]:
        return _check_keys(v, info.data.get("column", ""))


class RenameColumn(_Change):
    """Rename ``column`` to ``new_name``; the rollback renames it back."""

    kind: Literal["rename"] = "rename"
    new_name: str

    @field_validator("new_name")
    @classmethod
    def _new_name_is_usable(cls, v: str, info: Any) -> str:
        sql.identifier(v)
        if v == info.data.get("column"):
            raise ValueError("new_name is the column's current name")
        return v


class RetypeColumn(_Change):
    """Change ``column`` from ``from_type`` to ``to_type``; the rollback casts back.

    Lossy retypes (see :func:`classify_retype`) are refused unless ``allow_lossy`` is true; a
    lossy retype then needs ``key_columns`` so the original values can be kept and restored.
    """

    kind: Literal["retype"] = "retype"
    from_type: str
    to_type: str
    allow_lossy: bool = False
    key_columns: list[str] = Field(default_factory=list)

    @field_validator("key_columns")
    @classmethod
    def _keys(cls, v: list[str], info: Any) -> list[str]:
        return _check_keys(v, info.data.get("column", ""))


class SetNullability(_Change):
    """Make ``column`` nullable (``nullable=True``, a relax) or NOT NULL (``nullable=False``).

    On BigQuery, NOT NULL is REQUIRED and nullable is NULLABLE.
    """

    kind: Literal["nullability"] = "nullability"
    nullable: bool


ColumnChange = Annotated[
    Union[AddColumn, DropColumn, RenameColumn, RetypeColumn, SetNullability], Field(discriminator="kind")
]


# -- schemas, guards, checks, the migration ----------------------------------------------------


class ColumnSpec(BaseModel):
    """One column of a table: its name, its type in the table's dialect, and whether it takes NULL."""

    model_config = ConfigDict(frozen=True)

    name: str
    type: str
    nullable: bool = True


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


class Guard(BaseModel):
    """A query returning one count; the direction it guards is refused when the count is not 0.

    ``{rows}`` in ``message`` stands for the count.
    """

    description: str
    sql: str
    message: str


class MigrationCheck(BaseModel):
    """What the catalog must show for one column after a direction has run.

    ``sql`` is an ``information_schema`` query for the column (rows: name, type, nullability);
    :func:`verify_migration` evaluates the same expectation through :func:`read_table_schema`.

    Attributes:
        present: whether the column must exist.
        type: if set, the column's type must be this type (compared after normalizing
            synonyms of the dialect, e.g. ``INT`` and ``NUMBER(38,0)`` on Snowflake).
        nullable: if set, the column's nullability.
    """

    description: str
    sql: str
    table: str
    column: str
    present: bool = True
    type: str | None = None
    nullable: bool | None = None


class Migration(BaseModel):
    """Forward and rollback SQL for one column change on one dialect.

    Attributes:
        change: the change this migration carries out.
        dialect: ``duckdb``, ``snowflake`` or ``bigquery``.
        summary: one human sentence.
        forward: statements to run in order (one statement per string).
        rollback: statements that undo ``forward``, in order.
        forward_guards: queries that must return 0 before ``forward`` runs.
        rollback_guards: queries that must return 0 before ``rollback`` runs.
        checks: what the catalog shows once ``forward`` has run.
        rollback_checks: what the catalog shows once ``rollback`` has run.
        cleanup: statements to run once the rollback window has closed (drop a backup table).
        backup_table: the backup table the forward creates, if any.
        rollback_restores_column_order: False when the rollback re-adds a column at the end.
        notes: dialect limits and side effects, each with its source.
    """

    change: ColumnChange
    dialect: Dialect
    summary: str
    forward: list[str]
    rollback: list[str]
    forward_guards: list[Guard] = Field(default_factory=list)
    rollback_guards: list[Guard] = Field(default_factory=list)
    checks: list[MigrationCheck] = Field(default_factory=list)
    rollback_checks: list[MigrationCheck] = Field(default_factory=list)
    cleanup: list[str] = Field(default_factory=list)
    backup_table: str | None = None
    rollback_restores_column_order: bool = True
    notes: list[str] = Field(default_factory=list)


# -- types -------------------------------------------------------------------------------------

T = exp.DataType.Type
_INT_BITS = {T.TINYINT: 8, T.SMALLINT: 16, T.INT: 32, T.MEDIUMINT: 32, T.BIGINT: 64, T.INT128: 128}
# decimal digits every value of a signed integer type has room for (e.g. 18 for BIGINT: 9.2e18)
_INT_FULL_DIGITS = {8: 2, 16: 4, 32: 9, 64: 18, 128: 38}
# decimal digits needed to hold every value of a signed integer type
_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19, 128: 39}
_TEXT = {T.VARCHAR, T.CHAR, T.TEXT, T.NVARCHAR, T.NCHAR}
_DECIMALS = {T.DECIMAL, T.BIGDECIMAL, T.DECIMAL32, T.DECIMAL64, T.DECIMAL128, T.DECIMAL256}
_SNOWFLAKE_MAX_VARCHAR = (16_777_216, 134_217_728)  # the two maximum lengths Snowflake reports


@dataclass(frozen=True)
class TypeInfo:
    """What a type holds on a dialect: ``family`` plus its size.

    Families: ``int`` (``bits``), ``decimal`` (``precision``, ``scale``), ``float`` (``bits``),
    ``text`` (``length``, None = unbounded), ``bool``, ``date``, ``timestamp`` (no zone),
    ``timestamptz``, ``timestampltz``, ``time``, ``binary`` (``length``), or ``other`` (``name``).
    """

    family: str
    bits: int | None = None
    precision: int | None = None
    scale: int | None = None
    length: int | None = None
    name: str | None = None


def parse_type(text: str, dialect: str) -> exp.DataType:
    """Parse a SQL type written in ``dialect`` into a sqlglot DataType.

    Raises:
        MigrationError: ``text`` is not one complete built-in type of the dialect (trailing
            text, user-defined or unknown type names and statement separators are refused).
    """
    if not isinstance(text, str) or not text.strip():
        raise MigrationError("a column type is empty")
    try:
        statements = sqlglot.parse(f"CAST(NULL AS {text})", read=dialect)
    except sqlglot.errors.SqlglotError as e:
        raise MigrationError(f"not a {dialect} type: {text!r} ({str(e).splitlines()[0]})") from None
    extra = {k for k, v in statements[0].args.items() if v not in (None, False, [])} - {"this", "to", "_type"} \
        if len(statements) == 1 and isinstance(statements[0], exp.Cast) else {"?"}
    if extra:  # e.g. "INT DEFAULT 1" or "INT FORMAT 'x'" parse as CAST options: not a bare type
        raise MigrationError(f"not a {dialect} type: {text!r}")
    dtype = statements[0].args["to"]
    if not isinstance(dtype, exp.DataType) or dtype.this in (T.USERDEFINED, T.UNKNOWN):
        raise MigrationError(f"not a built-in {dialect} type: {text!r}")
    return dtype


def _params(dtype: exp.DataType) -> list[int]:
    out = []
    for e in dtype.expressions:
        node = e.this if isinstance(e, exp.DataTypeParam) else e
        try:
            out.append(int(node.name if isinstance(node, exp.Expression) else node))
        except (TypeError, ValueError):
            out.append(-1)
    return out


def type_info(dtype: exp.DataType | str, dialect: str) -> TypeInfo:
    """What ``dtype`` holds on ``dialect`` (e.g. every integer type is NUMBER(38,0) on Snowflake and INT64 on BigQuery)."""
    if isinstance(dtype, str):
        dtype = parse_type(dtype, dialect)
    t, p = dtype.this, _params(dtype)
    if t in _INT_BITS:
        if dialect == "snowflake":
            return TypeInfo("decimal", precision=38, scale=0)
        return TypeInfo("int", bits=64 if dialect == "bigquery" else _INT_BITS[t])
    if t in _DECIMALS:
        if dialect == "bigquery":
            big = t == T.BIGDECIMAL
            default = (76, 38) if big else (38, 9)
            if not p:
                return TypeInfo("decimal", precision=default[0], scale=default[1])
            return TypeInfo("decimal", precision=p[0], scale=p[1] if len(p) > 1 else 0)
        default = (38, 0) if dialect == "snowflake" else (18, 3)
        if not p:
            return TypeInfo("decimal", precision=default[0], scale=default[1])
        return TypeInfo("decimal", precision=p[0], scale=p[1] if len(p) > 1 else 0)
    if t in (T.FLOAT, T.DOUBLE):
        return TypeInfo("float", bits=32 if (t == T.FLOAT and dialect == "duckdb") else 64)
    if t in _TEXT:
        length = p[0] if p and dialect != "duckdb" else None  # DuckDB does not enforce VARCHAR(n)
        if dialect == "snowflake" and length in _SNOWFLAKE_MAX_VARCHAR:
            length = None
        return TypeInfo("text", length=length)
    if t in (T.BINARY, T.VARBINARY, T.BLOB):
        return TypeInfo("binary", length=p[0] if p and dialect != "duckdb" else None)
    if t == T.BOOLEAN:
        return TypeInfo("bool")
    if t == T.DATE:
        return TypeInfo("date")
    if t in (T.TIMESTAMP, T.TIMESTAMPNTZ, T.DATETIME):
        return TypeInfo("timestamp")
    if t == T.TIMESTAMPTZ:
        return TypeInfo("timestamptz")
    if t == T.TIMESTAMPLTZ:
        return TypeInfo("timestampltz")
    if t == T.TIME:
        return TypeInfo("time")
    return TypeInfo("other", name=dtype.sql(dialect=dialect))


def same_type(a: str, b: str, dialect: str) -> bool:
    """True when ``a`` and ``b`` are the same type on ``dialect`` (synonyms and defaults normalized)."""
    return type_info(a, dialect) == type_info(b, dialect)


@dataclass(frozen=True)
class RetypeAssessment:
    """The outcome of :func:`classify_retype`.

    Attributes:
        lossy: True when some value of the old type cannot survive the new type and back.
        reasons: why it is lossy (empty when it is not).
        same: the two types are the same type on this dialect.
    """

    lossy: bool
    reasons: list[str]
    same: bool = False


def classify_retype(from_type: str, to_type: str, dialect: str) -> RetypeAssessment:
    """Say whether changing a column from ``from_type`` to ``to_type`` can lose information.

    Lossless: integer to a wider integer; integer to a decimal with room for all its digits, or
    to a float whose mantissa holds it (INT to DOUBLE, not BIGINT to DOUBLE); decimal to a decimal
    with at least the same scale and integer digits; decimal with at most 15 digits to a 64-bit
    float; 32-bit to 64-bit float; text to longer or unbounded text; integer, decimal, boolean,
    date and timestamp to unbounded text; date to timestamp; boolean to integer; the same type.

    Lossy, with the reason given: narrowing (fewer integer digits, shorter text, smaller
    integer or float), decimal scale reduction (rounds), integer above 2**53 or decimal above 15
    digits into a float, float to decimal or integer, string to number/date/anything (parsing
    fails or normalizes, ``'007'`` becomes 7), timestamp to date, time-zone changes, and every
    pair not listed as lossless.

    Raises:
        MigrationError: a type does not parse on ``dialect``.
    """
    a, b = type_info(from_type, dialect), type_info(to_type, dialect)
    if a == b:
        return RetypeAssessment(False, [], same=True)
    why: list[str] = []
    fa, fb = a.family, b.family
    if fa == "int" and fb == "int":
        if b.bits < a.bits:
            why.append(f"narrowing: a {a.bits}-bit integer does not fit a {b.bits}-bit integer")
    elif fa == "int" and fb == "decimal":
        if b.precision - b.scale < _INT_DIGITS[a.bits]:
            why.append(f"narrowing: {from_type} needs {_INT_DIGITS[a.bits]} integer digits, {to_type} has {b.precision - b.scale}")
    elif fa == "int" and fb == "float":
        if a.bits > (16 if b.bits == 32 else 32):
            why.append(f"precision: {from_type} values above 2**{24 if b.bits == 32 else 53} are rounded in a {b.bits}-bit float")
    elif fa == "decimal" and fb == "decimal":
        if b.scale < a.scale:
            why.append(f"decimal scale reduction: {a.scale} to {b.scale} digits after the point rounds values")
        if b.precision - b.scale < a.precision - a.scale:
            why.append(f"narrowing: {a.precision - a.scale} to {b.precision - b.scale} integer digits")
    elif fa == "decimal" and fb == "int":
        if a.scale > 0:
            why.append(f"decimal scale reduction: {to_type} has no digits after the point")
        if a.precision - a.scale > _INT_FULL_DIGITS[b.bits]:
            why.append(f"narrowing: {a.precision - a.scale} integer digits do not all fit {to_type}")
    elif fa == "decimal" and fb == "float":
        if a.precision > (6 if b.bits == 32 else 15):
            why.append(f"precision: a {b.bits}-bit float keeps {6 if b.bits == 32 else 15} significant digits, {from_type} has {a.precision}")
    elif fa == "float" and fb == "float":
        if b.bits < a.bits:
            why.append("narrowing: a 64-bit float does not fit a 32-bit float")
    elif fa == "float" and fb in ("decimal", "int"):
        why.append(f"float to {fb}: fractions and large values are rounded or fail")
    elif fa == "text" and fb == "text":
        if b.length is not None and (a.length is None or b.length < a.length):
            why.append(f"narrowing: text longer than {b.length} characters does not fit")
    elif fb == "text" and fa in ("int", "decimal", "bool", "date", "timestamp"):
        if b.length is not None:
            why.append(f"narrowing: the text form of {from_type} may be longer than {b.length} characters")
    elif fa == "text":
        target = "number" if fb in ("int", "decimal", "float") else fb
        why.append(f"string to {target}: values that do not parse fail, others are normalized (e.g. '007' becomes 7)")
    elif fa == "date" and fb == "timestamp":
        pass
    elif fa == "bool" and fb == "int":
        pass
    elif fa == "timestamp" and fb == "date":
        why.append("timestamp to date drops the time of day")
    elif {fa, fb} <= {"timestamp", "timestamptz", "timestampltz"}:
        why.append("time zone: the value read back depends on the session time zone")
    else:
        why.append(f"{fa} to {fb} is not a known lossless change")
    return RetypeAssessment(bool(why), why)


# -- names -------------------------------------------------------------------------------------


def _catalog_name(name: str, dialect: str) -> str:
    """The name the catalog stores for ``name`` (Snowflake upper-cases unquoted names)."""
    if dialect == "snowflake" and not sql.identifier(name).quoted:
        return name.upper()
    return name


def _same_name(reported: str, given: str, dialect: str) -> bool:
    """Whether a name reported by the catalog is the column ``given`` in a statement.

    Snowflake: names that need no quotes compare upper-cased (``c``, ``C``), others exactly.
    DuckDB and BigQuery column names are case-insensitive.
    """
    if dialect == "snowflake":
        return _catalog_name(reported, dialect) == _catalog_name(given, dialect)
    return reported.lower() == given.lower()


def _parts(table: str) -> list[str]:
    return table.split(".")


def _sibling(table: str, name: str) -> str:
    """A table in the same schema as ``table`` called ``name``."""
    return ".".join([*_parts(table)[:-1], name])


def _change_id(change: BaseModel) -> str:
    return hashlib.sha256(change.model_dump_json().encode()).hexdigest()[:8]


# -- statement builders ------------------------------------------------------------------------


def _col(name: str, table_alias: str | None = None) -> exp.Column:
    return exp.Column(this=sql.identifier(name), table=exp.to_identifier(table_alias) if table_alias else None)


def _alter(table: str, action: exp.Expression) -> exp.Alter:
    return exp.Alter(this=sql.table(table), kind="TABLE", actions=[action])


def _add_column(table: str, column: str, dtype: exp.DataType, nullable: bool = True, default: Any = None) -> exp.Alter:
    constraints = []
    if default is not None:
        constraints.append(exp.ColumnConstraint(kind=exp.DefaultColumnConstraint(this=sql.literal(default))))
    if not nullable:
        constraints.append(exp.ColumnConstraint(kind=exp.NotNullColumnConstraint()))
    return _alter(table, exp.ColumnDef(this=sql.identifier(column), kind=dtype.copy(), constraints=constraints or None))


def _drop_column(table: str, column: str) -> exp.Alter:
    return _alter(table, exp.Drop(tables=[_col(column)], kind="COLUMN"))


def _rename_column(table: str, old: str, new: str) -> exp.Alter:
    return _alter(table, exp.RenameColumn(this=_col(old), to=_col(new)))


def _set_not_null(table: str, column: str, not_null: bool) -> exp.Alter:
    if not_null:
        return _alter(table, exp.AlterColumn(this=sql.identifier(column), allow_null=False))
    return _alter(table, exp.AlterColumn(this=sql.identifier(column), drop=True, allow_null=True))


def _set_type(table: str, column: str, dtype: exp.DataType, dialect: str) -> exp.Alter:
    using = exp.Cast(this=_col(column), to=dtype.copy()) if dialect == "duckdb" else None
    return _alter(table, exp.AlterColumn(this=sql.identifier(column), dtype=dtype.copy(), using=using))


def _set_default(table: str, column: str, value: Any) -> exp.Alter:
    return _alter(table, exp.AlterColumn(this=sql.identifier(column), default=sql.literal(value)))


def _drop_table(table: str) -> exp.Drop:
    return exp.Drop(tables=[sql.table(table)], kind="TABLE", exists=True)


def _ctas(new_table: str, select: exp.Select) -> exp.Create:
    return exp.Create(kind="TABLE", this=sql.table(new_table), expression=select)


def _keys_match(keys: Sequence[str], left: str, right: str) -> exp.Expression:
    return exp.and_(*(exp.EQ(this=_col(k, left), expression=_col(k, right)) for k in keys))


def _update_from(table: str, column: str, source: str, keys: Sequence[str]) -> exp.Update:
    """``UPDATE table AS dw_t SET column = dw_b.column FROM source AS dw_b WHERE dw_t.k = dw_b.k ...``."""
    target = sql.table(table)
    target.set("alias", exp.TableAlias(this=exp.to_identifier("dw_t")))
    src = sql.table(source)
    src.set("alias", exp.TableAlias(this=exp.to_identifier("dw_b")))
    from_key = "from_" if "from_" in exp.Update.arg_types else "from"  # renamed in sqlglot 28
    return exp.Update(
        this=target,
        expressions=[exp.EQ(this=_col(column), expression=_col(column, "dw_b"))],
        where=exp.Where(this=_keys_match(keys, "dw_t", "dw_b")),
        **{from_key: exp.From(this=src)},
    )


def _update_set(table: str, column: str, value: exp.Expression, where: exp.Expression) -> exp.Update:
    return exp.Update(
        this=sql.table(table), expressions=[exp.EQ(this=_col(column), expression=value)], where=exp.Where(this=where)
    )


def _count(table: str, where: exp.Expression | None = None, alias: str | None = None) -> exp.Select:
    src = sql.table(table)
    if alias:
        src.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    q = exp.select(exp.Count(this=exp.Star())).from_(src)
    return q.where(where) if where is not None else q


def _is_null(column: str) -> exp.Expression:
    return exp.Is(this=_col(column), expression=exp.Null())


def _not_null(column: str) -> exp.Expression:
    return exp.Not(this=_is_null(column))


def _text_type() -> exp.DataType:
    return exp.DataType.build("VARCHAR")


def _try_cast_type(dtype: exp.DataType, dialect: str) -> exp.DataType:
    """``dtype`` for use in an expression: BigQuery takes parameterized types in DDL only (sqlglot
    strips ``NUMERIC(P, S)`` to ``NUMERIC`` in a CAST), so the parameters are dropped there and
    checked separately by :func:`_does_not_fit`."""
    out = dtype.copy()
    if dialect == "bigquery":
        out.set("expressions", [])
    return out


def _does_not_fit(column: str, target: exp.DataType, info: TypeInfo, dialect: str, *, exact: bool) -> exp.Expression:
    """True for a row whose non-NULL value cannot be held by ``target``.

    The value goes through text first because Snowflake's TRY_CAST only takes strings. With
    ``exact``, a value that the cast changes (rounds) counts as not fitting too. Decimal integer
    digits, decimal scale and text length are also checked explicitly, which does not depend on
    how a dialect treats the type's parameters in a cast.
    """
    attempt = exp.TryCast(this=exp.Cast(this=_col(column), to=_text_type()), to=_try_cast_type(target, dialect))
    conds: list[exp.Expression] = [exp.Is(this=attempt.copy(), expression=exp.Null())]
    if exact:
        conds.append(exp.NEQ(this=attempt.copy(), expression=_col(column)))
    if info.family == "decimal" and info.precision is not None:
        conds.append(exp.GTE(this=exp.Abs(this=_col(column)),
                             expression=exp.Pow(this=exp.Literal.number(10), expression=exp.Literal.number(info.precision - info.scale))))
        if exact:
            conds.append(exp.NEQ(this=exp.Round(this=_col(column), decimals=exp.Literal.number(info.scale)), expression=_col(column)))
    if info.family in ("text", "binary") and info.length is not None:
        conds.append(exp.GT(this=exp.Length(this=_col(column)), expression=exp.Literal.number(info.length)))
    return exp.and_(_not_null(column), exp.paren(exp.or_(*conds), copy=False))


# -- information_schema ------------------------------------------------------------------------


def _info_schema_columns(table: str, dialect: str, column: str | None = None) -> exp.Select:
    """``information_schema`` query for the columns of ``table`` (or just ``column``), in order.

    Rows: ``column_name, data_type, is_nullable`` and, except on DuckDB and BigQuery,
    ``numeric_precision, numeric_scale, character_maximum_length`` (the standard catalog's
    ``data_type`` has no parameters). PostgreSQL, MySQL/MariaDB and other engines with the SQL
    standard's ``information_schema`` are read there: an unqualified name means the current schema
    (``current_schema()``; ``DATABASE()`` on MySQL).
    """
    parts = _parts(table)
    name = parts[-1]
    schema = parts[-2] if len(parts) >= 2 else None
    catalog = parts[-3] if len(parts) == 3 else None
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
                        catalog=sql.identifier(catalog) if catalog else None)
        conds = [
            exp.EQ(this=exp.column("table_name"), expression=sql.literal(_catalog_name(name, dialect))),
            exp.EQ(this=exp.column("table_schema"),
                   expression=sql.literal(_catalog_name(schema, dialect)) if schema else exp.func("CURRENT_SCHEMA")),
        ]
        if column:
            conds.append(exp.EQ(this=exp.column("column_name"), expression=sql.literal(_catalog_name(column, dialect))))
    elif dialect == "bigquery":
        if schema is None:
            raise MigrationError(f"name BigQuery tables with their dataset (dataset.table), got {table!r}")
        # sqlglot's own form of `project.dataset.INFORMATION_SCHEMA.COLUMNS`
        src = exp.Table(this=exp.Identifier(this="INFORMATION_SCHEMA.COLUMNS", quoted=True),
                        db=sql.identifier(schema), catalog=sql.identifier(catalog) if catalog else None)
        conds = [exp.EQ(this=exp.column("table_name"), expression=sql.literal(name))]
        if column:
            conds.append(exp.EQ(this=lower(exp.column("column_name")), expression=sql.literal(column.lower())))
    else:
        src = exp.Table(this=ident("columns"), db=ident("information_schema"))
        current = exp.func("DATABASE") if dialect == "mysql" else exp.func("current_schema")
        conds = [
            exp.EQ(this=exp.column("table_name"), expression=sql.literal(name)),
            exp.EQ(this=exp.column("table_schema"), expression=sql.literal(schema) if schema else current),
        ]
        if catalog:
            conds.append(exp.EQ(this=exp.column("table_catalog"), expression=sql.literal(catalog)))
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
    parts = _parts(table)
    if len(parts) == 3:
        return table
    if len(parts) == 2:
        return f"{db.project}.{table}"
    if not getattr(db, "dataset", None):
        raise MigrationError(f"name BigQuery tables with their dataset (dataset.table), got {table!r}")
    return f"{db.project}.{db.dataset}.{table}"


def _read_bigquery_schema(db: Any, table: str) -> TableSchema:
    sql.table(table)
    try:
        with db.client() as client:
            t = client.get_table(_bigquery_ref(db, table))
    except Exception as e:
        if type(e).__name__ == "NotFound":
            raise MigrationError(f"{db.name}: table {table} not found") from None
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
        MigrationError: the table does not exist (no columns).
        dw_dagster.sql.UnsafeIdentifierError: a part of ``table`` is hostile.
        dw_dagster.databases.DatabaseError: the query or the API call failed.
    """
    dialect = db.dialect
    if dialect == "bigquery":
        schema = _read_bigquery_schema(db, table)
    else:
        q = _render(_info_schema_columns(table, dialect), dialect)
        rows = db.fetch_all(q)
        schema = TableSchema(
            table=table,
            columns=[ColumnSpec(name=r[0], type=_catalog_type(r, dialect), nullable=str(r[2]).upper() == "YES") for r in rows],
        )
    if not schema.columns:
        raise MigrationError(f"{db.name}: table {table} not found (no columns in the catalog)")
    return schema


# -- generation --------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What a change generator fills in; turned into a :class:`Migration`."""

    summary: str
    forward: list[exp.Expression]
    rollback: list[exp.Expression]
    forward_guards: list[Guard]
    rollback_guards: list[Guard]
    checks: list[MigrationCheck]
    rollback_checks: list[MigrationCheck]
    cleanup: list[exp.Expression]
    backup_table: str | None = None
    order_restored: bool = True
    notes: list[str] = field(default_factory=list)


def _new_plan(summary: str) -> _Plan:
    return _Plan(summary, [], [], [], [], [], [], [])


_NOTE_BQ_NO_SET_NOT_NULL = (
    "BigQuery cannot change a column from NULLABLE to REQUIRED in place: there is no ALTER COLUMN "
    "SET NOT NULL and a mode only changes from REQUIRED to NULLABLE ({src}); the table is rebuilt with "
    "CREATE OR REPLACE TABLE (column list with NOT NULL) AS SELECT, a full rewrite billed as a query, "
    "refused while the column holds NULLs."
)
_NOTE_BQ_REBUILD_LOSES = (
    "The BigQuery rebuild re-declares the columns, their modes, time partitioning and clustering; table "
    "options (description, labels, expiration), column descriptions and row access policies are not re-declared "
    "by it and must be re-applied if the table has them ({src})."
)


def _render(e: exp.Expression, dialect: str) -> str:
    """Render ``e`` for ``dialect``, raising when sqlglot cannot express part of it there.

    One exception: sqlglot 30 reports ``ALTER COLUMN ... SET NOT NULL`` as unsupported while
    rendering it correctly (its generator only accepts ``allow_null`` when ``drop`` is set), so
    that statement is rendered without the check.
    """
    action = e.args.get("actions", [None])[0] if isinstance(e, exp.Alter) else None
    if isinstance(action, exp.AlterColumn) and action.args.get("allow_null") is False and not action.args.get("drop"):
        return e.sql(dialect=dialect, unsupported_level=ErrorLevel.IGNORE)
    return e.sql(dialect=dialect, unsupported_level=ErrorLevel.RAISE)


def _check(table: str, column: str, dialect: str, *, present: bool = True, type: str | None = None,
           nullable: bool | None = None, what: str) -> MigrationCheck:
    return MigrationCheck(
        description=what, sql=_render(_info_schema_columns(table, dialect, column), dialect), table=table,
        column=column, present=present, type=type, nullable=nullable,
    )


def _rebuild(table: str, columns: Sequence[ColumnSpec], schema: TableSchema,
             select: Mapping[str, exp.Expression] | None = None) -> exp.Create:
    """``CREATE OR REPLACE TABLE table (<columns>) [PARTITION BY] [CLUSTER BY] AS SELECT ... FROM table``.

    ``select`` maps a column name to the expression that fills it (default: the column itself).
    """
    if schema.rebuild_blockers:
        raise MigrationError(
            f"{table}: this change needs a BigQuery table rebuild, which would drop: {'; '.join(schema.rebuild_blockers)}"
        )
    select = dict(select or {})
    defs, exprs = [], []
    for c in columns:
        dtype = parse_type(c.type, "bigquery")
        constraints = None if c.nullable else [exp.ColumnConstraint(kind=exp.NotNullColumnConstraint())]
        defs.append(exp.ColumnDef(this=sql.identifier(c.name), kind=dtype, constraints=constraints))
        e = select.get(c.name)
        exprs.append(exp.alias_(e, sql.identifier(c.name)) if e is not None else _col(c.name))
    props = []
    if schema.partition_column:
        pcol = next((c for c in columns if _same_name(c.name, schema.partition_column, "bigquery")), None)
        if pcol is None:
            raise MigrationError(f"{table}: partition column {schema.partition_column} is not among the columns")
        fam, unit = type_info(pcol.type, "bigquery").family, schema.partition_granularity or "DAY"
        pc = _col(pcol.name)
        if fam == "date":
            part = pc if unit == "DAY" else exp.DateTrunc(this=pc, unit=exp.Literal.string(unit))
        elif fam == "timestamptz":
            part = exp.TimestampTrunc(this=pc, unit=exp.Var(this=unit))
        elif fam == "timestamp":
            part = exp.DatetimeTrunc(this=pc, unit=exp.Var(this=unit))
        else:
            raise MigrationError(f"{table}: cannot re-declare time partitioning on a {pcol.type} column")
        props.append(exp.PartitionedByProperty(this=part))
    if schema.cluster_columns:
        props.append(exp.ClusterProperty(expressions=[_col(c) for c in schema.cluster_columns]))
    return exp.Create(
        kind="TABLE", replace=True, this=exp.Schema(this=sql.table(table), expressions=defs),
        expression=exp.select(*exprs).from_(sql.table(table)),
        properties=exp.Properties(expressions=props) if props else None,
    )


def _need_schema(schema: TableSchema | None, why: str) -> TableSchema:
    if schema is None:
        raise MigrationError(f"{why}; pass current_schema=read_table_schema(db, table) to generate_migration")
    return schema


def _no_nulls_guard(table: str, column: str, dialect: str, message: str) -> Guard:
    return Guard(description=f"no NULL in {column}", sql=_render(_count(table, _is_null(column)), dialect), message=message)


def _keys_guard(table: str, keys: Sequence[str], dialect: str) -> Guard:
    """Rows whose key is NULL or shared with another row."""
    grouped = (
        exp.select(*(_col(k) for k in keys)).from_(sql.table(table)).group_by(*(_col(k) for k in keys))
        .having(exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(1)))
    )
    dupes = exp.select(exp.Count(this=exp.Star())).from_(grouped.subquery("dw_d"))
    null_keys = _count(table, exp.or_(*(_is_null(k) for k in keys)))
    q = exp.select(exp.Add(this=dupes.subquery(), expression=null_keys.subquery()))
    return Guard(
        description=f"key_columns {', '.join(keys)} identify the rows of {table}",
        sql=_render(q, dialect),
        message=f"refused: key_columns ({', '.join(keys)}) do not identify the rows of {table}: "
                "{rows} key value(s) are duplicated or NULL, so the backup could not be restored row by row",
    )


def _backup_statements(table: str, backup: str, keys: Sequence[str], column: str) -> exp.Create:
    return _ctas(backup, exp.select(*(_col(k) for k in (*keys, column))).from_(sql.table(table)))


def _gen_add(c: AddColumn, d: str, schema: TableSchema | None, p: _Plan) -> None:
    dtype = parse_type(c.type, d)
    if schema is not None and schema.column(c.column, d) is not None:
        raise MigrationError(f"{c.table} already has a column {c.column}")
    if d == "bigquery":
        if not c.nullable:
            raise MigrationError(
                "BigQuery cannot add a REQUIRED column to an existing table "
                f"({SOURCES['bigquery_schemas']}, 'Add an empty column'): add it nullable with a default, "
                "then SetNullability(nullable=False), which rebuilds the table"
            )
        p.forward.append(_add_column(c.table, c.column, dtype))
        if c.default is not None:
            p.forward.append(_set_default(c.table, c.column, c.default))
            p.forward.append(_update_set(c.table, c.column, sql.literal(c.default), _is_null(c.column)))
            p.notes.append(
                "BigQuery: the default is set with ALTER COLUMN SET DEFAULT and written into existing rows by an "
                f"UPDATE, so the result does not depend on whether ADD COLUMN fills them ({SOURCES['bigquery_ddl']})."
            )
    else:
        p.forward.append(_add_column(c.table, c.column, dtype, c.nullable, c.default))
        if c.default is not None:
            src = SOURCES["duckdb_alter_table"] if d == "duckdb" else SOURCES["snowflake_alter_table"]
            p.notes.append(f"{d}: ADD COLUMN ... DEFAULT fills the existing rows with the default ({src}).")
    p.rollback.append(_drop_column(c.table, c.column))
    p.notes.append("The rollback drops the column: values written into it after the forward are dropped too.")
    p.checks.append(_check(c.table, c.column, d, type=c.type, nullable=c.nullable, what=f"{c.column} added as {c.type}"))
    p.rollback_checks.append(_check(c.table, c.column, d, present=False, what=f"{c.column} gone again"))


def _gen_drop(c: DropColumn, d: str, schema: TableSchema | None, p: _Plan) -> None:
    col_type, nullable = c.type, c.nullable
    spec = schema.column(c.column, d) if schema else None
    if schema is not None and spec is None:
        raise MigrationError(f"{c.table} has no column {c.column}")
    if schema is not None:
        for k in c.key_columns:
            if schema.column(k, d) is None:
                raise MigrationError(f"{c.table} has no key column {k}")
    if spec is not None:
        col_type = col_type or spec.type
        nullable = spec.nullable if nullable is None else nullable
    if col_type is None or nullable is None:
        raise MigrationError(
            "DropColumn needs the column's type and nullability for its rollback: give type= and nullable=, "
            "or current_schema=read_table_schema(db, table)"
        )
    dtype = parse_type(col_type, d)
    if d == "bigquery" and schema is not None and (
        (schema.partition_column and _same_name(schema.partition_column, c.column, d))
        or any(_same_name(x, c.column, d) for x in schema.cluster_columns)
    ):
        raise MigrationError(f"BigQuery cannot drop a partitioning or clustering column ({SOURCES['bigquery_ddl']})")
    backup = _sibling(c.table, f"{_parts(c.table)[-1]}__dw_backup_{_change_id(c)}")
    p.backup_table = backup
    p.forward_guards.append(_keys_guard(c.table, c.key_columns, d))
    p.forward.append(_backup_statements(c.table, backup, c.key_columns, c.column))
    p.forward.append(_drop_column(c.table, c.column))
    p.rollback.append(_add_column(c.table, c.column, dtype))
    p.rollback.append(_update_from(c.table, c.column, backup, c.key_columns))
    order_restored = False
    if not nullable:
        bt = sql.table(backup)
        bt.set("alias", exp.TableAlias(this=exp.to_identifier("dw_b")))
        missing = exp.Not(this=exp.Exists(this=exp.select(exp.Literal.number(1)).from_(bt)
                                          .where(_keys_match(c.key_columns, "dw_t", "dw_b"))))
        p.rollback_guards.append(Guard(
            description=f"every row of {c.table} has a backed-up {c.column}",
            sql=_render(_count(c.table, missing, alias="dw_t"), d),
            message=f"refused: {{rows}} row(s) of {c.table} were written after {c.column} was dropped and have no value "
                    f"to restore into the NOT NULL column {c.column}; fill or delete them first",
        ))
        if d == "bigquery":
            sch = _need_schema(schema, "the rollback re-imposes REQUIRED on the re-added column, which BigQuery "
                                       "only does by rebuilding the table")
            p.rollback.append(_rebuild(c.table, sch.columns, sch))
            p.notes.append(_NOTE_BQ_NO_SET_NOT_NULL.format(src=SOURCES["bigquery_schemas"]))
            p.notes.append(_NOTE_BQ_REBUILD_LOSES.format(src=SOURCES["bigquery_ddl"]))
            order_restored = True
        else:
            p.rollback.append(_set_not_null(c.table, c.column, True))
    p.rollback.append(_drop_table(backup))
    p.cleanup.append(_drop_table(backup))
    p.order_restored = order_restored
    p.notes.append(
        f"The forward keeps {', '.join(c.key_columns)} and {c.column} in {backup}; the rollback adds {c.column} back "
        f"(at the end of the table{'' if order_restored else ', so the column order differs from the start'}), restores "
        "its values by key and drops the backup. Rows written after the drop get NULL. Run `cleanup` to drop the "
        "backup once the rollback window has closed."
    )
    if d == "bigquery":
        p.notes.append(f"BigQuery DROP COLUMN cannot drop partitioning or clustering columns ({SOURCES['bigquery_ddl']}).")
    p.checks += [
        _check(c.table, c.column, d, present=False, what=f"{c.column} dropped from {c.table}"),
        _check(backup, c.column, d, type=col_type, what=f"{c.column} kept in {backup}"),
    ]
    p.rollback_checks.append(_check(c.table, c.column, d, type=col_type, nullable=nullable, what=f"{c.column} back"))


def _gen_rename(c: RenameColumn, d: str, schema: TableSchema | None, p: _Plan) -> None:
    if schema is not None:
        if schema.column(c.column, d) is None:
            raise MigrationError(f"{c.table} has no column {c.column}")
        if schema.column(c.new_name, d) is not None:
            raise MigrationError(f"{c.table} already has a column {c.new_name}")
    p.forward.append(_rename_column(c.table, c.column, c.new_name))
    p.rollback.append(_rename_column(c.table, c.new_name, c.column))
    p.notes.append("Views and queries that name the old column stop working until they are changed.")
    p.checks += [_check(c.table, c.column, d, present=False, what=f"{c.column} no longer exists"),
                 _check(c.table, c.new_name, d, what=f"{c.new_name} exists")]
    p.rollback_checks += [_check(c.table, c.new_name, d, present=False, what=f"{c.new_name} no longer exists"),
                          _check(c.table, c.column, d, what=f"{c.column} exists again")]


def _bigquery_in_place(a: TypeInfo, b: TypeInfo) -> bool:
    """Whether BigQuery's ALTER COLUMN SET DATA TYPE takes ``a`` to ``b``.

    INT64 to NUMERIC/BIGNUMERIC/FLOAT64 and NUMERIC to BIGNUMERIC/FLOAT64 (coercions), and a
    parameterized type to a less restrictive one of the same kind.
    """
    if a.family == "int":
        return b.family == "float" or (b.family == "decimal" and (b.precision, b.scale) in ((38, 9), (76, 38)))
    if a.family == "decimal":
        if b.family == "float":
            return True
        return b.family == "decimal" and b.scale >= a.scale and b.precision - b.scale >= a.precision - a.scale
    if a.family in ("text", "binary") and b.family == a.family:
        return b.length is None or (a.length is not None and b.length >= a.length)
    return False


def _snowflake_in_place(a: TypeInfo, b: TypeInfo) -> bool:
    """Whether Snowflake's SET DATA TYPE takes ``a`` to ``b``: synonyms, longer VARCHAR, NUMBER precision at the same scale."""
    if a == b:
        return True
    if a.family == "decimal" and b.family == "decimal":
        return a.scale == b.scale
    if a.family == "text" and b.family == "text":
        return b.length is None or (a.length is not None and b.length >= a.length)
    return False


def _retype_steps(table: str, column: str, current: str, target: str, d: str, schema: TableSchema | None,
                  tmp: str, direction: str, p: _Plan) -> tuple[list[exp.Expression], bool]:
    """Statements that change ``column`` from ``current`` to ``target``; and whether column order is kept."""
    a, b = type_info(current, d), type_info(target, d)
    tdt = parse_type(target, d)
    if d == "duckdb":
        return [_set_type(table, column, tdt, d)], True
    if d == "snowflake":
        if _snowflake_in_place(a, b):
            return [_set_type(table, column, tdt, d)], True
        spec = schema.column(column, d) if schema else None
        if spec is None:
            raise MigrationError(
                f"Snowflake cannot change {column} from {current} to {target} in place ({SOURCES['snowflake_alter_column']}); "
                "the column is swapped for a new one, which needs its nullability"
                + ("" if schema else ": pass current_schema=read_table_schema(db, table)")
            )
        steps: list[exp.Expression] = [
            _add_column(table, tmp, tdt),
            _update_set(table, tmp, exp.Cast(this=_col(column), to=tdt.copy()), exp.true()),
            _drop_column(table, column),
            _rename_column(table, tmp, column),
        ]
        if not spec.nullable:
            steps.append(_set_not_null(table, column, True))
        p.notes.append(
            f"Snowflake ({direction}): SET DATA TYPE cannot change {current} to {target} (only synonyms, longer VARCHAR, "
            f"NUMBER precision at the same scale: {SOURCES['snowflake_alter_column']}); the column is swapped "
            f"(add {tmp}, fill with CAST, drop, rename{', SET NOT NULL' if not spec.nullable else ''}). It moves to the "
            "end of the table and loses its default, comment, tags and policies."
        )
        return steps, False
    if _bigquery_in_place(a, b):
        return [_set_type(table, column, tdt, d)], True
    sch = _need_schema(schema, f"BigQuery cannot change {column} from {current} to {target} with ALTER COLUMN SET DATA "
                               f"TYPE ({SOURCES['bigquery_ddl']}); the table is rebuilt, which needs its schema")
    cols = [ColumnSpec(name=x.name, type=target if _same_name(x.name, column, d) else x.type, nullable=x.nullable)
            for x in sch.columns]
    p.notes.append(
        f"BigQuery ({direction}): ALTER COLUMN SET DATA TYPE only takes INT64 to NUMERIC/BIGNUMERIC/FLOAT64, NUMERIC to "
        f"BIGNUMERIC/FLOAT64 and a parameterized type to a less restrictive one ({SOURCES['bigquery_ddl']}; "
        f"{SOURCES['bigquery_conversion']}); {current} to {target} rebuilds the table with CREATE OR REPLACE TABLE ... "
        "AS SELECT CAST(...), a full rewrite billed as a query."
    )
    p.notes.append(_NOTE_BQ_REBUILD_LOSES.format(src=SOURCES["bigquery_ddl"]))
    value: exp.Expression = _col(column)
    if a.family == "decimal" and b.family == "decimal" and b.scale < a.scale:
        # the CAST carries no parameters on BigQuery: round explicitly (half away from zero)
        value = exp.Round(this=value, decimals=exp.Literal.number(b.scale))
    return [_rebuild(table, cols, sch, {column: exp.Cast(this=value, to=tdt.copy())})], True


def _gen_retype(c: RetypeColumn, d: str, schema: TableSchema | None, p: _Plan) -> None:
    from_dt, to_dt = parse_type(c.from_type, d), parse_type(c.to_type, d)
    spec = schema.column(c.column, d) if schema else None
    if schema is not None:
        if spec is None:
            raise MigrationError(f"{c.table} has no column {c.column}")
        if not same_type(spec.type, c.from_type, d):
            raise MigrationError(f"{c.table}.{c.column} is {spec.type}, not from_type {c.from_type}")
    fwd = classify_retype(c.from_type, c.to_type, d)
    if fwd.same:
        raise MigrationError(f"{c.from_type} and {c.to_type} are the same type on {d}; nothing to change")
    if fwd.lossy and not c.allow_lossy:
        raise LossyRetypeError(
            f"refused: changing {c.table}.{c.column} from {c.from_type} to {c.to_type} on {d} is lossy: "
            f"{'; '.join(fwd.reasons)}. Pass allow_lossy=True with key_columns to keep the original values for the rollback.",
            fwd.reasons,
        )
    if fwd.lossy and not c.key_columns:
        raise MigrationError("a lossy retype needs key_columns so that its rollback can restore the original values")
    cid = _change_id(c)
    tmp = f"{c.column}__dw_retype_{cid}"
    backup = None
    if fwd.lossy:
        backup = _sibling(c.table, f"{_parts(c.table)[-1]}__dw_backup_{cid}")
        p.backup_table = backup
        p.forward_guards.append(_keys_guard(c.table, c.key_columns, d))
        # values the new type cannot take at all make the forward fail half-way on some dialects
        none = _does_not_fit(c.column, to_dt, type_info(c.to_type, d), d, exact=False)
        p.forward_guards.append(Guard(
            description=f"every {c.column} value casts to {c.to_type}", sql=_render(_count(c.table, none), d),
            message=f"refused: {{rows}} value(s) of {c.table}.{c.column} cannot be cast to {c.to_type}",
        ))
        p.forward.append(_backup_statements(c.table, backup, c.key_columns, c.column))
        p.notes.append(f"Lossy ({'; '.join(fwd.reasons)}): allowed by allow_lossy; the original values are kept in "
                       f"{backup} and restored by the rollback. Run `cleanup` to drop it once the rollback window has closed.")
    steps, kept_f = _retype_steps(c.table, c.column, c.from_type, c.to_type, d, schema, tmp, "forward", p)
    p.forward += steps
    after = schema
    if schema is not None:  # the schema after the forward, for a rollback rebuild
        after = schema.model_copy(update={"columns": [
            ColumnSpec(name=x.name, type=c.to_type if _same_name(x.name, c.column, d) else x.type, nullable=x.nullable)
            for x in schema.columns]})
    back_steps, kept_r = _retype_steps(c.table, c.column, c.to_type, c.from_type, d, after, tmp, "rollback", p)
    back = classify_retype(c.to_type, c.from_type, d)
    if back.lossy:
        p.rollback_guards.append(Guard(
            description=f"every {c.column} value survives the cast back to {c.from_type}",
            sql=_render(_count(c.table, _does_not_fit(c.column, from_dt, type_info(c.from_type, d), d, exact=True)), d),
            message=f"refused: {{rows}} value(s) of {c.table}.{c.column} written since the retype do not fit "
                    f"{c.from_type}; change or delete them before rolling back",
        ))
    p.rollback += back_steps
    if backup:
        p.rollback.append(_update_from(c.table, c.column, backup, c.key_columns))
        p.rollback.append(_drop_table(backup))
        p.cleanup.append(_drop_table(backup))
    p.order_restored = kept_f and kept_r
    p.checks.append(_check(c.table, c.column, d, type=c.to_type, what=f"{c.column} is {c.to_type}"))
    p.rollback_checks.append(_check(c.table, c.column, d, type=c.from_type, what=f"{c.column} is {c.from_type} again"))


def _gen_nullability(c: SetNullability, d: str, schema: TableSchema | None, p: _Plan) -> None:
    spec = schema.column(c.column, d) if schema else None
    if schema is not None:
        if spec is None:
            raise MigrationError(f"{c.table} has no column {c.column}")
        if spec.nullable == c.nullable:
            raise MigrationError(f"{c.table}.{c.column} is already {'nullable' if c.nullable else 'NOT NULL'}")
    mode = "REQUIRED" if d == "bigquery" else "NOT NULL"
    nulls_msg = ("refused: {rows} row(s) of " + f"{c.table} hold NULL in {c.column}" + "{after}; " + mode
                 + " cannot be re-imposed while NULLs exist. Backfill or delete those rows first.")
    relax_sql, tighten_sql = [_set_not_null(c.table, c.column, False)], [_set_not_null(c.table, c.column, True)]
    if d == "bigquery":
        sch = _need_schema(schema, f"BigQuery cannot re-impose REQUIRED on {c.column} in place ({SOURCES['bigquery_schemas']}); "
                                   "the " + ("rollback" if c.nullable else "forward") + " rebuilds the table, which needs its schema")
        required = [ColumnSpec(name=x.name, type=x.type, nullable=False if _same_name(x.name, c.column, d) else x.nullable)
                    for x in sch.columns]
        tighten_sql = [_rebuild(c.table, required, sch)]
        p.notes.append(_NOTE_BQ_NO_SET_NOT_NULL.format(src=SOURCES["bigquery_schemas"]))
        p.notes.append(_NOTE_BQ_REBUILD_LOSES.format(src=SOURCES["bigquery_ddl"]))
        p.notes.append(f"BigQuery relaxes REQUIRED to NULLABLE in place with ALTER COLUMN DROP NOT NULL ({SOURCES['bigquery_ddl']}).")
    else:
        src = SOURCES["duckdb_alter_table"] if d == "duckdb" else SOURCES["snowflake_alter_column"]
        p.notes.append(f"{d}: ALTER COLUMN SET NOT NULL / DROP NOT NULL change nullability in place ({src}).")
    if c.nullable:
        p.forward += relax_sql
        p.rollback += tighten_sql
        p.rollback_guards.append(_no_nulls_guard(c.table, c.column, d, nulls_msg.replace("{after}", " (written after the relax)")))
    else:
        p.forward_guards.append(_no_nulls_guard(c.table, c.column, d, nulls_msg.replace("{after}", "")))
        p.forward += tighten_sql
        p.rollback += relax_sql
    p.checks.append(_check(c.table, c.column, d, nullable=c.nullable,
                           what=f"{c.column} is {'nullable' if c.nullable else 'NOT NULL'}"))
    p.rollback_checks.append(_check(c.table, c.column, d, nullable=not c.nullable,
                                    what=f"{c.column} is {'NOT NULL' if c.nullable else 'nullable'} again"))


def _summary(c: BaseModel, d: str) -> str:
    if isinstance(c, AddColumn):
        return (f"Add {c.column} {c.type}{'' if c.nullable else ' NOT NULL'}"
                f"{'' if c.default is None else f' DEFAULT {c.default!r}'} to {c.table} on {d}; rollback drops it.")
    if isinstance(c, DropColumn):
        return (f"Drop {c.column} from {c.table} on {d}, keeping it by {', '.join(c.key_columns)} in a backup table; "
                "rollback re-adds and restores it.")
    if isinstance(c, RenameColumn):
        return f"Rename {c.table}.{c.column} to {c.new_name} on {d}; rollback renames it back."
    if isinstance(c, RetypeColumn):
        return f"Change {c.table}.{c.column} from {c.from_type} to {c.to_type} on {d}; rollback casts back to {c.from_type}."
    assert isinstance(c, SetNullability)
    mode = ("REQUIRED", "NULLABLE") if d == "bigquery" else ("NOT NULL", "nullable")
    if c.nullable:
        return (f"Relax {c.table}.{c.column} from {mode[0]} to {mode[1]} on {d}; rollback re-imposes {mode[0]}, "
                "refused while NULLs exist.")
    return f"Make {c.table}.{c.column} {mode[0]} on {d} (refused while NULLs exist); rollback relaxes it again."


_GENERATORS: dict[type, Callable[..., None]] = {
    AddColumn: _gen_add, DropColumn: _gen_drop, RenameColumn: _gen_rename,
    RetypeColumn: _gen_retype, SetNullability: _gen_nullability,
}


def generate_migration(change: AddColumn | DropColumn | RenameColumn | RetypeColumn | SetNullability,
                       dialect: str, *, current_schema: TableSchema | None = None) -> Migration:
    """Produce forward and rollback SQL for one column change on one dialect.

    Args:
        change: an :class:`AddColumn`, :class:`DropColumn`, :class:`RenameColumn`,
            :class:`RetypeColumn` or :class:`SetNullability`.
        dialect: ``"duckdb"``, ``"snowflake"`` or ``"bigquery"``.
        current_schema: the table's schema before the change, from :func:`read_table_schema`.
            Required where a statement needs the whole table: a BigQuery rebuild (re-imposing
            REQUIRED, a retype BigQuery cannot do in place) and a Snowflake column swap. When
            given, the change is also checked against it (the column exists, ``from_type``
            matches, the nullability really changes).

    Returns:
        A :class:`Migration` whose statements, guards and checks are rendered for ``dialect``.

    Raises:
        MigrationError: the dialect is not supported, a type does not parse, the change does not
            fit ``current_schema``, or it needs ``current_schema`` and none was given, or the
            dialect cannot do it (e.g. adding a REQUIRED column on BigQuery).
        LossyRetypeError: a lossy retype without ``allow_lossy=True``.
        dw_dagster.sql.UnsafeIdentifierError: a table or column name is hostile (for changes
            built with ``model_construct``; validated models refuse such names already).
    """
    if dialect not in DIALECTS:
        raise MigrationError(f"unsupported dialect {dialect!r}; supported: {', '.join(DIALECTS)}")
    gen = _GENERATORS.get(type(change))
    if gen is None:
        raise MigrationError(f"not a column change: {type(change).__name__}")
    sql.table(change.table)
    sql.identifier(change.column)
    if dialect == "bigquery" and len(_parts(change.table)) < 2:
        raise MigrationError(f"name BigQuery tables with their dataset (dataset.table), got {change.table!r}")
    plan = _new_plan(_summary(change, dialect))
    gen(change, dialect, current_schema, plan)

    def render(stmts: Sequence[exp.Expression]) -> list[str]:
        return [_render(s, dialect) for s in stmts]

    notes = list(dict.fromkeys(plan.notes))  # keep order, drop repeats
    return Migration(
        change=change, dialect=dialect, summary=plan.summary, forward=render(plan.forward),
        rollback=render(plan.rollback), forward_guards=plan.forward_guards, rollback_guards=plan.rollback_guards,
        checks=plan.checks, rollback_checks=plan.rollback_checks, cleanup=render(plan.cleanup),
        backup_table=plan.backup_table, rollback_restores_column_order=plan.order_restored, notes=notes,
    )


# -- running -----------------------------------------------------------------------------------


def check_guards(db: Database, migration: Migration, direction: Literal["forward", "rollback"] = "forward") -> None:
    """Run the guards of one direction.

    Raises:
        MigrationRefused: a guard counted rows (the message says how many and what to do).
        ValueError: ``direction`` is neither ``forward`` nor ``rollback``.
    """
    guards = _direction(migration, direction)[1]
    for g in guards:
        ((n,),) = db.fetch_all(g.sql)
        if int(n or 0):
            raise MigrationRefused(g, int(n))


def _direction(m: Migration, direction: str) -> tuple[list[str], list[Guard], list[MigrationCheck]]:
    if direction == "forward":
        return m.forward, m.forward_guards, m.checks
    if direction == "rollback":
        return m.rollback, m.rollback_guards, m.rollback_checks
    raise ValueError(f"direction is 'forward' or 'rollback', got {direction!r}")


def apply_migration(db: Database, migration: Migration, direction: Literal["forward", "rollback"] = "forward") -> None:
    """Run one direction of ``migration`` on ``db``: its guards, then its statements in order.

    The statements run one by one (each :meth:`~dw_dagster.databases.Database.execute` is its
    own transaction on these databases), so a failure part-way leaves the earlier ones applied;
    the error names the statement. DDL commits implicitly on Snowflake and BigQuery anyway.

    Raises:
        MigrationRefused: a guard found rows that make this direction unsafe; nothing ran.
        MigrationError: ``db.dialect`` is not the migration's dialect.
        dw_dagster.databases.DatabaseError: a statement failed.
    """
    if db.dialect != migration.dialect:
        raise MigrationError(f"the migration is for {migration.dialect}, the database is {db.dialect}")
    statements = _direction(migration, direction)[0]
    check_guards(db, migration, direction)
    for s in statements:
        db.execute(s)


def verify_migration(db: Database, migration: Migration, direction: Literal["forward", "rollback"] = "forward",
                     *, read_schema: Callable[[Database, str], TableSchema] = read_table_schema) -> list[str]:
    """Compare the catalog with the checks of one direction.

    Args:
        db: the database the migration ran on.
        migration: the migration.
        direction: ``"forward"`` (its :attr:`Migration.checks`) or ``"rollback"``.
        read_schema: how to read a table's schema; :func:`read_table_schema` by default
            (a test can substitute another source for an emulator).

    Returns:
        One line per check that does not hold; empty when the direction took effect.

    Raises:
        dw_dagster.databases.DatabaseError: reading the catalog failed.
    """
    failures: list[str] = []
    schemas: dict[str, TableSchema | None] = {}
    d = migration.dialect
    for chk in _direction(migration, direction)[2]:
        if chk.table not in schemas:
            try:
                schemas[chk.table] = read_schema(db, chk.table)
            except MigrationError:
                schemas[chk.table] = None
        schema = schemas[chk.table]
        col = schema.column(chk.column, d) if schema else None
        if not chk.present:
            if col is not None:
                failures.append(f"{chk.description}: {chk.table}.{chk.column} still exists")
            continue
        if col is None:
            failures.append(f"{chk.description}: {chk.table}.{chk.column} does not exist")
            continue
        if chk.type is not None and not same_type(col.type, chk.type, d):
            failures.append(f"{chk.description}: {chk.table}.{chk.column} is {col.type}, expected {chk.type}")
        if chk.nullable is not None and col.nullable != chk.nullable:
            failures.append(f"{chk.description}: {chk.table}.{chk.column} is "
                            f"{'nullable' if col.nullable else 'NOT NULL'}, expected {'nullable' if chk.nullable else 'NOT NULL'}")
    return failures


__all__ = [
    "AddColumn",
    "ColumnChange",
    "ColumnSpec",
    "DropColumn",
    "Guard",
    "LossyRetypeError",
    "Migration",
    "MigrationCheck",
    "MigrationError",
    "MigrationRefused",
    "RenameColumn",
    "RetypeAssessment",
    "RetypeColumn",
    "SetNullability",
    "SOURCES",
    "TableSchema",
    "TypeInfo",
    "apply_migration",
    "check_guards",
    "classify_retype",
    "generate_migration",
    "parse_type",
    "read_table_schema",
    "same_type",
    "type_info",
    "verify_migration",
]
