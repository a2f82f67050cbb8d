"""The guarded replay of parked orders (examples/dw_dagster_examples/orders/replay.py) on embedded DuckDB.

The orders stream is sunk once at a small scale (its gift-card orders from the release parked in
analytics.orders_dlq); each test works on its own copy of that warehouse.
"""

import datetime as dt
import json
import shutil

import pytest
import sqlglot

from dw_dagster.databases import sql
from dw_dagster.databases import DuckDBDatabase
from dw_dagster_examples.orders import cdc
from dw_dagster_examples.orders import generator as g
from dw_dagster_examples.orders import sink as sk
from dw_dagster.checks.dead_letter import parked_rows
from dw_dagster.changes.replay import (
    ReplayRefused,
    ReplaySpec,
    classify,
    ensure_replay_tables,
    parked_states,
    replay_dead_letter,
    replay_step,
    undo_replay,
    verify_replay,
)

SCALE = 0.005
PARKED = round(3_912 * SCALE)
REASON = "shipping_country: missing required field"
RELAX = "ALTER TABLE analytics.orders ALTER COLUMN shipping_country DROP NOT NULL"
COLS = ", ".join(g.COLUMNS)


@pytest.fixture(scope="module")
def sunk(tmp_path_factory):
    path = tmp_path_factory.mktemp("orders_replay") / "warehouse.duckdb"
    result = sk.CdcSink(DuckDBDatabase(path), batch_rows=5_000).run(cdc.ReplaySource(SCALE))
    assert result.parked == PARKED
    return path, g.final_rows(SCALE)


@pytest.fixture
def db(sunk, tmp_path):
    path = tmp_path / "warehouse.duckdb"
    shutil.copy(sunk[0], path)
    return DuckDBDatabase(path)


def spec(expected=PARKED, **kw) -> ReplaySpec:
    return ReplaySpec.for_sink_table(sk.ORDERS_TABLE, expected_rows=expected, reasons=[REASON], **kw)


def rows(db) -> dict[int, dict]:
    return {r[0]: dict(zip(g.COLUMNS, r)) for r in db.fetch_all(f"SELECT {COLS} FROM analytics.orders")}


def count(db, table="analytics.orders") -> int:
    return db.fetch_all(f"SELECT count(*) FROM {table}")[0][0]


def test_after_the_relax_every_parked_row_lands_once_and_a_rerun_inserts_nothing(db, sunk):
    final = sunk[1]
    before = count(db)
    db.execute(RELAX)
    res = replay_dead_letter(db, spec(), "cs-a")
    assert (res.inserted_rows, res.already_replayed_rows, res.rejected_rows) == (PARKED, 0, 0)
    assert res.required_columns == [c for c in g.COLUMNS if c != "shipping_country"]  # read from the catalog
    assert count(db) == before + PARKED
    assert rows(db) == final  # the target now equals the source, the gift cards with NULL shipping_country
    v = verify_replay(db, spec())
    assert (v.parked_keys, v.present_once, v.missing, v.duplicated, v.passed) == (PARKED, PARKED, 0, 0, True)
    again = replay_dead_letter(db, spec(), "cs-a")
    assert (again.inserted_rows, again.already_replayed_rows, again.rejected_rows) == (0, PARKED, 0)
    # only the classification and the (idempotent) recording of skipped rows ran: nothing inserted
    assert count(db) == before + PARKED and len(again.sql) == 2 and again.states["replayed"] == PARKED
    assert count(db, "analytics.orders_dlq") == PARKED  # the dead-letter table stays the record
    assert db.fetch_all("SELECT count(*), count(DISTINCT order_id), min(change_set_id) "
                        "FROM analytics.orders_dlq_replayed")[0] == (PARKED, PARKED, "cs-a")


