"""The volume sensor's row-count history store and the summary observations (issue 15, item 1).

The store is one row per watched table in the ledger's database, bounded by ``history_length``;
``observations="summary"`` shows anomalies always, status changes and a daily count within a
per-tick budget; a rebuild reads the store, and the event log only for tables the store lacks.
"""

from __future__ import annotations

import uuid

import dagster as dg
import pytest
import sqlalchemy as sa

from dw_dagster.core import records
from dw_dagster.detection.volume import VolumeTable, build_volume_sensor
from dw_dagster.detection.volume import store as store_mod
from dw_dagster.detection.volume.history import TableHistory
from dw_dagster.detection.volume.store import VolumeHistoryStore, history_t, store_for
from dw_dagster_tests.detection.test_volume_sensor import SENSOR, Clock, daemon_for, fill, volume_obs
from dw_dagster_tests.detection.test_volume_sensor import wh  # noqa: F401 - the DuckDB warehouse fixture

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request, tmp_path):
    if request.param == "sqlite":
        yield sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
        return
    schema = f"dw_store_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_URL)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    eng = sa.create_engine(PG_URL, connect_args={"options": f"-csearch_path={schema}"})
    yield eng
    eng.dispose()
    with admin.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
    admin.dispose()


def test_the_store_round_trips_histories_and_upserts_in_place(engine):
    st = VolumeHistoryStore(engine)
    hs = {f"wh:s.t{i}": TableHistory(entries=((None, i), (None, i + 1)), recorded_at=100.0 + i, observed_at=50.0,
                                      observed_status="ok", unobserved=i, last_status="ok") for i in range(2500)}
    hs["wh:s.p#ts"] = TableHistory(entries=(("2026-03-01", 5), ("2026-03-02", 7)), recorded_at=9.0, last_status="low")
    assert st.save(hs) == 2501
    assert st.load(hs) == hs
    again = {"wh:s.t7": TableHistory(entries=((None, 8), (None, 9), (None, 1)), recorded_at=200.0, last_status="low")}
    st.save(again)
    got = st.load(["wh:s.t7", "wh:s.t8", "wh:nope"])
    assert got == {"wh:s.t7": again["wh:s.t7"], "wh:s.t8": hs["wh:s.t8"]}
    rows, size = st.size()
    assert rows == 2501 and 0 < size < 2501 * 40


def test_a_malformed_row_is_left_out_not_a_crash(engine):
    st = VolumeHistoryStore(engine)
    st.save({"wh:a": TableHistory(entries=((None, 1),), recorded_at=1.0), "wh:b": TableHistory(entries=((None, 2),), recorded_at=1.0)})
    with engine.begin() as conn:
        conn.execute(sa.update(history_t).where(history_t.c.spec_id == "wh:a").values(entries="{not json"))
    assert list(st.load(["wh:a", "wh:b"])) == ["wh:b"]


def test_rows_written_after_the_last_kept_tick_are_read_as_their_previous_history(engine):
    """A tick whose result Dagster did not keep (a "Test sensor" evaluation) wrote the store: a
    rebuild told when the last kept tick ended reads such a row as the history its tick started
    from, or leaves it out when that tick started from none; rows of other sensors are not read."""
    import time

    st, notes = VolumeHistoryStore(engine, "east"), []
    h0 = TableHistory(entries=((None, 5),), recorded_at=1.0, observed_at=1.0, observed_status="ok", last_status="ok")
    st.save({"wh:a": h0, "wh:b": h0})
    kept_until = time.time()
    time.sleep(0.01)
    h1 = TableHistory(entries=((None, 5), (None, 6)), recorded_at=2.0, observed_at=2.0, observed_status="ok",
                      last_status="ok")
    st.save({"wh:a": h1, "wh:new": h1}, previous={"wh:a": h0, "wh:new": None})
    VolumeHistoryStore(engine, "west").save({"wh:a": h1, "wh:west_only": h1})
    assert st.load(["wh:a", "wh:b", "wh:new", "wh:west_only"]) == {"wh:a": h1, "wh:b": h0, "wh:new": h1}
    got = st.load(["wh:a", "wh:b", "wh:new", "wh:west_only"], notes.append, kept_until=kept_until)
    assert got == {"wh:a": h0, "wh:b": h0}
    assert notes and "2 tables were last written by a tick whose result was not kept" in notes[0]
    with pytest.raises(ValueError, match="1 to 128 characters"):
        VolumeHistoryStore(engine, "x" * 129)


