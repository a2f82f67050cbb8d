"""The compare rules of the row diff, and the shape of its result.

Typed comparison (in the database, per column):

- integers and decimals exactly (never cast to floating point);
- floating point on either side within ``abs_tolerance + rel_tolerance × max(|a|, |b|)``
  (so ``0.1+0.2`` equals ``0.30`` and ``-0.0`` equals ``0.00``);
- timestamps truncated to ``timestamp_precision`` (``"millisecond"``, ...) when given;
- ``CHAR`` against ``VARCHAR`` with trailing blanks trimmed;
- keys compared case-insensitively when asked, with keys that collide under that rule reported.
"""

import hashlib
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, Field

from dw_dagster.checks.utc import is_aware
from dw_dagster.databases import DatabaseError, sql
from dw_dagster.databases.catalog import ColumnTypes

FLOAT_TYPES = ("FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8", "FLOAT64")


SINGLE_FLOAT_TYPES = ("REAL", "FLOAT4")


CHAR_TYPES = ("CHAR", "BPCHAR", "CHARACTER")


TEXT_TYPES = ("VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR", "CHARACTER", "NVARCHAR", "NCHAR", "CHARACTER VARYING")


NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT", "INT2", "INT4", "INT8", "INT64",
                 "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "DECIMAL", "NUMERIC", "NUMBER", "BIGNUMERIC")


# A float difference this large means an infinity or NaN was involved (|a - b| is never finite there).
_DOUBLE_MAX = "1.7976931348623157e308"


class RowDiffEntry(BaseModel):
    key: list[Any]
    status: str = Field(description="missing (source only), extra (target only), changed, duplicate")
    columns: list[str] = Field(default_factory=list, description="changed columns")
    source_rows: int
    target_rows: int


class RowDiffResult(BaseModel):
    """Counts of each kind of difference (keys), per-column change counts, and a key-ordered sample."""

    missing: int = 0
    extra: int = 0
    changed: int = 0
    duplicated_source: int = 0
    duplicated_target: int = 0
    changed_columns: dict[str, int] = Field(default_factory=dict)
    sample: list[RowDiffEntry] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    queries: list[str] = Field(default_factory=list)
    buckets_compared: int | None = None
    buckets_downloaded: int | None = None
    rows_downloaded: int | None = None

    @property
    def identical(self) -> bool:
        return not (self.missing or self.extra or self.changed or self.duplicated_source or self.duplicated_target)


def _is(kind: Sequence[str], ty: str | None) -> bool:
    if not ty or ("VARYING" in ty and "CHARACTER VARYING" not in kind):  # CHARACTER VARYING is VARCHAR, not CHAR
        return False
    return any(ty == k or ty.startswith(k + "(") or ty.startswith(k + " ") for k in kind)


def _scale(ty: str | None) -> int:
    """The scale of ``DECIMAL(p, s)`` / ``NUMERIC(p, s)`` / ``NUMBER(p, s)``; 0 for integers."""
    if ty and "," in ty and ty.endswith(")"):
        try:
            return int(ty.rsplit(",", 1)[1].rstrip(") "))
        except ValueError:
            return 0
    return 0


def _key_expr(ref: str, c: str, own: dict[str, str], other: dict[str, str], case_insensitive: bool) -> str:
    """A key column as compared: CHAR padding trimmed, text lower-cased when keys are
    case-insensitive (only text columns), and a numeric key whose type differs from the other
    side's (INTEGER against DECIMAL(10,2)) cast to one DECIMAL(38, s) so values, not spellings, match."""
    ty, ty_o = own.get(c.lower()), other.get(c.lower())
    e = ref
    if _text_vs_other(ty, ty_o):  # an INTEGER key against a VARCHAR one: matched as text
        e = f"CAST({e} AS VARCHAR)"
        ty = "VARCHAR"
    if _is(CHAR_TYPES, ty):
        e = f"RTRIM({e})"
    if case_insensitive and (ty is None or _is(TEXT_TYPES, ty)):
        e = f"LOWER({e})"
    if _is(NUMERIC_TYPES, ty) and _is(NUMERIC_TYPES, ty_o) and ty != ty_o:
        e = f"CAST({e} AS DECIMAL(38, {max(_scale(ty), _scale(ty_o))}))"
    if is_aware(ty) and ty_o and ty_o.startswith("TIMESTAMP") and not is_aware(ty_o):
        e = f"CAST({e} AT TIME ZONE 'UTC' AS TIMESTAMP)"  # an aware key against a naive (UTC by contract) one
    return e


def _text_vs_other(ty: str | None, ty_o: str | None) -> bool:
    """One side text and the other not: compared as text, since casting the text to the other
    type would round ('1.504' = DECIMAL 1.50) or fail ('abc' as INTEGER)."""
    return bool(ty and ty_o) and _is(TEXT_TYPES, ty) != _is(TEXT_TYPES, ty_o)


