import dagster as dg
from dw_dagster import DatabaseResource, build_null_rate_check, build_reconciliation_checks

recon = build_reconciliation_checks(
    asset="orders", source_asset="orders_source", source_table="src.orders", target_table="tgt.orders",
    slice_by=["region"], measures=["amount"], key_columns=["id"], blocking=True)  # stops the deploy
nulls = build_null_rate_check(asset="orders", table="tgt.orders", columns=["region"], name="region_nulls",
                              severity=dg.AssetCheckSeverity.WARN)              # recorded, exits 0
defs = dg.Definitions(
    assets=[dg.AssetSpec("orders"), dg.AssetSpec("orders_source")],
    asset_checks=[recon, nulls],
    jobs=[dg.define_asset_job("ci_checks", selection=dg.AssetSelection.all_asset_checks())],
    resources={"source_db": DatabaseResource(url=dg.EnvVar("CI_WAREHOUSE")),
               "warehouse": DatabaseResource(url=dg.EnvVar("CI_WAREHOUSE"))},
)
