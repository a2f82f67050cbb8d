"""The volume sensor's row-count history store: one compact row per watched table, in the ledger's database.

Why a store of its own
----------------------

A volume sensor over tens of thousands of tables cannot keep its history in the event log: at
50,000 tables with every table changing between two ticks 30 s apart, one ``AssetObservation``
per changed count is 144 million events a day, and rebuilding the history of 50,000 assets from
the event log costs ~2 ms per asset (100 s, beyond Dagster's sensor evaluation timeout). So the
history lives in table ``dw_volume_history`` of the ledger's database (the Dagster instance's own
storage, :func:`dw_dagster.core.ledger.ledger_for`: ``dw_ledger.db`` beside a SQLite instance, the
same PostgreSQL database as ``dagster-postgres``, in memory for an ephemeral instance):

========================  ==========================================================================
column                    what it holds
========================  ==========================================================================
``sensor``                the volume sensor's name; with ``spec_id`` the primary key, so two sensors
                          (two code locations) watching one table keep their own histories
``spec_id``               the spec id (``database:table[#partition_column]``)
``entries``               JSON ``[[partition or null, rows], ...]``, oldest first: at most
                          ``history_length`` counts (``history_length + 1`` partitions for a
                          partitioned spec) - the store never grows with time
``recorded_at``           epoch seconds of the newest recorded count
``observed_at``           epoch seconds of the newest count shown as an ``AssetObservation``
``observed_status``       that observation's status
``unobserved``            counts recorded since then and not shown one by one
``last_status``           the status of the newest recorded count
``previous``              JSON of the history the writing tick started from (all of the above), or
                          null: what a rebuild reads when that tick's result was not kept
``updated_at``            epoch seconds of the write
``writer``                the id of the tick that wrote the row (its cursor names it)
``parent``                the id of the tick that tick started from (null: it had no cursor)
========================  ==========================================================================

One row per watched table, rewritten when its history changes: the store's size is bounded by
the number of tables (≈ 1 KB per table with 28 counts, ``previous`` included: 50 MB at 50,000 tables), whatever
the number of ticks.

When it is written
------------------

The tick that records counts writes the histories it changed before it returns, in one
transaction: one upsert (``INSERT ... ON CONFLICT (spec_id) DO UPDATE``, SQLite and PostgreSQL)
compiled once and executed for the rows in batches of 1,000, so a restarted code server loses
nothing. A tick the daemon evaluates again with the previous cursor (it failed to store the
result) scores from the in-process snapshot that cursor names, not from the store, and writes the
same tables again. A tick whose result Dagster never keeps (a "Test sensor" evaluation in the UI,
a daemon that died before storing the result) has written the store all the same:
each row keeps the history its tick started from (``previous``) and names its tick (``writer``) and
the tick that one started from (``parent``, the writer its input cursor named). Each tick's cursor
names the tick itself; the next tick marks that one kept (``dw_volume_kept``: Dagster stored its
result). A rebuild reads the row of a tick no cursor named as its ``previous``, so the next kept
tick records and shows those counts again; no clock is compared (see :meth:`VolumeHistoryStore.load`
for the rebuild without a cursor). Rows written before the store named its writers are judged by
the cursor's ``at`` against their ``updated_at``, as before. A store that cannot be written (a lock another session holds for more than
:data:`WRITE_WAIT_S` seconds, a dropped table is created again first) is logged and named in the
tick's summary; the in-process history keeps the counts and the next tick writes them. A
hand-edited row that is not what this module writes is left out when read, and the tick's
summary names it (the table is rebuilt from its observations).

When it is read
---------------

Only when the in-process history cache does not hold the snapshot the cursor names (a new code
server, another replica, a lost cursor): one ``SELECT`` per 1,000 spec ids. Tables the store does
not know yet are rebuilt from their volume observations (a deployment that upgrades keeps its
history), and only those whose asset has any event at all (one batched asset-record read
decides: a table nobody ever recorded costs nothing). That read costs ~2 ms per asset, so it is
spread over ticks: each tick reads for at most ``REBUILD_BUDGET_S`` seconds, and a table whose
history is still unread is not scored until it is (status ``history_pending`` in the tick's
summary).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import weakref
from types import SimpleNamespace
from collections.abc import Callable, Iterable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dw_dagster.core import keys as c
from dw_dagster.detection.volume.counts import MAX_SPEC_ID_CHARS
from dw_dagster.detection.volume.history import TableHistory

_meta = sa.MetaData()

#: the longest sensor name the store keys rows by (Dagster's names are far shorter)
MAX_SENSOR_CHARS = 128

history_t = sa.Table(
    "dw_volume_history", _meta,
    sa.Column("sensor", sa.String(MAX_SENSOR_CHARS), primary_key=True),
    sa.Column("spec_id", sa.String(MAX_SPEC_ID_CHARS), primary_key=True),
    sa.Column("entries", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.Float, nullable=True),
    sa.Column("observed_at", sa.Float, nullable=True),
    sa.Column("observed_status", sa.String(32), nullable=True),
    sa.Column("unobserved", sa.Integer, nullable=False, default=0),
    sa.Column("last_status", sa.String(32), nullable=True),
    sa.Column("previous", sa.Text, nullable=True),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("writer", sa.String(32), nullable=True),
    sa.Column("parent", sa.String(32), nullable=True),
)

#: ticks whose result Dagster kept (a later tick's cursor named them), each with the tick it started from
#: (``parent``, "" for none): a row whose writer is not here but a sibling of it is was written by a tick
#: Dagster threw away
kept_t = sa.Table(
    "dw_volume_kept", _meta,
    sa.Column("sensor", sa.String(MAX_SENSOR_CHARS), primary_key=True),
    sa.Column("writer", sa.String(32), primary_key=True),
    sa.Column("parent", sa.String(32), nullable=False),
    sa.Column("at", sa.Float, nullable=False),
)

#: marks between two prunings of the writers no store row names any more (per process and database)
PRUNE_EVERY = 200

#: spec ids per SELECT / rows per upsert statement
CHUNK = 1000

#: seconds a tick spends at most rebuilding histories from observations (the rest wait for later ticks)
REBUILD_BUDGET_S = 20.0

#: KiB of SQLite page cache for a store write (the connection's, freed when it closes)
WRITE_CACHE_KIB = 65536

#: seconds a store write waits at most for a lock another session holds (then it fails and is retried
#: next tick): well inside Dagster's 60 s sensor evaluation timeout
WRITE_WAIT_S = 10.0

_created: "weakref.WeakSet[Engine]" = weakref.WeakSet()
_marks: "weakref.WeakKeyDictionary[Engine, int]" = weakref.WeakKeyDictionary()


def _upgrade(engine: Engine) -> None:
    """A ``dw_volume_history`` from before the store was keyed by sensor (no ``sensor`` column, ``spec_id``
    alone the key) is renamed aside, ``dw_volume_history_before_sensor_<time>``, and a new one created: the
    store is a cache of what the volume observations hold, rebuilt from them (module docstring), and the old
    rows are kept. One without ``previous``, ``writer`` or ``parent`` (and with ``sensor``) gains the column."""
    inspector = sa.inspect(engine)
    if not inspector.has_table(history_t.name):
        return
    have = {col["name"] for col in inspector.get_columns(history_t.name)}
    quote = engine.dialect.identifier_preparer.quote
    with engine.begin() as conn:
        if "sensor" not in have:
            aside = f"{history_t.name}_before_sensor_{int(time.time())}"
            conn.exec_driver_sql(f"ALTER TABLE {quote(history_t.name)} RENAME TO {quote(aside)}")
            return
        for column in ("previous", "writer", "parent"):
            if column not in have:
                conn.exec_driver_sql(f"ALTER TABLE {quote(history_t.name)} ADD COLUMN {column} "
                                     f"{history_t.c[column].type.compile(dialect=engine.dialect)}")


def _ensure(engine: Engine) -> None:
    if engine in _created:
        return
    for attempt in range(5):
        try:
            _upgrade(engine)
            _meta.create_all(engine, checkfirst=True)
            break
        except (sa.exc.OperationalError, sa.exc.ProgrammingError, sa.exc.IntegrityError):
            if attempt == 4:  # another process creating the same table at the same moment
                raise
            time.sleep(0.2 * (attempt + 1))
    _created.add(engine)


# one encoder for every row (json.dumps with separators builds a new one per call)
_json = json.JSONEncoder(separators=(",", ":")).encode


def _encode(h: TableHistory) -> str:
    return _json([[p, r] for p, r in h.entries])


def _encode_whole(h: TableHistory | None) -> str | None:
    if h is None:
        return None
    return _json({"entries": [[p, r] for p, r in h.entries], "recorded_at": h.recorded_at,
                       "observed_at": h.observed_at, "observed_status": h.observed_status, "unobserved": h.unobserved,
                       "last_status": h.last_status})


def _decode_whole(text: str) -> TableHistory:
    """A ``previous`` column (:func:`_encode_whole`); ``ValueError`` for anything else."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError("previous is not a JSON object with entries")
    return _history(SimpleNamespace(**{**dict.fromkeys(_WHOLE), **data, "entries": json.dumps(data["entries"])}))


