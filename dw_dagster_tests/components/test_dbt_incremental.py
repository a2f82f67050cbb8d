"""A dbt incremental model (``@dbt_assets``, dbt-duckdb): the loop from a failing reconciliation check
to a verified receipt (``pipeline: dbt_incremental``).

A fresh ``dg`` project holds a dbt project whose model ``fct_sales`` is materialized
``incremental`` and reads ``where sale_ts > (select max(sale_ts) from {{ this }})``, with a
downstream table ``sales_by_region``. Its ``@dbt_assets`` function builds through
``dw_dagster.dbt_incremental_build``, which records each run's high-watermark and the source's
newest arrival. Six rows of 2 November reach the source 30 hours late: the next run reads above
the high-watermark and never sees them. The diagnosis finds them behind the watermark of the run
responsible for them; the change set rewrites the model (read by ``posted_ts`` with a 48 h
lookback, a bounded-rebuild clause, ``unique_key``) and rebuilds 2 November with
``dbt build --select fct_sales --vars``; the receipt verifies.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import yaml

from dw_dagster_tests.components.loop import (
    approve_merge_and_repair, check_results, forget_project_modules, load_defs, write_project)
from dw_dagster_tests.components.test_component import DAY1, DAY2, OWNER, _rows, idp  # noqa: F401 (fixture)

DBT = Path(sys.executable).parent / "dbt"

MODEL = """\
{{ config(materialized='incremental') }}

