"""``mcp_tools_demo``: the latency of each MCP read tool on the store-sales demo's instance.

Setup (not timed): ``dw-dagster demo store-sales --json --scale 0.002`` into the benchmark's
folder (a real instance: the incident, diagnosis, change set, refused and accepted approvals,
the repair runs and four receipts); an MCP server on it with the store-sales code location
loaded (``build_server``), called through the SDK's in-process client (``mcp.Client(server)``,
one session, as an assistant keeps one).

Timed: each read tool with the arguments an assistant would send, ``max(repeat, 15)`` calls after
one warm-up call; the median per tool. Peer (same run, same instance): the equivalent read a person
does today, in process — the CLI command through click's runner where one exists (``incidents
--json``, ``change-sets --json``, ``receipts --asset ... --json``, ``receipts verify``, ``blast-radius
--json``; each opens the instance, as the command does), else the record functions the tool builds
on (:mod:`dw_dagster.core.records`, the check history, :func:`dw_dagster.lineage.lineage_graph`,
:func:`dw_dagster.changes.migrations.generate_migration`). ``run_quality_check`` (a Dagster run) is
timed too, without a goal. Goal: every read tool's median ≤ 100 ms (``ours_s`` is the slowest).

Usage: ``python -m dw_dagster_tests.benchmarks.run --only mcp_tools_demo``
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL_S = 0.1
STORE_SALES_ONLY = ("load_from:\n  - python_module:\n      module_name: dw_dagster_examples.store_sales.definitions\n"
                    "      attribute: defs\n      location_name: store_sales\n")


def _median_s(fn, n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _demo(work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DW_", "DAGSTER_HOME"))}
    proc = subprocess.run([str(Path(sys.executable).parent / "dw-dagster"), "demo", "store-sales", "--json", "--scale",
                           "0.002", "--workdir", str(work)], capture_output=True, text=True, env=env, cwd=work, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"the demo failed: {proc.stderr[-2000:]}")
    return work


def bench_mcp_tools_demo(work: Path, repeat: int) -> dict:
    import anyio
    import dagster as dg
    from click.testing import CliRunner

    from dw_dagster.cli.main import main as cli
    from dw_dagster.core import records
    from dw_dagster_examples.store_sales import home as h
    from dw_dagster.lineage import downstream, lineage_graph, select_nodes
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings
    from dw_dagster.changes.migrations import SetNullability, generate_migration

    demo = _demo(work / "demo")
    home, store_sales = demo / "dagster_home", demo / "store_sales"
    key = (home / "approval_signing.key").read_text().strip()
    os.environ.update({"DW_APPROVAL_SIGNING_KEY": key, "DW_STORE_SALES_HOME": str(store_sales)})
    (work / "workspace.yaml").write_text(STORE_SALES_ONLY)
    server = build_server(ServerSettings(dagster_home=str(home), workspace=str(work / "workspace.yaml"),
                                         domains=str(h.domains_path(store_sales))))
    state = server.dw_state
    state.workspace()
    instance = dg.DagsterInstance.from_config(str(home))
    asset = dg.AssetKey(["store_sales_line"])
    (inc,) = records.incidents(instance)
    (cs,) = records.change_sets(instance)
    manifest = h.dbt_dir(store_sales) / "target" / "manifest.json"
    env = {"DAGSTER_HOME": str(home), "DW_APPROVAL_SIGNING_KEY": key}
    runner = CliRunner()

    def run_cli(*args: str):
        def go():
            res = runner.invoke(cli, list(args), env=env, catch_exceptions=False)
            assert res.exit_code == 0, res.output
        return go

    def both(*fns):
        return lambda: [f() for f in fns]

    loc = state.workspace().loaded()[0]
    checks = [k for k in loc.asset_graph.asset_check_keys if k.asset_key == asset]
    cases = {  # tool: (arguments, peer description, peer)
        "list_incidents": ({}, "dw-dagster incidents --json", run_cli("incidents", "--json")),
        "get_incident": ({"incident_id": inc.id}, "incidents --asset --json + change-sets --json + receipts verify",
                         both(run_cli("incidents", "--asset", "store_sales_line", "--json"), run_cli("change-sets", "--json"),
                              run_cli("receipts", "verify"))),
        "diagnose_incident": ({"incident_id": inc.id}, "records.diagnoses of the asset",
                              lambda: records.diagnoses(instance, [asset])),
        "get_root_cause": ({"incident_id": inc.id}, "records.incidents + records.diagnoses of the asset",
                           both(lambda: records.incidents(instance, [asset]), lambda: records.diagnoses(instance, [asset]))),
        "blast_radius_analysis": ({"node": "store_sales_line"}, "dw-dagster blast-radius --json",
                                  run_cli("blast-radius", "--manifest", str(manifest), "--select", "store_sales_line",
                                          "--json")),
        "trace_cross_platform_lineage": ({"asset": "store_sales_line"}, "lineage_graph of the location + downstream",
                                         lambda: downstream(g := lineage_graph(loc.asset_graph),
                                                            select_nodes(g, "store_sales_line"))),
        "get_incident_history": ({"asset": "store_sales_line"}, "dw-dagster incidents --asset --json",
                                 run_cli("incidents", "--asset", "store_sales_line", "--json")),
        "get_quality_score": ({"asset": "store_sales_line"}, "each check's execution history",
                              lambda: [instance.event_log_storage.get_asset_check_execution_history(k, limit=10)
                                       for k in checks]),
        "explain_table": ({"asset": "store_sales_line"}, "incidents --asset --json + receipts --asset --json",
                          both(run_cli("incidents", "--asset", "store_sales_line", "--json"),
                               run_cli("receipts", "--asset", "store_sales_line", "--json"))),
        "get_audit_trail": ({"change_set_id": cs.id}, "change-sets --json + receipts --asset --json + records.refusals",
                            both(run_cli("change-sets", "--json"), run_cli("receipts", "--asset", "store_sales_line", "--json"),
                                 lambda: records.refusals(instance, cs.id))),
        "generate_migration": ({"table": "store_sales_line", "change": {"kind": "nullability", "column": "region",
                                                                        "nullable": False}},
                               "dw_dagster.changes.migrations.generate_migration",
                               lambda: generate_migration(SetNullability(table="warehouse.pos.sales_line", column="region",
                                                                         nullable=False), "duckdb")),
    }
    n = max(repeat, 15)
    tools: dict[str, dict] = {}

    async def measure() -> float:
        from mcp import Client

        async with Client(server) as c:
            for name, (args, _, _) in cases.items():
                first = await c.call_tool(name, args)
                if first.is_error:
                    raise RuntimeError(f"{name}: {first.content[0].text}")
                times = []
                for _ in range(n):
                    t = time.perf_counter()
                    await c.call_tool(name, args)
                    times.append(time.perf_counter() - t)
                tools[name] = {"ours_ms": round(statistics.median(times) * 1000, 1)}
            t = time.perf_counter()
            r = await c.call_tool("run_quality_check", {"asset": "store_sales_line"})
            if r.is_error or r.structured_content["status"] != "SUCCESS":
                raise RuntimeError(f"run_quality_check: {r.content[0].text}")
            return time.perf_counter() - t

    quality_s = anyio.run(measure)
    from dw_dagster_tests.benchmarks.run import _ours_peak

    mem = _ours_peak({})
    for name, (_, peer, fn) in cases.items():
        tools[name].update(peer=peer, peer_ms=round(_median_s(fn, n) * 1000, 1))
    slowest = max(tools, key=lambda t: tools[t]["ours_ms"])
    print(json.dumps(tools, indent=1), flush=True)
    return {"name": "mcp_tools_demo", "ours_s": tools[slowest]["ours_ms"] / 1000,
            "peer": f"the same reads through the CLI or the record functions, in process (slowest tool: {slowest}, "
                    f"peer {tools[slowest]['peer']})", "peer_s": tools[slowest]["peer_ms"] / 1000, "goal": GOAL_S,
            "goal_unit": "s", "rows": int(instance.event_log_storage.get_maximum_record_id() or 0),
            "rows_are": "event log records in the demo instance", "slowest_tool": slowest, "tools": tools,
            "run_quality_check_s": round(quality_s, 2), "calls_per_tool": n, **mem}


__all__ = ["bench_mcp_tools_demo"]