def _value_expr(alias: str, col: str, ty_self: str | None, ty_other: str | None, timestamp_precision: str | None) -> str:
    ref = f"{alias}.{sql.identifier(col).sql('duckdb')}"
    if _text_vs_other(ty_self, ty_other):
        return f"CAST({ref} AS VARCHAR)"
    if _is(CHAR_TYPES, ty_self) or _is(CHAR_TYPES, ty_other):
        return f"RTRIM({ref})"
    if timestamp_precision and ty_self and ty_self.startswith("TIMESTAMP"):
        if ty_self == "TIMESTAMP_NS":  # DuckDB rounds nanoseconds to microseconds on the cast DATE_TRUNC makes: floor first
            ref = f"MAKE_TIMESTAMP((EPOCH_NS({ref}) - ((EPOCH_NS({ref}) % 1000) + 1000) % 1000) // 1000)"
        return f"DATE_TRUNC('{timestamp_precision}', {ref})"
    return ref


def _differs(col: str, ts: str | None, tt: str | None, rel_tol: float, abs_tol: float, timestamp_precision: str | None) -> str:
    a = _value_expr("s", col, ts, tt, timestamp_precision)
    b = _value_expr("t", col, tt, ts, timestamp_precision)
    if (_is(FLOAT_TYPES, ts) or _is(FLOAT_TYPES, tt)) and not _text_vs_other(ts, tt):
        if _is(SINGLE_FLOAT_TYPES, ts) or _is(SINGLE_FLOAT_TYPES, tt):
            rel_tol = max(rel_tol, 2.0 ** -23)  # a 4-byte float holds 24 significant bits
        fa, fb = f"CAST({a} AS DOUBLE)", f"CAST({b} AS DOUBLE)"
        # Equal values (+Inf = +Inf; NaN = NaN on DuckDB, Snowflake and PostgreSQL) never differ; otherwise a
        # difference that is not finite (an infinity or NaN on one side) always does, and a finite one
        # is judged against the tolerance.
        return (f"(CASE WHEN {a} IS NULL OR {b} IS NULL THEN {a} IS DISTINCT FROM {b} WHEN {fa} = {fb} THEN FALSE "
                f"ELSE NOT (ABS({fa} - {fb}) <= {_DOUBLE_MAX} "
                f"AND ABS({fa} - {fb}) <= {abs_tol!r} + {rel_tol!r} * GREATEST(ABS({fa}), ABS({fb}))) END)")
    return f"({a} IS DISTINCT FROM {b})"


def _trimmed(types: ColumnTypes, trim: bool) -> ColumnTypes:
    """With ``trim``, text columns are treated as ``CHAR`` (compared with trailing blanks trimmed)."""
    return ColumnTypes({c: "CHAR" if trim and _is(TEXT_TYPES, ty) else ty for c, ty in types.items()},
                       getattr(types, "names", None))


TIMESTAMP_PRECISIONS = ("microsecond", "millisecond", "second", "minute", "hour", "day")


def _options(rel_tolerance: float, abs_tolerance: float, timestamp_precision: str | None,
             case_insensitive_keys: bool) -> "_Options":
    """The typed-comparison settings, checked (they end up in SQL).

    Raises:
        ValueError: a tolerance that is negative or not finite, or an unknown ``timestamp_precision``.
    """
    for name, v in (("rel_tolerance", rel_tolerance), ("abs_tolerance", abs_tolerance)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
    if timestamp_precision is not None and timestamp_precision not in TIMESTAMP_PRECISIONS:
        raise ValueError(f"timestamp_precision must be one of {', '.join(TIMESTAMP_PRECISIONS)} or None, got {timestamp_precision!r}")
    return _Options(float(rel_tolerance), float(abs_tolerance), timestamp_precision, bool(case_insensitive_keys))


class _Options(NamedTuple):
    rel_tolerance: float
    abs_tolerance: float
    timestamp_precision: str | None
    case_insensitive_keys: bool


def _compare_columns(source_table: str, target_table: str, key_columns: Sequence[str], compare_columns: Sequence[str] | None,
                     st: ColumnTypes, tt: ColumnTypes) -> tuple[list[str], list[str]]:
    """The columns to compare (each in its own spelling) and warnings about columns left out."""
    if isinstance(key_columns, str) or isinstance(compare_columns, str):
        raise ValueError("key_columns and compare_columns are lists of column names, not a string")
    keys_l = [k.lower() for k in key_columns]
    if len(set(keys_l)) != len(keys_l):
        raise ValueError(f"key_columns names a column twice: {list(key_columns)}")
    for k in keys_l:
        if k not in st or k not in tt:
            raise DatabaseError(f"key column {k} is not in both {source_table} and {target_table}")
    if compare_columns is None:
        names = getattr(st, "names", {})
        only = [f"column {names.get(c, c)} is only in {source_table}; not compared" for c in st if c not in tt and c not in keys_l]
        only += [f"column {getattr(tt, 'names', {}).get(c, c)} is only in {target_table}; not compared"
                 for c in tt if c not in st and c not in keys_l]
        return [names.get(c, c) for c in st if c in tt and c not in keys_l], only
    for c in compare_columns:
        if c.lower() not in st or c.lower() not in tt:
            raise DatabaseError(f"compared column {c} is not in both {source_table} and {target_table}")
    return list(compare_columns), []


def key_digest(values: Sequence[Any]) -> str:
    """A stable id for a key (sha256 of its text), for logs and receipts."""
    return hashlib.sha256("|".join("N" if v is None else f"V{len(str(v))}:{v}" for v in values).encode()).hexdigest()[:16]
