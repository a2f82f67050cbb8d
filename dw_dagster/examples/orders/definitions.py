"""The orders code location: the CDC sink with its dead-letter table, the finance_daily dbt models, and dw_dagster.

``dagster dev -w workspace.yaml`` loads :data:`defs` (location ``orders``). Everything lives under
``$DW_ORDERS_HOME`` (:mod:`.home`, :mod:`.paths`); ``dw-dagster demo orders`` prints the command
that opens the demo's own instance and files.

What it holds (``shared/design/DESIGN.md`` §3, orders stream):

- ``shop/orders`` — the orders service's table (MariaDB in production), an external asset;
- ``orders`` — the change stream applied to ``analytics.orders`` by
  :class:`~dw_dagster.examples.orders.sink.CdcSink`, rejected rows parked in
  ``analytics.orders_dlq``. By default the stream is the generator's deterministic replay
  (:class:`~dw_dagster.examples.orders.cdc.ReplaySource`, no server); with
  ``DW_ORDERS_SOURCE_URL=mysql://user:password@host:port`` it is the server's binlog. The sink
  validates against the target's schema as the warehouse's catalog has it at each run;
- the ``finance_daily`` dbt models (``fct_daily_gmv``, ``finance_gmv_by_payment_method``,
  ``finance_gmv_mtd``; tests; the Lightdash "Daily GMV" exposure);
- detection: ``daily_volume`` (rows per ``order_ts`` day against the same weekday's baseline)
  and ``dead_letter`` (rows parked in the last 24 h and not replayed: the view
  ``analytics.orders_dlq_pending``) on ``orders``; the incident sensor turns a
  failure into one incident and a run of the diagnosis job
  (:class:`~dw_dagster.diagnosis.sink_diagnoser.DeadLetterDiagnoser`);
- repair: the approval job, the remediation sensor with the ``migration`` and ``replay`` step
  jobs, the rebuild of the finance_daily models, the verification checks
  (``parked_rows_replayed``, ``no_new_dead_letters``, ``daily_volume``, ``dead_letter`` on ``orders``;
  ``gift_card_gmv`` on ``fct_daily_gmv``) and the receipt job.
"""

import datetime as dt
import itertools
import os
from pathlib import Path

import dagster as dg
from dagster_dbt import DagsterDbtTranslator, DbtCliResource, DbtProject, dbt_assets, get_asset_key_for_model
from pydantic import Field

from dw_dagster.checks import build_dead_letter_check, build_volume_check
from dw_dagster.databases import Database, DatabaseResource, DuckDBDatabase
from dw_dagster.definitions import dbt_executable, prepare_manifest
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.examples.orders import cdc
from dw_dagster.examples.orders import home as h
from dw_dagster.examples.orders import paths as p
from dw_dagster.diagnosis.sink_diagnoser import DeadLetterDiagnoser
from dw_dagster.repair.replay import (
    REPLAY,
    REPLAY_UNDO,
    ReplaySpec,
    ensure_replay_tables,
    pending_view_name,
    run_replay_step,
    run_replay_undo_step,
)
from dw_dagster.examples.orders.sink import ORDERS_TABLE, CdcSink, SinkTable
from dw_dagster.examples.orders.source import SOURCE_TABLE
from dw_dagster.lineage import load_manifest
from dw_dagster.approval.job import build_approval_job
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.receipts.job import build_receipt_job
from dw_dagster.repair.replay_checks import build_replay_checks
from dw_dagster.repair.control import build_control_jobs, build_expiry_sensor, control_asset_spec
from dw_dagster.repair.guard import guarded_executor
from dw_dagster.repair.jobs import build_rebuild_job, build_verify_job
from dw_dagster.repair.steps import build_step_jobs

GROUP = "orders"
DBT_GROUP = "finance_daily"
SOURCE_ASSET = dg.AssetKey(["shop", "orders"])
TARGET_ASSET = dg.AssetKey(["orders"])
GMV_ASSET = dg.AssetKey(["fct_daily_gmv"])
SINK_TABLE = ORDERS_TABLE
OWNER = "maya.chen@shop.example"
VOLUME_CHECK = "daily_volume"
DEAD_LETTER_CHECK = "dead_letter"
REPLAYED_CHECK = "parked_rows_replayed"
NO_NEW_DLQ_CHECK = "no_new_dead_letters"
GIFT_CARD_CHECK = "gift_card_gmv"
GIFT_CARD = "gift_card"
LOCATION_NAME = "orders"  # workspace.yaml location_name
#: the replay tables of the sink's dead-letter table (ledger, and the view of rows still parked)
PENDING_SPEC = ReplaySpec.for_sink_table(SINK_TABLE, expected_rows=0)


