"""DuckDBDatabase waits for another process's file lock instead of failing (parallel Dagster steps)."""

import multiprocessing as mp
import time

import pytest

from dw_dagster.databases import DuckDBDatabase


def _hold_lock(path: str, seconds: float, ready) -> None:
    import duckdb

    con = duckdb.connect(path)
    ready.set()
    time.sleep(seconds)
    con.close()


def test_waits_for_lock_held_by_another_process(tmp_path):
    db = DuckDBDatabase(tmp_path / "w.duckdb")
    db.execute("CREATE TABLE t AS SELECT 42 AS a")
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(db.path, 1.5, ready))
    holder.start()
    try:
        assert ready.wait(60)
        assert db.fetch_all("SELECT a FROM t") == [(42,)]
    finally:
        holder.join(30)


def test_gives_up_after_lock_wait(tmp_path):
    db = DuckDBDatabase(tmp_path / "w.duckdb")
    db.execute("CREATE TABLE t AS SELECT 1 AS a")
    db.lock_wait_s = 0.5
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(db.path, 4.0, ready))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(Exception, match="lock"):
            db.fetch_all("SELECT a FROM t")
    finally:
        holder.join(30)
