"""Hard cases of the C18 (watermark) and C19 (REQUIRED NULLs → dead letter) kinds, and their combination.

Every test states the hand-computed right answer in a comment: several partitions, microsecond
ties, aware timestamps, NULL groups, UUID and quoted keys, gaps smaller and larger than the late
rows, late rows that have since landed, lookbacks rounded up, extra dead-letter keys, composite and
JSON keys, NULL keys, and two causes that share a row.
"""

import datetime as dt
import uuid

import pytest

from dw_dagster.databases import DatabaseError
from dw_dagster.diagnosis.combine import combine_findings
from dw_dagster.diagnosis.causes.dead_letter import DeadLetterTable, diagnose_required_nulls
from dw_dagster.diagnosis.causes.watermark import PartitionLoad, diagnose_late_rows
from dw_dagster.databases.sql import UnsafeIdentifierError

T = dt.datetime
HWM = T(2024, 3, 9, 23, 50)


# ---------------------------------------------------------------------------------------------
# C18 kind: late rows behind a high-watermark
# ---------------------------------------------------------------------------------------------


def _orders(db, rows, landed, *, key_type="INT", ts_type="TIMESTAMP", extra_cols=""):
    """src.orders / tgt.orders(id, updated_at, ingested_at[, extra]) from (id, updated, ingested[, extra...]) tuples."""
    db.execute("CREATE SCHEMA IF NOT EXISTS src; CREATE SCHEMA IF NOT EXISTS tgt")
    cols = f"id {key_type}, updated_at {ts_type}, ingested_at {ts_type}{extra_cols}"
    db.execute(f"CREATE TABLE src.orders ({cols})")
    db.execute(f"CREATE TABLE tgt.orders ({cols})")

    def lit(v):
        if v is None:
            return "NULL"
        if isinstance(v, dt.datetime):
            return f"CAST('{v.isoformat(sep=' ')}' AS {ts_type})"
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        return str(v)

    db.execute("INSERT INTO src.orders VALUES " + ", ".join("(" + ", ".join(lit(v) for v in r) + ")" for r in rows))
    in_list = ", ".join(lit(k) for k in landed)
    db.execute(f"INSERT INTO tgt.orders SELECT * FROM src.orders WHERE id IN ({in_list})")


def _c18_rows():
    rows = [(i, T(2024, 3, 9, 8 + 4 * (i - 1)), T(2024, 3, 9, 8 + 4 * (i - 1))) for i in range(1, 5)]
    rows += [(5, T(2024, 3, 9, 22), T(2024, 3, 10, 2)), (6, T(2024, 3, 9, 23, 50), T(2024, 3, 9, 23, 50, 5)),
             (7, T(2024, 3, 9, 23, 50), T(2024, 3, 10, 2, 30)), (8, T(2024, 3, 10, 4), T(2024, 3, 10, 4))]
    return rows


C18_LOADS = [
    PartitionLoad("2024-03-09", T(2024, 3, 9), T(2024, 3, 10), source_snapshot_ts=T(2024, 3, 9, 23, 50, 5)),
    PartitionLoad("2024-03-10", T(2024, 3, 10), T(2024, 3, 11), source_snapshot_ts=T(2024, 3, 10, 4)),
]


def _late(db, loads=C18_LOADS, hwm=HWM, **kw):
    kw.setdefault("source_table", "src.orders")
    kw.setdefault("target_table", "tgt.orders")
    return diagnose_late_rows(db, db, key_column="id", partition_column="updated_at", watermark_column="updated_at",
                              arrival_column="ingested_at", loads=loads, high_watermark=hwm, **kw)


def _sample(f):
    return next(e for e in f.evidence if "late keys" in e.description)


