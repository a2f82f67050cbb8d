"""Field cases of time semantics where a check reads a time: freshness, the volume check's day
buckets, the null rate's window; on DuckDB, PostgreSQL and MariaDB, sessions in other time zones."""

import datetime as dt
import urllib.parse

import pytest

from dw_dagster.checks.dead_letter import parked_rows
from dw_dagster.checks.freshness import freshness
from dw_dagster.checks.null_rate import null_rates
from dw_dagster.checks.volume import volume_scores
from dw_dagster.databases import DatabaseError, SqlAlchemyDatabase
from dw_dagster_tests.conftest import POSTGRES_URL
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.field_cases.tables import load

UTC = dt.timezone.utc
KINDS = [
    kind("time-epoch-where-timestamp-read", "time", "an epoch-integer column given where a check reads a timestamp "
         "(freshness, volume, null rate): refused, naming it", "https://github.com/PostHog/posthog/pull/86228",
         "dw_dagster/checks/utc.py, dw_dagster/checks/freshness.py", "test_epoch_column_is_refused_by_every_check", True),
    kind("time-freshness-aware-session", "time", "freshness of a TIMESTAMPTZ column read in a session far from UTC",
         "https://github.com/chio-labs/sqlbuild/pull/522", "dw_dagster/checks/freshness.py",
         "test_freshness_of_aware_column_in_other_session_zone", False),
    kind("time-volume-utc-day-buckets", "time", "day buckets of an aware column when the session's zone is not UTC",
         "https://github.com/elementary-data/elementary/issues/1471", "dw_dagster/checks/volume.py",
         "test_volume_buckets_by_utc_day_in_any_session_zone", False),
    kind("time-keyword-column-name", "types", "a timestamp column named like a keyword (at) read by freshness on DuckDB",
         "https://github.com/duckdb/dbt-duckdb/issues/95", "dw_dagster/checks/utc.py", "test_freshness_of_iso_text", True),
    kind("time-dead-letter-aware-session", "time", "rows parked in a TIMESTAMPTZ dead-letter table counted from a "
         "non-UTC session", "https://github.com/dbt-labs/dbt-snowflake/issues/1256", "dw_dagster/checks/dead_letter.py",
         "test_dead_letter_window_is_utc_in_any_session_zone", True),
    kind("time-freshness-iso-text", "time", "freshness of ISO-8601 text with a 'Z' or an offset (a string-typed column)",
         "https://github.com/exasol/dbt-exasol/issues/90", "dw_dagster/checks/freshness.py",
         "test_freshness_of_iso_text", False),
    kind("time-null-rate-aware-session", "time", "the null rate's current UTC day of a TIMESTAMPTZ column read in a "
         "session at UTC+14", "https://github.com/PostHog/posthog/pull/62037", "dw_dagster/checks/null_rate.py",
         "test_null_rate_day_of_an_aware_column_in_any_session_zone", False),
]

NOW = dt.datetime(2024, 11, 3, 12, 0, tzinfo=UTC)
ENGINES = ["duck", "pg", "maria"]


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_epoch_column_is_refused_by_every_check(engine):
    """PostHog #86228 (https://github.com/PostHog/posthog/pull/86228): epoch integers taken for
    timestamps crash (``ILLEGAL_TYPE_OF_ARGUMENT``) or land in the year 56000. Freshness crashed
    with ``'int' object has no attribute 'tzinfo'``; the volume check cast an integer to a DATE.
    Right answer: each check refuses, naming the table and column and saying what to do."""
    epoch = int(NOW.timestamp())
    t = load(engine, "epochs", [("id", "INTEGER"), ("loaded_at", "BIGINT")], [(1, epoch - 60), (2, epoch - 7200)])
    with pytest.raises(DatabaseError, match=r"loaded_at.*(number|BIGINT).*epoch"):
        freshness(engine.db, t, "loaded_at", max_lag=dt.timedelta(hours=1), now_utc=NOW)
    with pytest.raises(DatabaseError, match=r"loaded_at is .*a number, not a timestamp"):
        volume_scores(engine.db, t, "loaded_at", now=NOW)
    with pytest.raises(DatabaseError, match=r"loaded_at is .*a number, not a timestamp"):
        null_rates(engine.db, t, ["id"], timestamp_column="loaded_at", as_of=NOW.date())


