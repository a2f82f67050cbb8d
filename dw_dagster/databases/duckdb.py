"""DuckDB: the embedded warehouse (a file, with lock retries) and an in-memory DuckDB for streamed joins."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from dw_dagster.databases import sql
from dw_dagster.databases.base import DatabaseError, _short
from dw_dagster.dagster_private import public

# SQLAlchemy dialect name -> sqlglot dialect name


def _is_held_elsewhere(e: BaseException) -> bool:
    """True for DuckDB's "Could not set lock on file" (another process holds the file)."""
    text = str(e).lower()
    return "could not set lock" in text or "conflicting lock" in text


def _is_open_here(e: BaseException) -> bool:
    """True for DuckDB's "Unique file handle conflict" (another DuckDB instance of this process has the file
    attached: the stream diff's, for a while)."""
    return "unique file handle conflict" in str(e).lower()


def _is_lock_conflict(e: BaseException) -> bool:
    return _is_held_elsewhere(e) or _is_open_here(e)


def _lock_retrying(seconds: float, when=_is_lock_conflict):
    """A ``tenacity.Retrying`` that retries a DuckDB open while ``when(error)`` (by default a lock held by
    another process or instance), with jittered exponential back-off, for up to ``seconds``."""
    import tenacity

    return tenacity.Retrying(retry=tenacity.retry_if_exception(when),
                             wait=tenacity.wait_random_exponential(multiplier=0.05, max=2.0),
                             stop=tenacity.stop_after_delay(seconds), reraise=True)


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
        # A new in-memory DuckDB costs ~30 ms to open; a connection (cursor) of one process-wide instance
        # with a private in-memory database attached and in use costs ~0.5 ms. The tables live in
        # that database (unique name, detached by close()); registered Arrow views and the session's
        # time zone belong to the connection: nothing is shared between two LocalDuckDBs.
        import uuid

        self._db = f"dw_local_{uuid.uuid4().hex}"
        self.con = _shared_instance().cursor()
        self.con.execute(f"ATTACH ':memory:' AS {self._db}")
        # detached when closed, or when this object is collected unclosed (the shared instance outlives it)
        self._finalizer = weakref.finalize(self, _detach, self.con, self._db)
        self.con.execute(f"USE {self._db}")
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
        """Drop the private database (its tables' memory) and the connection; safe to call twice."""
        if self.con is None:
            return
        self._finalizer()
        self.con = None


def _detach(con, name: str) -> None:
    try:
        con.execute("USE memory")
        con.execute(f"DETACH DATABASE IF EXISTS {name}")
    finally:
        con.close()


_SHARED: tuple[int, object] | None = None
_SHARED_LOCK = threading.Lock()


def _shared_instance():
    """The process's in-memory DuckDB behind every :class:`LocalDuckDB` (2 threads), made again in a forked child."""
    global _SHARED
    import os

    import duckdb

    with _SHARED_LOCK:
        if _SHARED is None or _SHARED[0] != os.getpid():
            _SHARED = (os.getpid(), duckdb.connect(config={"threads": 2}))
        return _SHARED[1]


def _q(name: str) -> str:
    return sql.identifier(name).sql("duckdb")


@public
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
    def connect(self, threads: int | None = None):
        """A DuckDB connection, closed on exit.

        DuckDB lets one process at a time hold a file open for writing; when another process
        (a parallel Dagster step, dbt) holds the lock, opening is retried with jittered
        exponential back-off for up to :attr:`lock_wait_s` seconds before the lock error is raised.

        Args:
            threads: DuckDB's ``threads`` for the instance this opens (a caller that runs its own
                statements side by side on cursors needs no worker threads of DuckDB's beside
                them). Ignored when this process has the file open already: that instance keeps
                its own setting.
        """
        con = self._open(threads)
        try:
            con.execute("SET TimeZone = 'UTC'")
            yield con
        finally:
            con.close()

    def _open(self, threads: int | None = None):
        import duckdb

        config: dict[str, object] = {"memory_limit": self.memory_limit} if self.memory_limit else {}
        opening = _lock_retrying(self.lock_wait_s)
        if threads is None:
            return opening(duckdb.connect, self.path, config=config)
        try:
            return opening(duckdb.connect, self.path, config={**config, "threads": threads})
        except duckdb.ConnectionException as e:
            if "different configuration" not in str(e):
                raise
            return opening(duckdb.connect, self.path, config=config)  # open in this process: its instance as it is

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