def test_late_rows_in_three_partitions_window_lists_them_in_order(duck):
    # Days 03-06..03-09, each loaded once at 23:00 of its own day (snapshot = 23:00); HWM 03-09 23:50.
    # Late (wm <= HWM, arrived after their partition's snapshot), all missing from the target:
    #   id 10 wm 03-07 12:00 arr 03-10 01:00 (below, delay 61 h)
    #   id 11 wm 03-08 06:00 arr 03-10 01:00 (below, delay 43 h)
    #   id 12 wm 03-09 10:00 arr 03-10 02:00 (below, delay 16 h)
    #   id 13 wm 03-09 23:50 arr 03-10 02:30 (tied)
    # 03-06 has no late row and no gap. Expected: window [03-07, 03-08, 03-09] in order, explained 4/4,
    # 3 below + 1 tied, longest delay 61 h -> proposed lookback 72 h (61 rounded up to whole days).
    rows = [(1, T(2024, 3, 6, 10), T(2024, 3, 6, 10)), (2, T(2024, 3, 7, 10), T(2024, 3, 7, 10)),
            (3, T(2024, 3, 8, 10), T(2024, 3, 8, 10)), (4, T(2024, 3, 9, 10), T(2024, 3, 9, 10)),
            (10, T(2024, 3, 7, 12), T(2024, 3, 10, 1)), (11, T(2024, 3, 8, 6), T(2024, 3, 10, 1)),
            (12, T(2024, 3, 9, 10), T(2024, 3, 10, 2)), (13, T(2024, 3, 9, 23, 50), T(2024, 3, 10, 2, 30))]
    _orders(duck, rows, [1, 2, 3, 4])
    loads = [PartitionLoad(f"2024-03-0{d}", T(2024, 3, d), T(2024, 3, d + 1), source_snapshot_ts=T(2024, 3, d, 23))
             for d in (9, 6, 8, 7)]  # given out of order on purpose
    f = _late(duck, loads=loads, gap_rows=4)
    assert f.window == ["2024-03-07", "2024-03-08", "2024-03-09"]
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (4, 0, 1.0)
    assert (f.details["below_watermark_rows"], f.details["tied_with_watermark_rows"]) == (3, 1)
    assert f.details["max_delay_hours"] == 61.0 and f.details["proposed_lookback_hours"] == 72
    per = {p["partition"]: p["explained_rows"] for p in f.details["per_partition"]}
    assert per == {"2024-03-07": 1, "2024-03-08": 1, "2024-03-09": 2}
    assert [(v["key"], v["class"]) for v in _sample(f).values] == [(10, "below"), (11, "below"), (12, "below"), (13, "tied")]


def test_row_that_arrived_before_its_partition_was_loaded_is_not_late(duck):
    # C18 plus id 9: wm 03-09 21:00, arrived 21:00 (< the 23:50:05 snapshot), missing for another reason.
    # Late = {5, 7}; gap 3 -> explained 2, unexplained 1 (id 9 is not forced onto this cause).
    _orders(duck, _c18_rows() + [(9, T(2024, 3, 9, 21), T(2024, 3, 9, 21))], [1, 2, 3, 4, 6, 8])
    f = _late(duck, gap_rows=3)
    assert f.details["late_rows"] == 2
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (2, 1, round(2 / 3, 4))
    assert [v["key"] for v in _sample(f).values] == [5, 7]


def test_ties_at_microsecond_precision(duck):
    # HWM 23:50:00.123456 under a strict '>'. All three rows arrive after the 03-09 snapshot:
    #   id 20 wm = HWM exactly -> tied (skipped); id 21 wm = HWM - 1 us -> below (skipped);
    #   id 22 wm = HWM + 1 us -> read by run 2 (landed, not late).
    hwm = T(2024, 3, 9, 23, 50, 0, 123456)
    rows = [(1, T(2024, 3, 9, 8), T(2024, 3, 9, 8)),
            (20, hwm, T(2024, 3, 10, 1)), (21, hwm - dt.timedelta(microseconds=1), T(2024, 3, 10, 1)),
            (22, hwm + dt.timedelta(microseconds=1), T(2024, 3, 10, 1))]
    _orders(duck, rows, [1, 22])
    f = _late(duck, hwm=hwm, gap_rows=2)
    assert (f.details["late_rows"], f.details["below_watermark_rows"], f.details["tied_with_watermark_rows"]) == (2, 1, 1)
    assert (f.explained_rows, f.unexplained_rows) == (2, 0)
    assert [(v["key"], v["class"]) for v in _sample(f).values] == [(20, "tied"), (21, "below")]


def test_timestamptz_columns_and_aware_watermark_give_the_c18_answer(duck):
    # C18 with TIMESTAMPTZ columns whose values are written at +02:00, and the HWM given as an aware
    # time in +02:00 (2024-03-10 01:50+02:00 == 2024-03-09 23:50 UTC). Same answer as C18:
    # missing {5, 7}, 1 below + 1 tied, window [03-09], min lookback 4 h, proposed 24 h.
    plus2 = dt.timezone(dt.timedelta(hours=2))
    rows = [(i, u.replace(tzinfo=dt.timezone.utc).astimezone(plus2), g.replace(tzinfo=dt.timezone.utc).astimezone(plus2))
            for i, u, g in _c18_rows()]
    _orders(duck, rows, [1, 2, 3, 4, 6, 8], ts_type="TIMESTAMPTZ")
    f = _late(duck, hwm=T(2024, 3, 10, 1, 50, tzinfo=plus2), gap_rows=2)
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (2, 0, 1.0)
    assert f.window == ["2024-03-09"]
    assert (f.details["below_watermark_rows"], f.details["tied_with_watermark_rows"]) == (1, 1)
    assert f.details["min_lookback_hours"] == 4.0 and f.details["proposed_lookback_hours"] == 24
    assert [(v["key"], v["class"]) for v in _sample(f).values] == [(5, "below"), (7, "tied")]


