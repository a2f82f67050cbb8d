"""The store-sales code location: the POS load with the watermark bug, dbt models, and dw_dagster.

``dagster dev -w workspace.yaml`` loads :data:`defs`. Everything lives under
``$DW_STORE_SALES_HOME`` (see :mod:`.home`); ``make demo`` prints the exact command to open the
demo's own instance and files.
"""


import datetime as dt
import os
import warnings
from pathlib import Path

import dagster as dg
from dagster_dbt import DagsterDbtTranslator, DbtCliResource, DbtProject, dbt_assets, get_asset_key_for_model

from dw_dagster.checks import build_null_rate_check, build_reconciliation_checks, build_volume_check
from dw_dagster.databases import DatabaseResource
from dw_dagster.definitions import dbt_executable, prepare_manifest
from dw_dagster.diagnosis.job import IncrementalLoadDiagnoser, build_diagnosis_job
from dw_dagster.examples.store_sales import home as h
from dw_dagster.lineage import load_manifest
from dw_dagster.pipelines.incremental import PipelineRepoResource, load_partition
from dw_dagster.proposals.watermark import DbtCountTest
from dw_dagster.approval.job import build_approval_job
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.receipts.job import build_receipt_job
from dw_dagster.core import keys as c
from dw_dagster.repair.control import build_control_jobs, build_expiry_sensor, control_asset_spec
from dw_dagster.repair.guard import guarded_executor
from dw_dagster.repair.jobs import build_rebuild_job, build_verify_job, build_window_job
from dw_dagster.repair.undo import build_undo_jobs

GROUP = "store_sales"
SOURCE_ASSET = dg.AssetKey(["pos_source", "sales_line"])
TARGET_ASSET = dg.AssetKey(["store_sales_line"])
DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-29", timezone="UTC")
RECON_CHECK = "region_compare"
VOLUME_CHECK = "daily_volume"
NULL_CHECK = "null_rate"
DBT_TEST = DbtCountTest(
    model="fct_store_sales_daily",
    count_column="line_count",
    source_name="pos",
    source_table="sales_line",
    group={"store_id": "store_id", "sale_date": "cast(sale_ts as date)"},
)


def prepare_dbt(project_dir: Path) -> Path:
    """Parse the dbt project if its manifest is missing; return the manifest path."""
    return prepare_manifest(project_dir)


