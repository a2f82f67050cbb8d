pip install dw-dagster                         # the library, with DuckDB as the embedded default
pip install 'dw-dagster[snowflake,mcp]'        # extras: postgres, snowflake, bigquery, mysql, mcp, review, slack
