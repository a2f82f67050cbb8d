"""The on-premises-to-warehouse diff: a table in PostgreSQL (the source) against its copy in DuckDB.

``rowdiff_pg_duckdb_10m``: :func:`~dw_dagster.checks.rowdiff.row_diff_across` as configured by
default (``transfer="auto"``: on loopback the stream path, every source row read once with a binary
``COPY`` and compared in a local DuckDB) against two peers in the same run: reladiff ``hashdiff``
between the same two tables (``peer_s``), and the physical floor of reading the source once, the
bare ``COPY (SELECT id, region, amount, note FROM src) TO STDOUT (FORMAT binary)`` read by ``psql``
to ``/dev/null`` (``floor_s``). The hash-and-bisect path (``transfer="bisect"``) runs once at the
top size too, for its time and bytes moved (``bisect_s``, ``bisect_bytes_fetched`` beside
``bytes_fetched``). Goals (issue 32): ≤ 2.0 × the floor, ≤ 0.25 of reladiff (``goal``), identical key
sets (asserted in the run, at every size), peak ≤ 1 GB.

``slice_compare_pg_duckdb_10m``: :func:`~dw_dagster.checks.reconcile.reconcile` (per-region count
and sum on each side, with its recount when the counts differ) against two bare ``GROUP BY``
queries, one per side. Goal: ratio ≤ 1.2.

Data (not timed; generated in a process of its own): the tables of :mod:`.run` (integer key, a
region among 5, a DECIMAL(18,2) amount, a VARCHAR note). The source is written by DuckDB to a CSV
file and streamed into PostgreSQL 15 on 127.0.0.1:5432 with ``COPY ... FROM STDIN`` (1 MB
blocks), in a database of its own (``dw_bench``, dropped afterwards), with a primary key on ``id``
(an operational source has one; reladiff's key-range segments use it), then ``VACUUM ANALYZE``
so neither side of the timing pays for hint bits. The target (0.5 % of keys missing, 0.5 % of
amounts changed) is a DuckDB file (1 GB memory limit, 2 threads).

Curve (issue 15, item 5): each benchmark runs at three sizes, ``rows`` × 0.1, 0.3 and 1 (1M, 3M and
10M at ``--scale 1``), and reports the seconds per million rows of ours and of the peer at each
(``curve`` in the result), so a reader sees whether the cost is flat. Ours is timed ``repeat``
times (median) at every size before any peer runs, so ``ours_peak_rss_mb`` is ours alone; the
reladiff peer, being slow, is timed once per size.

Usage: ``python -m dw_dagster_tests.benchmarks.run --only rowdiff_pg_duckdb_10m [--scale S]``
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

PG_HOST = os.environ.get("DW_BENCH_PG_HOST", "127.0.0.1")
PG_USER = os.environ.get("DW_BENCH_PG_USER", "postgres")
PG_DB = "dw_bench"
FRACTIONS = (0.1, 0.3, 1.0)
COLUMNS = ("region", "amount", "note")


def _pg_url(db: str, driver: str = "") -> str:
    return f"postgresql{driver}://{PG_USER}@{PG_HOST}:5432/{db}"


def _sizes(rows: int) -> list[int]:
    """The three sizes of the curve, each a multiple of 200 (so the differences are exact counts)."""
    return sorted({max(200, int(rows * f) // 200 * 200) for f in FRACTIONS})


def _admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(_pg_url("postgres"), autocommit=True) as con:
        con.execute(statement)


def drop_database() -> None:
    """Drop the benchmark's PostgreSQL database (and any session still on it)."""
    _admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")


def _load(work: Path, sizes: list[int]) -> None:
    """Write the DuckDB target tables ``tgt_<n>`` and load the PostgreSQL source tables ``src_<n>``."""
    import duckdb
    import psycopg

    from dw_dagster_tests.benchmarks.run import MEMORY_LIMIT, _write_tables

    path, csv = work / "warehouse.duckdb", work / "src.csv"
    top = max(sizes)
    _write_tables(path, top, ("src", "tgt"))
    con = duckdb.connect(str(path), config={"memory_limit": MEMORY_LIMIT, "threads": 2})
    con.execute(f"COPY src TO '{csv}' (FORMAT csv, HEADER false)")
    con.execute("DROP TABLE src")
    for n in sizes:
        con.execute(f"CREATE TABLE tgt_{n} AS SELECT * FROM tgt WHERE id < {n}")
    con.execute("DROP TABLE tgt")
    con.execute("CHECKPOINT")
    con.close()

    drop_database()
    _admin(f"CREATE DATABASE {PG_DB}")
    with psycopg.connect(_pg_url(PG_DB), autocommit=True) as pg:
        pg.execute("SET synchronous_commit = off")
        pg.execute(f"CREATE TABLE src_{top} (id BIGINT NOT NULL, region TEXT, amount NUMERIC(18, 2), note TEXT)")
        with pg.cursor() as cur, cur.copy(f"COPY src_{top} FROM STDIN (FORMAT csv)") as copy, open(csv, "rb") as f:
            while block := f.read(1 << 20):
                copy.write(block)
        csv.unlink()
        for n in sizes:
            if n != top:
                pg.execute(f"CREATE TABLE src_{n} AS SELECT * FROM src_{top} WHERE id < {n}")
            pg.execute(f"ALTER TABLE src_{n} ADD PRIMARY KEY (id)")
            pg.execute(f"VACUUM ANALYZE src_{n}")


