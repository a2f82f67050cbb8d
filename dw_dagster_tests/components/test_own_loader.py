"""An asset that loads by its own code (no ``load_partition``, no pipeline file of dw_dagster's shape)
and records each load with ``dw_dagster.load_metadata``: the loop from a failing reconciliation
check to a verified receipt (``pipeline: recorded_load``).

The asset merges a day of ``src.sales`` into ``wh.sales`` with DuckDB's ``INSERT OR REPLACE`` on
its primary key, reading rows above the high-watermark it takes from the target. It reads its
watermark column and lookback from a settings file of its own (``config/sales_load.yaml``); the
fix dw_dagster proposes is a diff of those two lines, and the repair reruns the day holding the
late rows.
"""

from __future__ import annotations

import datetime as dt
import os
import textwrap
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import yaml

from dw_dagster_tests.components.loop import (
    approve_merge_and_repair, check_results, forget_project_modules, load_defs, write_project)
from dw_dagster_tests.components.test_component import DAY1, DAY2, OWNER, _insert, _rows, idp  # noqa: F401 (fixture)

ASSET_PY = '''\
import datetime as dt
import os
from pathlib import Path

import dagster as dg
import duckdb
import yaml

from dw_dagster import LoadResult, load_metadata

SETTINGS = Path(__file__).resolve().parents[4] / "config" / "sales_load.yaml"
DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-04")
COLUMNS = ["id", "region", "sale_ts", "posted_ts", "amount"]


@dg.asset(key=["sales"], deps=[dg.AssetKey(["src", "sales"])], partitions_def=DAILY,
          backfill_policy=dg.BackfillPolicy.single_run())
def sales(context: dg.AssetExecutionContext):
    """Our own loader: rows of each day above the high-watermark, merged on id."""
    settings = yaml.safe_load(SETTINGS.read_text())
    wm, lookback = settings["watermark_column"], float(settings["lookback_hours"])
    assert wm in COLUMNS
    results = []
    with duckdb.connect(os.environ["SALES_WAREHOUSE"]) as wh:
        wh.execute("CREATE SCHEMA IF NOT EXISTS wh")
        wh.execute("CREATE TABLE IF NOT EXISTS wh.sales (id BIGINT PRIMARY KEY, region VARCHAR, sale_ts TIMESTAMP, "
                   "posted_ts TIMESTAMP, amount DECIMAL(18,2))")
        for pk in context.partition_keys:
            tw = DAILY.time_window_for_partition_key(pk)
            start, end = tw.start.replace(tzinfo=None), tw.end.replace(tzinfo=None)
            hwm = wh.execute(f'SELECT max("{wm}") FROM wh.sales').fetchall()[0][0]
            low = hwm - dt.timedelta(hours=lookback) if hwm is not None else None
            with duckdb.connect(os.environ["SALES_SOURCE"], read_only=True) as src:
                snapshot = src.execute("SELECT max(posted_ts) FROM src.sales").fetchall()[0][0]
                query = "SELECT id, region, sale_ts, posted_ts, amount FROM src.sales WHERE sale_ts >= ? AND sale_ts < ?"
                params = [start, end]
                if low is not None:
                    query += f' AND "{wm}" > ?'
                    params.append(low)
                batch = src.execute(query, params).to_arrow_table()
            wh.register("batch", batch)
            wh.execute("INSERT OR REPLACE INTO wh.sales SELECT * FROM batch")
            wh.unregister("batch")
            results.append(LoadResult(partition_key=pk, partition_start=start, partition_end=end, watermark_column=wm,
                                      watermark_low=low, lookback_hours=lookback, source_snapshot_ts=snapshot,
                                      rows_read=batch.num_rows))
    return dg.MaterializeResult(metadata=load_metadata(results))
'''

SETTINGS = """\
# read by the sales asset at run time
watermark_column: sale_ts   # the column compared with the high-watermark
lookback_hours: 0
"""


def defs_yaml(issuer: str) -> str:
    return textwrap.dedent(f"""\
        type: dw_dagster.DataOpsComponent
        attributes:
          domains:
            domains:
              - name: sales
                assets: [[sales]]
                approvers: [{OWNER}]
            identity:
              oidc: {{issuer: "{issuer}", audience: dw-dagster}}
          databases:
            source: {{url: "duckdb:///{{{{ env.SALES_SOURCE }}}}"}}
            warehouse: {{url: "duckdb:///{{{{ env.SALES_WAREHOUSE }}}}"}}
          assets:
            - key: sales
              table: wh.sales
              database: warehouse
              checks:
                reconciliation:
                  source: {{database: source, table: src.sales, asset: src/sales}}
                  slice_by: [region]
                  measures: [amount]
              pipeline:
                recorded_load:
                  source_database: source
                  source_table: src.sales
                  key: id
                  partition_column: sale_ts
                  arrival_column: posted_ts
                  repo: ../../../..
                  settings_file: config/sales_load.yaml
        """)


