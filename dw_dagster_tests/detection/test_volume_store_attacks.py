"""Attacks on the volume sensor's row-count history store and its summary observations.

Each test names the promise it checks (store.py's module docstring, ``build_volume_sensor``'s
docstring, the README's "Watching the row counts of many tables"): a hand-edited store row, a
store write that fails (a SQLite write lock held by another process), a dropped store table, a
held-back summary observation, a spec id longer than the store's key column, two sensors sharing
a spec id, a "Test sensor" evaluation whose result is not stored.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import uuid

import dagster as dg
import pytest
import sqlalchemy as sa

from dw_dagster.core import records
from dw_dagster.core.ledger import ledger_for
from dw_dagster.detection.volume import VolumeTable, build_volume_sensor
from dw_dagster.detection.volume import store as store_mod
from dw_dagster.detection.volume.history import TableHistory
from dw_dagster.detection.volume.store import VolumeHistoryStore, history_t, store_for
from dw_dagster_tests.detection.test_volume_sensor import SENSOR, Clock, daemon_for, fill, volume_obs
from dw_dagster_tests.detection.test_volume_sensor import wh  # noqa: F401 - the DuckDB warehouse fixture

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _edit(engine, spec_id: str, **values) -> None:
    """Hand-edit one store row with raw SQL (as an operator with a SQL shell would: no type checks)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE dw_volume_history SET " + ", ".join(f"{k} = ?" for k in values)
                             + " WHERE spec_id = ?", (*values.values(), spec_id))


# -- hand-edited rows -------------------------------------------------------------------------


@pytest.mark.parametrize("values", [
    {"entries": "[[null, 1e400]]"},          # json reads it as float('inf'): int() raises OverflowError
    {"entries": "[[null, -5]]"},             # a negative row count
    {"entries": '{"12": 0}'},                # a JSON object, not a list of pairs
    {"entries": "[[null, 1.5]]"},            # not an integer count
    {"entries": "[[null, true]]"},           # a JSON boolean
    {"unobserved": "x"},                     # text in an integer column (SQLite keeps it)
    {"recorded_at": "abc"},                  # text in a float column
    {"observed_at": "yesterday"},
    {"entries": "[[null, 5, 6]]"},           # not a pair
], ids=lambda v: next(iter(v)) + "=" + str(next(iter(v.values()))))
def test_a_hand_edited_row_is_left_out_and_the_others_still_load(tmp_path, values):
    """store.load: "a row whose entries is not the JSON this module writes is left out too". One
    bad row made ``load`` raise (OverflowError, ValueError): every table of the sensor then lost
    its stored history and was rebuilt from the observations; a text ``recorded_at`` was returned
    as is and failed every later tick."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    st = VolumeHistoryStore(engine)
    good = TableHistory(entries=((None, 5), (None, 6)), recorded_at=100.0, observed_at=90.0, observed_status="ok",
                        unobserved=1, last_status="ok")
    st.save({"wh:bad": good, "wh:good": good})
    _edit(engine, "wh:bad", **values)
    assert st.load(["wh:bad", "wh:good"]) == {"wh:good": good}


def test_a_row_with_a_text_recorded_at_does_not_fail_every_tick(wh):
    """A tick never crashes: a store row holding text where a time belongs was handed to the
    scoring as is (``now - 'abc'``), so every tick failed and no table was scored any more."""
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable(f"pos.t{i}", f"t{i}") for i in range(2)]
    daemon = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock),
                        instance)
    for n in range(3):
        for i in range(2):
            fill(wh, f"pos.t{i}", 100 + n)
        clock.advance(hours=1)
        daemon.tick(SENSOR)
    _edit(store_for(instance).engine, "warehouse:pos.t0", recorded_at="abc")
    restarted = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock),
                           instance)
    for i in range(2):
        fill(wh, f"pos.t{i}", 5)  # a drop on both
    clock.advance(hours=1)
    tick = restarted.tick(SENSOR)
    assert "tick failed" not in (tick.skip_reason or "")
    assert volume_obs(instance, "t1")[-1]["dw/volume_status"] == "low"  # scored from its stored history
    assert volume_obs(instance, "t1")[-1]["dw/volume_baseline_n"] == 3
    assert volume_obs(instance, "t0")[-1]["dw/volume_status"] == "low"  # its history rebuilt from observations


# -- a store that cannot be written for a while -----------------------------------------------


def _sqlite_instance(tmp_path) -> dg.DagsterInstance:
    home = tmp_path / "home"
    home.mkdir()
    return dg.DagsterInstance.local_temp(str(home))


def test_counts_a_locked_store_did_not_take_are_written_on_a_later_tick(wh, tmp_path, monkeypatch):
    """store.py: "a restarted code server loses nothing". Another process held the ledger's SQLite
    write lock beyond the busy timeout during a tick: the tick logged "store not written", but the
    tables it changed were never written later (only tables changed again were), so a restart read
    a history without that tick's counts and recorded the same count a second time."""
    instance = _sqlite_instance(tmp_path)
    clock = Clock()
    specs = [VolumeTable(f"pos.t{i}", f"t{i}") for i in range(2)]
    engine = ledger_for(instance).engine
    monkeypatch.setattr(store_mod, "WRITE_WAIT_S", 0.2)
    daemon = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock),
                        instance)
    for n in range(3):
        for i in range(2):
            fill(wh, f"pos.t{i}", 100 + n)
        clock.advance(hours=1)
        daemon.tick(SENSOR)

    fill(wh, "pos.t0", 103)  # only t0 changes while the lock is held
    holder = sqlite3.connect(engine.url.database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        clock.advance(hours=1)
        locked = daemon.tick(SENSOR)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "row-count history store not written" in locked.skip_reason
    fill(wh, "pos.t1", 104)  # the next tick changes t1 only
    clock.advance(hours=1)
    daemon.tick(SENSOR)

    stored = store_for(instance).load(["warehouse:pos.t0"])["warehouse:pos.t0"]
    assert [r for _, r in stored.entries] == [100, 101, 102, 103]
    restarted = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock),
                           instance)
    clock.advance(minutes=5)
    restarted.tick(SENSOR)
    assert [o["dagster/row_count"] for o in volume_obs(instance, "t0")] == [100, 101, 102, 103]  # 103 once


