"""build_volume_sensor on real DuckDB files and a real (ephemeral) Dagster instance.

Counts from the catalog in a constant number of statements, one incident per anomaly and never a
second while it is open, dead-letter growth, explicit insufficient history, history rebuilt from
observations when the cursor is lost, missing tables and broken warehouses, hostile names.
"""

import datetime as dt
import json

import dagster as dg
import pytest
import sqlalchemy as sa

from dw_dagster.core import keys as c
from dw_dagster.databases import sql
from dw_dagster.checks.volume import score_against_baseline, score_days
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core.models import BlastRadius, Diagnosis, utcnow
from dw_dagster.core import records
from dw_dagster.detection.volume import build_volume_sensor, watched_asset_keys
from dw_dagster.detection.volume.history import VOLUME_TABLE_KEY
from dw_dagster.detection.volume.store import history_t, store_for
from dw_dagster.detection.volume import VolumeTable, days_ago, fetch_row_counts

SENSOR = "dw_volume_sensor"
T0 = dt.datetime(2026, 3, 2, 6, 0, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self, t: dt.datetime = T0) -> None:
        self.t = t

    def __call__(self) -> dt.datetime:
        return self.t

    def advance(self, **kw) -> None:
        self.t += dt.timedelta(**kw)


class SpyDatabase:
    """A Database (protocol) over a DuckDB file that records every statement (goes through fetch_all)."""

    dialect = "duckdb"

    def __init__(self, inner: DuckDBDatabase) -> None:
        self.inner, self.name, self.statements = inner, inner.name, []

    def fetch_all(self, statement: str) -> list[tuple]:
        self.statements.append(statement)
        return self.inner.fetch_all(statement)

    def fetch_batches(self, statement, batch_rows=100_000):
        raise NotImplementedError

    def execute(self, statement: str) -> None:
        self.inner.execute(statement)


@pytest.fixture
def wh(tmp_path):
    db = DuckDBDatabase(tmp_path / "warehouse.duckdb")
    db.execute("CREATE SCHEMA pos")
    return db


@pytest.fixture
def instance():
    return dg.DagsterInstance.ephemeral()


def fill(db: DuckDBDatabase, table: str, rows: int) -> None:
    db.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT range AS id, TIMESTAMP '2026-03-01 12:00:00' AS ts FROM range({rows})")


def daemon_for(sensor, instance, *jobs) -> LocalSensorDaemon:
    return LocalSensorDaemon(dg.Definitions(sensors=[sensor], jobs=list(jobs)), instance, log_level="WARNING")


def volume_obs(instance, key) -> list[dict]:
    out = []
    for rec in records.iter_observations(instance, dg.AssetKey(key), newest_first=False):
        md = rec.asset_observation.metadata
        if VOLUME_TABLE_KEY in md:
            out.append({k: getattr(v, "value", v) for k, v in md.items()})
    return out


def grow_history(db, daemon, clock, table, sizes):
    """One recorded observation per size (the count changes every tick)."""
    for n in sizes:
        fill(db, table, n)
        clock.advance(hours=1)
        daemon.tick(SENSOR)


# -- the scoring function shared with the volume check ------------------------------------------


def test_score_against_baseline_is_the_volume_checks_scoring():
    counts = {dt.date(2024, 3, d): n for d, n in zip(range(1, 8), [100, 104, 98, 101, 99, 103, 40])}
    (day,) = score_days(counts, [dt.date(2024, 3, 7)], min_band_pct=0)
    s = score_against_baseline(40, [100, 104, 98, 101, 99, 103], min_band_pct=0)
    assert (s.status, s.mean, s.stddev, s.lower, s.upper, s.z_score) == (
        day.status, day.mean, day.stddev, day.lower, day.upper, day.z_score) == ("low", 100.833, 2.317, 93.884, 107.783, -26.26)
    assert score_against_baseline(5, [5, 5], min_history=3).status == "insufficient_history"
    assert score_against_baseline(0, [0, 0, 0]).status == "no_rows"  # the check's rule; the sensor maps it (below)
    with pytest.raises(ValueError, match="method"):
        score_against_baseline(1, [1, 2, 3], method="ewma")


