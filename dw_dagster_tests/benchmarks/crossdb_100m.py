"""``rowdiff_crossdb_100m``: the cross-database row diff at 100M rows per side, and its memory curve.

:func:`~dw_dagster.checks.rowdiff.row_diff_across` between two DuckDB files (the tables of
:mod:`.run`: 0.5 % of the keys missing, 0.5 % of the amounts changed) at three sizes, ``rows`` ×
0.1, 0.3 and 1 (10M, 30M and 100M per side with ``--scale 10``). Run by hand, never by ``make
bench``'s default list: ``make bench BENCH_ARGS="--scale 10 --repeat 1 --only rowdiff_crossdb_100m"``.

Goal (issue 15, items 3 and 5): the diff's peak memory ≤ 1 GB at every size and flat in the rows
(``meets_goal``: every size's peak ≤ 1,024 MB and the largest size's at most 1.25 × the smallest
size's, ``memory_flat``). Each size runs in a fresh child process (``spawn``), so its
``peak_rss_mb`` (``ru_maxrss``) is that size's own; ``base_rss_mb`` is the child's resident memory
after the imports, before the diff. The two "remote" databases are DuckDB files opened inside that
process (``memory_limit`` 1 GB each, one open at a time: each query opens and closes its
connection), so the peak includes DuckDB's buffer pool for the file being scanned.

Per size, ``curve`` holds the seconds (median of ``repeat`` below the largest size, once at the
largest), seconds per million rows, the peak, and what moved between the two databases and this
process: ``bytes_fetched`` (Arrow buffer bytes of the bucket checksums and of the downloaded rows,
as counted by ``row_diff_across``), ``bytes_sent`` (the SQL, which carries the bucket lists),
``bytes_moved`` (their sum), ``rows_downloaded`` and ``download_passes``.

Peer: reladiff ``hashdiff`` on the same two files, each size in a fresh child (its own peak,
``peer_peak_rss_mb``), stopped after :data:`PEER_TIMEOUT_S` seconds (1,200; ``DW_BENCH_PEER_TIMEOUT_S``) (then ``peer_s`` is None at
that size and ``peer_note`` says so). Key sets: at every size the peer finished, our differing keys
(a separate run with the sample as large as the differences, in its own child: its memory is not
the measured one) and reladiff's are compared by count and by the sha256 of the sorted keys, never
as two Python sets in one process.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
import resource
import time
from pathlib import Path

FRACTIONS = (0.1, 0.3, 1.0)
COLUMNS = ("region", "amount", "note")
PEER_TIMEOUT_S = int(os.environ.get("DW_BENCH_PEER_TIMEOUT_S", "1200"))
GOAL_MB = 1024
FLAT_FACTOR = 1.25


def _sizes(rows: int) -> list[int]:
    """The curve's sizes, each a multiple of 200 (so the differences are exact counts)."""
    return sorted({max(200, int(rows * f) // 200 * 200) for f in FRACTIONS})


def _write(work: Path, sizes: list[int]) -> None:
    """``a.duckdb`` with ``src_<n>`` and ``b.duckdb`` with ``tgt_<n>`` for every size (the first
    ``n`` keys of the largest table)."""
    import duckdb

    from dw_dagster_tests.benchmarks.run import MEMORY_LIMIT, _write_tables

    top = max(sizes)
    for file, table in (("a.duckdb", "src"), ("b.duckdb", "tgt")):
        _write_tables(work / file, top, (table,))
        con = duckdb.connect(str(work / file), config={"memory_limit": MEMORY_LIMIT, "threads": 2})
        for n in sizes:
            con.execute(f"CREATE TABLE {table}_{n} AS SELECT * FROM {table} WHERE id < {n}")
        con.execute(f"DROP TABLE {table}")
        con.execute("CHECKPOINT")
        con.close()


def _rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _digest(keys) -> tuple[int, str]:
    """(count, sha256 of the sorted keys, one per line)."""
    ordered = sorted(keys)
    return len(ordered), hashlib.sha256("\n".join(map(str, ordered)).encode()).hexdigest()


def _ours(work: Path, n: int, repeat: int, out) -> None:
    """One size of ours, in a child: timed ``repeat`` times with a 10-key sample."""
    from dw_dagster.checks.rowdiff import row_diff_across
    from dw_dagster_tests.benchmarks.run import _db, _timed

    a, b = _db(work / "a.duckdb"), _db(work / "b.duckdb")
    base = _rss_mb()
    got = {}

    def run():
        got["r"] = row_diff_across(a, b, f"src_{n}", f"tgt_{n}", ["id"], list(COLUMNS), max_download_rows=5 * n,
                                   sample_limit=10)

    s = _timed(run, repeat)
    r = got["r"]
    assert (r.missing, r.extra, r.changed) == (n // 200, 0, n // 200), (r.missing, r.extra, r.changed)
    out.put({"rows": n, "ours_s": round(s, 3), "ours_s_per_m_rows": round(s / (n / 1e6), 3), "peak_rss_mb": _rss_mb(),
             "base_rss_mb": base, "buckets": r.buckets_compared, "buckets_downloaded": r.buckets_downloaded,
             "rows_downloaded": r.rows_downloaded, "download_passes": r.download_passes,
             "bytes_fetched": r.bytes_fetched, "bytes_sent": r.bytes_sent, "bytes_moved": r.bytes_fetched + r.bytes_sent})


def _our_keys(work: Path, n: int, out) -> None:
    """Our differing keys at one size (the sample as large as the differences), as a digest."""
    from dw_dagster.checks.rowdiff import row_diff_across
    from dw_dagster_tests.benchmarks.run import _db

    r = row_diff_across(_db(work / "a.duckdb"), _db(work / "b.duckdb"), f"src_{n}", f"tgt_{n}", ["id"], list(COLUMNS),
                        max_download_rows=5 * n, sample_limit=n // 100)
    out.put(_digest(int(e.key[0]) for e in r.sample))


def _peer(work: Path, n: int, out) -> None:
    """reladiff hashdiff at one size, in a child: seconds, peak, and its differing keys' digest."""
    import reladiff

    t = time.perf_counter()
    a = reladiff.connect_to_table(f"duckdb://{work / 'a.duckdb'}", f"src_{n}", "id", extra_columns=COLUMNS)
    b = reladiff.connect_to_table(f"duckdb://{work / 'b.duckdb'}", f"tgt_{n}", "id", extra_columns=COLUMNS)
    keys = {int(row[1][0]) for row in reladiff.diff_tables(a, b, algorithm=reladiff.Algorithm.HASHDIFF)}
    s = time.perf_counter() - t
    count, digest = _digest(keys)
    out.put({"peer_s": round(s, 3), "peer_s_per_m_rows": round(s / (n / 1e6), 3), "peer_peak_rss_mb": _rss_mb(),
             "peer_keys": count, "peer_digest": digest})


def _in_child(target, *args, timeout: float | None = None):
    """Run ``target(*args, queue)`` in a fresh spawned process and return the one result it
    puts; None when it runs past ``timeout`` seconds (it is then terminated).

    Raises:
        RuntimeError: the child exited without a result.
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    start = time.monotonic()
    try:
        while True:
            try:
                return q.get(timeout=5)
            except queue.Empty:
                if not p.is_alive():
                    raise RuntimeError(f"{target.__name__}{args[1:]} exited {p.exitcode} without a result") from None
                if timeout is not None and time.monotonic() - start > timeout:
                    p.terminate()
                    return None
    finally:
        p.join()


def bench_rowdiff_crossdb_100m(work: Path, rows: int, repeat: int) -> dict:
    """``rowdiff_crossdb_100m``; see the module docstring."""
    sizes = _sizes(rows)
    t = time.perf_counter()
    p = mp.get_context("spawn").Process(target=_write, args=(work, sizes))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"generating the tables failed (exit {p.exitcode})")
    print(f"  wrote {', '.join(f'{n:,}' for n in sizes)} rows per side in {time.perf_counter() - t:.1f} s", flush=True)
    curve = []
    for n in sizes:
        point = _in_child(_ours, work, n, repeat if n < sizes[-1] else 1)
        print(f"  ours {n:,} rows: {point['ours_s']} s ({point['ours_s_per_m_rows']} s/M rows), peak "
              f"{point['peak_rss_mb']} MB (base {point['base_rss_mb']} MB), {point['bytes_moved']:,} bytes moved, "
              f"{point['download_passes']} passes", flush=True)
        curve.append(point)
    peer_note, identical = [], True
    for point in curve:
        n = point["rows"]
        theirs = _in_child(_peer, work, n, timeout=PEER_TIMEOUT_S)
        if theirs is None:
            peer_note.append(f"reladiff stopped after {PEER_TIMEOUT_S} s at {n:,} rows")
            print(f"  {peer_note[-1]}", flush=True)
            point.update(peer_s=None, ratio=None)
            break  # a larger size would take longer still
        ours_keys = _in_child(_our_keys, work, n)
        same = ours_keys == (theirs.pop("peer_keys"), theirs.pop("peer_digest"))
        identical &= same
        point.update(theirs, ratio=round(point["ours_s"] / theirs["peer_s"], 3), identical_key_sets=same,
                     differing_keys=ours_keys[0])
        print(f"  reladiff {n:,} rows: {theirs['peer_s']} s, peak {theirs['peer_peak_rss_mb']} MB; key sets "
              f"{'identical' if same else 'DIFFER'} ({ours_keys[0]:,} keys)", flush=True)
    top, low = curve[-1], curve[0]
    flat = top["peak_rss_mb"] <= FLAT_FACTOR * low["peak_rss_mb"]
    under = all(c["peak_rss_mb"] <= GOAL_MB for c in curve)
    print("  curve: " + "; ".join(f"{c['rows']:,} rows {c['ours_s_per_m_rows']} s/M, {c['peak_rss_mb']} MB, "
                                  f"{c['bytes_moved'] / 1e6:,.1f} MB moved" for c in curve), flush=True)
    return {"name": "rowdiff_crossdb_100m", "rows": top["rows"], "ours_s": top["ours_s"],
            "peer": "reladiff hashdiff (each size in its own process, timed once)", "peer_s": top.get("peer_s"),
            "goal": GOAL_MB, "goal_unit": "MB", "meets_goal": bool(flat and under), "memory_flat": flat,
            "identical_key_sets": identical, "peer_note": "; ".join(peer_note) or None,
            "bytes_moved": top["bytes_moved"], "curve": curve, "ours_peak_rss_mb": max(c["peak_rss_mb"] for c in curve),
            "peak_rss_mb": max(c["peak_rss_mb"] for c in curve)}
