"""``dw-dagster mcp`` as a coding assistant starts it: a subprocess on stdio, the repository's workspace.yaml."""

import os
import sys
from pathlib import Path

import pytest

from dw_dagster_tests.mcp.test_tools import EXPECTED_TOOLS, MODELS

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


async def test_stdio_subprocess_lists_the_tools_and_answers(demo_env, tmp_path):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": str(tmp_path),
           "DW_APPROVAL_SIGNING_KEY": demo_env.key, "DW_STORE_SALES_HOME": str(demo_env.store_sales),
           "DW_ORDERS_HOME": str(tmp_path / "orders"), "DAGSTER_TELEMETRY_DISABLED": "1"}
    params = StdioServerParameters(command=str(BIN / "dw-dagster"), cwd=str(tmp_path), env=env, args=[
        "mcp", "-w", str(REPO / "workspace.yaml"), "--dagster-home", str(demo_env.home), "--domains", str(demo_env.domains)])
    log = tmp_path / "server.log"
    with open(log, "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=600) as c:
            tools = (await c.list_tools()).tools
            assert {t.name for t in tools} == EXPECTED_TOOLS
            listed = await c.call_tool("list_incidents", {})
            assert not listed.is_error, listed.content
            (inc,) = listed.structured_content["incidents"]
            got = await c.call_tool("get_incident", {"incident_id": inc["incident_id"]})
            assert not got.is_error, got.content
            assert got.structured_content["outcome"]["cause_kind"] == "late_rows_behind_watermark"
            assert all(r["verifies_now"] for r in got.structured_content["receipts"])
            br = await c.call_tool("blast_radius_analysis", {"node": "store_sales_line"})  # loads both locations
            assert not br.is_error, br.content
            assert {n.split(".")[-1] for n in br.structured_content["nodes"] if n.startswith("model.")} == MODELS
            assert br.structured_content["graph"] == "dbt manifest of location store_sales"
            bad = await c.call_tool("get_incident", {"incident_id": "nope"})
            assert bad.is_error and "no incident 'nope'" in bad.content[0].text
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
