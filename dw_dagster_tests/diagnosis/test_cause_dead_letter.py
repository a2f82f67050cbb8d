"""PUBLIC_CASES.md C19: NULLs in a REQUIRED column go to a dead-letter table (or are dropped)."""

import datetime as dt
import uuid

import pytest

from dw_dagster.databases import DuckDBDatabase
from dw_dagster.diagnosis.causes.dead_letter import DeadLetterTable, diagnose_required_nulls

DLQ = DeadLetterTable("events_dlq", ["id"], payload_column="payload", error_column="error")


def _c19(db, schema="main", variant="A", required_in_ddl=True):
    """source events(id 1..10, customer_id, amount), customer_id NULL for 4 and 7; target misses 4, 7 (C: and 9)."""
    s = schema
    db.execute(f"CREATE TABLE {s}.events (id INT, customer_id INT, amount DECIMAL(10,2))")
    db.execute(f"INSERT INTO {s}.events VALUES " + ", ".join(
        f"({i}, {'NULL' if i in (4, 7) else 100 + i}, {i}.50)" for i in range(1, 11)))
    db.execute(f"CREATE TABLE {s}.events_t (id INT, customer_id INT{' NOT NULL' if required_in_ddl else ''}, amount DECIMAL(10,2))")
    landed = [1, 2, 3, 5, 6, 8, 10] + ([] if variant == "C" else [9])
    db.execute(f"INSERT INTO {s}.events_t SELECT * FROM {s}.events WHERE id IN ({', '.join(map(str, landed))})")
    db.execute(f"CREATE TABLE {s}.events_dlq (id INT, payload VARCHAR, error VARCHAR)")
    if variant != "B":
        db.execute(f"INSERT INTO {s}.events_dlq VALUES (4, '{{\"id\": 4, \"customer_id\": null}}', 'missing required field'), "
                   f"(7, '{{\"id\": 7, \"customer_id\": null}}', 'missing required field')")


def _run(db, variant_gap, dlq=DLQ, target=None, **kw):
    return diagnose_required_nulls(db, target or db, source_table="events", target_table="events_t", key_columns=["id"],
                                   dead_letter=dlq, gap_rows=variant_gap, **kw)


def test_c19_a_nulls_routed_to_dead_letter(duck):
    _c19(duck, variant="A")
    f = _run(duck, 2)
    assert f.kind == "required_null_dead_letter" and f.details["variant"] == "dead_letter"
    assert f.summary.startswith("NULL in REQUIRED column customer_id → dead letter")
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (2, 0, 1.0)
    assert f.details["required_columns"] == ["customer_id"]  # read from the target's NOT NULL
    assert f.details["required_columns_source"].startswith("target catalog")
    assert (f.details["missing_rows"], f.details["missing_with_null"], f.details["null_rows_dead_lettered"]) == (2, 2, 2)
    assert f.details["explained_keys"] == [[4], [7]] and f.details["explained_keys_complete"]
    assert f.details["dlq_keys_equal_missing_null_keys"] is True
    assert f.details["dead_letter"]["errors"] == [{"error": "missing required field", "rows": 2}]
    assert "Not a partition backfill" in f.details["remediation"]
    keys = next(e for e in f.evidence if e.description.startswith("missing keys explained"))
    assert [v["key"] for v in keys.values["explained"]] == [[4], [7]] and keys.values["unexplained"] == []
    payloads = next(e for e in f.evidence if "payload" in e.description)
    assert [v["key"] for v in payloads.values] == [[4], [7]] and '"customer_id": null' in payloads.values[0]["payload"]
    assert all(e.sql and e.database for e in f.evidence)
    assert f.details["pushed_down"] is True


def test_c19_b_empty_dead_letter_means_dropped(duck):
    _c19(duck, variant="B")
    f = _run(duck, 2)
    assert f.details["variant"] == "dropped_no_dead_letter_record"
    assert f.summary.startswith("NULL in REQUIRED column customer_id → dropped, no dead-letter record")
    assert (f.explained_rows, f.unexplained_rows) == (2, 0)
    assert f.confidence == 0.6 < 1.0  # lower: nothing records the rejection
    assert f.details["dlq_keys_equal_missing_null_keys"] is False
    # no dead-letter table at all: the same label
    g = _run(duck, 2, dlq=None)
    assert g.details["variant"] == "dropped_no_dead_letter_record" and g.confidence == 0.6
    assert "no dead-letter table" in g.summary
    # a dead-letter table named but missing: said so, not an error
    h = _run(duck, 2, dlq=DeadLetterTable("nope_dlq", ["id"]))
    assert h.details["variant"] == "dropped_no_dead_letter_record" and "nope_dlq not found" in h.details["dead_letter"]["note"]


