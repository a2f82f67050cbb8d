"""Hard comparison kinds (issue 14, items 1-4, 10, 11), each on DuckDB and PostgreSQL on loopback,
in more than one session TimeZone where time is involved, the single-database diff and the
cross-database diff agreeing on the same data. Every expected answer is worked out by hand in
the test's comment.
"""

import contextlib
import urllib.parse

import pytest

from dw_dagster.checks.reconcile import reconcile
from dw_dagster.checks.rowdiff import row_diff, row_diff_across
from dw_dagster.databases import DuckDBDatabase, SqlAlchemyDatabase
from dw_dagster.databases.catalog import CatalogError
from dw_dagster_tests.conftest import POSTGRES_URL


class _ZonedDuck(DuckDBDatabase):
    """A DuckDB file whose sessions run in ``zone`` (a user's own connection may)."""

    def __init__(self, path, zone):
        super().__init__(path)
        self.zone = zone
        self.name = f"duckdb:{zone}"

    @contextlib.contextmanager
    def connect(self):
        con = self._open()
        try:
            con.execute(f"SET TimeZone = '{self.zone}'")
            yield con
        finally:
            con.close()


def _pg_in(zone):
    """The loopback PostgreSQL with its session TimeZone set to ``zone``."""
    opts = urllib.parse.quote(f"-c TimeZone={zone}")
    return SqlAlchemyDatabase(f"{POSTGRES_URL}?options={opts}")


def _keys(result, status):
    return [e.key for e in result.sample if e.status == status]


def _answer(r):
    """What a diff says, independent of how it was computed."""
    return (r.missing, r.extra, r.changed, r.duplicated_source, r.duplicated_target, r.collided_source,
            r.collided_target, dict(r.changed_columns), [(e.key, e.status, e.columns) for e in r.sample])


# ---- 4: case-insensitive keys across two databases --------------------------------------------

_FRUIT_S = "('Kiwi', 1), ('MANGO', 2), ('plum', 3), ('Fig', 4), ('lime', 5), ('Pear', 7)"
_FRUIT_T = "('kiwi', 1), ('mango', 2), ('PLUM', 30), ('fig', 4), ('Date', 6), ('pEAR', 7)"


def test_case_insensitive_keys_across_equal_the_single_database_diff(tmp_path, postgres, pg_schema):
    # Case ignored: kiwi, mango, fig, pear match; plum changed (3 vs 30); lime missing; date extra.
    a, b = DuckDBDatabase(tmp_path / "a.duckdb"), DuckDBDatabase(tmp_path / "b.duckdb")
    one = DuckDBDatabase(tmp_path / "one.duckdb")
    for db, rows in ((a, _FRUIT_S), (b, _FRUIT_T)):
        db.execute(f"CREATE TABLE f (k VARCHAR, v INT); INSERT INTO f VALUES {rows}")
    one.execute(f"CREATE TABLE s (k VARCHAR, v INT); INSERT INTO s VALUES {_FRUIT_S}; "
                f"CREATE TABLE t (k VARCHAR, v INT); INSERT INTO t VALUES {_FRUIT_T}")
    postgres.execute(f"CREATE TABLE {pg_schema}.s (k VARCHAR(10), v INT); INSERT INTO {pg_schema}.s VALUES {_FRUIT_S}; "
                     f"CREATE TABLE {pg_schema}.t (k TEXT, v INT); INSERT INTO {pg_schema}.t VALUES {_FRUIT_T}")
    expected = (1, 1, 1, 0, 0, 0, 0, {"v": 1}, [(["date"], "extra", []), (["lime"], "missing", []), (["plum"], "changed", ["v"])])
    single = [row_diff(one, "s", "t", ["k"], case_insensitive_keys=True),
              row_diff(postgres, f"{pg_schema}.s", f"{pg_schema}.t", ["k"], case_insensitive_keys=True)]
    across = [row_diff_across(a, b, "f", "f", ["k"], case_insensitive_keys=True, buckets=1024),
              row_diff_across(a, b, "f", "f", ["k"], case_insensitive_keys=True, buckets=1024, portable=True),
              row_diff_across(postgres, b, f"{pg_schema}.s", "f", ["k"], case_insensitive_keys=True, buckets=1024),
              row_diff_across(a, postgres, "f", f"{pg_schema}.t", ["k"], case_insensitive_keys=True, buckets=1024)]
    for r in single + across:
        assert _answer(r) == expected
    for r in across:
        # keys are bucketed as compared: only the buckets of lime, date and plum differ
        assert r.buckets_downloaded <= 3 and r.rows_downloaded <= 4