def test_rows_of_a_tick_a_later_cursor_never_named_are_read_by_who_wrote_them(engine, monkeypatch):
    """Each row names its writer (a tick) and the tick that one started from; a tick's cursor marks the tick it
    comes from as kept. The sensor's rebuild with a cursor reads only marked writers' rows as written; without
    one, also a row whose tick started from a marked one with no sibling marked; a reader, every row but those
    of a tick whose sibling was marked. No clock is compared (two hosts' clocks may disagree). Marks no row
    names any more are pruned."""
    st = VolumeHistoryStore(engine, "east")
    h = lambda *n: TableHistory(entries=tuple((None, x) for x in n), recorded_at=1.0, last_status="ok")  # noqa: E731
    st.save({"wh:a": h(1), "wh:b": h(1)}, writer="aa01", parent=None)  # the first tick
    st.save({"wh:a": h(1, 2)}, previous={"wh:a": h(1)}, writer="dd01", parent=None)  # a "Test sensor" before it
    st.mark_kept("aa01", None)  # the second tick's cursor named the first
    assert st.load(["wh:a", "wh:b"], reader="cursor") == {"wh:a": h(1), "wh:b": h(1)}
    assert st.load(["wh:a", "wh:b"], reader="no_cursor") == {"wh:a": h(1), "wh:b": h(1)}
    st.save({"wh:b": h(1, 3)}, previous={"wh:b": h(1)}, writer="bb01", parent="aa01")  # the second tick, not yet named
    st.save({"wh:a": h(1, 4)}, previous={"wh:a": h(1)}, writer="dd02", parent="bb01")  # a dry run from its cursor
    assert st.load(["wh:a", "wh:b"], reader="cursor") == {"wh:a": h(1), "wh:b": h(1)}  # neither confirmed
    assert st.load(["wh:a", "wh:b"], reader="no_cursor") == {"wh:a": h(1), "wh:b": h(1, 3)}
    assert st.load(["wh:a", "wh:b"]) == {"wh:a": h(1, 4), "wh:b": h(1, 3)}  # a reader: the newest rows
    st.mark_kept("bb01", "aa01")
    st.save({"wh:b": h(1, 3, 5)}, previous={"wh:b": h(1, 3)}, writer="cc01", parent="bb01")  # a sibling of dd02
    st.mark_kept("cc01", "bb01")
    for reader in ("latest", "cursor", "no_cursor"):  # dd02's sibling was kept: dd02 was thrown away
        assert st.load(["wh:a", "wh:b"], reader=reader) == {"wh:a": h(1), "wh:b": h(1, 3, 5)}, reader
    with pytest.raises(ValueError, match="reader must be"):
        st.load(["wh:a"], reader="all")
    monkeypatch.setattr(store_mod, "PRUNE_EVERY", 1)
    st.save({"wh:a": h(1, 6)}, previous={"wh:a": h(1)}, writer="ee01", parent="cc01")
    st.mark_kept("ee01", "cc01")  # no row needs aa01 any more; bb01 started cc01's row
    with engine.connect() as conn:
        left = sorted(conn.execute(sa.select(store_mod.kept_t.c.writer)).scalars())
    assert left == ["bb01", "cc01", "ee01"]
    assert st.load(["wh:a", "wh:b"], reader="cursor") == {"wh:a": h(1, 6), "wh:b": h(1, 3, 5)}


