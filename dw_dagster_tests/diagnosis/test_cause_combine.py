"""combine_findings: explained rows counted once, the remainder reported as unexplained."""

from dw_dagster.diagnosis.combine import combine_findings
from dw_dagster.diagnosis.causes.dead_letter import DeadLetterTable, diagnose_required_nulls
from dw_dagster.core.models import CauseFinding


def F(kind, explained, confidence=1.0, **details):
    return CauseFinding(kind=kind, summary=kind, confidence=confidence, explained_rows=explained, unexplained_rows=0,
                        details=details)


def test_overlapping_key_sets_are_counted_once():
    a = F("late_rows_behind_watermark", 3, explained_keys=[[1], [2], [3]], explained_keys_complete=True)
    b = F("required_null_dead_letter", 2, 0.9, explained_keys=[[3], [4]], explained_keys_complete=True)
    c = combine_findings(5, [b, a])
    assert (c.method, c.explained_rows, c.unexplained_rows, c.explained_rows_lower_bound) == ("keys", 4, 1, 3)
    assert [f.kind for f in c.findings] == ["late_rows_behind_watermark", "required_null_dead_letter", "unexplained"]
    assert c.findings[-1].unexplained_rows == 1 and "not assigned to the nearest cause" in c.findings[-1].summary


def test_per_partition_counts_are_capped_by_each_partition_gap():
    a = F("a", 4, per_partition=[{"partition": "d1", "explained_rows": 3, "gap_rows": 3}, {"partition": "d2", "explained_rows": 1, "gap_rows": 5}])
    b = F("b", 3, 0.5, per_partition=[{"partition": "d1", "explained_rows": 2}, {"partition": "d2", "explained_rows": 1}])
    c = combine_findings(8, [a, b])
    # d1: 3 + 2 capped at 3; d2: 1 + 1 = 2
    assert (c.method, c.explained_rows, c.unexplained_rows) == ("partitions", 5, 3)


def test_without_keys_or_partitions_the_sum_is_capped_at_the_gap():
    c = combine_findings(10, [F("a", 7), F("b", 6)])
    assert (c.method, c.explained_rows, c.unexplained_rows, c.explained_rows_lower_bound) == ("capped_sum", 10, 0, 7)
    assert [f.kind for f in c.findings] == ["a", "b"]


def test_nothing_explained_is_all_unexplained_and_nothing_is_forced():
    up = F("upstream_not_refreshed_or_failed", 0, 0.8)
    c = combine_findings(42, [F("late_rows_behind_watermark", 0, 0.0), up])
    assert (c.method, c.explained_rows, c.unexplained_rows) == ("none", 0, 42)
    assert [f.kind for f in c.findings] == ["upstream_not_refreshed_or_failed", "late_rows_behind_watermark", "unexplained"]
    assert combine_findings(0, []).findings == []


def test_direction_surplus_only_explains_a_negative_gap():
    dup = F("duplicate_load", 5, direction="surplus")
    late = F("late_rows_behind_watermark", 5)
    long_ = combine_findings(-7, [dup, late])
    assert (long_.explained_rows, long_.unexplained_rows, long_.counted_kinds) == (5, 2, ["duplicate_load"])
    short = combine_findings(5, [dup, late])
    assert (short.explained_rows, short.unexplained_rows, short.counted_kinds) == (5, 0, ["late_rows_behind_watermark"])


def test_c19_c_finding_combined(duck):
    """The real C19 C finding: 2 explained, id 9 left as an unexplained remainder of 1."""
    duck.execute("CREATE TABLE events (id INT, customer_id INT)")
    duck.execute("INSERT INTO events SELECT i, CASE WHEN i IN (4, 7) THEN NULL ELSE i END FROM range(1, 11) t(i)")
    duck.execute("CREATE TABLE events_t (id INT, customer_id INT NOT NULL)")
    duck.execute("INSERT INTO events_t SELECT * FROM events WHERE id NOT IN (4, 7, 9)")
    duck.execute("CREATE TABLE events_dlq (id INT, payload VARCHAR, error VARCHAR)")
    duck.execute("INSERT INTO events_dlq VALUES (4, '{}', 'missing required field'), (7, '{}', 'missing required field')")
    f = diagnose_required_nulls(duck, duck, source_table="events", target_table="events_t", key_columns=["id"],
                                dead_letter=DeadLetterTable("events_dlq", ["id"], "payload", "error"), gap_rows=3)
    late = F("late_rows_behind_watermark", 1, 1.0, explained_keys=[[7]], explained_keys_complete=True)
    c = combine_findings(3, [f, late])
    assert (c.method, c.explained_rows, c.unexplained_rows) == ("keys", 2, 1)  # 7 is claimed by both, counted once
    assert c.findings[0].kind == "required_null_dead_letter" and c.findings[-1].kind == "unexplained"
