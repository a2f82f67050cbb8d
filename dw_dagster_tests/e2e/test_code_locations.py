"""Two code locations with different domains in one workspace: each works alone and together.

The repository's ``workspace.yaml`` loads the store-sales and the orders examples. Neither may
wire anything through process-wide state (their domains, databases and integrations reach the
ops and sensors as resources and arguments), so:

- each location loads alone in its own process (``dagster definitions validate -m <module>``),
  and both together (``dagster definitions validate -w workspace.yaml``);
- under ``dagster dev -w workspace.yaml`` (a code server per location), the orders location's
  own approval job, launched through GraphQL, refuses the store-sales owner (not listed for
  ``orders``) and records the orders owner's verified approval — with ``$DW_DOMAINS_FILE``
  pointing at the *store-sales* domains file, which neither location may read.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster import records
from dw_dagster.core import keys as c
from dw_dagster_dev.demo import Timeline, demo_login, run_job
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_dev.services import OidcProvider
from dw_dagster_tests.harness.dagster_dev import BIN, WORKSPACE, dagster_dev, write_instance_yaml

MODULES = {"store_sales": "dw_dagster_examples.store_sales.definitions", "orders": "dw_dagster_examples.orders.definitions"}
ORDERS_OWNER = "maya.chen@shop.example"
STORE_SALES_OWNER = "dana.ortiz@grocer.example"
SCALE = 0.01
TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _env(root: Path, **more: str) -> dict[str, str]:
    """This environment without dw_dagster's, Dagster's or the integrations' variables; each
    location's home under ``root``; a throwaway instance."""
    drop = ("DW_", "DAGSTER_", "LIGHTUP_", "PAGERDUTY_", "SLACK_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"DW_STORE_SALES_HOME": str(root / "store_sales_home"), "DW_ORDERS_HOME": str(root / "orders_home"),
                "DAGSTER_HOME": str(root / "dagster_home"), "DAGSTER_TELEMETRY_DISABLED": "1", **more})
    (root / "dagster_home").mkdir(parents=True, exist_ok=True)
    return env


def _validate(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dagster"), "definitions", "validate", *args], cwd=root, env=_env(root),
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("location", sorted(MODULES))
def test_each_location_loads_alone_in_its_own_process(location, tmp_path):
    proc = _validate(tmp_path, "-m", MODULES[location])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "All code locations passed validation" in proc.stdout + proc.stderr


def test_both_locations_load_together_from_the_workspace(tmp_path):
    proc = _validate(tmp_path, "-w", str(WORKSPACE))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Validation successful for code location store_sales" in out
    assert "Validation successful for code location orders" in out


def _run(instance: dg.DagsterInstance, run_id: str, timeout: float = 300) -> dg.DagsterRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status in TERMINAL:
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not finish within {timeout} s")


def _failure(instance: dg.DagsterInstance, run_id: str) -> str:
    """The step failures' error messages of a run (what refused it)."""
    return "\n".join(e.dagster_event.event_specific_data.error.message for e in instance.all_logs(run_id)
                     if e.dagster_event and e.dagster_event.is_step_failure
                     and e.dagster_event.event_specific_data.error) or "(no step failure)"


def test_the_orders_approver_approves_under_the_orders_code_server(tmp_path):
    from dw_dagster_examples.orders import paths as orders_paths
    from dw_dagster_examples.orders.demo import prepare_incident_data
    from dw_dagster_examples.store_sales import home as store_sales_home

    root = tmp_path
    dagster_home, orders_home = root / "dagster_home", root / "orders_home"
    write_instance_yaml(dagster_home)
    store_sales_domains = store_sales_home.ensure_home(root / "store_sales_home") / "domains.yaml"
    with OidcProvider(root / "idp", [ORDERS_OWNER, STORE_SALES_OWNER]) as idp, \
            dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        # the orders incident up to its proposed change set, in this process, on the shared instance
        defs = prepare_incident_data(orders_home, instance, SCALE, Timeline(open(os.devnull, "w")))
        run_job(defs.resolve_job_def("orders_checks"), instance, "checks")  # the volume and dead-letter checks fail
        tick = LocalSensorDaemon(defs, instance, log_level="WARNING").tick("dw_check_incident_sensor")
        assert tick.run_ids and not tick.failed_run_ids, tick.skip_reason
        (cs,) = records.change_sets(instance)
        assert cs.domain == "orders" and cs.approvers == [ORDERS_OWNER]
        orders_domains = orders_paths.domains_path(orders_home)

        env = _env(root, DW_OIDC_ISSUER=idp.url, DW_DOMAINS_FILE=str(store_sales_domains),
                   **{c.SIGNING_KEY_ENV: os.environ[c.SIGNING_KEY_ENV]})
        with dagster_dev(dagster_home, env, root, locations=("store_sales", "orders")) as dev:
            def decide(email: str) -> dg.DagsterRun:
                token = demo_login(orders_domains, cs.id, email, instance)
                run_id = dev.submit_job("dw_approve_change_set", location="orders", tags={c.CHANGE_SET_TAG: cs.id},
                                        run_config={"ops": {"dw_record_decision": {"config": {
                                            "change_set_id": cs.id, "approver": "", "id_token": token,
                                            "decision": "approve", "comment": "from the orders code server"}}}})
                return _run(instance, run_id)

            refused = decide(STORE_SALES_OWNER)  # a refusal, recorded as one: not a failed run
            assert refused.status == dg.DagsterRunStatus.SUCCESS and refused.tags.get(c.DECISION_TAG) == "refused"
            assert "not an approver of domain 'orders'" in refused.tags[c.REFUSAL_TAG]
            approved = decide(ORDERS_OWNER)
            assert approved.status == dg.DagsterRunStatus.SUCCESS, _failure(instance, approved.run_id)
            assert approved.remote_job_origin.location_name == "orders"
        (a,) = records.approvals(instance, cs.id, active_only=True)
        assert (a.approver, a.identity.method, a.identity.issuer) == (ORDERS_OWNER, "oidc", idp.url)
        assert [r["approver"] for r in records.refusals(instance, cs.id)] == [STORE_SALES_OWNER]
