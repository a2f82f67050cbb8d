"""The orders code location: the CDC sink with its dead-letter table, the finance_daily dbt models, and dw_dagster.

``dagster dev -w workspace.yaml`` (location ``orders``) or ``-m dw_dagster_examples.orders.definitions``
loads :func:`defs`. The example's own pieces are here; the loop (checks, incident sensor,
diagnosis, approval, repair steps, verification, receipts, stop/resume, expiry) is one
:func:`dw_dagster.build_dw_definitions` call on ``dataops.yaml`` next to this file. Everything
lives under ``$DW_ORDERS_HOME`` (:mod:`.home`, :mod:`.paths`); ``dw-dagster demo orders`` prints
the command that opens the demo's own instance and files.

What it holds (orders stream):

- ``shop/orders`` — the orders service's table (MariaDB in production), an external asset;
- ``orders`` — the change stream applied to ``analytics.orders`` by
  :class:`~dw_dagster_examples.orders.sink.CdcSink`, rejected rows parked in
  ``analytics.orders_dlq``. By default the stream is the generator's deterministic replay
  (:class:`~dw_dagster_examples.orders.cdc.ReplaySource`, no server); with
  ``DW_ORDERS_SOURCE_URL=mysql://user:password@host:port`` it is the server's binlog. The sink
  validates against the target's schema as the warehouse's catalog has it at each run;
- the ``finance_daily`` dbt models (``fct_daily_gmv``, ``finance_gmv_by_payment_method``,
  ``finance_gmv_mtd``; tests; the Lightdash "Daily GMV" exposure);
- detection: ``daily_volume`` (rows per ``order_ts`` day against the same weekday's baseline)
  and ``dead_letter`` (rows parked in the last 24 h and not replayed: the view
  ``analytics.orders_dlq_pending``) on ``orders``; the incident sensor turns a
  failure into one incident and a run of the diagnosis job (the dead-letter sink's diagnoser:
  a REQUIRED column receiving NULLs);
- repair: the approval job, the remediation sensor with the ``migration`` and ``replay`` step
  jobs, the rebuild of the finance_daily models, the verification checks
  (``parked_rows_replayed``, ``no_new_dead_letters``, ``daily_volume``, ``dead_letter`` on ``orders``;
  ``gift_card_gmv`` on ``fct_daily_gmv``) and the receipt job.
"""

import datetime as dt
import itertools
import json
import os
from pathlib import Path

import dagster as dg
from dagster_dbt import DagsterDbtTranslator, DbtCliResource, DbtProject, dbt_assets
from pydantic import Field

from dw_dagster import Database, DatabaseResource, SinkTable, build_dw_definitions, database_from_url
from dw_dagster.databases.catalog import CatalogError, read_table_schema
from dw_dagster.definitions import dbt_executable, prepare_manifest
from dw_dagster_examples.orders import cdc
from dw_dagster_examples.orders import home as h
from dw_dagster_examples.orders import paths as p
from dw_dagster_examples.orders.sink import ORDERS_TABLE, CdcSink

#: the loop's configuration (dw_dagster.DataOpsConfig as YAML; ``{{ home }}`` is the location's home)
CONFIG = Path(__file__).resolve().parent / "dataops.yaml"
GROUP = "orders"
DBT_GROUP = "finance_daily"
SOURCE_ASSET = dg.AssetKey(["shop", "orders"])
TARGET_ASSET = dg.AssetKey(["orders"])
GMV_ASSET = dg.AssetKey(["fct_daily_gmv"])
SINK_TABLE = ORDERS_TABLE
OWNER = "maya.chen@shop.example"
GIFT_CARD_CHECK = "gift_card_gmv"
GIFT_CARD = "gift_card"