# ---- 10: identifiers resolved against each engine's catalog ------------------------------------


def test_identifiers_resolved_against_the_postgres_catalog(tmp_path, postgres, pg_schema):
    # "Amount" created quoted (mixed case); "Qty" and "QTY" differ only in case; "Note" and note too.
    for t, rows in (("s", "(1, 1.50, 1, 10, 'a', 'x'), (2, 2.00, 2, 20, 'b', 'y')"),
                    ("t", "(1, 1.50, 1, 11, 'a', 'x'), (2, 2.25, 2, 20, 'b', 'z')")):
        postgres.execute(f'CREATE TABLE {pg_schema}.{t} ("Id" INT, "Amount" NUMERIC(10,2), "Qty" INT, "QTY" INT, '
                         f'"Note" TEXT, note TEXT); INSERT INTO {pg_schema}.{t} VALUES {rows}')
    s, t = f"{pg_schema}.s", f"{pg_schema}.t"
    # every column compared, the two Qty columns apart: QTY differs for 1, Amount and note for 2
    r = row_diff(postgres, s, t, ["Id"])
    assert r.changed_columns == {"QTY": 1, "Amount": 1, "note": 1} and r.changed == 2
    # 'id' and 'amount' are no column's exact name and PostgreSQL folds them to themselves: a
    # unique case-insensitive match; 'NOTE' folds to note (an exact column), not "Note"
    r = row_diff(postgres, s, t, ["id"], ["amount", "NOTE", "Qty"])
    assert r.changed_columns == {"amount": 1, "NOTE": 1}
    with pytest.raises(CatalogError, match="ambiguous"):
        row_diff(postgres, s, t, ["Id"], ["qty"])  # neither exact nor folded; "Qty" and "QTY" both match
    # across: PostgreSQL's "Amount" against DuckDB's amount
    duck = DuckDBDatabase(tmp_path / "w.duckdb")
    duck.execute("CREATE TABLE t (id INT, amount DECIMAL(10,2)); INSERT INTO t VALUES (1, 1.50), (2, 2.25)")
    r = row_diff_across(postgres, duck, s, "t", ["Id"], ["Amount"])
    assert _answer(r) == _answer(row_diff(postgres, s, t, ["Id"], ["Amount"])) and r.changed_columns == {"Amount": 1}
    with pytest.raises(CatalogError, match="ambiguous"):
        row_diff_across(postgres, duck, s, "t", ["Id"], ["qty"])
    # reconciliation: sums of "Amount" per "Qty", PostgreSQL against DuckDB
    duck.execute("CREATE TABLE r (qty INT, amount DECIMAL(10,2)); INSERT INTO r VALUES (1, 1.50), (2, 2.00)")
    res = reconcile(postgres, duck, s, "r", ["Qty"], ["Amount"])
    assert res.passed and [sl.slice for sl in res.slices] == [{"Qty": 1}, {"Qty": 2}]
    with pytest.raises(CatalogError, match="ambiguous"):
        reconcile(postgres, duck, s, "r", ["qty"], ["Amount"])


def _make_quoted(db, name, columns, rows):
    """Like ``make_table`` but every column name quoted, so a mixed-case name keeps its case."""
    from sqlglot import exp

    from dw_dagster.databases import sql
    from dw_dagster.databases.catalog import quoted
    from dw_dagster_tests.harness.emulators import _typed_literal

    types = {c: exp.DataType.build(t, dialect="duckdb") for c, t in columns.items()}
    db.execute(exp.Create(kind="TABLE", this=exp.Schema(this=sql.table(name), expressions=[
        exp.ColumnDef(this=quoted(c), kind=t.copy()) for c, t in types.items()])).sql(dialect=db.dialect))
    values = exp.values([exp.tuple_(*(_typed_literal(v, types[c]) for v, c in zip(row, columns))) for row in rows])
    db.execute(exp.insert(values, sql.table(name), columns=[quoted(c) for c in columns]).sql(dialect=db.dialect))


