dw-dagster approvals serve --host 127.0.0.1 --port 8770 --base-url https://approvals.grocer.example   # behind a TLS proxy
