"""Real binlog CDC end to end: the generator's changes applied to a private MariaDB with row-based
binary logging, read back with mysql-replication, sunk into DuckDB with the dead-letter queue.

The server is started by :mod:`dw_dagster_tests.harness.mariadb_server` for this module and removed after.
"""

import datetime as dt
import itertools
import uuid
from decimal import Decimal

import pytest

from dw_dagster.databases import DuckDBDatabase
from dw_dagster_examples.orders import cdc, generator as g
from dw_dagster_examples.orders import sink as sk
from dw_dagster_tests.harness.mariadb_server import mariadb_server

SCALE = 0.005
TXN_ROWS = 500
REASON = "shipping_country: missing required field"
COLS = ", ".join(g.COLUMNS)


def strip(e: cdc.ChangeEvent) -> tuple:
    return e.op, e.key, e.before, e.after, e.ts


def warehouse(db) -> dict[int, dict]:
    return {r[0]: dict(zip(g.COLUMNS, r)) for r in db.fetch_all(f"SELECT {COLS} FROM analytics.orders")}


def dlq(db) -> list[tuple]:
    return db.fetch_all("SELECT order_id, error_reason, op, payload FROM analytics.orders_dlq ORDER BY order_id")


@pytest.fixture(scope="module")
def server():
    try:
        with mariadb_server() as s:
            yield s
    except RuntimeError as e:  # pragma: no cover - the machines have the server binaries
        pytest.fail(f"a MariaDB server with row-based binary logging is required: {e}")


@pytest.fixture(scope="module")
def loaded(server):
    """The changes at SCALE applied to ``shop.orders``; the binlog read once from before the first one."""
    conn = cdc.MySQLConnection(server.host, server.port, server.user, server.password)
    schema = "shop" if server.private else f"dw_test_{uuid.uuid4().hex[:8]}"
    src = cdc.BinlogSource(conn, schema=schema)
    start = src.current_position()
    applied = cdc.apply_changes(conn, g.changes(SCALE), schema=schema, txn_rows=TXN_ROWS)
    events = list(src.read(start))
    yield conn, src, start, applied, events
    if not server.private:  # pragma: no cover - fallback to a shared server
        con = conn.connect(autocommit=True)
        with con.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {schema}")
        con.close()


def test_binlog_events_are_the_replay(loaded):
    _, src, start, applied, events = loaded
    replay = list(cdc.ReplaySource(SCALE, txn_rows=TXN_ROWS).read())
    assert [strip(e) for e in events] == [strip(e) for e in replay]  # op, key, images, commit time
    assert applied.inserts == sum(e.op == "insert" for e in events)
    assert applied.updates == sum(e.op == "update" for e in events) > 0
    assert applied.deletes == sum(e.op == "delete" for e in events) > 0
    first = events[0]
    assert isinstance(first.after["amount"], Decimal) and isinstance(first.after["order_ts"], dt.datetime)
    assert first.schema == src.schema and first.table == "orders"
    # positions: strictly increasing; inside a transaction next_position is the next event's position
    for a, b in zip(events, events[1:]):
        assert a.position < b.position and a.next_position <= b.position
        if a.position.log_pos == b.position.log_pos:
            assert a.next_position == b.position
    assert all(e.position.log_file.startswith("binlog.") for e in events)
    assert start <= events[0].position


def test_cdc_into_duckdb_matches_mariadb_and_parks_the_gift_cards(loaded, tmp_path):
    conn, src, start, _, events = loaded
    db = DuckDBDatabase(tmp_path / "cdc.duckdb")
    sink = sk.CdcSink(db, batch_rows=1_000)
    # a first run that stops after 3 batches (mid-transaction), then a run that resumes from the stored position
    crashed = sink.apply(itertools.islice(src.read(start), 3_000), start=start)
    assert sink.last_position() == crashed.position and crashed.position.row != 0
    rest = sink.run(src)
    assert crashed.events + rest.events == len(events)
    assert rest.batches[0].first_position == crashed.position
    source = cdc.source_rows(conn, schema=src.schema)
    bad = {k for k, r in source.items() if r["shipping_country"] is None}
    assert bad == {k for k, r in source.items() if r["payment_method"] == "gift_card" and r["order_ts"] >= g.RELEASE_TS}
    assert len(bad) == round(3_912 * SCALE) == crashed.parked + rest.parked
    assert warehouse(db) == {k: r for k, r in source.items() if k not in bad}
    parked = dlq(db)
    assert {r[0] for r in parked} == bad and {r[1] for r in parked} == {REASON} and {r[2] for r in parked} == {"insert"}
    assert all(sk.payload_to_row(r[3]) == source[r[0]] for r in parked)
    # the replay source gives the very same warehouse (the demo's server-less path)
    replay_db = DuckDBDatabase(tmp_path / "replay.duckdb")
    sk.CdcSink(replay_db, batch_rows=4_000).run(cdc.ReplaySource(SCALE, txn_rows=TXN_ROWS))
    assert warehouse(replay_db) == warehouse(db) and dlq(replay_db) == parked
    # sinking the same binlog again from the start parks nothing twice and changes nothing
    sink.run(src, start=start)
    assert warehouse(db) == {k: r for k, r in source.items() if k not in bad} and dlq(db) == parked