select id, region, sale_ts, posted_ts, amount
from {{ source('src', 'sales') }}
{% if is_incremental() %}
where sale_ts > (select max(sale_ts) from {{ this }})
{% endif %}
"""

FILES = {
    ".gitignore": "dbt_project/target/\ndbt_project/logs/\n",
    "dbt_project/dbt_project.yml": textwrap.dedent("""\
        name: shop
        version: "1.0.0"
        config-version: 2
        profile: shop
        model-paths: ["models"]
        """),
    "dbt_project/profiles.yml": textwrap.dedent("""\
        shop:
          target: dev
          outputs:
            dev:
              type: duckdb
              path: "{{ env_var('SHOP_WAREHOUSE') }}"
              schema: main
              threads: 1
        """),
    "dbt_project/models/sources.yml": "version: 2\nsources:\n  - name: src\n    schema: src\n    tables:\n      - name: sales\n",
    "dbt_project/models/fct_sales.sql": MODEL,
    "dbt_project/models/sales_by_region.sql": ("{{ config(materialized='table') }}\n"
                                               "select region, count(*) as n from {{ ref('fct_sales') }} group by region\n"),
    "src/shop_data/defs/dbt/assets.py": textwrap.dedent(f'''\
        from pathlib import Path

        import dagster as dg
        from dagster_dbt import DbtCliResource, DbtProject, dbt_assets

        from dw_dagster import DatabaseResource, dbt_incremental_build

        PROJECT = DbtProject(project_dir=Path(__file__).resolve().parents[4] / "dbt_project")


        @dbt_assets(manifest=PROJECT.manifest_path, project=PROJECT)
        def shop_dbt(context: dg.AssetExecutionContext, dbt: DbtCliResource, warehouse: DatabaseResource):
            yield from dbt_incremental_build(context, dbt, database=warehouse.get_database(),
                                             arrival_columns={{"fct_sales": "posted_ts"}})


        @dg.definitions
        def defs():
            dbt = DbtCliResource(project_dir=PROJECT, dbt_executable={str(DBT)!r})
            return dg.Definitions(assets=[shop_dbt], resources={{"dbt": dbt}})
        '''),
}


def defs_yaml(issuer: str) -> str:
    return textwrap.dedent(f"""\
        type: dw_dagster.DataOpsComponent
        attributes:
          domains:
            domains:
              - name: sales
                assets: [[fct_sales]]
                approvers: [{OWNER}]
            identity:
              oidc: {{issuer: "{issuer}", audience: dw-dagster}}
          databases:
            warehouse: {{url: "duckdb:///{{{{ env.SHOP_WAREHOUSE }}}}"}}
          assets:
            - key: fct_sales
              table: main.fct_sales
              database: warehouse
              checks:
                reconciliation:
                  source: {{database: warehouse, table: src.sales, asset: src/sales}}
                  slice_by: [region]
                  measures: [amount]
              pipeline:
                dbt_incremental: {{dbt_model: fct_sales, arrival_column: posted_ts, key: id, repo: ../../../..}}
          dbt: {{project_dir: ../../../../dbt_project}}
        """)


def _insert(rows) -> None:
    with duckdb.connect(os.environ["SHOP_WAREHOUSE"]) as con:
        con.execute("CREATE SCHEMA IF NOT EXISTS src")
        con.execute("CREATE TABLE IF NOT EXISTS src.sales (id BIGINT, region VARCHAR, sale_ts TIMESTAMP, "
                    "posted_ts TIMESTAMP, amount DECIMAL(18,2))")
        con.executemany("INSERT INTO src.sales VALUES (?, ?, ?, ?, ?)", rows)


def _query(q: str) -> list[tuple]:
    with duckdb.connect(os.environ["SHOP_WAREHOUSE"], read_only=True) as con:
        return con.execute(q).fetchall()


@pytest.fixture
def project(tmp_path, monkeypatch, idp):  # noqa: F811
    monkeypatch.setenv("SHOP_WAREHOUSE", str(tmp_path / "warehouse.duckdb"))
    root = write_project(tmp_path / "shop", {**FILES, "src/shop_data/defs/dataops/defs.yaml": defs_yaml(idp.url)})
    subprocess.run([str(DBT), "parse", "--quiet"], cwd=root / "dbt_project", check=True, capture_output=True,
                   env={**os.environ, "DBT_PROFILES_DIR": str(root / "dbt_project")})
    monkeypatch.syspath_prepend(str(root / "src"))
    yield root
    forget_project_modules()


@pytest.mark.skipif(not DBT.exists(), reason="dbt is not installed next to this Python")
def test_a_dbt_incremental_model_goes_from_a_failing_check_to_a_verified_receipt(project, idp, tmp_path):  # noqa: F811
    from dw_dagster import records, verify_receipts
    from dw_dagster.core.domains import Domains
    from dw_dagster.pipelines.dbt_incremental import INCREMENTAL_RUN_KEY

    _insert(_rows(DAY1, 1, 40, "east") + _rows(DAY2, 100, 40, "east"))
    defs = load_defs(project)
    fct = dg.AssetKey("fct_sales")
    (tmp_path / "dagster_home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster_home")) as instance:
        job = defs.resolve_implicit_global_asset_job_def()
        build = [fct, dg.AssetKey("sales_by_region")]
        assert job.execute_in_process(instance=instance, asset_selection=build).success
        # six rows of 2 November reach the source 30 hours late; then 3 November's rows arrive
        _insert(_rows(DAY2 + dt.timedelta(hours=3), 500, 6, "west", posted_delay=dt.timedelta(hours=30)))
        _insert(_rows(DAY2 + dt.timedelta(days=1), 200, 40, "east"))
        assert job.execute_in_process(instance=instance, asset_selection=build).success
        assert _query("SELECT count(*) FROM main.fct_sales WHERE region = 'west'") == [(0,)]
        runs = [records.metadata_json(r.asset_materialization.metadata, INCREMENTAL_RUN_KEY)
                for r in records.iter_materializations(instance, fct, newest_first=False)]
        assert [r["watermark_low"] for r in runs] == [None, "2026-11-02T19:30:00"]
        assert check_results(defs, instance, "reconciliation") == [False]

        def nothing_before_the_merge(cs):
            assert (project / "dbt_project" / "models" / "fct_sales.sql").read_text() == MODEL

        domains = Domains.model_validate(yaml.safe_load(defs_yaml(idp.url))["attributes"]["domains"])
        cs, stages = approve_merge_and_repair(defs, instance, idp, domains, project, asset=fct,
                                              before_merge=nothing_before_the_merge)

        (diagnosis,) = records.diagnoses(instance, [fct])
        late = diagnosis.primary
        assert late.kind == "late_rows_behind_watermark"
        assert (late.explained_rows, late.details["late_rows"], late.details["max_delay_hours"]) == (6, 6, 30.0)
        assert late.details["high_watermark"] == "2026-11-02 19:30:00" and late.window == ["2026-11-02"]
        assert cs.window == [] and [s.kind for s in cs.steps] == ["dbt_window"]
        assert cs.steps[0].spec["days"] == ["2026-11-02"]
        assert cs.steps[0].sql == ["dbt build --select fct_sales --vars '{\"dw_window_start\": \"2026-11-02 00:00:00\", "
                                   "\"dw_window_end\": \"2026-11-03 00:00:00\"}'"]
        assert cs.rebuild_assets == [["sales_by_region"]]
        assert "+{{ config(unique_key='id', materialized='incremental') }}" in cs.diff
        assert "+    posted_ts > (SELECT MAX(posted_ts) - INTERVAL '48' HOUR FROM {{ this }})" in cs.diff
        assert "-where sale_ts > (select max(sale_ts) from {{ this }})" in cs.diff

        assert stages == ["snapshot", "dbt_window-1", "rebuild", "verify", "receipt"], stages
        n, problems = verify_receipts(instance)
        assert n >= 1 and not problems, problems
        receipt = records.receipts(instance, fct)[0]
        assert receipt.verified, receipt
        assert _query("SELECT count(*), count(DISTINCT id) FROM main.fct_sales WHERE region = 'west'") == [(6, 6)]
        assert _query("SELECT n FROM main.sales_by_region WHERE region = 'west'") == [(6,)]
        rebuilt = records.metadata_json(next(records.iter_materializations(instance, fct)).asset_materialization.metadata,
                                        INCREMENTAL_RUN_KEY)
        assert (rebuilt["window_start"], rebuilt["watermark_column"]) == ("2026-11-02T00:00:00", "posted_ts")

        # the merged model keeps running: an ordinary run re-reads its lookback and merges, no duplicate
        assert job.execute_in_process(instance=instance, asset_selection=build).success
        assert _query("SELECT count(*) - count(DISTINCT id) FROM main.fct_sales") == [(0,)]
        assert check_results(defs, instance, "reconciliation") == [True]
