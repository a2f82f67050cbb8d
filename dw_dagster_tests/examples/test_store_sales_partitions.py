"""``dw-dagster demo store-sales --partitions``: the home says how the load is partitioned, and the
code location Dagster loads on that home follows it (the full hourly and weekly demos run the whole
loop to a verified receipt; they take minutes, so this checks the wiring only)."""

import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster_examples.store_sales import home as h
from dw_dagster_examples.store_sales.definitions import partitions_for


def test_the_home_chooses_the_partitions(tmp_path):
    assert partitions_for(tmp_path) is partitions_for(tmp_path / "other")  # daily without a file
    h.set_partitions_shape(tmp_path, "hourly")
    hourly = partitions_for(tmp_path)
    assert isinstance(hourly, dg.HourlyPartitionsDefinition) and len(hourly.get_partition_keys()) == 28 * 24
    h.set_partitions_shape(tmp_path, "weekly")
    weekly = partitions_for(tmp_path).get_partition_keys()
    assert weekly[3] == "2026-11-21"  # the week of the two offline days, closed before the stores came back
    with pytest.raises(ValueError, match="unknown partitions 'minutely'"):
        h.set_partitions_shape(tmp_path, "minutely")
    (tmp_path / "partitions").write_text("yearly\n")
    with pytest.raises(ValueError, match="says 'yearly'"):
        partitions_for(tmp_path)


def test_the_cli_names_the_shapes(tmp_path):
    dw = str(Path(sys.executable).parent / "dw-dagster")
    bad = subprocess.run([dw, "demo", "store-sales", "--partitions", "minutely", "--workdir", str(tmp_path)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "'minutely' is not one of 'daily', 'hourly', 'weekly'" in bad.stderr
