"""The undo's snapshot, restore and row checksum on the server engines, not only DuckDB.

The checksum (the sum of each row's 48-bit md5 modulo a prime, computed in the warehouse) was built
from the cross-database diff's hash, which has no MySQL/MariaDB form: an undo on a MariaDB warehouse
was refused with "no portable row checksum for 'mysql' warehouses". It is computed there with
``MD5`` and ``CONV`` now. Values a checksum must tell apart on every engine: NULL against ``''``,
trailing blanks, a changed decimal, a row moved to another day of the window.
"""

from __future__ import annotations

import uuid

import pytest

from dw_dagster.core.models import UndoPlan
from dw_dagster.databases import SqlAlchemyDatabase
from dw_dagster.repair.undo import partition_checksum, restore_partitions, snapshot_partitions, undo_promise

WINDOW = ["2026-11-03", "2026-11-04"]
#: 40 orders over four days, every fifth note NULL
INSERT = "INSERT INTO orders VALUES " + ", ".join(
    f"({i}, DATE '2026-11-0{2 + i % 4}', {i}.25, {'NULL' if i % 5 == 0 else repr('n' + str(i))})" for i in range(1, 41))
EXPECTED = 11341506475  # the window's checksum, measured on both engines (and DuckDB: the last test)


@pytest.fixture(params=["mariadb", "postgres"])
def db(request):
    import sqlalchemy as sa

    name = f"dw_undo_{uuid.uuid4().hex[:8]}"
    if request.param == "mariadb":
        admin = sa.create_engine("mysql+pymysql://root@127.0.0.1:3306")
        with admin.begin() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        out = SqlAlchemyDatabase(f"mysql+pymysql://root@127.0.0.1:3306/{name}")
        drop = [f"DROP DATABASE {name}", "DROP DATABASE IF EXISTS dw_undo"]
    else:
        admin = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test")
        with admin.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {name}")
        out = SqlAlchemyDatabase(f"postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{name}")
        drop = [f"DROP SCHEMA {name} CASCADE", "DROP SCHEMA IF EXISTS dw_undo CASCADE"]
    out.execute("CREATE TABLE orders (id INT, day DATE, amount DECIMAL(12, 2), note VARCHAR(20))")
    out.execute(INSERT)
    yield out
    out.dispose()
    with admin.begin() as conn:
        for statement in drop:
            conn.exec_driver_sql(statement)
    admin.dispose()


def test_a_snapshot_is_restored_and_its_checksum_tells_every_change_apart(db):
    plan = UndoPlan(resource_key="warehouse", table="orders", partition_column="day", window=WINDOW)
    before = partition_checksum(db, "orders", "day", WINDOW)
    assert before[0] == 20
    snap = snapshot_partitions(db, plan, "cs-undo-engines")
    assert (snap["rows"], snap["checksum"]) == before
    assert sum(p["rows"] for p in snap["per_partition"].values()) == 20  # neighbouring days merged in one slice
    for change in ("UPDATE orders SET note = '' WHERE id = 5",  # NULL -> ''
                   "UPDATE orders SET note = 'n2 ' WHERE id = 2",  # a trailing blank
                   "UPDATE orders SET amount = amount + 0.01 WHERE id = 6",
                   "UPDATE orders SET day = DATE '2026-11-04' WHERE id = 1"):  # moved to the other day of the window
        db.execute(change)
        after = partition_checksum(db, "orders", "day", WINDOW)
        assert after[0] == 20 and after != before, change
        restored = restore_partitions(db, plan, snap)
        assert partition_checksum(db, "orders", "day", WINDOW) == before, change
        assert undo_promise(snap, restored)["verified"], change
    (n,), = db.fetch_all("SELECT COUNT(*) FROM orders")
    assert n == 40  # the days outside the window untouched


def test_the_checksum_is_the_same_number_on_mariadb_and_postgresql(db):
    """The same rows give the same checksum on every engine (md5 of the same row text): the number a
    receipt records means the same thing whichever warehouse it came from."""
    assert partition_checksum(db, "orders", "day", WINDOW) == (20, EXPECTED)


def test_the_checksum_is_the_same_number_on_duckdb(tmp_path):
    from dw_dagster.databases import DuckDBDatabase

    duck = DuckDBDatabase(tmp_path / "wh.duckdb")
    duck.execute("CREATE TABLE orders (id INT, day DATE, amount DECIMAL(12, 2), note VARCHAR(20))")
    duck.execute(INSERT)
    assert partition_checksum(duck, "orders", "day", WINDOW) == (20, EXPECTED)
