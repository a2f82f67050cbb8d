"""The SQL statements migrations are made of, as sqlglot expressions (names quoted by :mod:`dw_dagster.databases.sql`, values as literals), and their rendering per dialect."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from sqlglot import exp
from sqlglot.errors import ErrorLevel

from dw_dagster.databases import sql
from dw_dagster.changes.migrations.types import TypeInfo

# -- errors ------------------------------------------------------------------------------------


# -- the changes -------------------------------------------------------------------------------


# -- schemas, guards, checks, the migration ----------------------------------------------------


# -- types -------------------------------------------------------------------------------------


# -- names -------------------------------------------------------------------------------------


def _change_id(change: BaseModel) -> str:
    return hashlib.sha256(change.model_dump_json().encode()).hexdigest()[:8]


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
