"""The ``informix`` sqlglot dialect on the SQL dw_dagster's checks and diffs generate.

No Informix server runs here: every statement is parsed by a grammar written from IBM's syntax
diagrams (*Informix Guide to SQL: Syntax*, 12.10/14.10), ``informix_grammar.lark`` next to this
file, built twice — with ``DELIMIDENT`` (double-quoted names) and without (no quoted names at
all). The grammar is tested to refuse what Informix does not have, so a pass means something.
"""

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest

lark = pytest.importorskip("lark")

from dw_dagster.checks.reconcile import comparison_scope, ranges_condition, slice_aggregate_sql  # noqa: E402
from dw_dagster.databases.informix import catalog_sql, decode_column, is_informix_url, rule_type  # noqa: E402
from dw_dagster.databases.informix_dialect import InformixSqlError, informix_datetime, to_informix  # noqa: E402

GRAMMAR = (Path(__file__).parent / "informix_grammar.lark").read_text()
DELIM = "informix"
NODELIM = "informix, delimident=false"


@pytest.fixture(scope="module")
def parsers():
    with_delim = lark.Lark(GRAMMAR, parser="earley")
    without = lark.Lark(GRAMMAR.replace("ident: IDENT | DELIM_IDENT", "ident: IDENT"), parser="earley")
    return {DELIM: with_delim, NODELIM: without}


def valid(parsers, dialect: str, text: str) -> bool:
    try:
        parsers[dialect].parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


@pytest.mark.parametrize("text", [
    "SELECT a FROM t LIMIT 10",                            # LIMIT tail: ruby-ibmdb#175 (no OFFSET/LIMIT tail)
    "SELECT a FROM t OFFSET 5",
    "SELECT DISTINCT SKIP 1 a FROM t",                     # hibernate-orm#8511: SKIP must precede DISTINCT
    "SELECT a % 2 FROM t",
    "SELECT a FROM t WHERE a IS DISTINCT FROM b",
    "SELECT COALESCE(a, b) FROM t",
    "SELECT MD5(a) FROM t",
    "SELECT CAST(a AS VARCHAR) FROM t",
    "SELECT CAST(a AS TIMESTAMP) FROM t",
    "SELECT a FROM t WHERE ts > TIMESTAMP '2026-11-01 00:00:00'",
    "SELECT a AT TIME ZONE 'UTC' FROM t",
    "WITH x AS (SELECT a FROM t) SELECT a FROM x",
    "SELECT a FROM t WHERE b = TRUE",
])
def test_the_grammar_refuses_what_informix_does_not_have(parsers, text):
    assert not valid(parsers, DELIM, text)


def test_the_grammar_takes_informix_forms(parsers):
    for text in ["SELECT SKIP 5 FIRST 10 DISTINCT a FROM t ORDER BY a",
                 "SELECT a FROM t WHERE ts >= DATETIME (2026-11-01 00:00:00.00000) YEAR TO FRACTION(5)",
                 "SELECT ts + INTERVAL (72) HOUR(2) TO HOUR FROM t", "SELECT a FROM t WHERE name MATCHES 'ab*'",
                 "SELECT SUBSTRING(a FROM 1 FOR 3), NVL(a, 0), a::LVARCHAR FROM t",
                 'SELECT "Net Sales" FROM t']:
        assert valid(parsers, DELIM, text), text
    assert not valid(parsers, NODELIM, 'SELECT "Net Sales" FROM t')


def _where():
    return ranges_condition("sale_ts", [(dt.datetime(2026, 11, 1), dt.datetime(2026, 11, 2, 12, 30))])


@pytest.mark.parametrize("dialect", [DELIM, NODELIM])
def test_the_reconciliation_sql_is_informix(parsers, dialect):
    """Counts and exact sums per slice, with and without keys, scoped to a window and to closed partitions."""
    import dagster as dg

    closed, _ = comparison_scope(dg.DailyPartitionsDefinition(start_date="2026-11-01"), "sale_ts", closed_only=True,
                                 now=dt.datetime(2026, 11, 5, 13, tzinfo=dt.timezone.utc))
    for where in (None, _where(), closed):
        for keys in ((), ("sales_line_id",)):
            text = slice_aggregate_sql("pos.sales_line", ["region"], ["net_sales"], dialect, keys, quote=True, where=where)
            assert valid(parsers, dialect, text), text
            assert "CAST(SUM" not in text and "FLOAT" not in text  # DECIMAL(p,s) sums stay exact
    text = slice_aggregate_sql("pos.sales_line", ["region"], ["net_sales"], DELIM, quote=True, where=closed)
    assert "DATETIME (2026-11-05 00:00:00.00000) YEAR TO FRACTION(5)" in text