def test_the_integer_stdev_is_bit_identical_to_statistics_stdev():
    import random
    import statistics

    from dw_dagster.checks.volume import _sample_stdev

    rng = random.Random(5)
    for _ in range(3000):
        top = 10 ** rng.randint(0, 15)
        values = [rng.randint(0, top) for _ in range(rng.randint(2, 30))]
        assert _sample_stdev(values) == statistics.stdev(values)
    assert _sample_stdev([7, 7, 7]) == 0.0 and _sample_stdev([1.5, 2.5]) == statistics.stdev([1.5, 2.5])


# -- where the counts come from -----------------------------------------------------------------


def test_counts_come_from_the_catalog_plus_batched_counts_never_one_query_per_table(wh):
    wh.execute("CREATE TABLE pos.t0 AS SELECT range AS id FROM range(3);"
               + ";".join(f"CREATE TABLE pos.t{i} AS SELECT range AS id FROM range({i % 7})" for i in range(1, 250)))
    fill(wh, "pos.sales_line", 10)
    specs = [VolumeTable(f"pos.t{i}", f"t{i}") for i in range(250)] + [VolumeTable("pos.nope", "nope")]
    spy = SpyDatabase(wh)
    found = fetch_row_counts(spy, specs)
    assert found.queries == spy.statements
    # one catalog query + ceil(250 / 100) UNION ALL statements, whatever the number of tables
    assert len(spy.statements) == 1 + 3
    assert "duckdb_tables()" in spy.statements[0] and "COUNT" not in spy.statements[0].upper()
    assert all(q.count("UNION ALL") <= 99 for q in spy.statements[1:])
    assert "WHERE" not in " ".join(spy.statements[1:])  # no partition asked for: no filtered COUNT(*)
    assert found.counts["warehouse:pos.t0"].rows == 3
    assert {i: found.counts[f"warehouse:pos.t{i}"].rows for i in range(1, 250)} == {i: i % 7 for i in range(1, 250)}
    assert found.counts["warehouse:pos.nope"].missing and found.counts["warehouse:pos.nope"].rows is None

    # a partition is asked for: COUNT(*) ... WHERE for that spec only, in the same batches
    spy.statements.clear()
    part = VolumeTable("pos.sales_line", "sales_line", partition_column="ts", partition=dt.date(2026, 3, 1))
    found = fetch_row_counts(spy, specs[:5] + [part])
    assert len(spy.statements) == 2
    assert spy.statements[1].count("WHERE") == 1 and "\"ts\" >= '2026-03-01 00:00:00+00:00'" in spy.statements[1]
    assert (found.counts[part.id].rows, found.counts[part.id].partition) == (10, "2026-03-01")


def test_duckdb_estimated_size_is_not_exact_after_delete_so_counts_are_exact(wh):
    """What the module docstring reports: duckdb_tables().estimated_size keeps deleted rows."""
    wh.execute("CREATE TABLE pos.big AS SELECT range AS id FROM range(100000)")
    wh.execute("DELETE FROM pos.big WHERE id % 3 = 0")
    wh.execute("CHECKPOINT")
    (est,) = wh.fetch_all("SELECT estimated_size FROM duckdb_tables() WHERE table_name = 'big'")[0]
    assert est == 100000
    assert fetch_row_counts(wh, [VolumeTable("pos.big", "big")]).counts["warehouse:pos.big"].rows == 66666


def test_sensor_tick_sends_a_constant_number_of_statements(wh, instance):
    wh.execute(";".join(f"CREATE TABLE pos.t{i} AS SELECT range AS id FROM range({i})" for i in range(30)))
    spy = SpyDatabase(wh)
    sensor = build_volume_sensor(tables=[VolumeTable(f"pos.t{i}", f"t{i}") for i in range(30)], databases={"warehouse": spy})
    tick = daemon_for(sensor, instance).tick(SENSOR)
    assert len(spy.statements) == 2 and tick.asset_events == 30
    assert "30 recorded (30 insufficient_history)" in tick.skip_reason


# -- incidents ------------------------------------------------------------------------------------

SEEN: list = []


def _diagnoser(context, incident):
    SEEN.append(incident)
    return Diagnosis(id="dg-test", incident_id=incident.id, asset_key=incident.asset_key, created_at=utcnow(), causes=[],
                     blast_radius=BlastRadius(root="(test)"), gap_rows=incident.gap_rows, unexplained_rows=incident.gap_rows), None


