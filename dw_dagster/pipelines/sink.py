"""The shape of a sink that parks rejected rows: its target table, dead-letter table, key and columns.

A *dead-letter sink* (a stream or batch writer that validates each row against the target's
schema and parks the rows it rejects instead of failing) is described once, by
:class:`SinkTable`; the dead-letter check, the REQUIRED-NULL diagnosis, the replay step and its
verification checks all read this one description.

The dead-letter table has the columns ``(<key>, payload, error_reason, failed_at,
source_position, source_ts, op)``: the rejected row as JSON, the reason (a NULL REQUIRED column
reads :data:`MISSING_REQUIRED`, several reasons are joined with ``"; "``), when it was parked
(naive UTC), where in the source stream it came from (positions of one source sort in stream
order), the source commit time and the change kind (``insert`` / ``update``; deletes are never
parked). Kafka Connect's dead-letter queues and BigQuery's Storage Write API rejections carry the
same facts (record, error, offset, time) under other names; a view renaming them fits this shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from sqlglot import exp

from dw_dagster.databases.sql import check_name, check_table_name
from dw_dagster.dagster_private import public

#: reason text for a NULL or absent REQUIRED column
MISSING_REQUIRED = "{column}: missing required field"
#: the dead-letter table's columns besides the key
DEAD_LETTER_COLUMNS = ("payload", "error_reason", "failed_at", "source_position", "source_ts", "op")
_OP = "dw_op"


@public
@dataclass(frozen=True)
class Column:
    """A target column.

    Attributes:
        name: a plain name.
        type: its SQL type in DuckDB's dialect: ``BIGINT``, ``INTEGER``, ``DECIMAL(p,s)``,
            ``DOUBLE``, ``BOOLEAN``, ``DATE``, ``TIMESTAMP`` (naive UTC) or ``VARCHAR``.
        required: REQUIRED (``NOT NULL``): a row with NULL here is parked.
    """

    name: str
    type: str
    required: bool = True

    def __post_init__(self) -> None:
        check_name(self.name, "column")
        _kind(self.type)

    @property
    def kind(self) -> tuple[str, int | None, int | None]:
        """``(kind, precision, scale)`` of this column's type (:meth:`type_kind`)."""
        return _kind(self.type)

    @staticmethod
    def type_kind(type_text: str) -> tuple[str, int | None, int | None]:
        """What a sink validates a value against: ``(kind, precision, scale)`` of a SQL type.

        Args:
            type_text: a type in DuckDB's dialect, e.g. ``DECIMAL(18,2)``.

        Returns:
            ``kind`` is one of ``int``, ``decimal``, ``float``, ``bool``, ``date``, ``timestamp``,
            ``str``; precision and scale are set for ``decimal`` only (``DECIMAL`` alone is (18, 3)).

        Raises:
            ValueError: the type is not one a sink can validate.
        """
        return _kind(type_text)


@lru_cache(maxsize=64)
def _kind(type_text: str) -> tuple[str, int | None, int | None]:
    """(kind, precision, scale) of a supported type; ValueError otherwise."""
    try:
        parsed = exp.DataType.build(type_text, dialect="duckdb")
    except Exception as e:
        raise ValueError(f"unsupported column type {type_text!r}") from e
    t = parsed.this
    T = exp.DataType.Type
    if t in (T.BIGINT, T.INT, T.SMALLINT, T.TINYINT):
        return "int", None, None
    if t == T.DECIMAL:
        params = [int(p.name) for p in parsed.expressions]
        if not params:
            return "decimal", 18, 3  # DuckDB's DECIMAL
        return "decimal", params[0], params[1] if len(params) > 1 else 0
    if t in (T.DOUBLE, T.FLOAT):
        return "float", None, None
    if t == T.BOOLEAN:
        return "bool", None, None
    if t == T.DATE:
        return "date", None, None
    if t in (T.TIMESTAMP, T.TIMESTAMPNTZ, T.DATETIME):
        return "timestamp", None, None
    if t in (T.VARCHAR, T.TEXT, T.CHAR, T.NVARCHAR, T.NCHAR):
        return "str", None, None
    raise ValueError(f"unsupported column type {type_text!r}")


