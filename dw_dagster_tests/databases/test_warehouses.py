"""The same cases on DuckDB, Snowflake (fakesnow) and BigQuery (bqemulator), over real sockets.

The emulators run on loopback, started and stopped by the session fixtures in ``conftest.py``;
``dw_dagster_tests/emulators.py`` lists where they differ from the real services. Where a case
depends on such a difference, the comment at the case says how it avoids it.
"""

import datetime as dt
import importlib
import re
import sys
import time
from decimal import Decimal

import pyarrow as pa
import pytest
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.checks.reconcile import reconcile
from dw_dagster.databases import Database, DatabaseError, DuckDBDatabase, database_from_url
from dw_dagster_tests.harness.emulators import BQEMULATOR_PROJECT, FAKESNOW_DATABASE, bigquery_client, make_table

SALES_COLUMNS = {"k": "INTEGER", "amt": "DECIMAL(18,2)", "name": "VARCHAR", "ts": "TIMESTAMP"}
# fakesnow reads a NULL TIMESTAMP_NTZ back as 1970-01-01, so no row has a NULL ts.
# bqemulator stores DECIMAL(18,2) so that at most 15 integer digits fit (BigQuery: 16), so the
# largest value has 15; its 17 significant digits are still more than a float64 holds.
SALES_ROWS = [
    (1, Decimal("123456789012345.67"), "alpha", dt.datetime(2024, 3, 1, 9, 30)),
    (2, Decimal("0.01"), "beta", dt.datetime(2024, 3, 1, 23, 59, 59)),
    (3, Decimal("-10.50"), "gamma", dt.datetime(2024, 3, 2, 0, 0)),
    (4, None, "delta", dt.datetime(2024, 3, 2, 12, 0)),
]
# Summed in float64 this is 123456789012335.19: only an exact Decimal gives the cents.
SALES_SUM = Decimal("123456789012335.18")

NOT_FOUND = re.compile(r"not found|does not exist", re.IGNORECASE)


def _q(db: Database, template: str, **values: object) -> str:
    return sql.render(template, db.dialect, **values)


def test_every_warehouse_is_a_database(warehouse):
    assert isinstance(warehouse.db, Database)
    assert warehouse.db.dialect == warehouse.kind


def test_types_round_trip_and_sums_are_exact_decimals(warehouse):
    db = warehouse.db
    t = warehouse.make_table("sales", SALES_COLUMNS, SALES_ROWS)

    (n, total, non_null), = db.fetch_all(_q(db, "SELECT COUNT(*), SUM(amt), COUNT(amt) FROM :t", t=sql.table(t)))
    assert (n, non_null) == (4, 3)
    assert isinstance(total, Decimal) and total == SALES_SUM

    rows = db.fetch_all(_q(db, "SELECT k, amt, name, ts FROM :t ORDER BY k", t=sql.table(t)))
    assert [tuple(r) for r in rows] == SALES_ROWS
    assert all(isinstance(r[1], Decimal) for r in rows if r[1] is not None)
    assert all(isinstance(r[0], int) and not isinstance(r[0], bool) for r in rows)


def test_date_boolean_double_columns(warehouse):
    db = warehouse.db
    t = warehouse.make_table(
        "misc",
        {"d": "DATE", "flag": "BOOLEAN", "x": "DOUBLE", "big": "BIGINT"},
        [(dt.date(2024, 2, 29), True, 0.25, 9007199254740993), (dt.date(1999, 12, 31), False, -1.5, None)],
    )
    rows = db.fetch_all(_q(db, "SELECT d, flag, x, big FROM :t ORDER BY d", t=sql.table(t)))
    assert [tuple(r) for r in rows] == [
        (dt.date(1999, 12, 31), False, -1.5, None),
        (dt.date(2024, 2, 29), True, 0.25, 9007199254740993),  # > 2**53: not through a float
    ]