def _setup(work: Path, rows: int) -> list[int]:
    """Generate and load the tables in a process of its own (its memory is not the benchmark's)."""
    sizes = _sizes(rows)
    t = time.perf_counter()
    p = mp.get_context("spawn").Process(target=_load, args=(work, sizes))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"loading the PostgreSQL and DuckDB tables failed (exit {p.exitcode})")
    print(f"  loaded {', '.join(f'{n:,}' for n in sizes)} rows into PostgreSQL and DuckDB in {time.perf_counter() - t:.1f} s",
          flush=True)
    return sizes


def _databases(work: Path):
    from dw_dagster.databases import SqlAlchemyDatabase

    from dw_dagster_tests.benchmarks.run import _db

    return SqlAlchemyDatabase(_pg_url(PG_DB, "+psycopg")), _db(work / "warehouse.duckdb")


def _point(n: int, ours_s: float, peer_s: float) -> dict:
    m = n / 1e6
    return {"rows": n, "ours_s": round(ours_s, 3), "peer_s": round(peer_s, 3),
            "ours_s_per_m_rows": round(ours_s / m, 3), "peer_s_per_m_rows": round(peer_s / m, 3),
            "ratio": round(ours_s / peer_s, 3)}


def _print_curve(name: str, curve: list[dict], peer: str) -> None:
    print(f"  {name} curve (s per million rows): " + "; ".join(
        f"{c['rows']:,} rows ours {c['ours_s_per_m_rows']} / {peer} {c['peer_s_per_m_rows']}" for c in curve), flush=True)


