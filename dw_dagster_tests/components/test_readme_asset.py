"""The adoption page's "Your asset, for incremental_load" snippets (docs/snippets/adopt/pipeline_sales.yaml
and adopt/sales_asset.py), run as written: its pipeline file and its
asset load a two-partition range in one run (as a repair's window run does) from a DuckDB source
into a DuckDB warehouse, and record the loads the diagnosis reads."""

from pathlib import Path

import dagster as dg
import duckdb

from dw_dagster import DatabaseResource

SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets"


def _snippets() -> tuple[str, str]:
    return (SNIPPETS / "adopt/pipeline_sales.yaml").read_text(), (SNIPPETS / "adopt/sales_asset.py").read_text()


def test_the_documented_asset_loads_a_partition_range_in_one_run(tmp_path, monkeypatch):
    yaml_block, py_block = _snippets()
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "sales.yaml").write_text(yaml_block)
    with duckdb.connect(str(tmp_path / "source.duckdb")) as con:
        con.execute("CREATE SCHEMA src")
        con.execute("CREATE TABLE src.sales (id INTEGER, region VARCHAR, sale_ts TIMESTAMP, posted_ts TIMESTAMP, "
                    "amount DECIMAL(12,2))")
        con.execute("INSERT INTO src.sales SELECT i, ['N','S'][i % 2 + 1], TIMESTAMP '2026-11-01' + INTERVAL (i) HOUR, "
                    "TIMESTAMP '2026-11-01' + INTERVAL (i) HOUR, 1.5 FROM range(72) t(i)")
    with duckdb.connect(str(tmp_path / "warehouse.duckdb")) as con:
        con.execute("CREATE SCHEMA wh")
        con.execute("CREATE TABLE wh.sales (id INTEGER, region VARCHAR, sale_ts TIMESTAMP, posted_ts TIMESTAMP, "
                    "amount DECIMAL(12,2))")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(py_block, "adopt/sales_asset.py", "exec"), scope)  # noqa: S102 - the docs' own code
    result = dg.materialize(
        [scope["sales"]], partition_key=None,
        tags={"dagster/asset_partition_range_start": "2026-11-01", "dagster/asset_partition_range_end": "2026-11-02"},
        resources={"source": DatabaseResource(url=f"duckdb:///{tmp_path / 'source.duckdb'}"),
                   "warehouse": DatabaseResource(url=f"duckdb:///{tmp_path / 'warehouse.duckdb'}")})
    assert result.success
    with duckdb.connect(str(tmp_path / "warehouse.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM wh.sales").fetchone()[0] == 48  # two days of the three
    mats = result.asset_materializations_for_node("sales")  # one per partition of the range
    assert sorted(m.partition for m in mats) == ["2026-11-01", "2026-11-02"]
    assert all("dw/loads" in m.metadata for m in mats)
