"""LocalDuckDB: a private in-memory database on a connection of one process-wide DuckDB.

Opening a new in-memory DuckDB costs ~30 ms, paid per cross-database diff, per late-row and
dead-letter diagnosis (the migration benchmark paid it 300 times per wave); a connection of one
shared instance with a private database attached costs under a millisecond. What must still hold:
two LocalDuckDBs — in two threads at once, with the same table names — never see each other's
tables, Arrow views or session settings, and closing one gives its memory back.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from dw_dagster.databases import LocalDuckDB
from dw_dagster.databases import duckdb as duck


def _attached() -> set[str]:
    return {r[0] for r in duck._shared_instance().execute("SELECT database_name FROM duckdb_databases()").fetchall()}


def test_two_locals_with_the_same_table_names_do_not_meet():
    a, b = LocalDuckDB(), LocalDuckDB()
    try:
        a.execute("CREATE TABLE dw_bs AS SELECT 1 AS v")
        b.execute("CREATE TABLE dw_bs AS SELECT 2 AS v UNION ALL SELECT 3")
        a.con.register("dw_batch", pa.table({"x": [10]}))
        assert a.fetch_all("SELECT * FROM dw_bs") == [(1,)]
        assert sorted(b.fetch_all("SELECT * FROM dw_bs")) == [(2,), (3,)]
        with pytest.raises(Exception, match="dw_batch"):
            b.fetch_all("SELECT * FROM dw_batch")  # an Arrow view belongs to its connection
        b.execute("SET TimeZone = 'America/Chicago'")
        assert a.fetch_all("SELECT current_setting('TimeZone')") == [("UTC",)]
    finally:
        a.close()
        b.close()


def test_close_detaches_the_private_database_and_is_idempotent():
    local = LocalDuckDB()
    name = local._db
    local.execute("CREATE TABLE t AS SELECT range AS v FROM range(1000)")
    assert name in _attached()
    local.close()
    local.close()
    assert name not in _attached()


def test_locals_in_threads_at_once_each_count_their_own_rows():
    errors, counts, names = [], {}, []

    def work(i: int) -> None:
        local = LocalDuckDB()
        names.append(local._db)
        try:
            for _ in range(20):
                local.execute("CREATE OR REPLACE TABLE dw_d AS SELECT range AS v FROM range(?)".replace("?", str(100 + i)))
                counts[i] = local.fetch_all("SELECT COUNT(*) FROM dw_d")[0][0]
                assert counts[i] == 100 + i
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            local.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and counts == {i: 100 + i for i in range(6)}
    assert not set(names) & _attached()  # (other tests' LocalDuckDBs may be open in this process)


def test_a_local_collected_unclosed_gives_its_database_back():
    import gc

    local = LocalDuckDB()
    name = local._db
    local.execute("CREATE TABLE t AS SELECT range AS v FROM range(1000)")
    del local
    gc.collect()
    assert name not in _attached()
