"""Issue 31: every diagnosed cause gets its change set and the test that would have caught it, end to end.

One small real world per test: a source DuckDB, a warehouse DuckDB with ``app.raw_orders`` (the
upstream asset ``raw_orders``) and ``app.orders`` (the asset ``orders`` that reads it), daily
partitions, a git pipeline repository the owner merges into, the reconciliation check that
detects the incident, the real cause functions, the proposals of :mod:`dw_dagster.diagnosis.fixes`,
the diagnosis job, the remediation sensor (ticked by the LocalSensorDaemon) and the receipt job on
a temporary Dagster instance. Each test walks incident → diagnosis → change set with its new test
→ approval → merge → repair → verify (the new test runs and passes) → receipt naming the test.

Failures from the field, one per kind:

- upstream failed, its reader ran on the missing partition anyway:
  https://github.com/dagster-io/dagster/issues/18441 (no "upstream materializations are missing"
  warning when the upstream partition failed);
- upstream stale, its reader ran on old data: https://github.com/dagster-io/dagster/issues/14385
  (partitioned assets not marked stale when the upstream has new data);
- duplicated load: https://github.com/airbytehq/airbyte/issues/12336 (each failed-sync retry
  appends the records again) and https://github.com/dbt-labs/dbt-core/issues/10432 (duplicate rows
  on the merge key of an incremental model);
- schema change the target does not take: https://github.com/dbt-labs/dbt-core/issues/10430 (a
  contracted incremental model fails on an upstream column's changed type).
"""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.approval.job import approve_in_process
from dw_dagster.changes.dedupe import DEDUPE, run_dedupe_step
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.domains import load_domains
from dw_dagster.core.models import BlastRadius, Diagnosis, utcnow
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.diagnosis.fixes import FixContext, propose_schema_fix
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.integrations.tableau import TableauClient
from dw_dagster.proposals.watermark import ProposalError, apply_change_set
from dw_dagster.receipts.job import build_receipt_job
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.repair.steps import build_step_jobs
from dw_dagster.repair.undo import build_undo_jobs
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_dev.fakes.tableau_server import FakeTableau, FakeTableauServer
from dw_dagster_tests.repair import cause_world as cw
from dw_dagster_tests.repair.cause_world import DAILY, DAYS, OWNER, cond, load

RAW, ORDERS = dg.AssetKey("raw_orders"), dg.AssetKey("orders")


@pytest.fixture
def world(tmp_path, monkeypatch):
    """(definitions, instance, the world, the domains file): one world with the remediation sensor on a temporary instance."""
    w = cw.OrdersWorld(tmp_path)
    domains = cw.domains_file(tmp_path / "domains.yaml", [w])
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    cw.create_orders_world(w)
    holder = {}
    parts = cw.orders_parts(w, domains, lambda: holder["defs"].resolve_asset_graph())
    steps = build_step_jobs({DEDUPE: run_dedupe_step}, resource_keys=["warehouse"])
    undo_jobs = build_undo_jobs(["warehouse"])
    diag = build_diagnosis_job(diagnoser=parts.diagnoser)
    tableau = FakeTableauServer(FakeTableau(workbooks={"Store P&L": True}))
    receipts = build_receipt_job(bi_refresh=lambda: TableauClient(tableau.url, "grocer", "dw-dagster", "s3cret"))
    holder["defs"] = defs = dg.Definitions(
        assets=parts.assets, asset_checks=parts.checks,
        jobs=[*parts.jobs.values(), diag, receipts, *steps.values(), *undo_jobs],
        sensors=[build_check_incident_sensor(check_keys=[w.compare], diagnosis_job_name=diag.name),
                 build_remediation_sensor(**parts.remediation, receipt_job=receipts, step_jobs=steps, undo_jobs=undo_jobs)],
        resources=parts.resources, executor=dg.in_process_executor)
    with dg.DagsterInstance.ephemeral() as instance, tableau:
        yield defs, instance, w, domains