@pytest.fixture
def project(tmp_path, monkeypatch, idp):  # noqa: F811
    monkeypatch.setenv("SALES_SOURCE", str(tmp_path / "source.duckdb"))
    monkeypatch.setenv("SALES_WAREHOUSE", str(tmp_path / "warehouse.duckdb"))
    root = write_project(tmp_path / "shop", {
        "src/shop_data/defs/sales/assets.py": ASSET_PY,
        "src/shop_data/defs/dataops/defs.yaml": defs_yaml(idp.url),
        "config/sales_load.yaml": SETTINGS,
    })
    monkeypatch.syspath_prepend(str(root / "src"))
    yield root
    forget_project_modules()


def test_an_asset_with_its_own_loader_goes_from_a_failing_check_to_a_verified_receipt(project, idp, tmp_path):  # noqa: F811
    from dw_dagster import records, verify_receipts
    from dw_dagster.core.domains import Domains

    src = Path(os.environ["SALES_SOURCE"])
    _insert(src, _rows(DAY1, 1, 40, "east") + _rows(DAY2, 100, 40, "east"))
    defs = load_defs(project)
    sales = dg.AssetKey("sales")
    (tmp_path / "dagster_home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster_home")) as instance:
        job = defs.resolve_implicit_global_asset_job_def()
        for day in ("2026-11-01", "2026-11-02"):
            assert job.execute_in_process(instance=instance, partition_key=day, asset_selection=[sales]).success
        # six rows of 2 November reach the source 30 hours late, behind the watermark the loads passed
        _insert(src, _rows(DAY2 + dt.timedelta(hours=3), 500, 6, "west", posted_delay=dt.timedelta(hours=30)))
        _insert(src, _rows(DAY2 + dt.timedelta(days=1), 200, 40, "east"))
        assert job.execute_in_process(instance=instance, partition_key="2026-11-03", asset_selection=[sales]).success
        assert check_results(defs, instance, "reconciliation") == [False]

        domains = Domains.model_validate(yaml.safe_load(defs_yaml(idp.url))["attributes"]["domains"])
        cs, stages = approve_merge_and_repair(defs, instance, idp, domains, project, asset=sales)

        (diagnosis,) = records.diagnoses(instance, [sales])
        late = diagnosis.primary
        assert late.kind == "late_rows_behind_watermark"
        assert (late.explained_rows, late.details["late_rows"], late.details["max_delay_hours"]) == (6, 6, 30.0)
        assert late.details["watermark_column"] == "sale_ts" and late.window == ["2026-11-02"]
        assert cs.window == ["2026-11-02"]
        assert "-watermark_column: sale_ts" in cs.diff and "+watermark_column: posted_ts" in cs.diff
        assert "+lookback_hours: 48" in cs.diff
        settings = yaml.safe_load((project / "config" / "sales_load.yaml").read_text())
        assert settings == {"watermark_column": "posted_ts", "lookback_hours": 48}

        assert stages[-1] == "receipt" and "window-1" in stages and "verify" in stages, stages
        n, problems = verify_receipts(instance)
        assert n >= 1 and not problems, problems
        (receipt,) = records.receipts(instance, sales)
        assert receipt.verified and receipt.partitions == ["2026-11-02"]
        with duckdb.connect(os.environ["SALES_WAREHOUSE"], read_only=True) as wh:
            assert wh.execute("SELECT count(*), count(DISTINCT id) FROM wh.sales WHERE region = 'west'").fetchone() == (6, 6)
        assert check_results(defs, instance, "reconciliation") == [True]


def test_a_recorded_load_names_the_settings_line_it_cannot_change(tmp_path):
    from dw_dagster import DwConfigError, build_dw_definitions

    (tmp_path / "repo" / "config").mkdir(parents=True)
    (tmp_path / "repo" / "config" / "s.yaml").write_text("watermark_column: sale_ts\n")
    cfg = yaml.safe_load(defs_yaml("http://127.0.0.1:1"))["attributes"]
    cfg["assets"][0]["pipeline"]["recorded_load"].update(repo="repo", settings_file="config/s.yaml")
    with pytest.raises(DwConfigError, match=r"recorded_load.settings_file: .*s.yaml has no top-level line for lookback_hours"):
        build_dw_definitions(cfg, base_dir=tmp_path)
    cfg["assets"][0]["pipeline"]["recorded_load"]["settings_file"] = "config/missing.yaml"
    with pytest.raises(DwConfigError, match=r"recorded_load.settings_file: .*missing.yaml does not exist"):
        build_dw_definitions(cfg, base_dir=tmp_path)
