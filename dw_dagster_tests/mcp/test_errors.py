"""Bad input and missing pieces: each a tool error with a sentence that says what to do, never a stack trace."""

import dagster as dg
import pytest

from dw_dagster_tests.mcp.client import assert_clear_error, call

pytestmark = pytest.mark.anyio

HOSTILE = 'store_sales_line"; DROP TABLE pos.sales_line; --\''


async def test_unknown_asset_names_the_closest(server):
    _, err = await call(server, "list_incidents", {"asset": "store_sale_line"})
    assert_clear_error(err, "no asset 'store_sale_line'", "the closest are store_sales_line")
    _, err = await call(server, "explain_table", {"asset": "fct_store_sales"})
    assert_clear_error(err, "the closest are", "fct_store_sales_daily")


async def test_an_asset_key_with_quotes_and_semicolons_is_an_unknown_asset(server, demo_env):
    from dw_dagster.core.ledger import ledger_for

    instance = dg.DagsterInstance.from_config(str(demo_env.home))
    before = (len(instance.get_run_records()), len(ledger_for(instance).incidents()))
    for tool, args in [("list_incidents", {"asset": HOSTILE}), ("get_incident_history", {"asset": HOSTILE}),
                       ("explain_table", {"asset": HOSTILE}), ("get_quality_score", {"asset": HOSTILE}),
                       ("run_quality_check", {"asset": HOSTILE}), ("get_audit_trail", {"asset": HOSTILE}),
                       ("trace_cross_platform_lineage", {"asset": HOSTILE}), ("blast_radius_analysis", {"node": HOSTILE}),
                       ("diagnose_incident", {"asset": HOSTILE, "check": "x'; --"})]:
        _, err = await call(server, tool, args)
        assert_clear_error(err, "store_sales_line")
        assert "DROP TABLE" in err  # the caller's text is quoted back, not run
    _, err = await call(server, "list_incidents", {"asset": '["store_sales_line", 1]'})
    assert_clear_error(err, "asset", "valid string")  # the input schema refuses it
    _, err = await call(server, "list_incidents", {"asset": ["store_sales_line'; --"]})
    assert_clear_error(err, "the closest are store_sales_line")
    for form in ('["store_sales_line"]', ["store_sales_line"], "/store_sales_line/"):
        ok, err = await call(server, "list_incidents", {"asset": form})
        assert err is None and ok["asset"] == "store_sales_line" and ok["total"] == 1
    assert (len(instance.get_run_records()), len(ledger_for(instance).incidents())) == before


async def test_unknown_incident_and_change_set(server):
    for tool in ("get_incident", "diagnose_incident", "get_root_cause", "remediate"):
        _, err = await call(server, tool, {"incident_id": "lu-000000000000"})
        assert_clear_error(err, "no incident 'lu-000000000000'", "known incidents include lu-", "list_incidents")
    _, err = await call(server, "get_audit_trail", {"change_set_id": "cs-nope'; --"})
    assert_clear_error(err, "no change set", "the closest are cs-")


async def test_arguments_that_do_not_fit(server):
    _, err = await call(server, "get_audit_trail", {})
    assert_clear_error(err, "give either asset or change_set_id")
    _, err = await call(server, "diagnose_incident", {"asset": "store_sales_line"})
    assert_clear_error(err, "give incident_id, or asset and check")
    _, err = await call(server, "list_incidents", {"status": "on fire"})
    assert_clear_error(err, "is not one of", "fixed (verified)")
    _, err = await call(server, "list_incidents", {"since": "last tuesday"})
    assert_clear_error(err, "is not a date", "7d")
    _, err = await call(server, "list_incidents", {"limit": 0})  # the input schema refuses it
    assert_clear_error(err, "limit")
    _, err = await call(server, "blast_radius_analysis", {"node": "fct_store_sales_daily+2"})
    assert_clear_error(err, "give a model name")


async def test_no_instance_at_the_path(tmp_path):
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    srv = build_server(ServerSettings(dagster_home=str(tmp_path / "nowhere"), workspace=""))
    _, err = await call(srv, "list_incidents")
    assert_clear_error(err, f"no Dagster instance at {tmp_path / 'nowhere'}", "DAGSTER_HOME")
    empty = tmp_path / "empty"
    empty.mkdir()
    _, err = await call(build_server(ServerSettings(dagster_home=str(empty), workspace="")), "get_incident", {"incident_id": "x"})
    assert_clear_error(err, "no Dagster instance at", "--dagster-home")
    assert not any(empty.iterdir())  # nothing was created in a folder that is not an instance


@pytest.fixture
def bare_home(tmp_path):
    """A Dagster instance with a run and a materialized asset, but no dw_dagster records."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")

    @dg.asset
    def some_table():
        return 1

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert dg.materialize([some_table], instance=instance).success
    return home


async def test_an_instance_with_no_dw_dagster_records(bare_home):
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    srv = build_server(ServerSettings(dagster_home=str(bare_home), workspace=""))
    for tool, args in [("list_incidents", {}), ("get_incident", {"incident_id": "inc-1"}),
                       ("get_incident_history", {"asset": "some_table"}), ("get_audit_trail", {"asset": "some_table"}),
                       ("diagnose_incident", {"incident_id": "inc-1"}), ("remediate", {"incident_id": "inc-1"})]:
        _, err = await call(srv, tool, args)
        assert_clear_error(err, "holds no dw_dagster records", "make demo")


async def test_no_workspace_and_no_manifest(demo_env):
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    srv = build_server(ServerSettings(dagster_home=str(demo_env.home), workspace=""))  # not even ./workspace.yaml
    _, err = await call(srv, "blast_radius_analysis", {"node": "store_sales_line"})
    assert_clear_error(err, "no dbt manifest", "--manifest")
    for tool in ("explain_table", "get_quality_score", "run_quality_check"):
        _, err = await call(srv, tool, {"asset": "store_sales_line"})
        assert_clear_error(err, "no workspace", "-w workspace.yaml")
    _, err = await call(srv, "trace_cross_platform_lineage", {"asset": "store_sales_line"})
    assert_clear_error(err, "no workspace")
    out, err = await call(srv, "list_incidents")  # the records need no workspace
    assert err is None and out["total"] == 1


async def test_a_workspace_file_that_is_not_one(tmp_path, demo_env):
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    bad = tmp_path / "workspace.yaml"
    bad.write_text("load_from:\n  - python_module: dw_dagster.no_such_module\n")
    srv = build_server(ServerSettings(dagster_home=str(demo_env.home), workspace=str(bad)))
    _, err = await call(srv, "explain_table", {"asset": "store_sales_line"})
    assert_clear_error(err, "no code location of", "loaded", "No module named 'dw_dagster.no_such_module'")
    _, err = await call(build_server(ServerSettings(dagster_home=str(demo_env.home), workspace="", manifests=[str(tmp_path / "m.json")])),
                        "blast_radius_analysis", {"node": "x"})
    assert_clear_error(err, "cannot read the dbt manifest", "target/manifest.json")