def build_definitions(home: Path | None = None) -> dg.Definitions:
    """Build the code location for one home directory (re-run after a merge to pick up new dbt tests)."""
    home = home or h.home_dir()
    if os.environ.get(h.HOME_ENV) and not h.source_path(home).exists():
        # a mistyped $DW_STORE_SALES_HOME would otherwise surface as "schema pos does not exist"
        warnings.warn(f"${h.HOME_ENV}={os.environ[h.HOME_ENV]} holds no store-sales data yet: the checks will fail "
                      "until `dw-dagster demo store-sales` (or the generator) fills it; is the path right?", stacklevel=2)
    home = h.ensure_home(home)
    os.environ["DW_WAREHOUSE_PATH"] = str(h.warehouse_path(home))
    domains = h.domains_path(home)  # read when used: edits apply at once; never a process-wide setting
    project_dir = h.dbt_dir(home)
    manifest_path = prepare_dbt(project_dir)
    project = DbtProject(project_dir=project_dir, profiles_dir=project_dir)

    pos_source = dg.AssetSpec(
        SOURCE_ASSET, group_name=GROUP, kinds={"informix"},
        description="pos.sales_line in the POS consolidation database (IBM Informix in production; "
        "a DuckDB file stands in locally).",
    )

    @dg.asset(
        key=TARGET_ASSET, deps=[SOURCE_ASSET], partitions_def=DAILY, group_name=GROUP, kinds={"duckdb"},
        backfill_policy=dg.BackfillPolicy.single_run(), owners=["dana.ortiz@grocer.example"],
        description="POS sales lines merged into the warehouse table pos.sales_line on sales_line_id, "
        "one daily partition of sale_ts at a time, reading rows above the high-watermark.",
        metadata={"dagster/table_name": "warehouse.pos.sales_line", "dw/pipeline_file": h.PIPELINE_FILE},
    )
    def store_sales_line(context: dg.AssetExecutionContext, pos_source: DatabaseResource,
                         warehouse: DatabaseResource, pipeline: PipelineRepoResource) -> dg.MaterializeResult:
        spec = pipeline.load_spec(h.PIPELINE_FILE)
        src, wh = pos_source.get_database(), warehouse.get_database()
        loads = {}
        for pk in sorted(context.partition_keys):
            tw = DAILY.time_window_for_partition_key(pk)
            res = load_partition(src, wh, spec, pk, tw.start.replace(tzinfo=None), tw.end.replace(tzinfo=None))
            context.log.info(f"{pk}: read {res.rows_read} rows above {res.watermark_low} on {res.watermark_column}; "
                             f"inserted {res.rows_inserted}, updated {res.rows_updated}")
            loads[pk] = res.model_dump(mode="json")
        total = wh.fetch_all("SELECT count(*) FROM pos.sales_line")[0][0]
        return dg.MaterializeResult(metadata={
            "dw/loads": dg.MetadataValue.json(loads),
            c.WATERMARK_COLUMN_KEY: spec.watermark_column,
            c.LOOKBACK_HOURS_KEY: spec.lookback_hours,
            c.ROWS_READ_KEY: sum(v["rows_read"] for v in loads.values()),
            c.ROWS_INSERTED_KEY: sum(v["rows_inserted"] for v in loads.values()),
            "dagster/row_count": int(total),
        })

    class Translator(DagsterDbtTranslator):
        def get_asset_spec(self, manifest, unique_id, project):
            return super().get_asset_spec(manifest, unique_id, project).replace_attributes(group_name=GROUP)

    translator = Translator()

    # The manifest goes in as data: dagster-dbt caches manifests read by path, and a merged change
    # set adds a test to the same path.
    manifest = load_manifest(manifest_path)

    # The finance_daily models in the same dbt project belong to the orders location.
    @dbt_assets(manifest=manifest, project=project, name="store_sales_dbt", dagster_dbt_translator=translator,
                exclude="tag:finance_daily")
    def store_sales_dbt(context: dg.AssetExecutionContext, dbt: DbtCliResource):
        yield from dbt.cli(["build"], context=context).stream()

    dbt_keys = {uid: list(get_asset_key_for_model([store_sales_dbt], n["name"]).path)
                for uid, n in manifest["nodes"].items() if n["resource_type"] == "model"}

    recon = build_reconciliation_checks(
        asset=TARGET_ASSET, source_asset=SOURCE_ASSET, source_table="pos.sales_line", target_table="pos.sales_line",
        slice_by=["region"], measures=["net_sales"], source_resource_key="pos_source", target_resource_key="warehouse",
        name=RECON_CHECK,
    )
    last_day = dt.date.fromisoformat(DAILY.get_last_partition_key())
    volume = build_volume_check(asset=TARGET_ASSET, table="pos.sales_line", timestamp_column="sale_ts",
                                resource_key="warehouse", name=VOLUME_CHECK, as_of=lambda: last_day)
    nulls = build_null_rate_check(asset=TARGET_ASSET, table="pos.sales_line", columns=["store_id", "region", "net_sales"],
                                  timestamp_column="sale_ts", resource_key="warehouse", name=NULL_CHECK,
                                  as_of=lambda: last_day)
    verify_keys = [dg.AssetCheckKey(TARGET_ASSET, n) for n in (RECON_CHECK, VOLUME_CHECK, NULL_CHECK)]

    diagnoser = IncrementalLoadDiagnoser(
        target_asset=TARGET_ASSET, source_resource_key="pos_source", target_resource_key="warehouse",
        pipeline_root=lambda: h.repo_dir(home), pipeline_file=h.PIPELINE_FILE,
        manifest_path=lambda: manifest_path, partitions_def=DAILY, domains_file=lambda: h.domains_path(home),
        dbt_asset_keys=dbt_keys, verify_checks=[[*k.asset_key.path, k.name] for k in verify_keys],
        group_by=["store_id"], dbt_test=DBT_TEST,
        asset_graph=lambda: built[0].resolve_asset_graph(),  # in-process runs have no repository
    )
    diagnosis_job = build_diagnosis_job(diagnoser=diagnoser, required_resource_keys=["pos_source", "warehouse"],
                                        domains=domains)
    load_job = dg.define_asset_job("store_sales_daily_load", selection=dg.AssetSelection.assets(TARGET_ASSET),
                                   partitions_def=DAILY, description="The nightly load of one day of POS lines.")
    models_job = dg.define_asset_job("store_sales_models", selection=dg.AssetSelection.assets(store_sales_dbt),
                                     description="dbt build of the store-sales models and their tests.")
    window_job = build_window_job("dw_rerun_store_sales_line", [TARGET_ASSET], DAILY)
    rebuild_job = build_rebuild_job("dw_rebuild_store_sales_models", dg.AssetSelection.assets(store_sales_dbt))
    verify_job = build_verify_job("dw_verify_store_sales_line", verify_keys,
                                  description="Reconciliation, volume and null-rate checks on store_sales_line.")
    receipt_job = build_receipt_job()
    undo_jobs = build_undo_jobs(["warehouse"])
    stop_job, resume_job = build_control_jobs(domains)
    checks = [recon, volume, nulls]
    sensors = [
        build_check_incident_sensor(check_keys=[verify_keys[0]], diagnosis_job_name=diagnosis_job.name, domains=domains),
        build_remediation_sensor(partitions_def=DAILY, window_job=window_job, rebuild_job=rebuild_job,
                                 verify_job=verify_job, receipt_job=receipt_job, pipeline_root=h.repo_dir(home),
                                 undo_jobs=undo_jobs, domains=domains),
    ]
    resources = {
        "pos_source": DatabaseResource(url=os.environ.get("DW_POS_SOURCE_URL") or f"duckdb:///{h.source_path(home)}"),
        "warehouse": DatabaseResource(url=f"duckdb:///{h.warehouse_path(home)}"),
        "pipeline": PipelineRepoResource(root=str(h.repo_dir(home))),
        "dbt": DbtCliResource(project_dir=project, profiles_dir=str(project_dir), dbt_executable=dbt_executable()),
    }
    checks, sensors, resources = _integrations(checks, sensors, resources, diagnosis_job.name, domains)
    built: list[dg.Definitions] = []
    defs = dg.Definitions(
        assets=[pos_source, store_sales_line, store_sales_dbt, control_asset_spec()],
        asset_checks=checks,
        jobs=[load_job, models_job, window_job, rebuild_job, verify_job, diagnosis_job, build_approval_job(domains),
              receipt_job, stop_job, resume_job, *undo_jobs],
        sensors=sensors,
        resources=resources,
        executor=guarded_executor(dg.in_process_executor),
    )
    built.append(defs)
    return defs


