"""reladiff's own test inputs as an oracle (https://github.com/erezsh/reladiff, ``tests/``).

Each case re-expresses one of reladiff's tests (``tests/test_joindiff.py``,
``tests/test_diff_tables.py``) as two small tables and runs them through ``row_diff`` (one
DuckDB file), ``row_diff_across`` between two DuckDB files, and DuckDB ↔ PostgreSQL. reladiff
answers with a stream of ``("-", row)`` (a source row not matched exactly) and ``("+", row)`` (a
target row not matched exactly); :func:`_as_reladiff` turns our result (missing, extra, changed
keys) into that stream, and it must equal reladiff's expected output.

Where our default differs, the test asserts our answer and says why (the ``DIFFERS`` cases):

- duplicate keys (reladiff ``test_dup_pks``: a ``ValueError``; ``TestDuplicateTables`` with
  ``duplicate_rows_support``: every duplicate row listed): we count a duplicated key
  (``duplicated_source`` / ``duplicated_target``) and do not pair its rows, since which copy is
  "the" row is not defined; a key duplicated on one side is not silently reported as a change.
- NULL keys (reladiff ``test_null_pks``: a ``ValueError``): we compare keys NULL-safely (a NULL
  key matches a NULL key) and warn how many there are, so a table with a NULL key is still diffed.
- keys of mixed kinds (reladiff ``TestUUIDs`` adds the key ``unexpected`` among UUIDs,
  ``TestAlphanumericKeys`` adds ``@@@``: a ``ValueError`` / ``NotImplementedError``, because its
  bisection does arithmetic on the key): our diff joins on the key's value and needs no key
  arithmetic, so the odd key is reported like any other (``missing`` here).
- columns of other names on each side (``TestDiffTables2``: reladiff pairs ``id``/``id2`` by the
  segment's arguments) and an update-time range (``TestDates.test_offset``: ``min_update`` /
  ``max_update``): our diffs compare columns of the same name over whole tables; the option that
  makes them agree is a view (``SELECT id2 AS id ...``, ``... WHERE datetime < :max``) on each side,
  which both diffs accept wherever they accept a table.
"""

import datetime as dt
import string
import uuid

import pytest

from dw_dagster.checks.rowdiff import row_diff, row_diff_across
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.field_cases.tables import load

KINDS = [
    kind("oracle-reladiff", "oracle", "reladiff's own test inputs (joindiff and hashdiff suites) agree with our row diffs",
         "https://github.com/erezsh/reladiff", "dw_dagster/checks/rowdiff/", "test_reladiff_case", False),
    kind("oracle-reladiff-options", "oracle", "reladiff cases where our default differs (duplicate and NULL keys), "
         "with the reason", "https://github.com/erezsh/reladiff", "dw_dagster/checks/rowdiff/",
         "test_reladiff_case_that_differs_by_default", False),
    kind("oracle-reladiff-odd-keys", "oracle", "reladiff cases of duplicated rows and keys of mixed kinds (a non-UUID "
         "among UUIDs, @@@ among alphanumerics), where reladiff raises or lists rows", "https://github.com/erezsh/reladiff",
         "dw_dagster/checks/rowdiff/", "test_reladiff_cases_of_duplicates_and_odd_keys_by_default", False),
    kind("oracle-reladiff-views", "oracle", "reladiff's column mapping (id against id2) and update-time ranges, agreeing "
         "through a view on each side", "https://github.com/erezsh/reladiff", "dw_dagster/checks/rowdiff/",
         "test_reladiff_column_mapping_and_update_range_agree_through_views", False),
]

T = dt.datetime(2022, 1, 1, 12, 30, 15)
MOVIE = [("id", "INTEGER"), ("userid", "INTEGER"), ("movieid", "INTEGER"), ("rating", "INTEGER"), ("timestamp", "TIMESTAMP")]
TEXT3 = [("id", "VARCHAR(40)"), ("c1", "VARCHAR(40)"), ("c2", "VARCHAR(40)")]
U = [f"00000000-0000-1000-8000-00000000000{i}" for i in range(10)]

