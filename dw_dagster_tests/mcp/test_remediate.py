"""A change set proposed through ``remediate`` waits for a listed approver like any other.

A fresh store-sales incident (scale 0.002, its own instance): the check incident sensor opens the
incident (its diagnosis run is left to ``remediate``), ``remediate`` proposes through the location's
diagnosis job, the owner merges the diff, and the remediation sensor — ticked by
:class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon` as the daemon would — runs no stage:
not after the proposal, not after the proposer's and two people's refused approvals. Only the
listed owner's verified approval through the approval job lets the first stage run.
"""

import os

import anyio
import dagster as dg
import pytest

from dw_dagster_tests.mcp.client import call
from dw_dagster_tests.mcp.conftest import STORE_SALES_ONLY

OWNER, NOT_LISTED = "dana.ortiz@grocer.example", "sam.lee@grocer.example"


@pytest.fixture(scope="module")
def fresh_incident(demo_env, tmp_path_factory):
    """A new store-sales home and instance with the incident opened by the check incident sensor, undiagnosed."""
    from dw_dagster_examples.store_sales import home as h
    from dw_dagster_examples.store_sales.demo import prepare_incident_data

    work = tmp_path_factory.mktemp("mcp_remediate")
    home = work / "store_sales"
    saved = os.environ.get(h.HOME_ENV)
    os.environ[h.HOME_ENV] = str(home)  # the location reads its home from it when it loads
    try:
        h.ensure_home(home)
        (work / "dagster_home").mkdir()
        instance = dg.DagsterInstance.from_config(str(work / "dagster_home"))
        defs = prepare_incident_data(home, instance, 0.002)
        checks = defs.resolve_job_def("dw_verify").execute_in_process(instance=instance, raise_on_error=False)
        (ev,) = [e for e in checks.get_asset_check_evaluations() if e.check_name == "region_compare"]
        assert not ev.passed  # Southwest is short
        sensor = defs.resolve_sensor_def("dw_check_incident_sensor")
        tick = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs,
                                                            sensor_name="dw_check_incident_sensor"))
        for event in tick.asset_events:  # what the daemon stores; its diagnosis run request is not launched
            instance.report_runless_asset_event(event)
        assert len(tick.run_requests) == 1 and tick.run_requests[0].job_name == "dw_diagnose_incident"
        workspace = work / "workspace.yaml"
        workspace.write_text(STORE_SALES_ONLY)
        from dw_dagster.mcp.server import build_server
        from dw_dagster.mcp.state import ServerSettings

        server = build_server(ServerSettings(dagster_home=str(work / "dagster_home"), workspace=str(workspace),
                                             domains=str(h.domains_path(home))))
        server.dw_state.workspace()  # loads the location for this home
    finally:
        if saved is None:
            os.environ.pop(h.HOME_ENV, None)
        else:
            os.environ[h.HOME_ENV] = saved
    return work, home, instance, defs, server


def test_a_proposal_from_remediate_runs_nothing_until_a_listed_person_approves(fresh_incident):
    from dw_dagster.approval.job import approve_in_process
    from dw_dagster.core.ledger import ledger_for
    from dw_dagster_examples.store_sales import home as h
    from dw_dagster_examples.store_sales.definitions import build_definitions
    from dw_dagster_dev.demo import demo_login
    from dw_dagster_dev.services import OidcProvider
    from dw_dagster.proposals.watermark import apply_change_set
    from dw_dagster.testing.local_daemon import LocalSensorDaemon

    work, home, instance, defs, server = fresh_incident
    led = ledger_for(instance)
    (row,) = led.incidents()
    assert row.state == "open" and led.change_set_rows(latest_only=False) == []
    before, _ = anyio.run(call, server, "diagnose_incident", {"incident_id": row.incident_id})
    assert before["diagnosed"] is False and "remediate" in before["next_step"]

    out, err = anyio.run(call, server, "remediate", {"incident_id": row.incident_id})
    assert err is None, err
    cs_id = out["change_set"]["id"]
    assert out["proposed_now"] is True and out["change_set"]["state"] == "proposed"
    assert out["change_set"]["approvers"] == [OWNER] and out["window"] == ["2026-11-26", "2026-11-27"]
    assert out["not_run"] == [] and out["deferred_partitions"] == []  # every partition the cause reaches exists
    assert "+watermark_column: posted_ts" in out["diff"] and OWNER in out["approval"] and "cannot" in out["approval"]
    run = instance.get_run_by_id(out["diagnosis_run_id"])  # the location's diagnosis job, as the sensor launches it
    assert run.job_name == "dw_diagnose_incident" and run.tags["dw/launched_by"] == "dw-dagster mcp remediate"
    (cs_row,) = led.change_set_rows(latest_only=False)
    assert (cs_row.change_set_id, cs_row.state, cs_row.incident_id) == (cs_id, "proposed", row.incident_id)
    assert led.decisions(cs_id) == [] and led.stages(cs_id, cs_row.version) == {}
    again, _ = anyio.run(call, server, "remediate", {"incident_id": row.incident_id})
    assert again["proposed_now"] is False and again["change_set"]["id"] == cs_id and len(led.change_set_rows()) == 1

    from dw_dagster.core import records

    apply_change_set(records.find_change_set(instance, cs_id), h.repo_dir(home), OWNER)  # the owner merges the diff
    (h.dbt_dir(home) / "target" / "manifest.json").unlink(missing_ok=True)
    daemon = LocalSensorDaemon(build_definitions(home), instance, log_level="WARNING")  # the location, reloaded
    domains = h.domains_path(home)

    def tick_runs_nothing() -> None:
        tick = daemon.tick("dw_remediation_sensor")
        assert tick.run_ids == [] and tick.failed_run_ids == [], tick
        assert led.stages(cs_id, cs_row.version) == {}

    tick_runs_nothing()
    for how in (dict(approver="dw-dagster"), dict(approver=OWNER)):  # the proposer; the owner's email typed
        ok, msg = approve_in_process(instance, cs_id, domains=domains, **how)
        assert not ok, msg
        tick_runs_nothing()
    with OidcProvider(work / "oidc", [OWNER, NOT_LISTED]):
        ok, msg = approve_in_process(instance, cs_id, domains=domains,
                                     id_token=demo_login(domains, cs_id, NOT_LISTED, instance))
        assert not ok and "not an approver" in msg
        tick_runs_nothing()
        ok, msg = approve_in_process(instance, cs_id, domains=domains, id_token=demo_login(domains, cs_id, OWNER, instance))
        assert ok, msg
    tick = daemon.tick("dw_remediation_sensor")
    assert len(tick.run_ids) == 1, tick
    stage_run = instance.get_run_by_id(tick.run_ids[0])
    assert stage_run.tags["dw/change_set_id"] == cs_id and stage_run.tags["dw/stage"] in ("snapshot", "window-1")
    (d,) = led.decisions(cs_id)
    assert d["approver"] == OWNER and d["method"] == "oidc"
    trail, _ = anyio.run(call, server, "get_audit_trail", {"change_set_id": cs_id})
    assert trail["counts"]["approval_refused"] == 3 and trail["counts"]["approved"] == 1
    assert trail["counts"]["stage_started"] == 1
