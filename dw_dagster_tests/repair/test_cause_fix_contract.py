"""Issue 31: a schema change upstream of a dbt model with an enforced contract, end to end.

``app.raw_orders`` relaxes ``note`` to NULLABLE and starts sending NULLs; the dbt model
``orders_contracted`` (DuckDB, ``contract: {enforced: true}``, ``note`` with a ``not_null``
constraint) no longer builds, so its table falls behind the raw table and the reconciliation
check fails. The diagnosis finds the schema change from the ``dw/schema`` snapshots; the change
set is the model's contract diff for the owner to merge, a ``dbt_build`` step, and the schema
contract test; after approval and the merge, the remediation sensor (LocalSensorDaemon) runs the
real ``dbt build``, the verify stage runs the new test, and the receipt names it. The world is
built by :mod:`.cause_world` (shared with the daemon's test, :mod:`dw_dagster_tests.e2e.test_cause_fixes_daemon`).

The failure from the field: https://github.com/dbt-labs/dbt-core/issues/10430 (a contracted model
breaks on its upstream column's changed type), and the contract's breaking-change rules in
https://github.com/dbt-labs/dbt-core/issues/7332.
"""

import dagster as dg
import pytest
import yaml

from dw_dagster.approval.job import approve_in_process
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.proposals.watermark import ProposalError, apply_change_set
from dw_dagster.receipts.job import build_receipt_job
from dw_dagster.repair.dbt_build import dbt_build_runner
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.repair.steps import build_step_jobs
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_tests.repair import cause_world as cw
from dw_dagster_tests.repair.cause_world import CONTRACT_SCHEMA as SCHEMA
from dw_dagster_tests.repair.cause_world import OWNER


def test_schema_change_behind_a_dbt_contract_is_fixed_in_the_contract(tmp_path, monkeypatch):
    w = cw.ContractWorld(tmp_path)
    domains = cw.domains_file(tmp_path / "domains.yaml", [w])
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    cw.create_contract_world(w)
    parts = cw.contract_parts(w, domains)
    steps = build_step_jobs({c.DBT_BUILD_STEP: dbt_build_runner(pipeline_root=w.repo)}, resource_keys=["warehouse"],
                            include_migration=False)
    diag = build_diagnosis_job(diagnoser=parts.diagnoser)
    defs = dg.Definitions(
        assets=parts.assets, asset_checks=parts.checks, jobs=[*parts.jobs.values(), diag, build_receipt_job(), *steps.values()],
        sensors=[build_check_incident_sensor(check_keys=[w.compare], diagnosis_job_name=diag.name),
                 build_remediation_sensor(**parts.remediation, receipt_job=build_receipt_job(), step_jobs=steps)],
        resources=parts.resources, executor=dg.in_process_executor)

    with dg.DagsterInstance.ephemeral() as instance:
        cw.contract_story(instance, w)
        detect = defs.resolve_job_def(w.job("detect")).execute_in_process(instance=instance)
        assert not detect.get_asset_check_evaluations()[0].passed
        daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
        assert len(daemon.tick("dw_check_incident_sensor").run_ids) == 1
        assert w.seen["args"] == {"model": "orders_contracted", "schema_file": "dbt/models/schema.yml", "dbt_project": "dbt",
                                  "upstream_table": "app.raw_orders"}
        (cs,) = records.change_sets(instance)
        assert w.seen["finding"] == cw.acted_finding(instance, cs)
        cw.check_contract_proposal(w, cs)
        assert approve_in_process(instance, cs.id, approver=OWNER)[0]
        assert not daemon.tick("dw_remediation_sensor").run_ids  # waits for the owner's merge
        apply_change_set(cs, w.repo, OWNER)
        stages = cw.tick_stages(daemon, instance)
        (r,) = records.receipts(instance, w.model)
        cw.check_contract_repair(instance, w, cs, stages, r)


def test_a_model_without_an_enforced_contract_gets_the_migration_instead():
    from dw_dagster.diagnosis.fixes import _contract_edit

    doc = yaml.safe_load(SCHEMA.replace("enforced: true", "enforced: false"))
    with pytest.raises(ProposalError, match="no enforced contract.*propose a migration instead"):
        _contract_edit(doc, "orders_contracted", [], "schema.yml")
    with pytest.raises(ProposalError, match="has no model 'other'"):
        _contract_edit(doc, "other", [], "schema.yml")


def test_the_diagnoser_finds_the_contracted_model_by_its_asset_key_or_name():
    """What IncrementalLoadDiagnoser/RecordedLoadDiagnoser ask before proposing a migration for a schema
    change: is the diagnosed asset a dbt model with an enforced contract (by ``dbt_asset_keys``, else by name)?"""
    from dw_dagster.diagnosis.contracts import contracted_model

    def model(name, enforced):
        return {"resource_type": "model", "name": name, "patch_path": "shop://models/schema.yml",
                "config": {"contract": {"enforced": enforced}}}

    manifest = {"nodes": {"model.shop.orders_contracted": model("orders_contracted", True),
                          "model.shop.loose": model("loose", False),
                          "seed.shop.orders_contracted_seed": {"resource_type": "seed", "name": "orders_contracted_seed"}}}
    keys = {"model.shop.orders_contracted": ["marts", "orders"]}
    assert contracted_model(manifest, ["marts", "orders"], keys)["name"] == "orders_contracted"  # by its asset key
    assert contracted_model(manifest, ["orders_contracted"], {})["name"] == "orders_contracted"  # by its name
    assert contracted_model(manifest, ["loose"], {}) is None  # no enforced contract: the migration is the fix
    assert contracted_model(manifest, ["orders_contracted_seed"], {}) is None and contracted_model(manifest, ["x"]) is None