# name: (columns, keys, source rows, target rows, reladiff's expected stream)
CASES = {
    "joindiff.test_composite_key[id]": (MOVIE, ["id"], [(1, 1, 1, 9, T), (2, 2, 2, 9, T)], [(1, 1, 1, 9, T), (2, 3, 2, 9, T)],
                                        {("-", (2, 2, 2, 9, T)), ("+", (2, 3, 2, 9, T))}),
    "joindiff.test_composite_key[id,userid]": (MOVIE, ["id", "userid"], [(1, 1, 1, 9, T), (2, 2, 2, 9, T)],
                                               [(1, 1, 1, 9, T), (2, 3, 2, 9, T)], {("-", (2, 2, 2, 9, T)), ("+", (2, 3, 2, 9, T))}),
    "joindiff.test_diff_small_tables": (MOVIE, ["id"], [(1, 1, 1, 9, T), (2, 2, 2, 9, T)], [(1, 1, 1, 9, T)], {("-", (2, 2, 2, 9, T))}),
    "joindiff.test_diff_table_above_bisection_threshold": (
        MOVIE, ["id"], [(i, i, i, 9, T) for i in range(1, 6)], [(i, i, i, 9, T) for i in range(1, 5)], {("-", (5, 5, 5, 9, T))}),
    "joindiff.test_return_empty_array_when_same": (MOVIE, ["id"], [(1, 1, 1, 9, T)], [(1, 1, 1, 9, T)], set()),
    "joindiff.test_diff_sorted_by_key": (
        MOVIE, ["id"], [(1, 1, 1, 9, T), (2, 2, 2, 9, T), (3, 3, 3, 9, T), (4, 4, 4, 9, T)],
        [(1, 1, 1, 9, T), (2, 2, 2, 9, T), (3, 3, 3, 8, T), (4, 4, 4, 7, T)],
        {("-", (3, 3, 3, 9, T)), ("+", (3, 3, 3, 8, T)), ("-", (4, 4, 4, 9, T)), ("+", (4, 4, 4, 7, T))}),
    "diff_tables.TestTableNullRowChecksum": ([("id", "VARCHAR(40)"), ("text_comment", "VARCHAR(40)")], ["id"],
                                             [(U[1], "1"), (U[2], None)], [(U[1], "1")], {("-", (U[2], None))}),
    "diff_tables.TestConcatMultipleColumnWithNulls": (
        TEXT3, ["id"], [(U[i], str(i), None) for i in range(8)], [(U[i], f"{i}-different", None) for i in range(8)],
        {("-", (U[i], str(i), None)) for i in range(8)} | {("+", (U[i], f"{i}-different", None)) for i in range(8)}),
    "diff_tables.TestCompoundKeySimple3.test_negative_keys[id]": (
        [("id", "INTEGER"), ("id2", "INTEGER")], ["id"], [(i, i + 1000) for i in range(1000)] + [(-999, 1001)],
        [(i, i + 1000) for i in range(1000)] + [(-999, -999998)], {("-", (-999, 1001)), ("+", (-999, -999998))}),
    "diff_tables.TestCompoundKeySimple3.test_negative_keys[id,id2]": (
        [("id", "INTEGER"), ("id2", "INTEGER")], ["id", "id2"], [(i, i + 1000) for i in range(1000)] + [(-999, 1001)],
        [(i, i + 1000) for i in range(1000)] + [(-999, -999998)], {("-", (-999, 1001)), ("+", (-999, -999998))}),
    "diff_tables.TestTableTableEmpty.test_empty_table": ([("id", "VARCHAR(40)"), ("text_comment", "VARCHAR(40)")], ["id"],
                                                         [], [], set()),
    "diff_tables.TestTableTableEmpty.test_empty_table2": ([("id", "VARCHAR(40)"), ("text_comment", "VARCHAR(40)")], ["id"],
                                                          [(U[0], "a"), (U[1], "b")], [],
                                                          {("-", (U[0], "a")), ("-", (U[1], "b"))}),
    "diff_tables.TestCompoundKeyAlphanum (its shape, our values)": (
        [("id", "VARCHAR(40)"), ("id2", "INTEGER"), ("comment", "VARCHAR(40)")], ["id", "id2"],
        [("a", 1, "x"), ("a", 2, "y"), ("b", 1, "z")], [("a", 1, "x"), ("a", 2, "Y"), ("c", 1, "z")],
        {("-", ("a", 2, "y")), ("+", ("a", 2, "Y")), ("-", ("b", 1, "z")), ("+", ("c", 1, "z"))}),
}


