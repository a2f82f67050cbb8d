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
"""

import datetime as dt

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
