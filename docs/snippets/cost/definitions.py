# What each asset costs per day, and warehouse changes for their owners, in a code location.
import dagster as dg

from dw_dagster.cost.observe import build_cost_observation_job
from dw_dagster.cost.sources import CostResource
from dw_dagster.definitions import build_warehouse_change_definitions

cost = CostResource(
    url=dg.EnvVar("DW_COST_URL").get_value("snowflake://user:pw@acme-xy12345/ANALYTICS?warehouse=OPS_WH"),
    manifests=["target/manifest.json"],  # dbt node ids -> Dagster asset keys
)
job, report_asset, schedule = build_cost_observation_job(engine="snowflake", start_date="2026-10-01")

defs = dg.Definitions.merge(
    dg.Definitions(assets=[report_asset], jobs=[job], schedules=[schedule], resources={"dw_cost": cost}),
    # approved ALTER WAREHOUSE changes: step job, saving checks, verify and receipt jobs, their sensor
    build_warehouse_change_definitions(["TRANSFORM_WH", "LOAD_WH", "BI_WH"], cost),
)
