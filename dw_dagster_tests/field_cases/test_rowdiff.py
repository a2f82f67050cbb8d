"""Field cases of the two row diffs: semi-structured and unusual column types, odd column names,
keys of two types. Each kind runs ``row_diff`` (one database: DuckDB, PostgreSQL, MariaDB where
the type exists there) and ``row_diff_across`` (DuckDB ↔ DuckDB, DuckDB ↔ PostgreSQL, DuckDB ↔
MariaDB), and is checked against the answer worked out in Python from the same values
(:func:`~dw_dagster_tests.field_cases.tables.expected`)."""

import datetime as dt
import decimal
import math
import uuid

import pytest

from dw_dagster.checks.rowdiff import row_diff, row_diff_across
from dw_dagster.databases import DatabaseError
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.field_cases.tables import answer, expected, load, same

H = "dw_dagster/checks/rowdiff/rules.py"
KINDS = [
    kind("rd-stream-numeric-digits", "types", "exact decimals through the stream (numeric sent as text): a NUMERIC(25) "
         "differing in its last digit, NUMERIC(38, 12), unconstrained numeric, values between -1 and 1",
         "https://github.com/GoogleCloudPlatform/professional-services-data-validator/issues/900",
         "dw_dagster/checks/rowdiff/stream.py", "test_numeric_digits_survive_the_stream", False),
    kind("rd-json-key-order", "types", "JSON documents equal as data but not as text (key order, white space)",
         "https://github.com/datafold/data-diff/pull/383", "dw_dagster/checks/rowdiff/joindiff.py",
         "test_json_key_order", True),
    kind("rd-pg-unordered-types", "types", "uuid, boolean and bytea columns in PostgreSQL's grouped diff (min(uuid) does not exist)",
         "https://github.com/espocrm/espocrm/issues/3436", "dw_dagster/checks/rowdiff/joindiff.py",
         "test_uuid_boolean_bytea_columns", True),
    kind("rd-uuid-vs-text-key", "types", "a UUID key against its upper-case text copy",
         "https://github.com/datafold/data-diff/pull/813", H, "test_uuid_key_against_upper_case_text", True),
    kind("rd-bool-vs-number", "types", "a BOOLEAN against a 1/0 number column (TINYINT(1), NUMBER(1))",
         "https://github.com/GoogleCloudPlatform/professional-services-data-validator/issues/1279", H,
         "test_boolean_against_number", True),
    kind("rd-epoch-vs-timestamp", "time", "an epoch-seconds integer against a timestamp: refused, naming the column",
         "https://github.com/PostHog/posthog/pull/86228", H, "test_epoch_integer_against_timestamp_is_refused", True),
    kind("rd-decimal-scale", "types", "decimals of different scale (NUMERIC(18,4) against NUMERIC(18,2))",
         "https://github.com/GoogleCloudPlatform/professional-services-data-validator/pull/1678", H,
         "test_decimals_of_different_scale", False),
    kind("rd-nan-inf-null", "types", "NaN, ±infinity and NULL floats against each other",
         "https://github.com/inveniosoftware/dictdiffer/issues/146", H, "test_nan_infinity_null", False),
    kind("rd-long-text", "types", "very long text differing only in its last character",
         "https://github.com/GoogleCloudPlatform/professional-services-data-validator/issues/990", H,
         "test_very_long_text", False),
    kind("rd-odd-column-names", "types", "column names with a space, a quote and reserved words",
         "https://github.com/DataRecce/recce/issues/1311", H, "test_odd_column_names", False),
    kind("rd-interval", "types", "intervals: 1 day against 24 hours", "https://github.com/MaterializeInc/materialize/issues/14163", H,
         "test_intervals", False),
    kind("rd-arrays-structs", "types", "arrays (order matters), structs and maps",
         "https://github.com/datafold/data-diff/issues/445", H, "test_arrays_structs_maps", False),
    kind("rd-null-vs-empty", "types", "NULL against the empty string", "https://github.com/Shopify/ghostferry/pull/137",
         H, "test_null_against_empty_string", False),
    kind("rd-null-vs-empty-nested", "types", "a NULL list or struct against an empty list or an all-NULL struct (DuckDB's hash)",
         "https://github.com/mabel-dev/opteryx/issues/2714", "dw_dagster/checks/rowdiff/joindiff.py",
         "test_null_against_empty_nested_values", True),
    kind("rd-date-vs-timestamp-key", "time", "a DATE key against a TIMESTAMP key at midnight",
         "https://github.com/datafold/data-diff/issues/539", H,
         "test_date_key_against_timestamp_key", True),
    kind("rd-naive-vs-aware-dst", "time", "naive UTC timestamps against TIMESTAMPTZ across a DST fall-back",
         "https://github.com/GoogleCloudPlatform/professional-services-data-validator/pull/930", H,
         "test_naive_utc_against_aware_in_dst_fold", False),
]