def test_identifiers_fold_and_quote_by_delimident(parsers):
    text = slice_aggregate_sql("pos.sales_line", ["Region"], ["net_sales"], DELIM, quote=True)
    assert '"Region"' in text and valid(parsers, DELIM, text)
    plain = slice_aggregate_sql("pos.sales_line", ["region"], ["net_sales"], NODELIM, quote=True)
    assert '"' not in plain and valid(parsers, NODELIM, plain)
    for bad in ("Region", "net sales", "first"):  # would need quotes, or reads as a Projection keyword
        with pytest.raises(InformixSqlError, match="DELIMIDENT"):
            slice_aggregate_sql("pos.sales_line", [bad], [], NODELIM, quote=True)


def test_first_skip_times_and_string_functions(parsers):
    text = to_informix("SELECT DISTINCT a, CAST(b AS VARCHAR), LENGTH(c), SUBSTRING(c, 1, 12), b % 7, COALESCE(a, b, c), "
                       "ts + INTERVAL 72 HOUR, CAST('2026-11-01' AS DATE) FROM t WHERE glob(x, 'ab*') "
                       "ORDER BY a NULLS FIRST LIMIT 10 OFFSET 5")
    assert text.startswith("SELECT SKIP 5 FIRST 10 DISTINCT ")
    for part in ("CAST(b AS LVARCHAR)", "CHAR_LENGTH(c)", "SUBSTR(c, 1, 12)", "MOD(b, 7)", "NVL(a, NVL(b, c))",
                 "INTERVAL (72) HOUR(2) TO HOUR", "MDY(11, 1, 2026)", "x MATCHES 'ab*'"):
        assert part in text, part
    assert valid(parsers, DELIM, text), text
    assert to_informix("SELECT * FROM (SELECT a FROM t LIMIT 3) AS x") == "SELECT * FROM (SELECT FIRST 3 a FROM t) AS x"
    with pytest.raises(InformixSqlError, match="FROM clause"):
        to_informix("SELECT a FROM t WHERE a IN (SELECT b FROM u LIMIT 1)")
    with pytest.raises(InformixSqlError, match="AT TIME ZONE"):
        to_informix("SELECT CAST(ts AT TIME ZONE 'UTC' AS TIMESTAMP) FROM t")
    assert "DECIMAL(32,2)" in to_informix("SELECT CAST(a AS DECIMAL(38, 2)) FROM t")  # Informix's widest is 32 digits