def bench_rowdiff_pg_duckdb(work: Path, rows: int, repeat: int) -> dict:
    """``rowdiff_pg_duckdb_10m``; see the module docstring."""
    import reladiff

    from dw_dagster.checks.rowdiff import row_diff_across
    from dw_dagster_tests.benchmarks.run import _ours_peak, _timed

    try:  # the database is dropped even when loading it fails half-way
        sizes = _setup(work, rows)
        pg, duck = _databases(work)
        ours_t, ours_keys, stats = {}, {}, {}
        for n in sizes:
            result = {}

            def ours():
                result["r"] = row_diff_across(pg, duck, f"src_{n}", f"tgt_{n}", ["id"], list(COLUMNS),
                                              max_download_rows=5 * n, sample_limit=n)

            ours_t[n] = _timed(ours, repeat)
            r = result["r"]
            assert (r.missing, r.extra, r.changed) == (n // 200, 0, n // 200), (r.missing, r.extra, r.changed)
            ours_keys[n] = {int(e.key[0]) for e in r.sample}
            stats[n] = {"transfer": r.transfer, "transfer_probe_mbps": r.transfer_probe_mbps,
                        "buckets": r.buckets_compared, "buckets_downloaded": r.buckets_downloaded,
                        "rows_downloaded": r.rows_downloaded, "bytes_fetched": r.bytes_fetched,
                        "download_passes": r.download_passes}
        mem = _ours_peak({})
        floor_t = {n: _timed(lambda: _floor(n), repeat) for n in sizes}
        top = sizes[-1]
        t0 = time.perf_counter()
        b = row_diff_across(pg, duck, f"src_{top}", f"tgt_{top}", ["id"], list(COLUMNS), max_download_rows=5 * top,
                            sample_limit=top, transfer="bisect")
        bisect = {"bisect_s": round(time.perf_counter() - t0, 3), "bisect_bytes_fetched": b.bytes_fetched,
                  "bisect_rows_downloaded": b.rows_downloaded}
        assert {int(e.key[0]) for e in b.sample} == ours_keys[top], "bisect and stream key sets differ"
        pg.dispose()

        peer_t, identical = {}, True
        for n in sizes:
            found = {}

            def rela():
                a = reladiff.connect_to_table(_pg_url(PG_DB), f"src_{n}", "id", extra_columns=COLUMNS)
                b = reladiff.connect_to_table(f"duckdb://{work / 'warehouse.duckdb'}", f"tgt_{n}", "id", extra_columns=COLUMNS)
                found["keys"] = {int(row[1][0]) for row in reladiff.diff_tables(a, b, algorithm=reladiff.Algorithm.HASHDIFF)}

            peer_t[n] = _timed(rela, 1)
            same = ours_keys[n] == found["keys"]
            assert same, f"{n:,} rows: key sets differ ({len(ours_keys[n]):,} ours, {len(found['keys']):,} reladiff)"
            identical &= same
        curve = [_point(n, ours_t[n], peer_t[n]) | {"floor_s": round(floor_t[n], 3),
                                                     "floor_ratio": round(ours_t[n] / floor_t[n], 3)} | stats[n]
                 for n in sizes]
        _print_curve("rowdiff_pg_duckdb", curve, "reladiff")
    finally:
        drop_database()
    top = sizes[-1]
    return {"name": "rowdiff_pg_duckdb_10m", "rows": top, "ours_s": ours_t[top],
            "peer": "reladiff hashdiff (PostgreSQL against DuckDB; timed once per size)", "peer_s": peer_t[top],
            "floor": "bare COPY (SELECT id, region, amount, note FROM src) TO STDOUT (FORMAT binary), psql to /dev/null",
            "floor_s": round(floor_t[top], 3), "floor_ratio": round(ours_t[top] / floor_t[top], 3), "floor_goal": 2.0,
            "goal": 0.25, "meets_goal": bool(ours_t[top] / peer_t[top] <= 0.25 and ours_t[top] / floor_t[top] <= 2.0),
            "identical_key_sets": identical, **stats[top], **bisect, "curve": curve,
            "load_average": _load_average(), **mem}


def _floor(n: int) -> None:
    """The physical floor: the source table's binary COPY read once, by psql, to /dev/null."""
    import subprocess

    q = f"COPY (SELECT id, region, amount, note FROM src_{n}) TO STDOUT (FORMAT binary)"
    with open(os.devnull, "wb") as null:
        subprocess.run(["psql", "-X", "-q", "-h", PG_HOST, "-U", PG_USER, "-d", PG_DB, "-c", q], stdout=null, check=True)


def _load_average() -> list[float]:
    """The machine's load average (1, 5, 15 minutes) when the benchmark ended (a shared machine)."""
    return [round(v, 2) for v in os.getloadavg()]


def bench_slice_compare_pg_duckdb(work: Path, rows: int, repeat: int) -> dict:
    """``slice_compare_pg_duckdb_10m``; see the module docstring."""
    from dw_dagster.checks.reconcile import reconcile
    from dw_dagster_tests.benchmarks.run import _ours_peak, _timed

    try:  # the database is dropped even when loading it fails half-way
        sizes = _setup(work, rows)
        pg, duck = _databases(work)
        ours_t, peer_t = {}, {}
        for n in sizes:
            result = {}

            def ours():
                result["r"] = reconcile(pg, duck, f"src_{n}", f"tgt_{n}", ["region"], ["amount"])

            ours_t[n] = _timed(ours, repeat)
            r = result["r"]
            assert not r.passed and r.gap_rows == n // 200 and not r.unstable, (r.gap_rows, r.unstable)
        mem = _ours_peak({})
        for n in sizes:
            def peer():
                pg.fetch_all(f"SELECT region, COUNT(*), SUM(amount) FROM src_{n} GROUP BY region")
                duck.fetch_all(f"SELECT region, COUNT(*), SUM(amount) FROM tgt_{n} GROUP BY region")

            peer_t[n] = _timed(peer, repeat)
        curve = [_point(n, ours_t[n], peer_t[n]) for n in sizes]
        _print_curve("slice_compare_pg_duckdb", curve, "GROUP BYs")
        pg.dispose()
    finally:
        drop_database()
    top = sizes[-1]
    return {"name": "slice_compare_pg_duckdb_10m", "rows": top, "ours_s": ours_t[top],
            "peer": "two bare GROUP BY queries (one on PostgreSQL, one on DuckDB)", "peer_s": peer_t[top],
            "goal": 1.2, "curve": curve, "load_average": _load_average(),
            "note": "ours reads the PostgreSQL side in one REPEATABLE READ snapshot (its table locked ACCESS SHARE "
                    "first) instead of recounting it; the DuckDB side keeps its recount", **mem}