def _incident_to_receipt(defs, instance, w):
    """Detect, diagnose, approve, merge, repair: (the change set, the stages run, the receipt on orders)."""
    first = defs.resolve_job_def(w.job("detect")).execute_in_process(instance=instance, raise_on_error=False)
    (ev,) = first.get_asset_check_evaluations()
    assert not ev.passed
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    assert len(daemon.tick("dw_check_incident_sensor").run_ids) == 1
    (cs,) = records.change_sets(instance)
    cw.assert_change_set_names_its_test(cs, w.orders.path)
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    tick = daemon.tick("dw_remediation_sensor")
    assert not tick.run_ids  # the new test is part of the diff: nothing changes data before the owner merges it
    apply_change_set(cs, w.repo, OWNER)
    stages = cw.tick_stages(daemon, instance)
    (r,) = records.receipts(instance, ORDERS)
    return cs, stages, r


@pytest.mark.parametrize("cause", list(cw.STORIES))
def test_each_cause_from_incident_to_the_receipt_naming_its_test(world, cause):
    """upstream failed (the upstream, then its readers, rerun; the Store P&L refreshed after the receipt),
    upstream stale (likewise), duplicated load (the partition held and deduplicated, not rerun), schema
    change (a migration with its rollback, then the reload): each change set adds the test that would
    have caught it, and the receipt names it, passed."""
    defs, instance, w, _ = world
    cw.STORIES[cause](defs, instance, w)
    cs, stages, r = _incident_to_receipt(defs, instance, w)
    assert w.seen["finding"] == cw.acted_finding(instance, cs)  # what the diagnoser acted on is what it recorded
    cw.CHECKS[cause](instance, w, cs, stages, r)


def test_duplicates_whose_copies_differ_are_refused_with_what_to_do(world):
    defs, instance, w, _ = world
    wh = w.wh
    from dw_dagster.changes.dedupe import dedupe_step
    from dw_dagster.changes.steps import StepRefused

    wh.execute(f"ATTACH '{w.src.path}' AS s (READ_ONLY); INSERT INTO app.orders SELECT * FROM s.app.src_orders")
    wh.execute(f"INSERT INTO app.orders SELECT id, ts, amount + 1, note FROM app.orders WHERE {cond(DAYS[1])}")
    step = dedupe_step(table="app.orders", key_columns=["id"], partition_column="ts", window=[DAYS[1]],
                       resource_key="warehouse", dialect="duckdb")
    cs = type("CS", (), {"id": "cs-x"})()
    with pytest.raises(StepRefused, match="4 key.*differ in other columns.*a person must decide"):
        run_dedupe_step(dg.build_op_context(), cs, step, wh)
    assert wh.fetch_all("SELECT count(*) FROM app.orders")[0][0] == 24  # nothing changed
    # a change set whose window was not kept first (no snapshot stage: no undo jobs) replaces nothing
    from dw_dagster.core.models import ChangeSet, UndoPlan

    now = utcnow()
    real = ChangeSet.seal(id="cs-nosnap", incident_id="i", diagnosis_id="d", domain="orders", proposer="dw", created_at=now,
                          expires_at=now, approvers=[OWNER], cause_kind="duplicate_load", summary="s", target_asset=["orders"],
                          window=[DAYS[1]], diff="", files=[], rebuild_assets=[], steps=[step], hold_only=True,
                          undo_plan=UndoPlan(resource_key="warehouse", table="app.orders", partition_column="ts",
                                             window=[DAYS[1]]))
    with pytest.raises(StepRefused, match="no copy of .* was kept .*undo_jobs"):
        run_dedupe_step(dg.build_op_context(instance=instance), real, step, wh)


def test_a_rename_upstream_is_refused_with_what_a_person_must_do(world):
    defs, instance, w, domains = world
    from dw_dagster.core.models import CauseFinding, Incident

    finding = CauseFinding(kind="schema_change", summary="renamed", confidence=0.5, explained_rows=0, unexplained_rows=4,
                           details={"changes": [{"table": "app.raw_orders", "changes": [
                               {"kind": "renamed", "column": "note", "new_column": "remark"}]}]})
    inc = Incident(id="inc-r", asset_key=["orders"], source="manual", detected_at=utcnow(), summary="x", gap_rows=4)
    diag = Diagnosis(id="dg-r", incident_id="inc-r", asset_key=["orders"], created_at=utcnow(), causes=[finding],
                     blast_radius=BlastRadius(root="orders"), gap_rows=4, unexplained_rows=4)
    ctx = FixContext(incident=inc, diagnosis=diag, domain=load_domains(domains).get("orders"),
                     pipeline_root=w.repo, target_table="app.orders", merge_key=["id"], partition_column="ts",
                     resource_key="warehouse", database=w.wh, partitions_def=DAILY)
    with pytest.raises(ProposalError, match="note renamed to remark upstream: a person must decide"):
        propose_schema_fix(ctx, finding)


