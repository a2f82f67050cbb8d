"""An ``informix`` dialect for sqlglot, for the SQL dw_dagster's checks and diffs generate.

sqlglot has no Informix dialect, so every SQL builder here failed on an IBM Informix source (the
store-sales story's POS consolidation database). This dialect renders what the builders produce —
not the whole language — following IBM's *Informix Guide to SQL: Syntax* (12.10 / 14.10):

- **identifiers**: names written without quotes fold to lower case. With ``DELIMIDENT`` set in
  the client environment, double quotes delimit identifiers (any case, any character) and
  strings take single quotes; without it (the setting ``delimident=false``: ``"informix,
  delimident=false"``) double quotes would start a *string*, so no name can be quoted: a name is
  written bare when that is the same name (a plain name in lower case) and refused otherwise
  (:class:`InformixSqlError` naming it and ``DELIMIDENT``), never silently changed;
- **row limits** go in the Projection clause: ``SELECT SKIP n FIRST m ...`` (``LIMIT`` at the end
  is not Informix); refused in a subquery other than one in a ``FROM`` clause, where Informix
  does not allow them;
- **times**: ``TIMESTAMP`` is ``DATETIME YEAR TO FRACTION(5)`` (10 µs: a sixth fraction digit is
  refused rather than dropped); literals are ``DATETIME (2026-11-01 07:00:00.00000) YEAR TO
  FRACTION(5)``; ``DATE`` literals ``MDY(m, d, y)`` (independent of ``DBDATE``); interval
  arithmetic ``INTERVAL (72) HOUR(2) TO HOUR``; ``AT TIME ZONE`` does not exist (an Informix
  ``DATETIME`` carries no zone) and is refused;
- **numbers**: ``DECIMAL(p,s)`` with ``p`` at most 32 (Informix's largest; a wider cast is
  narrowed to 32 digits, the scale kept); ``SUM`` over a ``DECIMAL(p,s)`` column is left exact
  (never cast to ``FLOAT``); ``%`` is ``MOD(a, b)``; ``DOUBLE`` is ``FLOAT`` and ``REAL``
  ``SMALLFLOAT``;
- **text**: ``VARCHAR`` without a length (``CAST(x AS VARCHAR)``) is ``LVARCHAR`` (``VARCHAR``
  with no length is one byte in Informix); length is ``CHAR_LENGTH`` (Informix's ``LENGTH``
  leaves out trailing blanks), ``SUBSTRING(x, a, b)`` is ``SUBSTR``, ``COALESCE`` nested ``NVL``,
  ``||`` concatenates; a glob pattern (DuckDB's ``GLOB``, ``*``, ``?``, ``[...]``) is
  ``MATCHES``, whose wildcards are the same.

There is no MD5 or other hash function built into Informix SQL, so the cross-database row diff
cannot checksum an Informix table in the database: it downloads the rows (sampled by key
buckets of a numeric key when configured) and compares them locally
(:func:`dw_dagster.checks.rowdiff.row_diff_across`).

sqlglot's compiled build (``sqlglotc``) refuses Python subclasses of its generator, so this
dialect keeps sqlglot's own base generator and rewrites the tree before it renders: each
construct Informix spells differently is replaced by its Informix text, built bottom-up.
No Informix server runs in dw_dagster's tests: the generated SQL is checked against a grammar
written from IBM's syntax diagrams (``dw_dagster_tests/databases/informix_grammar.lark``).
"""

from __future__ import annotations

import datetime as dt
import re

from sqlglot import exp, tokens
from sqlglot.dialects.dialect import Dialect, NormalizationStrategy

from dw_dagster.errors import DwDagsterError

#: Informix's largest DECIMAL precision
MAX_DECIMAL_PRECISION = 32
#: the DATETIME qualifier a TIMESTAMP maps to
DATETIME_QUALIFIER = "YEAR TO FRACTION(5)"
_PLAIN = re.compile(r"[a-z_][a-z0-9_$]*")
#: names that stand for clauses inside a Projection clause: unquoted they would be read as keywords
_AMBIGUOUS = frozenset({"skip", "first", "limit", "middle", "unique", "distinct", "all", "select", "from", "where",
                        "group", "order", "having", "union", "into", "null", "case", "when", "then", "else", "end"})
_INTERVAL_UNITS = {"YEAR", "MONTH", "DAY", "HOUR", "MINUTE", "SECOND"}


class InformixSqlError(DwDagsterError, ValueError):
    """A statement cannot be written for Informix as built; the message names the construct and why."""


class Informix(Dialect):
    """IBM Informix (12.10, 14.10): see the module docstring. Settings: ``delimident`` (default true)."""

    NORMALIZATION_STRATEGY = NormalizationStrategy.LOWERCASE
    NULL_ORDERING = "nulls_are_small"
    SUPPORTED_SETTINGS = {"delimident"}

    class Tokenizer(tokens.Tokenizer):
        QUOTES = ["'"]
        IDENTIFIERS = ['"']

    def __init__(self, **kwargs) -> None:
        delim = kwargs.pop("delimident", True)
        super().__init__(**kwargs)
        self.delimident = str(delim).strip().lower() not in ("false", "0", "no", "off")

    def generate(self, expression: exp.Expr, copy: bool = True, **opts) -> str:  # type: ignore[override]
        tree = expression.copy() if copy else expression
        rewritten = _Rewriter(self, opts).rewrite(tree)
        return self.generator(**opts).generate(rewritten, copy=False)


