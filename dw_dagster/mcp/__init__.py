"""dw_dagster as an MCP server (``dw-dagster mcp``; the optional extra ``dw-dagster[mcp]``).

:mod:`.server` builds the server and its tools (:func:`~dw_dagster.mcp.server.build_server`),
grouped by area: :mod:`.incidents`, :mod:`.diagnosis`, :mod:`.lineage`, :mod:`.quality`,
:mod:`.audit`, :mod:`.changes`; :mod:`.state` holds the instance, workspace and errors shared by
them, :mod:`.workspace` loads the code locations of a workspace file, :mod:`.auth` guards the HTTP
transport and :mod:`.command` is the CLI command. Nothing in this package is imported by
``import dw_dagster``: the MCP SDK is needed only to serve.
"""
