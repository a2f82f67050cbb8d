"""SQL building with sqlglot: identifiers are always built as sqlglot nodes, never pasted.

Queries are written once as templates in DuckDB's dialect with ``:name`` placeholders. Identifiers
and literals are substituted as sqlglot expressions (so a hostile name is quoted, never executed)
and the result is transpiled to the dialect of the database that runs it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from decimal import Decimal
from functools import lru_cache

import sqlglot
from sqlglot import exp
from dw_dagster.core.table_names import sibling_table, split_table, table_parts  # noqa: F401 - the last two for the callers of sql
from dw_dagster.errors import DwDagsterError


class UnsafeIdentifierError(DwDagsterError, ValueError):
    """An identifier from config or an incident payload cannot be used.

    Refused: empty names, names over 255 characters, control characters, backslashes and
    backticks. BigQuery reads backslash escapes inside backquoted names while sqlglot doubles a
    backtick, so those two characters cannot be quoted the same way on every dialect; no real
    table or column needs them.
    """


_MAX_IDENTIFIER = 255


def identifier(name: str) -> exp.Identifier:
    """Build one identifier node; sqlglot quotes it whenever it is not a plain name.

    Raises:
        UnsafeIdentifierError: ``name`` is empty, longer than 255 characters, or holds a control
            character, a backslash or a backtick.
    """
    if (not isinstance(name, str) or not name or len(name) > _MAX_IDENTIFIER
            or any(ch in "\\`" or ord(ch) < 32 or ord(ch) == 127 for ch in name)):
        raise UnsafeIdentifierError(f"not a usable SQL identifier: {name!r}")
    return exp.to_identifier(name)


def column(name: str) -> exp.Column:
    """A column reference from a bare column name (no table qualifier)."""
    return exp.Column(this=identifier(name))


def table(name: str | Sequence[str]) -> exp.Table:
    """A table reference from ``"schema.table"``, ``"catalog.schema.table"`` or a sequence of parts.

    Dots split parts; each part is quoted by sqlglot if needed. A part written in double quotes
    (``'"my-dw".main."Order Lines"'``) is that name exactly, dots and case included, and stays quoted
    (:func:`split_table`). A part that is empty (``"a..b"``) raises :class:`UnsafeIdentifierError`.
    """
    split = split_table(name) if isinstance(name, str) else [(p, False) for p in name]
    if not 1 <= len(split) <= 3:
        raise UnsafeIdentifierError(f"a table name has 1 to 3 dot-separated parts, got {name!r}")
    ids = []
    for part, quoted in split:
        ident = identifier(part)
        if quoted:
            ident.set("quoted", True)
        ids.append(ident)
    return exp.Table(**dict(zip(("this", "db", "catalog"), reversed(ids))))


def literal(value: object) -> exp.Expression:
    """A typed SQL literal for a Python value (str, int, Decimal, float, bool, date, datetime, None)."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), exp.DataType.build("TIMESTAMP"))
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), exp.DataType.build("DATE"))
    if isinstance(value, (int, float, Decimal)):
        return exp.Literal.number(str(value))
    if isinstance(value, str):
        return exp.Literal.string(value)
    raise TypeError(f"no SQL literal for {type(value).__name__}")


@lru_cache(maxsize=256)
def _parse_template(template: str) -> exp.Expression:
    return sqlglot.parse_one(template, read="duckdb")


def render(template: str, dialect: str, **values: object) -> str:
    """Fill a DuckDB-dialect template's ``:name`` placeholders and transpile it to ``dialect``.

    Args:
        template: SQL in DuckDB's dialect with ``:name`` placeholders.
        dialect: a sqlglot dialect name (``duckdb``, ``postgres``, ``snowflake``, ``bigquery``...).
        **values: sqlglot expressions (from :func:`table`, :func:`column`...) or plain Python
            values, which become literals through :func:`literal`.

    Returns:
        The SQL text for ``dialect``.
    """
    replacements = {
        k: v if isinstance(v, exp.Expression) else literal(v) for k, v in values.items()
    }
    tree = exp.replace_placeholders(_parse_template(template).copy(), **replacements)
    return tree.sql(dialect=dialect)


def values_table(alias: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> exp.Expression:
    """An inline ``(VALUES ...) AS alias(columns)`` relation built from small Python data."""
    if not rows:
        raise ValueError("values_table needs at least one row")
    return exp.values(
        [exp.tuple_(*(literal(v) for v in row)) for row in rows],
        alias=alias,
        columns=list(columns),
    )


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def check_name(name: str, what: str = "identifier") -> str:
    """Return ``name`` if it is a plain SQL name (letters, digits, ``_``; not starting with a digit; ≤ 64).

    Names from configuration (schemas, tables, columns) must pass this before they are built
    into SQL with sqlglot; anything else is refused rather than quoted.

    Raises:
        dw_dagster.UnsafeIdentifierError: ``name`` is not a plain name.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UnsafeIdentifierError(f"{what} {name!r} is not a plain name (letters, digits, _; max 64)")
    return name


def check_table_name(name: str, what: str = "table") -> str:
    """Return ``name`` if it is ``schema.table`` (or ``catalog.schema.table``) of plain names.

    Raises:
        dw_dagster.UnsafeIdentifierError: a part is not a plain name, or not 2–3 parts.
    """
    parts = name.split(".") if isinstance(name, str) else []
    if not 2 <= len(parts) <= 3:
        raise UnsafeIdentifierError(f"{what} {name!r} must be schema.table")
    for p in parts:
        check_name(p, what)
    return name