def test_a_store_table_dropped_while_the_sensor_runs_is_created_again(wh):
    """The store's table, dropped while the code server runs (an operator's clean-up, a restore):
    every later tick failed to write ("no such table"), for as long as the process lived, because
    the table's creation is remembered per engine; a restart then lost every count since."""
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable("pos.t0", "t0")]
    daemon = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, clock=clock), instance)
    fill(wh, "pos.t0", 100)
    clock.advance(hours=1)
    daemon.tick(SENSOR)
    with store_for(instance).engine.begin() as conn:
        history_t.drop(conn)
    for n in (101, 102):
        fill(wh, "pos.t0", n)
        clock.advance(hours=1)
        tick = daemon.tick(SENSOR)
    assert "store not written" not in tick.skip_reason
    assert [r for _, r in store_for(instance).load(["warehouse:pos.t0"])["warehouse:pos.t0"].entries] == [100, 101, 102]


# -- summary observations ---------------------------------------------------------------------


def test_a_status_change_held_back_by_the_budget_is_shown_on_the_next_tick(wh):
    """build_volume_sensor(observations="summary"): status changes "at most max_observations_per_tick
    ... per tick ...; the others wait for the next tick". A held-back status change of a table whose
    count did not change again was only shown a day later (with the daily count): for a day the
    asset page showed the old status - an anomaly an open incident covers included."""
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable(f"pos.t{i}", f"t{i}") for i in range(3)]
    daemon = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2,
                                            observations="summary", max_observations_per_tick=1, clock=clock),
                        instance)
    for n in (100, 101, 102):  # the third count is the first scored: insufficient_history -> ok
        for i in range(3):
            fill(wh, f"pos.t{i}", n)
        clock.advance(minutes=5)
        daemon.tick(SENSOR)
        for _ in range(3):  # unchanged ticks: the first-sight counts get their turn
            clock.advance(minutes=5)
            daemon.tick(SENSOR)
    # the budget holds back two of the three changes to "ok"; the next two (unchanged) ticks show them
    statuses = [[o["dw/volume_status"] for o in volume_obs(instance, f"t{i}")] for i in range(3)]
    assert all(s[-1] == "ok" for s in statuses), statuses