JOIN = ["join:duck", "join:pg", "join:maria"]
ACROSS = ["across:duck2", "across:pg", "across:maria"]


def _run(request, mode: str, types: dict[str, tuple[str, str]], columns: list[str], source, target, key="id", **kw):
    """Load the two tables where ``mode`` says (``join:<engine>`` both in one, ``across:<engine>``
    the source in DuckDB, the target there) with per-engine (source type, target type) of each
    column (``types[engine][i]``) and diff them."""
    how, where = mode.split(":")
    other = request.getfixturevalue(where)
    first = request.getfixturevalue("duck") if how == "across" else other
    base = other.name.rstrip("2")
    cols_s = [(c, types[first.name.rstrip("2")][i][0]) for i, c in enumerate([key, *columns])]
    cols_t = [(c, types[base][i][1]) for i, c in enumerate([key, *columns])]
    name = request.node.name.split("[")[0][5:40]
    s = load(first, f"{name}_s", cols_s, source)
    t = load(other, f"{name}_t", cols_t, target)
    if how == "join":
        return row_diff(first.db, s, t, [key], **kw)
    return row_diff_across(first.db, other.db, s, t, [key], **kw)


def _modes(types, join=JOIN, across=ACROSS):
    engines = {"duck": "duckdb", "pg": "postgres", "maria": "mariadb", "duck2": "duckdb"}
    return [m for m in [*join, *across] if engines[m.split(":")[1]] in types]


# -- JSON ---------------------------------------------------------------------------------------

JSON_TYPES = {"duckdb": [("INTEGER", "INTEGER"), ("JSON", "JSON")], "postgres": [("INTEGER", "INTEGER"), ("JSON", "JSONB")],
              "mariadb": [("INTEGER", "INTEGER"), ("JSON", "JSON")]}


@pytest.mark.parametrize("mode", _modes(JSON_TYPES))
def test_json_key_order(request, mode):
    """data-diff PR #383 (https://github.com/datafold/data-diff/pull/383): a JSON column whose
    documents are equal as data but serialized differently (object key order, white space: a
    ``json`` column keeps the text, ``jsonb`` does not) was reported changed. Right answer: equal
    as data (PostgreSQL's ``jsonb`` equality is the oracle: ``1.0`` = ``1``, ``true`` ≠ ``1``), array
    order still matters; a warning says how many rows differed in
    formatting only. MariaDB keeps ``JSON`` as ``LONGTEXT`` with a ``json_valid`` check; the catalog
    reads that check, so there too the column is compared as JSON."""
    source = [(1, '{"a": 1, "b": [1, 2]}'), (2, '{"a": 1}'), (3, "[1, 2]"), (4, None), (5, '{"n": 1.0}'), (6, '{"f": true}')]
    target = [(1, '{"b":[1,2],"a":1}'), (2, '{"a": 2}'), (3, "[2, 1]"), (4, None), (5, '{"n": 1}'), (6, '{"f": 1}')]
    r = _run(request, mode, JSON_TYPES, ["doc"], source, target, key="id")
    pg = request.getfixturevalue("pg").db  # the oracle: PostgreSQL's own jsonb equality

    def eq(a, b):
        if a is None or b is None:
            return a is None and b is None
        lit = lambda x: "'" + x.replace("'", "''") + "'"  # noqa: E731
        return pg.fetch_all(f"SELECT CAST({lit(a)} AS JSONB) = CAST({lit(b)} AS JSONB)")[0][0]

    assert answer(r) == expected(source, target, ["doc"], eq) == (0, 0, 3, {"doc": 3})
    assert sorted(e.key[0] for e in r.sample) == [2, 3, 6]