class OrdersSourceResource(dg.ConfigurableResource):
    """The orders service: its change stream for the sink, and its table for queries.

    Without ``mysql_url`` the stream is the generator's deterministic replay at ``scale`` and the
    table is the DuckDB stand-in at ``duckdb_path`` (:func:`~dw_dagster_examples.orders.source.write_source`).
    With ``mysql_url`` (``mysql://user:password@host:port``; give it as ``dg.EnvVar``) the stream
    is the server's row-based binlog and the table is queried over PyMySQL.
    """

    scale: float = Field(default=p.DEFAULT_SCALE, description="the replayed stream's scale (replay only)")
    txn_rows: int = Field(default=500, description="changes per replayed transaction")
    duckdb_path: str = Field(default="", description="the DuckDB stand-in of shop.orders (replay only)")
    mysql_url: str | None = Field(default=None, description="mysql://user:password@host:port of the orders database")

    def change_source(self) -> "cdc.ChangeSource":
        """The change stream: the binlog with ``mysql_url``, else the replay."""
        if self.mysql_url:
            return cdc.BinlogSource(cdc.MySQLConnection.from_url(self.mysql_url))
        return cdc.ReplaySource(self.scale, txn_rows=self.txn_rows)

    def get_database(self) -> Database:
        """The source table's database (``shop.orders``)."""
        if self.mysql_url:
            from sqlalchemy.engine import URL

            conn = cdc.MySQLConnection.from_url(self.mysql_url)
            return database_from_url(URL.create("mysql+pymysql", username=conn.user, password=conn.password or None,
                                                host=conn.host, port=conn.port).render_as_string(hide_password=False))
        return database_from_url(f"duckdb:///{self.duckdb_path}")


class OrdersStreamConfig(dg.Config):
    """Launchpad config of the ``orders`` asset."""

    until: str | None = Field(default=None, description="replay only: apply the changes committed before this UTC time "
                              "(ISO 8601, e.g. 2026-11-24T00:00:00); default: everything the source has")


def sink_table_now(db: Database, table: SinkTable = SINK_TABLE) -> SinkTable:
    """``table`` with the REQUIRED flags the warehouse's catalog shows now (a relaxed column is
    nullable for the sink too); ``table`` itself when the target does not exist yet."""
    try:
        schema = read_table_schema(db, table.table)
    except CatalogError:
        return table
    nullable = {col.name.lower() for col in schema.columns if col.nullable}
    relaxed = [col.name for col in table.columns if col.required and col.name.lower() in nullable and col.name != table.key]
    return table.with_nullable(*relaxed) if relaxed else table