def test_late_row_in_a_partition_without_a_recorded_load_is_not_claimed(duck):
    # C18 plus id 20: wm 03-08 12:00, arrived 03-10 01:00, missing; no load of 03-08 is recorded,
    # so "late relative to its partition's load" cannot be shown. Gap 3 -> explained 2, unexplained 1.
    _orders(duck, _c18_rows() + [(20, T(2024, 3, 8, 12), T(2024, 3, 10, 1))], [1, 2, 3, 4, 6, 8])
    f = _late(duck, gap_rows=3)
    assert f.details["late_rows"] == 2 and f.window == ["2024-03-09"]
    assert (f.explained_rows, f.unexplained_rows) == (2, 1)


def _one_late_row(db, delay):
    # one late row: wm 03-09 20:00 (below HWM), arrival wm + delay (after the 23:50:05 snapshot)
    _orders(db, [(1, T(2024, 3, 9, 8), T(2024, 3, 9, 8)), (2, T(2024, 3, 9, 20), T(2024, 3, 9, 20) + delay)], [1])


@pytest.mark.parametrize("delay, round_h, proposed", [
    (dt.timedelta(hours=4, minutes=1), 24, 24),    # 4.0167 h -> one day
    (dt.timedelta(hours=24), 24, 24),              # exactly one day: 24 h covers it (inclusive read)
    (dt.timedelta(hours=24, minutes=1), 24, 48),   # just over a day -> two days
    (dt.timedelta(hours=4, minutes=1), 1, 5),      # hourly rounding: 4.0167 h -> 5 h
    (dt.timedelta(hours=49), 24, 72),              # 49 h -> three days
])
def test_proposed_lookback_is_a_safe_round_up(duck, delay, round_h, proposed):
    _one_late_row(duck, delay)
    f = _late(duck, gap_rows=1, lookback_round_hours=round_h)
    assert f.details["proposed_lookback_hours"] == proposed
    assert f.details["proposed_lookback_hours"] * 3600 >= delay.total_seconds()


def test_min_lookback_is_never_below_the_real_delay(duck):
    # delay 4 h 0 min 1 s = 4.000278 h. A "min lookback" of 4.0 h would miss this very row;
    # the minimum must be >= 4.000278 (rounded UP, e.g. 4.001).
    _one_late_row(duck, dt.timedelta(hours=4, seconds=1))
    f = _late(duck, gap_rows=1)
    assert f.details["min_lookback_hours"] * 3600 >= 4 * 3600 + 1


def test_sub_second_delay_over_a_day_still_rounds_up(duck):
    # wm 03-09 20:00:00.100, arrival 03-10 20:00:00.600: real delay 24 h + 0.5 s, so a 24 h lookback
    # misses the row; the safe proposal with daily rounding is 48 h.
    wm = T(2024, 3, 9, 20, 0, 0, 100000)
    _orders(duck, [(1, T(2024, 3, 9, 8), T(2024, 3, 9, 8)), (2, wm, wm + dt.timedelta(hours=24, milliseconds=500))], [1])
    f = _late(duck, gap_rows=1)
    assert f.details["proposed_lookback_hours"] == 48


def test_varchar_key_with_a_quote(duck):
    # C18 with VARCHAR keys; the missing ones are "O'Brien-5" (below) and "x-7" (tied). Explained 2/2.
    rows = [(("O'Brien-5" if i == 5 else f"x-{i}"), u, g) for i, u, g in _c18_rows()]
    _orders(duck, rows, ["x-1", "x-2", "x-3", "x-4", "x-6", "x-8"], key_type="VARCHAR")
    f = _late(duck, gap_rows=2)
    assert (f.explained_rows, f.unexplained_rows) == (2, 0)
    assert [(v["key"], v["class"]) for v in _sample(f).values] == [("O'Brien-5", "below"), ("x-7", "tied")]
    assert f.details["sample_present_in_target"] == 0


def test_uuid_key(duck):
    # C18 with UUID merge keys (a common key type). Same answer: explained 2/2, sample of the two
    # missing keys, none of them present in the target. Must not crash.
    ids = {i: uuid.UUID(int=i) for i in range(1, 9)}
    rows = [(str(ids[i]), u, g) for i, u, g in _c18_rows()]
    _orders(duck, rows, [str(ids[i]) for i in (1, 2, 3, 4, 6, 8)], key_type="UUID")
    f = _late(duck, gap_rows=2)
    assert (f.explained_rows, f.unexplained_rows) == (2, 0)
    assert f.details["sample_size"] == 2 and f.details["sample_present_in_target"] == 0


def test_null_watermark_or_arrival_is_neither_late_nor_a_crash(duck):
    # C18 plus id 30 (updated_at NULL, ingested late) and id 31 (ingested_at NULL), both missing.
    # Neither can be shown late. Gap 4 -> explained 2 (5, 7), unexplained 2.
    extra = [(30, None, T(2024, 3, 10, 3)), (31, T(2024, 3, 9, 12), None)]
    _orders(duck, _c18_rows() + extra, [1, 2, 3, 4, 6, 8])
    f = _late(duck, gap_rows=4)
    assert f.details["late_rows"] == 2
    assert (f.explained_rows, f.unexplained_rows) == (2, 2)