def test_identifiers_on_every_warehouse(warehouse):
    # A quoted mixed-case "Amount" and a plain qty (upper case in Snowflake's catalog), named as
    # a user writes them; t differs from s in Amount for key 2.
    from decimal import Decimal

    cols = {"Id": "INTEGER", "Amount": "DECIMAL(10,2)"}
    s, t = warehouse.table("s"), warehouse.table("t")
    _make_quoted(warehouse.db, s, cols, [(1, Decimal("1.00")), (2, Decimal("2.00"))])
    _make_quoted(warehouse.db, t, cols, [(1, Decimal("1.00")), (2, Decimal("2.50"))])
    q = warehouse.make_table("q", {"qty": "INTEGER", "Amount": "DECIMAL(10,2)"}, [(1, Decimal("1.00")), (2, Decimal("2.50"))])
    r = row_diff(warehouse.db, s, t, ["Id"], ["Amount"])
    assert (r.changed, r.changed_columns, _keys(r, "changed")) == (1, {"Amount": 1}, [[2]])
    res = reconcile(warehouse.db, warehouse.db, t, q, [], ["Amount"])
    assert res.passed  # 1.00 + 2.50 on both sides
    res = reconcile(warehouse.db, warehouse.db, q, q, ["qty"], ["amount"])
    assert res.passed and len(res.slices) == 2


# ---- 2: session TimeZone in compared values ----------------------------------------------------

# id 1 and 2 equal in UTC; id 3's naive copy is an hour off.
_AWARE = "(1, TIMESTAMPTZ '2024-03-10 06:30:00+00'), (2, TIMESTAMPTZ '2024-11-03 05:45:00+00'), (3, TIMESTAMPTZ '2024-07-01 23:10:00+00')"
_NAIVE = "(1, TIMESTAMP '2024-03-10 06:30:00'), (2, TIMESTAMP '2024-11-03 05:45:00'), (3, TIMESTAMP '2024-07-02 00:10:00')"


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_aware_against_naive_values_in_any_session_zone(tmp_path, postgres, pg_schema, zone):
    path = tmp_path / "z.duckdb"
    DuckDBDatabase(path).execute(f"CREATE TABLE s (id INT, ts TIMESTAMPTZ); INSERT INTO s VALUES {_AWARE}; "
                                 f"CREATE TABLE t (id INT, ts TIMESTAMP); INSERT INTO t VALUES {_NAIVE}")
    postgres.execute(f"CREATE TABLE {pg_schema}.s (id INT, ts TIMESTAMPTZ); INSERT INTO {pg_schema}.s VALUES {_AWARE}; "
                     f"CREATE TABLE {pg_schema}.t (id INT, ts TIMESTAMP); INSERT INTO {pg_schema}.t VALUES {_NAIVE}")
    duck, pg = _ZonedDuck(path, zone), _pg_in(zone)
    try:
        assert duck.fetch_all("SELECT current_setting('TimeZone')")[0][0] == zone
        assert pg.fetch_all("SHOW TimeZone")[0][0] == zone
        expected = (0, 0, 1, 0, 0, 0, 0, {"ts": 1}, [([3], "changed", ["ts"])])
        results = [row_diff(duck, "s", "t", ["id"]), row_diff(pg, f"{pg_schema}.s", f"{pg_schema}.t", ["id"]),
                   row_diff_across(pg, duck, f"{pg_schema}.s", "t", ["id"]),
                   row_diff_across(duck, pg, "s", f"{pg_schema}.t", ["id"]),
                   row_diff(duck, "s", "t", ["id"], timestamp_precision="second")]
        for r in results:
            assert _answer(r) == expected
        # the aware key against the naive key: ids 1, 2 pair up by their UTC instant, id 3 does not
        for r in (row_diff(duck, "s", "t", ["ts"], []), row_diff(pg, f"{pg_schema}.s", f"{pg_schema}.t", ["ts"], []),
                  row_diff_across(pg, duck, f"{pg_schema}.s", "t", ["ts"], [])):
            assert (r.missing, r.extra, r.changed) == (1, 1, 0)
        # the naive copies as hashed across two sessions: equal rows never need a download
        assert row_diff_across(pg, duck, f"{pg_schema}.s", "t", ["id"], buckets=1024).rows_downloaded == 2
    finally:
        pg.dispose()


# ---- 1: timestamps stored at another precision -------------------------------------------------

# source microseconds; the target holds milliseconds from loaders that truncated or rounded:
# 1: .123456 -> .123 (either)      2: .123756 -> .124 (rounded)   3: 00.999600 -> 01.000 (rounded)
# 4: .500000 -> .502 (2 ms off)    5: .100900 -> .100 (truncated)
_US = ("(1, TIMESTAMP '2024-05-01 08:00:00.123456'), (2, TIMESTAMP '2024-05-01 08:00:00.123756'), "
       "(3, TIMESTAMP '2024-05-01 08:00:00.9996'), (4, TIMESTAMP '2024-05-01 08:00:00.5'), "
       "(5, TIMESTAMP '2024-05-01 08:00:00.1009')")