# -- types PostgreSQL cannot MIN() -----------------------------------------------------------------

UNORDERED = {"duckdb": [("INTEGER", "INTEGER"), ("UUID", "UUID"), ("BOOLEAN", "BOOLEAN"), ("BLOB", "BLOB")],
             "postgres": [("INTEGER", "INTEGER"), ("UUID", "UUID"), ("BOOLEAN", "BOOLEAN"), ("BYTEA", "BYTEA")],
             "mariadb": [("INTEGER", "INTEGER"), ("CHAR(36)", "CHAR(36)"), ("BOOLEAN", "BOOLEAN"), ("BLOB", "BLOB")]}


@pytest.mark.parametrize("mode", _modes(UNORDERED))
def test_uuid_boolean_bytea_columns(request, mode):
    """espocrm #3436 (https://github.com/espocrm/espocrm/issues/3436): ``function min(uuid) does
    not exist`` on PostgreSQL. The grouped diff took ``MIN()`` of each compared column, so a uuid,
    boolean or bytea column crashed the diff on PostgreSQL. Right answer: the rows compared."""
    u1, u2 = uuid.UUID(int=1), uuid.UUID(int=2)
    source = [(1, u1, True, b"\x00\x01"), (2, u2, False, b"ab"), (3, u1, None, b"")]
    target = [(1, u1, True, b"\x00\x01"), (2, u1, True, b"ac"), (4, u1, None, None)]
    r = _run(request, mode, UNORDERED, ["u", "b", "x"], source, target)
    assert answer(r) == expected(source, target, ["u", "b", "x"]) == (1, 1, 1, {"u": 1, "b": 1, "x": 1})


# -- keys of two types -------------------------------------------------------------------------------

UUID_TEXT = {"duckdb": [("UUID", "VARCHAR"), ("INTEGER", "INTEGER")], "postgres": [("UUID", "TEXT"), ("INTEGER", "INTEGER")],
             "mariadb": [("UUID", "VARCHAR(36)"), ("INTEGER", "INTEGER")]}


@pytest.mark.parametrize("mode", ["join:duck", "join:pg", "across:pg", "across:maria", "across:duck2"])
def test_uuid_key_against_upper_case_text(request, mode):
    """data-diff PR #813 (https://github.com/datafold/data-diff/pull/813): UUIDs kept as text in
    one system are upper case (SQL Server's ``uniqueidentifier`` prints so), a native UUID prints
    lower case; matched as text, every key was missing on one side and extra on the other.
    Right answer: a UUID's text is case-insensitive (RFC 9562), so keys pair up by value."""
    ids = [uuid.UUID(int=n * 0xABCDEF0123) for n in (1, 2, 3)]
    source = [(ids[0], 1), (ids[1], 2), (ids[2], 3)]
    target = [(str(ids[0]).upper(), 1), (str(ids[1]).upper(), 5), (str(uuid.UUID(int=9)).upper(), 3)]
    r = _run(request, mode, UUID_TEXT, ["v"], source, target, key="k")
    assert answer(r) == expected(source, target, ["v"], key=lambda k: uuid.UUID(str(k))) == (1, 1, 1, {"v": 1})


BOOL_NUM = {"duckdb": [("INTEGER", "INTEGER"), ("BOOLEAN", "INTEGER")], "postgres": [("INTEGER", "INTEGER"), ("BOOLEAN", "SMALLINT")],
            "mariadb": [("INTEGER", "INTEGER"), ("BOOLEAN", "TINYINT(1)")]}