@public
@dataclass(frozen=True)
class SinkTable:
    """Where the sink writes, and the target's schema.

    Attributes:
        table: the target, ``schema.table`` (plain names).
        dead_letter_table: where rejected rows are parked: ``(<key>, payload, error_reason,
            failed_at, source_position, source_ts, op)``.
        key: the merge key (a column of ``columns``; REQUIRED).
        columns: the target's columns, in order.
        state_table: ``(target_table, position, updated_at)``, one row per target: the sink's
            cursor; None = the position is only returned.

    Raises:
        dw_dagster.databases.sql.UnsafeIdentifierError: a name is not a plain name.
        ValueError: the key is not a column, a type is unsupported, or names repeat.
    """

    table: str
    dead_letter_table: str
    key: str
    columns: tuple[Column, ...]
    state_table: str | None = None

    #: a sink's staging column for the change kind (``upsert``/``delete``): no target column may carry the name
    OP_COLUMN: ClassVar[str] = _OP
    #: the reason a parked row gives for a NULL or absent REQUIRED column (``.format(column=name)``)
    MISSING_REQUIRED: ClassVar[str] = MISSING_REQUIRED

    def __post_init__(self) -> None:
        check_table_name(self.table, "target table")
        check_table_name(self.dead_letter_table, "dead-letter table")
        if self.state_table is not None:
            check_table_name(self.state_table, "state table")
        check_name(self.key, "key column")
        names = [c.name.lower() for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError("column names repeat")
        if self.key.lower() not in names:
            raise ValueError(f"key {self.key!r} is not a column")
        reserved = {_OP, "payload", "error_reason", "failed_at", "source_position", "source_ts", "op"}
        if reserved & set(names) - {self.key.lower()}:
            raise ValueError(f"column names {sorted(reserved & set(names))} are used by the sink")

    @property
    def key_column(self) -> Column:
        return next(c for c in self.columns if c.name == self.key)

    @property
    def required(self) -> list[str]:
        """Names of the REQUIRED columns (the key always is)."""
        return [c.name for c in self.columns if c.required or c.name == self.key]

    def with_nullable(self, *names: str) -> SinkTable:
        """This schema with ``names`` relaxed to NULLABLE (what the target looks like after the fix).

        Raises:
            ValueError: a name is not a column, or is the key.
        """
        known = {c.name for c in self.columns}
        for n in names:
            if n not in known or n == self.key:
                raise ValueError(f"{n!r} is not a non-key column")
        return dataclasses.replace(self, columns=tuple(
            dataclasses.replace(c, required=False) if c.name in names else c for c in self.columns))



def sink_table_from_catalog(db, table: str, dead_letter_table: str, key: str, *, state_table: str | None = None) -> SinkTable:
    """The :class:`SinkTable` of ``table`` as the database's catalog has it now (types in DuckDB's
    dialect, ``required`` from the columns' nullability; the key is always REQUIRED).

    Args:
        db: a :class:`~dw_dagster.databases.Database` holding ``table``.
        table, dead_letter_table: ``schema.table`` of the target and of its dead-letter table.
        key: the merge key column.

    Raises:
        dw_dagster.databases.catalog.CatalogError: the table does not exist.
        ValueError: the key is not a column, or a column's type is not one a sink can validate.
    """
    from dw_dagster.databases.catalog import read_table_schema

    schema = read_table_schema(db, table)
    cols = []
    for col in schema.columns:
        try:
            type_text = exp.DataType.build(col.type, dialect=db.dialect).sql("duckdb")
        except Exception as e:  # noqa: BLE001 - named below
            raise ValueError(f"{table}.{col.name}: type {col.type!r} cannot be read") from e
        cols.append(Column(col.name, type_text, required=not col.nullable or col.name.lower() == key.lower()))
    return SinkTable(table=table, dead_letter_table=dead_letter_table, key=key, columns=tuple(cols), state_table=state_table)


__all__ = ["Column", "DEAD_LETTER_COLUMNS", "MISSING_REQUIRED", "SinkTable", "sink_table_from_catalog"]
