"""``monitor_metrics``: a series scored against the volume check's own baseline, through the MCP client.

The same counts are scored by the real volume check (``build_volume_check`` over a DuckDB table,
run on a Dagster instance) and by the tool — from the series the assistant brings and from the
counts the check recorded — and the bands and verdicts agree. The failure kind, a drop in rows per
day: https://github.com/elementary-data/elementary/issues/586 (monitor a decrease in row count
against its baseline), and the lower bound kept at 0 rows as Elementary's
https://github.com/elementary-data/dbt-data-reliability/pull/508 does.
"""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.checks.volume import build_volume_check
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster_tests.mcp.client import assert_clear_error, call

pytestmark = pytest.mark.anyio

LAST = dt.date(2026, 11, 30)
#: 29 days of ~1,000 rows, then a drop to 610 on the last day
COUNTS = {LAST - dt.timedelta(days=i): (610 if i == 0 else 1000 + (i * 37) % 41) for i in range(29)}


@pytest.fixture
def home(tmp_path):
    """An instance where the volume check of ``sales`` ran once on a real table holding COUNTS."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    db = DuckDBDatabase(tmp_path / "wh.duckdb")
    db.execute("CREATE TABLE sales (id INT, sold_at TIMESTAMP)")
    db.execute("INSERT INTO sales " + " UNION ALL ".join(
        f"SELECT i, TIMESTAMP '{d} 08:00:00' FROM range({n}) t(i)" for d, n in COUNTS.items()))
    sales = dg.AssetSpec("sales")
    check = build_volume_check(asset="sales", table="sales", timestamp_column="sold_at", evaluate_days=29,
                               clock=lambda: dt.datetime(2026, 12, 6, tzinfo=dt.timezone.utc))
    defs = dg.Definitions(assets=[sales], asset_checks=[check],
                          jobs=[dg.define_asset_job("vol", selection=dg.AssetSelection.checks(check))],
                          resources={"warehouse": DatabaseResource(url=f"duckdb:///{db.path}")})
    with dg.DagsterInstance.from_config(str(home)) as instance:
        res = defs.resolve_job_def("vol").execute_in_process(instance=instance, raise_on_error=False)
        (ev,) = res.get_asset_check_evaluations()
        assert not ev.passed
        home.joinpath("check.json").write_text(str(ev.metadata["dw/days_json"].value[-1]))
    return home


def _server(home):
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    return build_server(ServerSettings(dagster_home=str(home), workspace=""))


async def test_a_series_and_the_recorded_counts_get_the_checks_band_and_verdict(home):
    import ast

    recorded = ast.literal_eval(home.joinpath("check.json").read_text())  # what the check itself said of LAST
    srv = _server(home)
    series = [{"day": d.isoformat(), "rows": n} for d, n in sorted(COUNTS.items())]
    out, err = await call(srv, "monitor_metrics", {"series": series, "table": "sales", "timestamp_column": "sold_at",
                                                   "dialect": "postgres"})
    assert err is None, err
    (day,) = out["scored"]
    assert out["verdict"] == "anomalous" and out["out_of_band"] == [LAST.isoformat()] and day["status"] == "low"
    assert (day["mean"], day["lower"], day["upper"], day["rows"]) == (recorded["mean"], recorded["lower"],
                                                                      recorded["upper"], 610)
    assert day["baseline_days"] == recorded["baseline_days"] == 4  # the same weekday, four weeks back
    assert out["sql"].startswith("SELECT CAST(sold_at AS DATE) AS d, COUNT(*) AS n FROM sales")
    # the asset's recorded counts: the same answer, and the query the check ran
    out2, err = await call(srv, "monitor_metrics", {"asset": "sales"})
    assert err is None, err
    assert out2["scored"] == out["scored"] and out2["source"] == "sales:daily_volume" and "GROUP BY" in out2["sql"]
    # a normal last day passes; two weeks scored at once
    calm = [p if p["day"] != LAST.isoformat() else {**p, "rows": 1010} for p in series]
    ok, _ = await call(srv, "monitor_metrics", {"series": calm, "evaluate_days": 14})
    assert ok["verdict"] == "ok" and len(ok["scored"]) == 14 and ok["sql"] is None
    short, _ = await call(srv, "monitor_metrics", {"series": series[-2:]})
    assert short["verdict"] == "insufficient_history"


async def test_bad_input_is_a_clear_error(home):
    srv = _server(home)
    _, err = await call(srv, "monitor_metrics", {})
    assert_clear_error(err, "give either series")
    _, err = await call(srv, "monitor_metrics", {"series": [{"day": "yesterday", "rows": 3}]})
    assert_clear_error(err, "series point 0 is not")
    _, err = await call(srv, "monitor_metrics", {"series": [{"day": "2026-11-01", "rows": -3}]})
    assert_clear_error(err, "never negative")
    _, err = await call(srv, "monitor_metrics", {"series": [{"day": "2026-11-01", "rows": 3}], "table": "x; DROP TABLE y",
                                                 "timestamp_column": "ts"})
    assert err is None or "Traceback" not in err
    _, err = await call(srv, "monitor_metrics", {"asset": "sales", "check": "not_there"})
    assert_clear_error(err, "no run evaluated the check")


async def test_the_tool_is_listed_read_only_with_every_argument_documented(home):
    from mcp import Client

    from dw_dagster.mcp.server import TOOLS

    async with Client(_server(home)) as cl:
        (tool,) = [t for t in (await cl.list_tools()).tools if t.name == "monitor_metrics"]
    assert "monitor_metrics" in TOOLS and tool.annotations.read_only_hint is True
    assert tool.output_schema and "Returns:" in tool.description and "Raises:" in tool.description
    assert all(schema.get("description") for schema in tool.input_schema["properties"].values())
