"""The volume tick pauses Python's cyclic garbage collector while it runs, and gives it back as it found it.

At 50,000 tables a tick keeps three objects a table until it ends, enough to start a full collection on most
ticks (0.3-0.6 s walking the whole code server on the 2-core machine; ``volume_tick_50000`` in
``bench_results.json``). These tests hold the rules the pause must keep in a code server that runs other
things beside the sensor: enabled again when the tick ends, even when it raises; left disabled when the
process had disabled it; and two sensors ticking at once in one process share the pause, so the first to
end does not resume collection under the second. The field case (no collection starts inside a tick;
sglang #9241) is ``field_cases/test_volume_sensor.py::test_no_garbage_collection_runs_inside_a_tick``.
"""

import gc
import threading

import dagster as dg
import pytest

from dw_dagster.databases import DuckDBDatabase
from dw_dagster.detection.volume import VolumeTable, build_volume_sensor
from dw_dagster.detection.volume.tick import VolumeTicker


@pytest.fixture
def wh(tmp_path):
    db = DuckDBDatabase(tmp_path / "warehouse.duckdb")
    db.execute("CREATE SCHEMA pos")
    db.execute("CREATE TABLE pos.orders AS SELECT range AS id FROM range(40)")
    return db


@pytest.fixture(autouse=True)
def _collector_enabled_after():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def _sensor(name: str, db_factory):
    return build_volume_sensor(tables=[VolumeTable("pos.orders", ["wh", "pos_orders"], database="wh")],
                               databases={"wh": db_factory}, name=name)


def _tick(sensor, instance):
    return sensor.evaluate_tick(dg.build_sensor_context(instance=instance, sensor_name=sensor.name))


def test_a_tick_counts_with_the_collector_paused_and_gives_it_back(wh):
    seen = []

    def db():
        seen.append(gc.isenabled())
        return wh

    gc.enable()
    result = _tick(_sensor("vol_a", db), dg.DagsterInstance.ephemeral())
    assert seen == [False]
    assert gc.isenabled()
    assert "1 recorded" in (result.skip_message or "")


def test_a_collector_the_process_had_disabled_stays_disabled(wh):
    gc.disable()
    _tick(_sensor("vol_a", lambda: wh), dg.DagsterInstance.ephemeral())
    assert not gc.isenabled()


def test_a_tick_that_raises_gives_the_collector_back(wh, monkeypatch):
    def broken(self, context):
        assert not gc.isenabled()
        raise RuntimeError("unexpected")

    monkeypatch.setattr(VolumeTicker, "_evaluate", broken)
    gc.enable()
    result = _tick(_sensor("vol_a", lambda: wh), dg.DagsterInstance.ephemeral())
    assert "tick failed: RuntimeError: unexpected" in (result.skip_message or "")
    assert gc.isenabled()


def test_two_sensors_ticking_at_once_share_the_pause(wh, tmp_path):
    """A's tick holds in its count while B's tick runs to its end: B must not resume the collector under A."""
    other = DuckDBDatabase(tmp_path / "other.duckdb")
    other.execute("CREATE SCHEMA pos")
    other.execute("CREATE TABLE pos.orders AS SELECT range AS id FROM range(7)")
    inside, release, during_a = threading.Event(), threading.Event(), []

    def held():
        inside.set()
        assert release.wait(30)
        during_a.append(gc.isenabled())
        return wh

    gc.enable()
    instance = dg.DagsterInstance.ephemeral()
    errors = []

    def run_a():
        try:
            _tick(_sensor("vol_a", held), instance)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    a = threading.Thread(target=run_a)
    a.start()
    try:
        assert inside.wait(30)
        _tick(_sensor("vol_b", lambda: other), instance)
        assert not gc.isenabled(), "B's tick ended and resumed the collector while A's tick was still running"
    finally:
        release.set()
        a.join(60)
    assert not errors and during_a == [False]
    assert gc.isenabled()


def test_ticks_that_keep_overlapping_still_collect_their_cyclic_garbage(monkeypatch):
    """Many sensors in one code server whose ticks overlap without end would never resume the collector (found by
    attacking the pause: 1.8 GB of cycles in 3 s from another thread). Past MAX_PAUSE_S, a tick that ends while
    another runs collects the young generations, and the other keeps the pause."""
    import weakref

    from dw_dagster.detection.volume import collector

    class Node:
        pass

    monkeypatch.setattr(collector, "MAX_PAUSE_S", 0.0)
    gc.enable()
    with collector.collector_paused():
        with collector.collector_paused():
            node = Node()
            node.me = node
            ref = weakref.ref(node)
            del node
            assert ref() is not None  # paused: the cycle waits
        assert ref() is None, "a tick ending past MAX_PAUSE_S while another runs did not collect the pause's cycles"
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_process_forked_during_a_tick_starts_with_the_collector_on():
    """A child forked while a tick runs (multiprocessing's fork) runs no tick: it must not inherit the pause."""
    import os

    from dw_dagster.detection.volume import collector

    gc.enable()
    read, write = os.pipe()
    with collector.collector_paused():
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once
            os.write(write, f"{gc.isenabled()} {collector._gc_pausers}".encode())
            os._exit(0)
        os.waitpid(pid, 0)
    os.close(write)
    assert os.read(read, 100) == b"True 0"
    os.close(read)
