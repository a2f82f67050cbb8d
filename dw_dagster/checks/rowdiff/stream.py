"""The streaming path of the cross-database diff: each side's rows read once, compared in a local DuckDB.

:func:`~dw_dagster.checks.rowdiff.row_diff_across` has two transfers. **bisect** (hash-and-bisect,
:mod:`.hashdiff`) has each engine hash its rows and sum the hashes per bucket, then downloads only
the differing buckets' rows: few bytes on the wire, but every row is hashed by the source engine
(md5 on PostgreSQL, about 1 µs a row) and each table is read two or three times. **stream** reads
every row of each side once and compares them locally: a PostgreSQL side with
``COPY (SELECT key, columns FROM t [WHERE sample]) TO STDOUT (FORMAT binary)`` (the ADBC PostgreSQL
driver decodes the binary COPY into Arrow in C; the ``SELECT`` is built with sqlglot from the
diff's projection, and sends each ``numeric`` column as the server's text, cast back to the exact
decimal locally). The rows land in a local DuckDB database (``memory_limit`` :data:`LOCAL_MEMORY`,
spilling to a temporary directory); when the other side is a DuckDB file, the file is attached to it
read-only and its table diffed where it is, not copied. They are diffed there by the same typed comparison the bisect path runs on the rows it downloads
(:func:`~.joindiff._diff_typed`), in passes of about ``pass_rows`` rows split by the hash of the
key (each pass a full outer join of its share of keys), so the memory held stays bounded however
large the tables are. Same rules, same result shape: identical key sets.

``transfer="auto"`` measures before it chooses (:func:`probe_mbps`): a probe reads
:data:`PROBE_ROWS` rows of the PostgreSQL side through the stream and times it, and the source
hashes the same rows the bisect path's way (both timings kept per database for
:data:`PROBE_TTL_S`); when the stream took at most twice as long (the bisect
path reads the source at least twice) — a LAN, loopback — the stream runs, else (a WAN between the
data centre and the cloud, where bytes on the wire are what costs) the hash-and-bisect path; a
``stream_min_mbps`` given instead compares the measured MB/s with it. The result says which ran (``transfer``), the probe's rate
(``transfer_probe_mbps``) and the bytes moved (``bytes_fetched``: Arrow buffer bytes of what came
from the two databases, the same measure on both paths).
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import sqlglot

from dw_dagster.checks.rowdiff.rules import RowDiffResult, timestamp_rule
from dw_dagster.databases import Database, DatabaseError

TRANSFERS = ("auto", "stream", "bisect")
#: rows (estimated from the catalog, times the sample's share) below which ``auto`` bisects without a
#: probe: the stream's fixed cost (a connection, a local engine) outweighs a small read
STREAM_MIN_ROWS = 200_000
#: rows the bandwidth probe reads, and the rows of its first, latency-only read
PROBE_ROWS, PROBE_BASE_ROWS = 50_000, 1_000
#: seconds a database's measured rate is reused (a wave of table pairs probes each database once)
PROBE_TTL_S = 300.0
_probed: dict[str, tuple[float, tuple[float, float, int]]] = {}
# seconds the source took to hash the probe's rows the bisect path's way, kept beside its probe (same TTL)
_hashed: dict[str, float] = {}
_probe_lock = threading.Lock()
#: the local DuckDB's memory limit (it spills to its temporary directory beyond). Measured at 10M rows a side
#: (PostgreSQL into a DuckDB file's connection, 2 cores; the process's peak with a 100,000-entry sample): 1GB
#: 7.1 s and 1,452 MB, 512MB 8.8 s and 1,077 MB, 320MB 7.9 s and 888 MB, 256MB 8.5 s and 835 MB (±1 s from
#: run to run): spilling costs little, the peak follows the limit
LOCAL_MEMORY = "320MB"
#: rows (both sides together) diffed per pass by default: each pass reads both local tables again (its share
#: of keys by hash), while the join spills beyond :data:`LOCAL_MEMORY` by itself. Measured at 10M rows a
#: side (PostgreSQL 15 on loopback against DuckDB, 2 cores): one pass 17.5 s, passes of 2M rows 29.9 s (ten
#: passes), the same peak memory (940 MB)
STREAM_PASS_ROWS = 20_000_000
# PostgreSQL types the stream reads into the same local types as the bisect path's download
_PG_TYPES = {"int2", "int4", "int8", "float4", "float8", "numeric", "text", "varchar", "bpchar", "name", "bool",
             "date", "timestamp", "timestamptz", "bytea"}


class StreamUnavailable(DatabaseError):
    """The streaming path cannot read a side (why, in the message): ``auto`` takes the bisect path."""


def _adbc_uri(db: Database) -> str:
    """A libpq URI for the PostgreSQL database behind ``db`` (a :class:`~dw_dagster.databases.SqlAlchemyDatabase`)."""
    engine = getattr(db, "_engine", None)
    if engine is None:
        inner = getattr(db, "_db", None)  # a wrapper (the migration's catalog cache)
        engine = getattr(inner, "_engine", None)
    if engine is None:
        raise StreamUnavailable(f"{db.name}: no connection URL to stream from")
    uri = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    base, sep, query = uri.partition("?")  # SQLAlchemy writes a space in a query value as '+', libpq wants %20
    return base + sep + query.replace("+", "%20")


def streamable(db: Database) -> str | None:
    """Why ``db`` cannot be streamed, or None: PostgreSQL (through the ADBC driver) and DuckDB can."""
    if db.dialect == "duckdb":
        return None
    if db.dialect != "postgres":
        return f"{db.name}: no streaming reader for {db.dialect}"
    try:
        import adbc_driver_postgresql.dbapi  # noqa: F401
    except ImportError:
        return "the ADBC PostgreSQL driver is not installed (pip install 'dw-dagster[postgres]')"
    try:
        _adbc_uri(db)
    except StreamUnavailable as e:
        return str(e)
    return None


def _select(db: Database, rel: str, limit: int | None = None) -> str:
    q = sqlglot.parse_one(f"SELECT * FROM {rel} AS dw_x", read="duckdb")
    if limit is not None:
        q = q.limit(int(limit))
    return q.sql(dialect=db.dialect)


class _Reader:
    """One side's rows as an Arrow record batch reader, counting the Arrow bytes that came through."""

    def __init__(self, db: Database, select: str, types: dict[str, str]) -> None:
        self.db, self.select, self.types, self.bytes, self.rows = db, select, types, 0, 0
        self._con = None
        #: PostgreSQL numeric columns read as text -> their (precision, scale), None when unconstrained
        self.numeric: dict[str, tuple[int, int] | None] = {}
        self.started = 0.0  # when the query was sent (after the connection opened)

    @property
    def statement(self) -> str:
        if self.db.dialect == "postgres":
            return f"COPY ({self.select}) TO STDOUT (FORMAT binary)"
        return self.select

    def reader(self):
        import pyarrow as pa

        if self.db.dialect == "postgres":
            import adbc_driver_postgresql.dbapi as pgdb

            try:
                self._con = pgdb.connect(_adbc_uri(self.db))
            except Exception as e:  # the driver's errors
                raise StreamUnavailable(f"{self.db.name}: the stream could not connect: {str(e).splitlines()[0]}") from e
            cur = self._cur = self._con.cursor()  # held: the reader closes with its cursor
            self.started = time.perf_counter()
            try:
                self._plan_numeric(cur)
                cur.execute(self.select)  # the driver reads it with COPY (...) TO STDOUT (FORMAT binary)
                src = cur.fetch_record_batch()
            except StreamUnavailable:
                raise
            except Exception as e:  # the driver's errors
                raise DatabaseError(f"{self.db.name}: stream failed: {str(e).splitlines()[0]}\n  SQL: {self.select[:300]}") from e
            schema = src.schema
            batches: Iterator = iter(src)
        else:
            first = self.db.fetch_batches(self.select)
            batches = iter(first)
            head = next(batches, None)
            if head is None:
                return None
            schema = head.schema
            batches = _chain(head, batches)

        def counted():
            for b in batches:
                self.bytes += b.nbytes
                self.rows += b.num_rows
                yield b

        return pa.RecordBatchReader.from_batches(schema, counted())

    def _plan_numeric(self, cur) -> None:
        """Read the result's schema first (no rows): refuse a type the stream cannot read, and have PostgreSQL send
        each ``numeric`` column as its text (kept in :attr:`numeric` with its precision and scale). The driver
        decodes a binary ``numeric`` into text itself, about 0.5 µs a value: at 10M rows that read took 8.8 s
        against 4.9 s for the server's own text (measured on loopback, PostgreSQL 15, 2 cores)."""
        from dw_dagster.databases import sql

        schema = cur.adbc_execute_schema(self.select)
        bad = [f"{f.name} ({_pg_type(f)})" for f in schema if _pg_type(f) not in _PG_TYPES]
        if bad:
            raise StreamUnavailable(f"{self.db.name}: no stream reader for column type(s) {', '.join(bad)}")
        self.numeric = {f.name: _numeric(f) for f in schema if _pg_type(f) == "numeric"}
        if self.numeric:
            q = lambda n: sql.identifier(n).sql("postgres")  # noqa: E731
            cols = ", ".join(f"CAST({q(f.name)} AS TEXT) AS {q(f.name)}" if f.name in self.numeric else q(f.name)
                             for f in schema)
            self.select = f"SELECT {cols} FROM ({self.select}) AS dw_n"

    def close(self) -> None:
        if self._con is not None:
            self._cur.close()
            self._con.close()
            self._con = None