_WHOLE = ("recorded_at", "observed_at", "observed_status", "unobserved", "last_status")


def _decode(text: str) -> tuple[tuple[str | None, int], ...]:
    """The entries this module writes: a JSON list of ``[partition or null, rows >= 0]`` pairs.

    Raises:
        ValueError: anything else (a hand-edited row: not JSON, not a list of pairs, a count that
            is not a non-negative integer, a partition that is not text)."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("entries is not a JSON list")
    out = []
    for e in data:
        if not (isinstance(e, list) and len(e) == 2):
            raise ValueError(f"entry {e!r} is not a [partition, rows] pair")
        p, r = e
        if p is not None and not isinstance(p, str):
            raise ValueError(f"partition {p!r} is not text or null")
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"row count {r!r} is not an integer >= 0")
        out.append((p, r))
    return tuple(out)


def _time(v: object, what: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{what} {v!r} is not epoch seconds")
    return float(v)


def _text(v: object, what: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{what} {v!r} is not text")
    return v


def _history(r) -> TableHistory:
    """A store row as a :class:`TableHistory`; ``ValueError`` when any column is not what :meth:`VolumeHistoryStore.save` writes."""
    unobserved = 0 if r.unobserved is None else r.unobserved
    if isinstance(unobserved, bool) or not isinstance(unobserved, int) or unobserved < 0:
        raise ValueError(f"unobserved {unobserved!r} is not an integer >= 0")
    return TableHistory(entries=_decode(r.entries), recorded_at=_time(r.recorded_at, "recorded_at"),
                        observed_at=_time(r.observed_at, "observed_at"),
                        observed_status=_text(r.observed_status, "observed_status"), unobserved=unobserved,
                        last_status=_text(r.last_status, "last_status"))


class _Kept:
    """Whether a store row comes from a tick whose result Dagster kept (:meth:`VolumeHistoryStore.load`)."""

    def __init__(self, writers: set[str], parents: set[str], kept_until: float | None, reader: str) -> None:
        if reader not in ("latest", "cursor", "no_cursor"):
            raise ValueError(f"reader must be 'latest', 'cursor' or 'no_cursor', got {reader!r}")
        self.writers, self.parents, self.kept_until, self.reader = writers, parents, kept_until, reader

    def __call__(self, r) -> bool:
        if r.writer is None:  # written before the store named its writers: by time
            return self.kept_until is None or (_time(r.updated_at, "updated_at") or 0.0) <= self.kept_until
        if r.writer in self.writers:
            return True
        # a tick that started where it did was kept instead (ticks with no cursor are no siblings of each other)
        sibling_kept = bool(r.parent) and r.parent in self.parents
        if self.reader == "latest":
            return not sibling_kept
        if self.reader == "no_cursor":
            return bool(r.parent) and r.parent in self.writers and not sibling_kept
        return False


def _insert(engine: Engine):
    """The dialect's ``insert`` (with ``ON CONFLICT``): SQLite's or PostgreSQL's."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif engine.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    else:
        raise ValueError(f"the volume history store needs SQLite or PostgreSQL, not {engine.dialect.name}")
    return insert


