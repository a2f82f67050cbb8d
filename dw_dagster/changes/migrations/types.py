"""Column types per dialect: parse them, describe them, and classify a retype as widening, narrowing or lossy.

Facts per dialect come from the vendors' type documentation (:data:`~dw_dagster.changes.migrations.SOURCES`)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from dw_dagster.changes.migrations.models import MigrationError
from dw_dagster.dagster_private import public

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


@public
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