def test_without_the_relax_the_rows_fail_again_and_stay_parked(db):
    before = count(db)
    res = replay_dead_letter(db, spec(), "cs-a")
    assert (res.inserted_rows, res.rejected_rows) == (0, PARKED)
    assert res.rejected_reasons == {REASON: PARKED}
    assert len(res.rejected_sample) == min(20, PARKED) and res.rejected_sample == sorted(res.rejected_sample)
    assert count(db) == before and count(db, "analytics.orders_dlq_replayed") == 0
    # once the column is relaxed, the same change set replays them
    db.execute(RELAX)
    assert replay_dead_letter(db, spec(), "cs-a").inserted_rows == PARKED


@pytest.mark.parametrize("expected", [PARKED - 1, PARKED + 1, 0])
def test_refused_when_the_count_is_not_what_the_change_set_expected(db, expected):
    db.execute(RELAX)
    before = count(db)
    with pytest.raises(ReplayRefused, match=f"expected {expected} row"):
        replay_dead_letter(db, spec(expected), "cs-a")
    assert count(db) == before and count(db, "analytics.orders_dlq_replayed") == 0


def test_more_rows_parked_since_the_proposal_refuse_it(db):
    db.execute(RELAX)
    proposal = classify(db, spec(0), "cs-a")
    assert (proposal.selected, proposal.new, proposal.rejected) == (PARKED, PARKED, 0)
    until = db.fetch_all("SELECT max(failed_at) FROM analytics.orders_dlq")[0][0]
    # the release keeps writing NULLs: one more gift card parked an hour after the proposal
    db.execute("INSERT INTO analytics.orders_dlq SELECT order_id + 1000000000, payload, error_reason, "
               "failed_at + INTERVAL 1 HOUR, source_position || '+', source_ts, op FROM analytics.orders_dlq "
               "ORDER BY order_id LIMIT 1")
    with pytest.raises(ReplayRefused) as e:
        replay_dead_letter(db, spec(PARKED), "cs-a")
    assert (e.value.details["new"], e.value.details["expected_rows"]) == (PARKED + 1, PARKED)
    # the change set bounds its selection to what was parked by the proposal: it still runs, exactly as approved
    res = replay_dead_letter(db, spec(PARKED, parked_until=until), "cs-a")
    assert res.inserted_rows == PARKED and res.before.selected == PARKED


def test_a_key_that_landed_meanwhile_or_was_replayed_elsewhere_refuses_it(db):
    db.execute(RELAX)
    assert replay_dead_letter(db, spec(), "cs-a").inserted_rows == PARKED
    with pytest.raises(ReplayRefused) as e:  # a second change set finds every key replayed by the first
        replay_dead_letter(db, spec(), "cs-b")
    assert (e.value.details["new"], e.value.details["replayed_elsewhere"]) == (0, PARKED)
    undo_replay(db, spec(), "cs-a")
    # one parked key lands through the stream (a newer accepted change) before the replay
    key = db.fetch_all("SELECT min(order_id) FROM analytics.orders_dlq")[0][0]
    db.execute(f"INSERT INTO analytics.orders SELECT {', '.join(f'{c}' for c in g.COLUMNS)} FROM "
               f"({sk.replay_select_sql()}) WHERE order_id = {key}")
    with pytest.raises(ReplayRefused) as e:
        replay_dead_letter(db, spec(), "cs-c")
    assert (e.value.details["new"], e.value.details["in_target_not_replayed"]) == (PARKED - 1, 1)


def test_an_interrupted_replay_is_completed_by_the_next_run(db):
    db.execute(RELAX)
    # the ledger insert happened, the target insert did not (a crash between the two statements)
    db.execute("CREATE TABLE analytics.orders_dlq_replayed (order_id BIGINT NOT NULL, source_position VARCHAR NOT NULL, "
               "change_set_id VARCHAR NOT NULL, replayed_at TIMESTAMP NOT NULL)")
    db.execute("INSERT INTO analytics.orders_dlq_replayed SELECT order_id, source_position, 'cs-a', now()::TIMESTAMP "
               "FROM analytics.orders_dlq ORDER BY order_id LIMIT 5")
    res = replay_dead_letter(db, spec(), "cs-a")
    assert (res.inserted_rows, res.already_replayed_rows) == (PARKED, 0)
    assert verify_replay(db, spec()).passed