def _missing(error: sa.exc.DBAPIError) -> bool:
    """True when ``error`` says the store's table is not there (dropped while this process had
    created it): SQLite's "no such table", PostgreSQL's SQLSTATE 42P01. Read from the error, never
    by asking the database (which would wait for the very lock that may have caused it)."""
    orig = error.orig
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code == "42P01" or "no such table" in str(orig)


class VolumeHistoryStore:
    """The ``dw_volume_history`` table of one database (see the module docstring).

    Args:
        engine: a SQLAlchemy engine on SQLite or PostgreSQL (the ledger's: ``ledger_for(instance).engine``).
        sensor: the volume sensor whose rows :meth:`load` and :meth:`save` read and write (at most
            :data:`MAX_SENSOR_CHARS` characters).

    Raises:
        ValueError: ``sensor`` is empty or too long.
        sqlalchemy.exc.SQLAlchemyError: the database refuses the table.
    """

    def __init__(self, engine: Engine, sensor: str = c.VOLUME_SENSOR) -> None:
        if not sensor or len(sensor) > MAX_SENSOR_CHARS:
            raise ValueError(f"sensor name must be 1 to {MAX_SENSOR_CHARS} characters, got {len(sensor)}")
        self.engine = engine
        self.sensor = sensor
        _ensure(engine)

    def load(self, spec_ids: Iterable[str], on_error: Callable[[str], None] | None = None, *,
             kept_until: float | None = None, reader: str = "latest") -> dict[str, TableHistory]:
        """This sensor's stored history of each of ``spec_ids`` the store holds (absent ids are left out).

        One ``SELECT`` per :data:`CHUNK` ids. A row that is not what :meth:`save` writes (a
        hand-edited one: ``entries`` not a JSON list of ``[partition, rows >= 0]`` pairs, text in a
        time or count column) is left out too, and ``on_error`` is told its spec id and why (the
        table is rebuilt from its observations instead). A store table dropped while the process
        runs is created again (nothing is read from it).

        Args:
            spec_ids: the tables' spec ids.
            on_error: told (one line) about each row left out and about rows read as their ``previous``.
            kept_until: for a row written before the store named its writers (``writer`` null): epoch
                seconds the last tick whose result Dagster kept ended (the cursor's); such a row
                written after it is read as its ``previous``. None: such rows as written.
            reader: which rows whose writer no later tick's cursor has named yet (:meth:`mark_kept`)
                are read as written. ``"latest"`` (a reader such as the CLI): those of the newest
                ticks, unless a tick that started where they did was kept instead. ``"cursor"`` (the
                sensor's rebuild, its cursor's tick marked first): none. ``"no_cursor"`` (the sensor's
                rebuild with no cursor to say which tick was kept): those of a tick that started from a
                kept one, unless a sibling was kept instead - the last kept tick's, or a "Test sensor"
                run's right before the cursor was deleted, which cannot be told apart - and never
                those of a tick that started from none (a "Test sensor" before the first tick).

        A row read as not kept is read as the history its tick started from (left out when it
        started from none).
        """
        ids = list(dict.fromkeys(spec_ids))
        out: dict[str, TableHistory] = {}
        unkept = 0
        try:
            with self.engine.connect() as conn:
                marks = conn.execute(sa.select(kept_t.c.writer, kept_t.c.parent).where(kept_t.c.sensor == self.sensor)).all()
                kept = _Kept({w for w, _ in marks}, {p for _, p in marks}, kept_until, reader)
                for start in range(0, len(ids), CHUNK):
                    chunk = ids[start:start + CHUNK]
                    for r in conn.execute(sa.select(history_t).where(history_t.c.sensor == self.sensor,
                                                                     history_t.c.spec_id.in_(chunk))):
                        try:
                            if not kept(r):
                                unkept += 1
                                if r.previous is not None:
                                    out[r.spec_id] = _decode_whole(r.previous)
                                continue
                            out[r.spec_id] = _history(r)
                        except (ValueError, TypeError, OverflowError) as e:
                            if on_error:
                                on_error(f"row-count history store: the row of {r.spec_id} is left out "
                                         f"(rebuilt from its observations): {e}")
                if unkept and on_error:
                    on_error(f"row-count history store: {unkept} tables were last written by a tick whose result "
                             "was not kept (a test evaluation?): their counts are recorded again")
        except (sa.exc.OperationalError, sa.exc.ProgrammingError) as e:
            if not _missing(e):
                raise
            _created.discard(self.engine)
            _ensure(self.engine)
            return {}
        return out

    def mark_kept(self, writer: str, parent: str | None) -> None:
        """Record that the tick ``writer`` (started from tick ``parent``) was kept: a tick's cursor named it,
        so Dagster stored its result. Every :data:`PRUNE_EVERY` marks, the marks no row of this sensor
        needs any more (its writer writes no row and starts none, its parent starts none) are forgotten.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database refuses the write."""
        stmt = _insert(self.engine)(kept_t).values(sensor=self.sensor, writer=writer, parent=parent or "", at=time.time())
        stmt = stmt.on_conflict_do_nothing(index_elements=[kept_t.c.sensor, kept_t.c.writer])
        n = _marks[self.engine] = _marks.get(self.engine, 0) + 1
        with self._writing() as conn:
            conn.execute(stmt)
            if n % PRUNE_EVERY == 0:
                mine = history_t.c.sensor == self.sensor
                writers = sa.select(history_t.c.writer).where(mine, history_t.c.writer.is_not(None))
                parents = sa.select(history_t.c.parent).where(mine, history_t.c.parent.is_not(None))
                conn.execute(sa.delete(kept_t).where(kept_t.c.sensor == self.sensor, kept_t.c.writer != writer,
                                                     kept_t.c.writer.not_in(writers), kept_t.c.writer.not_in(parents),
                                                     kept_t.c.parent.not_in(parents)))

    @contextlib.contextmanager
    def _writing(self):
        """A transaction that waits at most :data:`WRITE_WAIT_S` for another session's lock."""
        with self.engine.connect() as conn:
            wait_ms = int(WRITE_WAIT_S * 1000)
            if self.engine.dialect.name == "sqlite":  # before BEGIN, which is where SQLite waits
                driver = conn.connection.driver_connection
                driver.execute(f"PRAGMA busy_timeout = {wait_ms}")
                # a page cache the size of a large tick's rows: with SQLite's 2 MB default, an upsert of 50,000
                # rows re-read its pages from the file (13.4 against 8.5 us a row at 5,000; 9.8 with this)
                driver.execute(f"PRAGMA cache_size = {-WRITE_CACHE_KIB}")
            with conn.begin():
                if self.engine.dialect.name == "postgresql":  # PostgreSQL waits for a row lock forever
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {wait_ms}")
                yield conn

    def save(self, histories: Mapping[str, TableHistory],
             previous: Mapping[str, TableHistory | None] | None = None, writer: str | None = None,
             parent: str | None = None) -> int:
        """Upsert this sensor's ``histories`` (spec id → history); one statement per :data:`CHUNK` rows, one transaction.

        A store table dropped while the process runs is created again and written.

        Args:
            histories: spec id → the history to store.
            previous: spec id → the history the writing tick started from (kept beside it, read by
                :meth:`load` when that tick's result was not kept); missing ids keep none.
            writer: the writing tick's id (the one its cursor names; :meth:`mark_kept`).
            parent: the id of the tick it started from (its input cursor's ``writer``).

        Returns:
            Rows written.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database refuses the write (a lock held by another
                session for more than :data:`WRITE_WAIT_S` seconds, unreachable); nothing of this
                call is written."""
        if not histories:
            return 0
        now = time.time()
        before = previous or {}
        rows = [{"sensor": self.sensor, "spec_id": sid, "entries": _encode(h), "previous": _encode_whole(before.get(sid)), "recorded_at": h.recorded_at, "observed_at": h.observed_at,
                 "observed_status": h.observed_status, "unobserved": h.unobserved, "last_status": h.last_status,
                 "updated_at": now, "writer": writer, "parent": parent}
                for sid, h in histories.items()]
        stmt = _insert(self.engine)(history_t)
        stmt = stmt.on_conflict_do_update(
            index_elements=[history_t.c.sensor, history_t.c.spec_id],
            set_={c: stmt.excluded[c] for c in ("entries", "recorded_at", "observed_at", "observed_status",
                                                "unobserved", "last_status", "previous", "updated_at", "writer",
                                                "parent")})
        for attempt in (0, 1):
            try:
                with self._writing() as conn:  # one statement compiled once, executed for many rows (executemany)
                    for start in range(0, len(rows), CHUNK):
                        conn.execute(stmt, rows[start:start + CHUNK])
                return len(rows)
            except (sa.exc.OperationalError, sa.exc.ProgrammingError) as e:
                if attempt or not _missing(e):
                    raise
                _created.discard(self.engine)  # the table was dropped while this process ran: create it again
                _ensure(self.engine)
        raise AssertionError("unreachable")

    def search(self, contains: str | None = None, limit: int = 1000) -> list[tuple[str, str, TableHistory]]:
        """Stored histories of every sensor whose spec id contains ``contains`` (case-insensitive;
        None: all): ``[(sensor, spec_id, history)]`` ordered by spec id then sensor, at most ``limit``
        (rows that do not decode are left out). One query: an ASCII ``contains`` is a ``LIKE`` pattern
        (a bound parameter, ``%``, ``_`` and ``\\`` matched literally); any other is matched in Python
        on the spec ids (SQLite's ``lower()`` folds ASCII letters only, so ``Ü`` would never match ``ü``)."""
        q = sa.select(history_t).order_by(history_t.c.spec_id, history_t.c.sensor)
        python_match = bool(contains) and not contains.isascii()  # type: ignore[union-attr]
        if contains and not python_match:
            escaped = contains.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            q = q.where(sa.func.lower(history_t.c.spec_id).like(f"%{escaped}%", escape="\\"))
        if not python_match:
            q = q.limit(limit)
        out = []
        with self.engine.connect() as conn:
            for r in conn.execute(q):
                if python_match and contains.casefold() not in r.spec_id.casefold():  # type: ignore[union-attr]
                    continue
                try:
                    out.append((r.sensor, r.spec_id, _history(r)))
                except (ValueError, TypeError, OverflowError):
                    continue
                if len(out) >= limit:
                    break
        return out

    def size(self) -> tuple[int, int]:
        """(rows, bytes of their ``spec_id`` and ``entries`` text): what the store holds."""
        with self.engine.connect() as conn:
            n, b = conn.execute(sa.select(sa.func.count(), sa.func.coalesce(
                sa.func.sum(sa.func.length(history_t.c.entries) + sa.func.length(history_t.c.spec_id)), 0))).one()
        return int(n), int(b)


def store_for(instance, sensor: str = c.VOLUME_SENSOR) -> VolumeHistoryStore:
    """The history store of volume sensor ``sensor`` in the ledger database of a Dagster instance.

    Raises:
        dw_dagster.core.ledger.LedgerError: the instance's storage cannot hold the ledger."""
    from dw_dagster.core.ledger import ledger_for

    return VolumeHistoryStore(ledger_for(instance).engine, sensor)


def assets_with_records(instance, asset_keys: Sequence) -> set:
    """The asset keys among ``asset_keys`` that have any event in ``instance`` (one batched asset-record read per :data:`CHUNK` keys)."""
    out = set()
    keys = list(dict.fromkeys(asset_keys))
    for start in range(0, len(keys), CHUNK):
        out.update(rec.asset_entry.asset_key for rec in instance.get_asset_records(keys[start:start + CHUNK]))
    return out
