"""The orders sink on the replayed change stream: dead-letter parking, the 9 % day, idempotence,
positions, the generic (VALUES + MERGE) path on PostgreSQL, payload replay helpers, hostile names."""

import dataclasses
import datetime as dt
import itertools
import uuid
from decimal import Decimal

import pytest

from dw_dagster.databases import sql
from dw_dagster.checks.dead_letter import parked_rows
from dw_dagster.checks.volume import volume_scores
from dw_dagster.databases import DuckDBDatabase
from dw_dagster_examples.orders import cdc, generator as g
from dw_dagster_examples.orders import sink as sk

SCALE = 0.005
REASON = "shipping_country: missing required field"
COLS = ", ".join(g.COLUMNS)


def table_rows(db, table: str = "analytics.orders") -> dict[int, dict]:
    return {r[0]: dict(zip(g.COLUMNS, r)) for r in db.fetch_all(f"SELECT {COLS} FROM {table}")}


def dlq_rows(db, table: str = "analytics.orders_dlq") -> list[tuple]:
    return db.fetch_all(f"SELECT order_id, error_reason, source_position, op, payload FROM {table} ORDER BY order_id")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The replay at SCALE sunk once into DuckDB (shared by the read-only tests below)."""
    db = DuckDBDatabase(tmp_path_factory.mktemp("orders") / "warehouse.duckdb")
    sink = sk.CdcSink(db, batch_rows=2_000, failed_at=sk.commit_time)
    result = sink.run(cdc.ReplaySource(SCALE))
    return db, sink, result


def test_replay_lands_the_source_minus_the_parked_gift_cards(replayed):
    db, sink, result = replayed
    final = g.final_rows(SCALE)
    nulls = {k for k, r in final.items() if r["shipping_country"] is None}
    assert len(nulls) == round(3_912 * SCALE) == result.parked
    assert result.reasons == {REASON: len(nulls)}
    assert all(b.applied + b.parked == b.events for b in result.batches)
    assert result.events == sum(1 for _ in g.changes(SCALE))
    assert table_rows(db) == {k: r for k, r in final.items() if k not in nulls}
    dlq = dlq_rows(db)
    assert {r[0] for r in dlq} == nulls and {r[1] for r in dlq} == {REASON} and {r[3] for r in dlq} == {"insert"}
    assert all(final[r[0]] == sk.payload_to_row(r[4]) for r in dlq)
    # the target column is REQUIRED in the warehouse itself
    nullable = db.fetch_all("SELECT is_nullable FROM information_schema.columns WHERE table_schema = 'analytics' "
                            "AND table_name = 'orders' AND column_name = 'shipping_country'")
    assert nullable == [("NO",)]


def test_the_checks_see_the_incident(replayed):
    db, _, _ = replayed
    e = g.expected(SCALE)
    scores, _ = volume_scores(db, "analytics.orders", "order_ts")
    tue = scores[-1]
    assert tue.day == g.INCIDENT_DAY and tue.rows == e.incident_landed
    assert tue.deviation_pct == e.deviation_pct and tue.status == "low"
    assert [s.status for s in scores[:-1]] == ["ok"] * 6
    reasons, _ = parked_rows(db, "analytics.orders_dlq", "failed_at", "error_reason",
                             dt.datetime.combine(g.INCIDENT_DAY, dt.time()))
    assert [(r.reason, r.rows) for r in reasons] == [(REASON, e.parked_rows)]
    assert reasons[0].first_parked >= g.RELEASE_TS  # commit_time clock: on the source's timeline
    before, _ = parked_rows(db, "analytics.orders_dlq", "failed_at", "error_reason", g.RELEASE_TS - dt.timedelta(days=30))
    assert sum(r.rows for r in before) == e.parked_rows  # 0 before Tuesday, all of them from the release on


def test_position_is_durable_and_a_second_run_reads_nothing(replayed):
    db, sink, result = replayed
    assert result.position == result.batches[-1].position == sink.last_position()
    assert result.position.log_file == cdc.REPLAY_LOG
    again = sk.CdcSink(db).run(cdc.ReplaySource(SCALE))  # resumes from the stored position
    assert again.events == 0 and again.position == result.position
    md = result.metadata()
    assert md[sk.POSITION_METADATA_KEY] == str(result.position)
    assert sk.position_from_metadata(md) == result.position
    assert md["dw/cdc_parked"] == result.parked and md["dw/cdc_parked_reasons"] == {REASON: result.parked}
    assert cdc.SourcePosition.parse(str(result.position)) == result.position
    assert cdc.SourcePosition.parse("binlog.000002:4") == cdc.SourcePosition("binlog.000002", 4, 0)
    with pytest.raises(ValueError):
        cdc.SourcePosition.parse("nope")
    # as text, positions sort in stream order (for ORDER BY source_position)
    ps = [cdc.SourcePosition("binlog.000001", 999, 12), cdc.SourcePosition("binlog.000001", 1_000, 3),
          cdc.SourcePosition("binlog.000001", 1_000, 10), cdc.SourcePosition("binlog.000002", 4, 0)]
    assert sorted(ps, key=str) == sorted(ps) == ps


def test_rerunning_and_resuming_are_idempotent(tmp_path, replayed):
    reference, _, ref_result = replayed
    want, want_dlq = table_rows(reference), dlq_rows(reference)
    db = DuckDBDatabase(tmp_path / "w.duckdb")
    sink = sk.CdcSink(db, batch_rows=777, failed_at=sk.commit_time)
    source = cdc.ReplaySource(SCALE)
    events = source.read()
    # a first run that stops ("crashes") after 5 batches, mid-transaction
    first = sink.apply(itertools.islice(events, 777 * 5))
    assert first.position.row != 0
    saved = first.position
    # the next run resumes from the stored position and finishes
    rest = sink.run(source)
    assert rest.batches[0].first_position == saved
    assert first.events + rest.events == ref_result.events
    assert table_rows(db) == want and dlq_rows(db) == want_dlq
    # re-running everything from the start (and from an old position) changes nothing, parks nothing twice
    again = sink.run(source, start=cdc.SourcePosition(cdc.REPLAY_LOG, 0, 0))
    assert again.parked == ref_result.parked
    partial = sink.run(source, start=cdc.SourcePosition(cdc.REPLAY_LOG, 3, 1))
    assert partial.events < ref_result.events
    assert table_rows(db) == want and dlq_rows(db) == want_dlq
    assert db.fetch_all("SELECT count(*), count(DISTINCT (order_id, source_position)) FROM analytics.orders_dlq")[0] == (
        ref_result.parked, ref_result.parked)


def test_net_effect_within_a_batch_matches_one_at_a_time(tmp_path):
    """insert → bad update (parked) → good update → delete → re-insert, in one batch and one by one."""
    base = {"order_id": 7, "customer_id": 1, "order_ts": dt.datetime(2026, 11, 24, 10), "amount": Decimal("10.00"),
            "currency": "USD", "payment_method": "card", "shipping_country": "US", "status": "placed",
            "updated_at": dt.datetime(2026, 11, 24, 10)}
    bad = {**base, "shipping_country": None, "status": "shipped"}
    good = {**base, "status": "shipped", "amount": Decimal("9.00")}
    other = {**base, "order_id": 8}
    steps = [("insert", None, base), ("update", base, bad), ("update", base, good), ("insert", None, other),
             ("delete", other, None), ("delete", good, None), ("insert", None, {**base, "amount": Decimal("11.50")})]
    ts = dt.datetime(2026, 11, 24, 11)
    events = [cdc.ChangeEvent(op, "shop", "orders", (a or b)["order_id"], b, a, ts, cdc.SourcePosition("replay", 0, i),
                              cdc.SourcePosition("replay", 0, i + 1)) for i, (op, b, a) in enumerate(steps)]
    outcomes = []
    for batch_rows in (100, 1):
        db = DuckDBDatabase(tmp_path / f"n{batch_rows}.duckdb")
        res = sk.CdcSink(db, batch_rows=batch_rows).apply(events)
        assert res.parked == 1 and res.applied == 6
        outcomes.append((table_rows(db), [r[:4] for r in dlq_rows(db)]))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == {7: {**base, "amount": Decimal("11.50")}}
    assert outcomes[0][1] == [(7, REASON, "replay:0000000000:000000001", "update")]


class _NotDuck:
    """DuckDB behind the plain Database protocol, to drive the sink's generic VALUES + MERGE path."""

    dialect = "duckdb"
    name = "duckdb-generic"

    def __init__(self, db):
        self._db = db

    def fetch_all(self, q):
        return self._db.fetch_all(q)

    def fetch_batches(self, q, batch_rows=100_000):
        return self._db.fetch_batches(q, batch_rows)

    def execute(self, q):
        self._db.execute(q)


