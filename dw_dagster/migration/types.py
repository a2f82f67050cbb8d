"""Types across two engines: each catalog type read as a family with its size, and what a copy loses.

Schema parity (:mod:`dw_dagster.migration.parity`) maps the source's type and the target's onto
one vocabulary — integer (bits), decimal (precision, scale), float (mantissa bits), text (length,
fixed or varying), timestamp (fraction digits, with or without a zone), date, time, boolean,
bytes, uuid, json — and names every difference: a narrowing that can overflow or round is a
failure; a change whose values compare equal under the row diff's rules (``CHAR`` padding,
an aware timestamp read as UTC, a wider type) is a note.

Engine spellings covered: DuckDB, PostgreSQL, Snowflake, BigQuery, MySQL and Informix
(``DATETIME YEAR TO FRACTION(5)``, ``SMALLFLOAT``, ``SERIAL8``, ``LVARCHAR``, ``MONEY``). On DuckDB
``FLOAT`` is four bytes; on PostgreSQL, Informix and MySQL (``DOUBLE``) eight.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_INT_BITS = {"TINYINT": 8, "INT1": 8, "SMALLINT": 16, "INT2": 16, "INTEGER": 32, "INT": 32, "INT4": 32, "SERIAL": 32,
             "MEDIUMINT": 24, "BIGINT": 64, "INT8": 64, "INT64": 64, "SERIAL8": 64, "BIGSERIAL": 64, "HUGEINT": 128,
             "UTINYINT": 9, "USMALLINT": 17, "UINTEGER": 33, "UBIGINT": 65}
_DECIMAL = ("DECIMAL", "NUMERIC", "NUMBER", "MONEY", "BIGNUMERIC", "DEC")
_TEXT_VAR = ("VARCHAR", "CHARACTER VARYING", "NVARCHAR", "LVARCHAR", "TEXT", "STRING", "VARCHAR2")
_TEXT_FIXED = ("CHAR", "CHARACTER", "BPCHAR", "NCHAR")
_FRACTION = {"YEAR TO SECOND": 0, "YEAR TO FRACTION": 3}


@dataclass(frozen=True)
class Family:
    """One type as a family and its size. ``size`` is bits (integer, float), digits (decimal
    precision, timestamp fraction), characters (text; None: unbounded)."""

    family: str
    size: int | None = None
    scale: int = 0
    fixed: bool = False
    aware: bool = False
    spelled: str = ""

    def words(self) -> str:
        return self.spelled


def _params(t: str) -> list[int]:
    m = re.search(r"\(([^)]*)\)", t)
    if not m:
        return []
    out = []
    for p in m.group(1).split(","):
        p = p.strip()
        if p.isdigit():
            out.append(int(p))
    return out


def family(type_text: str, dialect: str) -> Family:  # noqa: C901 - one branch per family
    """The family of one catalog type as ``dialect`` spells it."""
    t = " ".join(str(type_text).upper().split())
    head = re.split(r"[ (]", t, 1)[0]
    p = _params(t)
    base = dialect.split(",")[0].strip()
    if head in _INT_BITS:
        return Family("integer", _INT_BITS[head], spelled=t)
    if head in _DECIMAL:
        if p:
            return Family("decimal", p[0], p[1] if len(p) > 1 else 0, spelled=t)
        default = {"duckdb": (18, 3), "snowflake": (38, 0), "bigquery": (38, 9)}.get(base)
        if head == "MONEY":
            default = (16, 2)
        if default is None:  # unbounded (PostgreSQL NUMERIC) or floating (Informix DECIMAL): nothing is proven held
            return Family("decimal", 1000, 1000, spelled=t)
        return Family("decimal", default[0], default[1], spelled=t)
    if head in ("REAL", "FLOAT4", "SMALLFLOAT") or (head == "FLOAT" and base == "duckdb"):
        return Family("float", 24, spelled=t)
    if head in ("DOUBLE", "FLOAT8", "FLOAT", "FLOAT64"):
        return Family("float", 53, spelled=t)
    if head == "DATETIME" and "YEAR" in t:  # Informix
        if "TO DAY" in t:
            return Family("date", spelled=t)
        digits = 0 if t.endswith("SECOND") else (p[0] if p else 3) if "FRACTION" in t else 0
        return Family("timestamp", digits, spelled=t)
    if head in ("TIMESTAMP", "DATETIME", "TIMESTAMPTZ", "TIMESTAMP_NTZ", "TIMESTAMP_LTZ", "TIMESTAMP_TZ",
                "TIMESTAMP_NS", "TIMESTAMP_MS", "TIMESTAMP_S", "TIMESTAMP_US"):
        aware = "WITH TIME ZONE" in t or head in ("TIMESTAMPTZ", "TIMESTAMP_LTZ", "TIMESTAMP_TZ") or (
            base == "bigquery" and head == "TIMESTAMP")
        digits = {"TIMESTAMP_NS": 9, "TIMESTAMP_MS": 3, "TIMESTAMP_S": 0}.get(head, p[0] if p else
                                                                             (9 if base == "snowflake" else 6))
        if base == "mysql" and head == "DATETIME" and not p:
            digits = 0
        return Family("timestamp", digits, aware=aware, spelled=t)
    if head == "DATE":
        return Family("date", spelled=t)
    if head in ("TIME", "TIMETZ"):
        return Family("time", spelled=t)
    if head in ("BOOLEAN", "BOOL"):
        return Family("boolean", spelled=t)
    if t.startswith("CHARACTER VARYING") or head in _TEXT_VAR:
        return Family("text", p[0] if p else None, spelled=t)
    if head in _TEXT_FIXED:
        return Family("text", p[0] if p else 1, fixed=True, spelled=t)
    if head in ("BLOB", "BYTEA", "BYTES", "BYTE", "VARBINARY", "BINARY"):
        return Family("bytes", spelled=t)
    if head == "UUID":
        return Family("uuid", spelled=t)
    if head in ("JSON", "JSONB", "VARIANT"):
        return Family("json", spelled=t)
    if head == "INTERVAL":
        return Family("interval", spelled=t)
    return Family("other:" + head.lower(), spelled=t)


@dataclass(frozen=True)
class Mapping:
    """How one column's type maps from the source to the target: ``ok`` false loses values."""

    ok: bool
    words: str