def informix_datetime(value: dt.datetime) -> str:
    """A ``DATETIME ... YEAR TO FRACTION(5)`` literal (naive, or aware converted to UTC).

    Raises:
        InformixSqlError: the value has a sixth fraction digit (finer than FRACTION(5) holds).
    """
    if value.tzinfo is not None:
        value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if value.microsecond % 10:
        raise InformixSqlError(f"{value.isoformat()} has a sixth fraction digit; DATETIME YEAR TO FRACTION(5) holds "
                               "10 µs (round the bound first)")
    return f"DATETIME ({value:%Y-%m-%d %H:%M:%S}.{value.microsecond // 10:05d}) {DATETIME_QUALIFIER}"


def informix_type(dtype: exp.DataType) -> str:
    """The Informix spelling of a sqlglot data type (see the module docstring)."""
    t = dtype.this
    params = [p.sql() for p in dtype.expressions]
    T = exp.DataType.Type
    if t in (T.TIMESTAMP, T.DATETIME, T.TIMESTAMPNTZ, T.TIMESTAMP_NS, T.TIMESTAMP_MS, T.TIMESTAMP_S):
        return f"DATETIME {DATETIME_QUALIFIER}"
    if t in (T.TIMESTAMPTZ, T.TIMESTAMPLTZ):
        raise InformixSqlError("Informix has no time-zone-aware DATETIME: convert to UTC before comparing")
    if t in (T.DECIMAL, T.BIGDECIMAL):
        if not params:
            return "DECIMAL(32)"
        p = min(int(params[0]), MAX_DECIMAL_PRECISION)
        s = int(params[1]) if len(params) > 1 else 0
        return f"DECIMAL({p},{min(s, p)})"
    if t in (T.VARCHAR, T.TEXT, T.NVARCHAR):
        if params and int(params[0]) <= 255:
            return f"VARCHAR({params[0]})"
        return f"LVARCHAR({params[0]})" if params else "LVARCHAR"
    if t in (T.CHAR, T.NCHAR):
        return f"CHAR({params[0]})" if params else "CHAR(1)"
    simple = {T.BIGINT: "BIGINT", T.INT: "INTEGER", T.SMALLINT: "SMALLINT", T.TINYINT: "SMALLINT",
              T.DOUBLE: "FLOAT", T.FLOAT: "SMALLFLOAT", T.DATE: "DATE", T.BOOLEAN: "BOOLEAN",
              T.INT128: "DECIMAL(32,0)", T.UBIGINT: "DECIMAL(20,0)", T.UINT: "BIGINT", T.USMALLINT: "INTEGER"}
    if t in simple:
        return simple[t]
    raise InformixSqlError(f"no Informix type for {dtype.sql()}")


