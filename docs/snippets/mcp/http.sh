export DW_MCP_TOKEN=$(openssl rand -hex 32)
.venv/bin/dw-dagster mcp --http 127.0.0.1:8808 -w workspace.yaml --dagster-home /srv/dagster
#   or: --oauth-issuer https://login.grocer.example --oauth-audience dw-mcp
claude mcp add --transport http dw-dagster http://127.0.0.1:8808/mcp --header "Authorization: Bearer $DW_MCP_TOKEN"
