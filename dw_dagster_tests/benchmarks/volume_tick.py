"""``volume_tick_5000``: one tick of the volume sensor over 5,000 DuckDB tables, against 5,000 ``COUNT(*)``.

``--tables N`` runs the same at N tables on a Dagster instance on SQLite files and reports what a
tick writes (events and bytes per tick and per day, the history store's size;
:func:`bench_volume_tick_50000`); ``--curve`` runs that at 5,000, 15,000 and 50,000 tables
(``volume_tick_50000`` with its ``curve``; ``make bench BENCH_ARGS="--only volume_tick_50000"``,
not part of the default run: ~15 minutes of setup on a 2-core machine).

Setup (not timed): one DuckDB file with 5,000 small tables (4,800 plain, 100 dead-letter, 100
watched by yesterday's partition of a timestamp column; 20-69 rows each), written in a process
of its own (DuckDB keeps a block per created table in memory: 1.6 GB at 5,000 tables in the
benchmark's own process before this), a Dagster instance whose row-count history store holds
three earlier counts per table, and one first tick (no cursor: it reads the history of the
5,000 tables back from the store; timed separately as ``rebuild_tick_s``). Then every table
changes (one row more; 1 % are anomalies: 24 plain tables are emptied - read empty, they wait
for a confirming tick and are not scored - and 25 dead-letter tables grow), so the timed tick
scores and records ~4,950 counts, writes them to the store and opens 25 incidents.

Timed (``ours_s``, median of ``repeat``): ``SensorDefinition.evaluate_tick`` from the first
tick's cursor: catalog query + ``COUNT(*)`` batches, scoring, the store's upsert, building the
observations, incidents and the cursor. Not timed: storing the tick's events, which the daemon
does after the tick (``store_first_tick_s``, ``store_tick_s``). ``counts_only_s`` is the warehouse
part of the tick alone (:func:`~dw_dagster.detection.volume.fetch_row_counts`).

Peer (``peer_s``, same run, same file): ``SELECT COUNT(*) FROM <table>`` per table, 5,000
statements on one open connection. Goal: ``ours_s`` ≤ 2 s (``goal_unit`` "s"); 15 s and peak
≤ 2 GB at 50,000 tables.

Usage: ``python -m dw_dagster_tests.benchmarks.volume_tick [--repeat N] [--tables N | --curve]``
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TABLES = 5000
DEAD_LETTER = 100
PARTITIONED = 100
GOAL_S = 2.0


def _rows(i: int) -> int:
    return 20 + i % 50


def _names(tables: int = TABLES, schema: str = "s") -> list[tuple[str, str]]:
    """(kind, table) for every table: plain, dlq or part (2 % dead-letter and 2 % partitioned tables)."""
    out = []
    dead, part = tables * DEAD_LETTER // TABLES, tables * PARTITIONED // TABLES
    for i in range(tables):
        kind = "dlq" if i < dead else "part" if i < dead + part else "plain"
        out.append((kind, f"{schema}.{kind}_{i:05d}"))
    return out


def create_sql(yesterday: dt.date, tables: int = TABLES, schema: str = "s",
               name: Callable[[str], str] = str) -> tuple[list[str], int]:
    """The ``CREATE TABLE`` statements of the benchmark's tables (valid in DuckDB and PostgreSQL) and their total rows.

    ``name`` maps a table name (``schema.kind_i``) to the one written in the statement (a
    catalog-qualified, upper-case name for fakesnow's DuckDB). Dead-letter tables start empty.
    """
    out, total = [], 0
    for i, (kind, table) in enumerate(_names(tables, schema)):
        n = 0 if kind == "dlq" else _rows(i)
        out.append(f"CREATE TABLE {name(table)} AS SELECT i AS id, TIMESTAMP '{yesterday} 10:00:00' AS ts "
                   f"FROM generate_series(0, {n - 1}) AS g(i)")
        total += n
    return out, total


def change_sql(yesterday: dt.date, tables: int = TABLES, schema: str = "s", name: Callable[[str], str] = str,
               empty: Callable[[str], str] = lambda t: f"DELETE FROM {t}") -> list[str]:
    """Every table changes: one more row; 1 plain table in 200 is emptied (``empty(table)``, default
    ``DELETE``); 1 dead-letter table in 4 grows by 5 rows. Valid in DuckDB and PostgreSQL."""
    out = []
    for i, (kind, table) in enumerate(_names(tables, schema)):
        t = name(table)
        if kind == "dlq":
            if i % 4 == 0:
                out.append(f"INSERT INTO {t} SELECT i, TIMESTAMP '{yesterday} 11:00:00' FROM generate_series(0, 4) AS g(i)")
        elif kind == "plain" and i % 200 == 7:
            out.append(empty(t))
        else:
            out.append(f"INSERT INTO {t} VALUES (-1, TIMESTAMP '{yesterday} 12:00:00')")
    return out


def expected_rows(tables: int = TABLES, schema: str = "s") -> dict[str, int]:
    """Table → its row count after :func:`change_sql` (for a partitioned table: yesterday's rows, which are all its rows)."""
    out = {}
    for i, (kind, table) in enumerate(_names(tables, schema)):
        if kind == "dlq":
            out[table] = 5 if i % 4 == 0 else 0
        elif kind == "plain" and i % 200 == 7:
            out[table] = 0
        else:
            out[table] = _rows(i) + 1
    return out


def specs_for(tables: int = TABLES, schema: str = "s", database: str = "warehouse") -> list:
    """The :class:`~dw_dagster.detection.volume.VolumeTable` specs of the tables, on warehouse key ``database``
    (asset keys ``[database, schema_table]``)."""
    from dw_dagster.detection.volume import VolumeTable

    return [VolumeTable(table, [database, table.replace(".", "_")], database=database, dead_letter=kind == "dlq",
                        partition_column="ts" if kind == "part" else None)
            for kind, table in _names(tables, schema)]


def _run_duckdb(path: Path, statements: list[str]) -> None:
    """Run ``statements`` on the DuckDB file in one transaction."""
    import duckdb

    con = duckdb.connect(str(path), config={"threads": 2})
    con.execute("BEGIN")
    for statement in statements:
        con.execute(statement)
    con.execute("COMMIT")
    con.close()


def _make(path: Path, yesterday: dt.date, tables: int = TABLES, schema: str = "s") -> int:
    import duckdb

    # 16 KB blocks (fixed when the file is created): with DuckDB's default 256 KB, each small table
    # takes 257 KB of file (50,000 tables: 13 GB)
    con = duckdb.connect(str(path), config={"threads": 2, "default_block_size": "16384"})
    con.execute(f"CREATE SCHEMA {schema}")
    con.close()
    statements, total = create_sql(yesterday, tables, schema)
    _run_duckdb(path, statements)
    return total


def _change(path: Path, yesterday: dt.date, tables: int = TABLES, schema: str = "s") -> None:
    """Every table changes (:func:`change_sql`): one more row; 24 plain tables emptied; 25 dead-letter tables grow by 5 rows."""
    _run_duckdb(path, change_sql(yesterday, tables, schema))


def _in_child(fn, *args):
    """``fn(*args)`` in a spawned process of its own: DuckDB's buffers for creating thousands of
    tables (a block per table) must not count in the tick's peak memory. Returns its result."""
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def bench_volume_tick_5000(work: Path, repeat: int) -> dict:
    """Run the benchmark in ``work`` (a scratch folder); returns run.py's result dict (see the module docstring)."""
    return bench_volume_tick(work, repeat)


def bench_volume_tick_50000(work: Path, repeat: int, tables: int = 50_000) -> dict:
    """``volume_tick_50000``: the same tick over 50,000 tables (goal 15 s, peak ≤ 2 GB), with what it writes.

    Runs on a Dagster instance on SQLite files (Dagster's default storage; the row-count history
    store is ``dw_ledger.db`` beside it), seeded through the store (three counts per table), with
    ``observations="summary"`` (the default above 1,000 tables). Reports ``events_per_tick``,
    ``store_tick_s`` (the daemon storing them) and ``event_log_bytes_per_tick`` (the growth of
    ``DAGSTER_HOME``'s event log), ``history_store_bytes`` (the store's size; rewritten in place,
    it does not grow with ticks), and per day at one tick every 30 s with every table changing:
    ``events_per_day_every_30s`` / ``bytes_per_day_every_30s`` (the budget bounds the summary
    observations: at most ``max_observations_per_tick`` plus anomalies, and in a steady state one
    per table per day plus status changes) beside ``every_count_events_per_day_every_30s`` /
    ``every_count_bytes_per_day_every_30s``: one observation per changed table (the design
    before the store), at the measured bytes per event.
    """
    return bench_volume_tick(work, repeat, tables=tables, goal_s=15.0, measure_storage=True)


def bench_volume_tick_curve(work: Path, repeat: int, sizes: tuple[int, ...] = (5_000, 15_000, 50_000)) -> dict:
    """``volume_tick_50000`` with its curve: the tick at each of ``sizes`` tables, in ms per table.

    Each size lives in a child process of its own (its own peak memory), set up one after the other;
    then the timed ticks run round by round, one tick of each size per round, and so do the peer's
    runs, so a machine that slows down for a minute slows every size alike. The result is the
    largest size's, with ``curve``: ``[{"tables", "ours_s", "peer_s", "ms_per_table",
    "peer_ms_per_table", "ticks_s", "peak_rss_mb", "events_per_tick", "tick_phases_s"}, ...]``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    children = []
    for n in sizes:  # set up one at a time: writing tables is not what is measured
        parent_end, child_end = ctx.Pipe()
        p = ctx.Process(target=_curve_child, args=(str(work / f"n{n}"), n, child_end))
        p.start()
        assert parent_end.recv() == "ready"
        children.append((n, p, parent_end))
    for step in ("tick", "peer"):
        for _ in range(repeat):
            for _, _, conn in children:
                conn.send(step)
                conn.recv()
    curve, last = [], None
    for n, p, conn in children:
        conn.send("finish")
        last = conn.recv()
        p.join()
        curve.append({"tables": n, "ours_s": last["ours_s"], "peer_s": last["peer_s"],
                      "ms_per_table": round(last["ours_s"] / n * 1000, 3),
                      "peer_ms_per_table": round(last["peer_s"] / n * 1000, 3), "ticks_s": last["ticks_s"],
                      "peak_rss_mb": last["peak_rss_mb"], "events_per_tick": last["events_per_tick"],
                      "tick_phases_s": last["tick_phases_s"], "load_average": last["load_average"]})
        print(f"  curve: {n:>6,} tables  {last['ours_s']:.2f} s  {curve[-1]['ms_per_table']} ms/table  "
              f"peak {last['peak_rss_mb']} MB", flush=True)
    assert last is not None
    return {**last, "curve": curve}


def _curve_child(work: str, tables: int, conn) -> None:
    """One size of :func:`bench_volume_tick_curve`: set up, then run what the parent sends ("tick", "peer",
    "finish": the result dict with the process's peak memory, and exit)."""
    import resource

    Path(work).mkdir(parents=True)
    bench = _TickBench(Path(work), tables, goal_s=15.0, measure_storage=True)
    conn.send("ready")
    while True:
        step = conn.recv()
        if step == "tick":
            conn.send(bench.tick())
        elif step == "peer":
            conn.send(bench.peer())
        else:
            out = bench.finish(len(bench.times))
            out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
            conn.send(out)
            return


def _seed_store(instance, specs, yesterday: dt.date) -> None:
    """Three earlier counts per table, written to the row-count history store as the sensor writes them."""
    import time as _time

    from dw_dagster.detection.volume.history import TableHistory
    from dw_dagster.detection.volume.store import store_for

    at = _time.time() - 3600
    hs = {}
    for i, s in enumerate(specs):
        if s.partition_column:
            entries = tuple(((yesterday - dt.timedelta(days=4 - k)).isoformat(), _rows(i) + d) for k, d in enumerate((0, 1, -1)))
        else:
            entries = tuple((None, 0 if s.dead_letter else _rows(i) + d) for d in (0, 1, -1))
        hs[s.id] = TableHistory(entries=entries, recorded_at=at, observed_at=at, observed_status="ok", last_status="ok")
    store_for(instance).save(hs)


def first_tick(sensor, instance):
    """``(tick, first, rebuild_tick_s, store_first_tick_s)``: ``tick(cursor)`` evaluates one tick of
    ``sensor`` on ``instance``; ``first`` is the tick without a cursor (timed: ``rebuild_tick_s``),
    whose events are then stored as the daemon stores them (timed: ``store_first_tick_s``)."""
    import dagster as dg

    def tick(cursor):
        context = dg.build_sensor_context(instance=instance, cursor=cursor, sensor_name=sensor.name)
        for handler in _KEEP:  # the context's logger is its own Logger, outside logging's hierarchy
            context.log.addHandler(handler)
        return sensor.evaluate_tick(context)

    t = time.perf_counter()
    first = tick(None)
    rebuild_tick_s = time.perf_counter() - t
    t = time.perf_counter()
    for ev in first.asset_events:
        instance.report_runless_asset_event(ev)
    return tick, first, rebuild_tick_s, time.perf_counter() - t


#: handlers :func:`first_tick`'s ``tick`` adds to each sensor context's logger (:func:`_tick_log_lines`)
_KEEP: list = []


@contextlib.contextmanager
def _tick_log_lines():
    """The volume sensor's tick log lines (``... queries, N s: history a s, catalog b s, ...``) while open."""
    import logging

    lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if " queries, " in msg and "catalog " in msg:
                lines.append(msg)

    handler = _Keep()
    _KEEP.append(handler)
    try:
        yield lines
    finally:
        _KEEP.remove(handler)


def _phases(line: str) -> dict[str, float]:
    """``{"history": s, "catalog": s, "counting": s, "scoring": s, "storing": s}`` from a tick's log line."""
    return {k: float(v) for k, v in re.findall(r"(history|catalog|counting|scoring|storing) ([0-9.]+) s", line)}


def _load() -> float:
    """The 1-minute load average (the machine is shared: noted beside each measurement)."""
    import os

    return round(os.getloadavg()[0], 1)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _file_bytes(path: Path) -> int:
    """A SQLite file's bytes with its write-ahead log."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


def _close_incidents(instance) -> None:
    """Close the incidents the previous timed tick opened (not timed), so every timed tick opens its own: each
    starts from the first tick's cursor, and before this the second and third found the first's incidents still
    open and shown by no kept tick, a path that reads the event log per incident (13 ms each at 50,000 tables)."""
    from dw_dagster.core.ledger import CLOSED, OPEN_INCIDENT_STATES, ledger_for

    ledger = ledger_for(instance)
    for row in ledger.incidents(states=OPEN_INCIDENT_STATES):
        ledger.set_incident_state(row.incident_id, CLOSED)


def bench_volume_tick(work: Path, repeat: int, tables: int = TABLES, goal_s: float = GOAL_S,
                      measure_storage: bool = False) -> dict:
    """One volume-sensor tick over ``tables`` DuckDB tables against ``tables`` single ``COUNT(*)`` (module docstring)."""
    bench = _TickBench(work, tables, goal_s, measure_storage)
    for _ in range(repeat):
        bench.tick()
    for _ in range(repeat):
        bench.peer()
    return bench.finish(repeat)


class _TickBench:
    """The benchmark in steps, so a curve can interleave its sizes (:func:`bench_volume_tick_curve`): set up
    (not timed), then timed ticks and peer runs in any order, then :meth:`finish` (the result dict)."""

    def __init__(self, work: Path, tables: int, goal_s: float, measure_storage: bool) -> None:
        import dagster as dg

        from dw_dagster.databases import DuckDBDatabase
        from dw_dagster.detection.volume import build_volume_sensor

        self.tables, self.goal_s, self.measure_storage = tables, goal_s, measure_storage
        yesterday = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date()
        self.path = work / f"volume_{tables}.duckdb"
        t = time.perf_counter()
        self.rows = _in_child(_make, self.path, yesterday, tables)
        self.make_s = time.perf_counter() - t
        self.specs = specs_for(tables)
        self.stack = contextlib.ExitStack()
        if measure_storage:  # Dagster's default storage, SQLite files (and the store in dw_ledger.db beside them)
            self.home = work / "dagster_home"
            self.home.mkdir()
            self.instance = self.stack.enter_context(dg.instance_for_test(temp_dir=str(self.home)))
        else:
            self.instance = dg.DagsterInstance.ephemeral()
        t = time.perf_counter()
        _seed_store(self.instance, self.specs, yesterday)
        self.seed_s = time.perf_counter() - t
        self.db = DuckDBDatabase(self.path)
        sensor = build_volume_sensor(tables=self.specs, databases={"warehouse": self.db}, min_history=3)
        self._tick, self.first, self.rebuild_tick_s, self.store_first_tick_s = first_tick(sensor, self.instance)
        _in_child(_change, self.path, yesterday, tables)
        self.times: list[float] = []
        self.phases: list[dict[str, float]] = []
        self.peer_times: list[float] = []
        self.last = None

    def tick(self) -> float:
        """One timed tick from the first tick's cursor (the previous timed tick's incidents closed first, not timed)."""
        if self.times:
            _close_incidents(self.instance)
        with _tick_log_lines() as lines:
            t = time.perf_counter()
            self.last = self._tick(self.first.cursor)
            self.times.append(time.perf_counter() - t)
        self.phases.append(_phases(lines[-1]) if lines else {})
        return self.times[-1]

    def peer(self) -> float:
        """One run of the peer: ``SELECT COUNT(*)`` per table on one connection."""
        import duckdb

        con = duckdb.connect(str(self.path))
        t = time.perf_counter()
        try:
            for _, table in _names(self.tables):
                con.execute(f"SELECT COUNT(*) FROM {table}").fetchall()
        finally:
            con.close()
        self.peer_times.append(time.perf_counter() - t)
        return self.peer_times[-1]

    def finish(self, repeat: int) -> dict:
        """The result dict (module docstring), with the storage figures when ``measure_storage``."""
        from dw_dagster.detection.volume import fetch_row_counts

        assert self.last is not None
        ours_s, peer_s, load = statistics.median(self.times), statistics.median(self.peer_times), _load()
        count_times = []
        for _ in range(repeat):  # the warehouse part alone: catalog query + COUNT(*) batches
            t = time.perf_counter()
            fetch_row_counts(self.db, self.specs)
            count_times.append(time.perf_counter() - t)
        volume_events = [e for e in self.last.asset_events if "dw/volume_table" in e.metadata]
        incidents = [e for e in self.last.asset_events if "dw/incident" in e.metadata]
        statuses: dict[str, int] = {}
        for e in volume_events:
            st = e.metadata["dw/volume_status"].value
            statuses[st] = statuses.get(st, 0) + 1
        tables, goal_s = self.tables, self.goal_s
        out = {
            "name": f"volume_tick_{tables}", "tables": tables, "rows": self.rows, "ours_s": round(ours_s, 3),
            "peer": f"{tables:,} SELECT COUNT(*) statements on one connection", "peer_s": round(peer_s, 3),
            "ratio": round(ours_s / peer_s, 3) if peer_s else None, "goal": goal_s, "goal_unit": "s",
            "meets_goal": ours_s <= goal_s, "observations_per_tick": len(volume_events),
            "incidents_per_tick": len(incidents), "statuses": statuses,
            "ticks_s": [round(x, 3) for x in self.times], "peer_runs_s": [round(x, 3) for x in self.peer_times],
            "counts_only_s": round(statistics.median(count_times), 3),
            "tick_phases_s": {k: round(statistics.median(p.get(k, 0.0) for p in self.phases), 2)
                              for k in ("history", "catalog", "counting", "scoring", "storing")},
            "load_average": load, "cursor_bytes": len(self.last.cursor or ""),
            "rebuild_tick_s": round(self.rebuild_tick_s, 3), "store_first_tick_s": round(self.store_first_tick_s, 3),
            "setup_s": {"make_tables": round(self.make_s, 1), f"seed_{3 * tables}_counts_in_the_store": round(self.seed_s, 1)},
        }
        if self.measure_storage:
            out.update(self._storage(incidents))
        self.stack.close()
        print(f"{out['name']:<28} tables {tables:>6,}  ours {out['ours_s']:>7.3f} s  {out['peer']}: {out['peer_s']} s  "
              f"ratio {out['ratio']}  (goal ours ≤ {goal_s} s: {'met' if out['meets_goal'] else 'NOT met'}); "
              f"{len(volume_events)} observations, {len(incidents)} incidents per tick; first tick with history rebuild "
              f"{out['rebuild_tick_s']} s; storing its {len(self.first.asset_events):,} events {out['store_first_tick_s']} s", flush=True)
        return out

    def _storage(self, incidents: list) -> dict:
        """What the daemon writes for the last tick, on Dagster's default SQLite storage."""
        from dw_dagster.detection.volume.store import store_for

        home, last, tables = self.home, self.last, self.tables
        assert last is not None
        ledger_file = home / "history" / "dw_ledger.db"
        before, ledger_before = _dir_bytes(home) - _file_bytes(ledger_file), _file_bytes(ledger_file)
        t = time.perf_counter()
        for ev in last.asset_events:
            self.instance.report_runless_asset_event(ev)
        store_tick_s = round(time.perf_counter() - t, 2)
        grown = _dir_bytes(home) - _file_bytes(ledger_file) - before
        rows_stored, store_bytes = store_for(self.instance).size()
        per_day = 86_400 // 30
        recorded = int(re.search(r": (\d+) recorded", last.skip_message or "").group(1))  # the tick's own summary
        per_event = grown / max(1, len(last.asset_events))
        # a day of ticks every 30 s with every table changing: each table shown once (its daily count), the
        # timed tick's anomalies once (an incident and an observation each: an asset has one open incident
        # at a time) and as many status changes back to ok; the bound: the budget on every tick, plus
        # one incident per table
        steady = tables + 3 * len(incidents)
        bound = 1000 * per_day + 2 * tables
        return dict(store_tick_s=store_tick_s, events_per_tick=len(last.asset_events), event_log_bytes_per_tick=grown,
                    bytes_per_event=round(per_event), history_store_rows=rows_stored, history_store_bytes=store_bytes,
                    ledger_file_bytes=_file_bytes(ledger_file),
                    ledger_file_growth_in_timed_ticks=_file_bytes(ledger_file) - ledger_before,
                    events_per_day_every_30s=steady, bytes_per_day_every_30s=round(steady * per_event),
                    events_per_day_bound=bound, bytes_per_day_bound=round(bound * per_event),
                    every_count_events_per_day_every_30s=recorded * per_day,
                    every_count_bytes_per_day_every_30s=round(recorded * per_day * per_event))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tables", type=int, default=TABLES, help="5,000 (volume_tick_5000); 50,000 adds the storage figures")
    ap.add_argument("--curve", action="store_true", help="volume_tick_50000 at 5,000, 15,000 and 50,000 tables")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = (bench_volume_tick_curve(Path(d), args.repeat) if args.curve
               else bench_volume_tick_5000(Path(d), args.repeat) if args.tables == TABLES
               else bench_volume_tick_50000(Path(d), args.repeat, tables=args.tables))
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
