"""Field cases of the guarded replay of parked rows (:mod:`dw_dagster.changes.replay`): changes
that are not plain inserts among a key's parked changes — a delete parked after the insert, and
stream positions that are numbers kept as text. On DuckDB, the replay's embedded warehouse (its
SQL is transpiled to BigQuery and Snowflake, tested elsewhere); the right answer is worked out in
Python from the same parked changes."""

import json

import pytest

from dw_dagster.databases import DuckDBDatabase
from dw_dagster.changes.replay import ReplaySpec, parked_states, replay_dead_letter, verify_replay
from dw_dagster_tests.field_cases.kinds import kind

R = "dw_dagster/changes/replay.py"
KINDS = [
    kind("replay-delete-after-parked-insert", "changes", "a key whose latest parked change is a delete (the insert was "
         "parked, then the key was deleted): replaying the insert would resurrect it",
         "https://github.com/confluentinc/kafka-connect-jdbc/issues/1562", R,
         "test_a_key_deleted_after_its_insert_was_parked_is_not_resurrected", True),
    kind("replay-positions-numbers-as-text", "changes", "stream positions that are numbers kept as text (Kafka offsets "
         "9 and 10): the newest parked change of a key is the higher number",
         "https://github.com/airbytehq/airbyte/issues/13814", R,
         "test_numeric_positions_kept_as_text_order_as_numbers", True),
]

REASON = "v: missing required field"


@pytest.fixture
def wh(tmp_path):
    db = DuckDBDatabase(tmp_path / "wh.duckdb")
    db.execute("CREATE SCHEMA a")
    db.execute("CREATE TABLE a.t (id BIGINT NOT NULL, v VARCHAR)")
    db.execute("CREATE TABLE a.dlq (id BIGINT, payload VARCHAR, error_reason VARCHAR, failed_at TIMESTAMP, "
               "source_position VARCHAR, source_ts TIMESTAMP, op VARCHAR)")
    return db


def _park(db, changes):
    """``(key, payload or None, position, op)`` per parked change, in the order the sink saw them."""
    for k, payload, pos, op in changes:
        p = "NULL" if payload is None else "'" + json.dumps(payload).replace("'", "''") + "'"
        db.execute(f"INSERT INTO a.dlq VALUES ({k}, {p}, '{REASON}', TIMESTAMP '2024-01-01 00:00:00', '{pos}', "
                   f"TIMESTAMP '2024-01-01 00:00:00', '{op}')")


def _spec(expected):
    return ReplaySpec(target_table="a.t", dead_letter_table="a.dlq", ledger_table="a.dlq_replayed", key="id",
                      columns=[("id", "BIGINT"), ("v", "VARCHAR")], reasons=[REASON], expected_rows=expected)


def _final_state(changes):
    """Python's answer: apply each key's changes in stream order (positions as numbers when they
    are numbers); the keys whose last change is not a delete, with their last payload."""
    rank = lambda pos: (0, int(pos)) if pos.isdigit() else (1, pos)  # noqa: E731
    last = {}
    for k, payload, pos, op in sorted(changes, key=lambda c: rank(c[2])):
        last[k] = None if op == "delete" else payload
    return {k: p["v"] for k, p in last.items() if p is not None}


def test_a_key_deleted_after_its_insert_was_parked_is_not_resurrected(wh):
    """kafka-connect-jdbc #1562 (https://github.com/confluentinc/kafka-connect-jdbc/issues/1562):
    a sink that applies a key's changes out of their order (updates first, then deletes) leaves the
    wrong row behind; here the order is lost at replay time. Key 2 was inserted with a NULL in a
    REQUIRED column (parked), then deleted at the source; a dead-letter sink that parks every later
    change of a parked key parks the delete too. The replay dropped deletes before taking each
    key's latest change, so it replayed the insert: a row deleted at the source came back. Right
    answer (Python, the changes applied in order): key 1 only; key 2's insert is recorded as
    superseded, never inserted, also on a second run."""
    changes = [(1, {"id": 1, "v": None}, "000001", "insert"), (2, {"id": 2, "v": None}, "000002", "insert"),
               (2, None, "000003", "delete")]
    _park(wh, changes)
    want = _final_state(changes)
    for _ in range(2):
        r = replay_dead_letter(wh, _spec(len(want)), "cs-1")
        assert dict(wh.fetch_all("SELECT id, v FROM a.t ORDER BY id")) == want == {1: None}
    assert r.states["superseded"] == 1 and r.states["replayed"] == 1
    assert parked_states(wh, _spec(1))["pending"] == 0
    assert verify_replay(wh, _spec(1)).passed


def test_numeric_positions_kept_as_text_order_as_numbers(wh):
    """airbyte #13814 (https://github.com/airbytehq/airbyte/issues/13814): cursor values compared
    as strings pick the wrong "latest" value. Kafka offsets (and binlog positions read as one
    number) kept in the VARCHAR ``source_position`` sort "9" after "10": of key 1's two parked
    changes the replay took the older one (offset 9, v NULL) over the newer (offset 10, v 'new').
    Right answer (Python, offsets as numbers): the change at offset 10 lands; zero-padded and
    non-numeric positions keep sorting as text."""
    changes = [(1, {"id": 1, "v": None}, "9", "insert"), (1, {"id": 1, "v": "new"}, "10", "update"),
               (2, {"id": 2, "v": "b"}, "99", "insert"), (2, {"id": 2, "v": None}, "100", "update")]
    _park(wh, changes)
    want = _final_state(changes)
    r = replay_dead_letter(wh, _spec(len(want)), "cs-1")
    assert dict(wh.fetch_all("SELECT id, v FROM a.t ORDER BY id")) == want == {1: "new", 2: None}
    assert r.states["superseded"] == 2
