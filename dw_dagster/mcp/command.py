"""The ``dw-dagster mcp`` command: serve the MCP tools over stdio (default) or streamable HTTP.

Kept apart from :mod:`dw_dagster.mcp.server` so the CLI can list the command without the optional
``mcp`` extra installed; running it without the extra says how to install it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 < int(port) < 65536):
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8808)", param_hint="--http")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def http_app(server, *, host: str):
    """The Starlette app serving ``server`` at ``/mcp`` with bearer auth (what ``--http`` runs).

    Args:
        server: from :func:`dw_dagster.mcp.server.build_server` built with :func:`auth_kwargs`.
        host: the interface it listens on (the SDK's DNS-rebinding protection allows it as Host).

    Returns:
        The ASGI app.
    """
    return server.streamable_http_app(streamable_http_path="/mcp", host=host)


def auth_kwargs(*, host: str, port: int, token: str | None, oauth) -> dict:
    """``token_verifier`` and ``auth`` for :func:`~dw_dagster.mcp.server.build_server` on HTTP.

    Args:
        token: the shared bearer token (``$DW_MCP_TOKEN``), or None.
        oauth: an :class:`~dw_dagster.mcp.auth.OAuthConfig`, or None.

    Raises:
        click.UsageError: neither is given (the HTTP endpoint is never open), or the token is too short.
    """
    from mcp.server.auth.settings import AuthSettings

    from dw_dagster.mcp.auth import TOKEN_ENV, AnyOfVerifier, OAuthTokenVerifier, StaticTokenVerifier

    if not token and oauth is None:
        raise click.UsageError(f"--http needs authentication: set ${TOKEN_ENV} (a shared token of at least 32 "
                               "characters) or give --oauth-issuer and --oauth-audience")
    verifiers = []
    if token:
        try:
            verifiers.append(StaticTokenVerifier(token))
        except ValueError as e:
            raise click.UsageError(str(e)) from e
    if oauth is not None:
        try:
            verifiers.append(OAuthTokenVerifier(oauth))
        except ValueError as e:
            raise click.UsageError(f"--oauth-issuer/--oauth-audience: {e}") from e
    base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    settings = AuthSettings(issuer_url=oauth.issuer if oauth is not None else base,
                            resource_server_url=f"{base}/mcp" if oauth is not None else None,
                            validate_token_resource=False if oauth is not None else None)
    return {"token_verifier": verifiers[0] if len(verifiers) == 1 else AnyOfVerifier(*verifiers), "auth": settings}


@click.command("mcp")
@click.option("--http", "http", default=None, metavar="HOST:PORT",
              help="Serve streamable HTTP at http://HOST:PORT/mcp (needs $DW_MCP_TOKEN or --oauth-*); default stdio.")
@click.option("-w", "--workspace", type=click.Path(dir_okay=False), default=None,
              help="Workspace file whose code locations give the asset graph and dbt manifest (default ./workspace.yaml "
                   "when present).")
@click.option("--location", "locations", multiple=True, help="Only this code location of the workspace (repeatable).")
@click.option("--manifest", "manifests", multiple=True, type=click.Path(dir_okay=False),
              help="A dbt manifest.json for the lineage tools, besides the workspace's (repeatable).")
@click.option("--domains", type=click.Path(dir_okay=False), default=None,
              help="Domains file (owners, autonomy) for explain_table; default $DW_DOMAINS_FILE.")
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None,
              help="Dagster instance directory (default: $DAGSTER_HOME).")
@click.option("--oauth-issuer", default=lambda: os.environ.get("DW_MCP_OAUTH_ISSUER"),
              help="Accept OAuth access tokens from this issuer on --http (verified through its JWKS); "
                   "default $DW_MCP_OAUTH_ISSUER.")
@click.option("--oauth-audience", default=lambda: os.environ.get("DW_MCP_OAUTH_AUDIENCE"),
              help="The audience those tokens must be issued to; default $DW_MCP_OAUTH_AUDIENCE.")
@click.option("--oauth-email-claim", default="email", show_default=True, help="The claim naming the caller.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="WARNING",
              show_default=True, help="The server's log level (stderr).")
@click.option("--dbt-executable", type=click.Path(dir_okay=False), default=None,
              help="The dbt the code locations run (sets $DW_DBT_EXECUTABLE and puts its folder first on PATH); "
                   "for a server started by an MCP client without the project's venv activated.")
def mcp_command(http, workspace, locations, manifests, domains, dagster_home, oauth_issuer, oauth_audience,
                oauth_email_claim, log_level, dbt_executable) -> None:
    """Serve dw_dagster's records and lineage to a coding assistant (Model Context Protocol).

    Tools: list_incidents, get_incident, diagnose_incident, get_root_cause, blast_radius_analysis,
    trace_cross_platform_lineage, get_incident_history, run_quality_check, get_quality_score,
    explain_table, get_audit_trail, generate_migration, remediate (proposes only). Nothing here
    approves, rejects, merges, resumes or runs a repair.
    """
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise click.UsageError("the MCP server needs the mcp extra: pip install 'dw-dagster[mcp]'") from None
    import logging

    if dbt_executable:
        exe = Path(dbt_executable).expanduser().resolve()
        if not exe.is_file():
            raise click.BadParameter(f"no dbt at {exe}", param_hint="--dbt-executable")
        os.environ["DW_DBT_EXECUTABLE"] = str(exe)
        os.environ["PATH"] = f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    from dw_dagster.mcp.auth import TOKEN_ENV, OAuthConfig
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    if workspace is not None and not Path(workspace).is_file():
        raise click.BadParameter(f"no workspace file at {workspace}", param_hint="-w")
    settings = ServerSettings(dagster_home=dagster_home, workspace=workspace, manifests=list(manifests), domains=domains,
                              locations=list(locations) or None)
    for name in ("dw_dagster", "alembic"):  # alembic: Dagster's storage says INFO each time it opens
        logging.getLogger(name).setLevel(log_level)
    if http is None:
        build_server(settings).run()  # stdio: fd 1 carries the protocol; anything printed goes to stderr
        return
    host, port = _host_port(http)
    oauth = None
    if oauth_issuer or oauth_audience:
        if not (oauth_issuer and oauth_audience):
            raise click.UsageError("OAuth needs both --oauth-issuer and --oauth-audience")
        oauth = OAuthConfig(issuer=oauth_issuer, audience=oauth_audience, email_claim=oauth_email_claim)
    kwargs = auth_kwargs(host=host, port=port, token=os.environ.get(TOKEN_ENV) or None, oauth=oauth)
    server = build_server(settings, **kwargs)
    from dw_dagster.core.extras import require

    require("mcp")
    import uvicorn

    click.echo(f"dw-dagster mcp: streamable HTTP at http://{host}:{port}/mcp "
               f"({'OAuth ' + oauth.issuer if oauth else ''}{' and ' if oauth and os.environ.get(TOKEN_ENV) else ''}"
               f"{'bearer token $' + TOKEN_ENV if os.environ.get(TOKEN_ENV) else ''})", err=True)
    uvicorn.run(http_app(server, host=host), host=host, port=port, log_level=log_level.lower(),
                server_header=False)
    sys.exit(0)


__all__ = ["auth_kwargs", "http_app", "mcp_command"]
