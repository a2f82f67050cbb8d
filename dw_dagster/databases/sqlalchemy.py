"""Any database SQLAlchemy can reach (PostgreSQL, MySQL/MariaDB, Informix through ``ibm_db_sa``, SQL Server...)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from dw_dagster.databases.base import DatabaseError, _short

# SQLAlchemy dialect name -> sqlglot dialect name
_SQLALCHEMY_TO_SQLGLOT = {
    "postgresql": "postgres",
    "mysql": "mysql",
    "mariadb": "mysql",
    "sqlite": "sqlite",
    "mssql": "tsql",
    "oracle": "oracle",
    "snowflake": "snowflake",
    "bigquery": "bigquery",
    "duckdb": "duckdb",
}


class SqlAlchemyDatabase:
    """Any database SQLAlchemy reaches, addressed by URL (``postgresql+psycopg://...``).

    The URL's password never appears in errors or in :attr:`name`.
    """

    def __init__(self, url: str) -> None:
        import sqlalchemy as sa

        self._engine = sa.create_engine(url, pool_pre_ping=True)
        backend = self._engine.dialect.name
        self.dialect = _SQLALCHEMY_TO_SQLGLOT.get(backend, backend)
        u = self._engine.url
        self.name = f"{backend}:{u.host or ''}{':' + str(u.port) if u.port else ''}/{u.database or ''}"
        # drivers with format/pyformat parameters (psycopg, PyMySQL) read '%' as a placeholder even with no
        # parameters: a '%' operator (PostgreSQL's modulo) or a LIKE pattern must reach them doubled
        self._percent = getattr(self._engine.dialect, "paramstyle", "") in ("format", "pyformat")

    def _text(self, sql: str) -> str:
        return sql.replace("%", "%%") if self._percent else sql

    def fetch_all(self, sql: str) -> list[tuple]:
        try:
            with self._engine.connect() as con:
                return [tuple(r) for r in con.exec_driver_sql(self._text(sql)).fetchall()]
        except Exception as e:
            raise DatabaseError(f"{self.name}: query failed: {type(e).__name__}: {str(e).splitlines()[0]}\n  SQL: {_short(sql)}") from e

    def fetch_batches(self, sql: str, batch_rows: int = 100_000) -> Iterator[pa.RecordBatch]:
        try:
            with self._engine.connect() as con:
                result = con.execution_options(stream_results=True, yield_per=batch_rows).exec_driver_sql(self._text(sql))
                names = list(result.keys())
                for part in result.partitions(batch_rows):
                    cols = list(zip(*part)) if part else [[] for _ in names]
                    yield pa.RecordBatch.from_arrays([_arrow(c) for c in cols], names=names)
        except Exception as e:
            raise DatabaseError(f"{self.name}: query failed: {type(e).__name__}: {str(e).splitlines()[0]}\n  SQL: {_short(sql)}") from e

    def execute(self, sql: str) -> None:
        try:
            with self._engine.begin() as con:
                con.exec_driver_sql(self._text(sql))
        except Exception as e:
            raise DatabaseError(f"{self.name}: statement failed: {type(e).__name__}: {str(e).splitlines()[0]}\n  SQL: {_short(sql)}") from e

    def execute_many(self, statements: "list[str]") -> None:
        """Run ``statements`` in one transaction: all of them, or (on an error) none.

        Raises:
            DatabaseError: a statement failed (named); the transaction was rolled back.
        """
        sql = ""
        try:
            with self._engine.begin() as con:
                for sql in statements:
                    con.exec_driver_sql(sql)
        except Exception as e:
            raise DatabaseError(f"{self.name}: statement failed (nothing of the transaction kept): {type(e).__name__}: "
                                f"{str(e).splitlines()[0]}\n  SQL: {_short(sql)}") from e

    @contextlib.contextmanager
    def snapshot(self, tables: Sequence[str] = ()) -> Iterator[Callable[[str], list[tuple]]]:
        """One snapshot-consistent read (PostgreSQL): a ``REPEATABLE READ READ ONLY`` transaction that first
        takes ``ACCESS SHARE`` locks on ``tables`` (``schema.table`` names), then yields a ``fetch_all``
        whose every query sees the same snapshot.

        The locks come before the snapshot is taken (the first query takes it): a ``TRUNCATE`` and
        reload running in one transaction is waited for and read whole, never as the empty table a
        snapshot taken before its commit would see (``TRUNCATE`` is not MVCC-safe); any other
        reload in one transaction is read as before or as after it, never half-done.

        Raises:
            NotImplementedError: the engine is not PostgreSQL.
            DatabaseError: a lock or query failed.
        """
        if self.dialect != "postgres":
            raise NotImplementedError(f"{self.name}: no snapshot reads for {self.dialect}")
        from dw_dagster.databases import sql as _sql

        statement = ""
        try:
            with self._engine.connect() as con:
                con = con.execution_options(isolation_level="REPEATABLE READ")
                with con.begin():
                    statement = "SET TRANSACTION READ ONLY"
                    con.exec_driver_sql(statement)
                    for t in tables:
                        statement = f"LOCK TABLE {_sql.table(t).sql(dialect='postgres')} IN ACCESS SHARE MODE"
                        con.exec_driver_sql(statement)

                    def fetch(query: str) -> list[tuple]:
                        nonlocal statement
                        statement = query
                        return [tuple(r) for r in con.exec_driver_sql(self._text(query)).fetchall()]

                    yield fetch
        except DatabaseError:
            raise
        except Exception as e:
            raise DatabaseError(f"{self.name}: snapshot read failed: {type(e).__name__}: {str(e).splitlines()[0]}\n"
                                f"  SQL: {_short(statement)}") from e

    def dispose(self) -> None:
        self._engine.dispose()


def _arrow(values) -> pa.Array:
    """One fetched column as Arrow. A driver that parses JSON (psycopg's ``json``/``jsonb``) hands
    back dicts, lists and scalars mixed in one column, which Arrow cannot type: such a column
    comes back as its JSON text (``json.dumps``), as the engine would print it."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        if not any(isinstance(v, (dict, list)) for v in values):
            raise
        import json

        return pa.array([None if v is None else json.dumps(v) for v in values], type=pa.string())
