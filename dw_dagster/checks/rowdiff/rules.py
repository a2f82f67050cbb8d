"""The compare rules of the row diff, and the shape of its result.

Typed comparison (in the database, per column):

- integers and decimals exactly (never cast to floating point);
- floating point on either side within ``abs_tolerance + rel_tolerance × max(|a|, |b|)``
  (so ``0.1+0.2`` equals ``0.30`` and ``-0.0`` equals ``0.00``);
- every time-zone-aware timestamp (key or not) as its UTC wall clock, so a ``TIMESTAMPTZ``
  against a naive UTC-by-contract ``TIMESTAMP`` gives the same answer in every session time zone;
- timestamps at ``timestamp_precision`` (``"millisecond"``, ...) when given, under
  ``timestamp_rounding``: ``"tolerate"`` (default: equal when their truncations differ by at most
  one unit, so a loader that rounded and one that truncated both match), ``"floor"`` (truncations
  equal) or ``"round"`` (values rounded half up to the unit equal);
- ``CHAR`` against ``VARCHAR`` with trailing blanks trimmed: columns the catalog types ``CHAR``,
  and those declared so per side (``source_char_columns`` / ``target_char_columns``) where the
  engine has no padded type (DuckDB);
- keys compared case-insensitively when asked; two distinct keys of one side that become equal
  under a normalization (case folding, ``CHAR`` trimming) are a **key collision**, reported with
  both spellings, never paired with a row of the other side nor counted as a duplicate.

Columns are named as configured and resolved against each engine's own catalog
(:func:`~dw_dagster.databases.catalog.resolve_column`), then quoted as the catalog spells them;
each table is read through a projection that renames its columns to internal aliases
(``dwkey0``, ``dwcol0``...), so two columns differing only in case stay two columns.
"""

import hashlib
import math
import re
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


JSON_TYPES = ("JSON", "JSONB")


UUID_TYPES = ("UUID", "UNIQUEIDENTIFIER")


# Types some engines cannot MIN() (PostgreSQL: json, jsonb, uuid before 16, boolean, bytea): the
# grouped diff takes the smallest text form instead (equal values have equal text on one engine).
UNORDERED_TYPES = ("JSON", "JSONB", "UUID", "BOOLEAN", "BOOL", "BYTEA", "XML", "POINT", "MONEY")


TEMPORAL_TYPES = ("DATE", "TIMESTAMP", "TIMESTAMPTZ", "DATETIME", "TIMESTAMP_NS", "TIMESTAMP_MS", "TIMESTAMP_S",
                  "TIMESTAMP_LTZ", "TIMESTAMP_NTZ", "TIMESTAMP_TZ", "TIME", "TIMETZ")


BINARY_TYPES = ("BLOB", "BYTEA", "BINARY", "VARBINARY", "BYTES", "LONGBLOB", "MEDIUMBLOB", "TINYBLOB")


# A float difference this large means an infinity or NaN was involved (|a - b| is never finite there).
_DOUBLE_MAX = "1.7976931348623157e308"


class RowDiffEntry(BaseModel):
    key: list[Any]
    status: str = Field(description="missing (source only), extra (target only), changed, duplicate, collision")
    columns: list[str] = Field(default_factory=list, description="changed columns")
    source_rows: int
    target_rows: int


class KeyCollision(BaseModel):
    """Two or more distinct keys of one side that are equal once normalized (case folding, trimming)."""

    side: str = Field(description="source or target")
    key: list[Any] = Field(description="the normalized key")
    spellings: list[Any] = Field(description="the first and the last original spelling (key columns joined by '|')")
    count: int = Field(description="distinct original spellings")


