"""``build_dw_definitions`` on a YAML file (the examples' way): templates, relative paths, errors
naming the file and the field, and integrations switched on by their credentials (``optional``)."""

from __future__ import annotations

import dagster as dg
import pytest

from dw_dagster import DwConfigError, build_dw_definitions, load_dataops_config

OWNER = "ana.silva@shop.example"

CONFIG = """\
domains: domains.yaml
databases:
  source: {url: "duckdb:///{{ home }}/source.duckdb"}
  warehouse: {url: "{{ env('TEST_DW_WAREHOUSE_URL', 'duckdb:///' ~ home ~ '/warehouse.duckdb') }}"}
assets:
  - key: sales
    table: wh.sales
    database: warehouse
    checks:
      reconciliation: {source: {database: source, table: src.sales, asset: src/sales}, slice_by: [region]}
integrations:
  lightup:
    optional: true
    tables: {"pos:src.sales": src/sales, "wh:wh.sales": sales}
    compare_metrics: "{{ env('TEST_DW_COMPARE_METRICS', '') }}"
  pagerduty: {optional: true, routing_key_env: TEST_DW_PD_KEY, api_token_env: TEST_DW_PD_TOKEN}
  slack: {optional: true, bot_token_env: TEST_DW_SLACK_TOKEN, channel: "{{ env.TEST_DW_SLACK_CHANNEL }}"}
"""

DOMAINS = f"""\
domains:
  - name: sales
    assets: [[sales]]
    approvers: [{OWNER}]
"""

CREDENTIALS = ("LIGHTUP_CREDENTIAL_FILE", "LIGHTUP_SERVER", "LIGHTUP_REFRESH_TOKEN", "TEST_DW_PD_KEY", "TEST_DW_PD_TOKEN",
               "TEST_DW_SLACK_TOKEN", "TEST_DW_SLACK_CHANNEL", "TEST_DW_COMPARE_METRICS", "TEST_DW_WAREHOUSE_URL")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    for k in CREDENTIALS:
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "dataops.yaml").write_text(CONFIG)
    (tmp_path / "domains.yaml").write_text(DOMAINS)
    return tmp_path


def _sensors(defs: dg.Definitions) -> set[str]:
    return {s.name for s in defs.get_repository_def().sensor_defs}


def test_templates_read_the_scope_and_the_environment(folder, monkeypatch):
    cfg = load_dataops_config(folder / "dataops.yaml", scope={"home": "/srv/sales"})
    assert cfg.databases["source"].url == "duckdb:////srv/sales/source.duckdb"
    assert cfg.databases["warehouse"].url == "duckdb:////srv/sales/warehouse.duckdb"
    assert cfg.integrations.lightup.compare_metrics == [] and cfg.integrations.slack.channel is None
    monkeypatch.setenv("TEST_DW_WAREHOUSE_URL", "postgresql+psycopg://wh/db")
    monkeypatch.setenv("TEST_DW_COMPARE_METRICS", "m-1, m-2,")
    monkeypatch.setenv("TEST_DW_SLACK_CHANNEL", "C0DATA")
    cfg = load_dataops_config(folder / "dataops.yaml", scope={"home": "/srv/sales"})
    assert cfg.databases["warehouse"].url == "postgresql+psycopg://wh/db"
    assert cfg.integrations.lightup.compare_metrics == ["m-1", "m-2"] and cfg.integrations.slack.channel == "C0DATA"


def test_relative_paths_resolve_against_the_file_or_base_dir(folder, tmp_path_factory):
    defs = build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
    assert defs.resolve_job_def("dw_approve_change_set") is not None
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    with pytest.raises(DwConfigError, match="domains"):  # no domains.yaml there
        build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)}, base_dir=elsewhere)
    (elsewhere / "domains.yaml").write_text(DOMAINS)
    assert build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)}, base_dir=elsewhere)


