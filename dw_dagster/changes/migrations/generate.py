"""Generate a column migration for one dialect: forward and rollback statements, guards, checks, notes.

A schema change (add, drop, rename, retype a column, or change its nullability) is described by
a pydantic model; :func:`generate_migration` turns it into a :class:`Migration` for one dialect:
the forward statements, the rollback statements, guard queries that must find nothing before a
direction may run, checks that show a direction took effect, and notes on the dialect's limits.
Every statement is a sqlglot expression rendered with ``.sql(dialect=...)``; table and column
names go through :mod:`dw_dagster.databases.sql` (quoted when needed, refused when hostile) and values
through :func:`dw_dagster.databases.sql.literal`. Nothing from a change is pasted into SQL as text.

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.databases.catalog import ColumnSpec, TableSchema, _info_schema_columns, _same_name
from dw_dagster.databases.sql import table_parts
from dw_dagster.changes.migrations.models import (
    DIALECTS,
    SOURCES,
    AddColumn,
    DropColumn,
    Guard,
    LossyRetypeError,
    Migration,
    MigrationCheck,
    MigrationError,
    RenameColumn,
    RetypeColumn,
    SetNullability,
)
from dw_dagster.changes.migrations.statements import (
    _add_column,
    _change_id,
    _col,
    _count,
    _ctas,
    _does_not_fit,
    _drop_column,
    _drop_table,
    _is_null,
    _keys_match,
    _rename_column,
    _render,
    _set_default,
    _set_not_null,
    _set_type,
    _update_from,
    _update_set,
)
from dw_dagster.changes.migrations.types import TypeInfo, classify_retype, parse_type, same_type, type_info
from dw_dagster.dagster_private import public

# -- errors ------------------------------------------------------------------------------------


# -- the changes -------------------------------------------------------------------------------


# -- schemas, guards, checks, the migration ----------------------------------------------------


# -- types -------------------------------------------------------------------------------------


# -- names -------------------------------------------------------------------------------------


# -- statement builders ------------------------------------------------------------------------


# -- information_schema ------------------------------------------------------------------------


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
    backup = sql.sibling_table(c.table, f"__dw_backup_{_change_id(c)}")  # beside the table, quoted as it is
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
        backup = sql.sibling_table(c.table, f"__dw_backup_{cid}")
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


@public
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
        dw_dagster.databases.sql.UnsafeIdentifierError: a table or column name is hostile (for changes
            built with ``model_construct``; validated models refuse such names already).
    """
    if dialect not in DIALECTS:
        raise MigrationError(f"unsupported dialect {dialect!r}; supported: {', '.join(DIALECTS)}")
    gen = _GENERATORS.get(type(change))
    if gen is None:
        raise MigrationError(f"not a column change: {type(change).__name__}")
    sql.table(change.table)
    sql.identifier(change.column)
    if dialect == "bigquery" and len(table_parts(change.table)) < 2:
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
