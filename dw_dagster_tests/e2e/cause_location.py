"""A code location for the cause fixes' daemon test: five worlds of :mod:`dw_dagster_tests.repair.cause_world`
in one location, so their incidents go through the same daemon ticks.

The four partitioned worlds (upstream failed, upstream stale, duplicated load, schema change) key their
assets ``<cause>/raw_orders`` and ``<cause>/orders``, each on its own DuckDB files (resources
``src_<cause>``, ``wh_<cause>``) and its own git pipeline repository; the dbt-contract world keeps
``raw_orders`` and ``orders_contracted``. One incident sensor watches the five ``compare`` checks and
launches the one diagnosis job (it diagnoses with the diagnosed asset's world); one remediation sensor a
world (``dw_remediation_<cause>``, accepting its domain's change sets) walks the repair with the
world's window and verify jobs and the shared step, undo and receipt jobs.

Where the worlds are comes from the environment the test gives ``dagster dev``:
``$DW_TEST_CAUSE_ROOT`` (a folder a world), ``$DW_DOMAINS_FILE``, and ``$DW_TEST_TABLEAU_URL`` (the fake
Tableau the receipt refreshes the Store P&L on). What the assets do (the failing upstream partition, an
append-only load) is in each world's ``state.json``, written by the test.
"""

import os
from pathlib import Path

import dagster as dg

from dw_dagster.approval.job import build_approval_job
from dw_dagster.changes.dedupe import DEDUPE, run_dedupe_step
from dw_dagster.core import keys as c
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.receipts.job import build_receipt_job
from dw_dagster.repair.dbt_build import dbt_build_runner
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.repair.steps import build_step_jobs
from dw_dagster.repair.undo import build_undo_jobs
from dw_dagster_tests.repair import cause_world as cw

CONTRACT = "dbt_contract"
CAUSES = (*cw.STORIES, CONTRACT)
INTERVAL_S = 2  # seven sensors: a tick each second kept the daemon's code server busy on 2 cores


def worlds(root: Path) -> dict:
    """cause → its world under ``root``."""
    out: dict = {name: cw.OrdersWorld(root / name, name=name, prefix=(name,), wh_key=f"wh_{name}", src_key=f"src_{name}")
                 for name in cw.STORIES}
    out[CONTRACT] = cw.ContractWorld(root / CONTRACT, name=CONTRACT, wh_key=f"wh_{CONTRACT}")
    return out


def remediation_sensor_name(cause: str) -> str:
    return f"{c.REMEDIATION_SENSOR}_{cause}"


def _receipt_job(tableau_url: str | None) -> dg.JobDefinition:
    from dw_dagster.integrations.tableau import TableauClient

    if not tableau_url:
        return build_receipt_job()
    return build_receipt_job(bi_refresh=lambda: TableauClient(tableau_url, "grocer", "dw-dagster", "s3cret"))


def cause_definitions(root: Path, domains: Path, tableau_url: str | None = None) -> dg.Definitions:
    """The location's definitions (module docstring); the test builds the same ones to load its worlds."""
    ws, holder = worlds(root), {}
    graph = lambda: holder["defs"].resolve_asset_graph()  # noqa: E731 - the location's graph, read when diagnosing
    parts = {n: cw.contract_parts(w, domains) if n == CONTRACT else cw.orders_parts(w, domains, graph) for n, w in ws.items()}
    wh_keys = [w.wh_key for w in ws.values()]
    steps = build_step_jobs({DEDUPE: run_dedupe_step, c.DBT_BUILD_STEP: dbt_build_runner(pipeline_root=ws[CONTRACT].repo)},
                            resource_keys=wh_keys)
    undo_jobs = build_undo_jobs(wh_keys)
    by_asset = {tuple(ws[n].model.path if n == CONTRACT else ws[n].orders.path): p.diagnoser for n, p in parts.items()}
    diag = build_diagnosis_job(diagnoser=lambda context, incident: by_asset[tuple(incident.asset_key)](context, incident))
    receipts = _receipt_job(tableau_url)
    running = dg.DefaultSensorStatus.RUNNING
    sensors = [build_check_incident_sensor(check_keys=[w.compare for w in ws.values()], diagnosis_job_name=diag.name,
                                           minimum_interval_seconds=INTERVAL_S, default_status=running)]
    for n, p in parts.items():
        sensors.append(build_remediation_sensor(
            **p.remediation, receipt_job=receipts, step_jobs=steps, undo_jobs=None if n == CONTRACT else undo_jobs,
            name=remediation_sensor_name(n), accepts=lambda cs, n=n: cs.domain == n,
            minimum_interval_seconds=INTERVAL_S, default_status=running))
    holder["defs"] = dg.Definitions(
        assets=[a for p in parts.values() for a in p.assets], asset_checks=[k for p in parts.values() for k in p.checks],
        jobs=[*(j for p in parts.values() for j in p.jobs.values()), diag, receipts, build_approval_job(), *steps.values(),
              *undo_jobs],
        sensors=sensors, resources={k: v for p in parts.values() for k, v in p.resources.items()},
        executor=dg.in_process_executor)
    return holder["defs"]


@dg.definitions
def defs() -> dg.Definitions:
    return cause_definitions(Path(os.environ["DW_TEST_CAUSE_ROOT"]), Path(os.environ["DW_DOMAINS_FILE"]),
                             os.environ.get("DW_TEST_TABLEAU_URL"))