def _u(i: int) -> str:
    """A version-1-shaped UUID as text (reladiff's ``str(uuid.uuid1(i))``, made reproducible)."""
    return str(uuid.UUID(f"{i:08x}-0000-11ee-8000-{i:012x}"))


#: reladiff's key alphabet (sqeleton ``alphanums``) and its base-65 numerals, written here
ALNUM = " -" + string.digits + string.ascii_uppercase + "_" + string.ascii_lowercase


def _alnum(n: int) -> str:
    out = ""
    while n > 0:
        n, r = divmod(n, len(ALNUM))
        out = ALNUM[r] + out
    return out


NOW = dt.datetime(2022, 1, 1, 12, 0, 0)
DATES = [("id", "INTEGER"), ("datetime", "TIMESTAMP"), ("text_comment", "VARCHAR(40)")]
DATE_ROWS = [(0, NOW - dt.timedelta(days=50), "50 days ago"), (1, NOW - dt.timedelta(hours=3), "3 hours ago"),
             (2, NOW - dt.timedelta(minutes=10), "10 mins ago"), (3, NOW - dt.timedelta(seconds=1), "1 second ago"),
             (4, NOW, "now")]
DATE_SRC = DATE_ROWS + [(5, NOW - dt.timedelta(seconds=5), "5 seconds ago")]
TEXT2 = [("id", "VARCHAR(40)"), ("text_comment", "VARCHAR(40)")]
UUID_ROWS = [(_u(i), str(i)) for i in range(100)]
NEW_UUID = _u(32132131)
ALPHA = [(_alnum(i), str(i)) for i in range(0, 10000, 1000)]
VARYING = [(_alnum(i * i), str(i)) for i in range(0, 10000, 1000)]
PAIRS = [("id", "INTEGER"), ("id2", "INTEGER")]
N, K, V1, V2 = 1000, 1001, 1001, 1000 * 1000 + 2
BASE_PAIRS = [(i, i + N) for i in range(N)]
COMPOUND = [("id", "VARCHAR(40)"), ("id2", "INTEGER"), ("comment", "VARCHAR(40)")]
COMPOUND_ROWS = [(_u(i), i, str(i)) for i in range(100)]
COMPOUND_ROWS2 = [r if r[1] != 9 else (r[0], 9000, r[2]) for r in COMPOUND_ROWS]
DATA = [("id", "INTEGER"), ("data", "VARCHAR(10)")]
RATINGS = [("id", "INTEGER"), ("userid", "INTEGER"), ("movieid", "INTEGER"), ("rating", "DOUBLE PRECISION")]

