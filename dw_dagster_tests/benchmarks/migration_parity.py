"""``migration_parity_100_pairs``: one full parity evaluation of a wave of 100 table pairs, PostgreSQL → DuckDB.

Ours: one run of the wave's job (``dw_migration__bench__w1``, in process, on an ephemeral instance):
the parity multi-check evaluating every pair — schema parity (both catalogs, the types mapped, key
uniqueness), counts and exact sums per slice, the cross-database key diff (sampled by key buckets:
the wave's rule compares every key below 50,000 source rows and buckets 0..0 of 16 above) — and
then the wave asset with the gate. Peer: the same counts and sums per slice written as bare SQL,
one ``GROUP BY`` on each side per pair, sequentially, on one open connection per engine, in the same
run (until 2026-12 the peer opened the DuckDB file for each statement, as ``DuckDBDatabase.fetch_all``
does: 20 ms a statement, 60 % of the peer's time, which made the ratio read 1.8 instead of about
3.5). Goal: ratio ≤ 1.5, peak ≤ 1 GB. Beside them: ``evaluation_only_s``, the same evaluation without
Dagster (the pairs' kinds on the check's thread pool and connections, nothing stored), and
``dagster_s``, the rest of ours: the run, its 300 check evaluations stored and the wave asset.

Data (not timed; generated in a process of its own): ``pairs`` tables of ``rows`` rows each in a
PostgreSQL database of its own (``dw_bench_migration``, dropped afterwards; an integer primary key,
a region among 5, a DECIMAL(18,2) amount, a VARCHAR note), ``VACUUM ANALYZE``-d; their copies in one
DuckDB file (1 GB memory limit), every tenth with one row missing and one amount changed.

Usage: ``python -m dw_dagster_tests.benchmarks.run --only migration_parity_100_pairs``
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import statistics
import time
from pathlib import Path

PG_HOST = os.environ.get("DW_BENCH_PG_HOST", "127.0.0.1")
PG_USER = os.environ.get("DW_BENCH_PG_USER", "postgres")
PG_DB = "dw_bench_migration"
PAIRS, ROWS = 100, 100_000


def _url(db: str, driver: str = "+psycopg") -> str:
    return f"postgresql{driver}://{PG_USER}@{PG_HOST}:5432/{db}"


def _admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(_url("postgres", ""), autocommit=True) as con:
        con.execute(statement)


def _generate(work: Path, pairs: int, rows: int) -> None:
    import duckdb
    import psycopg

    _admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
    _admin(f"CREATE DATABASE {PG_DB}")
    with psycopg.connect(_url(PG_DB, ""), autocommit=True) as con:
        con.execute("CREATE SCHEMA pos")
        for i in range(pairs):
            con.execute(f"CREATE TABLE pos.t{i} (id BIGINT PRIMARY KEY, region VARCHAR(16) NOT NULL, "
                        "amount DECIMAL(18,2) NOT NULL, note VARCHAR(32))")
            con.execute(f"INSERT INTO pos.t{i} SELECT g, (ARRAY['Midwest','Northeast','Southeast','Southwest','West'])"
                        f"[1 + g % 5], ((g * 7919) % 100000) / 100.0, 'n' || (g % 97) FROM generate_series(1, {rows}) g")
        con.execute("VACUUM ANALYZE")
    wh = duckdb.connect(str(work / "wh.duckdb"), config={"memory_limit": "1GB", "threads": 2})
    wh.execute("CREATE SCHEMA pos")
    for i in range(pairs):
        wh.execute(f"CREATE TABLE pos.t{i} (id BIGINT, region VARCHAR, amount DECIMAL(18,2), note VARCHAR)")
        wh.execute(f"INSERT INTO pos.t{i} SELECT g, ['Midwest','Northeast','Southeast','Southwest','West'][1 + g % 5], "
                   f"CAST(((g * 7919) % 100000) / 100.0 AS DECIMAL(18,2)), 'n' || (g % 97) FROM range(1, {rows + 1}) r(g)")
        if i % 10 == 0:
            wh.execute(f"DELETE FROM pos.t{i} WHERE id = 16")
            wh.execute(f"UPDATE pos.t{i} SET amount = amount + 1 WHERE id = 32")
    wh.close()


def _migration(work: Path, pairs: int) -> dict:
    """The migration's configuration: one wave of ``pairs`` pairs ``pos.t<i>`` (PostgreSQL) → ``pos.t<i>`` (DuckDB)."""
    return {"name": "bench", "max_workers": 4, "key_diff": {"full_below_rows": 50_000, "sample": [1, 16]},
            "waves": [{"name": "w1", "domain": "bench", "pairs": [
                {"source": {"database": "pg", "table": f"pos.t{i}"},
                 "target": {"asset": f"t{i}", "database": "wh", "table": f"pos.t{i}"},
                 "key": ["id"], "slice_by": ["region"], "sums": ["amount"]} for i in range(pairs)]}]}