#: Lightup tables → Dagster assets (datasource name in the store-sales Lightup workspace : table).
LIGHTUP_TABLES = {"pos-informix:pos.sales_line": SOURCE_ASSET, "warehouse:pos.sales_line": TARGET_ASSET}
LOCATION_NAME = "store_sales"  # workspace.yaml location_name


def _integrations(checks: list, sensors: list, resources: dict, diagnosis_job_name: str, domains) -> tuple[list, list, dict]:
    """Lightup, PagerDuty and Slack, each switched on by its environment variables.

    Lightup: ``LIGHTUP_CREDENTIAL_FILE`` (or ``LIGHTUP_SERVER`` + ``LIGHTUP_REFRESH_TOKEN``),
    ``LIGHTUP_COMPARE_METRICS`` (comma-separated compare metric uuids, for the on-demand check).
    PagerDuty: ``PAGERDUTY_ROUTING_KEY`` (+ ``PAGERDUTY_API_TOKEN``, ``PAGERDUTY_FROM``,
    ``PAGERDUTY_EVENTS_URL``, ``PAGERDUTY_API_URL``). Slack: ``SLACK_BOT_TOKEN`` (+ ``SLACK_CHANNEL``,
    ``SLACK_API_URL``). ``DAGSTER_UI_URL`` is the base of links (default http://localhost:3000).
    """
    from dw_dagster.integrations.lightup import LightupResource
    from dw_dagster.detection.lightup import build_lightup_compare_check, build_lightup_incident_sensor
    from dw_dagster.integrations.notifications import build_notification_sensor
    from dw_dagster.integrations.pagerduty import PagerDutyResource
    from dw_dagster.integrations.slack import SlackResource

    env = os.environ
    lightup = bool(env.get("LIGHTUP_CREDENTIAL_FILE") or (env.get("LIGHTUP_SERVER") and env.get("LIGHTUP_REFRESH_TOKEN")))
    pager = bool(env.get("PAGERDUTY_ROUTING_KEY"))
    slack = bool(env.get("SLACK_BOT_TOKEN"))
    if lightup:
        resources["lightup"] = LightupResource(workspace=env.get("LIGHTUP_WORKSPACE"))
        sensors.append(build_lightup_incident_sensor(table_assets=LIGHTUP_TABLES, diagnosis_job_name=diagnosis_job_name,
                                                     domains=domains))
        metrics = [m for m in env.get("LIGHTUP_COMPARE_METRICS", "").split(",") if m]
        if metrics:
            checks.append(build_lightup_compare_check(asset=TARGET_ASSET, compare_metric_uuids=metrics))
    if pager:
        resources["pager"] = PagerDutyResource(
            routing_key=dg.EnvVar("PAGERDUTY_ROUTING_KEY"),
            api_token=dg.EnvVar("PAGERDUTY_API_TOKEN") if env.get("PAGERDUTY_API_TOKEN") else None,
            from_email=env.get("PAGERDUTY_FROM"),
            events_base_url=env.get("PAGERDUTY_EVENTS_URL", "https://events.pagerduty.com"),
            rest_base_url=env.get("PAGERDUTY_API_URL", "https://api.pagerduty.com"))
    if slack:
        resources["slack"] = SlackResource(bot_token=dg.EnvVar("SLACK_BOT_TOKEN"),
                                           base_url=env.get("SLACK_API_URL", "https://slack.com/api"),
                                           default_channel=env.get("SLACK_CHANNEL"))
    sensors.append(build_expiry_sensor(slack_resource_key="slack" if slack else None, domains=domains))
    if lightup or pager or slack:
        sensors.append(build_notification_sensor(
            dagster_url=env.get("DAGSTER_UI_URL", "http://localhost:3000"), location_name=LOCATION_NAME,
            lightup_resource_key="lightup" if lightup else None, pager_resource_key="pager" if pager else None,
            slack_resource_key="slack" if slack else None))
    return checks, sensors, resources


defs = build_definitions()