CASES.update({
    "diff_tables.TestDates.test_basic": (DATES, ["id"], DATE_SRC, DATE_ROWS, {("-", DATE_SRC[5])}),
    "diff_tables.TestUUIDs.test_string_keys": (TEXT2, ["id"], UUID_ROWS + [(NEW_UUID, "This one is different")], UUID_ROWS,
                                               {("-", (NEW_UUID, "This one is different"))}),
    "diff_tables.TestTableUUID.test_uuid_column_with_nulls": (
        TEXT2, ["id"], [(_u(i), _u(i)) for i in range(10)] + [(NEW_UUID, None)], [(_u(i), _u(i)) for i in range(10)],
        {("-", (NEW_UUID, None))}),
    "diff_tables.TestAlphanumericKeys.test_alphanum_keys": (TEXT2, ["id"], ALPHA + [("aBcDeFgHiz", "This one is different")],
                                                            ALPHA, {("-", ("aBcDeFgHiz", "This one is different"))}),
    "diff_tables.TestVaryingAlphanumericKeys.test_varying_alphanum_keys": (
        TEXT2, ["id"], VARYING + [("aBcDeFgHiJ", "This one is different")], VARYING,
        {("-", ("aBcDeFgHiJ", "This one is different"))}),
    "diff_tables.TestCompoundKeySimple1.test_simple1[id]": (PAIRS, ["id"], BASE_PAIRS + [(K, V1)], BASE_PAIRS + [(K, V2)],
                                                            {("-", (K, V1)), ("+", (K, V2))}),
    "diff_tables.TestCompoundKeySimple1.test_simple1[id,id2]": (PAIRS, ["id", "id2"], BASE_PAIRS + [(K, V1)],
                                                                BASE_PAIRS + [(K, V2)], {("-", (K, V1)), ("+", (K, V2))}),
    "diff_tables.TestCompoundKeySimple2.test_simple2[id,id2]": (PAIRS, ["id", "id2"], BASE_PAIRS + [(K, V1)],
                                                                BASE_PAIRS + [(0, V2)], {("-", (K, V1)), ("+", (0, V2))}),
    "diff_tables.TestCompoundKeyAlphanum.test_compound_key[id]": (
        COMPOUND, ["id"], COMPOUND_ROWS, COMPOUND_ROWS2, {("-", COMPOUND_ROWS[9]), ("+", COMPOUND_ROWS2[9])}),
    "diff_tables.TestCompoundKeyAlphanum.test_compound_key[id,id2]": (
        COMPOUND, ["id", "id2"], COMPOUND_ROWS, COMPOUND_ROWS2, {("-", COMPOUND_ROWS[9]), ("+", COMPOUND_ROWS2[9])}),
    "diff_tables.TestSkipSortResults.test_skip_sort_results": (
        DATA, ["id"], [(1, "a"), (2, "b"), (3, "c"), (4, "x")], [(1, "a"), (2, "b"), (3, "z"), (4, "d")],
        {("-", (3, "c")), ("+", (3, "z")), ("-", (4, "x")), ("+", (4, "d"))}),
    "diff_tables.TestInfoTree.test_info_tree_root": ([("id", "INTEGER")], ["id"], [(i,) for i in range(1000)],
                                                     [(i,) for i in range(2000)], {("+", (i,)) for i in range(1000, 2000)}),
    "diff_tables.TestTableTableEmpty.test_empty_table3": (TEXT2, ["id"], [], UUID_ROWS, {("+", r) for r in UUID_ROWS}),
    "diff_tables.TestDiffSets.test_diff_sets[NULL,'']": (DATA, ["id"], [(1, None)], [(1, "")], {("-", (1, None)), ("+", (1, ""))}),
    "diff_tables.TestDiffSets.test_diff_sets['',NULL]": (DATA, ["id"], [(1, "")], [(1, None)], {("-", (1, "")), ("+", (1, None))}),
    "joindiff.TestUniqueConstraint.test_unique_constraint[id]": (RATINGS, ["id"], [(1, 1, 1, 9.0), (2, 2, 2, 9.0)],
                                                                 [(1, 1, 1, 9.0), (2, 2, 2, 9.0)], set()),
    "joindiff.TestUniqueConstraint.test_unique_constraint[userid]": (RATINGS, ["userid"], [(1, 1, 1, 9.0), (2, 2, 2, 9.0)],
                                                                     [(1, 1, 1, 9.0), (2, 2, 2, 9.0)], set()),
})

MODES = ["join:duck", "across:duck2", "across:pg"]


def _tables(request, mode, name, columns, source, target):
    how, where = mode.split(":")
    duck, other = request.getfixturevalue("duck"), request.getfixturevalue(where)
    first = duck if how == "across" else other
    tag = "".join(ch if ch.isalnum() else "_" for ch in name)[-40:].lower()
    return first, other, load(first, f"o_{tag}_s", columns, source), load(other, f"o_{tag}_t", columns, target)


