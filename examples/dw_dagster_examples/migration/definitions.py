"""The migration code location: the warehouse's loaders of the ten POS tables, and the dw_dagster loop.

What is the example's own is here: nine full-copy loaders (``warehouse/<table>``, one asset each,
one multi-asset) and the incremental load of ``warehouse/sales_line`` by high-watermark (daily
partitions of ``sale_ts``, the loader whose watermark misses back-dated lines). The migration —
two waves of five pairs, their parity checks, the wave assets and the gate — and the rest of the
loop are one :func:`dw_dagster.build_dw_definitions` call on ``dataops.yaml`` next to this file.
Everything lives under ``$DW_MIGRATION_HOME``; the source is ``$DW_MIGRATION_SOURCE_URL`` (a DuckDB
file in the home by default, or the PostgreSQL server on loopback).
"""

import datetime as dt
import json
import os
import shutil
import subprocess
from pathlib import Path

import dagster as dg

from dw_dagster import DatabaseResource, PipelineRepoResource, build_dw_definitions, load_metadata, load_partition
from dw_dagster.databases import DuckDBDatabase
from dw_dagster.core.windows import partition_window_utc
from dw_dagster_examples.migration import generator as gen

PACKAGE_DIR = Path(__file__).resolve().parent
CONFIG = PACKAGE_DIR / "dataops.yaml"
HOME_ENV = "DW_MIGRATION_HOME"
SOURCE_URL_ENV = "DW_MIGRATION_SOURCE_URL"
PIPELINE_FILE = "pipelines/sales_line.yaml"
GROUP = "pos_warehouse"
SALES = dg.AssetKey(["warehouse", "sales_line"])
COPIED = [t for t in gen.DDL if t != "sales_line"]


def home_dir() -> Path:
    """``$DW_MIGRATION_HOME``, else ``.dw_demo/migration`` in the repository (or the working directory)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).resolve()
    repo = PACKAGE_DIR.parents[3]
    root = repo if (repo / "workspace.yaml").exists() else Path.cwd()
    return (root / ".dw_demo" / "migration").resolve()


def warehouse_path(home: Path) -> Path:
    return home / "data" / "warehouse.duckdb"


def source_url(home: Path) -> str:
    return os.environ.get(SOURCE_URL_ENV) or f"duckdb:///{home / 'data' / 'pos_source.duckdb'}"


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=dw-demo", "-c", "user.email=dw-demo@localhost", *args], cwd=root, check=True,
                   capture_output=True)


def ensure_home(home: Path, day0: dt.date | None = None) -> Path:
    """The pipeline working copy (git, with the sales-line pipeline file), the domains file and the
    sale days (``data/days.json``, written once so every reload partitions the same days)."""
    repo = home / "repo"
    if not (repo / ".git").exists():
        (repo / "pipelines").mkdir(parents=True, exist_ok=True)
        shutil.copy(PACKAGE_DIR / PIPELINE_FILE, repo / PIPELINE_FILE)
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "POS loaders as deployed")
    (home / "data").mkdir(parents=True, exist_ok=True)
    if not (home / "domains.yaml").exists():
        shutil.copy(PACKAGE_DIR / "domains.yaml", home / "domains.yaml")
    days = home / "data" / "days.json"
    if not days.exists():
        days.write_text(json.dumps({"first_day": (day0 or gen.first_day()).isoformat()}))
    return home


def sale_days(home: Path) -> dg.DailyPartitionsDefinition:
    """The daily partitions of the sale days the home's data covers."""
    first = dt.date.fromisoformat(json.loads((home / "data" / "days.json").read_text())["first_day"])
    return dg.DailyPartitionsDefinition(start_date=first.isoformat(),
                                        end_date=(first + dt.timedelta(days=gen.DAYS)).isoformat(), timezone="UTC")


def build_definitions(home: Path | None = None) -> dg.Definitions:
    """The code location for one home (created when missing): loaders merged with the loop of ``dataops.yaml``."""
    home = ensure_home(home or home_dir())
    daily = sale_days(home)

    @dg.asset(key=SALES, partitions_def=daily, group_name=GROUP, kinds={"duckdb"},
              backfill_policy=dg.BackfillPolicy.single_run(), owners=["dana.ortiz@grocer.example"],
              description="POS sales lines merged into the warehouse on sales_line_id, one sale day at a time, "
                          "reading rows above the high-watermark.")
    def sales_line(context: dg.AssetExecutionContext, pos: DatabaseResource, warehouse: DatabaseResource,
                   pipeline: PipelineRepoResource) -> dg.MaterializeResult:
        spec = pipeline.load_spec(PIPELINE_FILE)
        src, wh = pos.get_database(), warehouse.get_database()
        results = []
        for pk in sorted(context.partition_keys):
            start, end = partition_window_utc(daily, pk)
            results.append(load_partition(src, wh, spec, pk, start, end))
        total = wh.fetch_all("SELECT count(*) FROM pos.sales_line")[0][0]
        return dg.MaterializeResult(metadata=load_metadata(results, row_count=int(total)))

    @dg.multi_asset(specs=[dg.AssetSpec(["warehouse", t], group_name=GROUP, kinds={"duckdb"},
                                        description=f"pos.{t} copied in full from the POS consolidation database")
                           for t in COPIED], can_subset=True, name="copy_pos_tables")
    def copy_tables(context: dg.AssetExecutionContext, pos: DatabaseResource, warehouse: DatabaseResource):
        import pyarrow as pa

        src, wh = pos.get_database(), warehouse.get_database()
        for key in sorted(context.selected_asset_keys, key=lambda k: k.path):
            table = key.path[-1]
            data = pa.Table.from_batches(list(gen.table_batches(src, table)))
            with wh.connect() as con:
                con.execute("CREATE SCHEMA IF NOT EXISTS pos")
                con.register("dw_copy", data)  # the source's declared types, not the ones Arrow infers from values
                con.execute(f"CREATE OR REPLACE TABLE pos.{table} ({gen.DDL[table]})")
                con.execute(f"INSERT INTO pos.{table} BY NAME SELECT * FROM dw_copy")
                con.unregister("dw_copy")
            yield dg.MaterializeResult(asset_key=key, metadata={"dagster/row_count": data.num_rows})

    own = dg.Definitions(
        assets=[sales_line, copy_tables],
        jobs=[dg.define_asset_job("pos_copy_tables", selection=dg.AssetSelection.assets(copy_tables),
                                  description="Copy the nine small POS tables to the warehouse."),
              dg.define_asset_job("pos_sales_line_load", selection=dg.AssetSelection.assets(SALES), partitions_def=daily,
                                  description="The nightly incremental load of the POS sales lines.")],
        resources={"pipeline": PipelineRepoResource(root=str(home / "repo"))},
    )
    loop = build_dw_definitions(CONFIG, base_dir=home, scope={"home": str(home)}, assets=[sales_line])
    return dg.Definitions.merge(own, loop)


def source_database(home: Path):
    """The source as a :class:`dw_dagster.Database` (a DuckDB file or PostgreSQL)."""
    from dw_dagster import database_from_url

    return database_from_url(source_url(home))


def warehouse_database(home: Path) -> DuckDBDatabase:
    return DuckDBDatabase(warehouse_path(home))


@dg.definitions
def defs() -> dg.Definitions:
    """The location as Dagster loads it: the home from ``$DW_MIGRATION_HOME``."""
    return build_definitions()
