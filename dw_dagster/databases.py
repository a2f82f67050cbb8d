"""One small interface over the databases dw_dagster reads: warehouses and operational sources.

The store-sales example reads its point-of-sale source (IBM Informix in production) through
:class:`Database`: :class:`DuckDBDatabase` for the embedded stand-in, :class:`SqlAlchemyDatabase`
for anything SQLAlchemy can reach (PostgreSQL on loopback in the tests; ``informix://`` through
``ibm_db_sa``, ``mysql+pymysql://``...). Queries come in as sqlglot-rendered text for the
database's :attr:`Database.dialect`; only aggregates and small samples are fetched with
:meth:`Database.fetch_all`, bulk rows stream as Arrow record batches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import dagster as dg
import pyarrow as pa
from pydantic import Field

from dw_dagster import sql

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


class DatabaseError(RuntimeError):
    """A query failed; the message names the database and the statement, never credentials."""


@runtime_checkable
class Database(Protocol):
    """What dw_dagster needs from a database: its dialect, small results, and streamed batches."""

    dialect: str
    name: str

    def fetch_all(self, sql: str) -> list[tuple]:
        """Run ``sql`` and return every row. Only for aggregates and bounded samples."""
        ...

    def fetch_batches(self, sql: str, batch_rows: int = 100_000) -> Iterator[pa.RecordBatch]:
        """Run ``sql`` and stream its rows as Arrow record batches of at most ``batch_rows`` rows."""
        ...

    def execute(self, sql: str) -> None:
        """Run a statement that returns nothing."""
        ...


def _is_lock_conflict(e: BaseException) -> bool:
    """True for DuckDB's "Could not set lock on file" (another process holds the file)."""
    text = str(e).lower()
    return "could not set lock" in text or "conflicting lock" in text


def _short(sql: str) -> str:
    return " ".join(sql.split())[:300]


class LocalDuckDB:
    """An in-memory DuckDB where rows or keys streamed from two databases are joined (the causes'
    key matching, the cross-database row diff's final comparison).

    Implements the :class:`Database` protocol, so the same SQL that runs pushed down in one
    database runs here over the streamed copies. Its session is in UTC, so aware and naive
    timestamps compare the same whatever the machine's time zone.
    """

    dialect = "duckdb"
    name = "duckdb:(local join of streamed keys)"

    def __init__(self) -> None:
        import duckdb

        self.con = duckdb.connect(config={"threads": 2})
        self.con.execute("SET TimeZone = 'UTC'")

    def fetch_all(self, query: str) -> list[tuple]:
        return self.con.execute(query).fetchall()

    def fetch_batches(self, query: str, batch_rows: int = 100_000):
        yield from self.con.sql(query).to_arrow_reader(batch_rows)

    def execute(self, query: str) -> None:
        self.con.execute(query)

    def load(self, name: str, columns: Sequence[tuple[str, str | None]], batches: Iterable) -> int:
        """Create table ``name`` and insert the Arrow batches into it by column name.

        Args:
            name: the local table.
            columns: (column, DuckDB type); a type of None keeps the type the first batch brings
                (VARCHAR when no batch has rows or the first batch holds only NULLs there).
            batches: Arrow record batches (``Database.fetch_batches``).

        Returns:
            Rows loaded.
        """
        created, rows = False, 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            self.con.register("dw_batch", batch)
            if not created:
                import pyarrow as pa

                sel = []
                for c, ty in columns:
                    null = pa.types.is_null(batch.schema.field(c).type)
                    sel.append(f"CAST({_q(c)} AS {ty or 'VARCHAR'}) AS {_q(c)}" if ty or null else _q(c))
                self.con.execute(f"CREATE TABLE {_q(name)} AS SELECT {', '.join(sel)} FROM dw_batch")
                created = True
            else:
                self.con.execute(f"INSERT INTO {_q(name)} BY NAME SELECT * FROM dw_batch")
            self.con.unregister("dw_batch")
            rows += batch.num_rows
        if not created:
            cols = ", ".join(f"{_q(c)} {ty or 'VARCHAR'}" for c, ty in columns)
            self.con.execute(f"CREATE TABLE {_q(name)} ({cols})")
        return rows

    def close(self) -> None:
        self.con.close()


def _q(name: str) -> str:
    return sql.identifier(name).sql("duckdb")


