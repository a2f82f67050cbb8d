"""``volume_tick_3x5000``: one volume-sensor tick over three warehouses of 5,000 tables each.

The warehouses (issue 15, item 1, the multi-warehouse part):

* **DuckDB**: a file (:class:`~dw_dagster.databases.DuckDBDatabase`).
* **PostgreSQL**: the server on 127.0.0.1:5432 (database ``test``, trust auth) through
  :class:`~dw_dagster.databases.SqlAlchemyDatabase` (psycopg), in schemas of the benchmark's own
  (``dw_vol3x_<n>``, dropped before and after).
* **Snowflake**: fakesnow 0.12.1 in server mode (``fakesnow.server()`` in a process of its own on
  127.0.0.1, an in-memory DuckDB behind it) through :class:`~dw_dagster.databases.snowflake.SnowflakeDatabase`
  and the real ``snowflake-connector-python`` over HTTP. Its tables are created (and changed)
  directly in the server process's DuckDB, in the catalog fakesnow serves (``DW_TEST.S<n>.*``,
  upper-case names as Snowflake stores unquoted ones): 20 ms per statement through the connector
  would make setup minutes long. Everything timed goes through the connector.

Each warehouse holds the tables of :mod:`.volume_tick` (2 % dead-letter, 2 % watched by
yesterday's partition of a timestamp column, the rest plain; 20-69 rows each), and every size is
measured the way ``volume_tick_5000`` is: a fresh in-memory Dagster instance whose row-count
history store holds three earlier counts per table, one first tick (no cursor: the history read
back from the store, ``rebuild_tick_s``), then
every table changes (one row more; 1 plain table in 200 emptied, 1 dead-letter table in 4 grows)
and the tick after the change runs once (``first_timed_tick_s``: it scores and records the
changed counts and opens the incidents, counted in ``incidents_per_tick``, ``statuses``,
``observations_per_tick``), then ``repeat`` more times from the same cursor (``ours_s``:
``SensorDefinition.evaluate_tick``, median; these find the incidents open in the ledger, as the
next tick would, and record the same counts). An emptied table is ``unconfirmed`` in these ticks
(``confirm_empty_seconds``, 120 s, has not passed). On fakesnow a table is emptied by
re-creating it: fakesnow's ``row_count`` is DuckDB's ``estimated_size``, which keeps deleted rows
(``fakesnow_row_count_after_delete`` reports what it says for a 10-row table after
``DELETE``; Snowflake's ``row_count`` is exact). After the change, each warehouse's counts are
compared with the rows written (``counts_exact``, ``mismatches``).

Per warehouse (``warehouses``): ``queries``, the statements it received in one tick, counted by
the database object the sensor holds (the DuckDB connection's ``execute``; ``fetch_all`` of the
PostgreSQL and Snowflake databases), split into ``catalog_queries`` and ``count_queries``;
``pool_pings`` for PostgreSQL (SQLAlchemy's ``pool_pre_ping`` sends a ``SELECT 1`` before each
statement); ``counts_s``, :func:`~dw_dagster.detection.volume.fetch_row_counts` on that warehouse
alone (median of ``repeat``); ``one_catalog_query`` and ``why`` (issue 15's aim: one catalog query
per warehouse per tick; true when one catalog query counts every whole table, ``whole_table_counts``
= 0, and the only other statements are the ``COUNT(*) ... WHERE`` batches of the partitioned specs,
which no catalog can answer).

Where fakesnow's time goes (measured apart, 5,000 tables per schema): the catalog query 0.19-0.23 s
(with the connector's login, 0.09 s); the one ``UNION ALL`` of the 100 partitioned specs' ``COUNT(*)
... WHERE`` 2.1-2.6 s, nearly all of it fakesnow rewriting the statement with sqlglot (30 branches
0.38 s): the emulator's cost, not a measure of Snowflake's.

Peer (same run): ``SELECT COUNT(*) FROM <table>`` per table on one connection to each warehouse
(duckdb, psycopg, the Snowflake connector), one warehouse after the other; ``peer_s`` is the sum.
DuckDB and PostgreSQL are timed ``repeat`` times (median), fakesnow once per size (about 15-20 ms a
statement). Ours is measured at every size before any peer runs (``ours_peak_rss_mb``).

Curve (issue 15, item 5): the same at 500, 1,500 and 5,000 tables per warehouse (each size in
schemas of its own), ``curve`` giving ms per table of the tick, of each warehouse's counts and of
each peer.

Goals: ``ours_s`` ≤ 15 s (``goal_unit`` "s") and peak RSS ≤ 2,000 MB (``peak_goal_mb``). The
reference machine has 2 cores shared with other work, and the fakesnow server and PostgreSQL
run on the same cores as the tick.

Run time: about 20 minutes here (the first ticks and storing their events: 4 min at 5,000 per
warehouse; the fakesnow peer: 3.5 min; seeding observations took 5.5 min more before the history
store), so it is not part of
the default ``make bench``: ``python -m dw_dagster_tests.benchmarks.run --only volume_tick_3x5000``
(or ``python -m dw_dagster_tests.benchmarks.volume_tick_3x [--repeat N] [--sizes 500,1500,5000]``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import gc
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dw_dagster_tests.benchmarks.volume_tick import (
    _make,
    _names,
    _run_duckdb,
    _seed_store,
    change_sql,
    create_sql,
    expected_rows,
    first_tick,
    specs_for,
)

SIZES = (500, 1500, 5000)
GOAL_S = 15.0
PEAK_GOAL_MB = 2000
PG_URL = os.environ.get("DW_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_CHUNK = 500  # tables per PostgreSQL setup round trip (one implicit transaction each)
FAKESNOW_DATABASE = "DW_TEST"
WAREHOUSES = ("duckdb", "postgres", "snowflake")

WHY = {
    "duckdb": "duckdb_tables().estimated_size is not exact (deleted rows stay counted until a row group goes), "
              "so after the catalog query (which watched tables exist) the counts are COUNT(*) in UNION ALL "
              "batches of 100 tables",
    "postgres": "pg_class.reltuples and pg_stat_user_tables.n_live_tup are estimates (VACUUM/ANALYZE, the "
                "statistics collector), so the counts are COUNT(*) in UNION ALL batches of 25 tables "
                "without a catalog query",
    "snowflake": "information_schema.tables.row_count is exact for tables: one catalog query counts every "
                 "plain and dead-letter table; the partitioned specs need COUNT(*) ... WHERE (one UNION ALL "
                 "batch per 100), which no catalog holds",
}


# -- fakesnow in a process of its own -----------------------------------------------------------


def _serve_fakesnow(port: int, pipe: Any, log_path: str) -> None:
    """In a spawned process: ``fakesnow.server()`` on 127.0.0.1:``port``; runs each list of DuckDB
    statements received on ``pipe`` in one transaction on the server's DuckDB (setup only) and
    answers ``("ok", seconds, peak_rss_mb)`` or ``("error", text)``; stops on None."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from dw_dagster_tests.harness.emulators import _exit_with_parent

    import fakesnow

    _exit_with_parent()
    start = fakesnow.server  # the function; importing the module fakesnow.server replaces the attribute
    with start(port=port, host="127.0.0.1"):
        shared = sys.modules["fakesnow.server"].shared_fs
        shared.connect(FAKESNOW_DATABASE).close()  # creates the database with fakesnow's catalog views
        pipe.send(("ok", 0.0, 0.0))
        while (statements := pipe.recv()) is not None:
            t = time.perf_counter()
            con = shared.duck_conn.cursor()
            try:
                con.execute("BEGIN")
                for s in statements:
                    con.execute(s)
                con.execute("COMMIT")
                pipe.send(("ok", time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
            except Exception as e:  # noqa: BLE001 - reported to the benchmark process
                pipe.send(("error", f"{type(e).__name__}: {e}"[:2000]))
            finally:
                con.close()


class _FakesnowServer:
    """The fakesnow server process and its setup pipe."""

    def __init__(self, work: Path) -> None:
        from dw_dagster_tests.harness.emulators import free_port

        self.port = free_port()
        self.log = work / "fakesnow.log"
        self._pipe, child = mp.Pipe()
        self._proc = mp.get_context("spawn").Process(target=_serve_fakesnow, args=(self.port, child, str(self.log)),
                                                     daemon=True)
        self._proc.start()
        self._answer(120)
        self.peak_rss_mb = 0.0

    def _answer(self, timeout: float) -> tuple:
        if not self._pipe.poll(timeout):
            raise RuntimeError(f"fakesnow server: no answer in {timeout:.0f} s; log {self.log}")
        msg = self._pipe.recv()
        if msg[0] != "ok":
            raise RuntimeError(f"fakesnow server: {msg[1]}")
        return msg

    def run(self, statements: list[str]) -> float:
        """Run DuckDB statements in one transaction in the server's database; returns seconds."""
        self._pipe.send(statements)
        _, seconds, rss = self._answer(600)
        self.peak_rss_mb = max(self.peak_rss_mb, rss)
        return seconds

    def connect_kwargs(self) -> dict[str, Any]:
        """``snowflake.connector.connect`` arguments for the server (as the tests' harness gives them)."""
        return dict(user="fake", password="snow", account="fakesnow", host="127.0.0.1", port=self.port,
                    protocol="http", database=FAKESNOW_DATABASE, login_timeout=60, network_timeout=120,
                    session_parameters={"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False})

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pipe.send(None)
        self._proc.join(20)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(10)


# -- counting what each warehouse receives ------------------------------------------------------


class _CountingConnection:
    """A DuckDB connection that records every statement it executes."""

    def __init__(self, con: Any, statements: list[str]) -> None:
        self._con, self._statements = con, statements

    def execute(self, statement: str, *args: Any) -> Any:
        self._statements.append(statement)
        return self._con.execute(statement, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


def _counting_duckdb(path: Path, statements: list[str]):
    """A DuckDBDatabase whose connections record their statements in ``statements``."""
    from dw_dagster.databases import DuckDBDatabase

    class CountingDuckDB(DuckDBDatabase):
        @contextlib.contextmanager
        def connect(self) -> Iterator[Any]:
            with super().connect() as con:
                yield _CountingConnection(con, statements)

        def fetch_all(self, sql: str) -> list[tuple]:
            statements.append(sql)
            return super().fetch_all(sql)

    return CountingDuckDB(path)


class _Counting:
    """A Database whose ``fetch_all`` records every statement; everything else is the wrapped one's."""

    def __init__(self, inner: Any, statements: list[str]) -> None:
        self.inner, self.statements = inner, statements
        self.dialect, self.name = inner.dialect, inner.name

    def fetch_all(self, statement: str) -> list[tuple]:
        self.statements.append(statement)
        return self.inner.fetch_all(statement)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _is_catalog(statement: str) -> bool:
    s = statement.lower()
    return "duckdb_tables()" in s or "information_schema.tables" in s


# -- the warehouses -----------------------------------------------------------------------------


@dataclasses.dataclass
class _Warehouse:
    key: str
    db: Any  # what the sensor holds
    statements: list[str]
    schema: Callable[[int], str]  # tables per warehouse -> schema of that size
    setup: Callable[[list[str]], float]  # runs setup statements, returns seconds
    name: Callable[[str], str] = str  # table name as written in setup statements
    empty: Callable[[str], str] = lambda t: f"DELETE FROM {t}"
    pings: Callable[[], int] = lambda: 0


def _pg_run(statements: list[str]) -> float:
    """Run statements on PostgreSQL, ``PG_CHUNK`` per round trip (each chunk one implicit transaction)."""
    import psycopg

    t = time.perf_counter()
    with psycopg.connect(PG_URL, autocommit=True) as con:
        for i in range(0, len(statements), PG_CHUNK):
            con.execute(";\n".join(statements[i:i + PG_CHUNK]).encode())
    return time.perf_counter() - t


def _pg_drop(schemas: list[str]) -> None:
    """Drop the benchmark's PostgreSQL schemas, their tables ``PG_CHUNK`` per transaction first."""
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as con:
        for schema in schemas:
            tables = [r[0] for r in con.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename", (schema,)).fetchall()]
            for i in range(0, len(tables), PG_CHUNK):
                con.execute("DROP TABLE " + ", ".join(f"{schema}.{t}" for t in tables[i:i + PG_CHUNK]))
            con.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _warehouses(work: Path, fakesnow: _FakesnowServer) -> dict[str, _Warehouse]:
    from dw_dagster.databases import SqlAlchemyDatabase
    from dw_dagster.databases.snowflake import SnowflakeDatabase

    path = work / "volume_3x.duckdb"
    duck_statements: list[str] = []
    duck = _Warehouse("duckdb", _counting_duckdb(path, duck_statements), duck_statements, lambda n: f"s{n}",
                      lambda st: _timed_once(lambda: _run_duckdb(path, st)))
    duck.path = path  # type: ignore[attr-defined]

    pg_statements: list[str] = []
    pg_db = SqlAlchemyDatabase(PG_URL.replace("postgresql://", "postgresql+psycopg://", 1))
    pings = [0]
    ping = pg_db._engine.dialect.do_ping

    def counted_ping(dbapi_connection: Any) -> bool:
        pings[0] += 1
        return ping(dbapi_connection)

    pg_db._engine.dialect.do_ping = counted_ping  # SQLAlchemy's pool_pre_ping: a SELECT 1 per checkout
    pg = _Warehouse("postgres", _Counting(pg_db, pg_statements), pg_statements, lambda n: f"dw_vol3x_{n}", _pg_run,
                    pings=lambda: pings[0])

    sf_statements: list[str] = []
    sf = _Warehouse("snowflake", _Counting(SnowflakeDatabase(**fakesnow.connect_kwargs()), sf_statements),
                    sf_statements, lambda n: f"s{n}", fakesnow.run,
                    name=lambda t: f"{FAKESNOW_DATABASE}.{t.upper()}",
                    empty=lambda t: f"CREATE OR REPLACE TABLE {t} (id BIGINT, ts TIMESTAMP)")
    return {"duckdb": duck, "postgres": pg, "snowflake": sf}


def _timed_once(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _make_all(whs: dict[str, _Warehouse], yesterday: dt.date, sizes: list[int]) -> tuple[dict, dict]:
    """Create every size's tables in every warehouse; returns (seconds, rows) per warehouse."""
    seconds: dict[str, float] = {}
    rows: dict[str, dict[int, int]] = {}
    for key, w in whs.items():
        t = time.perf_counter()
        rows[key] = {}
        for n in sizes:
            schema = w.schema(n)
            if key == "duckdb":
                rows[key][n] = _make(w.path, yesterday, n, schema)  # type: ignore[attr-defined]
                continue
            statements, rows[key][n] = create_sql(yesterday, n, schema, name=w.name)
            head = f"CREATE SCHEMA {FAKESNOW_DATABASE}.{schema.upper()}" if key == "snowflake" else f"CREATE SCHEMA {schema}"
            w.setup([head] + statements)
        seconds[key] = round(time.perf_counter() - t, 1)
    return seconds, rows


def _fakesnow_after_delete(fakesnow: _FakesnowServer) -> Any:
    """What fakesnow's ``information_schema.tables.row_count`` says for a 10-row table after ``DELETE`` of all rows."""
    import snowflake.connector

    t = f"{FAKESNOW_DATABASE}.PUBLIC.DW_VOL3X_PROBE"
    fakesnow.run([f"CREATE SCHEMA IF NOT EXISTS {FAKESNOW_DATABASE}.PUBLIC",
                  f"CREATE TABLE {t} AS SELECT i AS id FROM generate_series(1, 10) AS g(i)"])
    fakesnow.run([f"DELETE FROM {t}"])
    with contextlib.closing(snowflake.connector.connect(**fakesnow.connect_kwargs())) as con:
        (n,) = con.cursor().execute("SELECT row_count FROM information_schema.tables "
                                    "WHERE table_schema = 'PUBLIC' AND table_name = 'DW_VOL3X_PROBE'").fetchone()
    fakesnow.run([f"DROP TABLE {t}"])
    return n


# -- the peer -----------------------------------------------------------------------------------


def _peer(w: _Warehouse, fakesnow: _FakesnowServer, n: int) -> Callable[[], None]:
    """``SELECT COUNT(*) FROM <table>`` for each of the size's tables on one connection to ``w``."""
    tables = [t for _, t in _names(n, w.schema(n))]

    def on(con_factory: Callable[[], Any], run: Callable[[Any, str], Any]) -> Callable[[], None]:
        def go() -> None:
            with contextlib.closing(con_factory()) as con:
                for t in tables:
                    run(con, f"SELECT COUNT(*) FROM {t}")
        return go

    if w.key == "duckdb":
        import duckdb

        return on(lambda: duckdb.connect(str(w.path)), lambda c, q: c.execute(q).fetchall())  # type: ignore[attr-defined]
    if w.key == "postgres":
        import psycopg

        return on(lambda: psycopg.connect(PG_URL, autocommit=True), lambda c, q: c.execute(q).fetchall())
    import snowflake.connector

    def sf(con: Any, q: str) -> None:
        cur = con.cursor()
        try:
            cur.execute(q).fetchall()
        finally:
            cur.close()

    return on(lambda: snowflake.connector.connect(**fakesnow.connect_kwargs()), sf)


# -- one size -----------------------------------------------------------------------------------


def _median_times(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, last = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), last


def _one_size(whs: dict[str, _Warehouse], yesterday: dt.date, n: int, repeat: int) -> dict:
    """Seed, first tick, change, timed ticks and per-warehouse counts at ``n`` tables per warehouse."""
    import dagster as dg

    from dw_dagster.detection.volume import build_volume_sensor, fetch_row_counts

    specs = {k: specs_for(n, w.schema(n), database=k) for k, w in whs.items()}
    instance = dg.DagsterInstance.ephemeral()
    t = time.perf_counter()
    for k in whs:
        _seed_store(instance, specs[k], yesterday)
    seed_s = time.perf_counter() - t
    sensor = build_volume_sensor(tables=[s for k in whs for s in specs[k]], databases={k: w.db for k, w in whs.items()},
                                 min_history=3)

    tick, first, rebuild_tick_s, store_first_tick_s = first_tick(sensor, instance)

    change_s = {}
    for k, w in whs.items():
        change_s[k] = round(w.setup(change_sql(yesterday, n, w.schema(n), name=w.name, empty=w.empty)), 2)

    per_tick: dict[str, dict[str, int]] = {}

    def counted_tick() -> Any:
        before = {k: (len(w.statements), w.pings()) for k, w in whs.items()}
        result = tick(first.cursor)
        for k, w in whs.items():
            sent = w.statements[before[k][0]:]
            per_tick[k] = {"queries": len(sent), "catalog_queries": sum(map(_is_catalog, sent)),
                           "count_queries": sum(not _is_catalog(s) for s in sent),
                           "whole_table_counts": sum(" WHERE " not in b.upper() for s in sent if not _is_catalog(s)
                                                     for b in s.split(" UNION ALL "))}
            if k == "postgres":
                per_tick[k]["pool_pings"] = w.pings() - before[k][1]
        return result

    t = time.perf_counter()
    last = counted_tick()  # the first timed tick opens the incidents; the later ones find them open
    first_timed_s = time.perf_counter() - t
    ours_s, _ = _median_times(counted_tick, repeat)
    warehouses: dict[str, dict] = {}
    for k, w in whs.items():
        counts_s, found = _median_times(lambda: fetch_row_counts(w.db, specs[k]), repeat)
        assert len(found.queries) == per_tick[k]["queries"], (k, len(found.queries), per_tick[k])
        expected = expected_rows(n, w.schema(n))
        wrong = [s.table for s in specs[k] if found.counts[s.id].rows != expected[s.table]]
        warehouses[k] = {**per_tick[k], "counts_s": round(counts_s, 3), "counts_ms_per_table": round(counts_s / n * 1e3, 3),
                         "one_catalog_query": per_tick[k]["catalog_queries"] == 1 and per_tick[k]["whole_table_counts"] == 0,
                         "counts_exact": not wrong, "mismatches": len(wrong), "change_s": change_s[k]}
        if wrong:
            warehouses[k]["mismatch_examples"] = wrong[:5]
    volume_events = [e for e in last.asset_events if "dw/volume_table" in e.metadata]
    statuses: dict[str, int] = {}
    for e in volume_events:
        st = e.metadata["dw/volume_status"].value
        statuses[st] = statuses.get(st, 0) + 1
    out = {"tables_per_warehouse": n, "tables": 3 * n, "ours_s": round(ours_s, 3),
           "ours_ms_per_table": round(ours_s / (3 * n) * 1e3, 3), "warehouses": warehouses,
           "observations_per_tick": len(volume_events),
           "incidents_per_tick": sum(1 for e in last.asset_events if "dw/incident" in e.metadata),
           "statuses": statuses, "first_timed_tick_s": round(first_timed_s, 3), "rebuild_tick_s": round(rebuild_tick_s, 3),
           "store_first_tick_s": round(store_first_tick_s, 3), "seed_s": round(seed_s, 1)}
    print(f"  {3 * n:,} tables ({n:,} per warehouse): tick {ours_s:.3f} s; " + "; ".join(
        f"{k} {v['queries']} queries ({v['catalog_queries']} catalog) {v['counts_s']} s" for k, v in warehouses.items())
          + f"; {out['observations_per_tick']} observations, {out['incidents_per_tick']} incidents; "
          f"first tick {out['rebuild_tick_s']} s", flush=True)
    return out


# -- the benchmark ------------------------------------------------------------------------------


def bench_volume_tick_3x5000(work: Path, repeat: int, sizes: tuple[int, ...] = SIZES) -> dict:
    """Run the benchmark in ``work`` (a scratch folder); returns run.py's result dict (see the module docstring)."""
    sizes_l = sorted(sizes)
    top = sizes_l[-1]
    yesterday = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date()
    fakesnow = _FakesnowServer(work)
    pg_schemas = [f"dw_vol3x_{n}" for n in sizes_l]
    try:
        _pg_drop(pg_schemas)
        whs = _warehouses(work, fakesnow)
        make_s, rows = _make_all(whs, yesterday, sizes_l)
        after_delete = _fakesnow_after_delete(fakesnow)
        points = {}
        for n in sizes_l:
            points[n] = _one_size(whs, yesterday, n, repeat)
            gc.collect()
        ours_peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

        peer_s: dict[int, dict[str, float]] = {}
        for n in sizes_l:
            peer_s[n] = {}
            for k, w in whs.items():
                peer_s[n][k] = _median_times(_peer(w, fakesnow, n), 1 if k == "snowflake" else repeat)[0]
            print(f"  peer at {n:,} per warehouse: " + ", ".join(f"{k} {v:.2f} s" for k, v in peer_s[n].items()), flush=True)
        whs["postgres"].db.inner.dispose()
    finally:
        fakesnow.close()
        _pg_drop(pg_schemas)

    curve = []
    for n in sizes_l:
        p = points[n]
        total_peer = sum(peer_s[n].values())
        curve.append({"tables_per_warehouse": n, "tables": 3 * n, "ours_s": p["ours_s"], "peer_s": round(total_peer, 3),
                      "ours_ms_per_table": p["ours_ms_per_table"],
                      "peer_ms_per_table": round(total_peer / (3 * n) * 1e3, 3),
                      "ratio": round(p["ours_s"] / total_peer, 3),
                      "warehouses": {k: {"queries": v["queries"], "counts_s": v["counts_s"],
                                         "counts_ms_per_table": v["counts_ms_per_table"],
                                         "peer_s": round(peer_s[n][k], 3),
                                         "peer_ms_per_table": round(peer_s[n][k] / n * 1e3, 3)}
                                     for k, v in p["warehouses"].items()}})
    p = points[top]
    warehouses = {k: {**v, "peer_s": round(peer_s[top][k], 3), "why": WHY[k]} for k, v in p["warehouses"].items()}
    total_peer = sum(peer_s[top].values())
    out = {
        "name": f"volume_tick_3x{top}",
        "tables": 3 * top,
        "tables_per_warehouse": top,
        "rows": sum(r[top] for r in rows.values()),
        "ours_s": p["ours_s"],
        "peer": f"a SELECT COUNT(*) per table on one connection to each warehouse ({3 * top:,} statements; "
                f"DuckDB and PostgreSQL median of {repeat}, fakesnow once)",
        "peer_s": round(total_peer, 3),
        "ratio": round(p["ours_s"] / total_peer, 3),
        "goal": GOAL_S,
        "goal_unit": "s",
        "meets_goal": p["ours_s"] <= GOAL_S,
        "peak_goal_mb": PEAK_GOAL_MB,
        "ours_peak_rss_mb": ours_peak,
        "meets_peak_goal": ours_peak <= PEAK_GOAL_MB,
        "warehouses": warehouses,
        "observations_per_tick": p["observations_per_tick"],
        "incidents_per_tick": p["incidents_per_tick"],
        "statuses": p["statuses"],
        "first_timed_tick_s": p["first_timed_tick_s"],
        "rebuild_tick_s": p["rebuild_tick_s"],
        "store_first_tick_s": p["store_first_tick_s"],
        "fakesnow_row_count_after_delete": after_delete,
        "fakesnow_server_peak_rss_mb": round(fakesnow.peak_rss_mb, 1),
        "curve": curve,
        "setup_s": {"make_tables": make_s, "seed_counts_in_the_store": {n: points[n]["seed_s"] for n in sizes_l}},
        "machine": "2 cores shared with other work; PostgreSQL and the fakesnow server run on the same cores",
    }
    print(f"{out['name']:<28} tables {3 * top:>6,}  ours {out['ours_s']:>7.3f} s  peer {out['peer_s']} s  ratio "
          f"{out['ratio']}  (goal ours ≤ {GOAL_S} s: {'met' if out['meets_goal'] else 'NOT met'}; peak {ours_peak} MB, "
          f"goal ≤ {PEAK_GOAL_MB} MB: {'met' if out['meets_peak_goal'] else 'NOT met'})", flush=True)
    print("  curve (ms per table): " + "; ".join(
        f"{c['tables_per_warehouse']:,}/warehouse ours {c['ours_ms_per_table']} peer {c['peer_ms_per_table']}"
        for c in curve), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="tables per warehouse, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = bench_volume_tick_3x5000(Path(d), args.repeat, tuple(int(x) for x in args.sizes.split(",")))
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