def test_a_drop_far_below_the_baseline_opens_exactly_one_incident_and_one_diagnosis(wh, instance):
    SEEN.clear()
    clock = Clock()
    job = build_diagnosis_job(diagnoser=_diagnoser)
    sensor = build_volume_sensor(tables=[VolumeTable("pos.sales_line", "store_sales_line")], databases={"warehouse": wh},
                                 min_history=7, diagnosis_job_name=job.name, clock=clock)
    daemon = daemon_for(sensor, instance, job)
    grow_history(wh, daemon, clock, "pos.sales_line", [1000, 1010, 995, 1003, 1020, 1001, 998, 1012])
    assert not records.incidents(instance)

    fill(wh, "pos.sales_line", 120)  # most of the table is gone
    clock.advance(hours=1)
    tick = daemon.tick(SENSOR)
    (inc,) = records.incidents(instance)
    assert inc.source == "volume_sensor" and inc.asset_key == ["store_sales_line"]
    assert (inc.gap_rows, inc.gap_pct) == (885, 88.058)  # baseline mean 1,004.875 rows (8 observations)
    assert "120 rows, low" in inc.summary and "zscore" in inc.summary
    assert (inc.window_end - inc.window_start) == dt.timedelta(hours=1)  # since the previous recorded count
    assert len(tick.run_ids) == 1 and [i.id for i in SEEN] == [inc.id]
    run = instance.get_run_by_id(tick.run_ids[0])
    assert run.tags[c.INCIDENT_TAG] == inc.id
    assert run.tags["dagster/run_key"] == inc.id and run.tags["dw/volume_table"] == "warehouse:pos.sales_line"
    last = volume_obs(instance, "store_sales_line")[-1]
    assert (last["dagster/row_count"], last["dw/volume_status"], last["dw/volume_change"]) == (120, "low", -892)
    assert last["dw/volume_lower"] > 120

    # the next ticks: unchanged (not even recorded), then lower still: recorded, not a second incident
    clock.advance(hours=1)
    tick = daemon.tick(SENSOR)
    assert tick.asset_events == 0 and not tick.run_ids and "1 unchanged" in tick.skip_reason
    fill(wh, "pos.sales_line", 5)  # below the new band (the 120 is part of the baseline now: lower 21.4)
    clock.advance(hours=1)
    tick = daemon.tick(SENSOR)
    assert not tick.run_ids and len(records.incidents(instance)) == 1
    last = volume_obs(instance, "store_sales_line")[-1]
    assert last["dw/volume_status"] == "low" and last["dw/volume_open_incident"] == inc.id
    assert f"incident {inc.id} still open" in tick.skip_reason


def test_an_incident_a_dry_run_recorded_is_diagnosed_once_by_the_next_ticks(wh, instance):
    """A "Test sensor" evaluation (or a tick whose run requests were lost) records the incident and
    launches nothing; the next real ticks request its diagnosis under the same run key: one run."""
    from dw_dagster.core.ledger import ledger_for

    SEEN.clear()
    clock = Clock()
    job = build_diagnosis_job(diagnoser=_diagnoser)
    sensor = build_volume_sensor(tables=[VolumeTable("pos.sales_line", "store_sales_line")], databases={"warehouse": wh},
                                 min_history=7, diagnosis_job_name=job.name, clock=clock)
    daemon = daemon_for(sensor, instance, job)
    grow_history(wh, daemon, clock, "pos.sales_line", [1000, 1010, 995, 1003, 1020, 1001, 998, 1012])
    fill(wh, "pos.sales_line", 120)
    clock.advance(hours=1)
    dry = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=daemon.cursors.get(SENSOR),
                                                       definitions=daemon.defs, sensor_name=SENSOR))
    (asked,) = dry.run_requests
    (inc,) = records.incidents(instance)
    assert ledger_for(instance).incident(inc.id).state == "open" and SEEN == []
    ticks = []
    for _ in range(3):
        clock.advance(hours=1)
        ticks.append(daemon.tick(SENSOR))
    assert [len(t.run_ids) for t in ticks] == [1, 0, 0] and not any(t.failed_run_ids for t in ticks)
    (run,) = instance.get_runs(filters=dg.RunsFilter(job_name=job.name))
    assert asked.run_key == run.tags["dagster/run_key"] == inc.id and [i.id for i in SEEN] == [inc.id]
    assert len(records.incidents(instance)) == 1 and ledger_for(instance).incident(inc.id).state == "diagnosed"