def test_generic_path_gives_the_same_state(tmp_path):
    scale = 0.002
    fast = DuckDBDatabase(tmp_path / "fast.duckdb")
    sk.CdcSink(fast, batch_rows=1_500).run(cdc.ReplaySource(scale))
    inner = DuckDBDatabase(tmp_path / "generic.duckdb")
    res = sk.CdcSink(_NotDuck(inner), batch_rows=1_500).run(cdc.ReplaySource(scale))
    assert res.parked == round(3_912 * scale)
    assert table_rows(inner) == table_rows(fast) and dlq_rows(inner) == dlq_rows(fast)
    assert sk.CdcSink(_NotDuck(inner)).last_position() == res.position
    # re-run the second half: idempotent on this path too
    sk.CdcSink(_NotDuck(inner), batch_rows=1_500).run(cdc.ReplaySource(scale), start=res.batches[len(res.batches) // 2].first_position)
    assert table_rows(inner) == table_rows(fast) and dlq_rows(inner) == dlq_rows(fast)


def test_postgres_warehouse(postgres):
    """The same sink on PostgreSQL 15 (inline VALUES, MERGE), in a schema of its own."""
    scale = 0.002
    schema = f"t_{uuid.uuid4().hex[:10]}"
    table = dataclasses.replace(sk.ORDERS_TABLE, table=f"{schema}.orders", dead_letter_table=f"{schema}.orders_dlq",
                         state_table=f"{schema}.orders_cdc_state")
    try:
        sink = sk.CdcSink(postgres, table, batch_rows=1_500)
        res = sink.run(cdc.ReplaySource(scale))
        final = g.final_rows(scale)
        nulls = {k for k, r in final.items() if r["shipping_country"] is None}
        assert res.parked == len(nulls) == round(3_912 * scale)
        assert table_rows(postgres, f"{schema}.orders") == {k: r for k, r in final.items() if k not in nulls}
        assert {r[0] for r in dlq_rows(postgres, f"{schema}.orders_dlq")} == nulls
        assert sink.last_position() == res.position
        sink.run(cdc.ReplaySource(scale), start=cdc.SourcePosition("replay", 0))  # idempotent
        assert len(dlq_rows(postgres, f"{schema}.orders_dlq")) == len(nulls)
        # the SQL twin of payload_to_row works on PostgreSQL too
        back = postgres.fetch_all(sk.replay_select_sql(table, "postgres"))
        assert {r[0]: dict(zip(g.COLUMNS, r[2:])) for r in back} == {k: final[k] for k in nulls}
    finally:
        postgres.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_payload_round_trip_and_replay_sql(replayed):
    db, _, _ = replayed
    final = g.final_rows(SCALE)
    via_sql = db.fetch_all(sk.replay_select_sql(sk.ORDERS_TABLE, "duckdb"))
    assert len(via_sql) == round(3_912 * SCALE)
    for key, position, *values in via_sql:
        row = dict(zip(g.COLUMNS, values))
        assert row == final[key] and row["shipping_country"] is None
        payload = db.fetch_all(f"SELECT payload FROM analytics.orders_dlq WHERE source_position = '{position}'")[0][0]
        assert sk.payload_to_row(payload) == row
        # after the column is relaxed the same row is accepted
        assert sk.coerce_row(row, sk.ORDERS_TABLE)[1] == REASON
        assert sk.coerce_row(row, sk.ORDERS_TABLE.with_nullable("shipping_country")) == (row, None)
    for dialect in ("bigquery", "snowflake", "postgres"):
        assert "orders_dlq" in sk.replay_select_sql(sk.ORDERS_TABLE, dialect)


def test_coerce_row_reasons():
    ok = {"order_id": "5", "customer_id": 1, "order_ts": "2026-11-24T10:00:00+01:00", "amount": "12.5",
          "currency": "EUR", "payment_method": "card", "shipping_country": "DE", "status": "placed",
          "updated_at": dt.datetime(2026, 11, 24, 9)}
    row, reason = sk.coerce_row(ok)
    assert reason is None and row["order_id"] == 5 and row["amount"] == Decimal("12.50")
    assert row["order_ts"] == dt.datetime(2026, 11, 24, 9)  # aware → naive UTC
    assert sk.coerce_row({**ok, "shipping_country": None}) == (None, REASON)
    missing = {k: v for k, v in ok.items() if k not in ("shipping_country", "currency")}
    assert sk.coerce_row(missing)[1] == "currency: missing required field; shipping_country: missing required field"
    assert sk.coerce_row({**ok, "amount": "12.345"})[1] == "amount: not a DECIMAL(18,2): '12.345'"  # never rounded
    assert sk.coerce_row({**ok, "amount": "1e17"})[1].startswith("amount: not a DECIMAL(18,2)")
    assert sk.coerce_row({**ok, "order_id": True})[1].startswith("order_id: not a BIGINT")
    assert sk.coerce_row({**ok, "order_ts": "yesterday"})[1].startswith("order_ts: not a TIMESTAMP")
    with pytest.raises(ValueError):
        sk.payload_to_row("[1, 2]")


@pytest.mark.parametrize("bad", ['analytics.orders"; DROP TABLE analytics.orders; --', "analytics.ord`ers",
                                 "analytics.orders\n", "orders", "a.b.c.d", "analytics.1orders", "analytics..orders",
                                 "analytics.orders OR 1=1"])
def test_hostile_table_names_are_refused(bad):
    with pytest.raises(sql.UnsafeIdentifierError):
        dataclasses.replace(sk.ORDERS_TABLE, table=bad)
    with pytest.raises(sql.UnsafeIdentifierError):
        dataclasses.replace(sk.ORDERS_TABLE, dead_letter_table=bad)
    with pytest.raises(sql.UnsafeIdentifierError):
        dataclasses.replace(sk.ORDERS_TABLE, state_table=bad)


@pytest.mark.parametrize("bad", ["order_id; DROP TABLE x", "ship`country", "a b", "", "x" * 65, "1col", 'c"'])
def test_hostile_column_and_source_names_are_refused(bad):
    with pytest.raises(sql.UnsafeIdentifierError):
        sk.Column(bad, "VARCHAR")
    with pytest.raises(sql.UnsafeIdentifierError):
        dataclasses.replace(sk.ORDERS_TABLE, key=bad)
    with pytest.raises(sql.UnsafeIdentifierError):
        cdc.ReplaySource(0.001, table=bad)
    conn = cdc.MySQLConnection(port=1)  # never reached: names are checked before connecting
    with pytest.raises(sql.UnsafeIdentifierError):
        cdc.BinlogSource(conn, schema=bad)
    with pytest.raises(sql.UnsafeIdentifierError):
        cdc.apply_changes(conn, [], table=bad)
    with pytest.raises(sql.UnsafeIdentifierError):
        cdc.source_ddl(schema=bad)


def test_table_spec_validation():
    with pytest.raises(ValueError, match="not a column"):
        dataclasses.replace(sk.ORDERS_TABLE, key="nope")
    with pytest.raises(ValueError, match="unsupported column type"):
        sk.Column("x", "STRUCT(a INT)")
    with pytest.raises(ValueError, match="used by the sink"):
        dataclasses.replace(sk.ORDERS_TABLE, columns=(*sk.ORDERS_COLUMNS, sk.Column("dw_op", "VARCHAR")))
    relaxed = sk.ORDERS_TABLE.with_nullable("shipping_country")
    assert "shipping_country" not in relaxed.required and "shipping_country" in sk.ORDERS_TABLE.required
    with pytest.raises(ValueError):
        sk.ORDERS_TABLE.with_nullable("order_id")
    ddl = sk.CdcSink(DuckDBDatabase(":memory:")).ddl()
    assert any("shipping_country VARCHAR NOT NULL" in s or "shipping_country TEXT NOT NULL" in s for s in ddl)