def _diff(mode, first, other, s, t, keys):
    if mode.startswith("join"):
        return row_diff(first.db, s, t, keys, sample_limit=10_000)
    return row_diff_across(first.db, other.db, s, t, keys, sample_limit=10_000)


def _as_reladiff(result, columns, keys, source, target) -> set:
    """Our result as reladiff's stream: a missing key's source row "-", an extra key's target row
    "+", a changed key both."""
    idx = [[c for c, _ in columns].index(k) for k in keys]
    by_key = lambda rows: {tuple(r[i] for i in idx): r for r in rows}  # noqa: E731
    s, t = by_key(source), by_key(target)
    out = set()
    for e in result.sample:
        k = tuple(e.key)
        if e.status in ("missing", "changed"):
            out.add(("-", s[k]))
        if e.status in ("extra", "changed"):
            out.add(("+", t[k]))
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_reladiff_case(request, case, mode):
    """reladiff (https://github.com/erezsh/reladiff), ``tests/``: the case's inputs and expected
    output, through our diff, agree."""
    columns, keys, source, target, want = CASES[case]
    first, other, s, t = _tables(request, mode, case, columns, source, target)
    r = _diff(mode, first, other, s, t, keys)
    assert _as_reladiff(r, columns, keys, source, target) == want
    assert r.missing + r.extra + r.changed == len({tuple(e.key) for e in r.sample})


@pytest.mark.parametrize("mode", MODES)
def test_reladiff_case_that_differs_by_default(request, mode):
    """reladiff ``test_dup_pks``, ``test_null_pks`` (tests/test_joindiff.py) and
    ``TestDuplicates2`` (tests/test_diff_tables.py): reladiff raises on a duplicated or NULL key,
    or (``duplicate_rows_support``) lists every duplicate row. Ours, by default, and why (module
    docstring): a duplicated key is counted, not paired; a NULL key is compared NULL-safely and
    warned about."""
    cols = [("id", "INTEGER"), ("rating", "INTEGER")]
    first, other, s, t = _tables(request, mode, "dup_pks", cols, [(1, 9), (1, 10)], [(1, 9)])
    r = _diff(mode, first, other, s, t, ["id"])
    assert (r.duplicated_source, r.duplicated_target, r.missing, r.extra) == (1, 0, 0, 0)
    first, other, s, t = _tables(request, mode, "null_pks", cols, [(None, 9)], [(1, 9)])
    r = _diff(mode, first, other, s, t, ["id"])
    assert (r.missing, r.extra, r.changed) == (1, 1, 0) and any("NULL" in w for w in r.warnings)
    data = [("id", "INTEGER"), ("data", "VARCHAR(10)")]
    a = [(12, "ABCDE"), (12, "ABCDE"), (6, "ABCDE")]
    b = [(4, "ABCDEF"), (4, "ABCDE"), (4, "ABCDE"), (6, "ABCDE"), (6, "ABCDE")]
    first, other, s, t = _tables(request, mode, "dups2", data, a, b)
    r = _diff(mode, first, other, s, t, ["id"])
    # key 12 only in the source (twice), 4 only in the target (three rows), 6 duplicated in the target
    assert (r.missing, r.extra, r.duplicated_source, r.duplicated_target) == (1, 1, 1, 2)