_MS = ("(1, TIMESTAMP '2024-05-01 08:00:00.123'), (2, TIMESTAMP '2024-05-01 08:00:00.124'), "
       "(3, TIMESTAMP '2024-05-01 08:00:01'), (4, TIMESTAMP '2024-05-01 08:00:00.502'), "
       "(5, TIMESTAMP '2024-05-01 08:00:00.100')")


@pytest.mark.parametrize("rounding,changed", [("tolerate", [[4]]), ("floor", [[2], [3], [4]]), ("round", [[4], [5]])])
def test_timestamp_precision_rounding_rule(tmp_path, postgres, pg_schema, rounding, changed):
    duck = DuckDBDatabase(tmp_path / "p.duckdb")
    duck.execute(f"CREATE TABLE s (id INT, ts TIMESTAMP); INSERT INTO s VALUES {_US}; "
                 f"CREATE TABLE t (id INT, ts TIMESTAMP); INSERT INTO t VALUES {_MS}")
    postgres.execute(f"CREATE TABLE {pg_schema}.s (id INT, ts TIMESTAMP); INSERT INTO {pg_schema}.s VALUES {_US}; "
                     f"CREATE TABLE {pg_schema}.t (id INT, ts TIMESTAMP(3)); INSERT INTO {pg_schema}.t VALUES {_MS}")
    s, t = f"{pg_schema}.s", f"{pg_schema}.t"
    kw = dict(timestamp_precision="millisecond", timestamp_rounding=rounding)
    for r in (row_diff(duck, "s", "t", ["id"], **kw), row_diff(postgres, s, t, ["id"], **kw),
              row_diff_across(postgres, duck, s, "t", ["id"], **kw), row_diff_across(duck, postgres, "s", t, ["id"], **kw)):
        assert _keys(r, "changed") == changed
        assert r.timestamp_rule.startswith(f"millisecond, {rounding}:")
    # without a precision every microsecond counts: 1, 2, 3, 4 and 5 all differ, and no rule is stated
    r = row_diff(duck, "s", "t", ["id"])
    assert r.changed == 5 and r.timestamp_rule is None
    with pytest.raises(ValueError, match="timestamp_rounding"):
        row_diff(duck, "s", "t", ["id"], timestamp_precision="second", timestamp_rounding="ceil")


# ---- 3a: CHAR semantics declared per column and side -------------------------------------------


def test_declared_char_columns_trim_only_those(tmp_path, postgres, pg_schema):
    # code came from a CHAR(4) export (padded) into DuckDB, which has no padded type; note is a real
    # VARCHAR whose trailing blank changed for key 'B'. The key itself was padded too.
    src_rows = "('A   ', 'AB  ', 'x'), ('B   ', 'CD  ', 'y ')"
    tgt_rows = "('A', 'AB', 'x'), ('B', 'CD', 'y')"
    one = DuckDBDatabase(tmp_path / "one.duckdb")
    one.execute(f"CREATE TABLE s (k VARCHAR, code VARCHAR, note VARCHAR); INSERT INTO s VALUES {src_rows}; "
                f"CREATE TABLE t (k VARCHAR, code VARCHAR, note VARCHAR); INSERT INTO t VALUES {tgt_rows}")
    postgres.execute(f"CREATE TABLE {pg_schema}.t (k VARCHAR(4), code VARCHAR(4), note VARCHAR(4)); "
                     f"INSERT INTO {pg_schema}.t VALUES {tgt_rows}")
    declared = dict(source_char_columns=["k", "CODE"])
    expected = (0, 0, 1, 0, 0, 0, 0, {"note": 1}, [(["B"], "changed", ["note"])])
    for r in (row_diff(one, "s", "t", ["k"], **declared),
              row_diff_across(one, postgres, "s", f"{pg_schema}.t", ["k"], **declared),
              row_diff_across(one, postgres, "s", f"{pg_schema}.t", ["k"], portable=True, **declared)):
        assert _answer(r) == expected
    # trimming every text column hides the real change in note
    assert row_diff(one, "s", "t", ["k"], trim_trailing_blanks=True).identical
    # nothing declared: the padded key and code differ
    r = row_diff(one, "s", "t", ["k"])
    assert (r.missing, r.extra) == (2, 2)
    with pytest.raises(Exception, match="declared CHAR column nope"):
        row_diff(one, "s", "t", ["k"], source_char_columns=["nope"])


