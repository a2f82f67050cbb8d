# an MCP client starts the server without the project's venv on PATH: name the dbt to run
claude mcp add dw-dagster -e DAGSTER_HOME=$PWD/.dw_demo/dagster_home \
  -- $PWD/.venv/bin/dw-dagster mcp -w $PWD/workspace.yaml --dbt-executable $PWD/.venv/bin/dbt
