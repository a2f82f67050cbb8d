"""MCP ``remediate`` on a workspace where every integration is configured, run by whichever Python runs it.

``test_remediate_versions.py`` runs this file with the project's interpreter (the newest Dagster
``make install`` resolved) and with the cached venv holding the lowest Dagster the package allows
(:mod:`dw_dagster_tests.harness.lowest_dagster`), so the tool is exercised on both ends of
``dagster>=1.13,<1.14``. It:

1. makes a store-sales home with the late-rows incident (scale 0.002) in a new instance, runs the
   checks job and one tick of the check incident sensor in process (the incident opened, its
   diagnosis left to ``remediate``), with no integration;
2. then sets the credentials of every integration the location's ``dataops.yaml`` names (Lightup,
   PagerDuty with its REST token, Slack) in the environment, so the definitions load with all of
   them and the notification sensor (loopback URLs that nothing listens on: nothing is sent);
3. calls ``remediate`` through the MCP SDK's client on a server whose workspace loads the location.

It prints one JSON line: the Dagster version, the tool's answer or error, and the sensors and
resources the location loaded with.

Usage: ``python dw_dagster_tests/mcp/remediate_all_integrations.py WORKDIR``
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INTEGRATIONS_ENV = {
    "LIGHTUP_SERVER": "http://127.0.0.1:9", "LIGHTUP_REFRESH_TOKEN": "not-used", "LIGHTUP_WORKSPACE": "ws-1",
    "LIGHTUP_COMPARE_METRICS": "metric-uuid-1",
    "PAGERDUTY_ROUTING_KEY": "not-used", "PAGERDUTY_API_TOKEN": "not-used", "PAGERDUTY_FROM": "oncall@grocer.example",
    "PAGERDUTY_EVENTS_URL": "http://127.0.0.1:9", "PAGERDUTY_API_URL": "http://127.0.0.1:9",
    "SLACK_BOT_TOKEN": "xoxb-not-used", "SLACK_CHANNEL": "#data-incidents", "SLACK_API_URL": "http://127.0.0.1:9/api",
}
WORKSPACE = """load_from:
  - python_module:
      module_name: dw_dagster_examples.store_sales.definitions
      attribute: defs
      location_name: store_sales
"""


def main(workdir: Path) -> dict:
    import anyio
    import dagster as dg

    from dw_dagster_examples.store_sales import home as h
    from dw_dagster_examples.store_sales.demo import prepare_incident_data

    home = workdir / "store_sales"
    os.environ[h.HOME_ENV] = str(home)
    h.ensure_home(home)
    (workdir / "dagster_home").mkdir(exist_ok=True)
    instance = dg.DagsterInstance.from_config(str(workdir / "dagster_home"))
    defs = prepare_incident_data(home, instance, 0.002)
    defs.resolve_job_def("dw_verify").execute_in_process(instance=instance, raise_on_error=False)
    sensor = defs.resolve_sensor_def("dw_check_incident_sensor")
    tick = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs,
                                                        sensor_name="dw_check_incident_sensor"))
    for event in tick.asset_events:
        instance.report_runless_asset_event(event)
    (workdir / "workspace.yaml").write_text(WORKSPACE)
    os.environ.update(INTEGRATIONS_ENV)  # the location the server loads has every integration

    from dw_dagster.core.ledger import ledger_for
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings
    from dw_dagster_tests.mcp.client import call

    server = build_server(ServerSettings(dagster_home=str(workdir / "dagster_home"),
                                         workspace=str(workdir / "workspace.yaml"), domains=str(h.domains_path(home))))
    (loc,) = server.dw_state.workspace().loaded()
    (row,) = ledger_for(instance).incidents()
    out, err = anyio.run(call, server, "remediate", {"incident_id": row.incident_id})
    return {"dagster": dg.__version__, "result": out, "error": err,
            "sensors": sorted(s.name for s in loc.defs.sensors or ()),
            "resources": sorted(loc.defs.resources or {})}


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print(json.dumps(main(Path(sys.argv[1]).resolve()), default=str))