# ---- 3b: key collisions after normalization ----------------------------------------------------


def test_key_collision_after_trimming_or_case_folding(tmp_path, postgres, pg_schema):
    # DuckDB: 'a' and 'a ' are two source keys; with k declared CHAR they fold into one key, which
    # is a collision (not a duplicate) and is not paired with the target's 'a'. 'b' matches.
    one = DuckDBDatabase(tmp_path / "one.duckdb")
    one.execute("CREATE TABLE s (k VARCHAR, v INT); INSERT INTO s VALUES ('a', 1), ('a ', 1), ('b', 2); "
                "CREATE TABLE t (k VARCHAR, v INT); INSERT INTO t VALUES ('a', 1), ('b', 2)")
    other = DuckDBDatabase(tmp_path / "other.duckdb")
    other.execute("CREATE TABLE t (k VARCHAR, v INT); INSERT INTO t VALUES ('a', 1), ('b', 2)")
    expected = (0, 0, 0, 0, 0, 1, 0, {}, [(["a"], "collision", [])])
    pg_t = _pg_copy(postgres, pg_schema, "('a', 1), ('b', 2)")
    for r in (row_diff(one, "s", "t", ["k"], source_char_columns=["k"]),
              row_diff_across(one, other, "s", "t", ["k"], source_char_columns=["k"]),
              row_diff_across(one, postgres, "s", pg_t, ["k"], source_char_columns=["k"])):
        assert _answer(r) == expected and not r.identical
        assert [(c.side, c.key, c.spellings, c.count) for c in r.collisions] == [("source", ["a"], ["a", "a "], 2)]
    # PostgreSQL: 'Q1' and 'q1' collide on the target when case is ignored; 'q2' matches 'Q2'
    postgres.execute(f"CREATE TABLE {pg_schema}.s (k TEXT, v INT); INSERT INTO {pg_schema}.s VALUES ('q1', 1), ('Q2', 2); "
                     f"CREATE TABLE {pg_schema}.t2 (k TEXT, v INT); INSERT INTO {pg_schema}.t2 VALUES ('Q1', 1), ('q1', 1), ('q2', 2)")
    s, t = f"{pg_schema}.s", f"{pg_schema}.t2"
    for r in (row_diff(postgres, s, t, ["k"], case_insensitive_keys=True),
              row_diff_across(postgres, postgres, s, t, ["k"], case_insensitive_keys=True)):
        assert _answer(r) == (0, 0, 0, 0, 0, 0, 1, {}, [(["q1"], "collision", [])])
        assert [(c.side, c.spellings) for c in r.collisions] == [("target", ["Q1", "q1"])]


def _pg_copy(postgres, schema, rows):
    postgres.execute(f"CREATE TABLE IF NOT EXISTS {schema}.t (k TEXT, v INT); DELETE FROM {schema}.t; "
                     f"INSERT INTO {schema}.t VALUES {rows}")
    return f"{schema}.t"


# ---- 11: NaN and infinities in reconciled sums -------------------------------------------------

# slice A: NaN on both sides, finite sums 3.5 vs 4.0 (a real difference NaN must not hide)
# slice B: NaN, +Inf and 1.0 on both sides: passes
# slice C: a NaN in the source where the target holds 1.0: NaN counts 1 vs 0 and finite 1 vs 2
_NAN_S = ("('A', 1.5), ('A', 'NaN'), ('A', 2.0), ('B', 'NaN'), ('B', 'Infinity'), ('B', 1.0), "
          "('B', '-Infinity'), ('C', 1.0), ('C', 'NaN')")
_NAN_T = ("('A', 1.5), ('A', 'NaN'), ('A', 2.5), ('B', 'NaN'), ('B', 'Infinity'), ('B', 1.0), "
          "('B', '-Infinity'), ('C', 1.0), ('C', 1.0)")


