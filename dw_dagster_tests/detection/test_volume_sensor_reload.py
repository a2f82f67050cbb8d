"""Issue 14 kind 12 in the volume sensor: a table truncated and reloaded between two ticks reads
empty for a moment. That reading opens no incident and never enters the baseline; a table that
stays empty is scored (and opens its incident) once a later tick confirms it."""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.core import records
from dw_dagster.databases import DuckDBDatabase
from dw_dagster.detection.volume import VolumeTable, build_volume_sensor
from dw_dagster.detection.volume.history import ROW_COUNT_KEY, VOLUME_TABLE_KEY
from dw_dagster.testing.local_daemon import LocalSensorDaemon

T0 = dt.datetime(2026, 3, 2, 6, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> dt.datetime:
        return self.t


def _world(tmp_path, rows_by_tick: list[int], seconds_between: float):
    db = DuckDBDatabase(tmp_path / "wh.duckdb")
    db.execute("CREATE SCHEMA app; CREATE TABLE app.orders (id BIGINT)")
    clock = Clock()
    sensor = build_volume_sensor(tables=[VolumeTable("app.orders", "orders")], databases={"warehouse": db},
                                 min_history=5, row_counts="count", clock=clock)
    instance = dg.DagsterInstance.ephemeral()
    daemon = LocalSensorDaemon(dg.Definitions(sensors=[sensor]), instance, log_level="WARNING")
    reasons = []
    for i, n in enumerate(rows_by_tick):
        db.execute(f"DELETE FROM app.orders; INSERT INTO app.orders SELECT range FROM range({n})")
        clock.t = T0 + dt.timedelta(seconds=seconds_between * i)
        reasons.append(daemon.tick("dw_volume_sensor").skip_reason or "")
    counts = [rec.asset_observation.metadata[ROW_COUNT_KEY].value
              for rec in records.iter_observations(instance, dg.AssetKey("orders"), newest_first=False)
              if VOLUME_TABLE_KEY in rec.asset_observation.metadata]
    return counts, records.incidents(instance), reasons


STEADY = [1000, 1010, 1020, 1030, 1040, 1050, 1060]


@pytest.mark.parametrize("reloaded", [1070, 1500])
def test_an_empty_reading_between_two_loads_opens_nothing_and_stays_out_of_the_baseline(tmp_path, reloaded):
    counts, incidents, reasons = _world(tmp_path, STEADY + [0, reloaded], seconds_between=60)
    assert 0 not in counts and counts[-1] == reloaded
    assert "read empty, not scored yet" in reasons[-2]
    assert (incidents == []) == (reloaded == 1070)  # a reload far above the band is still "high"


def test_a_table_that_stays_empty_is_scored_once_a_later_tick_confirms_it(tmp_path):
    counts, incidents, reasons = _world(tmp_path, STEADY + [0, 0, 0], seconds_between=60)
    assert "read empty" in reasons[-3] and "read empty" in reasons[-2]  # 0 s, 60 s after the first
    assert counts[-1] == 0 and len(incidents) == 1  # 120 s after: confirmed, scored, one incident
    assert "0 rows" in incidents[0].summary