def test_freshness_of_aware_column_in_other_session_zone(pg):
    """sqlbuild PR #522 (https://github.com/chio-labs/sqlbuild/pull/522): freshness observed in
    local time on a non-UTC machine was off by the UTC offset. Here the PostgreSQL session runs in
    Pacific/Kiritimati (UTC+14) and the column is TIMESTAMPTZ. Right answer (Python): the newest
    instant is 11:30 UTC, 30 minutes old at 12:00 UTC, so a 1-hour lag passes and a 20-minute one fails."""
    t = load(pg, "aware", [("at", "TIMESTAMPTZ")], [("2024-11-03 01:30:00-04",), ("2024-11-03 06:30:00-05",)])
    far = SqlAlchemyDatabase(f"{POSTGRES_URL}?options={urllib.parse.quote('-c TimeZone=Pacific/Kiritimati')}")
    try:
        newest = max(dt.datetime.fromisoformat(x) for x in ("2024-11-03 01:30:00-04:00", "2024-11-03 06:30:00-05:00"))
        r, _ = freshness(far, t, "at", max_lag=dt.timedelta(hours=1), now_utc=NOW)
        assert r.max_timestamp_utc == newest.astimezone(UTC) == dt.datetime(2024, 11, 3, 11, 30, tzinfo=UTC)
        assert r.passed and r.lag_seconds == (NOW - newest).total_seconds() == 1800
        r, _ = freshness(far, t, "at", max_lag=dt.timedelta(minutes=20), now_utc=NOW)
        assert not r.passed
    finally:
        far.dispose()


def test_volume_buckets_by_utc_day_in_any_session_zone(pg):
    """elementary #1471 (https://github.com/elementary-data/elementary/issues/1471): day buckets
    of an absolute timestamp taken in another zone than the one the user means leave every
    "complete" day partial. Rows at 23:30 UTC read in a UTC+14 session would land on the next day.
    Right answer (Python, UTC days): each day's count is the rows of that UTC day."""
    rows = [dt.datetime(2024, 10, d, h, 30, tzinfo=UTC) for d in range(1, 11) for h in (1, 23)]
    t = load(pg, "vol", [("at", "TIMESTAMPTZ")], [(r,) for r in rows])
    far = SqlAlchemyDatabase(f"{POSTGRES_URL}?options={urllib.parse.quote('-c TimeZone=Pacific/Kiritimati')}")
    try:
        scores, _ = volume_scores(far, t, "at", evaluate_days=3, training_days=5, now=NOW)
        by_day = {}
        for r in rows:
            by_day[r.date()] = by_day.get(r.date(), 0) + 1
        assert {s.day: s.rows for s in scores} == {d: by_day[d] for d in sorted(by_day)[-3:]}
    finally:
        far.dispose()


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_freshness_of_iso_text(engine):
    """dbt-exasol #90 (https://github.com/exasol/dbt-exasol/issues/90): source freshness over a
    column the adapter took for a string failed. Right answer: ISO-8601 text with ``Z`` or an
    offset read as the instant it names (Python's ``fromisoformat``); the newest here is 11:45 UTC.
    The column is named ``at``, a DuckDB keyword (``AT TIME ZONE``): dbt-duckdb #95
    (https://github.com/duckdb/dbt-duckdb/issues/95) had tests fail on names that need quoting;
    freshness sent ``MAX(at)`` bare and DuckDB refused to parse it."""
    values = ["2024-11-03T11:45:00Z", "2024-11-03T06:40:00-05:00"]
    t = load(engine, "iso_text", [("at", "VARCHAR(40)")], [(v,) for v in values])
    r, _ = freshness(engine.db, t, "at", max_lag=dt.timedelta(minutes=30), now_utc=NOW)
    newest = max(dt.datetime.fromisoformat(v.replace("Z", "+00:00")) for v in values)
    assert r.max_timestamp_utc == newest == dt.datetime(2024, 11, 3, 11, 45, tzinfo=UTC)
    assert r.passed