def test_a_spike_is_high_and_mad_method_is_available(wh, instance):
    clock = Clock()
    sensor = build_volume_sensor(tables=[VolumeTable("pos.events", "events")], databases={"warehouse": wh},
                                 method="mad", min_history=5, clock=clock)
    daemon = daemon_for(sensor, instance)
    grow_history(wh, daemon, clock, "pos.events", [500, 510, 505, 498, 502, 507])
    fill(wh, "pos.events", 5000)
    clock.advance(hours=1)
    daemon.tick(SENSOR)
    (inc,) = records.incidents(instance)
    assert "5,000 rows, high" in inc.summary and "mad" in inc.summary and inc.gap_rows < 0


def test_dead_letter_growth_is_reported_with_the_increase(wh, instance):
    clock = Clock()
    wh.execute("CREATE TABLE pos.sales_line_dlq (id INT, reason VARCHAR)")
    sensor = build_volume_sensor(tables=[VolumeTable("pos.sales_line_dlq", "store_sales_line", dead_letter=True)],
                                 databases={"warehouse": wh}, clock=clock)
    daemon = daemon_for(sensor, instance)
    tick = daemon.tick(SENSOR)
    assert "1 insufficient_history" in tick.skip_reason and not records.incidents(instance)
    wh.execute("INSERT INTO pos.sales_line_dlq SELECT range, 'bad store_id' FROM range(17)")
    clock.advance(minutes=5)
    tick = daemon.tick(SENSOR)
    (inc,) = records.incidents(instance)
    assert inc.gap_rows == 17 and "grew by 17 rows (0 → 17)" in inc.summary
    obs = volume_obs(instance, "store_sales_line")
    assert [(o["dagster/row_count"], o["dw/volume_status"], o.get("dw/volume_change")) for o in obs] == [
        (0, "insufficient_history", None), (17, "grew", 17)]
    assert obs[-1]["dw/volume_dead_letter"] is True
    # drained: fine; grows again while the first incident is open: recorded as grew, no second incident
    wh.execute("DELETE FROM pos.sales_line_dlq WHERE id < 10")
    clock.advance(minutes=5)
    daemon.tick(SENSOR)
    wh.execute("INSERT INTO pos.sales_line_dlq SELECT range, 'x' FROM range(3)")
    clock.advance(minutes=5)
    tick = daemon.tick(SENSOR)
    obs = volume_obs(instance, "store_sales_line")
    assert [(o["dagster/row_count"], o["dw/volume_status"], o["dw/volume_change"]) for o in obs[2:]] == [(7, "ok", -10), (10, "grew", 3)]
    assert len(records.incidents(instance)) == 1 and obs[-1]["dw/volume_open_incident"] == inc.id


def test_insufficient_history_is_an_explicit_status_not_a_pass_nor_an_incident(wh, instance):
    clock = Clock()
    sensor = build_volume_sensor(tables=[VolumeTable("pos.orders", "orders")], databases={"warehouse": wh},
                                 min_history=3, clock=clock)
    daemon = daemon_for(sensor, instance)
    grow_history(wh, daemon, clock, "pos.orders", [1000, 1002, 5])  # 5 would be "low" with history
    obs = volume_obs(instance, "orders")
    assert [(o["dw/volume_status"], o["dw/volume_baseline_n"]) for o in obs] == [
        ("insufficient_history", 0), ("insufficient_history", 1), ("insufficient_history", 2)]
    assert "dw/volume_mean" not in obs[-1]
    assert not records.incidents(instance)
    fill(wh, "pos.orders", 6)
    clock.advance(hours=1)
    daemon.tick(SENSOR)
    last = volume_obs(instance, "orders")[-1]
    assert (last["dw/volume_status"], last["dw/volume_baseline_n"], last["dw/volume_lower"]) == ("ok", 3, 0.0)


def test_an_always_empty_table_is_ok_not_no_rows(wh, instance):
    clock = Clock()
    wh.execute("CREATE TABLE pos.empty (id INT)")
    sensor = build_volume_sensor(tables=[VolumeTable("pos.empty", "empty")], databases={"warehouse": wh}, min_history=2,
                                 record_unchanged_every_seconds=3600, clock=clock)
    daemon = daemon_for(sensor, instance)
    for _ in range(4):
        daemon.tick(SENSOR)
        clock.advance(hours=1)
    assert [o["dw/volume_status"] for o in volume_obs(instance, "empty")] == ["insufficient_history"] * 2 + ["ok"] * 2
    assert not records.incidents(instance)


# -- recording policy --------------------------------------------------------------------------------