@pytest.mark.parametrize("mode", ["join:duck", "join:pg", "across:pg", "across:maria"])
def test_boolean_against_number(request, mode):
    """data-validation-tool #1279
    (https://github.com/GoogleCloudPlatform/professional-services-data-validator/issues/1279):
    Oracle and MySQL keep booleans as ``NUMBER(1)`` / ``TINYINT(1)``; comparing them with a real
    BOOLEAN crashed (PostgreSQL: no ``boolean = integer`` operator). Right answer: the boolean
    compared as 1 / 0."""
    source = [(1, True), (2, False), (3, True), (4, None)]
    target = [(1, 1), (2, 0), (3, 0), (4, None)]
    r = _run(request, mode, BOOL_NUM, ["flag"], source, target)
    assert answer(r) == expected(source, target, ["flag"], eq=lambda a, b: same(None if a is None else int(a), b)) \
        == (0, 0, 1, {"flag": 1})


EPOCH = {"duckdb": [("INTEGER", "INTEGER"), ("BIGINT", "TIMESTAMP")], "postgres": [("INTEGER", "INTEGER"), ("BIGINT", "TIMESTAMP")],
         "mariadb": [("INTEGER", "INTEGER"), ("BIGINT", "DATETIME")]}


@pytest.mark.parametrize("mode", ["join:duck", "join:pg", "across:pg", "across:maria"])
def test_epoch_integer_against_timestamp_is_refused(request, mode):
    """PostHog #86228 (https://github.com/PostHog/posthog/pull/86228): epoch integers read as
    timestamps without a unit land in the year 56000 (milliseconds) or crash. The diff crashed
    with DuckDB's ``Unimplemented type for cast (BIGINT -> TIMESTAMP)``. Right answer: a refusal
    naming the column and both types (the unit is the user's to say, in a view)."""
    when = dt.datetime(2023, 11, 14, 22, 13, 20)
    source = [(1, int(when.replace(tzinfo=dt.timezone.utc).timestamp()))]
    with pytest.raises(DatabaseError, match=r"column at cannot be compared: .*number \(BIGINT\) against a time"):
        _run(request, mode, EPOCH, ["at"], source, [(1, when)])


DECIMALS = {"duckdb": [("INTEGER", "INTEGER"), ("DECIMAL(18,4)", "DECIMAL(18,2)")],
            "postgres": [("INTEGER", "INTEGER"), ("NUMERIC(18,4)", "NUMERIC(18,2)")],
            "mariadb": [("INTEGER", "INTEGER"), ("DECIMAL(18,4)", "DECIMAL(18,2)")]}


@pytest.mark.parametrize("mode", _modes(DECIMALS))
def test_decimals_of_different_scale(request, mode):
    """data-validation-tool PR #1678
    (https://github.com/GoogleCloudPlatform/professional-services-data-validator/pull/1678:
    decimals hashed with insignificant trailing zeros on one engine only): values printed at different scales (``1.5000`` / ``1.50``) must match, and a difference in
    the last kept digit must not be rounded away. Right answer: decimals compared exactly as
    numbers (``decimal.Decimal``)."""
    D = decimal.Decimal
    source = [(1, D("1.5000")), (2, D("2.0100")), (3, D("-0.0000")), (4, D("99999999999999.9900"))]
    target = [(1, D("1.50")), (2, D("2.02")), (3, D("0.00")), (4, D("99999999999999.99"))]
    r = _run(request, mode, DECIMALS, ["amount"], source, target)
    assert answer(r) == expected(source, target, ["amount"]) == (0, 0, 1, {"amount": 1})


FLOATS = {"duckdb": [("INTEGER", "INTEGER"), ("DOUBLE", "DOUBLE")],
          "postgres": [("INTEGER", "INTEGER"), ("DOUBLE PRECISION", "DOUBLE PRECISION")]}