def test_c19_c_remainder_is_unexplained(duck):
    _c19(duck, variant="C")
    f = _run(duck, 3)
    assert f.details["variant"] == "dead_letter"
    assert (f.explained_rows, f.unexplained_rows) == (2, 1)
    assert f.details["unexplained_sample"] == [[9]]
    assert f.confidence == round(2 / 3, 4)
    assert "1 unexplained" in f.summary and "[[9]]" in f.summary
    assert f.details["explained_keys"] == [[4], [7]]


def test_required_columns_given_when_the_catalog_does_not_say(duck):
    _c19(duck, variant="A", required_in_ddl=False)
    f = _run(duck, 2)  # no NOT NULL in the target: no REQUIRED column known, only the dead-letter records
    assert (f.details["required_columns"], f.details["variant"], f.details["other_rows_dead_lettered"]) == ([], "no_required_nulls", 2)
    assert f.explained_rows == 2 and "parked in events_dlq for another reason" in f.summary
    assert _run(duck, 2, dlq=None).details["tested"] is False  # neither REQUIRED columns nor a DLQ: not testable
    g = _run(duck, 2, required_columns=["customer_id"])
    assert (g.explained_rows, g.details["variant"], g.details["required_columns_source"]) == (2, "dead_letter", "given")


def test_no_nulls_is_not_this_cause(duck):
    """Failing case: rows missing for another reason, DLQ empty — nothing explained, all reported."""
    _c19(duck, variant="B")
    duck.execute("UPDATE events SET customer_id = 1 WHERE customer_id IS NULL")
    f = _run(duck, 2, required_columns=["customer_id"])
    assert f.details["variant"] == "no_required_nulls"
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (0, 2, 0.0)
    assert f.details["unexplained_sample"] == [[4], [7]] and f.window == []
    assert f.details["remediation"] is None


def test_dead_letter_key_stored_as_text_and_window_per_day(duck):
    duck.execute("CREATE TABLE src (id INT, d TIMESTAMP, customer_id INT)")
    duck.execute("INSERT INTO src SELECT i, TIMESTAMP '2024-03-08 12:00:00' + INTERVAL (i % 3) DAY, "
                 "CASE WHEN i % 5 = 0 THEN NULL ELSE i END FROM range(1, 31) t(i)")
    duck.execute("CREATE TABLE tgt (id INT, d TIMESTAMP, customer_id INT NOT NULL)")
    duck.execute("INSERT INTO tgt SELECT * FROM src WHERE customer_id IS NOT NULL")
    duck.execute("CREATE TABLE dlq (k VARCHAR, err VARCHAR, parked TIMESTAMP)")
    duck.execute("INSERT INTO dlq SELECT CAST(id AS VARCHAR), 'null customer_id', TIMESTAMP '2024-03-11' FROM src "
                 "WHERE customer_id IS NULL AND id <> 30")
    duck.execute("INSERT INTO dlq VALUES ('999', 'old', TIMESTAMP '2024-01-01')")
    dlq = DeadLetterTable("dlq", ["k"], error_column="err", timestamp_column="parked", since=dt.datetime(2024, 3, 1))
    f = diagnose_required_nulls(duck, duck, source_table="src", target_table="tgt", key_columns=["id"], dead_letter=dlq,
                                partition_column="d", window=(dt.datetime(2024, 3, 9), dt.datetime(2024, 3, 11)))
    # window 03-09..03-10: ids with i % 3 in (1, 2) and i % 5 == 0 → 5, 10, 20, 25
    assert f.details["missing_rows"] == 4 and f.details["missing_with_null"] == 4
    assert f.details["null_rows_dead_lettered"] == 4 and f.details["variant"] == "dead_letter"
    assert f.details["dead_letter"]["rows"] == 5  # the 2024-01-01 row is before `since`
    assert f.details["dlq_keys_equal_missing_null_keys"] is False  # 15 is in the DLQ too, but outside the window
    assert f.window == ["2024-03-09", "2024-03-10"]
    assert {p["partition"]: p["explained_rows"] for p in f.details["per_partition"]} == {"2024-03-09": 2, "2024-03-10": 2}
    # id 30 (NULL, day 03-08) is outside the window; with the whole table it is dropped without a record
    g = diagnose_required_nulls(duck, duck, source_table="src", target_table="tgt", key_columns=["id"], dead_letter=dlq,
                                partition_column="d")
    assert (g.details["missing_with_null"], g.details["null_rows_dead_lettered"], g.details["variant"]) == (6, 5, "partly_dead_lettered")
    assert 0.6 < g.confidence < 1.0