def test_the_causes_guide_snippets_run(tmp_path):
    """docs/snippets/causes/fixes_definitions.py wires the check and the step jobs into valid
    Definitions; docs/snippets/causes/dw_unique_merge_key__app__orders.sql is what the fix writes,
    and it finds the duplicated key in a real table."""
    from pathlib import Path

    from dw_dagster.proposals.regression_tests import duplicate_keys_test, runnable_sql

    snippets = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "causes"
    scope: dict = {}
    exec(compile((snippets / "fixes_definitions.py").read_text(), "causes/fixes_definitions.py", "exec"), scope)  # noqa: S102
    defs = dg.Definitions(assets=[dg.AssetSpec("orders")], asset_checks=[scope["new_tests"]],
                          jobs=[scope["verify"], *scope["step_jobs"].values()],
                          resources={"warehouse": DatabaseResource(url=f"duckdb:///{tmp_path / 'w.duckdb'}")})
    dg.Definitions.validate_loadable(defs)
    assert {"migration", "migration_rollback", DEDUPE} <= set(scope["step_jobs"])
    sql_text = (snippets / "dw_unique_merge_key__app__orders.sql").read_text()
    assert sql_text == duplicate_keys_test("app.orders", ["id"], "duckdb", tests_dir="dbt_project/tests").file_text("cs-3f9a1c0d2e")
    db = DuckDBDatabase(tmp_path / "t.duckdb")
    db.execute("CREATE SCHEMA app; CREATE TABLE app.orders (id INT); INSERT INTO app.orders VALUES (1), (2), (2)")
    assert db.fetch_all(runnable_sql(sql_text)) == [(2, 2)]


def test_the_dedupe_step_and_the_new_tests_on_postgresql(postgres, tmp_path):
    """The same step, guard and tests on PostgreSQL (another engine, a composite merge key, a
    timestamptz partition column): duplicates replaced in one transaction, the uniqueness and
    contract tests fail before and pass after; a NOT NULL drift test catches a NULL."""
    import uuid

    from dw_dagster.proposals.regression_tests import duplicate_keys_test, not_null_test, schema_contract_test
    from dw_dagster.changes.dedupe import dedupe_step
    from dw_dagster.repair.new_tests import run_test_file

    schema = f"t_{uuid.uuid4().hex[:10]}"
    table = f"{schema}.lines"
    postgres.execute(f"CREATE SCHEMA {schema}")
    try:
        postgres.execute(f"CREATE TABLE {table} (store_id INT NOT NULL, line_no INT NOT NULL, sold_at TIMESTAMPTZ, "
                         "amount NUMERIC(18,2))")
        postgres.execute(f"INSERT INTO {table} SELECT s, l, TIMESTAMPTZ '2024-03-02 10:00:00+00', 1.25 "
                         "FROM generate_series(1, 3) s, generate_series(1, 4) l")
        postgres.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE store_id = 2")  # the load appended twice
        repo = tmp_path / "repo"
        tests = [duplicate_keys_test(table, ["store_id", "line_no"], "postgres", tests_dir="t"),
                 schema_contract_test(table, [("store_id", False), ("amount", True)], "postgres", tests_dir="t"),
                 not_null_test(table, ["amount"], "postgres", tests_dir="t")]
        for t in tests:
            (repo / t.path).parent.mkdir(parents=True, exist_ok=True)
            (repo / t.path).write_text(t.file_text("cs-pg"))
        before = [run_test_file(postgres, repo, t.path) for t in tests]
        assert [(r["passed"], r.get("failing_rows")) for r in before] == [(False, 4), (True, 0), (True, 0)]
        step = dedupe_step(table=table, key_columns=["store_id", "line_no"], partition_column="sold_at",
                           window=["2024-03-02"], resource_key="warehouse", dialect="postgres")
        result = run_dedupe_step(dg.build_op_context(), type("CS", (), {"id": "cs-pg"})(), step, postgres)
        assert (result["rows_before"], result["distinct_keys_before"], result["rows_after"]) == (16, 12, 12)
        assert all(r["passed"] for r in (run_test_file(postgres, repo, t.path) for t in tests))
        postgres.execute(f"UPDATE {table} SET amount = NULL WHERE store_id = 3 AND line_no = 1")
        assert run_test_file(postgres, repo, tests[2].path) == {"test": tests[2].path, "passed": False, "failing_rows": 1}
    finally:
        postgres.execute(f"DROP SCHEMA {schema} CASCADE")