def test_the_latest_parked_change_of_a_key_wins_and_a_bad_value_stays_parked(db, sunk):
    db.execute(RELAX)
    first, second = (r[0] for r in db.fetch_all("SELECT order_id FROM analytics.orders_dlq ORDER BY order_id LIMIT 2"))
    # a later parked update of `first` (status changed), and a payload of `second` whose amount does not fit
    payload = json.loads(db.fetch_all(f"SELECT payload FROM analytics.orders_dlq WHERE order_id = {first}")[0][0])
    later = json.dumps({**payload, "status": "refunded"})
    db.execute(f"INSERT INTO analytics.orders_dlq SELECT order_id, {sql.literal(later).sql('duckdb')}, error_reason, failed_at, "
               f"'replay:9999999999:000000000', source_ts, 'update' FROM analytics.orders_dlq WHERE order_id = {first}")
    bad = json.loads(db.fetch_all(f"SELECT payload FROM analytics.orders_dlq WHERE order_id = {second}")[0][0])
    db.execute(f"UPDATE analytics.orders_dlq SET payload = {sql.literal(json.dumps({**bad, 'amount': '12.345'})).sql('duckdb')} "
               f"WHERE order_id = {second}")
    res = replay_dead_letter(db, spec(), "cs-a")  # PARKED keys: still one row per key
    assert (res.inserted_rows, res.rejected_rows) == (PARKED - 1, 1)
    assert res.rejected_reasons == {"amount: not a DECIMAL(18,2)": 1} and res.rejected_sample == [second]
    got = rows(db)
    assert got[first]["status"] == "refunded" and second not in got
    v = verify_replay(db, spec())
    assert (v.missing, v.missing_sample, v.passed) == (1, [second], False)


def test_every_parked_row_ends_in_a_recorded_state(db):
    db.execute(RELAX)
    view = ensure_replay_tables(db, spec(0))
    keys = [r[0] for r in db.fetch_all("SELECT order_id FROM analytics.orders_dlq ORDER BY order_id LIMIT 3")]
    newer, dup, landed = keys
    payload = json.loads(db.fetch_all(f"SELECT payload FROM analytics.orders_dlq WHERE order_id = {newer}")[0][0])
    later = sql.literal(json.dumps({**payload, "status": "refunded"})).sql("duckdb")
    # `newer`: a later parked update supersedes its first parked row; `dup`: the same change parked
    # twice (a redelivery: same payload, a later position); `landed`: reached the target meanwhile
    db.execute(f"INSERT INTO analytics.orders_dlq SELECT order_id, {later}, error_reason, failed_at, "
               f"'replay:9999999999:000000001', source_ts, 'update' FROM analytics.orders_dlq WHERE order_id = {newer}")
    db.execute("INSERT INTO analytics.orders_dlq SELECT order_id, payload, error_reason, failed_at, "
               f"'replay:9999999999:000000002', source_ts, op FROM analytics.orders_dlq WHERE order_id = {dup}")
    db.execute(f"INSERT INTO analytics.orders SELECT {COLS} FROM ({sk.replay_select_sql()}) WHERE order_id = {landed}")
    assert count(db, view) == PARKED + 2  # every parked row waits
    res = replay_dead_letter(db, spec(PARKED - 1), "cs-a")  # the landed key is not due
    assert res.inserted_rows == PARKED - 1
    expect = {"replayed": PARKED - 1, "superseded": 1, "duplicate": 1, "already_landed": 1, "pending": 0}
    assert res.states == expect == parked_states(db, spec(0))
    assert count(db, view) == 0  # nothing left pending: the dead-letter check over the view passes
    reasons, _ = parked_rows(db, view, "failed_at", "error_reason", dt.datetime(2000, 1, 1))
    assert reasons == []
    got = {tuple(r) for r in db.fetch_all("SELECT order_id, state FROM analytics.orders_dlq_resolved")}
    assert got == {(newer, "superseded"), (dup, "duplicate"), (landed, "already_landed")}
    # a re-run records nothing twice; the undo puts every row back to pending
    assert replay_dead_letter(db, spec(PARKED - 1), "cs-a").states == expect
    undo_replay(db, spec(0), "cs-a")
    assert parked_states(db, spec(0))["pending"] == PARKED + 2 and count(db, view) == PARKED + 2