def test_compound_key_with_a_null_part(duck):
    duck.execute("CREATE TABLE s (region VARCHAR, n INT, c INT)")
    duck.execute("INSERT INTO s VALUES ('EU', 1, 1), (NULL, 2, NULL), ('US', 3, NULL), ('US', 4, 4)")
    duck.execute("CREATE TABLE t2 (region VARCHAR, n INT, c INT NOT NULL)")
    duck.execute("INSERT INTO t2 VALUES ('EU', 1, 1), ('US', 4, 4)")
    duck.execute("CREATE TABLE d2 (region VARCHAR, n INT, e VARCHAR)")
    duck.execute("INSERT INTO d2 VALUES (NULL, 2, 'c is required'), ('US', 3, 'c is required')")
    f = diagnose_required_nulls(duck, duck, source_table="s", target_table="t2", key_columns=["region", "n"],
                                dead_letter=DeadLetterTable("d2", ["region", "n"], error_column="e"))
    assert (f.explained_rows, f.details["null_rows_dead_lettered"], f.details["variant"]) == (2, 2, "dead_letter")
    assert f.details["explained_keys"] == [[None, 2], ["US", 3]]


@pytest.fixture
def pg_schema(postgres):
    schema = f"c19_{uuid.uuid4().hex[:8]}"
    postgres.execute(f"CREATE SCHEMA {schema}")
    yield postgres, schema
    postgres.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_c19_across_postgres_and_duckdb(pg_schema, tmp_path):
    """Source in PostgreSQL, target and dead-letter table in DuckDB: keys streamed and compared locally."""
    pg, schema = pg_schema
    pg.execute(f"CREATE TABLE {schema}.events (id INT, customer_id INT, amount DECIMAL(10,2))")
    pg.execute(f"INSERT INTO {schema}.events VALUES " + ", ".join(
        f"({i}, {'NULL' if i in (4, 7) else 100 + i}, {i}.50)" for i in range(1, 11)))
    wh = DuckDBDatabase(tmp_path / "wh.duckdb")
    _c19(wh, variant="C")
    f = diagnose_required_nulls(pg, wh, source_table=f"{schema}.events", target_table="events_t", key_columns=["id"],
                                dead_letter=DLQ, gap_rows=3, batch_rows=3)
    assert f.details["pushed_down"] is False
    assert (f.explained_rows, f.unexplained_rows, f.details["variant"]) == (2, 1, "dead_letter")
    assert f.details["required_columns"] == ["customer_id"]  # from the DuckDB target's catalog
    assert f.details["explained_keys"] == [[4], [7]] and f.details["unexplained_sample"] == [[9]]
    assert f.details["dlq_keys_equal_missing_null_keys"] is True
    streamed = f.evidence[0]
    assert streamed.values["streamed_rows"] == {"dw_src": 10, "dw_tgt": 7, "dw_dlq": 2}
    assert "postgresql:" in streamed.database and f"FROM {schema}.events" in streamed.sql


def test_c19_pushed_down_in_postgres(pg_schema):
    pg, schema = pg_schema
    _c19(pg, schema=schema, variant="A")
    dlq = DeadLetterTable(f"{schema}.events_dlq", ["id"], payload_column="payload", error_column="error")
    f = diagnose_required_nulls(pg, pg, source_table=f"{schema}.events", target_table=f"{schema}.events_t",
                                key_columns=["id"], dead_letter=dlq, gap_rows=2)
    assert f.details["pushed_down"] is True and f.details["required_columns"] == ["customer_id"]
    assert (f.explained_rows, f.unexplained_rows, f.confidence, f.details["variant"]) == (2, 0, 1.0, "dead_letter")
    assert f.details["explained_keys"] == [[4], [7]]
