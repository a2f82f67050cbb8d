"""``dw-dagster volume-history``: the volume sensor's stored row counts, read from the instance."""

from __future__ import annotations

import json

import dagster as dg
from click.testing import CliRunner

from dw_dagster.cli.main import main
from dw_dagster.detection.volume.history import TableHistory
from dw_dagster.detection.volume.store import store_for


def test_volume_history_lists_the_stored_counts_and_finds_tables_by_part_of_their_id(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        store_for(instance).save({
            "warehouse:pos.sales_line": TableHistory(entries=tuple((None, 1000 + i) for i in range(12)),
                                                     recorded_at=1_780_000_000.0, last_status="ok"),
            "warehouse:pos.sales_line#sale_ts": TableHistory(entries=(("2026-11-30", 40), ("2026-12-01", 4)),
                                                             recorded_at=1_780_000_000.0, last_status="low"),
            "warehouse:pos.stores_100%": TableHistory(entries=((None, 7),), recorded_at=1.0, last_status="ok"),
        })
    run = CliRunner().invoke(main, ["volume-history", "SALES_LINE", "--dagster-home", str(home)])
    assert run.exit_code == 0, run.output
    assert ("warehouse:pos.sales_line  ok  last recorded 2026-05-28T20:26Z  (sensor dw_volume_sensor)\n"
            "    2 earlier, 1,002, 1,003") in run.output
    assert "warehouse:pos.sales_line#sale_ts  low" in run.output and "2026-12-01: 4" in run.output
    assert "stores" not in run.output
    js = json.loads(CliRunner().invoke(main, ["volume-history", "100%", "--json", "--dagster-home", str(home)]).output)
    assert js == [{"sensor": "dw_volume_sensor", "table": "warehouse:pos.stores_100%", "counts": [{"partition": None, "rows": 7}],
                   "recorded_at": 1.0, "last_status": "ok", "observed_at": None, "unobserved_counts": 0}]
    assert "no recorded counts for a table matching '_x'" in CliRunner().invoke(
        main, ["volume-history", "_x", "--dagster-home", str(home)]).output  # "_" is not a wildcard


def test_a_table_two_sensors_watch_is_listed_once_per_sensor(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        store_for(instance, "east_volume").save({"warehouse:pos.t": TableHistory(entries=((None, 5),), recorded_at=1.0)})
        store_for(instance, "west_volume").save({"warehouse:pos.t": TableHistory(entries=((None, 9),), recorded_at=1.0)})
    js = json.loads(CliRunner().invoke(main, ["volume-history", "pos.t", "--json", "--dagster-home", str(home)]).output)
    assert [(r["sensor"], r["counts"][0]["rows"]) for r in js] == [("east_volume", 5), ("west_volume", 9)]