def test_scope_needs_a_file(folder):
    cfg = load_dataops_config(folder / "dataops.yaml", scope={"home": str(folder)})
    with pytest.raises(DwConfigError, match="scope"):
        build_dw_definitions(cfg, scope={"home": str(folder)}, base_dir=folder)


@pytest.mark.parametrize("old, new, field", [
    ("    optional: true\n", "    optinal: true\n", "optinal"),  # an unknown field
    ("    optional: true\n", "    optional: maybe\n", "optional"),  # a wrong type
    ("  slack: {optional: true,", "  slack: {optional: true, colour: red,", "colour"),  # unknown, deeper
    ("      reconciliation: {", "      reconciliation: {name: [1, 2], ", "name"),  # a wrong type in a check
])
def test_a_mistake_names_the_file_and_the_field(folder, old, new, field):
    assert old in CONFIG
    (folder / "dataops.yaml").write_text(CONFIG.replace(old, new, 1))
    with pytest.raises(DwConfigError) as e:
        build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
    assert str(folder / "dataops.yaml") in str(e.value) and field in str(e.value), str(e.value)


def test_a_template_without_its_scope_names_the_file(folder):
    with pytest.raises(DwConfigError) as e:
        load_dataops_config(folder / "dataops.yaml")
    assert str(folder / "dataops.yaml") in str(e.value) and "home" in str(e.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(DwConfigError, match="nope.yaml: cannot read"):
        load_dataops_config(tmp_path / "nope.yaml")


def test_optional_integrations_stay_out_without_their_credentials(folder):
    defs = build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
    assert _sensors(defs) == {"dw_check_incident_sensor", "dw_remediation_sensor", "dw_expiry_sensor"}
    assert not {"lightup", "pager", "slack"} & set(defs.resources)


def test_optional_integrations_come_in_with_their_credentials(folder, monkeypatch):
    monkeypatch.setenv("LIGHTUP_SERVER", "https://lightup.example")
    monkeypatch.setenv("LIGHTUP_REFRESH_TOKEN", "r")
    monkeypatch.setenv("TEST_DW_PD_KEY", "k")
    monkeypatch.setenv("TEST_DW_SLACK_TOKEN", "xoxb-1")
    monkeypatch.setenv("TEST_DW_COMPARE_METRICS", "m-1")
    defs = build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
    assert _sensors(defs) == {"dw_check_incident_sensor", "dw_remediation_sensor", "dw_expiry_sensor",
                              "dw_lightup_incident_sensor", "dw_notification_sensor"}
    assert {"lightup", "pager", "slack"} <= set(defs.resources)
    assert defs.resources["pager"].api_token is None  # its token's variable is not set: pages without notes
    # the compare check sits on the watched asset among the tables (not the first table's)
    checks = {k for c in defs.asset_checks for k in c.check_keys}
    assert dg.AssetCheckKey(dg.AssetKey("sales"), "lightup_compare") in checks
    monkeypatch.setenv("TEST_DW_PD_TOKEN", "t")
    assert build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)}).resources["pager"].api_token


def test_compare_asset_overrides_the_default(folder, monkeypatch):
    monkeypatch.setenv("LIGHTUP_CREDENTIAL_FILE", str(folder / "cred.json"))
    monkeypatch.setenv("TEST_DW_COMPARE_METRICS", "m-1")
    text = CONFIG.replace("    optional: true\n", "    optional: true\n    compare_asset: src/sales\n", 1)
    (folder / "dataops.yaml").write_text(text)
    defs = build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
    checks = {k for c in defs.asset_checks for k in c.check_keys}
    assert dg.AssetCheckKey(dg.AssetKey(["src", "sales"]), "lightup_compare") in checks


def test_an_integration_not_optional_is_there_without_credentials(folder):
    text = CONFIG.replace("slack: {optional: true,", "slack: {optional: false,")
    (folder / "dataops.yaml").write_text(text)
    defs = build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
    assert "slack" in defs.resources and "dw_notification_sensor" in _sensors(defs)