def test_nan_and_infinities_counted_apart_in_reconciliation(tmp_path, postgres, pg_schema):
    duck = DuckDBDatabase(tmp_path / "n.duckdb")
    duck.execute(f"CREATE TABLE s (r VARCHAR, m DOUBLE); INSERT INTO s VALUES {_NAN_S}; "
                 f"CREATE TABLE t (r VARCHAR, m DOUBLE); INSERT INTO t VALUES {_NAN_T}")
    postgres.execute(f"CREATE TABLE {pg_schema}.s (r TEXT, m NUMERIC); INSERT INTO {pg_schema}.s VALUES {_NAN_S}; "
                     f"CREATE TABLE {pg_schema}.t (r TEXT, m DOUBLE PRECISION); INSERT INTO {pg_schema}.t VALUES {_NAN_T}")
    s, t = f"{pg_schema}.s", f"{pg_schema}.t"
    for res in (reconcile(duck, duck, "s", "t", ["r"], ["m"]), reconcile(postgres, postgres, s, t, ["r"], ["m"]),
                reconcile(postgres, duck, s, "t", ["r"], ["m"]), reconcile(duck, postgres, "s", t, ["r"], ["m"]),
                reconcile(postgres, duck, s, "t", ["r"], ["m"], key_columns=["r", "m"])):
        by = {sl.slice["r"]: sl for sl in res.slices}
        assert {k: sl.passed for k, sl in by.items()} == {"A": False, "B": True, "C": False}
        assert float(by["A"].source_sums["m"]) == 3.5 and float(by["A"].target_sums["m"]) == 4.0
        assert by["A"].source_nonfinite == by["A"].target_nonfinite == {"m": [1, 0, 0]}
        assert by["B"].source_nonfinite == {"m": [1, 1, 1]} and float(by["B"].source_sums["m"]) == 1.0
        assert (by["C"].source_nonfinite, by["C"].target_nonfinite) == ({"m": [1, 0, 0]}, {"m": [0, 0, 0]})


# ---- 12: a table that changed while it was read ------------------------------------------------


class _Reloading:
    """A database whose ``table`` is emptied just before each of the first ``times`` aggregate
    reads and reloaded just after (a loader's truncate-and-reload racing the check)."""

    def __init__(self, db, table, rows, times):
        self.db, self.table, self.rows, self.times = db, table, rows, times
        self.dialect, self.name = db.dialect, db.name

    def fetch_all(self, q):
        if "dw_rows" not in q or self.times <= 0:
            return self.db.fetch_all(q)
        self.times -= 1
        self.db.execute(f"DELETE FROM {self.table}")
        try:
            return self.db.fetch_all(q)
        finally:
            self.db.execute(f"INSERT INTO {self.table} VALUES {self.rows}")

    def fetch_batches(self, q, batch_rows=100_000):
        return self.db.fetch_batches(q, batch_rows)

    def execute(self, q):
        self.db.execute(q)


@pytest.mark.parametrize("engine", ["duckdb", "postgres"])
def test_target_reloaded_while_read_is_retried_then_inconclusive(tmp_path, postgres, pg_schema, engine):
    rows = "('N', 1.00), ('N', 2.00), ('S', 3.00)"
    if engine == "duckdb":
        db, t = DuckDBDatabase(tmp_path / "r.duckdb"), "t"
    else:
        db, t = postgres, f"{pg_schema}.t"
    db.execute(f"CREATE TABLE {t} (region VARCHAR(4), amt DECIMAL(10,2)); INSERT INTO {t} VALUES {rows}")
    duck = DuckDBDatabase(tmp_path / "s.duckdb")
    duck.execute(f"CREATE TABLE s (region VARCHAR, amt DECIMAL(10,2)); INSERT INTO s VALUES {rows}")
    # emptied during the first read only: the second read is stable and matches (3 rows each side)
    res = reconcile(duck, _Reloading(db, t, rows, 1), "s", t, ["region"], ["amt"], retry_wait_s=0)
    assert (res.passed, res.inconclusive, res.attempts, len(res.unstable)) == (True, False, 2, 1)
    assert "target" in res.unstable[0] and "0 rows read, 3 right after" in res.unstable[0]
    # emptied during every read: inconclusive, never "100 % short"
    res = reconcile(duck, _Reloading(db, t, rows, 5), "s", t, ["region"], ["amt"], stable_read_attempts=3, retry_wait_s=0)
    assert (res.passed, res.inconclusive, res.attempts) == (False, True, 3)