@pytest.mark.parametrize("mode", _modes(FLOATS))
def test_nan_infinity_null(request, mode):
    """dictdiffer #146 (https://github.com/inveniosoftware/dictdiffer/issues/146: a float
    comparator that missed ``inf``) and the engines' float rules: NaN equals NaN in DuckDB and PostgreSQL (unlike IEEE), an infinity is not within any
    tolerance of a large finite number, and NULL is not NaN. Right answer (Python, NaN = NaN):
    keys 2, 3, 5 and 6 changed."""
    inf, nan = float("inf"), float("nan")
    source = [(1, nan), (2, nan), (3, inf), (4, -inf), (5, 1e300), (6, None), (7, 0.1 + 0.2)]
    target = [(1, nan), (2, None), (3, -inf), (4, -inf), (5, inf), (6, nan), (7, 0.3)]
    r = _run(request, mode, FLOATS, ["x"], source, target)
    close = lambda a, b: same(a, b) or (None not in (a, b) and math.isfinite(a - b) and abs(a - b) <= 1e-9 * max(abs(a), abs(b)))  # noqa: E731
    assert answer(r) == expected(source, target, ["x"], close) == (0, 0, 4, {"x": 4})


LONG = {"duckdb": [("INTEGER", "INTEGER"), ("VARCHAR", "VARCHAR")], "postgres": [("INTEGER", "INTEGER"), ("TEXT", "TEXT")],
        "mariadb": [("INTEGER", "INTEGER"), ("LONGTEXT", "LONGTEXT")]}


@pytest.mark.parametrize("mode", _modes(LONG))
def test_very_long_text(request, mode):
    """data-validation-tool #990
    (https://github.com/GoogleCloudPlatform/professional-services-data-validator/issues/990):
    long text cropped to 30 characters before hashing on SQL Server, so a difference past the
    cut was hidden. Right answer: 200,000-character values differing only in the last character differ."""
    body = "ü" * 199_999
    source = [(1, body + "a"), (2, body + "b")]
    target = [(1, body + "a"), (2, body + "c")]
    r = _run(request, mode, LONG, ["note"], source, target)
    assert answer(r) == expected(source, target, ["note"]) == (0, 0, 1, {"note": 1})


NAMES = {e: [("INTEGER", "INTEGER"), ("INTEGER", "INTEGER"), (t, t), (t, t)]
         for e, t in (("duckdb", "VARCHAR"), ("postgres", "TEXT"), ("mariadb", "VARCHAR(20)"))}


@pytest.mark.parametrize("mode", _modes(NAMES))
def test_odd_column_names(request, mode):
    """recce #1311 (https://github.com/DataRecce/recce/issues/1311): a value diff put column
    names bare into SQL; names that need quoting (a space, a double quote, a reserved word like ``select``/``order``) broke the
    generated SQL. Right answer: the diff quotes every name, per engine."""
    source = [(1, 10, "a", "x"), (2, 20, "b", "y")]
    target = [(1, 10, "a", "x"), (2, 21, "b", "z")]
    r = _run(request, mode, NAMES, ["group by", 'we"ird', "select"], source, target, key="order id")
    assert answer(r) == expected(source, target, ["group by", 'we"ird', "select"]) == (0, 0, 1, {"group by": 1, "select": 1})


INTERVALS = {"duckdb": [("INTEGER", "INTEGER"), ("INTERVAL", "INTERVAL")],
             "postgres": [("INTEGER", "INTEGER"), ("INTERVAL", "INTERVAL")]}


@pytest.mark.parametrize("mode", _modes(INTERVALS))
def test_intervals(request, mode):
    """Materialize #14163 (https://github.com/MaterializeInc/materialize/issues/14163: an engine
    that compared ``26 hours`` below ``1 day``) and PostgreSQL's interval comparison: ``INTERVAL '1 day'`` equals ``INTERVAL '24 hours'`` on both engines although they
    print differently, so a text-hash mismatch must not become a reported change. Right answer
    (Python ``timedelta``): only key 2 changed."""
    source = [(1, dt.timedelta(days=1)), (2, dt.timedelta(hours=2)), (3, dt.timedelta(0))]
    target = [(1, dt.timedelta(hours=24)), (2, dt.timedelta(hours=3)), (3, dt.timedelta(0))]
    r = _run(request, mode, INTERVALS, ["span"], [(k, _iv(v)) for k, v in source], [(k, _iv(v, True)) for k, v in target])
    assert answer(r) == expected(source, target, ["span"]) == (0, 0, 1, {"span": 1})