class DuckDBDatabase:
    """A DuckDB file (or ``:memory:``), opened per call so other processes (dbt) can use it between.

    Args:
        path: path of the ``.duckdb`` file; created on first write.
        memory_limit: DuckDB ``memory_limit`` setting, e.g. ``"1GB"``; None keeps DuckDB's default.
    """

    dialect = "duckdb"
    #: seconds to keep retrying when another process holds the file's lock
    lock_wait_s: float = 120.0

    def __init__(self, path: str | Path, memory_limit: str | None = None) -> None:
        self.path = str(path)
        self.name = f"duckdb:{Path(self.path).name}"
        self.memory_limit = memory_limit

    @contextlib.contextmanager
    def connect(self):
        """A DuckDB connection, closed on exit.

        DuckDB lets one process at a time hold a file open for writing; when another process
        (a parallel Dagster step, dbt) holds the lock, opening is retried with jittered
        exponential back-off for up to :attr:`lock_wait_s` seconds before the lock error is raised.
        """
        con = self._open()
        try:
            con.execute("SET TimeZone = 'UTC'")
            yield con
        finally:
            con.close()

    def _open(self):
        import duckdb
        import tenacity

        config = {"memory_limit": self.memory_limit} if self.memory_limit else {}
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_is_lock_conflict),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=2.0),
            stop=tenacity.stop_after_delay(self.lock_wait_s),
            reraise=True,
        )
        return retrying(duckdb.connect, self.path, config=config)

    def fetch_all(self, sql: str) -> list[tuple]:
        with self.connect() as con:
            try:
                return con.execute(sql).fetchall()
            except Exception as e:  # duckdb raises many error classes
                raise DatabaseError(f"{self.name}: query failed: {e}\n  SQL: {_short(sql)}") from e

    def fetch_batches(self, sql: str, batch_rows: int = 100_000) -> Iterator[pa.RecordBatch]:
        with self.connect() as con:
            try:
                reader = con.sql(sql).to_arrow_reader(batch_rows)
            except Exception as e:
                raise DatabaseError(f"{self.name}: query failed: {e}\n  SQL: {_short(sql)}") from e
            yield from reader

    def execute(self, sql: str) -> None:
        with self.connect() as con:
            try:
                con.execute(sql)
            except Exception as e:
                raise DatabaseError(f"{self.name}: statement failed: {e}\n  SQL: {_short(sql)}") from e


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

    def fetch_all(self, sql: str) -> list[tuple]:
        try:
            with self._engine.connect() as con:
                return [tuple(r) for r in con.exec_driver_sql(sql).fetchall()]
        except Exception as e:
            raise DatabaseError(f"{self.name}: query failed: {type(e).__name__}: {str(e).splitlines()[0]}\n  SQL: {_short(sql)}") from e

    def fetch_batches(self, sql: str, batch_rows: int = 100_000) -> Iterator[pa.RecordBatch]:
        try:
            with self._engine.connect() as con:
                result = con.execution_options(stream_results=True, yield_per=batch_rows).exec_driver_sql(sql)
                names = list(result.keys())
                for part in result.partitions(batch_rows):
                    cols = list(zip(*part)) if part else [[] for _ in names]
                    yield pa.RecordBatch.from_arrays([pa.array(c) for c in cols], names=names)
        except Exception as e:
            raise DatabaseError(f"{self.name}: query failed: {type(e).__name__}: {str(e).splitlines()[0]}\n  SQL: {_short(sql)}") from e

    def execute(self, sql: str) -> None:
        try:
            with self._engine.begin() as con:
                con.exec_driver_sql(sql)
        except Exception as e:
            raise DatabaseError(f"{self.name}: statement failed: {type(e).__name__}: {str(e).splitlines()[0]}\n  SQL: {_short(sql)}") from e

    def dispose(self) -> None:
        self._engine.dispose()


def database_from_url(url: str) -> Database:
    """Open a :class:`Database` from a URL.

    ``duckdb:///path/to/file.duckdb`` (or a bare path ending in ``.duckdb``) opens DuckDB natively;
    ``snowflake://user:password@account/database/schema?warehouse=WH&role=R`` opens
    :class:`~dw_dagster.warehouses.SnowflakeDatabase` (``?host=127.0.0.1&port=8085&protocol=http``
    reaches an emulator); ``bigquery://project/dataset?location=EU`` opens
    :class:`~dw_dagster.warehouses.BigQueryDatabase` with Application Default Credentials, and
    ``bigquery://project/dataset?endpoint=http://127.0.0.1:9050`` an emulator with anonymous
    credentials; anything else is handed to SQLAlchemy.

    Raises:
        ValueError: for an empty URL, or a malformed ``snowflake://`` or ``bigquery://`` URL.
        ImportError: the ``snowflake`` or ``bigquery`` extra of dw-dagster is not installed.
    """
    if not url:
        raise ValueError("database URL is empty")
    if url.startswith("snowflake://"):
        from dw_dagster.warehouses import SnowflakeDatabase

        return SnowflakeDatabase.from_url(url)
    if url.startswith("bigquery://"):
        from dw_dagster.warehouses import BigQueryDatabase

        return BigQueryDatabase.from_url(url)
    if url.startswith("duckdb:///"):
        return DuckDBDatabase(url[len("duckdb:///") :])
    if url.startswith("duckdb://"):
        return DuckDBDatabase(url[len("duckdb://") :] or ":memory:")
    if url.endswith(".duckdb") and "://" not in url:
        return DuckDBDatabase(url)
    return SqlAlchemyDatabase(url)


class DatabaseResource(dg.ConfigurableResource):
    """A Dagster resource that opens a :class:`Database` from a URL.

    Examples:
        .. code-block:: python

            pos = DatabaseResource(url=dg.EnvVar("POS_SOURCE_URL"))
            warehouse = DatabaseResource(url="duckdb:///warehouse.duckdb")
    """

    url: str = Field(description="duckdb:///path.duckdb, or any SQLAlchemy URL (postgresql+psycopg://...)")

    def get_database(self) -> Database:
        return database_from_url(self.url)