def test_duplicate_late_rows_in_the_source(duck):
    # C18 with id 5 present twice in the source (two identical late rows), neither in the target.
    # Gap in rows = 3 (5, 5, 7); all three are late -> explained 3/3.
    _orders(duck, _c18_rows() + [(5, T(2024, 3, 9, 22), T(2024, 3, 10, 2))], [1, 2, 3, 4, 6, 8])
    f = _late(duck, gap_rows=3)
    assert f.details["late_rows"] == 3
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (3, 0, 1.0)


def test_gap_smaller_than_late_rows_caps_explained(duck):
    # C18 (2 late missing rows) but the incident's gap is 1 (say another row arrived in the target).
    # A finding cannot explain more than the gap it reports: explained 1, unexplained 0,
    # explained + unexplained == gap (models.CauseFinding), confidence 1.0.
    _orders(duck, _c18_rows(), [1, 2, 3, 4, 6, 8])
    f = _late(duck, gap_rows=1)
    assert f.explained_rows + f.unexplained_rows == 1
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (1, 0, 1.0)


def test_gap_zero_with_late_rows_explains_nothing(duck):
    # gap 0: nothing to explain -> explained 0, unexplained 0, confidence 0.
    _orders(duck, _c18_rows(), [1, 2, 3, 4, 6, 8])
    f = _late(duck, gap_rows=0)
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (0, 0, 0.0)


def test_gap_larger_than_late_rows(duck):
    # C18 with incident gap 5: explained 2, unexplained 3, confidence 0.4.
    _orders(duck, _c18_rows(), [1, 2, 3, 4, 6, 8])
    f = _late(duck, gap_rows=5)
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (2, 3, 0.4)


def test_measured_gap_when_gap_rows_is_none(duck):
    # gap_rows None: the gap measured in partition 03-09 is 2 (ids 5, 7) -> 2/2.
    _orders(duck, _c18_rows(), [1, 2, 3, 4, 6, 8])
    f = _late(duck)
    assert (f.explained_rows, f.unexplained_rows, f.confidence) == (2, 0, 1.0)


def test_no_loads_or_no_snapshot_cannot_test(duck):
    # No load (or none with a snapshot): the cause cannot be tested -> 0 explained, the whole gap
    # unexplained, confidence 0.
    _orders(duck, _c18_rows(), [1, 2, 3, 4, 6, 8])
    for loads in ([], [PartitionLoad("2024-03-09", T(2024, 3, 9), T(2024, 3, 10), source_snapshot_ts=None)]):
        f = _late(duck, loads=loads, gap_rows=5)
        assert (f.explained_rows, f.unexplained_rows, f.confidence, f.window) == (0, 5, 0.0, [])


def test_group_by_with_a_null_group(duck):
    # C18 with store_id; the two late rows are in store 1 (id 5) and store NULL (id 7).
    # Expected: explained 2/2, two groups (store 1 and store NULL); no crash on the NULL group.
    rows = [(i, u, g, (None if i == 7 else 1)) for i, u, g in _c18_rows()]
    _orders(duck, rows, [1, 2, 3, 4, 6, 8], extra_cols=", store_id INT")
    f = _late(duck, gap_rows=2, group_by=["store_id"])
    assert (f.explained_rows, f.unexplained_rows) == (2, 0)
    assert len(f.details["groups"]) == 2


def test_late_row_already_backfilled_does_not_explain_another_missing_row(duck):
    # C18 but id 5 and 7 were since backfilled (present in the target) and id 2 (not late) is
    # missing for another reason. Gap 1 (id 2). No missing row is late -> explained 0, unexplained 1.
    # (Counting min(late, gap) per partition pairs late-but-present rows with an unrelated missing row.)
    _orders(duck, _c18_rows(), [1, 3, 4, 5, 6, 7, 8])
    f = _late(duck, gap_rows=1)
    assert f.details["sample_present_in_target"] == 2  # the evidence itself says the late rows landed
    assert (f.explained_rows, f.unexplained_rows) == (0, 1)


def test_hostile_table_and_column_names_are_not_executed(duck):
    # A table name carrying SQL is quoted, so the query fails as "table not found" (DatabaseError)
    # and src.orders still exists; a backtick or control character is refused (UnsafeIdentifierError).
    _orders(duck, _c18_rows(), [1, 2, 3, 4, 6, 8])
    with pytest.raises(DatabaseError):
        _late(duck, gap_rows=2, source_table='orders"; DROP TABLE src.orders; --')
    with pytest.raises(UnsafeIdentifierError):
        _late(duck, gap_rows=2, source_table="src.ord`ers")
    with pytest.raises((DatabaseError, UnsafeIdentifierError)):
        diagnose_late_rows(duck, duck, source_table="src.orders", target_table="tgt.orders", key_column="id",
                           partition_column="updated_at", watermark_column='updated_at"; DROP TABLE src.orders; --',
                           arrival_column="ingested_at", loads=C18_LOADS, high_watermark=HWM, gap_rows=2)
    assert duck.fetch_all("SELECT COUNT(*) FROM src.orders")[0][0] == 8