def _digits_of_int(bits: int) -> int:
    return len(str(2 ** (bits - 1)))


def compare(src: Family, tgt: Family, *, timestamp_precision: str | None = None,
            trim_trailing_blanks: bool = False) -> Mapping | None:
    """What a copy from ``src`` to ``tgt`` does to the values: None when nothing changes."""
    s, t = src, tgt
    same = s.spelled == t.spelled
    if s.family == t.family == "integer":
        if t.size < s.size:
            return Mapping(False, f"{s.spelled} → {t.spelled}: integer narrowed from {s.size} to {t.size} bits (values "
                                  "outside the smaller range overflow)")
        return None if t.size == s.size or same else Mapping(True, f"{s.spelled} → {t.spelled}: widened")
    if s.family == "integer" and t.family == "decimal":
        if t.size - t.scale < _digits_of_int(s.size):
            return Mapping(False, f"{s.spelled} → {t.spelled}: {t.size - t.scale} integer digits cannot hold every "
                                  f"{s.size}-bit integer")
        return Mapping(True, f"{s.spelled} → {t.spelled}: integer held exactly as a decimal")
    if s.family == t.family == "decimal":
        if t.scale < s.scale:
            return Mapping(False, f"{s.spelled} → {t.spelled}: scale reduced from {s.scale} to {t.scale} (values are "
                                  "rounded: sums differ)")
        if t.size - t.scale < s.size - s.scale:
            return Mapping(False, f"{s.spelled} → {t.spelled}: precision narrowed ({s.size - s.scale} integer digits to "
                                  f"{t.size - t.scale}: large values overflow)")
        return None if (s.size, s.scale) == (t.size, t.scale) else Mapping(True, f"{s.spelled} → {t.spelled}: widened")
    if s.family == "decimal" and t.family == "float":
        return Mapping(False, f"{s.spelled} → {t.spelled}: exact decimals become floating point (sums are no longer exact)")
    if s.family == "float" and t.family == "decimal":
        return Mapping(False, f"{s.spelled} → {t.spelled}: floating point rounded to {t.scale} decimal places")
    if s.family == "integer" and t.family == "float":
        if s.size > t.size:
            return Mapping(False, f"{s.spelled} → {t.spelled}: {s.size}-bit integers lose digits in a {t.size}-bit mantissa")
        return Mapping(True, f"{s.spelled} → {t.spelled}: integers held exactly as floating point")
    if s.family == t.family == "float":
        if t.size < s.size:
            return Mapping(False, f"{s.spelled} → {t.spelled}: double precision narrowed to single (about 7 digits)")
        return None if t.size == s.size else Mapping(True, f"{s.spelled} → {t.spelled}: widened")
    if s.family == t.family == "text":
        if t.size is not None and (s.size is None or t.size < s.size):
            return Mapping(False, f"{s.spelled} → {t.spelled}: text narrowed to {t.size} characters (longer values are "
                                  "cut or refused)")
        if s.fixed != t.fixed:
            how = "compared with trailing blanks trimmed" if trim_trailing_blanks or s.fixed or t.fixed else ""
            return Mapping(True, f"{s.spelled} → {t.spelled}: CHAR pads with blanks, VARCHAR keeps them as loaded; {how}")
        return None if same or (s.size == t.size) else Mapping(True, f"{s.spelled} → {t.spelled}: widened")
    if s.family == t.family == "timestamp":
        notes, ok = [], True
        if s.aware and not t.aware:
            notes.append("the time zone is dropped: values compared as UTC wall clocks")
        elif t.aware and not s.aware:
            notes.append("naive values gain a zone: the source is read as UTC")
        if t.size < s.size:
            coarse = {"second": 0, "millisecond": 3, "microsecond": 6}.get(timestamp_precision or "", None)
            if coarse is None or coarse > t.size:
                ok = False
                notes.append(f"fraction digits reduced from {s.size} to {t.size} (set timestamp_precision to compare at "
                             "the coarser precision)")
            else:
                notes.append(f"fraction digits reduced from {s.size} to {t.size}; compared at the {timestamp_precision}")
        elif t.size > s.size:
            notes.append(f"fraction digits widened from {s.size} to {t.size}")
        if not notes:
            return None
        return Mapping(ok, f"{s.spelled} → {t.spelled}: " + "; ".join(notes))
    if s.family == "date" and t.family == "timestamp":
        return Mapping(True, f"{s.spelled} → {t.spelled}: dates held as midnight")
    if s.family == "timestamp" and t.family == "date":
        return Mapping(False, f"{s.spelled} → {t.spelled}: the time of day is dropped")
    if s.family == t.family:
        return None
    if {s.family, t.family} == {"boolean", "integer"}:
        return Mapping(True, f"{s.spelled} → {t.spelled}: booleans held as 0/1")
    return Mapping(False, f"{s.spelled} → {t.spelled}: {s.family} becomes {t.family}")


__all__ = ["Family", "Mapping", "compare", "family"]