def test_the_examples_configurations_validate():
    """Both examples' dataops.yaml files are valid configurations (their own folders as home)."""
    import dw_dagster_examples.orders.definitions as orders
    import dw_dagster_examples.store_sales.definitions as store_sales

    for module in (store_sales, orders):
        cfg = load_dataops_config(module.CONFIG, scope={"home": "/h"})
        assert cfg.databases["warehouse"].url == "duckdb:////h/data/warehouse.duckdb"
        assert [a.key for a in cfg.assets] == [module.TARGET_ASSET.to_user_string()]


def test_a_source_that_is_no_asset_needs_no_asset_key(tmp_path):
    """``source.asset`` left out: the check has no extra dependency (it once depended on its own
    asset and Dagster refused the definitions), and it compares the real tables."""
    import duckdb

    for name, schema, rows in (("source", "src", [("N", 5), ("S", 3)]), ("warehouse", "wh", [("N", 5), ("S", 2)])):
        with duckdb.connect(str(tmp_path / f"{name}.duckdb")) as con:
            con.execute(f"CREATE SCHEMA {schema}")
            con.execute(f"CREATE TABLE {schema}.sales (region VARCHAR, n INTEGER)")
            con.executemany(f"INSERT INTO {schema}.sales SELECT ?, range FROM range(?)", rows)
    (tmp_path / "dataops.yaml").write_text(CONFIG.replace(", asset: src/sales}", "}").split("integrations:")[0])
    (tmp_path / "domains.yaml").write_text(DOMAINS)

    @dg.asset(name="sales")
    def sales() -> None:
        """The team's own asset (the table is already loaded)."""

    defs = dg.Definitions.merge(dg.Definitions(assets=[sales]),
                                build_dw_definitions(tmp_path / "dataops.yaml", scope={"home": str(tmp_path)}))
    check = next(c for c in defs.asset_checks if dg.AssetCheckKey(dg.AssetKey("sales"), "reconciliation") in c.check_keys)
    assert not list(check.check_specs)[0].additional_deps
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(raise_on_error=False)
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.metadata["dw/gap_rows"].value == 1


@pytest.mark.parametrize("freshness, ok", [("{timestamp_column: sold_at, max_lag_days: 1, deadline_timezone: America/Los_Angeles}", True),
                                           ("{timestamp_column: sold_at, max_lag_hours: 26}", True),
                                           ("{timestamp_column: sold_at}", False)])
def test_freshness_takes_calendar_days_or_elapsed_hours(folder, freshness, ok):
    text = CONFIG.replace("slice_by: [region]}", f"slice_by: [region]}}\n      freshness: {freshness}")
    (folder / "dataops.yaml").write_text(text)
    if not ok:
        with pytest.raises(DwConfigError, match="freshness.*max_lag_hours .*or max_lag_days|max_lag_days"):
            build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
        return
    defs = build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
    assert any(dg.AssetCheckKey(dg.AssetKey("sales"), "freshness") in c.check_keys for c in defs.asset_checks)


def test_sensor_interval_reaches_the_loop_sensors_and_is_bounded(folder, monkeypatch):
    """``sensor_interval_seconds`` (templated from the environment, as the store-sales example does)
    sets the incident, remediation and notification sensors' interval; below Dagster's 5 s loop it is refused."""
    monkeypatch.setenv("TEST_DW_SLACK_TOKEN", "xoxb-test")
    text = CONFIG + "sensor_interval_seconds: \"{{ env('TEST_DW_INTERVAL', '30') }}\"\n"
    (folder / "dataops.yaml").write_text(text)
    monkeypatch.setenv("TEST_DW_INTERVAL", "7")
    repo = build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)}).get_repository_def()
    intervals = {s.name: s.minimum_interval_seconds for s in repo.sensor_defs}
    for name in ("dw_check_incident_sensor", "dw_remediation_sensor", "dw_notification_sensor"):
        assert intervals[name] == 7, intervals
    monkeypatch.setenv("TEST_DW_INTERVAL", "1")
    with pytest.raises(DwConfigError, match="sensor_interval_seconds"):
        build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
