"""The test each fix adds: the one that would have caught the failure, chosen by where it entered.

Each is a *singular* test in dbt's own style: a query over the warehouse's tables that returns the
offending rows, so it passes when it returns none. Plain SQL is a valid dbt singular test (a dbt
project runs it with ``dbt test``), and dw_dagster runs the same file in the repair's verify stage
(:func:`dw_dagster.repair.new_tests.build_new_tests_check`) against the warehouse resource, so the
receipt names the test and says whether it passed. Every identifier is built with sqlglot and the
query is rendered in the warehouse's dialect.

- :func:`duplicate_keys_test`: no key of the merge key held by more than one row (a duplicated load);
- :func:`not_null_test`: no NULL in the REQUIRED columns (NOT NULL drift);
- :func:`dead_letter_growth_test`: the dead-letter table holds at most N rows per error;
  :func:`dead_letter_outstanding_test`: no parked row that is neither in the target nor replayed;
- :func:`upstream_landed_test`: every partition of the target holds as many rows as its upstream
  table's partition (a stale or failed upstream read too early);
- :func:`schema_contract_test`: the table's columns, types and nullability are the contract's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from dw_dagster.core.table_names import table_slug
from dw_dagster.databases import sql

#: the folder of the pipeline repository the tests go to, unless the diagnoser names another
DEFAULT_TESTS_DIR = "dbt_project/tests"


@dataclass(frozen=True)
class RegressionTest:
    """One singular test: its file (relative to the pipeline repository), what it asserts and its SQL."""

    name: str
    path: str
    asserts: str
    sql: str
    kind: str

    def file_text(self, change_set_id: str) -> str:
        """The file the change set adds: a comment naming the change set and the assertion, then the query."""
        return (f"-- Added by dw-dagster change set {change_set_id} ({self.kind}): {self.asserts}.\n"
                f"-- A singular test: it passes when the query returns no row.\n{self.sql.rstrip(';')}\n")


def _name(kind: str, table: str) -> str:
    return f"dw_{kind}__{table_slug(table)}"


def _test(kind: str, table: str, asserts: str, tree: exp.Expression, dialect: str, tests_dir: str) -> RegressionTest:
    name = _name(kind, table)
    return RegressionTest(name=name, path=f"{tests_dir.rstrip('/')}/{name}.sql", asserts=asserts,
                          sql=tree.sql(dialect=dialect, pretty=True), kind=kind)


def duplicate_keys_test(table: str, key_columns: Sequence[str], dialect: str,
                        tests_dir: str = DEFAULT_TESTS_DIR) -> RegressionTest:
    """No value of ``key_columns`` is held by more than one row of ``table`` (dbt's ``unique``, on the merge key)."""
    keys = [sql.column(k) for k in key_columns]
    tree = (exp.select(*keys, exp.alias_(exp.Count(this=exp.Star()), "copies")).from_(sql.table(table))
            .group_by(*[k.copy() for k in keys]).having(exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(1))))
    return _test("unique_merge_key", table, f"every {', '.join(key_columns)} of {table} is held by one row",
                 tree, dialect, tests_dir)


def not_null_test(table: str, columns: Sequence[str], dialect: str, tests_dir: str = DEFAULT_TESTS_DIR) -> RegressionTest:
    """No NULL in any of ``columns`` of ``table`` (dbt's ``not_null``, for the REQUIRED columns)."""
    cond = exp.or_(*[exp.Is(this=sql.column(col), expression=exp.Null()) for col in columns])
    tree = exp.select("*").from_(sql.table(table)).where(cond)
    return _test("not_null", table, f"{', '.join(columns)} of {table} hold no NULL", tree, dialect, tests_dir)


def dead_letter_growth_test(dead_letter_table: str, error_column: str, dialect: str,
                            tests_dir: str = DEFAULT_TESTS_DIR, allowed: int = 0) -> RegressionTest:
    """The dead-letter table holds at most ``allowed`` rows per error (parked rows are a failure, not a log)."""
    err = sql.column(error_column)
    tree = (exp.select(err, exp.alias_(exp.Count(this=exp.Star()), "parked_rows")).from_(sql.table(dead_letter_table))
            .group_by(err.copy()).having(exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(allowed))))
    return _test("dead_letter_growth", dead_letter_table, f"{dead_letter_table} holds at most {allowed} row(s) per "
                 f"{error_column}", tree, dialect, tests_dir)


def dead_letter_outstanding_test(dead_letter_table: str, key: str, target_table: str, error_column: str, dialect: str,
                                 ledger_table: str | None = None, tests_dir: str = DEFAULT_TESTS_DIR,
                                 allowed: int = 0) -> RegressionTest:
    """Parked rows of ``dead_letter_table`` whose key is neither in ``target_table`` nor replayed
    (``ledger_table``) — the dead letter growing again — more than ``allowed`` per error."""
    def absent(table: str) -> exp.Expression:
        return exp.Not(this=exp.Exists(this=exp.select(exp.Literal.number(1)).from_(sql.table(table).as_("x")).where(
            exp.EQ(this=exp.column(key, "x"), expression=exp.column(key, "d")))))

    err = exp.column(error_column, "d")
    cond = exp.and_(absent(target_table), *([absent(ledger_table)] if ledger_table else []))
    tree = (exp.select(err, exp.alias_(exp.Count(this=exp.Star()), "parked_rows"))
            .from_(sql.table(dead_letter_table).as_("d")).where(cond).group_by(err.copy())
            .having(exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(allowed))))
    return _test("dead_letter_outstanding", dead_letter_table, f"{dead_letter_table} holds at most {allowed} parked "
                 f"row(s) per {error_column} that are neither in {target_table} nor replayed", tree, dialect, tests_dir)