class _Rewriter:
    """Bottom-up: every node Informix spells differently becomes an ``exp.Var`` holding its text."""

    def __init__(self, dialect: Informix, opts: dict) -> None:
        self.dialect, self.opts = dialect, opts

    def text(self, node: exp.Expression) -> str:
        return self.dialect.generator(**self.opts).generate(node, copy=False)

    def rewrite(self, node: exp.Expression) -> exp.Expression:
        for key, value in list(node.args.items()):
            if isinstance(value, exp.DataType):
                continue  # a cast's type: written by the cast itself
            if isinstance(value, exp.Expression):
                node.set(key, self.rewrite(value))
            elif isinstance(value, list):
                node.set(key, [self.rewrite(v) if isinstance(v, exp.Expression) else v for v in value])
        return self.one(node)

    def one(self, node: exp.Expression) -> exp.Expression:  # noqa: C901 - one branch per construct
        if isinstance(node, exp.Identifier):
            return self.identifier(node)
        if isinstance(node, exp.Select):
            return self.select(node)
        if isinstance(node, exp.Cast):
            return self.cast(node)
        if isinstance(node, exp.Interval):
            return self.interval(node)
        if isinstance(node, exp.Mod):
            return exp.Anonymous(this="MOD", expressions=[node.this, node.expression])
        if isinstance(node, exp.Coalesce):
            args = [node.this, *node.expressions]
            out = args[-1]
            for a in reversed(args[:-1]):
                out = exp.Anonymous(this="NVL", expressions=[a, out])
            return out
        if isinstance(node, exp.Length):
            return exp.Anonymous(this="CHAR_LENGTH", expressions=[node.this])
        if isinstance(node, exp.Substring):
            args = [node.this, node.args.get("start") or exp.Literal.number(1)]
            if node.args.get("length") is not None:
                args.append(node.args["length"])
            return exp.Anonymous(this="SUBSTR", expressions=args)
        if isinstance(node, exp.Anonymous) and node.name.upper() == "GLOB" and len(node.expressions) == 2:
            node = exp.Glob(this=node.expressions[0], expression=node.expressions[1])
        if isinstance(node, exp.Glob):
            return exp.Var(this=f"{self.text(node.this)} MATCHES {self.text(node.expression)}")
        if isinstance(node, exp.Concat):
            parts = node.expressions
            out = parts[0]
            for p in parts[1:]:
                out = exp.DPipe(this=out, expression=p)
            return out
        if isinstance(node, exp.AtTimeZone):
            raise InformixSqlError("Informix has no AT TIME ZONE: an Informix DATETIME carries no zone (store and "
                                   "compare UTC)")
        if isinstance(node, exp.Boolean):
            return exp.Var(this="'t'::BOOLEAN" if node.this else "'f'::BOOLEAN")
        if isinstance(node, (exp.MD5, exp.SHA, exp.SHA2)):
            raise InformixSqlError("Informix SQL has no built-in hash function (MD5, SHA): the row diff downloads "
                                   "the rows of an Informix table instead of checksumming them there")
        return node

    def identifier(self, node: exp.Identifier) -> exp.Expression:
        name = node.name
        if self.dialect.delimident:
            return node
        if not _PLAIN.fullmatch(name) or name in _AMBIGUOUS:
            raise InformixSqlError(
                f"the name {name!r} can only be written quoted (it is not a plain lower-case name, or it is a keyword "
                "of the Projection clause); set DELIMIDENT in the Informix client environment and use the "
                "'informix' dialect with delimident (the default)")
        return exp.Identifier(this=name, quoted=False)

    def select(self, node: exp.Select) -> exp.Expression:
        limit, offset = node.args.get("limit"), node.args.get("offset")
        if limit is None and offset is None:
            return node
        parent = node.parent
        if isinstance(parent, exp.Subquery) and not isinstance(parent.parent, (exp.From, exp.Join)):
            raise InformixSqlError("Informix allows SKIP/FIRST in a subquery only in a FROM clause")
        node.set("limit", None)
        node.set("offset", None)
        head = ""
        if offset is not None:
            head += f"SKIP {self._count(offset.expression if isinstance(offset, exp.Offset) else offset)} "
        if limit is not None:
            head += f"FIRST {self._count(limit.expression if isinstance(limit, exp.Limit) else limit)} "
        body = self.text(node)
        if not body.startswith("SELECT "):
            raise InformixSqlError(f"cannot place SKIP/FIRST in {body[:40]!r}")
        return exp.Var(this="SELECT " + head + body[len("SELECT "):])

    @staticmethod
    def _count(e: exp.Expression) -> int:
        if isinstance(e, exp.Literal) and e.is_int and int(e.name) >= 0:
            return int(e.name)
        raise InformixSqlError(f"SKIP and FIRST take an unsigned integer literal, got {e.sql()}")

    def cast(self, node: exp.Cast) -> exp.Expression:
        target = informix_type(node.args["to"])
        value = node.this
        if isinstance(value, exp.Literal) and value.is_string and target.startswith("DATETIME"):
            try:
                return exp.Var(this=informix_datetime(dt.datetime.fromisoformat(value.name)))
            except ValueError as e:
                raise InformixSqlError(f"{value.name!r} is not a date and time") from e
        if isinstance(value, exp.Literal) and value.is_string and target == "DATE":
            try:
                d = dt.date.fromisoformat(value.name)
            except ValueError as e:
                raise InformixSqlError(f"{value.name!r} is not a date") from e
            return exp.Var(this=f"MDY({d.month}, {d.day}, {d.year})")
        return exp.Var(this=f"CAST({self.text(value)} AS {target})")

    def interval(self, node: exp.Interval) -> exp.Expression:
        unit = (node.text("unit") or "").upper().rstrip("S")
        value = node.this
        if unit not in _INTERVAL_UNITS or not (isinstance(value, exp.Literal)):
            raise InformixSqlError(f"cannot write the interval {node.sql()} for Informix")
        try:
            n = int(str(value.name).strip())
        except ValueError as e:
            raise InformixSqlError(f"an Informix INTERVAL literal takes whole units, got {value.name!r}") from e
        digits = max(2, len(str(abs(n))))
        sign = "-" if n < 0 else ""
        return exp.Var(this=f"INTERVAL ({sign}{abs(n)}) {unit}({digits}) TO {unit}")


def to_informix(sql_text: str, *, read: str = "duckdb", delimident: bool = True) -> str:
    """Transpile one statement from ``read`` (DuckDB's dialect, as the builders write) to Informix."""
    import sqlglot

    return sqlglot.transpile(sql_text, read=read, write=dialect_name(delimident))[0]


def dialect_name(delimident: bool = True) -> str:
    """The sqlglot dialect string: ``informix`` or ``informix, delimident=false``."""
    return "informix" if delimident else "informix, delimident=false"


__all__ = ["DATETIME_QUALIFIER", "Informix", "InformixSqlError", "MAX_DECIMAL_PRECISION", "dialect_name",
           "informix_datetime", "informix_type", "to_informix"]