def test_unchanged_counts_are_recorded_once_a_day_not_every_tick(wh, instance):
    clock = Clock()
    fill(wh, "pos.stores", 300)
    sensor = build_volume_sensor(tables=[VolumeTable("pos.stores", "stores")], databases={"warehouse": wh}, clock=clock)
    daemon = daemon_for(sensor, instance)
    events = []
    for _ in range(26):  # hourly ticks for a day and an hour
        events.append(daemon.tick(SENSOR).asset_events)
        clock.advance(hours=1)
    assert sum(events) == 2 and events[0] == 1 and events[24] == 1
    assert [o["dagster/row_count"] for o in volume_obs(instance, "stores")] == [300, 300]


# -- the history lives in the observations --------------------------------------------------------


@pytest.mark.parametrize("source", ["the history store", "observations"])
@pytest.mark.parametrize("lost", ["missing", "garbage", "other process"])
def test_a_lost_cursor_rebuilds_the_history_from_the_store_or_observations(wh, instance, lost, source):
    clock = Clock()
    specs = [VolumeTable("pos.sales_line", "store_sales_line")]
    first = build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=5, clock=clock)
    daemon = daemon_for(first, instance)
    grow_history(wh, daemon, clock, "pos.sales_line", [1000, 1010, 995, 1003, 1020, 1001])
    # other observations on the same asset (an incident closed long ago, anything) do not disturb the history
    instance.report_runless_asset_event(dg.AssetObservation(asset_key=dg.AssetKey("store_sales_line"),
                                                            metadata={"dw/receipt_hash": "x"}))
    cursor = daemon.cursors[SENSOR]
    assert json.loads(cursor)["v"] == 1

    # a new sensor object (a restarted code server: nothing in memory), cursor lost or unreadable
    second = build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=5, clock=clock)
    daemon2 = daemon_for(second, instance)
    daemon2.cursors[SENSOR] = {"missing": None, "garbage": "{not json", "other process": cursor}[lost]
    if source == "observations":  # a deployment upgraded from before the store: its history is in the event log only
        with store_for(instance).engine.begin() as conn:
            conn.execute(sa.delete(history_t))
    fill(wh, "pos.sales_line", 100)
    clock.advance(hours=1)
    tick = daemon2.tick(SENSOR)
    n = (1, 0) if source == "the history store" else (0, 1)
    assert (f"rebuilt the history of 1 tables ({n[0]} from the history store, {n[1]} from observations; "
            "1 with earlier counts)") in tick.skip_reason
    assert ("Failed to interpret cursor '{not json'. Starting from scratch" in tick.skip_reason) == (lost == "garbage")
    last = volume_obs(instance, "store_sales_line")[-1]
    # scored against the five counts recorded before it, read back from the event log
    assert (last["dw/volume_status"], last["dw/volume_baseline_n"], last["dw/volume_change"]) == ("low", 6, -901)
    assert len(records.incidents(instance)) == 1
    assert json.loads(daemon2.cursors[SENSOR])["epoch"] != json.loads(cursor)["epoch"]
    stored = store_for(instance).load(["warehouse:pos.sales_line"])["warehouse:pos.sales_line"]
    assert [r for _, r in stored.entries] == [1000, 1010, 995, 1003, 1020, 1001, 100] and stored.last_status == "low"


def test_the_cursor_is_a_small_token_and_a_repeated_tick_reuses_its_snapshot(wh, instance):
    clock = Clock()
    wh.execute(";".join(f"CREATE TABLE pos.t{i} AS SELECT range AS id FROM range({10 + i})" for i in range(50)))
    sensor = build_volume_sensor(tables=[VolumeTable(f"pos.t{i}", f"t{i}") for i in range(50)], databases={"warehouse": wh},
                                 clock=clock)
    daemon = daemon_for(sensor, instance)
    daemon.tick(SENSOR)
    cursor = daemon.cursors[SENSOR]
    assert len(cursor) < 160  # its snapshot token, the tick's time and ids (this one's and its parent's)
    fill(wh, "pos.t3", 1)
    # the daemon failed to store a tick: it evaluates again with the previous cursor; no rebuild
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=daemon.defs, sensor_name=SENSOR)
    a = sensor.evaluate_tick(ctx)
    b = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=daemon.defs, sensor_name=SENSOR))
    # "at": when each ended; "writer": each evaluation's own id (its store rows name it)
    token = lambda c: {k: v for k, v in json.loads(c).items() if k not in ("at", "writer")}  # noqa: E731
    assert len(a.asset_events) == len(b.asset_events) == 1 and token(a.cursor) == token(b.cursor)
    assert "rebuilt" not in (a.skip_message or "") + (b.skip_message or "")