def test_inconclusive_check_opens_no_incident(tmp_path):
    import dagster as dg

    from dw_dagster.checks.reconcile import INCONCLUSIVE_KEY, build_reconciliation_checks
    from dw_dagster.databases import DatabaseResource
    from dw_dagster.detection.incidents import _inconclusive

    duck = DuckDBDatabase(tmp_path / "c.duckdb")
    duck.execute("CREATE TABLE s (r VARCHAR, m INT); INSERT INTO s VALUES ('a', 1); CREATE TABLE t (r VARCHAR, m INT)")

    class _AlwaysReloading(dg.ConfigurableResource):
        path: str

        def get_database(self):
            return _Reloading(DuckDBDatabase(self.path), "t", "('a', 1)", 100)

    check = build_reconciliation_checks(asset="t", source_asset="s", source_table="s", target_table="t",
                                        slice_by=["r"], measures=["m"])
    defs = dg.Definitions(assets=[dg.AssetSpec("t"), dg.AssetSpec("s")], asset_checks=[check],
                          jobs=[dg.define_asset_job("c", selection=dg.AssetSelection.checks(check))],
                          resources={"source_db": DatabaseResource(url=duck.path),
                                     "warehouse": _AlwaysReloading(path=duck.path)})
    import sys

    rec = sys.modules["dw_dagster.checks.reconcile"]  # the package's `reconcile` is the function

    with dg.instance_for_test() as instance, pytest.MonkeyPatch.context() as mp:
        mp.setattr(rec.time, "sleep", lambda s: None)  # the check waits 2 s between its three reads
        (ev,) = defs.resolve_job_def("c").execute_in_process(instance=instance).get_asset_check_evaluations()
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.WARN
    assert ev.description.startswith("inconclusive after 3 reads") and ev.metadata[INCONCLUSIVE_KEY].value is True
    assert _inconclusive(ev)


class _ReloadingBatches(_Reloading):
    """Empties ``table`` just before its bucket hashes are read, reloads it just after."""

    def fetch_all(self, q):
        return self.db.fetch_all(q)

    def fetch_batches(self, q, batch_rows=100_000):
        if "dw_b" not in q or self.times <= 0:
            yield from self.db.fetch_batches(q, batch_rows)
            return
        self.times -= 1
        self.db.execute(f"DELETE FROM {self.table}")
        try:
            yield from self.db.fetch_batches(q, batch_rows)
        finally:
            self.db.execute(f"INSERT INTO {self.table} VALUES {self.rows}")


def test_row_diff_across_flags_a_target_reloaded_while_read(tmp_path, postgres, pg_schema):
    rows = "(1, 'a'), (2, 'b')"
    postgres.execute(f"CREATE TABLE {pg_schema}.t (k INT, v TEXT); INSERT INTO {pg_schema}.t VALUES {rows}")
    duck = DuckDBDatabase(tmp_path / "s.duckdb")
    duck.execute(f"CREATE TABLE s (k INT, v VARCHAR); INSERT INTO s VALUES {rows}")
    r = row_diff_across(duck, _ReloadingBatches(postgres, f"{pg_schema}.t", rows, 1), "s", f"{pg_schema}.t", ["k"])
    assert r.unstable == [f"target {pg_schema}.t changed while read: 2 rows counted, 0 hashed"]
    r = row_diff_across(duck, postgres, "s", f"{pg_schema}.t", ["k"])
    assert r.identical and r.unstable == []


def test_nan_and_infinities_on_every_warehouse(warehouse):
    # A: NaN on both sides, finite 3.0 vs 3.5 (fails); B: NaN, +Inf, -Inf and 2.0 on both (passes)
    cols = {"r": "VARCHAR", "m": "DOUBLE"}
    s = warehouse.make_table("s", cols, [("A", 1.0), ("A", "NaN"), ("A", 2.0), ("B", "NaN"), ("B", "inf"), ("B", "-inf"),
                                         ("B", 2.0)])
    t = warehouse.make_table("t", cols, [("A", 1.0), ("A", "NaN"), ("A", 2.5), ("B", "NaN"), ("B", "inf"), ("B", "-inf"),
                                         ("B", 2.0)])
    by = {sl.slice["r"]: sl for sl in reconcile(warehouse.db, warehouse.db, s, t, ["r"], ["m"]).slices}
    assert (by["A"].passed, by["B"].passed) == (False, True)
    assert (float(by["A"].source_sums["m"]), float(by["A"].target_sums["m"])) == (3.0, 3.5)
    assert by["A"].source_nonfinite == {"m": [1, 0, 0]} and by["B"].target_nonfinite == {"m": [1, 1, 1]}