def _iv(v: dt.timedelta, hours: bool = False):
    from dw_dagster_tests.field_cases.tables import Raw

    if hours:
        return Raw(f"INTERVAL '{int(v.total_seconds() // 3600)} hours'")
    return Raw(f"INTERVAL '{v.days} days'") if v.days else Raw(f"INTERVAL '{int(v.total_seconds() // 3600)} hours'")


NESTED = {"duckdb": [("INTEGER", "INTEGER"), ("INTEGER[]", "INTEGER[]")],
          "postgres": [("INTEGER", "INTEGER"), ("INTEGER[]", "INTEGER[]")]}


@pytest.mark.parametrize("mode", _modes(NESTED))
def test_arrays_structs_maps(request, mode):
    """data-diff #445 (https://github.com/datafold/data-diff/issues/445): array and struct columns
    broke the generated SQL (BigQuery cannot group by them). Right answer: arrays equal element by element in
    order (``[1, 2]`` ≠ ``[2, 1]``); on DuckDB structs and maps compared field by field too."""
    source = [(1, [1, 2]), (2, [1, 2]), (3, []), (4, None)]
    target = [(1, [1, 2]), (2, [2, 1]), (3, []), (4, [])]
    r = _run(request, mode, NESTED, ["xs"], source, target)
    assert answer(r) == expected(source, target, ["xs"]) == (0, 0, 2, {"xs": 2})
    if mode.endswith(("duck", "duck2")):
        from dw_dagster_tests.field_cases.tables import Raw

        other = request.getfixturevalue(mode.split(":")[1])
        duck = request.getfixturevalue("duck")
        cols = [("id", "INTEGER"), ("st", "STRUCT(a INTEGER, b VARCHAR)"), ("m", "MAP(VARCHAR, INTEGER)")]
        s = load(duck, "nested_s", cols, [(1, Raw("{'a': 1, 'b': 'x'}"), Raw("MAP {'k': 1}")),
                                          (2, Raw("{'a': 2, 'b': 'y'}"), Raw("MAP {'k': 1}"))])
        t = load(other, "nested_t", cols, [(1, Raw("{'a': 1, 'b': 'x'}"), Raw("MAP {'k': 2}")),
                                           (2, Raw("{'a': 2, 'b': 'z'}"), Raw("MAP {'k': 1}"))])
        r = row_diff(duck.db, s, t, ["id"]) if other is duck else row_diff_across(duck.db, other.db, s, t, ["id"])
        assert answer(r) == (0, 0, 2, {"st": 1, "m": 1})


EMPTY = {"duckdb": [("INTEGER", "INTEGER"), ("VARCHAR", "VARCHAR")], "postgres": [("INTEGER", "INTEGER"), ("TEXT", "TEXT")],
         "mariadb": [("INTEGER", "INTEGER"), ("VARCHAR(10)", "VARCHAR(10)")]}


@pytest.mark.parametrize("mode", _modes(EMPTY))
def test_null_against_empty_string(request, mode):
    """ghostferry PR #137 (https://github.com/Shopify/ghostferry/pull/137): a row checksum that
    coalesced NULL to a marker string could not tell ``NULL`` from that string; a concatenation
    cannot tell ``NULL`` from ``''`` (nor ``'a','bc'`` from ``'ab','c'``).
    Right answer: NULL ≠ '' and the split matters."""
    source = [(1, None, "a"), (2, "", "bc"), (3, "x", None)]
    target = [(1, "", "a"), (2, "", "bc"), (3, "x", "")]
    types = {e: [*v, v[1]] for e, v in EMPTY.items()}
    r = _run(request, mode, types, ["v", "w"], source, target)
    assert answer(r) == expected(source, target, ["v", "w"]) == (0, 0, 2, {"v": 1, "w": 1})