def test_undo_removes_exactly_the_replayed_keys(db):
    db.execute(RELAX)
    before = rows(db)
    replay_dead_letter(db, spec(), "cs-a")
    assert undo_replay(db, spec(), "cs-a") == PARKED
    assert rows(db) == before and count(db, "analytics.orders_dlq_replayed") == 0
    assert replay_dead_letter(db, spec(), "cs-a2").inserted_rows == PARKED  # can be replayed again, once


def test_selection_bounds(db):
    db.execute(RELAX)
    earliest = db.fetch_all("SELECT min(failed_at) FROM analytics.orders_dlq")[0][0]
    assert classify(db, spec(0, parked_until=earliest - dt.timedelta(seconds=1)), "cs-a").selected == 0
    assert classify(db, spec(0, parked_since=earliest), "cs-a").selected == PARKED
    other = ReplaySpec.for_sink_table(sk.ORDERS_TABLE, expected_rows=0, reasons=["currency: missing required field"])
    assert classify(db, other, "cs-a").selected == 0
    assert classify(db, ReplaySpec.for_sink_table(sk.ORDERS_TABLE, expected_rows=0), "cs-a").selected == PARKED  # any reason


def test_pushed_down_sql_for_each_warehouse(db):
    db.execute(RELAX)
    res = replay_dead_letter(db, spec(), "cs-a")
    ledger, target, resolve = res.sql[1:]
    assert resolve.startswith("INSERT INTO analytics.orders_dlq_resolved") and "'superseded'" in resolve
    for dialect in ("bigquery", "snowflake"):  # the recording of skipped rows transpiles too
        sqlglot.parse_one(sqlglot.transpile(resolve, read="duckdb", write=dialect)[0], read=dialect)
    assert ledger.startswith("INSERT INTO analytics.orders_dlq_replayed") and "FROM analytics.orders_dlq AS d" in ledger
    assert target.startswith("INSERT INTO analytics.orders (order_id,") and "TRY_CAST(" in target
    step = replay_step(spec(), resource_key="warehouse", change_set_id="cs-a", dialect="bigquery",
                       required_columns=["order_id"])
    (shown,) = step.sql
    assert "SAFE_CAST((JSON_EXTRACT_SCALAR(s.dw_payload, '$.amount')) AS NUMERIC(18, 2)) AS amount" in shown
    assert step.kind == "replay" and step.change_class == "replay_dead_letter" and step.expected_rows == PARKED
    assert step.rollback_sql[0].startswith("DELETE FROM analytics.orders WHERE order_id IN")
    for dialect in ("bigquery", "snowflake", "duckdb"):
        for s in step.rollback_sql:
            sqlglot.parse_one(s, read=dialect)


@pytest.mark.parametrize("bad", ["analytics.orders; DROP TABLE x", "analytics.ord`ers", "orders", "a..b"])
def test_hostile_table_names_are_refused(bad):
    with pytest.raises(ValueError):
        ReplaySpec(target_table=bad, dead_letter_table="a.b", ledger_table="a.c", key="k", columns=[("k", "BIGINT")],
                   expected_rows=0)