def test_the_store_stays_bounded_whatever_the_number_of_ticks(wh):
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable(f"pos.t{i}", f"t{i}") for i in range(3)]
    sensor = build_volume_sensor(tables=specs, databases={"warehouse": wh}, history_length=5, min_history=3, clock=clock)
    daemon = daemon_for(sensor, instance)
    for n in range(30):
        for i in range(3):
            fill(wh, f"pos.t{i}", 1000 + (n % 4) + i)
        clock.advance(hours=1)
        daemon.tick(SENSOR)
    st = store_for(instance)
    got = st.load([s.id for s in specs])
    assert st.size()[0] == 3 and all(len(h.entries) == 5 for h in got.values())
    assert [r for _, r in got["warehouse:pos.t0"].entries] == [1001, 1002, 1003, 1000, 1001]


def test_summary_observations_show_anomalies_status_changes_and_a_daily_count_within_a_budget(wh):
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable(f"pos.t{i}", f"t{i}") for i in range(5)]
    for i in range(5):
        fill(wh, f"pos.t{i}", 100 + i)
    sensor = build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=2, observations="summary",
                                 max_observations_per_tick=2, record_unchanged_every_seconds=86_400, clock=clock)
    daemon = daemon_for(sensor, instance)

    def shown() -> dict[str, list[dict]]:
        return {f"t{i}": volume_obs(instance, f"t{i}") for i in range(5)}

    # first sight: 5 counts recorded, 2 shown per tick; the rest wait (unchanged counts are shown later)
    first = daemon.tick(SENSOR)
    assert first.asset_events == 2 and "3 summary observations wait for the next tick" in first.skip_reason
    clock.advance(minutes=5)
    assert daemon.tick(SENSOR).asset_events == 2
    clock.advance(minutes=5)
    assert daemon.tick(SENSOR).asset_events == 1
    clock.advance(minutes=5)
    assert daemon.tick(SENSOR).asset_events == 0
    obs = shown()
    assert all(len(v) == 1 and v[0]["dw/volume_status"] == "insufficient_history" for v in obs.values())
    # the three that waited were recorded at first sight and shown later as that same count
    assert sorted(v[0]["dw/volume_source"] for v in obs.values()).count("unchanged") == 3

    # counts change every tick: recorded (the store has them), shown only when the status changes
    for n in range(1, 4):
        for i in range(5):
            fill(wh, f"pos.t{i}", 100 + i + n)
        clock.advance(minutes=5)
        daemon.tick(SENSOR)
    obs = shown()
    assert [o["dw/volume_status"] for o in obs["t0"]] == ["insufficient_history", "ok"]
    assert obs["t0"][-1]["dw/volume_unobserved_counts"] == 1  # the second count (still insufficient) was not shown
    assert len(store_for(instance).load(["warehouse:pos.t0"])["warehouse:pos.t0"].entries) == 4

    # an anomaly is always shown, with its incident, whatever the budget
    for i in range(5):
        fill(wh, f"pos.t{i}", 10 if i < 3 else 104 + i)
    clock.advance(minutes=5)
    tick = daemon.tick(SENSOR)
    assert sum(1 for v in shown().values() if v[-1]["dw/volume_status"] == "low") == 3
    assert len(records.incidents(instance)) == 3 and tick.asset_events >= 6

    # a day later every table is recorded and shown again, with how many counts were recorded and not shown
    before = {k: len(v) for k, v in shown().items()}
    clock.advance(hours=24)
    for _ in range(3):
        daemon.tick(SENSOR)
        clock.advance(minutes=5)
    obs = shown()
    assert all(len(obs[k]) == before[k] + 1 for k in obs)
    assert (obs["t4"][-1]["dw/volume_status"], obs["t4"][-1]["dw/volume_unobserved_counts"],
            obs["t4"][-1]["dagster/row_count"]) == ("ok", 1, 108)  # t4's change to ok waited a tick; 108 was not shown


