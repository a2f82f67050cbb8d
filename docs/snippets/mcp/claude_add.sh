claude mcp add --transport sse lightup \
  "https://mcp.grocer.lightup.ai/sse?host=https://app.grocer.lightup.ai&refresh_token=$LIGHTUP_REFRESH_TOKEN" -s user
claude mcp add mage-agent -- mage-agent mcp
claude mcp add dw-dagster \
  -e DAGSTER_HOME=$PWD/.dw_demo/dagster_home \
  -e DW_APPROVAL_SIGNING_KEY_FILE=$PWD/.dw_demo/dagster_home/approval_signing.key \
  -e DW_DOMAINS_FILE=$PWD/.dw_demo/store_sales/domains.yaml \
  -- $PWD/.venv/bin/dw-dagster mcp -w $PWD/workspace.yaml