@pytest.mark.parametrize("bad", ["k; DROP TABLE x", "ship`country", "a b", "1col", "c'"])
def test_hostile_column_names_are_refused(bad):
    with pytest.raises(ValueError):
        ReplaySpec(target_table="a.b", dead_letter_table="a.c", ledger_table="a.d", key="k", columns=[(bad, "BIGINT")],
                   expected_rows=0)
    with pytest.raises(ValueError):
        ReplaySpec(target_table="a.b", dead_letter_table="a.c", ledger_table="a.d", key=bad, columns=[("k", "BIGINT")],
                   expected_rows=0)


def test_reasons_are_literals_not_sql(db):
    db.execute(RELAX)
    hostile = ReplaySpec.for_sink_table(sk.ORDERS_TABLE, expected_rows=0, reasons=["x' OR 1=1 --"])
    assert classify(db, hostile, "cs-'a").selected == 0


def test_the_dead_letter_fix_adds_the_test_that_would_have_caught_it(db, tmp_path):
    """Issue 31: the dead-letter fix's change set carries a dead-letter test in its diff (named in
    new_tests and verify_checks); the test fails on the parked rows and passes once they are replayed.
    The field case: https://github.com/airbytehq/airbyte/issues/12336 (rows accumulate where nobody
    counts them until a person notices)."""
    from dw_dagster.core import keys as c
    from dw_dagster.core.domains import Domain
    from dw_dagster.core.models import BlastRadius, CauseFinding, Diagnosis, Incident, utcnow
    from dw_dagster.diagnosis.sink_diagnoser import propose_required_null_fix
    from dw_dagster.repair.new_tests import run_test_file

    finding = CauseFinding(kind="required_null_dead_letter", summary="parked", confidence=1.0, explained_rows=PARKED,
                           unexplained_rows=0, details={"nulls_per_column": {"shipping_country": PARKED},
                                                        "null_rows_dead_lettered": PARKED,
                                                        "dead_letter": {"errors": [{"error": REASON}]}})
    inc = Incident(id="inc-dl", asset_key=["orders"], source="manual", detected_at=utcnow(), summary="short", gap_rows=PARKED)
    diag = Diagnosis(id="dg-dl", incident_id=inc.id, asset_key=["orders"], created_at=utcnow(), causes=[finding],
                     blast_radius=BlastRadius(root="orders"), gap_rows=PARKED, unexplained_rows=0)
    domain = Domain(name="orders", assets=[["orders"]], approvers=["o@x"])
    cs = propose_required_null_fix(incident=inc, diagnosis=diag, finding=finding, domain=domain, target=db,
                                   sink_table=sk.ORDERS_TABLE, verify_checks=[["orders", "dead_letter"]], tests_dir="tests",
                                   pipeline_root=tmp_path)
    without = propose_required_null_fix(incident=inc, diagnosis=diag, finding=finding, domain=domain, target=db,
                                        sink_table=sk.ORDERS_TABLE)
    assert without.diff == "" and without.new_tests == []  # no tests_dir: as before
    (path,) = cs.new_tests
    assert path == "tests/dw_dead_letter_outstanding__analytics__orders_dlq.sql" and f"b/{path}" in cs.diff
    assert ["orders", c.NEW_TESTS_CHECK] in cs.verify_checks and "add the test" in cs.summary
    (tmp_path / "tests").mkdir()
    (tmp_path / path).write_text("".join(line[1:] for line in cs.diff.splitlines(keepends=True)
                                         if line.startswith("+") and not line.startswith("+++")))
    ensure_replay_tables(db, spec())  # the replay ledger the test reads (the replay step creates it too)
    assert run_test_file(db, tmp_path, path) == {"test": path, "passed": False, "failing_rows": 1}  # one error, parked
    db.execute(RELAX)
    replay_dead_letter(db, spec(), cs.id)
    assert run_test_file(db, tmp_path, path)["passed"]