# ---------------------------------------------------------------------------------------------
# C19 kind: NULLs in REQUIRED columns → dead letter (or dropped)
# ---------------------------------------------------------------------------------------------

DLQ = DeadLetterTable("events_dlq", ["id"], payload_column="payload", error_column="error")


def _events(db, *, null_ids=(4, 7), landed=None, dlq=((4, "missing required field"), (7, "missing required field")),
            dlq_key_type="INT", amount_null_ids=(), amount_required=False):
    db.execute("CREATE TABLE events (id INT, customer_id INT, amount DECIMAL(10,2))")
    db.execute("INSERT INTO events VALUES " + ", ".join(
        f"({i}, {'NULL' if i in null_ids else 100 + i}, {'NULL' if i in amount_null_ids else f'{i}.50'})" for i in range(1, 11)))
    db.execute(f"CREATE TABLE events_t (id INT, customer_id INT NOT NULL, amount DECIMAL(10,2){' NOT NULL' if amount_required else ''})")
    landed = landed if landed is not None else [i for i in range(1, 11) if i not in null_ids and i not in amount_null_ids]
    db.execute(f"INSERT INTO events_t SELECT * FROM events WHERE id IN ({', '.join(map(str, landed))})")
    db.execute(f"CREATE TABLE events_dlq (id {dlq_key_type}, payload VARCHAR, error VARCHAR)")
    if dlq:
        db.execute("INSERT INTO events_dlq VALUES " + ", ".join(
            f"({k!r}, '{{\"id\": {k}}}', '{e}')" if isinstance(k, str) else f"({k}, '{{\"id\": {k}}}', '{e}')" for k, e in dlq))


def _nulls(db, gap, dlq=DLQ, **kw):
    kw.setdefault("key_columns", ["id"])
    return diagnose_required_nulls(db, db, source_table=kw.pop("source_table", "events"),
                                   target_table=kw.pop("target_table", "events_t"), dead_letter=dlq, gap_rows=gap, **kw)


def test_dlq_with_extra_keys_counts_only_the_missing_ones(duck):
    # DLQ holds 4, 7 (missing, NULL) plus 2 (parked, later replayed: present in the target) and 99
    # (not in the source). Explained = missing ∩ (NULL or DLQ) = {4, 7} -> 2/2, confidence 1.0;
    # nothing "parked for another reason" among the missing; DLQ keys (4 distinct) != missing keys.
    _events(duck, dlq=((4, "missing required field"), (7, "missing required field"), (2, "timeout"), (99, "bad")))
    f = _nulls(duck, 2)
    assert (f.explained_rows, f.unexplained_rows, f.confidence, f.details["variant"]) == (2, 0, 1.0, "dead_letter")
    assert (f.details["null_rows_dead_lettered"], f.details["other_rows_dead_lettered"]) == (2, 0)
    assert f.details["dead_letter"]["distinct_keys"] == 4
    assert f.details["dlq_keys_equal_missing_null_keys"] is False
    assert f.details["explained_keys"] == [[4], [7]]


def test_dlq_reason_texts_differ(duck):
    # DLQ error texts differ per row; the key match, not the text, decides. 2/2 dead_letter, both
    # errors reported with their counts (1 each).
    _events(duck, dlq=((4, 'null value in column "customer_id" violates not-null constraint'), (7, "schema mismatch")))
    f = _nulls(duck, 2)
    assert (f.explained_rows, f.details["variant"], f.details["null_rows_dead_lettered"]) == (2, "dead_letter", 2)
    assert sorted(e["error"] for e in f.details["dead_letter"]["errors"]) == [
        'null value in column "customer_id" violates not-null constraint', "schema mismatch"]


def test_two_required_columns_null_on_different_rows(duck):
    # customer_id NULL on 4 and 9, amount NULL on 7 and 9; both REQUIRED in the target (catalog).
    # Missing {4, 7, 9}, all three with a NULL (9 counted once), per column {customer_id: 2, amount: 2};
    # DLQ holds 4, 7, 9 -> dead_letter 3/3, label "REQUIRED columns customer_id, amount".
    _events(duck, null_ids=(4, 9), amount_null_ids=(7, 9), amount_required=True,
            dlq=((4, "missing required field"), (7, "missing required field"), (9, "missing required field")))
    f = _nulls(duck, 3)
    assert sorted(f.details["required_columns"]) == ["amount", "customer_id"]
    assert (f.details["missing_rows"], f.details["missing_with_null"]) == (3, 3)
    assert f.details["nulls_per_column"] == {"customer_id": 2, "amount": 2}
    assert (f.explained_rows, f.unexplained_rows, f.confidence, f.details["variant"]) == (3, 0, 1.0, "dead_letter")
    assert "REQUIRED columns" in f.summary and "customer_id" in f.summary and "amount" in f.summary
    assert f.details["explained_keys"] == [[4], [7], [9]]