@pytest.mark.parametrize("mode", MODES)
def test_reladiff_cases_of_duplicates_and_odd_keys_by_default(request, mode):
    """reladiff ``TestCompoundKeySimple2`` keyed on ``id`` alone (the target then holds key 0
    twice), ``TestDuplicateTables`` (every duplicate row listed), ``TestUUIDs`` and
    ``TestAlphanumericKeys`` with a key of another kind (``unexpected``, ``@@@``: reladiff raises).
    Ours, by default (module docstring): a duplicated key is counted, not paired; an odd key is a
    key like any other."""
    first, other, s, t = _tables(request, mode, "simple2_id", PAIRS, BASE_PAIRS + [(K, V1)], BASE_PAIRS + [(0, V2)])
    r = _diff(mode, first, other, s, t, ["id"])
    assert (r.missing, r.extra, r.changed, r.duplicated_source, r.duplicated_target) == (1, 0, 0, 0, 1)
    a = [(12, "ABCDE"), (12, "ABCDE")]
    b = [(4, "ABCDEF"), (4, "ABCDE"), (4, "ABCDE"), (6, "ABCDE"), (6, "ABCDE"), (6, "ABCDE")]
    first, other, s, t = _tables(request, mode, "dup_tables", DATA, a, b)
    r = _diff(mode, first, other, s, t, ["id"])
    assert (r.missing, r.extra, r.duplicated_source, r.duplicated_target) == (1, 2, 1, 2)
    for name, rows, odd in (("uuid_odd", UUID_ROWS, "unexpected"), ("alnum_odd", ALPHA, "@@@")):
        first, other, s, t = _tables(request, mode, name, TEXT2, rows + [(odd, "<-- this bad value should not break us")], rows)
        r = _diff(mode, first, other, s, t, ["id"])
        assert _as_reladiff(r, TEXT2, ["id"], rows + [(odd, "<-- this bad value should not break us")], rows) == \
            {("-", (odd, "<-- this bad value should not break us"))}


def _view(engine, name: str, select: str) -> str:
    view = engine.table(name)
    engine.db.execute(f"DROP VIEW IF EXISTS {view}")
    engine.db.execute(f"CREATE VIEW {view} AS {select}")
    return view


@pytest.mark.parametrize("mode", MODES)
def test_reladiff_column_mapping_and_update_range_agree_through_views(request, mode):
    """reladiff ``TestDiffTables2.test_diff_column_names`` (``id``/``rating``/``timestamp`` against
    ``id2``/``rating2``/``timestamp2``: no difference) and ``TestDates.test_offset`` (the rows
    updated before ``now - 3 s``: 4 against 3, one difference; after it: 2 against 2, none;
    between a day ago and ``now - 3 s``: 3 against 2, one). With the option our diffs take for
    both — a view on each side — the answers are reladiff's."""
    t_src = [(1, 9.0, dt.datetime(2022, 1, 1)), (2, 9.0, dt.datetime(2021, 1, 1)), (3, 9.0, dt.datetime(2022, 1, 1))]
    first, other, s, t = _tables(request, mode, "colnames", [("id", "INTEGER"), ("rating", "DOUBLE PRECISION"),
                                                              ("timestamp", "TIMESTAMP")], t_src, [])
    t = load(other, "o_colnames_t2", [("id2", "INTEGER"), ("rating2", "DOUBLE PRECISION"), ("timestamp2", "TIMESTAMP")], t_src)
    v = _view(other, "o_colnames_v", f'SELECT id2 AS id, rating2 AS rating, timestamp2 AS "timestamp" FROM {t}')
    r = _diff(mode, first, other, s, v, ["id"])
    assert (r.missing, r.extra, r.changed) == (0, 0, 0)
    sec1, day1 = NOW - dt.timedelta(seconds=3), NOW - dt.timedelta(days=1)
    first, other, s, t = _tables(request, mode, "dates", DATES, DATE_SRC, DATE_ROWS)
    for lo, hi, want in ((None, sec1, 1), (sec1, None, 0), (day1, sec1, 1)):
        cond = " AND ".join([f"\"datetime\" >= '{lo}'"] * (lo is not None) + [f"\"datetime\" < '{hi}'"] * (hi is not None))
        vs = _view(first, "o_dates_vs", f"SELECT * FROM {s} WHERE {cond}")
        vt = _view(other, "o_dates_vt", f"SELECT * FROM {t} WHERE {cond}")
        r = _diff(mode, first, other, vs, vt, ["id"])
        inside = lambda rows: {x for x in rows if (lo is None or x[1] >= lo) and (hi is None or x[1] < hi)}  # noqa: E731
        assert r.missing + r.extra + r.changed == len(inside(DATE_SRC) ^ inside(DATE_ROWS)) == want
