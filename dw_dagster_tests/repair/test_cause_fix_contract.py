"""Issue 31: a schema change upstream of a dbt model with an enforced contract, end to end.

``app.raw_orders`` relaxes ``note`` to NULLABLE and starts sending NULLs; the dbt model
``orders_contracted`` (DuckDB, ``contract: {enforced: true}``, ``note`` with a ``not_null``
constraint) no longer builds, so its table falls behind the raw table and the reconciliation
check fails. The diagnosis finds the schema change from the ``dw/schema`` snapshots; the change
set is the model's contract diff for the owner to merge, a ``dbt_build`` step, and the schema
contract test; after approval and the merge, the remediation sensor (LocalSensorDaemon) runs the
real ``dbt build``, the verify stage runs the new test, and the receipt names it.

The failure from the field: https://github.com/dbt-labs/dbt-core/issues/10430 (a contracted model
breaks on its upstream column's changed type), and the contract's breaking-change rules in
https://github.com/dbt-labs/dbt-core/issues/7332.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest
import yaml

from dw_dagster.approval.job import approve_in_process
from dw_dagster.checks import build_reconciliation_checks
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.domains import load_domains
from dw_dagster.core.models import BlastRadius, Diagnosis, utcnow
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.diagnosis.causes.schema_change import diagnose_schema_change, schema_metadata, take_schema_snapshot
from dw_dagster.diagnosis.contracts import contract_fix_args
from dw_dagster.diagnosis.fixes import FixContext, propose_contract_fix
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.proposals.watermark import ProposalError, apply_change_set
from dw_dagster.receipts.job import build_receipt_job, receipt_markdown
from dw_dagster.repair.dbt_build import dbt_build_runner
from dw_dagster.repair.new_tests import build_new_tests_check
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.repair.steps import build_step_jobs
from dw_dagster.testing.local_daemon import LocalSensorDaemon

OWNER = "dana.ortiz@grocer.example"
RAW, MODEL = dg.AssetKey("raw_orders"), dg.AssetKey("orders_contracted")
SCHEMA = """\
version: 2
models:
  - name: orders_contracted
    config:
      materialized: table
      contract:
        enforced: true
    columns:
      - name: id
        data_type: integer
        constraints:
          - type: not_null
      - name: note
        data_type: varchar
        constraints:
          - type: not_null
