"""The orders source (``shop.orders`` in MariaDB/MySQL) and its change stream.

Two sources produce the same :class:`ChangeEvent` stream, so the sink (:mod:`.sink`) can be
driven by either:

- :class:`BinlogSource` reads the server's **row-based binary log** with ``mysql-replication``
  (``pymysqlreplication.BinLogStreamReader``, ``blocking=False``): every ``WriteRowsEvent``,
  ``UpdateRowsEvent`` and ``DeleteRowsEvent`` of the table becomes one event with its before/after
  row image. The server needs ``log_bin`` on, ``binlog_format=ROW``, ``binlog_row_image=FULL``
  and ``binlog_row_metadata=FULL`` (column names in the log), and a user with ``REPLICATION
  SLAVE`` and ``REPLICATION CLIENT`` (``BINLOG MONITOR`` on MariaDB) privileges;
  :meth:`BinlogSource.check_server` says what is missing.
- :class:`ReplaySource` replays :func:`~.generator.changes` deterministically with no server
  (the demo's default path).

:func:`apply_changes` writes the generator's changes into the MariaDB table in transactions of
up to ``txn_rows`` consecutive changes of one UTC clock hour, with the session clock
(``SET timestamp``) set to each transaction's commit time (its last change's time), so the binlog
carries the generator's times. A :class:`ReplaySource` with the same ``txn_rows`` then yields the
same events (op, key, before, after, ``ts``) as :class:`BinlogSource` reading that binlog; only
the positions differ.

Positions. A :class:`SourcePosition` is ``(log_file, log_pos, row)``: ``log_pos`` is the start of
the transaction in the binlog and ``row`` the number of this table's row changes of that
transaction already consumed, so a cursor can sit *inside* a transaction (a sink batch may end
there) and resuming from it reads nothing twice. After a transaction's last row the cursor moves
to the end of its commit (XID) event, row 0. Each event carries ``position`` (where it is) and
``next_position`` (the cursor to store once it is applied). The replay uses ``log_file =
"replay"`` and the transaction number as ``log_pos``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol
from urllib.parse import unquote, urlsplit

from dw_dagster.databases import sql
from dw_dagster_examples.orders import generator as gen

check_name, check_table_name = sql.check_name, sql.check_table_name

Op = Literal["insert", "update", "delete"]
REPLAY_LOG = "replay"
SOURCE_SCHEMA = "shop"
SOURCE_TABLE = "orders"
#: server id this reader registers with (must differ from the server's and every replica's)
DEFAULT_SERVER_ID = 4271

@dataclass(frozen=True, order=True)
class SourcePosition:
    """A resumable cursor in the change stream (see the module docstring).

    Attributes:
        log_file: binlog file name (``binlog.000001``), or ``"replay"``.
        log_pos: byte offset of the transaction's first event in ``log_file`` (replay: transaction number).
        row: this table's row changes of that transaction already consumed.
    """

    log_file: str
    log_pos: int
    row: int = 0

    def __str__(self) -> str:
        """``file:pos:row`` with ``pos`` and ``row`` zero-padded (10 and 9 digits), so positions of
        one source sort as text in stream order (``ORDER BY source_position`` in SQL)."""
        return f"{self.log_file}:{self.log_pos:010d}:{self.row:09d}"

    @classmethod
    def parse(cls, text: str) -> SourcePosition:
        """Parse ``"file:pos:row"`` (``"file:pos"`` means row 0).

        Raises:
            ValueError: not that shape.
        """
        parts = str(text).rsplit(":", 2)
        try:
            if len(parts) == 3 and parts[0]:
                return cls(parts[0], int(parts[1]), int(parts[2]))
            head, pos = str(text).rsplit(":", 1)
            if head:
                return cls(head, int(pos), 0)
        except ValueError:
            pass
        raise ValueError(f"not a source position: {text!r} (expected file:pos:row)")


@dataclass(frozen=True)
class ChangeEvent:
    """One row change of the source table, as the CDC reader (or the replay) delivers it.

    Attributes:
        op: ``insert``, ``update`` or ``delete``.
        schema, table: the source table.
        key: the row key (``order_id``).
        before: the row before (update, delete) — column name → value; None for an insert.
        after: the row after (insert, update); None for a delete. Values as MariaDB returns
            them: int, ``Decimal``, naive UTC ``datetime``, str, None.
        ts: commit time of the change's transaction (naive UTC; the binlog event timestamp).
        position: where the change is in the stream.
        next_position: the cursor to store once this change is applied.
    """

    op: Op
    schema: str
    table: str
    key: int
    before: dict | None
    after: dict | None
    ts: dt.datetime
    position: SourcePosition
    next_position: SourcePosition

    @property
    def row(self) -> dict:
        """The row this change leaves (after), or removes (before, for a delete)."""
        return self.after if self.after is not None else (self.before or {})


class ChangeSource(Protocol):
    """Anything that yields :class:`ChangeEvent` s from a cursor."""

    def read(self, start: SourcePosition | None = None) -> Iterator[ChangeEvent]:
        """Changes after ``start`` (None: from the beginning), in commit order, until the end of the log."""
        ...


def _transactions(changes: Iterable[gen.OrderChange], txn_rows: int) -> Iterator[list[gen.OrderChange]]:
    """Group changes into transactions: consecutive changes of one UTC clock hour, at most ``txn_rows``.

    (So a transaction's commit time — its last change's time — is never more than an hour after
    any of its changes, at every scale.)
    """
    chunk: list[gen.OrderChange] = []
    hour = None
    for c in changes:
        h = c.ts.replace(minute=0, second=0, microsecond=0)
        if chunk and (len(chunk) >= txn_rows or h != hour):
            yield chunk
            chunk = []
        chunk.append(c)
        hour = h
    if chunk:
        yield chunk


class ReplaySource:
    """The generator's change stream replayed as :class:`ChangeEvent` s, with no server.

    Transactions are up to ``txn_rows`` consecutive changes of one UTC clock hour (as
    :func:`apply_changes` commits them); ``ts`` is the transaction's commit time (its last
    change's time, naive UTC); positions are ``replay:<transaction>:<row>``. Reading from a
    position regenerates the stream and skips what lies before it.

    Args:
        scale: the generator's scale.
        txn_rows: changes per transaction.
        schema, table: the names put on the events.
    """

    def __init__(self, scale: float = 1.0, *, txn_rows: int = 500, schema: str = SOURCE_SCHEMA,
                 table: str = SOURCE_TABLE) -> None:
        if txn_rows < 1:
            raise ValueError("txn_rows must be at least 1")
        gen._check_scale(scale)
        self.scale, self.txn_rows = scale, txn_rows
        self.schema, self.table = check_name(schema, "schema"), check_name(table, "table")

    def read(self, start: SourcePosition | None = None) -> Iterator[ChangeEvent]:
        """Changes after ``start`` (a ``replay:…`` position; None: from the first change).

        Raises:
            ValueError: ``start`` is a binlog position, not a replay one.
        """
        if start is not None and start.log_file != REPLAY_LOG:
            raise ValueError(f"{start} is not a replay position")
        for txn, chunk in enumerate(_transactions(gen.changes(self.scale), self.txn_rows)):
            if start is not None and txn < start.log_pos:
                continue
            commit = chunk[-1].ts
            for i, c in enumerate(chunk):
                if start is not None and txn == start.log_pos and i < start.row:
                    continue
                last = i == len(chunk) - 1
                yield ChangeEvent(
                    op=c.op, schema=self.schema, table=self.table, key=c.order_id, before=c.before, after=c.after,
                    ts=commit, position=SourcePosition(REPLAY_LOG, txn, i),
                    next_position=SourcePosition(REPLAY_LOG, txn + 1, 0) if last else SourcePosition(REPLAY_LOG, txn, i + 1))


# -- MariaDB / MySQL ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MySQLConnection:
    """Where the source server is. The password never appears in ``repr``, errors or events.

    Args:
        host, port, user, password: the server and account (the reader needs replication privileges).
    """

    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = field(default="", repr=False)

    @classmethod
    def from_url(cls, url: str) -> MySQLConnection:
        """From ``mysql://user:password@host:port`` (``mariadb://`` and ``mysql+pymysql://`` too).

        Raises:
            ValueError: another scheme, or no host.
        """
        u = urlsplit(url)
        if u.scheme not in ("mysql", "mariadb", "mysql+pymysql", "mariadb+pymysql") or not u.hostname:
            raise ValueError("expected mysql://user:password@host:port")
        return cls(host=u.hostname, port=u.port or 3306, user=unquote(u.username or "root"),
                   password=unquote(u.password or ""))

    def settings(self) -> dict:
        """Keyword arguments for ``pymysql.connect`` and ``BinLogStreamReader``."""
        return {"host": self.host, "port": self.port, "user": self.user, "password": self.password}

    def connect(self, **kwargs):
        """A PyMySQL connection (autocommit off unless asked)."""
        import pymysql

        return pymysql.connect(**self.settings(), **kwargs)


def _mysql_table(schema: str, table: str) -> str:
    return sql.table([check_name(schema, "schema"), check_name(table, "table")]).sql("mysql")


def _mysql_col(name: str) -> str:
    return sql.identifier(check_name(name, "column")).sql("mysql")


def source_ddl(schema: str = SOURCE_SCHEMA, table: str = SOURCE_TABLE) -> list[str]:
    """MySQL statements creating the source database and the orders table (if missing)."""
    t = _mysql_table(schema, table)
    return [
        f"CREATE DATABASE IF NOT EXISTS {sql.identifier(check_name(schema, 'schema')).sql('mysql')}",
        f"CREATE TABLE IF NOT EXISTS {t} ("
        " order_id BIGINT NOT NULL PRIMARY KEY,"
        " customer_id BIGINT NOT NULL,"
        " order_ts DATETIME NOT NULL,"
        " amount DECIMAL(18,2) NOT NULL,"
        " currency CHAR(3) NOT NULL,"
        " payment_method VARCHAR(16) NOT NULL,"
        " shipping_country CHAR(2) NULL,"
        " status VARCHAR(16) NOT NULL,"
        " updated_at DATETIME NOT NULL"
        ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    ]


@dataclass
class ApplyResult:
    """What :func:`apply_changes` wrote (counts in row changes; ``transactions`` committed)."""

    transactions: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0


def _epoch(ts: dt.datetime) -> float:
    return ts.replace(tzinfo=dt.timezone.utc).timestamp()


def apply_changes(conn: MySQLConnection, changes: Iterable[gen.OrderChange], *, schema: str = SOURCE_SCHEMA,
                  table: str = SOURCE_TABLE, txn_rows: int = 500, create: bool = True) -> ApplyResult:
    """Write ``changes`` into ``schema.table`` on a MariaDB/MySQL server, in order.

    One transaction per ``txn_rows`` consecutive changes of one UTC clock hour; runs of inserts
    go in one multi-row ``INSERT``, updates and deletes one statement per row (so the binlog keeps the changes' order). Each
    transaction runs with ``SET timestamp`` at its last change's time, so the binlog events carry
    the generator's commit times (UTC); the session's time zone is set to UTC.

    Args:
        conn: the server.
        changes: e.g. ``generator.changes(scale)``.
        schema, table: where (plain names; created when ``create``).
        txn_rows: changes per transaction (use the same value for :class:`ReplaySource`).

    Returns:
        Counts of what was written.

    Raises:
        dw_dagster.databases.sql.UnsafeIdentifierError: a name is not a plain name.
        pymysql.MySQLError: the server refused a statement (the transaction is rolled back).
    """
    t = _mysql_table(schema, table)
    cols = ", ".join(_mysql_col(c) for c in gen.COLUMNS)
    marks = ", ".join(["%s"] * len(gen.COLUMNS))
    insert = f"INSERT INTO {t} ({cols}) VALUES ({marks})"
    sets = ", ".join(f"{_mysql_col(c)} = %s" for c in gen.COLUMNS if c != gen.KEY)
    update = f"UPDATE {t} SET {sets} WHERE {_mysql_col(gen.KEY)} = %s"
    delete = f"DELETE FROM {t} WHERE {_mysql_col(gen.KEY)} = %s"
    result = ApplyResult()
    con = conn.connect(autocommit=False)
    try:
        with con.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            if create:
                for ddl in source_ddl(schema, table):
                    cur.execute(ddl)
            for chunk in _transactions(changes, txn_rows):
                cur.execute("SET timestamp = %s", (_epoch(chunk[-1].ts),))
                i = 0
                try:
                    while i < len(chunk):
                        op = chunk[i].op
                        j = i
                        while j < len(chunk) and chunk[j].op == op:
                            j += 1
                        run = chunk[i:j]
                        if op == "insert":
                            cur.executemany(insert, [tuple(c.after[k] for k in gen.COLUMNS) for c in run])
                            result.inserts += len(run)
                        elif op == "update":
                            cur.executemany(update, [tuple(c.after[k] for k in gen.COLUMNS if k != gen.KEY) + (c.order_id,)
                                                     for c in run])
                            result.updates += len(run)
                        else:
                            cur.executemany(delete, [(c.order_id,) for c in run])
                            result.deletes += len(run)
                        i = j
                    con.commit()
                except Exception:
                    con.rollback()
                    raise
                result.transactions += 1
            cur.execute("SET timestamp = DEFAULT")
    finally:
        con.close()
    return result


class CdcConfigError(RuntimeError):
    """The server cannot feed row-based CDC: binary logging or its settings, or privileges, are missing."""


#: the server settings :class:`BinlogSource` needs (variable → required value)
REQUIRED_SETTINGS = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}


class BinlogSource:
    """Row changes of one table from a MariaDB/MySQL binary log (``mysql-replication``).

    Args:
        conn: the server; the user needs replication privileges.
        schema, table: the source table (plain names).
        key: its key column.
        server_id: the id this reader registers with; unique among the server's replicas.

    Reading is non-blocking: :meth:`read` returns when it reaches the end of the log. It starts
    from a :class:`SourcePosition` (None: the first event of the oldest binlog still on the
    server, which holds the whole table only if the table was created after binary logging was
    switched on — no initial snapshot is taken).
    """

    def __init__(self, conn: MySQLConnection, *, schema: str = SOURCE_SCHEMA, table: str = SOURCE_TABLE,
                 key: str = gen.KEY, server_id: int = DEFAULT_SERVER_ID) -> None:
        self.conn = conn
        self.schema, self.table = check_name(schema, "schema"), check_name(table, "table")
        self.key = check_name(key, "key column")
        self.server_id = int(server_id)

    def _query(self, q: str) -> list[tuple]:
        con = self.conn.connect(autocommit=True)
        try:
            with con.cursor() as cur:
                cur.execute(q)
                return list(cur.fetchall())
        finally:
            con.close()

    def check_server(self) -> dict[str, str]:
        """The server's binlog settings; raises when one is not what row-based CDC needs.

        Returns:
            ``{variable: value}`` for :data:`REQUIRED_SETTINGS`.

        Raises:
            CdcConfigError: a setting is off (the message names it and the value needed).
        """
        values = {k.lower(): str(v) for k, v in self._query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata')")}
        bad = [f"{k}={values.get(k, '(missing)')} (need {v})" for k, v in REQUIRED_SETTINGS.items()
               if values.get(k, "").upper() != v]
        if bad:
            raise CdcConfigError(f"{self.conn.host}:{self.conn.port} cannot feed row-based CDC: " + ", ".join(bad))
        return values

    def first_position(self) -> SourcePosition:
        """The start of the oldest binlog file on the server.

        Raises:
            CdcConfigError: binary logging is off or the user may not list the logs.
        """
        try:
            logs = self._query("SHOW BINARY LOGS")
        except Exception as e:
            raise CdcConfigError(f"cannot list binary logs: {e}") from e
        if not logs:
            raise CdcConfigError("the server has no binary logs (log_bin off?)")
        return SourcePosition(str(logs[0][0]), 4, 0)

    def current_position(self) -> SourcePosition:
        """The end of the log now: a cursor that reads only changes committed from now on."""
        rows = self._query("SHOW MASTER STATUS")
        if not rows:
            raise CdcConfigError("SHOW MASTER STATUS is empty (log_bin off?)")
        return SourcePosition(str(rows[0][0]), int(rows[0][1]), 0)

    def read(self, start: SourcePosition | None = None) -> Iterator[ChangeEvent]:
        """Row changes after ``start`` until the end of the log (see the module docstring).

        A transaction's changes are yielded once its commit (XID) event has been read, so a
        cursor never points into a transaction that may still be rolled back.

        Raises:
            CdcConfigError: the server settings are wrong (checked first).
            ValueError: ``start`` is a replay position.
        """
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        if start is not None and start.log_file == REPLAY_LOG:
            raise ValueError(f"{start} is a replay position, not a binlog one")
        self.check_server()
        start = start or self.first_position()
        stream = BinLogStreamReader(
            connection_settings=self.conn.settings(), server_id=self.server_id, blocking=False,
            resume_stream=True, log_file=start.log_file, log_pos=start.log_pos,
            only_schemas=[self.schema], only_tables=[self.table], enable_logging=False,
        )
        log_file = start.log_file
        txn_start: int | None = None
        pending: list[tuple[Op, dict | None, dict | None, dt.datetime]] = []
        try:
            for ev in stream:
                pkt = ev.packet
                if isinstance(ev, RotateEvent):
                    log_file = ev.next_binlog
                    continue
                query = _query_text(ev) if isinstance(ev, QueryEvent) else None
                if isinstance(ev, (MariadbGtidEvent, GtidEvent)) or (query == "BEGIN" and txn_start is None):
                    txn_start = pkt.log_pos - pkt.event_size  # where this event starts
                    pending = []  # rows of an unterminated transaction were never committed
                    continue
                if isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                    ts = dt.datetime.fromtimestamp(ev.timestamp, dt.timezone.utc).replace(tzinfo=None)
                    for r in ev.rows:
                        if isinstance(ev, WriteRowsEvent):
                            pending.append(("insert", None, dict(r["values"]), ts))
                        elif isinstance(ev, UpdateRowsEvent):
                            pending.append(("update", dict(r["before_values"]), dict(r["after_values"]), ts))
                        else:
                            pending.append(("delete", dict(r["values"]), None, ts))
                    continue
                if query is not None and query != "COMMIT":
                    txn_start, pending = None, []  # DDL: a transaction of its own, no rows
                    continue
                if not (isinstance(ev, XidEvent) or query == "COMMIT") or txn_start is None:
                    continue
                end, rows, pending = pkt.log_pos, pending, []
                # resuming inside a transaction: its first start.row changes were consumed already
                lo = start.row if (log_file, txn_start) == (start.log_file, start.log_pos) else 0
                for i in range(lo, len(rows)):
                    op, before, after, ts = rows[i]
                    yield ChangeEvent(
                        op=op, schema=self.schema, table=self.table,
                        key=(after if after is not None else before)[self.key], before=before, after=after, ts=ts,
                        position=SourcePosition(log_file, txn_start, i),
                        next_position=(SourcePosition(log_file, end, 0) if i == len(rows) - 1
                                       else SourcePosition(log_file, txn_start, i + 1)))
                txn_start = None
        finally:
            stream.close()


def _query_text(ev) -> str:
    q = ev.query
    if isinstance(q, bytes):
        q = q.decode("utf-8", "replace")
    return str(q).strip().upper()


def source_rows(conn: MySQLConnection, schema: str = SOURCE_SCHEMA, table: str = SOURCE_TABLE) -> dict[int, dict]:
    """The source table now: ``order_id`` → row (every row; for tests and small scales)."""
    con = conn.connect(autocommit=True)
    try:
        with con.cursor() as cur:
            cols = ", ".join(_mysql_col(c) for c in gen.COLUMNS)
            cur.execute(f"SELECT {cols} FROM {_mysql_table(schema, table)}")
            return {r[0]: dict(zip(gen.COLUMNS, r)) for r in cur.fetchall()}
    finally:
        con.close()


__all__ = [
    "ApplyResult", "BinlogSource", "CdcConfigError", "ChangeEvent", "ChangeSource", "MySQLConnection", "ReplaySource",
    "SourcePosition", "apply_changes", "check_name", "check_table_name", "source_ddl", "source_rows",
]