class OrdersSourceResource(dg.ConfigurableResource):
    """The orders service: its change stream for the sink, and its table for queries.

    Without ``mysql_url`` the stream is the generator's deterministic replay at ``scale`` and the
    table is the DuckDB stand-in at ``duckdb_path`` (:func:`~dw_dagster.examples.orders.source.write_source`).
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
            from dw_dagster.databases import SqlAlchemyDatabase

            conn = cdc.MySQLConnection.from_url(self.mysql_url)
            from sqlalchemy.engine import URL

            return SqlAlchemyDatabase(URL.create("mysql+pymysql", username=conn.user, password=conn.password or None,
                                                 host=conn.host, port=conn.port).render_as_string(hide_password=False))
        return DuckDBDatabase(self.duckdb_path)


class OrdersStreamConfig(dg.Config):
    """Launchpad config of the ``orders`` asset."""

    until: str | None = Field(default=None, description="replay only: apply the changes committed before this UTC time "
                              "(ISO 8601, e.g. 2026-11-24T00:00:00); default: everything the source has")


def sink_table_now(db: Database, table: SinkTable = SINK_TABLE) -> SinkTable:
    """``table`` with the REQUIRED flags the warehouse's catalog shows now (a relaxed column is
    nullable for the sink too); ``table`` itself when the target does not exist yet."""
    from dw_dagster.databases.catalog import CatalogError, read_table_schema

    try:
        schema = read_table_schema(db, table.table)
    except CatalogError:
        return table
    nullable = {col.name.lower() for col in schema.columns if col.nullable}
    relaxed = [col.name for col in table.columns if col.required and col.name.lower() in nullable and col.name != table.key]
    return table.with_nullable(*relaxed) if relaxed else table


def prepare_dbt(home: Path) -> Path:
    """Parse the home's dbt project if its manifest is missing; return the manifest path."""
    return prepare_manifest(p.dbt_dir(home), p.profiles_dir(home))