"""


def _dbt_build(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "dbt"), "build", "--project-dir", str(project),
                           "--profiles-dir", str(project)], capture_output=True, text=True, cwd=project)


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", *args], cwd=repo, check=True, capture_output=True)


def test_schema_change_behind_a_dbt_contract_is_fixed_in_the_contract(tmp_path, monkeypatch):
    domains = tmp_path / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: orders
            assets: [[orders_contracted], [raw_orders]]
            approvers: [{OWNER}]
            autonomy: L2
            identity: unverified
        """))
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    wh = DuckDBDatabase(tmp_path / "wh.duckdb")
    wh.execute("CREATE SCHEMA app; CREATE TABLE app.raw_orders (id INT NOT NULL, note VARCHAR NOT NULL);"
               "INSERT INTO app.raw_orders SELECT i, 'n' || i FROM range(1, 17) t(i)")
    repo = tmp_path / "repo"
    project = repo / "dbt"
    (project / "models").mkdir(parents=True)
    (project / "dbt_project.yml").write_text("name: shop\nversion: '1.0'\nconfig-version: 2\nprofile: shop\n"
                                             "model-paths: [models]\n")
    (project / "profiles.yml").write_text(f"shop:\n  target: dev\n  outputs:\n    dev:\n      type: duckdb\n"
                                          f"      path: {wh.path}\n      schema: main\n      threads: 1\n")
    (project / "models" / "sources.yml").write_text("version: 2\nsources:\n  - name: app\n    schema: app\n"
                                                    "    tables:\n      - name: raw_orders\n")
    (project / "models" / "orders_contracted.sql").write_text("select id, note from {{ source('app', 'raw_orders') }}\n")
    (project / "models" / "schema.yml").write_text(SCHEMA)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "init")
    assert _dbt_build(project).returncode == 0
    assert wh.fetch_all("SELECT count(*) FROM main.orders_contracted")[0][0] == 16

    recon = build_reconciliation_checks(asset=MODEL, source_asset=RAW, source_table="app.raw_orders",
                                        target_table="main.orders_contracted", key_columns=["id"], slice_by=[],
                                        source_resource_key="warehouse", target_resource_key="warehouse", name="compare")
    new_tests = build_new_tests_check(MODEL, resource_key="warehouse", pipeline_root=repo, tests_dir="dbt/tests")
    compare = dg.AssetCheckKey(MODEL, "compare")
    detect = dg.define_asset_job("detect", selection=dg.AssetSelection.checks(compare))
    verify = dg.define_asset_job("verify", selection=dg.AssetSelection.checks(compare, dg.AssetCheckKey(MODEL, c.NEW_TESTS_CHECK)))
    steps = build_step_jobs({c.DBT_BUILD_STEP: dbt_build_runner(pipeline_root=repo)}, resource_keys=["warehouse"],
                            include_migration=False)
    seen = {}

    def diagnoser(context, incident):
        f = diagnose_schema_change(context.instance, [MODEL, RAW], gap_rows=incident.gap_rows)
        diag = Diagnosis(id="dg-" + incident.id, incident_id=incident.id, asset_key=incident.asset_key,
                         created_at=utcnow(), causes=[f], blast_radius=BlastRadius(root="orders_contracted"),
                         gap_rows=incident.gap_rows, unexplained_rows=f.unexplained_rows)
        ctx = FixContext(incident=incident, diagnosis=diag, domain=load_domains(domains).get("orders"), pipeline_root=repo,
                         target_table="main.orders_contracted", merge_key=["id"], partition_column="id",
                         resource_key="warehouse", database=wh, partitions_def=None,
                         verify_checks=[["orders_contracted", "compare"]], tests_dir="dbt/tests")
        seen["finding"] = f
        # what IncrementalLoadDiagnoser/RecordedLoadDiagnoser do for a schema change: the contracted model found
        # in the manifest (the diagnosed asset itself) and its properties file, relative to the pipeline repository
        args = contract_fix_args(project / "target" / "manifest.json", MODEL.path, {}, repo, f, "main.orders_contracted")
        assert args == {"model": "orders_contracted", "schema_file": "dbt/models/schema.yml", "dbt_project": "dbt",
                        "upstream_table": "app.raw_orders"}
        assert contract_fix_args(project / "target" / "manifest.json", RAW.path, {}, repo, f, "app.raw_orders") is None
        return diag, propose_contract_fix(ctx, f, **args)

    diag = build_diagnosis_job(diagnoser=diagnoser)
    defs = dg.Definitions(
        assets=[dg.AssetSpec(RAW), dg.AssetSpec(MODEL, deps=[RAW])], asset_checks=[recon, new_tests],
        jobs=[detect, verify, diag, build_receipt_job(), *steps.values()],
        sensors=[build_check_incident_sensor(check_keys=[compare], diagnosis_job_name=diag.name),
                 build_remediation_sensor(verify_job=verify, receipt_job=build_receipt_job(), step_jobs=steps,
                                          pipeline_root=repo)],
        resources={"warehouse": DatabaseResource(url=f"duckdb:///{wh.path}")}, executor=dg.in_process_executor)

    with dg.DagsterInstance.ephemeral() as instance:
        snap = lambda: instance.report_runless_asset_event(  # noqa: E731
            dg.AssetObservation(RAW, metadata=schema_metadata(take_schema_snapshot(wh, "app.raw_orders"))))
        snap()
        wh.execute("ALTER TABLE app.raw_orders ALTER COLUMN note DROP NOT NULL;"  # upstream relaxes note ...
                   "INSERT INTO app.raw_orders SELECT i, NULL FROM range(17, 21) t(i)")  # ... and sends NULLs
        snap()
        failed = _dbt_build(project)
        assert failed.returncode != 0 and "constraint" in failed.stdout.lower()  # the contract rejects the build
        assert not defs.resolve_job_def("detect").execute_in_process(instance=instance).get_asset_check_evaluations()[0].passed
        daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
        assert len(daemon.tick("dw_check_incident_sensor").run_ids) == 1
        assert seen["finding"].kind == "schema_change" and "note" in seen["finding"].summary
        (cs,) = records.change_sets(instance)
        assert cs.new_tests == ["dbt/tests/dw_schema_contract__main__orders_contracted.sql"]
        assert "-          - type: not_null" in cs.diff and "dbt/models/schema.yml" in cs.diff
        assert [s.kind for s in cs.steps] == ["dbt_build"] and cs.window == []
        assert approve_in_process(instance, cs.id, approver=OWNER)[0]
        assert not daemon.tick("dw_remediation_sensor").run_ids  # waits for the owner's merge
        apply_change_set(cs, repo, OWNER)
        after = yaml.safe_load((project / "models" / "schema.yml").read_text())["models"][0]
        assert [col.get("constraints") for col in after["columns"]] == [[{"type": "not_null"}], None]
        stages = []
        for _ in range(6):
            tick = daemon.tick("dw_remediation_sensor")
            assert not tick.failed_run_ids, stages
            if not tick.run_ids:
                break
            stages.append(instance.get_run_by_id(tick.run_ids[0]).tags[c.STAGE_TAG])
        assert stages == ["dbt_build-1", "verify", "receipt"]
        assert wh.fetch_all("SELECT count(*), count(note) FROM main.orders_contracted")[0] == (20, 16)
        (r,) = records.receipts(instance, MODEL)
        assert r.verified and r.outcome == "applied", receipt_markdown(r)
        assert [t["test"] for t in r.evidence_summary[c.RECEIPT_NEW_TESTS]] == cs.new_tests
        assert f"`{cs.new_tests[0]}` passed" in receipt_markdown(r)


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
