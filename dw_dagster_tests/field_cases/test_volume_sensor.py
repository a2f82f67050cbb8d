"""Field cases of the volume sensor's partition counts (:func:`~dw_dagster.detection.volume.counts.fetch_row_counts`,
what every tick of :func:`~dw_dagster.detection.volume.build_volume_sensor` runs): a partition
column that is an absolute time read in a session far from UTC, and partition columns named like
keywords; on DuckDB, PostgreSQL and MariaDB, against the count worked out in Python. The
ledger's batch of a tick's incidents, two ticks at once naming the same assets in opposite orders.
And the code server's garbage collector, which must not walk the whole process during a tick."""

import datetime as dt
import gc
import urllib.parse

import pytest

from dw_dagster.databases import SqlAlchemyDatabase
from dw_dagster.detection.volume.counts import VolumeTable, fetch_row_counts
from dw_dagster_tests.conftest import POSTGRES_URL
from dw_dagster_tests.core.test_ledger_incidents import _item, ledger  # noqa: F401 - the SQLite and PostgreSQL ledgers
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.field_cases.tables import load

C = "dw_dagster/detection/volume/counts.py"
KINDS = [
    kind("vol-partition-aware-session", "time", "the volume sensor's UTC-day partition count over a TIMESTAMPTZ "
         "column, read in a session far from UTC", "https://github.com/pgpartman/pg_partman/issues/36", C,
         "test_partition_count_of_an_aware_column_is_the_utc_day_in_any_session", True),
    kind("vol-incident-lock-order", "vendors", "two ticks recording incidents on the same assets at once, each "
         "taking PostgreSQL advisory locks in its own order, deadlock", "https://github.com/cyrilgdn/terraform-provider-postgresql/pull/640",
         "dw_dagster/core/ledger_incidents.py", "test_batches_naming_the_same_assets_in_opposite_orders_open_one_incident_each", True),
    kind("vol-tick-full-collection", "dependencies", "a large tick's live objects start full garbage collections "
         "that walk the whole serving process (stalls of 100-300 ms, found nothing to free)",
         "https://github.com/sgl-project/sglang/pull/9241", "dw_dagster/detection/volume/collector.py",
         "test_no_garbage_collection_runs_inside_a_tick", True),
    kind("vol-keyword-partition-column", "types", "a partition column named like a keyword (at, order) in the volume "
         "sensor's count", "https://github.com/sodadata/soda-core/issues/1022", C,
         "test_partition_columns_named_like_keywords_are_counted", True),
]

UTC = dt.timezone.utc
NOW = dt.datetime(2024, 3, 10, 12, 0, tzinfo=UTC)  # the default partition is yesterday: 2024-03-09 (UTC)
INSTANTS = [dt.datetime(2024, 3, 9, 0, 30, tzinfo=UTC), dt.datetime(2024, 3, 9, 23, 30, tzinfo=UTC),
            dt.datetime(2024, 3, 10, 2, 0, tzinfo=UTC), dt.datetime(2024, 3, 10, 3, 0, tzinfo=UTC),
            dt.datetime(2024, 3, 8, 23, 59, tzinfo=UTC)]


def _utc_day(day: dt.date) -> int:
    return sum(1 for t in INSTANTS if t.date() == day)


@pytest.mark.parametrize("zone", ["America/New_York", "Pacific/Kiritimati"])
def test_partition_count_of_an_aware_column_is_the_utc_day_in_any_session(pg, zone):
    """pg_partman #36 (https://github.com/pgpartman/pg_partman/issues/36): a day's bounds written
    as naive text (``ts >= '2014-10-01 00:00:00'``) against a ``timestamptz`` column are read in
    the session's time zone, so a run from another zone moves rows across the day. The volume
    sensor counted yesterday's partition with naive ``CAST(... AS TIMESTAMP)`` bounds: in a New
    York session 2024-03-09 "had" 3 rows (the evening of 03-09 UTC was cut off and the night of
    03-10 UTC taken). Right answer (Python, UTC days): 2 rows, in every session zone; a naive
    ``TIMESTAMP`` column holding UTC wall-clock times gives the same."""
    t = load(pg, "vol_aware", [("at_tz", "TIMESTAMPTZ"), ("at_naive", "TIMESTAMP")],
             [(i, i.replace(tzinfo=None)) for i in INSTANTS])
    far = SqlAlchemyDatabase(f"{POSTGRES_URL}?options={urllib.parse.quote('-c TimeZone=' + zone)}")
    try:
        specs = [VolumeTable(t, "vol_aware", partition_column="at_tz"),
                 VolumeTable(t, "vol_naive", partition_column="at_naive")]
        got = fetch_row_counts(far, specs, now=NOW, row_counts="count").counts
    finally:
        far.dispose()
    want = _utc_day(dt.date(2024, 3, 9))
    assert [(c.rows, c.partition, c.error) for c in got.values()] == [(want, "2024-03-09", None)] * 2
    assert want == 2