def test_datetime_literals_hold_five_fraction_digits():
    assert informix_datetime(dt.datetime(2026, 11, 1, 7, 0, 0, 123450)) == \
        "DATETIME (2026-11-01 07:00:00.12345) YEAR TO FRACTION(5)"
    aware = dt.datetime(2026, 11, 1, 8, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert informix_datetime(aware).startswith("DATETIME (2026-11-01 07:00:00.00000)")
    with pytest.raises(InformixSqlError, match="sixth fraction digit"):
        informix_datetime(dt.datetime(2026, 11, 1, 7, 0, 0, 123456))


def test_the_diff_and_catalog_sql_is_informix(parsers):
    """What the cross-database diff sends to an Informix side (counts and NULL keys, the rows to download,
    the sampled key buckets) and the catalog and planning reads."""
    import sqlglot

    from dw_dagster.checks.rowdiff.joindiff import _raw_key
    from dw_dagster.migration.parity import _duplicate_keys_sql

    class Fake:
        dialect = DELIM

    rel = '(SELECT "sales_line_id" AS dwkey0, "net_sales" AS dwcol0 FROM pos.sales_line)'
    sampled = f"(SELECT * FROM {rel} AS dw_r WHERE (MOD(ABS(dwkey0), 8) < 1 OR dwkey0 IS NULL))"
    statements = [
        sqlglot.transpile(f"SELECT COUNT(*), COUNT(*) - COUNT(dwkey0) FROM {rel} AS x", read="duckdb", write=DELIM)[0],
        sqlglot.transpile(f"SELECT dwkey0, dwcol0 FROM {sampled} AS dw_x", read="duckdb", write=DELIM)[0],
        catalog_sql("pos.sales_line"), catalog_sql("sales_line", NODELIM),
        _duplicate_keys_sql(Fake(), "pos.sales_line", ["store_id", "sales_line_id"]),
    ]
    raw = _raw_key(["k"], {"k": "CHAR"}, {"k": "VARCHAR"}, False)
    statements.append(sqlglot.transpile(f"SELECT MIN({raw}), MAX({raw}), COUNT(DISTINCT {raw}), COUNT(*) OVER () FROM t "
                                        "AS x GROUP BY RTRIM(k) HAVING COUNT(DISTINCT k) > 1 ORDER BY 1 LIMIT 20",
                                        read="duckdb", write=DELIM)[0])
    for text in statements:
        assert valid(parsers, DELIM, text), text
    assert "MOD(ABS(dwkey0), 8) < 1" in statements[1]


def test_catalog_codes_decode_as_ibm_documents_them():
    assert decode_column(5, 18 * 256 + 2) == ("DECIMAL(18,2)", True)
    assert decode_column(5 + 256, 16 * 256 + 255) == ("DECIMAL(16)", False)  # scale 255: floating decimal
    assert decode_column(10, 19 * 256 + 0 * 16 + 15) == ("DATETIME YEAR TO FRACTION(5)", True)
    assert decode_column(10, 19 * 256 + 0 * 16 + 10) == ("DATETIME YEAR TO SECOND", True)
    assert decode_column(13 + 256, 5 * 256 + 32) == ("VARCHAR(32)", False)
    assert decode_column(0, 10) == ("CHAR(10)", True)
    assert decode_column(52, 8) == ("BIGINT", True)
    assert rule_type("DATETIME YEAR TO FRACTION(5)") == "TIMESTAMP" and rule_type("MONEY(16,2)") == "DECIMAL(16,2)"
    assert rule_type("SERIAL8") == "BIGINT" and rule_type("NCHAR(4)") == "CHAR(4)" and rule_type("SMALLFLOAT") == "REAL"
    with pytest.raises(ValueError):
        decode_column(99, 0)


def test_the_driver_is_an_extra_imported_only_for_an_informix_url(tmp_path):
    """``import dw_dagster`` imports no Informix driver; opening an ``ibm_db_sa://`` URL without the extra
    names the extra (no Informix server, no driver here)."""
    code = ("import sys, dw_dagster\n"
            "assert not [m for m in sys.modules if m.startswith(('ibm_db', 'IfxPy', 'ifxalchemy'))], 'driver imported'\n"
            "from dw_dagster import database_from_url, DatabaseError\n"
            "try:\n    database_from_url('ibm_db_sa://u:p@127.0.0.1:9089/pos')\nexcept DatabaseError as e:\n"
            "    assert 'dw-dagster[informix]' in str(e), e\n    print('refused')\n"
            "else:\n    print('opened')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("refused", "opened")  # opened only where the extra is installed
    assert is_informix_url("informix+ifxpy://h/db") and is_informix_url("ibm_db_sa://h/db")
    assert not is_informix_url("postgresql+psycopg://h/db")


def test_row_diff_across_downloads_from_an_engine_without_a_row_hash(tmp_path):
    """An Informix side has no MD5 in SQL: the diff downloads its rows (here an Informix-flavoured
    stand-in whose generated SQL is valid DuckDB too) and still finds every difference, sampled or not."""
    import sqlglot

    from dw_dagster.checks.rowdiff import row_diff_across
    from dw_dagster.databases import DuckDBDatabase

    src, tgt = DuckDBDatabase(tmp_path / "s.duckdb"), DuckDBDatabase(tmp_path / "t.duckdb")
    for db in (src, tgt):
        db.execute("CREATE SCHEMA pos")
        db.execute("CREATE TABLE pos.t AS SELECT i AS id, CAST(i * 1.5 AS DECIMAL(10,2)) AS amt FROM range(200) r(i)")
    tgt.execute("DELETE FROM pos.t WHERE id IN (8, 9)")
    tgt.execute("UPDATE pos.t SET amt = 0 WHERE id = 16")

    class InformixLike:
        dialect, name = DELIM, "informix-like"

        def _duck(self, q):
            assert "MD5" not in q.upper()
            return sqlglot.transpile(q, read="postgres", write="duckdb")[0]

        def fetch_all(self, q):
            return src.fetch_all(self._duck(q))

        def fetch_batches(self, q, batch_rows=100_000):
            return src.fetch_batches(self._duck(q), batch_rows)

        def column_types(self, table):
            from dw_dagster.databases.catalog import column_types

            return column_types(src, table)

    full = row_diff_across(InformixLike(), tgt, "pos.t", "pos.t", ["id"])
    assert (full.missing, full.changed) == (2, 1)
    assert any("downloaded" in w for w in full.warnings)
    sampled = row_diff_across(InformixLike(), tgt, "pos.t", "pos.t", ["id"], sample=(1, 8))
    assert (sampled.missing, sampled.changed) == (1, 1)  # keys 8 and 16 are in bucket 0 of 8; 9 is not
    assert any("sampled" in w for w in sampled.warnings)
