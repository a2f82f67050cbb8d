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


def test_threads_set_for_a_fresh_open_and_left_alone_when_this_process_has_the_file_open(tmp_path):
    """``connect(threads=1)`` (the volume sensor's count session) sets the instance's threads when it opens
    the file; when this process has the file open already (a resource's own connection), DuckDB refuses a
    second configuration, and the connection is made to that instance, its setting untouched. DuckDB
    refuses a connection whose user-provided settings differ from the open instance's since
    https://github.com/duckdb/duckdb/pull/13129; the same refusal hit duckdb_engine's pooled
    connections: https://github.com/Mause/duckdb_engine/issues/1127."""
    import duckdb

    db = DuckDBDatabase(tmp_path / "w.duckdb")
    db.execute("CREATE TABLE t AS SELECT 1 AS a")
    with db.connect(threads=1) as con:
        assert con.execute("SELECT current_setting('threads')").fetchone() == (1,)
    held = duckdb.connect(db.path)
    (threads,) = held.execute("SELECT current_setting('threads')").fetchone()
    try:
        with db.connect(threads=1) as con:
            assert con.execute("SELECT a FROM t").fetchall() == [(1,)]
            assert con.execute("SELECT current_setting('threads')").fetchone() == (threads,)
        assert held.execute("SELECT current_setting('threads')").fetchone() == (threads,)
    finally:
        held.close()


def test_the_volume_count_session_opens_a_subclass_whose_connect_takes_no_threads(tmp_path):
    import contextlib

    from dw_dagster.detection.volume import VolumeTable, fetch_row_counts

    class Own(DuckDBDatabase):
        @contextlib.contextmanager
        def connect(self):
            with super().connect() as con:
                yield con

    db = Own(tmp_path / "w.duckdb")
    db.execute("CREATE TABLE t AS SELECT 1 AS a")
    spec = VolumeTable("t", "t")
    assert fetch_row_counts(db, [spec]).counts[spec.id].rows == 1