def _aliased(plan, types) -> dict[str, str]:
    """Alias -> type of the diff's projection (keys, then compared columns)."""
    return {a: types.get(a) or "VARCHAR" for a in [*plan.keys, *plan.columns]}


def _chain(head, rest):
    yield head
    yield from rest


def _pg_type(field) -> str:
    meta = field.metadata or {}
    return (meta.get(b"POSTGRESQL:type") or meta.get(b"ADBC:postgresql:typname") or b"?").decode()


def _numeric(field) -> tuple[int, int] | None:
    """(precision, scale) of a PostgreSQL ``numeric(p, s)`` column from its typmod, None when unconstrained or
    when the scale is outside ``0..p`` (PostgreSQL 15 allows ``numeric(5, -2)`` and ``numeric(3, 5)``: its
    typmod holds the scale as 11 signed bits); such a column is read like an unconstrained one."""
    raw = (field.metadata or {}).get(b"POSTGRESQL:typmod")
    mod = int(raw) if raw else -1
    if mod < 4:
        return None
    precision, scale = ((mod - 4) >> 16) & 0xFFFF, (((mod - 4) & 0x7FF) ^ 0x400) - 0x400
    return (precision, scale) if 0 <= scale <= precision else None


def _load(local, name: str, side: _Reader) -> None:
    """Create local table ``name`` (in ``local``'s :attr:`~_Local.schema`) from one side's stream
    (PostgreSQL ``numeric`` cast back from its exact text)."""
    from dw_dagster.databases import sql

    con = local.con.cursor()
    table = f"{local.schema}.{name}"
    try:
        rdr = side.reader()
        if rdr is None:  # a DuckDB side with no rows: an empty table of its catalog's types
            defs = ", ".join(f"{sql.identifier(c).sql('duckdb')} {t}" for c, t in side.types.items())
            con.execute(f"CREATE TABLE {table} ({defs})")
            return
        cols, unconstrained = [], []
        for f in rdr.schema:
            q = sql.identifier(f.name).sql("duckdb")
            if f.name in side.numeric:
                ps = side.numeric[f.name]
                if ps is not None and ps[0] <= 38:
                    cols.append(f"CAST({q} AS DECIMAL({ps[0]}, {ps[1]})) AS {q}")
                    continue
                unconstrained.append(q)
            cols.append(q)
        con.register(f"{name}_arrow", rdr)
        try:
            con.execute(f"CREATE TABLE {table} AS SELECT {', '.join(cols)} FROM {name}_arrow")
        except Exception as e:  # duckdb's error classes; a numeric NaN or Infinity is no DuckDB decimal
            if "Conversion Error" in str(e):
                raise StreamUnavailable(f"{side.db.name}: a value the stream cannot hold locally: {str(e).splitlines()[0]}") from e
            raise DatabaseError(f"{side.db.name}: stream failed: {str(e).splitlines()[0]}\n  SQL: {side.statement[:300]}") from e
        con.unregister(f"{name}_arrow")
        for q in unconstrained:  # numeric without a usable typmod: the exact decimal of the widest scale read
            _exact_decimal(con, table, q, side.db.name)
    finally:
        con.close()
        side.close()


