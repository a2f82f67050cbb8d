"""What a migration is: the column changes (pydantic), the generated :class:`Migration` with its guards and checks, and its errors."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dw_dagster.databases import sql
from dw_dagster.databases.catalog import CatalogError
from dw_dagster.errors import DwDagsterError
from dw_dagster.dagster_private import public

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


@public
class MigrationError(CatalogError):
    """A change cannot be turned into a migration for this dialect (the message says why and what to pass)."""


@public
class LossyRetypeError(MigrationError):
    """A retype would lose information and ``allow_lossy`` was not set.

    Attributes:
        reasons: one sentence per way the retype loses information.
    """

    def __init__(self, message: str, reasons: Sequence[str]) -> None:
        super().__init__(message)
        self.reasons = list(reasons)


@public
class MigrationRefused(DwDagsterError, RuntimeError):
    """A guard query found rows that make a direction unsafe; nothing was run.

    Attributes:
        guard: the :class:`Guard` that refused.
        rows: how many rows it found.
    """

    def __init__(self, guard: Guard, rows: int) -> None:
        super().__init__(guard.message.replace("{rows}", str(rows)))
        self.guard = guard
        self.rows = rows


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


@public
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


@public
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


@public
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


@public
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


@public
class SetNullability(_Change):
    """Make ``column`` nullable (``nullable=True``, a relax) or NOT NULL (``nullable=False``).

    On BigQuery, NOT NULL is REQUIRED and nullable is NULLABLE.
    """

    kind: Literal["nullability"] = "nullability"
    nullable: bool


ColumnChange = Annotated[
    Union[AddColumn, DropColumn, RenameColumn, RetypeColumn, SetNullability], Field(discriminator="kind")
]


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


@public
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