def test_composite_key_with_text_parts_in_the_dlq(duck):
    # Key (region, n). Source: (EU,1,c=1) (EU,2,NULL) (US,2,NULL) (US,3,3). DLQ stores both parts as
    # text: ('EU','2'), ('US','2'). Missing {(EU,2), (US,2)} -> dead_letter 2/2; (EU,2) vs (US,2)
    # must not be confused (same n).
    duck.execute("CREATE TABLE s (region VARCHAR, n INT, c INT)")
    duck.execute("INSERT INTO s VALUES ('EU', 1, 1), ('EU', 2, NULL), ('US', 2, NULL), ('US', 3, 3)")
    duck.execute("CREATE TABLE t2 (region VARCHAR, n INT, c INT NOT NULL)")
    duck.execute("INSERT INTO t2 VALUES ('EU', 1, 1), ('US', 3, 3)")
    duck.execute("CREATE TABLE d2 (r VARCHAR, k VARCHAR, e VARCHAR)")
    duck.execute("INSERT INTO d2 VALUES ('EU', '2', 'c is required'), ('US', '2', 'c is required'), ('US', '3', 'old')")
    f = diagnose_required_nulls(duck, duck, source_table="s", target_table="t2", key_columns=["region", "n"],
                                dead_letter=DeadLetterTable("d2", ["r", "k"], error_column="e"), gap_rows=2)
    assert (f.explained_rows, f.details["null_rows_dead_lettered"], f.details["variant"]) == (2, 2, "dead_letter")
    assert f.details["explained_keys"] == [["EU", 2], ["US", 2]]


def test_dlq_key_inside_json_payload_through_a_view(duck):
    # DLQ raw(payload JSON text, error); the key is inside the payload, once as a number, once as a
    # string. A view extracts it (as the docs say). Missing {4, 7} -> dead_letter 2/2.
    _events(duck, dlq=())
    duck.execute("CREATE TABLE raw_dlq (payload VARCHAR, error VARCHAR)")
    duck.execute("""INSERT INTO raw_dlq VALUES ('{"id": 4, "customer_id": null}', 'missing required field'),
                    ('{"id": "7", "customer_id": null}', 'missing required field')""")
    duck.execute("CREATE VIEW raw_dlq_v AS SELECT json_extract_string(payload, '$.id') AS id, payload, error FROM raw_dlq")
    f = _nulls(duck, 2, dlq=DeadLetterTable("raw_dlq_v", ["id"], payload_column="payload", error_column="error"))
    assert (f.explained_rows, f.confidence, f.details["variant"]) == (2, 1.0, "dead_letter")
    payloads = next(e for e in f.evidence if "payload" in e.description)
    assert len(payloads.values) == 2


@pytest.mark.parametrize("variant, landed, dlq, gap, expected", [
    # B: DLQ empty -> dropped, 2/2 explained, certainty 0.6 -> confidence 0.6
    ("B", None, (), 2, ("dropped_no_dead_letter_record", 2, 0, 0.6)),
    # C: id 9 also missing (not NULL): 2 explained, 1 unexplained, confidence 2/3
    ("C", [1, 2, 3, 5, 6, 8, 10], ((4, "m"), (7, "m")), 3, ("dead_letter", 2, 1, round(2 / 3, 4))),
    # B+C: DLQ empty and 9 missing: 2/3 * 0.6 = 0.4
    ("BC", [1, 2, 3, 5, 6, 8, 10], (), 3, ("dropped_no_dead_letter_record", 2, 1, 0.4)),
    # partly: only 4 parked -> certainty 0.6 + 0.4 * 1/2 = 0.8
    ("partly", None, ((4, "m"),), 2, ("partly_dead_lettered", 2, 0, 0.8)),
    # partly + C: 2/3 * 0.8 = 0.5333
    ("partlyC", [1, 2, 3, 5, 6, 8, 10], ((4, "m"),), 3, ("partly_dead_lettered", 2, 1, round(2 / 3 * 0.8, 4))),
    # gap given smaller than the missing NULL rows: capped at the gap, 1/1
    ("small_gap", None, ((4, "m"), (7, "m")), 1, ("dead_letter", 1, 0, 1.0)),
])
def test_variants_re_derived(duck, variant, landed, dlq, gap, expected):
    _events(duck, landed=landed, dlq=dlq)
    f = _nulls(duck, gap)
    assert (f.details["variant"], f.explained_rows, f.unexplained_rows, f.confidence) == expected
    assert f.explained_rows + f.unexplained_rows == gap


