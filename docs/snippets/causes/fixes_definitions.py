import dagster as dg

from dw_dagster.changes.dedupe import DEDUPE, run_dedupe_step
from dw_dagster.repair.new_tests import build_new_tests_check
from dw_dagster.repair.steps import build_step_jobs

ORDERS = dg.AssetKey("orders")

# runs the tests a fix added, from the merged pipeline repository, in the repair's verify stage
new_tests = build_new_tests_check(ORDERS, resource_key="warehouse", pipeline_root="/srv/pipelines",
                                  tests_dir="dbt_project/tests")
# the step jobs: schema migrations (with their rollbacks) and the duplicated-load replacement
step_jobs = build_step_jobs({DEDUPE: run_dedupe_step}, resource_keys=["warehouse"])
# the verify job holds the check; pass step_jobs and verify to build_remediation_sensor
verify = dg.define_asset_job("dw_verify", selection=dg.AssetSelection.checks(new_tests))
