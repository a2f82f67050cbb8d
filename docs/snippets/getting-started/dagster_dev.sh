DAGSTER_HOME=$PWD/.dw_demo/dagster_home DW_STORE_SALES_HOME=$PWD/.dw_demo/store_sales \
DW_APPROVAL_SIGNING_KEY=$(cat .dw_demo/dagster_home/approval_signing.key) \
.venv/bin/dagster dev -w workspace.yaml