class RowDiffResult(BaseModel):
    """Counts of each kind of difference (keys), per-column change counts, and a key-ordered sample."""

    missing: int = 0
    extra: int = 0
    changed: int = 0
    duplicated_source: int = 0
    duplicated_target: int = 0
    collided_source: int = Field(default=0, description="normalized keys held by two or more distinct source keys")
    collided_target: int = 0
    collisions: list[KeyCollision] = Field(default_factory=list, description="a sample, with the spellings")
    timestamp_rule: str | None = Field(default=None, description="how timestamps were compared, when a precision was given")
    changed_columns: dict[str, int] = Field(default_factory=dict)
    sample: list[RowDiffEntry] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    queries: list[str] = Field(default_factory=list)
    unstable: list[str] = Field(default_factory=list, description="across databases: a table that changed while read")
    buckets_compared: int | None = None
    buckets_downloaded: int | None = None
    rows_downloaded: int | None = None
    download_passes: int | None = Field(default=None, description="across databases: passes the download ran in")
    bytes_fetched: int | None = Field(default=None, description="across databases: Arrow buffer bytes of the bucket "
                                      "checksums and rows fetched from the two databases")
    bytes_sent: int | None = Field(default=None, description="across databases: UTF-8 bytes of the SQL sent to them")
    transfer: str | None = Field(default=None, description="across databases: the path that ran: stream (every row "
                                 "read once, compared locally), bisect (bucket hashes, then the differing buckets' rows) "
                                 "or download (no row hash in SQL on a side: every row downloaded)")
    transfer_probe_mbps: float | None = Field(default=None, description="across databases, transfer auto: the measured "
                                              "MB/s of the source's stream that chose the path")

    @property
    def identical(self) -> bool:
        return not (self.missing or self.extra or self.changed or self.duplicated_source or self.duplicated_target
                    or self.collided_source or self.collided_target)


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
    case-insensitive (only text columns), a numeric key whose type differs from the other
    side's (INTEGER against DECIMAL(10,2)) cast to one DECIMAL(38, s) so values, not spellings,
    match, and an aware timestamp as its UTC wall clock (whatever the session's time zone)."""
    ty, ty_o = own.get(c.lower()), other.get(c.lower())
    e = ref
    if _text_vs_other(ty, ty_o):  # an INTEGER key against a VARCHAR one: matched as text
        e = f"CAST({_utc(e, ty)} AS VARCHAR)"
        ty = "VARCHAR"
    if _is(CHAR_TYPES, ty):
        e = f"RTRIM({e})"
    if _bool_vs_number(ty, ty_o):  # a boolean key against a number: 1 / 0, both as one DECIMAL
        return f"CAST(CAST({e} AS INTEGER) AS DECIMAL(38, {_scale(ty_o)}))"
    if _bool_vs_number(ty_o, ty):
        return f"CAST({e} AS DECIMAL(38, {_scale(ty)}))"
    if _is(TEXT_TYPES, ty) and _is(UUID_TYPES, ty_o):  # a UUID's text is case-insensitive (RFC 9562)
        e = f"LOWER({e})"
    if case_insensitive and (ty is None or _is(TEXT_TYPES, ty)):
        e = f"LOWER({e})"
    if _is(NUMERIC_TYPES, ty) and _is(NUMERIC_TYPES, ty_o) and ty != ty_o:
        e = f"CAST({e} AS DECIMAL(38, {max(_scale(ty), _scale(ty_o))}))"
    if _is(("DATE",), ty) and _is(("TIMESTAMP", "TIMESTAMPTZ", "DATETIME", "TIMESTAMP_NS", "TIMESTAMP_MS", "TIMESTAMP_S"), ty_o):
        e = f"CAST({e} AS TIMESTAMP)"  # a DATE key against a TIMESTAMP one: midnight, so both match as timestamps
    return _utc(e, ty)


def _utc(ref: str, ty: str | None) -> str:
    """An aware timestamp as its naive UTC wall clock; anything else as it is."""
    return f"CAST({ref} AT TIME ZONE 'UTC' AS TIMESTAMP)" if is_aware(ty) else ref


def _folds(c: str, own: dict[str, str], case_insensitive: bool) -> bool:
    """Whether the key column's normalization can make two distinct values equal (trim, case)."""
    ty = own.get(c.lower())
    return _is(CHAR_TYPES, ty) or (case_insensitive and (ty is None or _is(TEXT_TYPES, ty)))


BOOL_TYPES = ("BOOLEAN", "BOOL")


def _bool_vs_number(ty: str | None, ty_o: str | None) -> bool:
    """A BOOLEAN against a number (MySQL's ``TINYINT(1)``, Oracle's ``NUMBER(1)``): the boolean is
    compared as 1 / 0."""
    return _is(BOOL_TYPES, ty) and _is(NUMERIC_TYPES, ty_o)


def _family(ty: str | None) -> str | None:
    for name, kind in (("text", TEXT_TYPES), ("number", NUMERIC_TYPES + FLOAT_TYPES), ("time", TEMPORAL_TYPES),
                       ("binary", BINARY_TYPES), ("boolean", BOOL_TYPES), ("uuid", UUID_TYPES), ("json", JSON_TYPES)):
        if _is(kind, ty):
            return name
    return None


def incomparable(ty: str | None, ty_o: str | None) -> str | None:
    """Why a column typed ``ty`` on one side cannot be compared with ``ty_o`` on the other (None
    when it can): text against anything is compared as text, a boolean against a number as 1 / 0;
    other different families (a number against a time, binary against a number...) have no
    meaning the diff could pick for the user, so it refuses rather than guess or crash."""
    fa, fb = _family(ty), _family(ty_o)
    if fa is None or fb is None or fa == fb or "text" in (fa, fb) or {fa, fb} == {"boolean", "number"}:
        return None
    hint = " (an epoch number against a timestamp: convert it in a view, e.g. to_timestamp(n))" \
        if {fa, fb} == {"number", "time"} else ""
    return f"a {fa} ({ty}) against a {fb} ({ty_o}){hint}"


def _text_vs_other(ty: str | None, ty_o: str | None) -> bool:
    """One side text and the other not: compared as text, since casting the text to the other
    type would round ('1.504' = DECIMAL 1.50) or fail ('abc' as INTEGER)."""
    return bool(ty and ty_o) and _is(TEXT_TYPES, ty) != _is(TEXT_TYPES, ty_o)


# Half of each unit, to round half up by truncating ``x + half`` (microseconds cannot be rounded
# on engines that hold microseconds: they are floored).
_HALF_UNIT = {"millisecond": "500 MICROSECOND", "second": "500 MILLISECOND", "minute": "30 SECOND",
              "hour": "30 MINUTE", "day": "12 HOUR"}

TIMESTAMP_ROUNDINGS = ("tolerate", "floor", "round")


def _value_expr(alias: str, col: str, ty_self: str | None, ty_other: str | None, timestamp_precision: str | None,
                rounding: str = "floor") -> str:
    ref = f"{alias}.{sql.identifier(col).sql('duckdb')}"
    if _text_vs_other(ty_self, ty_other):
        if _is(TEXT_TYPES, ty_self) and _is(UUID_TYPES, ty_other):  # a UUID's text is case-insensitive
            return f"LOWER({ref})"
        return f"CAST({_utc(ref, ty_self)} AS VARCHAR)"
    if _is(CHAR_TYPES, ty_self) or _is(CHAR_TYPES, ty_other):
        return f"RTRIM({ref})"
    if _bool_vs_number(ty_self, ty_other):
        return f"CAST({ref} AS INTEGER)"
    ref = _utc(ref, ty_self)
    if timestamp_precision and ty_self and ty_self.startswith("TIMESTAMP"):
        if ty_self == "TIMESTAMP_NS":  # DuckDB rounds nanoseconds to microseconds on the cast DATE_TRUNC makes: floor first
            ref = f"MAKE_TIMESTAMP((EPOCH_NS({ref}) - ((EPOCH_NS({ref}) % 1000) + 1000) % 1000) // 1000)"
        if rounding == "round" and timestamp_precision in _HALF_UNIT:
            ref = f"({ref} + INTERVAL {_HALF_UNIT[timestamp_precision]})"
        return f"DATE_TRUNC('{timestamp_precision}', {ref})"
    return ref


def timestamp_rule(timestamp_precision: str | None, rounding: str) -> str | None:
    """The timestamp comparison in words, for the result (None without a precision)."""
    if not timestamp_precision:
        return None
    words = {"tolerate": f"equal when truncated to the {timestamp_precision} they differ by at most one {timestamp_precision}",
             "floor": f"equal when truncated to the {timestamp_precision} they are equal",
             "round": f"equal when rounded half up to the {timestamp_precision} they are equal"}
    return f"{timestamp_precision}, {rounding}: {words[rounding]}; aware timestamps compared in UTC"


def _differs(col: str, ts: str | None, tt: str | None, rel_tol: float, abs_tol: float, timestamp_precision: str | None,
             rounding: str = "floor") -> str:
    a = _value_expr("s", col, ts, tt, timestamp_precision, rounding)
    b = _value_expr("t", col, tt, ts, timestamp_precision, rounding)
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
    if (timestamp_precision and rounding == "tolerate" and ts and tt and ts.startswith("TIMESTAMP")
            and tt.startswith("TIMESTAMP")):
        unit = f"INTERVAL 1 {timestamp_precision.upper()}"
        return (f"(CASE WHEN {a} IS NULL OR {b} IS NULL THEN {a} IS DISTINCT FROM {b} "
                f"ELSE NOT ({a} = {b} OR {a} = {b} + {unit} OR {a} + {unit} = {b}) END)")
    return f"({a} IS DISTINCT FROM {b})"


def _trimmed(types: ColumnTypes, trim: bool, char_columns: Sequence[str] = ()) -> ColumnTypes:
    """Text columns treated as ``CHAR`` (compared with trailing blanks trimmed): every one with
    ``trim``, else those in ``char_columns`` (keys of ``types``)."""
    chars = {c.lower() for c in char_columns}
    return ColumnTypes({c: "CHAR" if (trim or c.lower() in chars) and _is(TEXT_TYPES, ty) else ty
                        for c, ty in types.items()}, getattr(types, "names", None))


TIMESTAMP_PRECISIONS = ("microsecond", "millisecond", "second", "minute", "hour", "day")


def _options(rel_tolerance: float, abs_tolerance: float, timestamp_precision: str | None,
             case_insensitive_keys: bool, timestamp_rounding: str = "tolerate") -> "_Options":
    """The typed-comparison settings, checked (they end up in SQL).

    Raises:
        ValueError: a tolerance that is negative or not finite, an unknown ``timestamp_precision``
            or ``timestamp_rounding``.
    """
    for name, v in (("rel_tolerance", rel_tolerance), ("abs_tolerance", abs_tolerance)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
    if timestamp_precision is not None and timestamp_precision not in TIMESTAMP_PRECISIONS:
        raise ValueError(f"timestamp_precision must be one of {', '.join(TIMESTAMP_PRECISIONS)} or None, got {timestamp_precision!r}")
    if timestamp_rounding not in TIMESTAMP_ROUNDINGS:
        raise ValueError(f"timestamp_rounding must be one of {', '.join(TIMESTAMP_ROUNDINGS)}, got {timestamp_rounding!r}")
    return _Options(float(rel_tolerance), float(abs_tolerance), timestamp_precision, bool(case_insensitive_keys),
                    timestamp_rounding)


class _Options(NamedTuple):
    rel_tolerance: float
    abs_tolerance: float
    timestamp_precision: str | None
    case_insensitive_keys: bool
    timestamp_rounding: str = "tolerate"


class _Plan(NamedTuple):
    """What a diff reads: per side a DuckDB-dialect relation that projects the resolved catalog
    columns under internal aliases (keys ``dwkey0``..., compared columns ``dwcol0``...), the alias
    → type maps, and the alias → configured name labels for the result."""

    keys: list[str]
    columns: list[str]
    source_rel: str
    target_rel: str
    st: ColumnTypes
    tt: ColumnTypes
    labels: dict[str, str]
    warnings: list[str]


def _names(spec: Any, side: str) -> list[str]:
    if spec is None:
        return []
    if isinstance(spec, str):
        raise ValueError(f"{side}_char_columns is a list of column names, not a string")
    return list(spec)


def _typed(columns: list[tuple[str, str]], dialect: str) -> dict[str, str]:
    """Column → type, with BigQuery's ``TIMESTAMP`` (an instant, unlike ``DATETIME``) marked aware."""
    if dialect != "bigquery":
        return dict(columns)
    return {n: "TIMESTAMP WITH TIME ZONE" if ty == "TIMESTAMP" else ty for n, ty in columns}


def _plan(source: Any, target: Any, source_table: str, target_table: str, key_columns: Sequence[str],
          compare_columns: Sequence[str] | None, trim: bool = False, source_char_columns: Sequence[str] | None = None,
          target_char_columns: Sequence[str] | None = None) -> _Plan:
    """Resolve the configured names against each side's catalog and build the two projections.

    Raises:
        ValueError: a bare string where a list is expected, or a key column named twice.
        DatabaseError: a table, key column or compared column is missing on a side.
        CatalogError: a configured name matches two columns differing only in case.
    """
    from dw_dagster.databases.catalog import display_name, quoted, resolve_column, table_columns

    if isinstance(key_columns, str) or isinstance(compare_columns, str):
        raise ValueError("key_columns and compare_columns are lists of column names, not a string")
    keys_l = [k.lower() for k in key_columns]
    if len(set(keys_l)) != len(keys_l):
        raise ValueError(f"key_columns names a column twice: {list(key_columns)}")
    s_chars, t_chars = _names(source_char_columns, "source"), _names(target_char_columns, "target")
    sc, tc = table_columns(source, source_table), table_columns(target, target_table)
    s_names, t_names = [n for n, _ in sc], [n for n, _ in tc]
    s_ty, t_ty = _typed(sc, source.dialect), _typed(tc, target.dialect)

    def both(name: str, what: str) -> tuple[str, str]:
        a = resolve_column(s_names, name, source.dialect, source_table)
        b = resolve_column(t_names, name, target.dialect, target_table)
        if a is None or b is None:
            raise DatabaseError(f"{what} {name} is not in both {source_table} and {target_table}")
        return a, b

    keys = [both(k, "key column") for k in key_columns]
    warnings: list[str] = []
    if compare_columns is None:
        used_s, used_t = {a for a, _ in keys}, {b for _, b in keys}
        pairs, labels_c = [], []
        for n in s_names:
            if n in used_s:
                continue
            m = resolve_column([c for c in t_names if c not in used_t], n, target.dialect, target_table)
            if m is None:
                warnings.append(f"column {display_name(n, source.dialect)} is only in {source_table}; not compared")
                continue
            pairs.append((n, m))
            labels_c.append(display_name(n, source.dialect))
            used_t.add(m)
        warnings += [f"column {display_name(n, target.dialect)} is only in {target_table}; not compared"
                     for n in t_names if n not in used_t]
    else:
        pairs = [both(c, "compared column") for c in compare_columns]
        labels_c = list(compare_columns)
    key_alias = [f"dwkey{i}" for i in range(len(keys))]
    col_alias = [f"dwcol{i}" for i in range(len(pairs))]
    labels = dict(zip(key_alias, key_columns)) | dict(zip(col_alias, labels_c))
    aliases = [*key_alias, *col_alias]

    def rel(table: str, names: list[str]) -> str:
        cols = ", ".join(f"{quoted(n).sql('duckdb')} AS {a}" for n, a in zip(names, aliases))
        return f"(SELECT {cols} FROM {sql.table(table).sql('duckdb')})"

    s_cols, t_cols = [a for a, _ in [*keys, *pairs]], [b for _, b in [*keys, *pairs]]

    def declared(chars: list[str], names: list[str], dialect: str, table: str) -> list[str]:
        out = []
        for c in chars:
            r = resolve_column(names, c, dialect, table)
            if r is None or r not in names:
                raise DatabaseError(f"declared CHAR column {c} is not among the compared columns of {table}")
            out.append(aliases[names.index(r)])
        return out

    for a, sn_, tn_ in zip(aliases, s_cols, t_cols):
        why = incomparable(s_ty[sn_], t_ty[tn_])
        if why:
            raise DatabaseError(f"column {labels[a]} cannot be compared: {source_table}.{display_name(sn_, source.dialect)} "
                                f"against {target_table}.{display_name(tn_, target.dialect)} is {why}; compare "
                                "a converted column (a view), or leave it out of compare_columns")
    st = _trimmed(ColumnTypes({a: s_ty[n] for a, n in zip(aliases, s_cols)}), trim,
                  declared(s_chars, s_cols, source.dialect, source_table))
    tt = _trimmed(ColumnTypes({a: t_ty[n] for a, n in zip(aliases, t_cols)}), trim,
                  declared(t_chars, t_cols, target.dialect, target_table))
    return _Plan(key_alias, col_alias, rel(source_table, s_cols), rel(target_table, t_cols), st, tt, labels, warnings)


def _relabel(result: "RowDiffResult", labels: dict[str, str]) -> "RowDiffResult":
    """Internal aliases back to the configured names in the counts, the sample and the warnings."""
    result.changed_columns = {labels.get(c, c): n for c, n in result.changed_columns.items()}
    for e in result.sample:
        e.columns = [labels.get(c, c) for c in e.columns]
    alias = re.compile(r"\bdw(?:key|col)\d+\b")
    result.warnings = [alias.sub(lambda m: labels.get(m.group(0), m.group(0)), w) for w in result.warnings]
    return result


def key_digest(values: Sequence[Any]) -> str:
    """A stable id for a key (sha256 of its text), for logs and receipts."""
    return hashlib.sha256("|".join("N" if v is None else f"V{len(str(v))}:{v}" for v in values).encode()).hexdigest()[:16]