def test_dead_letter_window_is_utc_in_any_session_zone(pg):
    """dbt-snowflake #1256 (https://github.com/dbt-labs/dbt-snowflake/issues/1256): UTC batch
    bounds compared with time-zone-aware columns were shifted by the session's offset, so the wrong
    rows were read. The dead-letter check compared ``parked_at >= since`` (naive UTC) with a
    TIMESTAMPTZ column, which a New York session read as 10:00 New York: the two rows parked
    after 10:00 UTC were not counted and the check passed. Right answer (Python): per reason, the
    rows whose instant is at or after ``since``."""
    utc = dt.timezone.utc
    parked = [(dt.datetime(2024, 1, 1, 9, 30, tzinfo=utc), "schema"), (dt.datetime(2024, 1, 1, 10, 30, tzinfo=utc), "schema"),
              (dt.datetime(2024, 1, 1, 11, 30, tzinfo=utc), "fk")]
    t = load(pg, "dlq", [("parked_at", "TIMESTAMPTZ"), ("reason", "TEXT")], parked)
    since = dt.datetime(2024, 1, 1, 10, 0)
    ny = SqlAlchemyDatabase(f"{POSTGRES_URL}?options={urllib.parse.quote('-c TimeZone=America/New_York')}")
    try:
        got, _ = parked_rows(ny, t, "parked_at", "reason", since)
    finally:
        ny.dispose()
    want = {}
    for at, reason in parked:
        if at >= since.replace(tzinfo=utc):
            want[reason] = want.get(reason, 0) + 1
    assert {p.reason: p.rows for p in got} == want == {"schema": 1, "fk": 1}


def test_null_rate_day_of_an_aware_column_in_any_session_zone(pg):
    """PostHog PR #62037 (https://github.com/PostHog/posthog/pull/62037): day buckets cut at another
    zone's midnight than the one meant put the night's events "into the prior day's bucket". The
    null rate compares the current UTC day with the days before; read in a UTC+14 session, a naive
    bound would move 00:30 UTC into the previous day and 23:30 UTC into the next. Right answer
    (Python, UTC days): the current day 2024-01-02 holds 2 rows, 1 of them NULL; the baseline day
    before holds 1 row, NULL."""
    rows = [(dt.datetime(2024, 1, 2, 0, 30, tzinfo=UTC), None), (dt.datetime(2024, 1, 2, 23, 30, tzinfo=UTC), 1),
            (dt.datetime(2024, 1, 1, 23, 30, tzinfo=UTC), None), (dt.datetime(2024, 1, 3, 1, 0, tzinfo=UTC), None)]
    t = load(pg, "nr_aware", [("at", "TIMESTAMPTZ"), ("v", "INTEGER")], rows)
    far = SqlAlchemyDatabase(f"{POSTGRES_URL}?options={urllib.parse.quote('-c TimeZone=Pacific/Kiritimati')}")
    try:
        (rate,), _ = null_rates(far, t, ["v"], timestamp_column="at", as_of=dt.date(2024, 1, 2))
    finally:
        far.dispose()
    today = [v for at, v in rows if at.date() == dt.date(2024, 1, 2)]
    before = [v for at, v in rows if at.date() < dt.date(2024, 1, 2)]
    assert (rate.current_rows, rate.current_nulls) == (len(today), today.count(None)) == (2, 1)
    assert (rate.baseline_rows, rate.baseline_nulls) == (len(before), before.count(None)) == (1, 1)
