make demo-migration                                   # DuckDB → DuckDB, the embedded default
dw-dagster demo migration --source postgres --json    # the PostgreSQL server on loopback as the on-premises source
dw-dagster migration status --json                    # every wave: pairs, states, sign-off, reopening
