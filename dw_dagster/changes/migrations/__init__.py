"""Column migrations with rollback SQL for DuckDB, Snowflake and BigQuery.

A schema change (add, drop, rename, retype a column, or change its nullability) is a pydantic
model (:mod:`.models`); :func:`generate_migration` (:mod:`.generate`) turns it into a
:class:`Migration` for one dialect: forward statements, rollback statements, guard queries that must
find nothing before a direction may run, checks that show a direction took effect, and notes on the
dialect's limits. Statements are sqlglot expressions (:mod:`.statements`); types and the
classification of a retype are in :mod:`.types`; :func:`apply_migration` and
:func:`verify_migration` (:mod:`.apply`) run and check one direction; a table's columns come from
the catalog reader :func:`~dw_dagster.databases.catalog.read_table_schema`.
"""

from dw_dagster.databases.catalog import CatalogError, ColumnSpec, TableSchema, read_table_schema
from dw_dagster.changes.migrations.apply import apply_migration, check_guards, verify_migration
from dw_dagster.changes.migrations.generate import generate_migration
from dw_dagster.changes.migrations.models import (
    DIALECTS,
    SOURCES,
    AddColumn,
    ColumnChange,
    DropColumn,
    Guard,
    LossyRetypeError,
    Migration,
    MigrationCheck,
    MigrationError,
    MigrationRefused,
    RenameColumn,
    RetypeColumn,
    SetNullability,
)
from dw_dagster.changes.migrations.types import (
    RetypeAssessment,
    TypeInfo,
    classify_retype,
    parse_type,
    same_type,
    type_info,
)

__all__ = [
    "AddColumn", "CatalogError", "ColumnChange", "ColumnSpec", "DIALECTS", "DropColumn", "Guard", "LossyRetypeError",
    "Migration", "MigrationCheck", "MigrationError", "MigrationRefused", "RenameColumn", "RetypeAssessment",
    "RetypeColumn", "SOURCES", "SetNullability", "TableSchema", "TypeInfo", "apply_migration", "check_guards",
    "classify_retype", "generate_migration", "parse_type", "read_table_schema", "same_type", "type_info",
    "verify_migration",
]