def test_every_count_is_shown_up_to_a_thousand_tables_by_default(wh):
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    sensor = build_volume_sensor(tables=[VolumeTable("pos.t0", "t0")], databases={"warehouse": wh}, clock=clock)
    daemon = daemon_for(sensor, instance)
    for n in range(4):
        fill(wh, "pos.t0", 100 + n)
        clock.advance(minutes=5)
        daemon.tick(SENSOR)
    assert len(volume_obs(instance, "t0")) == 4 and "dw/volume_unobserved_counts" not in volume_obs(instance, "t0")[0]
    with pytest.raises(ValueError, match="observations must be"):
        build_volume_sensor(tables=[VolumeTable("pos.t0", "t0")], observations="some")
    with pytest.raises(ValueError, match="max_observations_per_tick"):
        build_volume_sensor(tables=[VolumeTable("pos.t0", "t0")], max_observations_per_tick=0)


def test_an_upgrade_reads_the_event_log_history_tick_by_tick_and_scores_nothing_unread(wh, monkeypatch):
    """A deployment from before the store: its history is in the observations only. The rebuild
    reads it within a time budget per tick; a table not read yet is not scored (no wrong baseline)."""
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    specs = [VolumeTable(f"pos.t{i}", f"t{i}") for i in range(3)]
    old = build_volume_sensor(tables=specs, databases={"warehouse": wh}, min_history=3, clock=clock)
    daemon = daemon_for(old, instance)
    for n in range(4):
        for i in range(3):
            fill(wh, f"pos.t{i}", 1000 + n)
        clock.advance(hours=1)
        daemon.tick(SENSOR)
    with store_for(instance).engine.begin() as conn:
        conn.execute(sa.delete(history_t))  # as it was before the store existed

    monkeypatch.setattr(store_mod, "REBUILD_BUDGET_S", 0.0)  # one asset per tick
    new = build_volume_sensor(tables=specs + [VolumeTable("pos.never", "never")], databases={"warehouse": wh},
                              min_history=3, clock=clock)
    daemon2 = daemon_for(new, instance)
    fill(wh, "pos.never", 5)
    for i in range(3):
        fill(wh, f"pos.t{i}", 10)  # a drop: must be scored against the old history, never against nothing
    clock.advance(hours=1)
    first = daemon2.tick(SENSOR)
    assert "(0 from the history store, 1 from observations; 1 with earlier counts)" in first.skip_reason
    assert "2 of 3 tables wait for their history from observations" in first.skip_reason  # pos.never had no events
    assert volume_obs(instance, "t0")[-1]["dw/volume_status"] == "low"
    assert len(volume_obs(instance, "t1")) == 4 and len(volume_obs(instance, "t2")) == 4  # not scored yet
    clock.advance(minutes=5)
    assert "1 still wait" in daemon2.tick(SENSOR).skip_reason
    clock.advance(minutes=5)
    daemon2.tick(SENSOR)
    assert [volume_obs(instance, f"t{i}")[-1]["dw/volume_status"] for i in range(3)] == ["low", "low", "low"]
    assert volume_obs(instance, "t1")[-1]["dw/volume_baseline_n"] == 4
    assert len(store_for(instance).load([s.id for s in specs])) == 3


def test_the_tick_summary_keeps_its_notes_when_a_diagnosis_job_is_named(wh):
    """The re-diagnosis step returned its evidence observations under the name of the tick's notes,
    so a rebuild's note (and the summary budget's) vanished from the skip reason."""
    from dw_dagster.diagnosis.job import build_diagnosis_job
    from dw_dagster_tests.detection.test_volume_sensor import _diagnoser

    instance = dg.DagsterInstance.ephemeral()
    fill(wh, "pos.t0", 10)
    job = build_diagnosis_job(diagnoser=_diagnoser)
    sensor = build_volume_sensor(tables=[VolumeTable("pos.t0", "t0")], databases={"warehouse": wh},
                                 diagnosis_job_name=job.name, clock=Clock())
    tick = daemon_for(sensor, instance, job).tick(SENSOR)
    assert "no cursor: rebuilt the history of 1 tables" in tick.skip_reason
