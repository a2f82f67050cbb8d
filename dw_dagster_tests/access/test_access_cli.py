"""``dw-dagster access request … --json`` on PostgreSQL, as a person runs it (``--login`` through the
identity provider's real login in a "browser"), and ``access list``.

The Done-when of the issue: the JSON carries ``request_id, grantee, statements, rollback,
newly_reachable [{table, columns, privilege}], sensitive [{table, column, category}], approvers,
expires_at``, and ``newly_reachable`` is exactly what ``has_table_privilege`` /
``has_column_privilege`` say after the grant minus before — proven here by running the printed
statements inside a transaction that is rolled back.
"""

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dw_dagster.cli import main
from dw_dagster_tests.access.flow import ANA, BO, DANA, SAM, services, write_domains
from dw_dagster_tests.access.pg_world import pg_world, proven_newly
from dw_dagster_tests.conftest import POSTGRES_URL

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def outside():
    with services() as s:
        yield s


@pytest.fixture
def world(outside, tmp_path):
    idp = outside[0]
    with pg_world() as pg:
        pg.run(f"CREATE TABLE {pg.t('ledger')} (id int, amount numeric)",
               f"CREATE TABLE {pg.t('customers')} (id int, email text, region text)",
               f'GRANT USAGE ON SCHEMA "{pg.schema}" TO PUBLIC')
        analyst = pg.create_role("analyst")
        pg.create_role("dana")
        pg.run(f'GRANT SELECT ON {pg.t("ledger")} TO "{analyst}"', f'GRANT SELECT (id, email) ON {pg.t("customers")} TO "{analyst}"')
        domains = tmp_path / "domains.yaml"
        write_domains(domains, pg, idp.url)
        home = tmp_path / "home"
        home.mkdir()
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        browser = tmp_path / "browser.py"
        browser.write_text("import sys, httpx\nhttpx.get(sys.argv[1] + '&login_hint=" + SAM.replace("@", "%40")
                           + "', follow_redirects=True, timeout=30)\n")
        env = {**os.environ, "DAGSTER_HOME": str(home), "DW_DOMAINS_FILE": str(domains),
               "BROWSER": f"{sys.executable} {browser} %s"}
        yield pg, analyst, env, home


def _cli(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dw-dagster"), *args], env=env, capture_output=True, text=True, timeout=240)


def test_access_request_json_is_what_the_server_says_the_grant_opens(world):
    pg, analyst, env, home = world
    out = _cli(env, "access", "request", "--database", POSTGRES_URL, "--who", DANA, "--grant", analyst, "--for", "8h",
               "--why", "quarter close", "--json", "--login")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"request_id", "grantee", "statements", "rollback", "newly_reachable", "sensitive", "approvers",
            "expires_at"} <= set(data)
    assert data["request_id"].startswith("acc-") and data["grantee"] == DANA and data["state"] == "pending"
    documented = json.loads((Path(__file__).resolve().parents[2] / "docs/snippets/access/request_output.json").read_text())
    assert set(data) == set(documented)  # docs/snippets/access/request_output.json shows every key, and only those
    assert data["statements"] == [f'GRANT "{analyst}" TO "{pg.role("dana")}"']
    assert data["rollback"] == [f'REVOKE "{analyst}" FROM "{pg.role("dana")}"']
    got = {(x["table"].split(".")[-1], x["privilege"]): (x["table_level"], set(x["columns"])) for x in data["newly_reachable"]}
    assert got == proven_newly(pg, pg.role("dana"), data["statements"])
    assert got == {("ledger", "SELECT"): (True, {"id", "amount"}), ("customers", "SELECT"): (False, {"id", "email"})}
    assert [(s["table"].split(".")[-1], s["column"], s["category"]) for s in data["sensitive"]] == [("customers", "email", "email")]
    assert data["approvers"] == sorted([ANA, SAM, BO, DANA]) and data["requested_by"] == SAM
    ends = dt.datetime.fromisoformat(data["expires_at"])
    assert abs((ends - dt.datetime.now(dt.timezone.utc)).total_seconds() - 8 * 3600) < 120
    listed = json.loads(CliRunner().invoke(main, ["access", "list", "--json"], env=env).output)
    assert [(r["request_id"], r["state"]) for r in listed] == [(data["request_id"], "pending")]
    assert json.loads(CliRunner().invoke(main, ["access", "list", "--active", "--json"], env=env).output) == []


def test_dry_run_and_nothing_new_record_nothing(world):
    pg, analyst, env, home = world
    runner = CliRunner()
    base = ["access", "request", "--database", POSTGRES_URL, "--who", DANA, "--for", "30m", "--why", "look", "--json"]
    res = runner.invoke(main, [*base, "--tables", f"{pg.schema}.customers", "--columns", "region", "--dry-run"],
                        env={k: v for k, v in world[2].items() if k != "DAGSTER_HOME"} | {"DAGSTER_HOME": ""})
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["request_id"] is None and data["state"] == "dry-run"
    assert [(x["table"].split(".")[-1], x["columns"]) for x in data["newly_reachable"]] == [("customers", ["region"])]
    pg.run(f'GRANT SELECT ON {pg.t("ledger")} TO "{pg.role("dana")}"')
    res = runner.invoke(main, [*base, "--tables", f"{pg.schema}.ledger", "--requester", SAM], env=world[2])
    assert res.exit_code == 0 and json.loads(res.output)["state"] == "opens nothing new"
    assert json.loads(runner.invoke(main, ["access", "list", "--json"], env=world[2]).output) == []
    res = runner.invoke(main, [*base, "--tables", "nope.t"], env=world[2])
    assert res.exit_code == 3 and "no table" in res.output


def test_a_resource_key_is_found_in_the_workspaces_code_locations(world, tmp_path, monkeypatch):
    """``--database warehouse``: the access example's location (a workspace file) holds the resource."""
    pg, analyst, env, home = world
    access_home = tmp_path / "access_home"
    access_home.mkdir()
    (access_home / "domains.yaml").write_text(Path(env["DW_DOMAINS_FILE"]).read_text())
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text("load_from:\n  - python_module:\n      module_name: dw_dagster_examples.access.definitions\n"
                         "      location_name: access\n")
    monkeypatch.setenv("DW_ACCESS_HOME", str(access_home))
    monkeypatch.setenv("DW_ACCESS_DEMO_URL", POSTGRES_URL)
    res = CliRunner().invoke(main, ["access", "request", "--database", "warehouse", "--who", DANA, "--grant", analyst,
                                    "--for", "1h", "--why", "look", "--dry-run", "--json", "--workspace", str(workspace)],
                             env={**env, "DAGSTER_HOME": ""})
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["state"] == "dry-run" and {x["table"].split(".")[-1] for x in data["newly_reachable"]} == {"ledger", "customers"}
    res = CliRunner().invoke(main, ["access", "request", "--database", "nope", "--who", DANA, "--grant", analyst,
                                    "--for", "1h", "--why", "look", "--dry-run", "--workspace", str(workspace)],
                             env={**env, "DAGSTER_HOME": ""})
    assert res.exit_code == 2 and "no database resource" in res.output and "warehouse" in res.output
