"""Mage per asset in the loop's configuration: the ``mage`` resource, the verify stage's rerun check, the
diagnoser's Mage pipelines; left out when optional and no URL is set."""

from __future__ import annotations

import dagster as dg
import pytest

from dw_dagster import DwConfigError, build_dw_definitions
from dw_dagster.integrations.mage import MageResource

CONFIG = """\
domains: {domains: [{name: shop, assets: [[orders]], approvers: [ana@shop.example]}]}
databases:
  shop: {url: "duckdb:///{{ home }}/shop.duckdb"}
  warehouse: {url: "duckdb:///{{ home }}/warehouse.duckdb"}
assets:
  - key: orders
    table: analytics.orders
    database: warehouse
    checks: {volume: {timestamp_column: order_ts}}
    pipeline:
      dead_letter_sink: {source_database: shop, source_table: shop.orders, dead_letter_table: analytics.orders_dlq,
                         key: order_id, partition_column: order_ts, group_column: payment_method}
    mage: {writes: orders_stream, reads: [finance_daily]}
integrations:
  mage: {url: "{{ env('TEST_DW_MAGE_URL', '') }}", optional: true, rerun_timeout_s: 60, poll_s: 2,
         email_env: TEST_DW_MAGE_EMAIL, password_env: TEST_DW_MAGE_PASSWORD}
"""


@pytest.fixture
def config(tmp_path, monkeypatch):
    for k in ("TEST_DW_MAGE_URL", "TEST_DW_MAGE_EMAIL", "TEST_DW_MAGE_PASSWORD", "MAGE_URL"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "dataops.yaml").write_text(CONFIG)
    return tmp_path / "dataops.yaml"


def _diagnoser(defs: dg.Definitions):
    job = defs.resolve_job_def("dw_diagnose_incident")
    return job, job.graph.node_defs[0]


def test_mage_comes_in_with_its_url(config, tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_DW_MAGE_URL", "http://mage.internal:6789")
    monkeypatch.setenv("TEST_DW_MAGE_EMAIL", "viewer@shop.example")
    monkeypatch.setenv("TEST_DW_MAGE_PASSWORD", "s3cret")
    defs = build_dw_definitions(config, scope={"home": str(tmp_path)})
    res = defs.resources["mage"]
    assert isinstance(res, MageResource) and res.url == "http://mage.internal:6789"
    client = res.process_config_and_initialize().get_client()  # the credentials: the named variables, at run time
    assert client.email == "viewer@shop.example" and client.url == "http://mage.internal:6789"
    assert dg.AssetCheckKey(dg.AssetKey("orders"), "mage_rerun") in {k for c in defs.asset_checks for k in c.check_keys}
    assert "mage" in defs.resolve_job_def("dw_diagnose_incident").required_resource_keys


def test_optional_mage_without_a_url_is_left_out(config, tmp_path):
    defs = build_dw_definitions(config, scope={"home": str(tmp_path)})
    assert "mage" not in (defs.resources or {})
    assert not [k for c in defs.asset_checks for k in c.check_keys if k.name == "mage_rerun"]
    assert "mage" not in defs.resolve_job_def("dw_diagnose_incident").required_resource_keys


def test_an_asset_mage_source_needs_the_server(config, tmp_path):
    config.write_text(CONFIG.split("integrations:")[0])
    with pytest.raises(DwConfigError, match=r"assets\.0\.mage: needs integrations\.mage"):
        build_dw_definitions(config, scope={"home": str(tmp_path)})
    config.write_text(CONFIG.replace("mage: {writes: orders_stream, reads: [finance_daily]}", "mage: {}"))
    with pytest.raises(DwConfigError, match="give writes or reads"):
        build_dw_definitions(config, scope={"home": str(tmp_path)})