# -- failures never fail the tick -------------------------------------------------------------------


def test_a_missing_table_and_a_broken_warehouse_do_not_crash_the_tick(wh, tmp_path, instance):
    fill(wh, "pos.sales_line", 42)
    broken = DuckDBDatabase(tmp_path / "no" / "such" / "dir" / "w.duckdb")

    def unreachable():
        raise ConnectionError("warehouse is down")

    specs = [VolumeTable("pos.sales_line", "store_sales_line"), VolumeTable("pos.gone", "gone"),
             VolumeTable("pos.sales_line", "broken_copy", database="broken"),
             VolumeTable("pos.sales_line", "down_copy", database="down"),
             VolumeTable("pos.sales_line", "by_day", partition_column="no_such_column", partition="x")]
    sensor = build_volume_sensor(tables=specs, databases={"warehouse": wh, "broken": broken, "down": unreachable})
    tick = daemon_for(sensor, instance).tick(SENSOR)
    assert tick.asset_events == 1 and volume_obs(instance, "store_sales_line")[0]["dagster/row_count"] == 42
    r = tick.skip_reason
    assert "missing tables: warehouse:pos.gone" in r
    assert "warehouse 'broken' skipped this tick" in r and "warehouse 'down' skipped this tick: ConnectionError: warehouse is down" in r
    assert "not counted: warehouse:pos.sales_line#no_such_column:" in r
    assert not records.incidents(instance)


def test_a_failing_catalog_query_and_an_unexpected_error_never_raise(wh, instance):
    class Exploding:
        dialect = "duckdb"
        name = "exploding"

        def fetch_all(self, statement):
            raise MemoryError("boom")  # not a DatabaseError: still contained

    fill(wh, "pos.a", 3)
    sensor = build_volume_sensor(tables=[VolumeTable("pos.a", "a", database="exploding"), VolumeTable("pos.a", "b")],
                                 databases={"warehouse": wh, "exploding": Exploding()})
    tick = daemon_for(sensor, instance).tick(SENSOR)
    assert "warehouse 'exploding': catalog query failed: boom" in tick.skip_reason and tick.asset_events == 1

    def broken_clock():
        raise RuntimeError("clock stopped")

    sensor = build_volume_sensor(tables=[VolumeTable("pos.a", "a")], databases={"warehouse": wh}, clock=broken_clock)
    data = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor="kept"))
    assert data.skip_message == "tick failed: RuntimeError: clock stopped" and data.cursor == "kept"


# -- names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "pos.sales; DROP TABLE pos.sales", "pos.\"sales\"", "pos.sales' OR '1'='1", "pos.sales -- x", "pos./*x*/sales",
    "pos.sa`les", "pos.sa\\les", "pos.sa\nles", "a.b.c.d", "pos..sales", "", " pos.sales",
])
def test_hostile_table_names_are_refused_with_a_clear_error(name):
    with pytest.raises(sql.UnsafeIdentifierError, match="volume sensor"):
        VolumeTable(name, "x")


def test_hostile_columns_and_keys_are_refused():
    with pytest.raises(sql.UnsafeIdentifierError, match="partition column"):
        VolumeTable("pos.a", "a", partition_column="ts; DROP TABLE x")
    with pytest.raises(ValueError, match="resource key"):
        VolumeTable("pos.a", "a", database="ware-house")
    with pytest.raises(ValueError, match="partition given without partition_column"):
        VolumeTable("pos.a", "a", partition="2026-01-01")
    with pytest.raises(ValueError, match="duplicate"):
        build_volume_sensor(tables=[VolumeTable("pos.a", "a"), VolumeTable("pos.a", "b")])
    with pytest.raises(ValueError, match="min_history"):
        build_volume_sensor(tables=[VolumeTable("pos.a", "a")], min_history=30, history_length=28)


def test_names_with_blanks_and_case_are_quoted_and_found(wh):
    wh.execute('CREATE TABLE pos."Sales Line" AS SELECT range AS id FROM range(4)')
    found = fetch_row_counts(wh, [VolumeTable("pos.Sales Line", "x"), VolumeTable("POS.sales line", "y")])
    assert [c.rows for c in found.counts.values()] == [4, 4]