def test_fetch_batches_streams_every_row_in_bounded_batches(warehouse):
    db = warehouse.db
    rows = [(k, Decimal(k) / 100, f"n{k}", dt.datetime(2024, 1, 1) + dt.timedelta(minutes=k)) for k in range(1, 251)]
    t = warehouse.make_table("stream", SALES_COLUMNS, rows)

    batches = list(db.fetch_batches(_q(db, "SELECT k, amt FROM :t", t=sql.table(t)), batch_rows=100))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert len(batches) >= 3 and all(b.num_rows <= 100 for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.num_rows == 250
    ks = table.column(0).to_pylist()
    assert sorted(ks) == list(range(1, 251))
    assert sum(table.column(1).to_pylist()) == sum(r[1] for r in rows)  # decimals all the way


def test_hostile_table_name_is_quoted_and_never_runs_a_second_statement(warehouse):
    db = warehouse.db
    victim = warehouse.make_table("victim", {"k": "INTEGER"}, [(1,), (2,)])

    def count_from(*parts: str) -> str:
        return exp.select(exp.Count(this=exp.Star())).from_(sql.table(list(parts))).sql(dialect=db.dialect)

    # A double quote, a single quote and semicolons: each could end a quoted identifier or a string
    # in one of the three dialects (backticks and backslashes are refused outright, see
    # test_identifiers_bigquery_cannot_quote_safely_are_refused). Quoted, the whole string is one
    # table name, and no such table exists.
    # DuckDB, fakesnow and bqemulator say "... does not exist"; Snowflake says "Object ... does
    # not exist or not authorized", BigQuery "404 Not found: Table ...": the pattern takes both.
    with pytest.raises(DatabaseError) as err:
        db.fetch_all(count_from(warehouse.schema, 'x"; DROP TABLE victim; -- \'; DROP TABLE victim; --'))
    assert NOT_FOUND.search(str(err.value)), str(err.value)
    assert db.name in str(err.value)

    # The same with the victim's qualified name, so that a statement that escaped its quotes
    # would find the table (DuckDB and BigQuery run several statements in one call). Passed as
    # parts, so the dots stay inside the quoted name; BigQuery reads dots inside a quoted path as
    # separators (`a.b` is a.b), so there the name is an invalid path rather than "not found".
    with pytest.raises(DatabaseError):
        db.fetch_all(count_from(warehouse.schema, f'x"; DROP TABLE {victim}; -- \'; DROP TABLE {victim}; --'))
    assert db.fetch_all(_q(db, "SELECT COUNT(*) FROM :t", t=sql.table(victim))) == [(2,)]


def _bq_lex_outside_quotes(text: str) -> str:
    """What of ``text`` lies outside backtick-quoted identifiers, lexed the way BigQuery does.

    BigQuery's quoted identifiers "have the same escape sequences as string literals" (GoogleSQL
    lexical structure): a backslash escapes the next character, and a doubled backtick is not an
    escape but the end of one identifier and the start of another.
    """
    out, i, n = [], 0, len(text)
    while i < n:
        if text[i] == "`":
            i += 1
            while i < n and text[i] != "`":
                i += 2 if text[i] == "\\" else 1
            i += 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@pytest.mark.parametrize("name", ["a\\` ; DROP TABLE ds.victim; --", "a`b", "tab\\", "x\ny"],
                         ids=["backslash_backtick", "backtick", "backslash", "newline"])
def test_identifiers_bigquery_cannot_quote_safely_are_refused(name):
    # sqlglot doubles a backtick inside a BigQuery identifier and leaves backslashes as they are;
    # BigQuery reads backslash escapes in quoted identifiers, so such a name could close the
    # identifier early. dw_dagster.databases.sql refuses these characters for every dialect.
    with pytest.raises(sql.UnsafeIdentifierError):
        sql.table(["ds", name])
    ok = exp.select("*").from_(sql.table(["ds", "a'; DROP TABLE ds.victim; --"])).sql(dialect="bigquery")
    assert ";" not in _bq_lex_outside_quotes(ok), ok


def test_reconcile_duckdb_source_against_each_warehouse(warehouse, tmp_path):
    columns = {"k": "INTEGER", "day": "DATE", "region": "VARCHAR", "amt": "DECIMAL(18,2)"}
    d1, d2 = dt.date(2024, 3, 1), dt.date(2024, 3, 2)
    src_rows = [
        (1, d1, "EU", Decimal("123456789012345.67")),
        (2, d1, "EU", Decimal("10.00")),
        (3, d1, "US", Decimal("5.25")),
        (4, d2, "EU", Decimal("7.10")),
        (5, d2, "US", Decimal("2.00")),
        (6, d2, "US", Decimal("3.00")),
    ]
    tgt_rows = [
        (1, d1, "EU", Decimal("123456789012345.68")),  # a cent off: within a float's 1e-9 tolerance
        (2, d1, "EU", Decimal("10.00")),
        (3, d1, "US", Decimal("5.25")),
        (4, d2, "EU", Decimal("7.10")),
        (5, d2, "US", Decimal("2.00")),  # row 6 is missing
    ]
    source = DuckDBDatabase(tmp_path / "source.duckdb")
    source.execute("CREATE SCHEMA pos")
    make_table(source, "pos.sales", columns, src_rows)
    target_table = warehouse.make_table("sales", columns, tgt_rows)

    res = reconcile(source, warehouse.db, "pos.sales", target_table, ["day", "region"], ["amt"])

    got = {
        (s.slice["day"], s.slice["region"]): (
            s.source_rows, s.target_rows, s.gap_rows, s.gap_pct,
            Decimal(s.source_sums["amt"]), Decimal(s.target_sums["amt"]), Decimal(s.sum_gaps["amt"]), s.passed,
        )
        for s in res.slices
    }
    assert got == {
        ("2024-03-01", "EU"): (2, 2, 0, 0.0, Decimal("123456789012355.67"), Decimal("123456789012355.68"), Decimal("-0.01"), False),
        ("2024-03-01", "US"): (1, 1, 0, 0.0, Decimal("5.25"), Decimal("5.25"), Decimal("0"), True),
        ("2024-03-02", "EU"): (1, 1, 0, 0.0, Decimal("7.10"), Decimal("7.10"), Decimal("0"), True),
        ("2024-03-02", "US"): (2, 1, 1, 50.0, Decimal("5.00"), Decimal("2.00"), Decimal("3.00"), False),
    }
    assert res.gap_rows == 1 and not res.passed
    assert res.target_database == warehouse.db.name


def test_database_from_url_reaches_both_emulators(fakesnow_server, bqemulator_server):
    sf_url = (
        f"snowflake://{fakesnow_server['user']}:s%40cret%3Apw@{fakesnow_server['account']}/{FAKESNOW_DATABASE}"
        f"?host=127.0.0.1&port={fakesnow_server['port']}&protocol=http&network_timeout=20"
    )
    sf = database_from_url(sf_url)
    assert (sf.dialect, sf.name) == ("snowflake", f"snowflake:{fakesnow_server['account']}/{FAKESNOW_DATABASE}")
    assert sf.fetch_all("SELECT 1 + 1") == [(2,)]
    with pytest.raises(DatabaseError) as err:
        sf.fetch_all("SELECT * FROM no_such_schema.no_such_table")
    assert "s@cret" not in str(err.value) and "cret" not in str(err.value)

    bq = database_from_url(f"bigquery://{BQEMULATOR_PROJECT}?endpoint={bqemulator_server}")
    assert (bq.dialect, bq.name) == ("bigquery", f"bigquery:{BQEMULATOR_PROJECT}")
    assert bq.fetch_all("SELECT 1 + 1") == [(2,)]


def test_urls_are_checked_before_anything_connects():
    with pytest.raises(ValueError, match="unknown snowflake:// URL parameter 'passcode'"):
        database_from_url("snowflake://u:p@acct/db?passcode=123")
    with pytest.raises(ValueError, match="needs an account"):
        database_from_url("snowflake://u:p@/db")
    with pytest.raises(ValueError, match="unknown bigquery:// URL parameter 'key'"):
        database_from_url("bigquery://proj/ds?key=abc")


def test_bigquery_database_accepts_a_dagster_resource_without_connecting():
    # BigQueryResource builds its client from Application Default Credentials, which would reach
    # Google's metadata server; the emulator tests use a Client instead, and this only checks
    # that the adapter takes the resource and connects lazily.
    from dagster_gcp import BigQueryResource

    from dw_dagster.databases.bigquery import BigQueryDatabase

    db = BigQueryDatabase(BigQueryResource(project="acme-dw"), dataset="pos")
    assert (db.dialect, db.name) == ("bigquery", "bigquery:acme-dw/pos")
    assert isinstance(db, Database)


@pytest.mark.parametrize(
    ("blocked", "build", "extra"),
    [
        (
            ["snowflake.connector", "dagster_snowflake"],
            lambda w: w.SnowflakeDatabase(account="acct", user="u", password="p"),
            "snowflake",
        ),
        (
            ["google.cloud.bigquery", "dagster_gcp"],
            lambda w: w.BigQueryDatabase.from_url("bigquery://proj/ds?endpoint=http://127.0.0.1:9"),
            "bigquery",
        ),
        (
            ["google.cloud.bigquery", "dagster_gcp"],
            lambda w: w.BigQueryDatabase(object(), dataset="ds"),
            "bigquery",
        ),
    ],
    ids=["snowflake", "bigquery-url", "bigquery-client"],
)
def test_missing_optional_package_names_the_extra(monkeypatch, blocked, build, extra):
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    module = f"dw_dagster.databases.{extra}"
    monkeypatch.delitem(sys.modules, module, raising=False)
    engine = importlib.import_module(module)  # importable without the extras
    with pytest.raises(ImportError, match=re.escape(f"pip install 'dw-dagster[{extra}]'")):
        build(engine)


class _SlowJobs:
    """A loopback proxy in front of the BigQuery emulator that answers each ``jobs.insert`` after ``delay`` s:
    a slow endpoint (a loaded one, or an emulator running a MERGE inside the request), not a failing one."""

    def __init__(self, upstream: str, delay: float) -> None:
        import http.server
        import threading

        import httpx

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.command == "POST" and self.path.split("?")[0].endswith("/jobs"):
                    outer.slowed += 1
                    time.sleep(delay)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                r = httpx.request(self.command, upstream + self.path, content=body, headers=headers, timeout=60)
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = do_DELETE = do_PATCH = _forward

            def log_message(self, *a):
                pass

        self.slowed = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_slow_bigquery_endpoint_is_waited_for_not_failed(bqemulator_server):
    """The request's timeout is its own setting, not the retry deadline: with a 10 s deadline (the tests') a
    jobs.insert answered after 12 s failed every BigQuery e2e fixture of a loaded full run (ReadTimeout)."""
    from dw_dagster.databases.bigquery import BigQueryDatabase

    slow = _SlowJobs(bqemulator_server, delay=2.0)
    try:
        client = bigquery_client(slow.url)
        patient = BigQueryDatabase(client, retry_deadline_s=1)
        assert patient.fetch_all("SELECT 40 + 2") == [(42,)] and slow.slowed >= 1
        hasty = BigQueryDatabase(client, retry_deadline_s=1, request_timeout_s=0.5)
        with pytest.raises(DatabaseError, match="Timeout"):
            hasty.fetch_all("SELECT 1")
    finally:
        slow.close()
    with pytest.raises(ValueError, match="request_timeout_s must be a number of seconds above 0"):
        BigQueryDatabase(bigquery_client(bqemulator_server), request_timeout_s=0)