def _exact_decimal(con, table: str, q: str, db_name: str) -> None:
    """Column ``q`` (numeric text) of ``table`` as ``DECIMAL(38, s)``, ``s`` the widest scale read; refused
    (:class:`StreamUnavailable`) when a value would not fit exactly: more than 38 digits or a scale above 37
    would be rounded without a word, and NaN or Infinity is no decimal."""
    (scale, whole), = con.execute(f"SELECT COALESCE(MAX(LENGTH(SPLIT_PART({q}, '.', 2))), 0), "
                                  f"COALESCE(MAX(LENGTH(SPLIT_PART(LTRIM({q}, '-'), '.', 1))), 0) FROM {table}").fetchall()
    if int(scale) > 37 or int(whole) + int(scale) > 38:
        raise StreamUnavailable(f"{db_name}: numeric column {q} holds values of {int(whole)} integer and {int(scale)} "
                                "decimal digits, beyond DuckDB's DECIMAL(38): compared exactly only by the bisect path")
    try:
        con.execute(f"ALTER TABLE {table} ALTER {q} TYPE DECIMAL(38, {int(scale)})")
    except Exception as e:  # NaN or Infinity: not a DuckDB decimal
        raise StreamUnavailable(f"{db_name}: numeric column {q} does not fit DECIMAL(38): {str(e).splitlines()[0]}") from e