@pytest.mark.parametrize("engine", ["duck", "pg", "maria"], indirect=True)
def test_partition_columns_named_like_keywords_are_counted(engine):
    """soda-core #1022 (https://github.com/sodadata/soda-core/issues/1022): generated queries did
    not quote column names that are reserved words, and failed. The volume sensor sent
    ``WHERE at >= ...`` bare: DuckDB refused to parse it (``AT`` starts ``AT TIME ZONE``), so the
    partition was never counted (the tick reported an error for it, every tick). Right answer
    (Python): yesterday's rows, for a column named ``at`` and one named ``order``, on every engine."""
    ts = "TIMESTAMP NULL" if engine.name == "mariadb" else "TIMESTAMP"
    t = load(engine, "vol_kw", [("at", ts), ("order", ts)], [(i.replace(tzinfo=None),) * 2 for i in INSTANTS])
    specs = [VolumeTable(t, "vol_kw_at", partition_column="at"), VolumeTable(t, "vol_kw_order", partition_column="order")]
    got = fetch_row_counts(engine.db, specs, now=NOW, row_counts="count").counts
    want = _utc_day(dt.date(2024, 3, 9))
    assert [(c.rows, c.error) for c in got.values()] == [(want, None)] * 2


# -- the ledger's batch of a tick's incidents (record_incidents_unless_open) -------------------------


def test_batches_naming_the_same_assets_in_opposite_orders_open_one_incident_each(ledger, monkeypatch):  # noqa: F811
    """Two ticks (two replicas of a code location) record incidents on the same 40 assets at the same
    moment, each in its own order: no deadlock (PostgreSQL's asset locks are taken in one order),
    and one incident per asset between them. The failure kind, advisory locks taken in whatever order
    the rows came and two sessions deadlocking on shared members:
    https://github.com/cyrilgdn/terraform-provider-postgresql/pull/640 (and #639)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from dw_dagster.core.ledger_incidents import IncidentsMixin

    barrier = threading.Barrier(2, timeout=1.0)
    real = IncidentsMixin._open_incidents

    def look_then_wait(conn, asset_keys):
        found = real(conn, asset_keys)
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        return found

    monkeypatch.setattr(IncidentsMixin, "_open_incidents", staticmethod(look_then_wait))
    assets = [f"shop/t{i:02d}" for i in range(40)]

    def batch(k: int):
        order = assets if k == 0 else assets[::-1]
        return ledger.record_incidents_unless_open([_item(100 * k + i, a) for i, a in enumerate(order)])

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(batch, range(2))
    assert sum(ok for ok, _ in a + b) == len(assets)
    rows = ledger.incidents()
    assert sorted(r.asset_key for r in rows) == assets


def test_no_garbage_collection_runs_inside_a_tick(tmp_path, monkeypatch):
    """sglang #9241 (https://github.com/sgl-project/sglang/pull/9241) and ROCm/ATOM #1991
    (https://github.com/ROCm/ATOM/pull/1991): a serving process stalled
    100 ms to 1 s at a time in full collections over its whole heap that reclaimed nothing. The volume tick at
    50,000 tables started one on almost every tick (``volume_tick_50000``). With the collector set to run at
    every allocation, not one collection of any generation may start while a tick evaluates."""
    import dagster as dg

    from dw_dagster.databases import DuckDBDatabase
    from dw_dagster.detection.volume import build_volume_sensor
    from dw_dagster.detection.volume.tick import VolumeTicker

    db = DuckDBDatabase(tmp_path / "wh.duckdb")
    db.execute("CREATE SCHEMA pos")
    specs = []
    for i in range(3):
        db.execute(f"CREATE TABLE pos.t{i} AS SELECT range AS id FROM range({10 + i})")
        specs.append(VolumeTable(f"pos.t{i}", ["wh", f"pos_t{i}"], database="wh"))
    sensor = build_volume_sensor(tables=specs, databases={"wh": db}, name="vol_gc")
    inside, collections, original = [False], [], VolumeTicker._evaluate

    def spied(self, context):
        inside[0] = True
        try:
            return original(self, context)
        finally:
            inside[0] = False

    def seen(phase, info):
        if phase == "start" and inside[0]:
            collections.append(info["generation"])

    monkeypatch.setattr(VolumeTicker, "_evaluate", spied)
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.callbacks.append(seen)
    gc.enable()
    gc.set_threshold(1, 1, 1)
    try:
        result = sensor.evaluate_tick(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), sensor_name="vol_gc"))
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(seen)
        (gc.enable if enabled else gc.disable)()
    assert "3 recorded" in (result.skip_message or "")
    assert collections == [], f"{len(collections)} collections ran inside the tick"
