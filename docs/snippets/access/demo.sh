dw-dagster demo access --json                 # PostgreSQL on 127.0.0.1:5432; --database-url for another server
