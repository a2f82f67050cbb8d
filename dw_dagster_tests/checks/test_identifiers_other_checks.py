"""Issue 14 kind 10 in the freshness and dead-letter checks: a mixed-case column created quoted on
PostgreSQL (``"LoadedAt"``, ``"Reason"``) is found whether it is configured as spelled or in
another case (a unique case-insensitive match), and two columns differing only in case are an
error naming both — never "column does not exist", never the wrong column."""

import datetime as dt

import pytest

from dw_dagster.checks.dead_letter import parked_rows
from dw_dagster.checks.freshness import freshness
from dw_dagster.databases.catalog import CatalogError

NOW = dt.datetime(2026, 5, 4, 12, tzinfo=dt.timezone.utc)


@pytest.fixture
def parked(postgres):
    postgres.execute('DROP SCHEMA IF EXISTS idn CASCADE; CREATE SCHEMA idn; '
                     'CREATE TABLE idn.parked ("LoadedAt" TIMESTAMP, "Reason" TEXT, reason_code INT); '
                     "INSERT INTO idn.parked VALUES ('2026-05-04 10:00', 'null amount', 1), "
                     "('2026-05-04 11:00', 'null amount', 1), ('2026-05-04 11:30', 'bad region', 2)")
    yield postgres
    postgres.execute("DROP SCHEMA IF EXISTS idn CASCADE")


@pytest.mark.parametrize("ts", ["LoadedAt", "loadedat", "LOADEDAT"])
def test_freshness_reads_a_mixed_case_column_as_spelled_in_the_catalog(parked, ts):
    result, q = freshness(parked, "idn.parked", ts, max_lag=dt.timedelta(hours=2), now_utc=NOW)
    assert result.passed and result.max_timestamp_utc == dt.datetime(2026, 5, 4, 11, 30, tzinfo=dt.timezone.utc)
    assert '"LoadedAt"' in q


@pytest.mark.parametrize("reason", ["Reason", "reason"])
def test_the_dead_letter_check_reads_mixed_case_columns(parked, reason):
    rows, q = parked_rows(parked, "idn.parked", "LoadedAt", reason, dt.datetime(2026, 5, 4))
    assert [(r.reason, r.rows) for r in rows] == [("null amount", 2), ("bad region", 1)]
    assert '"Reason"' in q


def test_two_columns_differing_only_in_case_are_an_error_naming_both(parked):
    parked.execute('ALTER TABLE idn.parked ADD COLUMN "LOADEDAT" TIMESTAMP')
    # neither as spelled nor folded (PostgreSQL folds to lower case): two case-insensitive matches
    with pytest.raises(CatalogError, match="LoadedAt.*LOADEDAT|LOADEDAT.*LoadedAt"):
        freshness(parked, "idn.parked", "loadedAt", max_lag=dt.timedelta(hours=2), now_utc=NOW)
    result, _ = freshness(parked, "idn.parked", "LoadedAt", max_lag=dt.timedelta(hours=2), now_utc=NOW)  # exact wins
    assert result.non_null_rows == 3
