"""Field cases of the aggregate checks (reconciliation by slice, null rate, volume) on DuckDB,
PostgreSQL and MariaDB: slices of UUIDs kept as text, columns whose names need quoting."""

import datetime as dt
import uuid

import pytest

from dw_dagster.checks.null_rate import null_rates
from dw_dagster.checks.reconcile import reconcile
from dw_dagster.checks.volume import volume_scores
from dw_dagster.databases import DatabaseError
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.field_cases.tables import load

KINDS = [
    kind("chk-uuid-text-slices", "types", "reconciliation sliced by a UUID on one side and its upper-case text on the other",
         "https://github.com/rails-sqlserver/activerecord-sqlserver-adapter/issues/349", "dw_dagster/checks/reconcile.py",
         "test_reconcile_pairs_uuid_slices_in_any_letter_case", True),
    kind("chk-quoted-names", "types", "null rate and volume over columns named order, select, 'Group By' and at",
         "https://github.com/sodadata/soda-sql/issues/205", "dw_dagster/checks/null_rate.py, dw_dagster/checks/volume.py",
         "test_null_rate_and_volume_over_names_that_need_quoting", False),
]


@pytest.mark.parametrize("engine", ["pg", "maria"], indirect=True)
def test_reconcile_pairs_uuid_slices_in_any_letter_case(duck, engine):
    """activerecord-sqlserver-adapter #349
    (https://github.com/rails-sqlserver/activerecord-sqlserver-adapter/issues/349): SQL Server
    returns UUIDs in upper case, PostgreSQL in lower case, and comparisons between the two "give
    false negatives". Sliced by a native UUID (DuckDB) against the same UUIDs kept as upper-case
    text (MariaDB ``CHAR(36)``, PostgreSQL ``TEXT``), every slice was missing on one side and extra
    on the other. Right answer (Python, ``uuid.UUID`` equality): the slices pair and the sums agree;
    a side holding one UUID in two letter cases is refused, not merged (MariaDB's case-insensitive
    collation groups them itself: its own answer)."""
    ids = [uuid.UUID(int=n * 977) for n in (1, 2)]
    s = load(duck, "rec_s", [("u", "UUID"), ("amt", "DECIMAL(18,2)")], [(ids[0], 1.5), (ids[1], 2.25)])
    t = load(engine, "rec_t", [("u", "CHAR(36)" if engine.name == "mariadb" else "TEXT"), ("amt", "DECIMAL(18,2)")],
             [(str(ids[0]).upper(), 1.5), (str(ids[1]).upper(), 2.25)])
    r = reconcile(duck.db, engine.db, s, t, ["u"], ["amt"])
    assert r.passed
    assert sorted(sl.slice["u"] for sl in r.slices) == sorted(str(u) for u in ids)
    t2 = load(engine, "rec_t2", [("u", "VARCHAR(36)"), ("amt", "DECIMAL(18,2)")],
              [(str(ids[0]).upper(), 1.0), (str(ids[0]), 0.5), (str(ids[1]), 2.25)])
    if engine.name == "mariadb":  # its default collation is case-insensitive: the engine groups them as one value
        r2 = reconcile(duck.db, engine.db, s, t2, ["u"], ["amt"])
        gap = {sl.slice["u"]: (sl.source_rows, sl.target_rows) for sl in r2.slices}
        assert gap[str(ids[0])] == (1, 2) and not r2.passed  # two target rows of that UUID, one source row
        return
    with pytest.raises(DatabaseError, match="same slice once normalized"):
        reconcile(duck.db, engine.db, s, t2, ["u"], ["amt"])


@pytest.mark.parametrize("engine", ["duck", "pg", "maria"], indirect=True)
def test_null_rate_and_volume_over_names_that_need_quoting(engine):
    """soda-sql #205 (https://github.com/sodadata/soda-sql/issues/205): column names with white
    space (and keywords) need quoting in every generated query. Right answer (Python over the same
    rows): the null rate of each column on the current day, and one row per day in the volume."""
    rows = [(1, dt.datetime(2024, 1, 1, 10), None, 1), (None, dt.datetime(2024, 1, 2, 10), "x", None),
            (3, dt.datetime(2024, 1, 2, 11), "y", 4)]
    text = "VARCHAR(10)"
    t = load(engine, "kw", [("order", "INTEGER"), ("at", "TIMESTAMP NULL" if engine.name == "mariadb" else "TIMESTAMP"),
                            ("select", text), ("Group By", "INTEGER")], rows)
    today = [r for r in rows if r[1].date() == dt.date(2024, 1, 2)]
    rates, _ = null_rates(engine.db, t, ["order", "select", "Group By"], timestamp_column="at", as_of=dt.date(2024, 1, 2))
    for i, rate in enumerate(rates, start=0):
        col = [0, 2, 3][i]
        assert (rate.current_rows, rate.current_nulls) == (len(today), sum(r[col] is None for r in today))
    scores, _ = volume_scores(engine.db, t, "at", evaluate_days=2, training_days=1,
                              now=dt.datetime(2024, 1, 3, tzinfo=dt.timezone.utc))
    assert {s.day: s.rows for s in scores} == {dt.date(2024, 1, 1): 1, dt.date(2024, 1, 2): 2}