def test_aware_against_naive_on_every_warehouse(warehouse):
    # an aware column (TIMESTAMPTZ; TIMESTAMP_TZ on Snowflake, TIMESTAMP on BigQuery) against a
    # naive UTC-by-contract one (DATETIME on BigQuery): ids 1, 2 equal in UTC, id 3 an hour off
    import datetime as dt

    utc = dt.timezone.utc
    s = warehouse.make_table("s", {"id": "INTEGER", "ts": "TIMESTAMPTZ"},
                             [(1, dt.datetime(2024, 3, 10, 6, 30, tzinfo=utc)), (2, dt.datetime(2024, 11, 3, 5, 45, tzinfo=utc)),
                              (3, dt.datetime(2024, 7, 1, 23, 10, tzinfo=utc))])
    t = warehouse.make_table("t", {"id": "INTEGER", "ts": "TIMESTAMP"},
                             [(1, dt.datetime(2024, 3, 10, 6, 30)), (2, dt.datetime(2024, 11, 3, 5, 45)),
                              (3, dt.datetime(2024, 7, 2, 0, 10))])
    r = row_diff(warehouse.db, s, t, ["id"])
    assert _answer(r) == (0, 0, 1, 0, 0, 0, 0, {"ts": 1}, [([3], "changed", ["ts"])])


def test_mixed_case_timestamp_column_in_volume_and_null_rate(postgres, pg_schema):
    # "LoadedAt" created quoted (aware), read in a New York session: 3 rows on 2024-03-09 UTC
    # (one at 02:00 UTC, the evening of the 8th in New York), 2 on 2024-03-10 UTC; Note NULL once.
    import datetime as dt

    from dw_dagster.checks.null_rate import null_rates
    from dw_dagster.checks.volume import volume_scores

    postgres.execute(f'CREATE TABLE {pg_schema}.e ("LoadedAt" TIMESTAMPTZ, "Note" TEXT); INSERT INTO {pg_schema}.e VALUES '
                     "('2024-03-09 02:00+00', 'a'), ('2024-03-09 12:00+00', 'b'), ('2024-03-09 23:30+00', 'c'), "
                     "('2024-03-10 01:00+00', NULL), ('2024-03-10 13:00+00', 'd')")
    pg = _pg_in("America/New_York")
    try:
        (s,), _ = volume_scores(pg, f"{pg_schema}.e", "LoadedAt", evaluate_days=1, as_of=dt.date(2024, 3, 10),
                                training_days=1, min_band_pct=0)
        assert s.rows == 2
        (s,), _ = volume_scores(pg, f"{pg_schema}.e", "loadedat", evaluate_days=1, as_of=dt.date(2024, 3, 9),
                                training_days=1, min_band_pct=0)
        assert s.rows == 3
        rates, _ = null_rates(pg, f"{pg_schema}.e", ["Note"])
        assert [r.current_pct for r in rates] == [20.0]
    finally:
        pg.dispose()


def test_snapshot_read_excludes_a_reload_running_beside_it(tmp_path, postgres, pg_schema):
    """A PostgreSQL side is read in one snapshot with its table locked first (issue 32, item 3): a loader's
    reload in one transaction, running while the check reads, is read as before or after it, never half
    done, and needs no recount; a reload that empties the table in a commit of its own is still caught."""
    import threading

    import psycopg

    rows = ", ".join(f"('R{i % 3}', {i}.00)" for i in range(300))
    t = f"{pg_schema}.t"
    postgres.execute(f"CREATE TABLE {t} (region TEXT, amt NUMERIC(10,2)); INSERT INTO {t} VALUES {rows}")
    duck = DuckDBDatabase(tmp_path / "s.duckdb")
    duck.execute(f"CREATE TABLE s (region VARCHAR, amt DECIMAL(10,2)); INSERT INTO s VALUES {rows}")
    url = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    for reload in (f"DELETE FROM {t}", f"TRUNCATE {t}"):
        emptied, release = threading.Event(), threading.Event()

        def loader():
            with psycopg.connect(url) as con:  # one transaction: empty, refill, commit once told to
                con.execute(reload)
                con.execute(f"INSERT INTO {t} VALUES {rows}")
                emptied.set()
                release.wait(10)
                con.commit()

        th = threading.Thread(target=loader)
        th.start()
        emptied.wait(10)
        # DELETE: the snapshot reads the rows committed before the reload; TRUNCATE: the lock waits for its commit
        threading.Timer(1.0, release.set).start()
        res = reconcile(duck, postgres, "s", t, ["region"], ["amt"], retry_wait_s=0)
        th.join()
        assert (res.passed, res.attempts, res.unstable) == (True, 1, []), (reload, res.unstable)
    # the recount stays for a snapshot side that read no row (emptied and refilled in two commits)
    res = reconcile(duck, _Reloading(postgres, t, rows, 1), "s", t, ["region"], ["amt"], retry_wait_s=0)
    assert (res.passed, res.attempts, len(res.unstable)) == (True, 2, 1)