def test_c_remainder_has_a_parked_non_null_row(duck):
    # Variant C, but id 9 (not NULL) is parked in the DLQ for another reason ('timeout').
    # Explained = 4, 7 (NULL) + 9 (parked) = 3/3; variant dead_letter, other_rows_dead_lettered 1.
    _events(duck, landed=[1, 2, 3, 5, 6, 8, 10], dlq=((4, "m"), (7, "m"), (9, "timeout")))
    f = _nulls(duck, 3)
    assert (f.explained_rows, f.unexplained_rows, f.details["other_rows_dead_lettered"]) == (3, 0, 1)
    assert f.details["dlq_keys_equal_missing_null_keys"] is False


def test_dlq_key_as_text_source_key_as_int(duck):
    # DLQ stores the key as VARCHAR ('4', '7'); source key INT. Matched as text -> 2/2 dead_letter.
    _events(duck, dlq=(("4", "m"), ("7", "m")), dlq_key_type="VARCHAR")
    f = _nulls(duck, 2)
    assert (f.explained_rows, f.confidence, f.details["variant"]) == (2, 1.0, "dead_letter")


def test_source_key_as_text_dlq_key_as_int(duck):
    # The reverse: source key VARCHAR, DLQ key INT. 2/2 dead_letter; explained keys are the strings.
    duck.execute("CREATE TABLE ev (id VARCHAR, customer_id INT)")
    duck.execute("INSERT INTO ev VALUES ('1', 1), ('4', NULL), ('7', NULL)")
    duck.execute("CREATE TABLE ev_t (id VARCHAR, customer_id INT NOT NULL)")
    duck.execute("INSERT INTO ev_t VALUES ('1', 1)")
    duck.execute("CREATE TABLE ev_dlq (id INT, error VARCHAR)")
    duck.execute("INSERT INTO ev_dlq VALUES (4, 'm'), (7, 'm')")
    f = diagnose_required_nulls(duck, duck, source_table="ev", target_table="ev_t", key_columns=["id"],
                                dead_letter=DeadLetterTable("ev_dlq", ["id"], error_column="error"), gap_rows=2)
    assert (f.explained_rows, f.details["variant"]) == (2, "dead_letter")
    assert f.details["explained_keys"] == [["4"], ["7"]]


def test_dlq_key_as_double_is_matched_as_text_and_a_view_fixes_it(duck):
    # A DLQ that stores the numeric key as DOUBLE (a JSON number loaded as float): 4.0 and 7.0.
    # Keys are matched as text (documented), and '4.0' is not '4', so the rows read as dropped
    # without a record (0.6); a view that casts the DLQ key to the source's type gives 2/2.
    _events(duck, dlq=((4, "m"), (7, "m")), dlq_key_type="DOUBLE")
    f = _nulls(duck, 2)
    assert (f.details["null_rows_dead_lettered"], f.details["variant"]) == (0, "dropped_no_dead_letter_record")
    duck.execute("CREATE VIEW events_dlq_typed AS SELECT CAST(id AS BIGINT) AS id, error FROM events_dlq")
    f = _nulls(duck, 2, dlq=DeadLetterTable("events_dlq_typed", ["id"], error_column="error"))
    assert (f.details["null_rows_dead_lettered"], f.details["variant"]) == (2, "dead_letter")


def test_retried_dlq_rows_are_counted_once(duck):
    # The sink retried: 4 and 7 each parked twice. Rows 4, distinct keys 2, still 2/2, keys equal.
    _events(duck, dlq=((4, "m"), (4, "m"), (7, "m"), (7, "m")))
    f = _nulls(duck, 2)
    assert (f.explained_rows, f.details["null_rows_dead_lettered"]) == (2, 2)
    assert (f.details["dead_letter"]["rows"], f.details["dead_letter"]["distinct_keys"]) == (4, 2)
    assert f.details["dlq_keys_equal_missing_null_keys"] is True


def test_null_in_a_required_key_column_explains_the_missing_row(duck):
    # Target key id is NOT NULL (REQUIRED); the source has one row with id NULL (customer_id set)
    # that could not land. No DLQ. Right answer: it is explained as a NULL in REQUIRED column id,
    # dropped without record: explained 1/1, variant dropped_no_dead_letter_record.
    duck.execute("CREATE TABLE ev (id INT, customer_id INT)")
    duck.execute("INSERT INTO ev VALUES (1, 1), (NULL, 2)")
    duck.execute("CREATE TABLE ev_t (id INT NOT NULL, customer_id INT NOT NULL)")
    duck.execute("INSERT INTO ev_t VALUES (1, 1)")
    f = diagnose_required_nulls(duck, duck, source_table="ev", target_table="ev_t", key_columns=["id"], gap_rows=1)
    assert (f.explained_rows, f.details["variant"]) == (1, "dropped_no_dead_letter_record")