def test_resuming_from_a_saved_position_reads_nothing_twice(loaded, tmp_path):
    conn, src, start, _, events = loaded
    k = len(events) // 3
    while events[k].next_position.row == 0:  # a cursor inside a transaction
        k += 1
    assert list(src.read(events[k].next_position)) == events[k + 1:]
    end = events[-1].next_position
    assert list(src.read(end)) == []
    # new changes after the saved position: exactly those are read, and the sink applies them
    db = DuckDBDatabase(tmp_path / "w.duckdb")
    sink = sk.CdcSink(db, batch_rows=5_000)
    sink.apply(events, start=start)
    assert sink.last_position() == end
    existing = next(e.after for e in reversed(events) if e.op == "insert" and e.after["payment_method"] == "card")
    t = cdc._mysql_table(src.schema, "orders")
    now = dt.datetime(2026, 11, 25, 7, 0, 0)
    con = conn.connect(autocommit=False)
    try:
        with con.cursor() as cur:
            cur.execute("FLUSH BINARY LOGS")  # the saved position is now in an older file than the new changes
            cur.execute(f"INSERT INTO {t} ({COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (99_000_001, 5, now, Decimal("50.00"), "USD", "gift_card", None, "fulfilled", now))
            cur.execute(f"UPDATE {t} SET status = 'shipped', updated_at = %s WHERE order_id = %s", (now, existing["order_id"]))
            con.commit()
            cur.execute(f"DELETE FROM {t} WHERE order_id = %s", (existing["order_id"],))
            con.commit()
    finally:
        con.close()
    new = list(src.read(end))
    assert [(e.op, e.key) for e in new] == [("insert", 99_000_001), ("update", existing["order_id"]),
                                            ("delete", existing["order_id"])]
    assert new[1].before == existing and new[1].after["status"] == "shipped"
    assert all(e.position.log_file > end.log_file for e in new)  # read across the rotation
    res = sink.run(src)  # from the stored position
    assert res.events == 3 and res.parked == 1 and res.reasons == {REASON: 1}
    assert existing["order_id"] not in warehouse(db)
    assert 99_000_001 in {r[0] for r in dlq(db)}
    assert list(src.read(res.position)) == []


def test_server_settings_are_checked(server, loaded):
    if not server.private:  # pragma: no cover - never change a shared server's settings
        pytest.skip("only on the private server")
    conn, src, start, _, _ = loaded
    con = conn.connect(autocommit=True)
    try:
        with con.cursor() as cur:
            cur.execute("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
        with pytest.raises(cdc.CdcConfigError, match="binlog_row_metadata=MINIMAL"):
            src.check_server()
        with pytest.raises(cdc.CdcConfigError):
            next(iter(src.read(start)))
    finally:
        with con.cursor() as cur:
            cur.execute("SET GLOBAL binlog_row_metadata = 'FULL'")
        con.close()
    assert src.check_server()["binlog_row_metadata"] == "FULL"
    with pytest.raises(ValueError, match="replay position"):
        next(iter(src.read(cdc.SourcePosition(cdc.REPLAY_LOG, 0))))
    assert "s3cret" not in repr(cdc.MySQLConnection(password="s3cret"))
    assert cdc.MySQLConnection.from_url("mysql://u:p%40ss@db.example:3307") == cdc.MySQLConnection(
        "db.example", 3307, "u", "p@ss")


def test_a_server_without_row_based_binlog_is_refused():
    """The shared MariaDB on 3306 runs without a binary log: the reader says what is missing."""
    from dw_dagster_tests.harness.mariadb_server import SHARED_URL

    src = cdc.BinlogSource(cdc.MySQLConnection.from_url(SHARED_URL))
    try:
        src.check_server()
    except cdc.CdcConfigError as e:
        assert "need ROW" in str(e) or "log_bin=OFF" in str(e)
        return
    except Exception as e:  # pragma: no cover - no shared server here
        pytest.skip(f"no shared MariaDB at {SHARED_URL.split('@')[-1]}: {type(e).__name__}")
    pytest.skip("the shared server has a row-based binary log")  # pragma: no cover