def _definitions(work: Path, pairs: int):
    import dagster as dg

    from dw_dagster import build_dw_definitions

    (work / "domains.yaml").write_text("domains:\n  - name: bench\n    assets: [[migration, bench, w1]]\n"
                                       "    approvers: [owner@bench.example]\n    identity: unverified\n")
    cfg = {"domains": str(work / "domains.yaml"),
           "databases": {"pg": {"url": _url(PG_DB)}, "wh": {"url": f"duckdb:///{work}/wh.duckdb"}},
           "migration": _migration(work, pairs)}
    specs = [dg.AssetSpec(f"t{i}") for i in range(pairs)]
    return dg.Definitions.merge(build_dw_definitions(cfg, assets=specs), dg.Definitions(assets=specs))


def _bare(pg, wh, pairs: int) -> None:
    """The peer: each pair's counts and sums per slice, one ``GROUP BY`` per side, on one open connection per
    engine (``pg`` a SQLAlchemy database and its pool, ``wh`` a DuckDB connection), sequentially."""
    for i in range(pairs):
        q = f"SELECT region, COUNT(*), SUM(amount) FROM pos.t{i} GROUP BY region"
        pg.fetch_all(q)
        wh.execute(q).fetchall()


def _evaluation_only(work: Path, pairs: int) -> float:
    """Seconds of the wave's parity evaluation without Dagster: every pair's kinds on the same thread pool
    (``max_workers``) and connections as the check, no events stored (the rest of ours is Dagster's)."""
    from concurrent.futures import ThreadPoolExecutor

    from dw_dagster.databases import DuckDBDatabase, SqlAlchemyDatabase
    from dw_dagster.migration.checks import _anchors, evaluate_pair
    from dw_dagster.migration.config import MigrationConfig, pair_kinds

    mc = MigrationConfig.model_validate(_migration(work, pairs))
    dbs = {"pg": SqlAlchemyDatabase(_url(PG_DB)), "wh": DuckDBDatabase(work / "wh.duckdb")}
    anchors = _anchors(dbs)
    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(mc.max_workers) as pool:
            list(pool.map(lambda p: evaluate_pair(p, pair_kinds(p), dbs["pg"], dbs["wh"], rule=mc.key_diff,
                                                  anchors=anchors), mc.waves[0].pairs))
        return time.perf_counter() - t0
    finally:
        for con in anchors.values():
            con.close()
        dbs["pg"].dispose()


def bench_migration_parity(work: Path, rows: int, repeat: int, pairs: int = PAIRS) -> dict:
    """Ours (the wave job) and the peer (bare counts and sums), ``repeat`` times each, medians (module docstring)."""
    import dagster as dg

    from dw_dagster.databases import DuckDBDatabase, SqlAlchemyDatabase

    os.environ.setdefault("DW_APPROVAL_SIGNING_KEY", "bench-signing-key-0123456789abcdef")
    p = mp.get_context("spawn").Process(target=_generate, args=(work, pairs, rows))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError("generating the migration benchmark's tables failed")
    try:
        defs = _definitions(work, pairs)
        job = defs.resolve_job_def("dw_migration__bench__w1")
        ours, failing = [], None
        for _ in range(repeat):
            instance = dg.DagsterInstance.ephemeral()
            t0 = time.perf_counter()
            result = job.execute_in_process(instance=instance, raise_on_error=False)
            ours.append(time.perf_counter() - t0)
            assert result.success
            failed = [e.event_specific_data for e in result.all_events
                      if e.event_type_value == "ASSET_CHECK_EVALUATION" and not e.event_specific_data.passed]
            failing = sorted({d.asset_key.to_user_string() for d in failed})
        ours_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        evaluation = statistics.median(_evaluation_only(work, pairs) for _ in range(repeat))
        pg, peer = SqlAlchemyDatabase(_url(PG_DB)), []
        with DuckDBDatabase(work / "wh.duckdb").connect() as wh:
            for _ in range(repeat):
                t0 = time.perf_counter()
                _bare(pg, wh, pairs)
                peer.append(time.perf_counter() - t0)
        pg.dispose()
        expected = sorted(f"t{i}" for i in range(0, pairs, 10))
        unexpected = [f"{d.asset_key.to_user_string()}:{d.check_name}: {d.description[:200]}" for d in failed
                      if d.asset_key.to_user_string() not in expected]
        return {"name": "migration_parity_100_pairs" if pairs == PAIRS else f"migration_parity_{pairs}_pairs",
                "rows": rows * pairs, "pairs": pairs, "rows_per_pair": rows, "ours_s": statistics.median(ours),
                "peer": "bare SQL counts + sums per slice, both sides, sequential, one open connection per engine",
                "peer_s": statistics.median(peer), "evaluation_only_s": round(evaluation, 3),
                "dagster_s": round(statistics.median(ours) - evaluation, 3),
                "goal": 1.5, "ours_peak_rss_mb": round(ours_peak, 1),
                "failing_pairs_found": failing == expected, "unexpected_failures": unexpected[:5],
                "note": "ours: one run of the wave job (schema, counts+sums, key diff sampled 1/16 above 50k rows, "
                        "4 pairs at a time) and the wave asset, in process, ephemeral instance"}
    finally:
        _admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")


__all__ = ["bench_migration_parity"]
