"""MCP ``remediate`` with every integration configured, on the lowest and the highest Dagster the package allows.

Found in review: ``remediate`` always failed when the code location had Slack —
``AttributeError: 'Definitions' object has no attribute 'resolve_all_sensor_defs'`` on the Dagster
1.13 release ``make install`` resolves (the method does not exist on any 1.13 release). Each case
runs :mod:`.remediate_all_integrations` in its own process: with the project's interpreter (the
newest Dagster that was resolved into the project's venv) and with the cached venv that holds
``dagster==1.13.0`` and the integration libraries' lowest releases
(:mod:`dw_dagster_tests.harness.lowest_dagster`, built once under ``.cache/``, about 90 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("remediate_all_integrations.py")


def _python(which: str) -> str:
    if which == "installed":
        return sys.executable
    from dw_dagster_tests.harness.lowest_dagster import ensure_lowest_dagster_venv

    return str(ensure_lowest_dagster_venv().python)


@pytest.mark.parametrize("which", ["lowest", "installed"])
def test_remediate_proposes_with_every_integration_configured(which, tmp_path):
    python = _python(which)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DW_STORE_SALES", "DW_DOMAINS", "DAGSTER_HOME",
                                                                     "LIGHTUP_", "PAGERDUTY_", "SLACK_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "examples")])  # the library and the examples it runs
    # output to files, not pipes: Dagster's compute-log capture in the script leaves `tail -F` children that
    # outlive it holding the pipes, and communicate() then waited for them until the timeout (a full run)
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.run([python, str(SCRIPT), str(tmp_path)], stdout=out, stderr=err, text=True, env=env, cwd=tmp_path,
                              timeout=900)
    stdout, stderr = (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 0, stderr[-4000:]
    got = json.loads(stdout.strip().splitlines()[-1])
    if which == "lowest":
        assert got["dagster"] == "1.13.0"
    assert got["error"] is None, got["error"]
    assert {"lightup", "pager", "slack"} <= set(got["resources"]), got["resources"]
    assert {"dw_notification_sensor", "dw_lightup_incident_sensor"} <= set(got["sensors"]), got["sensors"]
    out = got["result"]
    assert out["proposed_now"] is True and out["change_set"]["state"] == "proposed"
    assert "dw_notification_sensor, location store_sales" in out["approval_request"]