def _recorded_diagnoser(defs, repo, domains):
    from dw_dagster.diagnosis.job import RecordedLoadDiagnoser

    return RecordedLoadDiagnoser(
        target_asset=ORDERS, source_resource_key="source", target_resource_key="warehouse", pipeline_root=lambda: repo,
        pipeline_file="settings.yaml", manifest_path=None, partitions_def=DAILY, domains_file=domains, dbt_asset_keys={},
        verify_checks=[["orders", "compare"]], source_table="app.src_orders", target_table="app.orders", key_column="id",
        partition_column="ts", arrival_column="ts", tests_dir="tests", upstream_tables={"raw_orders": "app.raw_orders"},
        asset_graph=defs.resolve_asset_graph, history=False)


def _incident(gap, window=None):
    from dw_dagster.core.models import Incident

    start = dt.datetime.fromisoformat(window).replace(tzinfo=dt.timezone.utc) if window else None
    return Incident(id=f"inc-{gap}", asset_key=["orders"], source="manual", detected_at=utcnow(), summary="x",
                    gap_rows=gap, window_start=start, window_end=start + dt.timedelta(days=1) if start else None)


def test_the_generic_diagnoser_proposes_the_duplicate_and_upstream_fixes(world):
    """RecordedLoadDiagnoser (what a dataops.yaml location runs) acts on the finding that counts rows,
    else on the upstream or schema finding with the highest confidence, and proposes its change set."""
    defs, instance, w, domains = world
    wh = w.wh
    resources = {"source": DatabaseResource(url=f"duckdb:///{w.src.path}"),
                 "warehouse": DatabaseResource(url=f"duckdb:///{wh.path}")}
    d = _recorded_diagnoser(defs, w.repo, domains)
    cw.duplicated_load_story(defs, instance, w)
    diag, cs = d(dg.build_op_context(instance=instance, resources=resources), _incident(-4))
    assert diag.primary.kind == "duplicate_load" and cs.cause_kind == "duplicate_load"
    assert cs.window == [DAYS[2]] and [s.kind for s in cs.steps] == ["dedupe"] and cs.hold_only
    assert cs.new_tests == ["tests/dw_unique_merge_key__app__orders.sql"]
    # upstream failed on the next day: no finding counts rows, the upstream one acts
    wh.execute(f"DELETE FROM app.orders WHERE {cond(DAYS[2])}; INSERT INTO app.orders SELECT * FROM app.raw_orders "
               f"WHERE {cond(DAYS[2])}; DELETE FROM app.raw_orders WHERE {cond(DAYS[3])}")
    w.set_state(fail_raw=[DAYS[3]])
    load(defs, instance, w, [DAYS[3]], assets=[RAW], ok=False)
    load(defs, instance, w, [DAYS[3]], assets=[ORDERS])
    diag, cs = d(dg.build_op_context(instance=instance, resources=resources), _incident(4, DAYS[3]))
    assert cs is not None and cs.cause_kind == "upstream_not_refreshed_or_failed", [c.summary for c in diag.causes]
    assert cs.window == [DAYS[3]] and cs.asset_levels == [[["raw_orders"]], [["orders"]]]
    assert cs.new_tests == ["tests/dw_upstream_landed__app__orders.sql"]
