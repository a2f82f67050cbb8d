"""Streamable HTTP on loopback: 401 without a token or with a wrong one, 200 with the right one; OAuth access
tokens checked against the identity provider's JWKS; the token never in a log line."""

import logging

import httpx
import pytest

from dw_dagster_tests.harness.asgi_server import serve

pytestmark = pytest.mark.anyio

TOKEN = "mcp-test-token-" + "7f3a9c" * 6
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def http_server(demo, workspace, **auth):
    """``make_app`` for :func:`serve`: the MCP server over HTTP with ``auth_kwargs(**auth)``."""
    from dw_dagster.mcp.command import auth_kwargs, http_app
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    def make(base):
        port = int(base.rsplit(":", 1)[1])
        srv = build_server(ServerSettings(dagster_home=str(demo.home), workspace=str(workspace)),
                           **auth_kwargs(host="127.0.0.1", port=port, **auth))
        return http_app(srv, host="127.0.0.1")

    return make


def post(base, token=None):
    headers = dict(HEADERS, **({"Authorization": f"Bearer {token}"} if token is not None else {}))
    return httpx.post(f"{base}/mcp", json=INIT, headers=headers, timeout=60)


async def list_incidents_over_http(base, token):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(f"{base}/mcp", http_client=http)) as c:
            r = await c.call_tool("list_incidents", {})
    return r


async def test_bearer_token(demo_env, store_sales_workspace, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    with serve(http_server(demo_env, store_sales_workspace, token=TOKEN, oauth=None), lifespan="on") as base:
        none = post(base)
        assert none.status_code == 401 and none.headers["www-authenticate"].startswith("Bearer")
        assert post(base, "not-the-token").status_code == 401
        assert post(base, TOKEN[:-1] + "0").status_code == 401
        assert post(base, TOKEN + "x").status_code == 401
        ok = post(base, TOKEN)
        assert ok.status_code == 200, ok.text
        r = await list_incidents_over_http(base, TOKEN)
        assert not r.is_error and r.structured_content["total"] == 1
    out, err = capfd.readouterr()
    assert TOKEN not in caplog.text and TOKEN not in out and TOKEN not in err


def test_http_refuses_to_start_without_authentication(demo_env, store_sales_workspace):
    import click

    from dw_dagster.mcp.command import auth_kwargs

    with pytest.raises(click.UsageError, match="needs authentication"):
        auth_kwargs(host="127.0.0.1", port=8808, token=None, oauth=None)
    with pytest.raises(click.UsageError, match="at least 32 characters"):
        auth_kwargs(host="127.0.0.1", port=8808, token="short", oauth=None)


@pytest.fixture
def idp():
    from dw_dagster_dev.fakes.oidc_server import start_oidc_server

    server = start_oidc_server(users={"dev@grocer.example": {"sub": "sub-dev", "email_verified": True}})
    yield server
    server.stop()


async def test_oauth_access_tokens_verified_through_the_jwks(demo_env, store_sales_workspace, idp, caplog, capfd):
    from dw_dagster.mcp.auth import OAuthConfig

    caplog.set_level(logging.DEBUG)
    good = idp.state.issue(email="dev@grocer.example", aud="dw-mcp")
    wrong_aud = idp.state.issue(email="dev@grocer.example", aud="another-api")
    expired = idp.state.issue(email="dev@grocer.example", aud="dw-mcp", exp_in=-600, iat_offset=-1200)
    unsigned = idp.state.issue(email="dev@grocer.example", aud="dw-mcp", alg="none")
    confused = idp.state.issue(email="dev@grocer.example", aud="dw-mcp", alg="HS256-public-key")
    foreign = idp.state.issue(email="dev@grocer.example", aud="dw-mcp", sign_with="unpublished")
    oauth = OAuthConfig(issuer=idp.url, audience="dw-mcp")
    with serve(http_server(demo_env, store_sales_workspace, token=None, oauth=oauth), lifespan="on") as base:
        assert post(base).status_code == 401
        for bad in (wrong_aud, expired, unsigned, confused, foreign, TOKEN):
            assert post(base, bad).status_code == 401
        assert post(base, good).status_code == 200
        r = await list_incidents_over_http(base, good)
        assert not r.is_error and r.structured_content["incidents"][0]["cause_kind"] == "late_rows_behind_watermark"
        meta = httpx.get(f"{base}/.well-known/oauth-protected-resource/mcp", timeout=10)
        assert meta.status_code == 200 and meta.json()["authorization_servers"] == [idp.url]
    out, err = capfd.readouterr()
    for t in (good, wrong_aud, expired):
        assert t not in caplog.text and t not in out and t not in err
    assert "refused an access token: wrong audience" in caplog.text  # the reason is logged, never the token