def build_verification_checks() -> list[dg.AssetChecksDefinition]:
    """The checks that prove a replay (:func:`dw_dagster.build_replay_checks`) and the example's own
    gift-card GMV compare on ``fct_daily_gmv`` (their numbers land in the receipt)."""

    @dg.asset_check(asset=GMV_ASSET, name=GIFT_CARD_CHECK, required_resource_keys={"warehouse", "shop"},
                    metadata={"dw/check_kind": "reconcile"},
                    description="fct_daily_gmv's gift-card orders and GMV per day and currency equal the source's "
                    "(shop.orders), over the model's last 7 order dates.")
    def gift_card_gmv(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        from dw_dagster.examples.orders.verify import gift_card_gmv_compare

        cmp = gift_card_gmv_compare(context.resources.warehouse.get_database(), context.resources.shop.get_database())
        return dg.AssetCheckResult(passed=cmp.passed, description=cmp.description, metadata=cmp.metadata())

    return [*build_replay_checks(asset=TARGET_ASSET, sink_table=SINK_TABLE, resource_key="warehouse",
                                 replayed_name=REPLAYED_CHECK, no_new_name=NO_NEW_DLQ_CHECK), gift_card_gmv]


def build_definitions(home: Path | None = None) -> dg.Definitions:
    """Build the orders code location for one home directory (created when missing)."""
    home = p.prepare_home(home or h.home_dir())
    domains = p.domains_path(home)  # read when used; never a process-wide setting
    manifest_path = prepare_dbt(home)
    project = DbtProject(project_dir=p.dbt_dir(home), profiles_dir=p.profiles_dir(home))
    mysql = bool(os.environ.get(h.SOURCE_URL_ENV))

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
        ensure_replay_tables(db, PENDING_SPEC)
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

    class Translator(DagsterDbtTranslator):
        def get_asset_spec(self, manifest, unique_id, project):
            return super().get_asset_spec(manifest, unique_id, project).replace_attributes(group_name=DBT_GROUP)

    manifest = load_manifest(manifest_path)

    @dbt_assets(manifest=manifest, project=project, name="finance_daily_dbt", select="tag:finance_daily",
                dagster_dbt_translator=Translator())
    def finance_daily_dbt(context: dg.AssetExecutionContext, dbt: DbtCliResource):
        yield from dbt.cli(["build"], context=context).stream()

    dbt_keys = {uid: list(get_asset_key_for_model([finance_daily_dbt], n["name"]).path)
                for uid, n in manifest["nodes"].items() if n["resource_type"] == "model" and "finance_daily" in n.get("tags", [])}

    volume = build_volume_check(asset=TARGET_ASSET, table=SINK_TABLE.table, timestamp_column="order_ts",
                                resource_key="warehouse", name=VOLUME_CHECK)
    # counts the parked rows not replayed yet (the view over analytics.orders_dlq), so a replay ends the alert
    dead_letter = build_dead_letter_check(asset=TARGET_ASSET, table=pending_view_name(PENDING_SPEC), timestamp_column="failed_at",
                                          reason_column="error_reason", resource_key="warehouse", name=DEAD_LETTER_CHECK,
                                          lookback_hours=24)
    verification = build_verification_checks()
    detect_keys = [dg.AssetCheckKey(TARGET_ASSET, VOLUME_CHECK), dg.AssetCheckKey(TARGET_ASSET, DEAD_LETTER_CHECK)]
    verify_keys = [dg.AssetCheckKey(TARGET_ASSET, VOLUME_CHECK), dg.AssetCheckKey(TARGET_ASSET, DEAD_LETTER_CHECK),
                   dg.AssetCheckKey(TARGET_ASSET, REPLAYED_CHECK),
                   dg.AssetCheckKey(TARGET_ASSET, NO_NEW_DLQ_CHECK), dg.AssetCheckKey(GMV_ASSET, GIFT_CARD_CHECK)]

    diagnoser = DeadLetterDiagnoser(
        target_asset=TARGET_ASSET, sink_table=SINK_TABLE, source_table=SOURCE_TABLE, source_resource_key="shop",
        target_resource_key="warehouse", partition_column="order_ts", group_column="payment_method",
        volume_check=detect_keys[0], manifest_path=lambda: manifest_path, dbt_asset_keys=dbt_keys,
        domains_file=lambda: p.domains_path(home), verify_checks=[[*k.asset_key.path, k.name] for k in verify_keys])
    diagnosis_job = build_diagnosis_job(diagnoser=diagnoser, required_resource_keys=["shop", "warehouse"], domains=domains)
    stream_job = dg.define_asset_job("orders_stream", selection=dg.AssetSelection.assets(TARGET_ASSET).without_checks(),
                                     description="Apply the orders change stream to analytics.orders (the sink).")
    models_job = dg.define_asset_job("finance_daily_models", selection=dg.AssetSelection.assets(finance_daily_dbt),
                                     description="dbt build of the finance_daily models and their tests.")
    detect_job = dg.define_asset_job("orders_checks", selection=dg.AssetSelection.checks(*detect_keys),
                                     description="Volume and dead-letter checks on orders.")
    rebuild_job = build_rebuild_job("dw_rebuild_finance_daily", dg.AssetSelection.assets(finance_daily_dbt),
                                    description="Approved rebuilds of the finance_daily models after a repair.")
    verify_job = build_verify_job("dw_verify_orders", verify_keys,
                                  description="The checks that prove a replay: parked rows present once, the day "
                                  "inside its baseline, no new dead letters, gift cards in fct_daily_gmv.")
    receipt_job = build_receipt_job()
    step_jobs = build_step_jobs({REPLAY: run_replay_step, REPLAY_UNDO: run_replay_undo_step}, resource_keys=["warehouse"])
    stop_job, resume_job = build_control_jobs(domains)
    sensors = [
        build_check_incident_sensor(check_keys=detect_keys, diagnosis_job_name=diagnosis_job.name, domains=domains),
        build_remediation_sensor(rebuild_job=rebuild_job, verify_job=verify_job, receipt_job=receipt_job, step_jobs=step_jobs,
                                 domains=domains),
        build_expiry_sensor(domains=domains),
    ]
    resources = {
        "shop": OrdersSourceResource(scale=p.read_scale(home), duckdb_path=str(p.source_path(home)),
                                     mysql_url=dg.EnvVar(h.SOURCE_URL_ENV) if mysql else None),
        "warehouse": DatabaseResource(url=f"duckdb:///{h.warehouse_path(home)}"),
        "dbt": DbtCliResource(project_dir=project, profiles_dir=str(p.profiles_dir(home)), dbt_executable=dbt_executable()),
    }
    return dg.Definitions(
        assets=[shop_orders, orders, finance_daily_dbt, control_asset_spec()],
        asset_checks=[volume, dead_letter, *verification],
        jobs=[stream_job, models_job, detect_job, rebuild_job, verify_job, diagnosis_job, build_approval_job(domains),
              receipt_job, stop_job, resume_job, *step_jobs.values()],
        sensors=sensors,
        resources=resources,
        executor=guarded_executor(dg.in_process_executor),
    )


defs = build_definitions()
