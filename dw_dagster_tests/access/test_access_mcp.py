"""The MCP tool ``request_access`` only proposes: a draft over stdio (nobody is proven), a pending
request when the HTTP endpoint's OAuth access token proved the caller; never an approval or a grant."""

import anyio
import httpx
import pytest

from dw_dagster.core.ledger import ledger_for
from dw_dagster_tests.access.flow import CLIENT, DANA, SAM, services, write_domains
from dw_dagster_tests.access.pg_world import pg_world
from dw_dagster_tests.conftest import POSTGRES_URL
from dw_dagster_tests.mcp.client import assert_clear_error, call


@pytest.fixture(scope="module")
def outside():
    with services() as s:
        yield s


@pytest.fixture
def world(outside, tmp_path):
    import dagster as dg

    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    idp = outside[0]
    with pg_world() as pg:
        pg.run(f"CREATE TABLE {pg.t('ledger')} (id int, amount numeric)")
        analyst = pg.create_role("analyst")
        pg.create_role("dana")
        pg.run(f'GRANT SELECT ON {pg.t("ledger")} TO "{analyst}"')
        domains = tmp_path / "domains.yaml"
        write_domains(domains, pg, idp.url)
        home = tmp_path / "home"
        home.mkdir()
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        server = build_server(ServerSettings(dagster_home=str(home), workspace="", domains=str(domains)))
        with dg.DagsterInstance.from_config(str(home)) as instance:
            yield pg, analyst, server, instance, idp


ARGS = dict(database=POSTGRES_URL, who=DANA, why="close the quarter", duration="1h")


def test_over_stdio_the_request_is_a_draft_nobody_is_asked(world):
    pg, analyst, server, instance, _ = world
    out, err = anyio.run(call, server, "request_access", {**ARGS, "grant": analyst})
    assert err is None, err
    assert out["state"] == "draft" and out["requested_by"] is None and out["change_sets"] == []
    assert "access confirm " + out["request_id"] in out["next"]
    assert [x["table"].split(".")[-1] for x in out["newly_reachable"]] == ["ledger"]
    assert ledger_for(instance).access_row(out["request_id"]).state == "draft"
    assert ledger_for(instance).change_set_rows() == []
    dry, err = anyio.run(call, server, "request_access", {**ARGS, "grant": analyst, "dry_run": True})
    assert dry["state"] == "dry-run" and dry["request_id"] is None
    _, err = anyio.run(call, server, "request_access", {**ARGS, "tables": ["nope.t"]})
    assert_clear_error(err, "no table")


def test_a_caller_proven_by_an_oauth_token_files_a_pending_request(world):
    """The HTTP endpoint's bearer token, verified by the same OIDC verifier the approvals use."""
    from mcp.server.auth.middleware.auth_context import auth_context_var
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

    from dw_dagster.mcp.auth import OAuthConfig, OAuthTokenVerifier

    pg, analyst, server, instance, idp = world
    raw = httpx.post(idp.url + "/_fake/issue", json={"email": SAM, "aud": CLIENT}).json()["id_token"]
    token = anyio.run(OAuthTokenVerifier(OAuthConfig(issuer=idp.url, audience=CLIENT)).verify_token, raw)
    assert token is not None
    mark = auth_context_var.set(AuthenticatedUser(token))
    try:
        out, err = anyio.run(call, server, "request_access", {**ARGS, "grant": analyst})
    finally:
        auth_context_var.reset(mark)
    assert err is None, err
    assert out["state"] == "pending" and out["requested_by"] == SAM and out["change_sets"] == [
        f"ar-{out['request_id'][4:]}-finance"]
    row = ledger_for(instance).access_row(out["request_id"])
    assert row.state == "pending" and row.requested_by == SAM