# -- partitions ---------------------------------------------------------------------------------------


def test_a_partitioned_spec_scores_one_day_against_the_other_days(wh, instance):
    clock = Clock(dt.datetime(2026, 3, 2, 6, 0, tzinfo=dt.timezone.utc))
    wh.execute("CREATE TABLE pos.sales_line (id BIGINT, sale_ts TIMESTAMP)")
    spec = VolumeTable("pos.sales_line", "store_sales_line", partition_column="sale_ts")  # default: yesterday
    sensor = build_volume_sensor(tables=[spec], databases={"warehouse": wh}, min_history=3, clock=clock)
    daemon = daemon_for(sensor, instance)
    for day, n in enumerate([200, 210, 190, 205, 60], start=1):  # 2026-03-01 .. 03-05
        wh.execute(f"INSERT INTO pos.sales_line SELECT range, TIMESTAMP '2026-03-{day:02d} 10:00:00' FROM range({n})")
        daemon.tick(SENSOR)
        clock.advance(days=1)
    obs = volume_obs(instance, "store_sales_line")
    assert [(o["dw/volume_partition"], o["dagster/row_count"], o["dw/volume_status"]) for o in obs] == [
        ("2026-03-01", 200, "insufficient_history"), ("2026-03-02", 210, "insufficient_history"),
        ("2026-03-03", 190, "insufficient_history"), ("2026-03-04", 205, "ok"), ("2026-03-05", 60, "low")]
    assert obs[-1]["dw/volume_source"] == "count(*) where partition"
    (inc,) = records.incidents(instance)
    assert "partition sale_ts = 2026-03-05" in inc.summary
    assert days_ago(0)(T0) == dt.date(2026, 3, 2)


# -- resources --------------------------------------------------------------------------------------


def test_the_warehouse_can_be_a_dagster_resource(tmp_path, instance):
    db = DuckDBDatabase(tmp_path / "w.duckdb")
    fill(db, "main_t", 9)
    sensor = build_volume_sensor(tables=[VolumeTable("main_t", "t", database="dwh")])
    assert sensor.required_resource_keys == {"dwh"}
    resource = DatabaseResource(url=f"duckdb:///{tmp_path / 'w.duckdb'}")
    # LocalSensorDaemon: build_sensor_context(definitions=...) (resources taken from the definitions)
    defs = dg.Definitions(sensors=[sensor], assets=[dg.AssetSpec(k) for k in watched_asset_keys(
        [VolumeTable("main_t", "t", database="dwh")])], resources={"dwh": resource})
    tick = LocalSensorDaemon(defs, instance).tick(SENSOR)
    assert tick.asset_events == 1, tick.skip_reason
    # the daemon's shape: the context carries the sensor's required resources
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), resources={"dwh": resource}) as ctx:
        data = sensor.evaluate_tick(ctx)
    assert len(data.asset_events) == 1 and data.asset_events[0].metadata["dagster/row_count"].value == 9


def test_the_code_server_path_builds_the_resources_itself(tmp_path, monkeypatch):
    """What the daemon asks a code server to run per tick (dagster._grpc.impl, internal API):
    resources are built from the definitions' top-level resources, EnvVar resolved there."""
    from dagster._grpc.impl import get_external_sensor_execution

    fill(DuckDBDatabase(tmp_path / "w.duckdb"), "t", 9)
    monkeypatch.setenv("DW_TEST_VOLUME_URL", f"duckdb:///{tmp_path / 'w.duckdb'}")
    sensor = build_volume_sensor(tables=[VolumeTable("t", "t", database="dwh")])
    defs = dg.Definitions(sensors=[sensor], resources={"dwh": DatabaseResource(url=dg.EnvVar("DW_TEST_VOLUME_URL"))})
    with dg.instance_for_test() as inst:
        data = get_external_sensor_execution(defs.get_repository_def(), None, inst.get_ref(), SENSOR,
                                             None, None, None, None, None)
        assert type(data).__name__ == "SensorExecutionData", data
        (event,) = data.asset_events
        assert event.metadata["dagster/row_count"].value == 9 and json.loads(data.cursor)["tick"] == 1
        again = get_external_sensor_execution(defs.get_repository_def(), None, inst.get_ref(), SENSOR,
                                              None, None, data.cursor, None, None)
        assert again.asset_events == [] and "1 unchanged" in again.skip_message
