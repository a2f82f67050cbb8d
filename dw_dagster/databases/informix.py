"""IBM Informix through SQLAlchemy (``ibm_db_sa://`` or ``informix://`` URLs), with its own catalog reader.

The driver is the optional extra ``dw-dagster[informix]`` (``ibm-db-sa``); it is imported only
when such a URL is opened. SQL is rendered by the ``informix`` sqlglot dialect
(:mod:`dw_dagster.databases.informix_dialect`): ``informix`` when the client environment sets
``DELIMIDENT`` (double quotes delimit names), else ``informix, delimident=false``.

Informix has no ``information_schema``: columns come from ``systables`` and ``syscolumns``, whose
``coltype`` and ``collength`` codes are decoded here (IBM, *Informix Guide to SQL: Reference*,
"SYSCOLUMNS"): the type is ``coltype`` modulo 256 (256 is added for ``NOT NULL``), a
``DECIMAL``'s precision and scale are ``collength // 256`` and ``collength % 256`` (scale 255:
floating), a ``DATETIME``'s qualifier is ``collength % 256`` as first field × 16 + last field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa

from dw_dagster.databases.base import DatabaseError
from dw_dagster.databases.informix_dialect import dialect_name

#: SQLAlchemy URL schemes read as Informix
URL_SCHEMES = ("informix", "ibm_db_sa")
#: the extra that brings the driver
EXTRA = "dw-dagster[informix]"

_TYPES = {0: "CHAR", 1: "SMALLINT", 2: "INTEGER", 3: "FLOAT", 4: "SMALLFLOAT", 5: "DECIMAL", 6: "SERIAL", 7: "DATE",
          8: "MONEY", 10: "DATETIME", 11: "BYTE", 12: "TEXT", 13: "VARCHAR", 14: "INTERVAL", 15: "NCHAR",
          16: "NVARCHAR", 17: "INT8", 18: "SERIAL8", 40: "LVARCHAR", 41: "BOOLEAN", 43: "LVARCHAR", 45: "BOOLEAN",
          52: "BIGINT", 53: "BIGSERIAL"}
_FIELDS = {0: "YEAR", 2: "MONTH", 4: "DAY", 6: "HOUR", 8: "MINUTE", 10: "SECOND", 11: "FRACTION(1)",
           12: "FRACTION(2)", 13: "FRACTION(3)", 14: "FRACTION(4)", 15: "FRACTION(5)"}


def is_informix_url(url: str) -> bool:
    """Whether ``url`` names an Informix database (``informix://``, ``informix+...://``, ``ibm_db_sa://``)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return scheme.split("+", 1)[0] in URL_SCHEMES


def decode_column(coltype: int, collength: int, extended_id: int = 0) -> tuple[str, bool]:
    """``(Informix type, nullable)`` of one ``syscolumns`` row.

    Raises:
        ValueError: an unknown type code.
    """
    nullable = not (coltype & 0x100)
    base = coltype & 0xFF
    if base == 40 and extended_id not in (0, 1):
        base = 41 if extended_id == 5 else base
    name = _TYPES.get(base)
    if name is None:
        raise ValueError(f"unknown Informix coltype {coltype}")
    if name in ("DECIMAL", "MONEY"):
        p, s = collength // 256, collength % 256
        return (f"{name}({p})" if s == 255 else f"{name}({p},{s})"), nullable
    if name in ("DATETIME", "INTERVAL"):
        q = collength % 256
        first, last = _FIELDS.get(q // 16, "?"), _FIELDS.get(q % 16, "?")
        return f"{name} {first} TO {last}", nullable
    if name in ("VARCHAR", "NVARCHAR"):
        return f"{name}({collength % 256})", nullable
    if name in ("CHAR", "NCHAR", "LVARCHAR"):
        return f"{name}({collength})", nullable
    return name, nullable


def rule_type(informix_type: str) -> str:
    """The type name the compare rules know (:mod:`dw_dagster.checks.rowdiff.rules`) for an Informix type."""
    t = informix_type.upper()
    head = t.split("(")[0].split(" ")[0]
    if head == "DATETIME":
        return "DATE" if t.endswith("TO DAY") else "TIMESTAMP"
    mapping = {"SERIAL": "INTEGER", "SERIAL8": "BIGINT", "INT8": "BIGINT", "BIGSERIAL": "BIGINT", "SMALLFLOAT": "REAL",
               "FLOAT": "DOUBLE", "NCHAR": "CHAR", "NVARCHAR": "VARCHAR", "LVARCHAR": "VARCHAR", "TEXT": "VARCHAR"}
    if head == "MONEY":
        return "DECIMAL" + t[len("MONEY"):]
    if head in mapping:
        rest = t[len(head):] if head in ("NCHAR", "NVARCHAR", "LVARCHAR") else ""
        return mapping[head] + rest
    return t


def catalog_sql(table: str, dialect: str = "informix") -> str:
    """The ``systables``/``syscolumns`` query for ``table``'s columns, in order (owner matched in any case)."""
    from sqlglot import exp

    from dw_dagster.databases import sql

    t = sql.table(table)
    owner = t.args.get("db")
    conds = [exp.column("tabid", "t").eq(exp.column("tabid", "c")),
             exp.func("LOWER", exp.column("tabname", "t")).eq(sql.literal(t.name.lower()))]
    if owner is not None:
        conds.append(exp.func("LOWER", exp.func("TRIM", exp.column("owner", "t"))).eq(sql.literal(owner.name.lower())))
    q = (exp.select(exp.column("colname", "c"), exp.column("coltype", "c"), exp.column("collength", "c"),
                    exp.column("extended_id", "c"))
         .from_(exp.Table(this=exp.to_identifier("systables"), alias=exp.TableAlias(this=exp.to_identifier("t"))))
         .join(exp.Table(this=exp.to_identifier("syscolumns"), alias=exp.TableAlias(this=exp.to_identifier("c"))))
         .where(exp.and_(*conds)).order_by(exp.column("colno", "c")))
    return q.sql(dialect=dialect)


class InformixDatabase:
    """An Informix database addressed by a SQLAlchemy URL (the driver from ``dw-dagster[informix]``).

    Raises (when opened):
        DatabaseError: the driver is not installed (the message names the extra).
    """

    def __init__(self, url: str) -> None:
        from dw_dagster.databases.sqlalchemy import SqlAlchemyDatabase

        try:
            self._db = SqlAlchemyDatabase(url)
        except Exception as e:  # sqlalchemy's NoSuchModuleError, or the driver's own ImportError
            if "NoSuchModule" in type(e).__name__ or isinstance(e, ImportError):
                raise DatabaseError(f"an Informix URL needs its driver: pip install '{EXTRA}' ({type(e).__name__}: "
                                    f"{str(e).splitlines()[0]})") from e
            raise
        self.name = self._db.name
        self.dialect = dialect_name(bool(os.environ.get("DELIMIDENT")))

    def fetch_all(self, sql: str) -> list[tuple]:
        return self._db.fetch_all(sql)

    def fetch_batches(self, sql: str, batch_rows: int = 100_000) -> Iterator[pa.RecordBatch]:
        return self._db.fetch_batches(sql, batch_rows)

    def execute(self, sql: str) -> None:
        self._db.execute(sql)

    def dispose(self) -> None:
        self._db.dispose()

    def _columns(self, table: str) -> list[tuple[str, str, bool]]:
        rows = self.fetch_all(catalog_sql(table, self.dialect))
        if not rows:
            raise DatabaseError(f"{self.name}: table {table} not found (no columns in systables/syscolumns)")
        out = []
        for name, coltype, collength, ext in rows:
            ty, nullable = decode_column(int(coltype), int(collength), int(ext or 0))
            out.append((str(name).strip(), ty, nullable))
        return out

    def column_types(self, table: str):
        """Column name → the type the compare rules know (:func:`rule_type`), in table order."""
        from dw_dagster.databases.catalog import ColumnTypes

        cols = self._columns(table)
        return ColumnTypes({n.lower(): rule_type(ty) for n, ty, _ in cols}, {n.lower(): n for n, _, _ in cols})

    def table_schema(self, table: str):
        """The table's columns with their Informix types and nullability (:class:`~dw_dagster.databases.catalog.TableSchema`)."""
        from dw_dagster.databases.catalog import ColumnSpec, TableSchema

        return TableSchema(table=table, columns=[ColumnSpec(name=n, type=ty, nullable=nl) for n, ty, nl in self._columns(table)])


__all__ = ["EXTRA", "InformixDatabase", "URL_SCHEMES", "catalog_sql", "decode_column", "is_informix_url", "rule_type"]