def build_gift_card_check() -> dg.AssetChecksDefinition:
    """The example's own proof on ``fct_daily_gmv``: gift-card orders and GMV per day and currency equal the
    source's (its numbers land in the receipt; the loop's ``verify`` names it)."""

    @dg.asset_check(asset=GMV_ASSET, name=GIFT_CARD_CHECK, required_resource_keys={"warehouse", "shop"},
                    metadata={"dw/check_kind": "reconcile"},
                    description="fct_daily_gmv's gift-card orders and GMV per day and currency equal the source's "
                    "(shop.orders), over the model's last 7 order dates.")
    def gift_card_gmv(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        from dw_dagster_examples.orders.verify import gift_card_gmv_compare

        cmp = gift_card_gmv_compare(context.resources.warehouse.get_database(), context.resources.shop.get_database())
        return dg.AssetCheckResult(passed=cmp.passed, description=cmp.description, metadata=cmp.metadata())

    return gift_card_gmv


class _Translator(DagsterDbtTranslator):
    """dagster-dbt's keys; the models in the ``finance_daily`` group."""

    def get_asset_spec(self, manifest, unique_id, project):
        return super().get_asset_spec(manifest, unique_id, project).replace_attributes(group_name=DBT_GROUP)


def build_definitions(home: Path | None = None, *, binlog: bool | None = None) -> dg.Definitions:
    """The orders code location for one home directory (created when missing).

    Args:
        home: the location's home (default ``$DW_ORDERS_HOME``, see :func:`.home.home_dir`).
        binlog: read the change stream from the MySQL/MariaDB binlog at ``$DW_ORDERS_SOURCE_URL``
            (True) or replay the generator's stream (False); default: the binlog when the
            variable is set.

    Returns:
        The example's assets, jobs and gift-card check merged with the loop of ``dataops.yaml``.
    """
    home = p.prepare_home(home or h.home_dir())
    project_dir, profiles_dir = p.dbt_dir(home), p.profiles_dir(home)
    manifest_path = prepare_manifest(project_dir, profiles_dir)
    project = DbtProject(project_dir=project_dir, profiles_dir=profiles_dir)
    mysql = bool(os.environ.get(h.SOURCE_URL_ENV)) if binlog is None else binlog

    shop_orders = dg.AssetSpec(
        SOURCE_ASSET, group_name=GROUP, kinds={"mariadb"},
        description="shop.orders in the orders service's MariaDB (with no server, the generator's replayed "
        "change stream and a DuckDB stand-in of the table).")

    @dg.asset(
        key=TARGET_ASSET, deps=[SOURCE_ASSET], group_name=GROUP, kinds={"duckdb"}, owners=[OWNER],
        description="The orders change stream merged into analytics.orders on order_id; rows the target's schema "
        "rejects are parked in analytics.orders_dlq with their reason, and the stream goes on.",
        metadata={"dagster/table_name": "warehouse.analytics.orders", "dw/dead_letter_table": SINK_TABLE.dead_letter_table},
    )
    def orders(context: dg.AssetExecutionContext, config: OrdersStreamConfig, shop: OrdersSourceResource,
               warehouse: DatabaseResource) -> dg.MaterializeResult:
        db = warehouse.get_database()
        sink = CdcSink(db, sink_table_now(db))
        sink.ensure_tables()
        start = sink.last_position()
        events = shop.change_source().read(start)
        if config.until:
            until = dt.datetime.fromisoformat(config.until)
            until = until.astimezone(dt.timezone.utc).replace(tzinfo=None) if until.tzinfo else until
            events = itertools.takewhile(lambda e: e.ts < until, events)
        result = sink.apply(events, start=start, on_batch=lambda b: context.log.debug(
            f"batch to {b.position}: {b.applied} applied, {b.parked} parked"))
        total, = db.fetch_all(f"SELECT count(*) FROM {SINK_TABLE.table}")[0]
        parked, = db.fetch_all(f"SELECT count(*) FROM {SINK_TABLE.dead_letter_table}")[0]
        context.log.info(f"applied {result.applied} change(s), parked {result.parked}; position {result.position}")
        required = [col.name for col in sink.table.columns if col.required]
        return dg.MaterializeResult(metadata={
            **{k: (dg.MetadataValue.json(v) if isinstance(v, dict) else v) for k, v in result.metadata().items()},
            "dw/dlq_rows": int(parked), "dw/required_columns": dg.MetadataValue.json(required),
            "dagster/row_count": int(total)})

    translator = _Translator()
    manifest = json.loads(manifest_path.read_text())

    @dbt_assets(manifest=manifest, project=project, name="finance_daily_dbt", select="tag:finance_daily",
                dagster_dbt_translator=translator)
    def finance_daily_dbt(context: dg.AssetExecutionContext, dbt: DbtCliResource):
        yield from dbt.cli(["build"], context=context).stream()

    own = dg.Definitions(
        assets=[shop_orders, orders, finance_daily_dbt],
        asset_checks=[build_gift_card_check()],
        jobs=[
            dg.define_asset_job("orders_stream", selection=dg.AssetSelection.assets(TARGET_ASSET).without_checks(),
                                description="Apply the orders change stream to analytics.orders (the sink)."),
            dg.define_asset_job("finance_daily_models", selection=dg.AssetSelection.assets(finance_daily_dbt),
                                description="dbt build of the finance_daily models and their tests."),
            dg.define_asset_job("orders_checks", selection=dg.AssetSelection.checks(
                dg.AssetCheckKey(TARGET_ASSET, "daily_volume"), dg.AssetCheckKey(TARGET_ASSET, "dead_letter")),
                description="Volume and dead-letter checks on orders."),
        ],
        resources={
            "shop": OrdersSourceResource(scale=p.read_scale(home), duckdb_path=str(p.source_path(home)),
                                         mysql_url=dg.EnvVar(h.SOURCE_URL_ENV) if mysql else None),
            "dbt": DbtCliResource(project_dir=project, profiles_dir=str(profiles_dir), dbt_executable=dbt_executable()),
        },
    )
    loop = build_dw_definitions(CONFIG, base_dir=home, scope={"home": str(home)}, assets=[orders],
                                dbt_translator=translator)
    return dg.Definitions.merge(own, loop)


@dg.definitions
def defs() -> dg.Definitions:
    """The location as Dagster loads it: the home from ``$DW_ORDERS_HOME`` (built when loaded, not on import)."""
    return build_definitions()