class _Local:
    """The local DuckDB of the stream: a private in-memory instance (``memory_limit`` the lower of
    :data:`LOCAL_MEMORY` and the DuckDB side's own, spilling to a temporary directory), so no setting of
    another connection is touched.

    With ``beside`` (a DuckDB side), that side's file is attached read-only as the default catalog
    (:attr:`attached`), and its table is diffed where it is rather than copied first (at 10M rows a side:
    7.9 s against 10.2 s); the streamed tables live in ``memory.main``. Read-only, the file is locked
    against writers for the diff, so every step reads the same rows. When this process already has the
    file open (DuckDB attaches a file once per process), :attr:`attached` is False and the side is
    streamed like the other.
    """

    def __init__(self, directory: str, beside=None) -> None:
        import duckdb

        from dw_dagster.databases import LocalDuckDB

        # in memory, its blocks evicted to the temporary directory beyond the memory limit
        self.con = duckdb.connect(":memory:",
                                  config={"threads": 2, "memory_limit": _memory_limit(beside), "temp_directory": directory,
                                          "preserve_insertion_order": False})
        self.con.execute("SET TimeZone = 'UTC'")
        self.con.execute("SET enable_progress_bar = false")
        self.schema = "memory.main"
        self.dialect, self.name = "duckdb", LocalDuckDB.name
        try:
            self.attached = beside is not None and self._attach(beside)
        except BaseException:
            self.con.close()
            raise
        if self.attached:
            self.name = beside.name

    def _attach(self, beside) -> bool:
        import duckdb

        from dw_dagster.databases import sql
        from dw_dagster.databases.duckdb import _is_held_elsewhere, _is_open_here, _lock_retrying

        path = str(getattr(beside, "path", ":memory:"))
        if path == ":memory:":
            return False
        # under the file's own catalog name (its stem, as DuckDB names it), so a three-part name resolves as in the file
        stem = Path(path).stem
        alias = sql.identifier(stem if stem.lower() not in ("memory", "temp", "system", "main") else "dw_side").sql("duckdb")
        attach = f"ATTACH {sql.literal(path).sql('duckdb')} AS {alias} (READ_ONLY)"
        try:  # another process writing the file: waited for as DuckDBDatabase does (not one of this process)
            _lock_retrying(float(getattr(beside, "lock_wait_s", 120.0)), when=_is_held_elsewhere)(self.con.execute, attach)
        except duckdb.Error as e:
            if _is_open_here(e):  # open in this process already: streamed instead
                return False
            raise DatabaseError(f"{beside.name}: could not be opened for the diff: {str(e).splitlines()[0]}") from e
        self.con.execute(f"USE {alias}")
        return True

    def _failed(self, e: Exception, query: str) -> DatabaseError:
        return DatabaseError(f"{self.name}: query failed: {str(e).splitlines()[0]}\n  SQL: {query[:300]}")

    def _run(self, query: str):
        try:
            return self.con.execute(query)
        except Exception as e:  # duckdb's error classes
            raise self._failed(e, query) from e

    def fetch_all(self, query: str) -> list[tuple]:
        return self._run(query).fetchall()

    def execute(self, query: str) -> None:
        self._run(query)

    def fetch_batches(self, query: str, batch_rows: int = 100_000):
        try:
            reader = self.con.sql(query).to_arrow_reader(batch_rows)
        except Exception as e:  # duckdb's error classes
            raise self._failed(e, query) from e
        yield from reader

    def close(self) -> None:
        self.con.close()


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|bytes|kb|mb|gb|tb|kib|mib|gib|tib)?\s*$", re.IGNORECASE)
_UNIT = {"b": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _memory_limit(side) -> str:
    """:data:`LOCAL_MEMORY`, or the DuckDB side's own ``memory_limit`` when that is lower (a limit set to fit a
    small container is kept); an own limit this cannot read leaves :data:`LOCAL_MEMORY`."""
    own = getattr(side, "memory_limit", None) if side is not None else None
    sizes = [(n, v) for v in (LOCAL_MEMORY, own) if isinstance(v, str) and (n := _bytes(v)) is not None]
    return min(sizes)[1] if sizes else LOCAL_MEMORY


def _bytes(text: str) -> int | None:
    m = _SIZE.match(text)
    return None if m is None else int(float(m.group(1)) * _UNIT[(m.group(2) or "b").lower()])


def estimated_rows(db: Database, table: str) -> float:
    """The table's rows as the catalog estimates them (PostgreSQL ``reltuples``, DuckDB ``estimated_size``);
    where the catalog does not say (a table never analyzed), its rows counted up to :data:`STREAM_MIN_ROWS`
    (a bounded read); infinity for another engine or when neither answers."""
    if db.dialect not in ("postgres", "duckdb"):
        return float("inf")
    found = _catalog_rows(db, table)
    return found if found is not None else _rows_up_to(db, table, STREAM_MIN_ROWS)


def _rows_up_to(db: Database, table: str, cap: int) -> float:
    """``table``'s rows counted up to ``cap`` (infinity at the cap or on an error: the stream stays possible)."""
    from dw_dagster.databases import sql

    exp = sqlglot.exp
    inner = exp.select("1").from_(sql.table(table)).limit(cap).subquery("dw_n")
    try:
        (n,), = db.fetch_all(exp.select(exp.func("COUNT", exp.Star())).from_(inner).sql(dialect=db.dialect))
    except DatabaseError:
        return float("inf")
    return float(n) if int(n) < cap else float("inf")


def _catalog_rows(db: Database, table: str) -> float | None:
    """The catalog's row estimate, or None when it does not say (never analyzed) or on an error."""
    from dw_dagster.databases import sql

    t = sql.table(table)
    try:
        if db.dialect == "postgres":
            name = sql.literal(t.sql(dialect="postgres")).sql("postgres")
            found = db.fetch_all(f"SELECT CAST(reltuples AS BIGINT) FROM pg_class WHERE oid = to_regclass({name})")
        elif db.dialect == "duckdb":
            cond = f"table_name = {sql.literal(t.name).sql('duckdb')}"
            if t.args.get("db") is not None:
                cond += f" AND schema_name = {sql.literal(t.args['db'].name).sql('duckdb')}"
            found = db.fetch_all(f"SELECT MAX(estimated_size) FROM duckdb_tables() WHERE {cond}")
        else:
            return None
    except DatabaseError:
        return None
    if not found or found[0][0] is None or int(found[0][0]) < 0:
        return None
    return float(found[0][0])


def _timed_read(source: Database, rel: str, rows: int) -> tuple[float, int, int]:
    """(seconds from the query to its last row, Arrow bytes, rows) of reading the first ``rows`` rows of ``rel``."""
    side = _Reader(source, _select(source, rel, rows), {})
    try:
        rdr = side.reader()
        if rdr is not None:
            for _ in rdr:
                pass
    finally:
        side.close()
    return time.perf_counter() - side.started, side.bytes, side.rows


def probe_mbps(source: Database, rel: str, rows: int = PROBE_ROWS) -> tuple[float, float, int]:
    """MB/s of ``source``'s stream: the extra bytes of reading ``rows`` rows of ``rel`` rather than
    :data:`PROBE_BASE_ROWS`, over the extra seconds (so the query's fixed latency, which a loaded
    server or a far one adds to every read, is not taken for a slow link; opening the connection is
    not counted either). A database's rate is measured once per :data:`PROBE_TTL_S` seconds and
    reused (keyed by its name).

    Returns:
        (MB/s, the seconds the ``rows`` read took from its query to its last row, the rows it read).
    """
    with _probe_lock:
        seen = _probed.get(source.name)
    if seen is not None and time.monotonic() - seen[0] < PROBE_TTL_S:
        return seen[1]
    with _probe_lock:
        _hashed.pop(source.name, None)  # a new probe: the hash of its rows is timed again
    s1, b1, _ = _timed_read(source, rel, PROBE_BASE_ROWS)
    s2, b2, n2 = _timed_read(source, rel, rows)
    if n2 < min(rows, 2 * PROBE_BASE_ROWS):  # a small table says nothing about the link: the whole read's rate
        return b2 / 1e6 / max(s2, 1e-6), s2, n2
    out = ((b2 - b1) / 1e6 / max(s2 - s1, 1e-6), s2, n2)
    with _probe_lock:
        _probed[source.name] = (time.monotonic(), out)
    return out


def probe_hash_s(source: Database, run) -> float:
    """Seconds ``run()`` (the source hashing the probe's rows the bisect path's way) takes; measured once
    per probe of ``source`` and reused while the probe is (:data:`PROBE_TTL_S`): without it every
    diff choosing its transfer hashed 50,000 rows again (0.3 s on PostgreSQL)."""
    with _probe_lock:
        seen = _hashed.get(source.name)
    if seen is not None:
        return seen
    t0 = time.perf_counter()
    run()
    took = time.perf_counter() - t0
    with _probe_lock:
        if source.name in _probed:
            _hashed[source.name] = took
    return took


def stream_diff(source: Database, target: Database, plan, opts, *, sample_limit: int, pass_rows: int,
                timestamp_precision, timestamp_rounding, warnings: list[str], merge) -> RowDiffResult:
    """Both sides streamed into a local DuckDB and diffed there in passes (module docstring).

    Raises:
        StreamUnavailable: a side cannot be streamed (its engine, a column type).
        DatabaseError: a query or the stream failed.
    """
    for db in (source, target):
        why = streamable(db)
        if why:
            raise StreamUnavailable(why)
    home = _home(source, target)
    sides = [_Reader(source, _select(source, plan.source_rel), _aliased(plan, plan.st)),
             _Reader(target, _select(target, plan.target_rel), _aliased(plan, plan.tt))]
    result = RowDiffResult(queries=[], warnings=list(warnings), buckets_compared=None,
                           buckets_downloaded=None, rows_downloaded=0, download_passes=0, transfer="stream",
                           timestamp_rule=timestamp_rule(timestamp_precision, timestamp_rounding))
    with tempfile.TemporaryDirectory(prefix="dw_rowdiff_stream_") as tmp:
        local = _Local(tmp, beside=None if home is None else (source, target)[home])
        home = home if local.attached else None
        streamed = [i for i in (0, 1) if i != home]
        try:
            _load_sides(local, sides, streamed)
            result.queries = [sides[i].statement for i in streamed]  # as sent (numeric columns as text)
            rels = [f"{local.schema}.{('dw_s', 'dw_t')[i]}" if i in streamed else (plan.source_rel, plan.target_rel)[i]
                    for i in (0, 1)]
            result.rows_downloaded = sum(sides[i].rows for i in streamed)
            _diff_loaded(local, rels, plan, opts, result, sample_limit=sample_limit, pass_rows=pass_rows, merge=merge)
        finally:
            local.close()
    result.bytes_fetched = sum(sides[i].bytes for i in streamed)
    result.bytes_sent = sum(len(s.encode()) for s in result.queries)
    return result


def _home(source: Database, target: Database) -> int | None:
    """The side (0 source, 1 target) diffed where it is, not streamed: a DuckDB file the local instance can
    attach (the target first), or None."""
    if source.dialect == target.dialect:  # two DuckDB files (perhaps one): both streamed into a local one
        return None
    for i in (1, 0):
        db = (source, target)[i]
        if db.dialect == "duckdb" and isinstance(getattr(db, "path", None), str):
            return i
    return None


def _load_sides(local: _Local, sides: list[_Reader], streamed: list[int]) -> None:
    """The streamed sides loaded into ``local`` (``dw_s``, ``dw_t``); two at once, the second in a thread."""
    names = ("dw_s", "dw_t")
    if len(streamed) == 1:
        _load(local, names[streamed[0]], sides[streamed[0]])
        return
    errors: list[BaseException] = []

    def load_target():
        try:
            _load(local, "dw_t", sides[1])
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(e)

    worker = threading.Thread(target=load_target, name="dw-rowdiff-stream-target")
    worker.start()  # the target loads while the source streams
    try:
        _load(local, "dw_s", sides[0])
    finally:
        worker.join()
    if errors:
        raise errors[0]


def _diff_loaded(local: _Local, rels: list[str], plan, opts, result: RowDiffResult, *, sample_limit: int,
                 pass_rows: int, merge) -> None:
    """Counts, NULL keys, collisions, then the typed diff of ``rels`` (source, target) in passes by key hash."""
    from dw_dagster.checks.rowdiff.joindiff import _collision_warning, _collisions, _counts_and_null_keys, _diff_typed
    from dw_dagster.checks.rowdiff.rules import _key_expr
    from dw_dagster.databases import sql

    n = {}
    for rel, side in zip(rels, ("source", "target")):
        n[side], warn, _ = _counts_and_null_keys(local, rel, plan.keys, side, plan.labels)
        result.warnings += warn
    for rel, side, own, other in ((rels[0], "source", plan.st, plan.tt), (rels[1], "target", plan.tt, plan.st)):
        found, total, _ = _collisions(local, rel, plan.keys, side, own, other, opts.case_insensitive_keys)
        result.collisions += found
        setattr(result, f"collided_{side}", total)
        result.warnings += [_collision_warning(c) for c in found]
    passes = max(1, -(-(n["source"] + n["target"]) // max(1, int(pass_rows))))
    q = lambda c: sql.identifier(c).sql("duckdb")  # noqa: E731
    for k in range(passes):
        parts = rels
        if passes > 1:
            parts = []
            for rel, own, other in ((rels[0], plan.st, plan.tt), (rels[1], plan.tt, plan.st)):
                key = ", ".join(_key_expr(q(c), c, own, other, opts.case_insensitive_keys) for c in plan.keys)
                parts.append(f"(SELECT * FROM {rel} AS dw_v WHERE hash({key}) % {passes} = {k})")
        part, _ = _diff_typed(local, parts[0], parts[1], plan.keys, plan.columns, plan.st, plan.tt, opts, sample_limit)
        merge(result, part, sample_limit)
        result.download_passes += 1