# -- spec ids and the store's key -------------------------------------------------------------


def test_a_spec_id_longer_than_the_store_key_is_refused_when_declared():
    """spec_id is VARCHAR(1024) in the store; VolumeTable accepted a longer id (3 name parts and a
    partition column of 255 characters each), and on PostgreSQL the tick's one upsert transaction
    then failed on every tick: no table of the sensor was written to the store any more."""
    long = ".".join(["a" * 255, "b" * 255, "c" * 255])
    with pytest.raises(ValueError, match="1024"):
        VolumeTable(long, "x", partition_column="d" * 255)


def test_the_longest_spec_id_fits_the_postgresql_store():
    schema = f"dw_att_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_URL)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    eng = sa.create_engine(PG_URL, connect_args={"options": f"-csearch_path={schema}"})
    try:
        long = ".".join(["a" * 255, "b" * 255, "c" * 255])
        spec = VolumeTable(long, "x", partition_column="d" * (1024 - len("warehouse:") - len(long) - 1))
        assert len(spec.id) == 1024
        st = VolumeHistoryStore(eng)
        h = TableHistory(entries=((None, 1),), recorded_at=1.0)
        st.save({spec.id: h, "warehouse:pos.t0": h})
        assert set(st.load([spec.id, "warehouse:pos.t0"])) == {spec.id, "warehouse:pos.t0"}
    finally:
        eng.dispose()
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


def test_two_sensors_watching_one_table_keep_their_own_histories(wh):
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    spec = [VolumeTable("pos.t0", "t0")]

    def two():
        return (daemon_for(build_volume_sensor(tables=spec, databases={"warehouse": wh}, name="long_history",
                                               history_length=28, min_history=3, clock=clock), instance),
                daemon_for(build_volume_sensor(tables=spec, databases={"warehouse": wh}, name="short_history",
                                               history_length=3, min_history=3, clock=clock), instance))

    long_d, short_d = two()
    for n in range(8):
        fill(wh, "pos.t0", 1000 + n)
        clock.advance(hours=1)
        long_d.tick("long_history")
        short_d.tick("short_history")
    long_d, short_d = two()  # both code servers restart
    fill(wh, "pos.t0", 1008)
    clock.advance(hours=1)
    long_d.tick("long_history")
    last = [o for o in volume_obs(instance, "t0") if o["dagster/row_count"] == 1008]
    assert last[0]["dw/volume_baseline_n"] == 8  # the long sensor's 8 earlier counts, not the short one's 3


# -- a "Test sensor" evaluation: evaluated, its result not stored ------------------------------


def _dry_run(daemon, sensor_name: str) -> None:
    """What the UI's "Test sensor" does: evaluate with the current cursor, store nothing."""
    sensor = daemon.defs.resolve_sensor_def(sensor_name)
    sensor.evaluate_tick(dg.build_sensor_context(instance=daemon.instance, cursor=daemon.cursors.get(sensor_name),
                                                 definitions=daemon.defs, sensor_name=sensor_name))