DATE_TS = {"duckdb": [("DATE", "TIMESTAMP"), ("INTEGER", "INTEGER")], "postgres": [("DATE", "TIMESTAMP"), ("INTEGER", "INTEGER")],
           "mariadb": [("DATE", "DATETIME"), ("INTEGER", "INTEGER")]}


@pytest.mark.parametrize("mode", ["join:duck", "join:pg", "across:pg", "across:maria"])
def test_date_key_against_timestamp_key(request, mode):
    """data-diff #539 (https://github.com/datafold/data-diff/issues/539: keys of other types than
    text and integers, timestamps among them, refused): a ``DATE`` key in one system is a ``TIMESTAMP`` (midnight) in the other (Oracle's
    DATE, a loader's cast). Right answer: ``2024-01-01`` pairs with ``2024-01-01 00:00:00``; a
    timestamp off midnight has no partner."""
    source = [(dt.date(2024, 1, 1), 1), (dt.date(2024, 1, 2), 2)]
    target = [(dt.datetime(2024, 1, 1), 1), (dt.datetime(2024, 1, 2, 10), 2)]
    r = _run(request, mode, DATE_TS, ["v"], source, target, key="day")
    as_ts = lambda k: k if isinstance(k, dt.datetime) else dt.datetime.combine(k, dt.time())  # noqa: E731
    assert answer(r) == expected(source, target, ["v"], key=as_ts) == (1, 1, 0, {})


def test_naive_utc_against_aware_in_dst_fold(request):
    """data-validation-tool PR #930
    (https://github.com/GoogleCloudPlatform/professional-services-data-validator/pull/930):
    time-zoned timestamps validated against naive ones. Here the naive side holds UTC wall clocks
    and the aware side was written in New York during the fall-back hour, so two instants share
    the local clock 01:30. Right answer: both pair with their UTC copies, whatever the sessions'
    time zone (PostgreSQL's session here: America/New_York)."""
    import urllib.parse

    from dw_dagster.databases import SqlAlchemyDatabase
    from dw_dagster_tests.conftest import POSTGRES_URL

    duck, pg = request.getfixturevalue("duck"), request.getfixturevalue("pg")
    ny = SqlAlchemyDatabase(f"{POSTGRES_URL}?options={urllib.parse.quote('-c TimeZone=America/New_York')}")
    try:
        utc = dt.timezone.utc
        instants = [dt.datetime(2024, 11, 3, 5, 30, tzinfo=utc), dt.datetime(2024, 11, 3, 6, 30, tzinfo=utc)]
        s = load(duck, "fold_s", [("at", "TIMESTAMP"), ("v", "INTEGER")], [(i.replace(tzinfo=None), n) for n, i in enumerate(instants)])
        t = load(pg, "fold_t", [("at", "TIMESTAMPTZ"), ("v", "INTEGER")],
                 [("2024-11-03 01:30:00-04", 0), ("2024-11-03 01:30:00-05", 1)])
        r = row_diff_across(duck.db, ny, s, t, ["at"])
        source = [(i, n) for n, i in enumerate(instants)]
        target = [(dt.datetime.fromisoformat(x), n) for x, n in (("2024-11-03 01:30:00-04:00", 0), ("2024-11-03 01:30:00-05:00", 1))]
        assert answer(r) == expected(source, target, ["v"]) == (0, 0, 0, {})
    finally:
        ny.dispose()