def upstream_landed_test(target_table: str, upstream_table: str, partition_column: str, dialect: str,
                         upstream_partition_column: str | None = None, tests_dir: str = DEFAULT_TESTS_DIR) -> RegressionTest:
    """Each day of ``upstream_table`` has as many rows in ``target_table`` (the target read its upstream
    after it landed, not before): the days whose counts differ."""
    def per_day(table: str, column: str, alias: str) -> exp.Select:
        day = exp.Cast(this=sql.column(column), to=exp.DataType.build("DATE"))
        return (exp.select(exp.alias_(day, "dw_day"), exp.alias_(exp.Count(this=exp.Star()), alias))
                .from_(sql.table(table)).group_by(day.copy()))

    up = per_day(upstream_table, upstream_partition_column or partition_column, "upstream_rows").subquery("u")
    tg = per_day(target_table, partition_column, "target_rows").subquery("t")
    day = exp.Coalesce(this=exp.column("dw_day", "u"), expressions=[exp.column("dw_day", "t")])
    u_rows = exp.Coalesce(this=exp.column("upstream_rows", "u"), expressions=[exp.Literal.number(0)])
    t_rows = exp.Coalesce(this=exp.column("target_rows", "t"), expressions=[exp.Literal.number(0)])
    tree = (exp.select(exp.alias_(day, "dw_day"), exp.alias_(u_rows, "upstream_rows"), exp.alias_(t_rows, "target_rows"))
            .from_(up).join(tg, on=exp.EQ(this=exp.column("dw_day", "u"), expression=exp.column("dw_day", "t")), join_type="FULL OUTER")
            .where(exp.NEQ(this=u_rows.copy(), expression=t_rows.copy())))
    return _test("upstream_landed", target_table, f"every day of {upstream_table} has as many rows in {target_table} "
                 "(it read its upstream after it landed)", tree, dialect, tests_dir)


def schema_contract_test(table: str, columns: Sequence[tuple[str, bool | None]], dialect: str,
                         tests_dir: str = DEFAULT_TESTS_DIR) -> RegressionTest:
    """``table`` has each of ``columns`` (name, nullable) with that nullability: the contract's
    columns the catalog (``information_schema.columns``) does not show as agreed."""
    parts = table.split(".")
    name, schema = parts[-1], (parts[-2] if len(parts) > 1 else None)
    rows = [(col, "YES" if nullable else "NO" if nullable is not None else None) for col, nullable in columns]
    expected = sql.values_table("contract", ["column_name", "is_nullable"], rows)
    cond = [exp.EQ(this=exp.Lower(this=exp.column("column_name", "c")), expression=exp.Lower(this=exp.column("column_name", "contract"))),
            exp.EQ(this=exp.Lower(this=exp.column("table_name", "c")), expression=exp.Lower(this=sql.literal(name)))]
    if schema:
        cond.append(exp.EQ(this=exp.Lower(this=exp.column("table_schema", "c")), expression=exp.Lower(this=sql.literal(schema))))
    catalog = exp.Table(this=exp.to_identifier("columns"), db=exp.to_identifier("information_schema"), alias=exp.TableAlias(this=exp.to_identifier("c")))
    nullable_differs = exp.and_(exp.Not(this=exp.Is(this=exp.column("is_nullable", "contract"), expression=exp.Null())),
                                exp.NEQ(this=exp.column("is_nullable", "c"), expression=exp.column("is_nullable", "contract")))
    tree = (exp.select(exp.column("column_name", "contract"), exp.alias_(exp.column("is_nullable", "contract"), "expected_nullable"),
                       exp.alias_(exp.column("is_nullable", "c"), "catalog_nullable"))
            .from_(expected).join(catalog, on=exp.and_(*cond), join_type="LEFT")
            .where(exp.or_(exp.Is(this=exp.column("column_name", "c"), expression=exp.Null()), nullable_differs)))
    return _test("schema_contract", table, f"{table} has the contract's columns "
                 f"({', '.join(col for col, _ in columns)}) with their nullability", tree, dialect, tests_dir)


def runnable_sql(text: str) -> str:
    """The query of a singular test file: its ``--`` comment lines and a trailing ``;`` removed.

    Raises:
        ValueError: the file uses dbt's Jinja (``{{ ref(...) }}``), which only ``dbt test`` renders.
    """
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--")).strip().rstrip(";")
    if "{{" in body or "{%" in body:
        raise ValueError("the test uses dbt's Jinja; run it with `dbt test` (dw_dagster runs plain SQL tests only)")
    if not body:
        raise ValueError("the test file holds no query")
    return body


__all__ = ["DEFAULT_TESTS_DIR", "RegressionTest", "dead_letter_growth_test", "dead_letter_outstanding_test", "duplicate_keys_test", "not_null_test",
           "runnable_sql", "schema_contract_test", "upstream_landed_test"]