def test_a_dry_run_before_a_restart_loses_no_observation(wh):
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable("pos.t0", "t0")]
    daemon = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock),
                        instance)
    for n in (100, 101, 102):
        fill(wh, "pos.t0", n)
        clock.advance(hours=1)
        daemon.tick(SENSOR)
    fill(wh, "pos.t0", 103)
    clock.advance(hours=1)
    _dry_run(daemon, SENSOR)
    restarted = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock),
                           instance)
    restarted.cursors = dict(daemon.cursors)  # the daemon's stored cursor: the dry run did not change it
    clock.advance(minutes=5)
    restarted.tick(SENSOR)
    assert [o["dagster/row_count"] for o in volume_obs(instance, "t0")] == [100, 101, 102, 103]


def test_a_dry_run_does_not_swallow_the_incident_observation(wh):
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable("pos.t0", "t0")]
    daemon = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock),
                        instance)
    for n in (1000, 1001, 1002):
        fill(wh, "pos.t0", n)
        clock.advance(hours=1)
        daemon.tick(SENSOR)
    fill(wh, "pos.t0", 10)
    clock.advance(hours=1)
    _dry_run(daemon, SENSOR)
    clock.advance(minutes=5)
    tick = daemon.tick(SENSOR)
    assert len(records.incidents(instance)) == 1
    assert any("dw/incident" in e.metadata for e in tick.events)


# -- two processes ticking at once ------------------------------------------------------------


def test_two_processes_ticking_at_once_open_one_incident(wh, monkeypatch):
    import dw_dagster.detection.volume.tick as sensor_mod

    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable("pos.t0", "t0")]
    a = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock), instance)
    for n in (1000, 1001, 1002):
        fill(wh, "pos.t0", n)
        clock.advance(hours=1)
        a.tick(SENSOR)
    clock_b = Clock(clock.t)
    b = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock_b), instance)
    b.cursors = dict(a.cursors)  # a second replica of the code location: same stored cursor, its own process
    fill(wh, "pos.t0", 10)
    clock.advance(hours=1)
    clock_b.t = clock.t + dt.timedelta(seconds=1)
    real, raced = sensor_mod.record_all_unless_open, []

    def race_then_record(instance_, incs):
        if not raced:  # process A has scored the drop; process B ticks to the end before A records
            raced.append(True)
            b.tick(SENSOR)
        return real(instance_, incs)

    monkeypatch.setattr(sensor_mod, "record_all_unless_open", race_then_record)
    a.tick(SENSOR)
    assert raced and len(records.incidents(instance)) == 1


# -- the PostgreSQL path: a dagster-postgres instance -----------------------------------------


@pytest.fixture
def pg_instance():
    from dw_dagster_tests.harness.dagster_dev import postgres_database

    with postgres_database("postgresql://postgres@127.0.0.1:5432") as url:
        url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
        with dg.instance_for_test(overrides={"storage": {"postgres": {"postgres_url": url}}}) as instance:
            yield instance
            ledger_for(instance).engine.dispose()


def test_on_postgresql_a_dropped_store_and_a_hand_edited_row_lose_nothing(wh, pg_instance):
    instance, clock = pg_instance, Clock()
    specs = [VolumeTable(f"pos.t{i}", f"t{i}") for i in range(2)]

    def sensor():
        return daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, clock=clock),
                          instance)

    daemon = sensor()
    for n in range(2):
        for i in range(2):
            fill(wh, f"pos.t{i}", 100 + n)
        clock.advance(hours=1)
        daemon.tick(SENSOR)
    st = store_for(instance)
    assert st.engine.dialect.name == "postgresql"
    with st.engine.begin() as conn:
        history_t.drop(conn)
    for i in range(2):
        fill(wh, f"pos.t{i}", 102)
    clock.advance(hours=1)
    assert "store not written" not in daemon.tick(SENSOR).skip_reason
    with st.engine.begin() as conn:
        conn.execute(sa.update(history_t).where(history_t.c.spec_id == "warehouse:pos.t0").values(entries="[[null, -3]]"))
    restarted = sensor()
    for i in range(2):
        fill(wh, f"pos.t{i}", 5)
    clock.advance(hours=1)
    tick = restarted.tick(SENSOR)
    assert "the row of warehouse:pos.t0 is left out" in tick.skip_reason
    assert [volume_obs(instance, f"t{i}")[-1]["dw/volume_status"] for i in range(2)] == ["low", "low"]
    assert volume_obs(instance, "t1")[-1]["dw/volume_baseline_n"] == 3  # the drop lost nothing: written again whole