@pytest.mark.parametrize("mode", ["join:duck", "across:duck2"])
def test_null_against_empty_nested_values(request, mode):
    """opteryx #2714 (https://github.com/mabel-dev/opteryx/issues/2714: hashing list columns
    mishandled NULLs). DuckDB's ``hash()`` gives a NULL list and ``[]`` the same value, and a
    NULL struct and ``{'a': NULL}`` too; the single-pass diff and the native cross-file diff
    trusted equal hashes, so these changes were silently missed. Right answer: each differs."""
    from dw_dagster_tests.field_cases.tables import Raw

    duck, other = request.getfixturevalue("duck"), request.getfixturevalue(mode.split(":")[1])
    cols = [("id", "INTEGER"), ("xs", "INTEGER[]"), ("st", "STRUCT(a INTEGER)")]
    s = load(duck, "nested_null_s", cols, [(1, None, Raw("NULL")), (2, [], Raw("{'a': NULL}")), (3, [1], Raw("{'a': 1}"))])
    t = load(other, "nested_null_t", cols, [(1, [], Raw("{'a': NULL}")), (2, None, Raw("NULL")), (3, [1], Raw("{'a': 1}"))])
    r = row_diff(duck.db, s, t, ["id"]) if other is duck else row_diff_across(duck.db, other.db, s, t, ["id"])
    source = [(1, None, None), (2, [], {"a": None}), (3, [1], {"a": 1})]
    target = [(1, [], {"a": None}), (2, None, None), (3, [1], {"a": 1})]
    assert answer(r) == expected(source, target, ["xs", "st"]) == (0, 0, 2, {"xs": 2, "st": 2})


_WIDE = [(1, "1234567890123456789012345", "0.71", "12345678901234567890123456.123456789012", "1.5"),
         (2, "1234567890123456789012340", "-0.71", "-0.000000000001", "0.000000000000000000000000001"),
         (3, "-9999999999999999999999999", "-0.00", "99999999999999999999999999.999999999999", "-7")]


def test_numeric_digits_survive_the_stream(tmp_path, postgres, pg_schema):
    """Exact decimals through the stream, which has PostgreSQL send each numeric as its text: digits beyond a
    double (DVT #900: a NUMERIC(25) differing in its last digit passed as equal), values between -1 and 1
    (DVT #1201: Oracle and PostgreSQL spell 0.71 differently), the widest DuckDB decimal, unconstrained
    numeric, and a negative zero, which PostgreSQL's numeric does not keep (data-diff #883).

    https://github.com/GoogleCloudPlatform/professional-services-data-validator/issues/900
    https://github.com/GoogleCloudPlatform/professional-services-data-validator/issues/1201
    https://github.com/datafold/data-diff/issues/883
    """
    from dw_dagster.databases import DuckDBDatabase

    cols = "(id INT, big NUMERIC(25, 0), small NUMERIC(4, 2), widest NUMERIC(38, 12), free NUMERIC)"
    rows = ", ".join(f"({i}, {b}, {s_}, {w}, {f})" for i, b, s_, w, f in _WIDE)
    postgres.execute(f"CREATE TABLE {pg_schema}.w {cols}; INSERT INTO {pg_schema}.w VALUES {rows}")
    duck = DuckDBDatabase(tmp_path / "w.duckdb")
    duck.execute("CREATE TABLE w (id INT, big DECIMAL(25, 0), small DECIMAL(4, 2), widest DECIMAL(38, 12), "
                 f"free DECIMAL(38, 27)); INSERT INTO w VALUES {rows}")
    same = row_diff_across(postgres, duck, f"{pg_schema}.w", "w", ["id"], transfer="stream")
    assert same.transfer == "stream" and same.identical, same.sample
    # one unit in the last digit of each wide column, on a different row each
    duck.execute("UPDATE w SET big = big + 1 WHERE id = 1; UPDATE w SET widest = widest - 0.000000000001 WHERE id = 3; "
                 "UPDATE w SET free = free + 0.000000000000000000000000001 WHERE id = 2")
    s = row_diff_across(postgres, duck, f"{pg_schema}.w", "w", ["id"], transfer="stream")
    b = row_diff_across(postgres, duck, f"{pg_schema}.w", "w", ["id"], transfer="bisect")
    assert (s.missing, s.extra, s.changed, s.changed_columns) == (b.missing, b.extra, b.changed, b.changed_columns)
    assert {int(e.key[0]): e.columns for e in s.sample} == {1: ["big"], 2: ["free"], 3: ["widest"]}