def test_hostile_dlq_and_source_names(duck):
    # A hostile DLQ name is quoted: "not found" note, the C19 B answer (dropped 2/2, 0.6); the events
    # table survives. A hostile source name fails as a DatabaseError, a backtick is refused.
    _events(duck, dlq=())
    f = _nulls(duck, 2, dlq=DeadLetterTable('events_dlq"; DROP TABLE events; --', ["id"]))
    assert (f.details["variant"], f.explained_rows, f.confidence) == ("dropped_no_dead_letter_record", 2, 0.6)
    assert "not found" in f.details["dead_letter"]["note"]
    with pytest.raises(DatabaseError):
        _nulls(duck, 2, source_table='events"; DROP TABLE events; --')
    with pytest.raises(UnsafeIdentifierError):
        _nulls(duck, 2, source_table="ev`ents")
    assert duck.fetch_all("SELECT COUNT(*) FROM events")[0][0] == 10


# ---------------------------------------------------------------------------------------------
# combine: two real causes overlapping on keys
# ---------------------------------------------------------------------------------------------


def _both_causes(db):
    """C18 with customer_id: missing {5, 7, 9, 10}; late {5, 7}; NULL customer_id {7, 9}; 10 lost for no known reason."""
    rows = [r + (100 + r[0],) for r in _c18_rows()]
    rows += [(9, T(2024, 3, 9, 12), T(2024, 3, 9, 12), None), (10, T(2024, 3, 9, 14), T(2024, 3, 9, 14), 110)]
    rows = [(r[0], r[1], r[2], None if r[0] == 7 else r[3]) for r in rows]
    _orders(db, rows, [1, 2, 3, 4, 6, 8], extra_cols=", customer_id INT")
    db.execute("ALTER TABLE tgt.orders ALTER COLUMN customer_id SET NOT NULL")
    db.execute("CREATE TABLE tgt.orders_dlq (id INT, error VARCHAR)")
    db.execute("INSERT INTO tgt.orders_dlq VALUES (7, 'missing required field'), (9, 'missing required field')")


@pytest.mark.parametrize("with_partition", [True, False], ids=["per_partition", "no_partition"])
def test_combine_real_overlapping_causes_counts_each_row_once(duck, with_partition):
    # Gap 4 = {5, 7, 9, 10}. Watermark explains {5, 7}; REQUIRED NULL explains {7, 9}; 7 is in both.
    # Union = {5, 7, 9} = 3 explained, 1 unexplained (id 10), reported as an `unexplained` finding of 1.
    _both_causes(duck)
    late = _late(duck, gap_rows=4)
    nulls = diagnose_required_nulls(duck, duck, source_table="src.orders", target_table="tgt.orders", key_columns=["id"],
                                    dead_letter=DeadLetterTable("tgt.orders_dlq", ["id"], error_column="error"),
                                    partition_column="updated_at" if with_partition else None, gap_rows=4)
    assert (late.explained_rows, nulls.explained_rows) == (2, 2)  # each cause on its own
    c = combine_findings(4, [late, nulls])
    assert (c.explained_rows, c.unexplained_rows) == (3, 1)
    assert c.findings[-1].kind == "unexplained" and c.findings[-1].unexplained_rows == 1


def test_combine_keys_int_and_text_are_the_same_key():
    # Finding a lists [[7]], finding b lists [["7"]] (DLQ key as text): one row. Gap 3 -> 2 explained
    # ({5, 7}), 1 unexplained.
    from dw_dagster.core.models import CauseFinding

    a = CauseFinding(kind="a", summary="a", confidence=1.0, explained_rows=2, unexplained_rows=1,
                     details={"explained_keys": [[5], [7]], "explained_keys_complete": True})
    b = CauseFinding(kind="b", summary="b", confidence=1.0, explained_rows=1, unexplained_rows=2,
                     details={"explained_keys": [["7"]], "explained_keys_complete": True})
    c = combine_findings(3, [a, b])
    assert (c.method, c.explained_rows, c.unexplained_rows) == ("keys", 2, 1)


def test_combine_keys_with_a_duplicated_source_key(duck):
    # Source has id 4 twice (both NULL customer_id) and 7 (NULL): gap in rows = 3, all 3 rows are
    # explained by the NULL cause. Another finding explains key 7 too. Combined: 3 rows explained,
    # 0 unexplained. Debatable: the key union counts distinct keys (2) while the gap counts rows.
    _events(duck, dlq=((4, "m"), (7, "m")))
    duck.execute("INSERT INTO events VALUES (4, NULL, 4.50)")
    f = _nulls(duck, 3)
    assert f.explained_rows == 3
    from dw_dagster.core.models import CauseFinding

    other = CauseFinding(kind="late_rows_behind_watermark", summary="x", confidence=1.0, explained_rows=1,
                         unexplained_rows=2, details={"explained_keys": [[7]], "explained_keys_complete": True})
    c = combine_findings(3, [f, other])
    assert (c.explained_rows, c.unexplained_rows) == (3, 0)