def test_on_postgresql_a_store_row_locked_by_another_process_does_not_hang_the_tick(wh, pg_instance, monkeypatch):
    """A tick never hangs past the daemon's sensor timeout (60 s): another session holding a lock on
    a store row (a long transaction, a hand edit left open) made the tick's upsert wait for as long
    as the lock was held - PostgreSQL has no lock timeout by default."""
    import threading
    import time

    instance, clock = pg_instance, Clock()
    monkeypatch.setattr(store_mod, "WRITE_WAIT_S", 1.0)
    specs = [VolumeTable("pos.t0", "t0")]
    daemon = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, clock=clock), instance)
    fill(wh, "pos.t0", 100)
    clock.advance(hours=1)
    daemon.tick(SENSOR)
    engine = store_for(instance).engine
    holder = engine.connect()
    tx = holder.begin()
    holder.execute(sa.select(history_t).where(history_t.c.spec_id == "warehouse:pos.t0").with_for_update())
    release = threading.Timer(40, tx.rollback)
    release.start()
    try:
        fill(wh, "pos.t0", 101)
        clock.advance(hours=1)
        t0 = time.monotonic()
        tick = daemon.tick(SENSOR)
        waited = time.monotonic() - t0
    finally:
        release.cancel()
        if tx.is_active:
            tx.rollback()
        holder.close()
    assert waited < 10, waited
    assert "row-count history store not written" in tick.skip_reason
    clock.advance(minutes=5)
    daemon.tick(SENSOR)  # the lock is gone: the count the locked tick recorded is written now
    assert [r for _, r in store_for(instance).load(["warehouse:pos.t0"])["warehouse:pos.t0"].entries] == [100, 101]


# -- attacks that held (kept as tests) --------------------------------------------------------


def test_a_restart_in_summary_mode_scores_against_every_recorded_count_not_only_the_shown_ones(wh):
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable("pos.t0", "t0")]

    def sensor():
        return daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=3,
                                              observations="summary", clock=clock), instance)

    daemon = sensor()
    for n in (1000, 1001, 1002, 1003, 1004):
        fill(wh, "pos.t0", n)
        clock.advance(minutes=5)
        daemon.tick(SENSOR)
    assert len(volume_obs(instance, "t0")) == 2  # first sight and the change to "ok" (1003); 1001, 1002 and 1004 not shown
    restarted = sensor()  # a new code server, and the cursor lost
    fill(wh, "pos.t0", 10)
    clock.advance(minutes=5)
    assert "1 from the history store" in restarted.tick(SENSOR).skip_reason
    last = volume_obs(instance, "t0")[-1]
    assert (last["dw/volume_status"], last["dw/volume_baseline_n"], last["dw/volume_unobserved_counts"]) == ("low", 5, 1)
    assert len(records.incidents(instance)) == 1


def test_a_hand_edited_row_with_a_huge_history_is_cut_back_to_history_length(wh):
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable("pos.t0", "t0")]
    store_for(instance).save({"warehouse:pos.t0": TableHistory(entries=tuple((None, 1000 + i % 3) for i in range(100_000)),
                                                               recorded_at=clock().timestamp(), last_status="ok")})
    daemon = daemon_for(build_volume_sensor(tables=specs, databases={"warehouse": wh}, history_length=5, min_history=3,
                                            clock=clock), instance)
    fill(wh, "pos.t0", 1001)
    clock.advance(hours=1)
    daemon.tick(SENSOR)
    assert volume_obs(instance, "t0")[-1]["dw/volume_baseline_n"] == 5
    assert len(store_for(instance).load(["warehouse:pos.t0"])["warehouse:pos.t0"].entries) == 5
