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
import subprocess
import textwrap
import time

import dagster as dg
import pytest

from dw_dagster.approval.job import approve_in_process
from dw_dagster.checks import build_reconciliation_checks
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.domains import load_domains
from dw_dagster.core.models import BlastRadius, Diagnosis, ExposureRef, utcnow
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.diagnosis.causes.duplicates import diagnose_duplicates
from dw_dagster.diagnosis.causes.schema_change import diagnose_schema_change, schema_metadata, take_schema_snapshot
from dw_dagster.diagnosis.causes.upstream import diagnose_upstream
from dw_dagster.diagnosis.combine import combine_findings
from dw_dagster.diagnosis.fixes import FixContext, propose_duplicate_fix, propose_schema_fix, propose_upstream_fix
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.integrations.tableau import TableauClient
from dw_dagster.proposals.watermark import ProposalError, apply_change_set
from dw_dagster.receipts.job import build_receipt_job, receipt_markdown
from dw_dagster.changes.dedupe import DEDUPE, run_dedupe_step
from dw_dagster.repair.new_tests import build_new_tests_check
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.repair.steps import build_step_jobs
from dw_dagster.repair.undo import build_undo_jobs
from dw_dagster_dev.fakes.tableau_server import FakeTableau, FakeTableauServer
from dw_dagster.testing.local_daemon import LocalSensorDaemon

OWNER = "dana.ortiz@grocer.example"
DAILY = dg.DailyPartitionsDefinition(start_date="2024-03-01", end_date="2024-03-06")
DAYS = DAILY.get_partition_keys()
RAW, ORDERS = dg.AssetKey("raw_orders"), dg.AssetKey("orders")
STATE = {"fail_raw": set(), "append": False}


def _cond(pk: str) -> str:
    a = dt.date.fromisoformat(pk)
    return f"ts >= TIMESTAMP '{a} 00:00:00' AND ts < TIMESTAMP '{a + dt.timedelta(days=1)} 00:00:00'"


@pytest.fixture
def world(tmp_path, monkeypatch):
    STATE.update(fail_raw=set(), append=False)
    domains = tmp_path / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: orders
            assets: [[orders], [raw_orders]]
            approvers: [{OWNER}]
            autonomy: L2
            identity: unverified
            max_window_partitions: 5
        """))
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "README").write_text("singular tests\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "--allow-empty", "-m", "init"],
                   cwd=repo, check=True)
    src, wh = DuckDBDatabase(tmp_path / "src.duckdb"), DuckDBDatabase(tmp_path / "wh.duckdb")
    src.execute("CREATE SCHEMA app; CREATE TABLE app.src_orders (id INT, ts TIMESTAMP, amount DECIMAL(18,2), note VARCHAR)")
    src.execute("INSERT INTO app.src_orders SELECT i, TIMESTAMP '2024-03-01 06:00:00' + INTERVAL ((i - 1) // 4) DAY "
                "+ INTERVAL (i % 4) HOUR, 2.50, 'n' || i FROM range(1, 21) t(i)")  # 4 rows a day, 03-01..03-05
    wh.execute("CREATE SCHEMA app; CREATE TABLE app.raw_orders (id INT, ts TIMESTAMP, amount DECIMAL(18,2), note VARCHAR);"
               "CREATE TABLE app.orders (id INT NOT NULL, ts TIMESTAMP, amount DECIMAL(18,2), note VARCHAR NOT NULL)")

    @dg.asset(key=RAW, partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run())
    def raw_orders(context: dg.AssetExecutionContext, warehouse: DatabaseResource) -> None:
        for pk in context.partition_keys:
            if pk in STATE["fail_raw"]:
                raise RuntimeError(f"source unreachable for {pk}")
            warehouse.get_database().execute(
                f"DELETE FROM app.raw_orders WHERE {_cond(pk)}; ATTACH '{src.path}' AS s (READ_ONLY); "
                f"INSERT INTO app.raw_orders SELECT * FROM s.app.src_orders WHERE {_cond(pk)}; DETACH s")

    @dg.asset(key=ORDERS, partitions_def=DAILY, deps=[raw_orders], backfill_policy=dg.BackfillPolicy.single_run())
    def orders(context: dg.AssetExecutionContext, warehouse: DatabaseResource) -> dg.MaterializeResult:
        from dw_dagster.pipelines.incremental import LoadResult, load_metadata

        loads = []
        for pk in context.partition_keys:  # append-only when STATE["append"], else replace the partition
            delete = "" if STATE["append"] else f"DELETE FROM app.orders WHERE {_cond(pk)}; "
            db = warehouse.get_database()
            n = db.fetch_all(f"SELECT count(*) FROM app.raw_orders WHERE {_cond(pk)}")[0][0]
            db.execute(f"{delete}INSERT INTO app.orders SELECT * FROM app.raw_orders WHERE {_cond(pk)}")
            start = dt.datetime.fromisoformat(pk)
            loads.append(LoadResult(partition_key=pk, partition_start=start, partition_end=start + dt.timedelta(days=1),
                                    watermark_column="ts", watermark_low=None, source_snapshot_ts=None, rows_read=n,
                                    rows_inserted=n))
        return dg.MaterializeResult(metadata=load_metadata(loads))  # what each load did (RecordedLoadDiagnoser reads it)

    recon = build_reconciliation_checks(asset=ORDERS, source_asset="src_orders", source_table="app.src_orders",
                                        target_table="app.orders", key_columns=["id"], slice_by=[], source_resource_key="source",
                                        target_resource_key="warehouse", name="compare", partition_column="ts",
                                        partitions_def=DAILY)
    new_tests = build_new_tests_check(ORDERS, resource_key="warehouse", pipeline_root=repo, tests_dir="tests")
    compare = dg.AssetCheckKey(ORDERS, "compare")
    detect_job = dg.define_asset_job("detect_orders", selection=dg.AssetSelection.checks(compare))
    verify_job = dg.define_asset_job("verify_orders", selection=dg.AssetSelection.checks(
        compare, dg.AssetCheckKey(ORDERS, c.NEW_TESTS_CHECK)))
    window_job = dg.define_asset_job("rerun_window", selection=dg.AssetSelection.assets(RAW, ORDERS), partitions_def=DAILY)
    load_job = dg.define_asset_job("load", selection=dg.AssetSelection.assets(RAW, ORDERS), partitions_def=DAILY)
    steps = build_step_jobs({DEDUPE: run_dedupe_step}, resource_keys=["warehouse"])
    undo_jobs = build_undo_jobs(["warehouse"])
    proposals = {}

    def diagnoser(context, incident):
        """The real causes, combined; the change set of the one to act on (as IncrementalLoadDiagnoser does)."""
        graph = proposals["defs"].resolve_asset_graph()
        gap_days = [pk for pk in DAYS if wh.fetch_all(f"SELECT count(*) FROM app.orders WHERE {_cond(pk)}")[0][0]
                    != src.fetch_all(f"SELECT count(*) FROM app.src_orders WHERE {_cond(pk)}")[0][0]]
        found = [diagnose_duplicates(wh, target_table="app.orders", key_columns=["id"], partition_column="ts",
                                     gap_rows=incident.gap_rows),
                 diagnose_upstream(context.instance, graph, ORDERS, gap_rows=incident.gap_rows, partitions=gap_days,
                                   max_age=proposals.get("max_age")),
                 diagnose_schema_change(context.instance, [ORDERS, RAW], gap_rows=incident.gap_rows)]
        combined = combine_findings(incident.gap_rows, [f for f in found if f.details.get("tested", True)])
        pnl = ExposureRef(unique_id="exposure.shop.store_pnl", name="store_pnl", label="Store P&L", depth=2,
                          needed_by=proposals.get("needed_by"), bi={"tool": "tableau", "workbook": "Store P&L"})
        diag = Diagnosis(id="dg-" + incident.id, incident_id=incident.id, asset_key=incident.asset_key, created_at=utcnow(),
                         causes=combined.findings, blast_radius=BlastRadius(root="orders", exposures=[pnl]),
                         gap_rows=incident.gap_rows, unexplained_rows=combined.unexplained_rows)
        counting = [f for f in combined.findings if f.explained_rows > 0]
        act = counting[0] if counting else max((f for f in combined.findings if f.kind != "unexplained"),
                                                key=lambda f: f.confidence)
        ctx = FixContext(incident=incident, diagnosis=diag, domain=load_domains(domains).get("orders"), pipeline_root=repo,
                         target_table="app.orders", merge_key=["id"], partition_column="ts", resource_key="warehouse",
                         database=wh, partitions_def=DAILY, verify_checks=[["orders", "compare"]], tests_dir="tests")
        if act.kind == "duplicate_load":
            cs = propose_duplicate_fix(ctx, act)
        elif act.kind == "schema_change":
            cs = propose_schema_fix(ctx, act, rerun_window=gap_days)
        else:
            cs = propose_upstream_fix(ctx, act, instance=context.instance, graph=graph,
                                      upstream_tables={"raw_orders": "app.raw_orders"}, stale_window=gap_days)
        proposals["finding"] = act
        return diag, cs

    diag = build_diagnosis_job(diagnoser=diagnoser)
    tableau = FakeTableauServer(FakeTableau(workbooks={"Store P&L": True}))
    receipts = build_receipt_job(bi_refresh=lambda: TableauClient(tableau.url, "grocer", "dw-dagster", "s3cret"))
    defs = dg.Definitions(
        assets=[raw_orders, orders, dg.AssetSpec("src_orders")], asset_checks=[recon, new_tests],
        jobs=[detect_job, verify_job, window_job, load_job, diag, receipts, *steps.values(), *undo_jobs],
        sensors=[build_check_incident_sensor(check_keys=[compare], diagnosis_job_name=diag.name),
                 build_remediation_sensor(partitions_def=DAILY, window_job=window_job, verify_job=verify_job,
                                          receipt_job=receipts, step_jobs=steps, undo_jobs=undo_jobs,
                                          pipeline_root=repo)],
        resources={"source": DatabaseResource(url=f"duckdb:///{src.path}"),
                   "warehouse": DatabaseResource(url=f"duckdb:///{wh.path}")},
        executor=dg.in_process_executor,
    )
    proposals["defs"] = defs
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.DagsterInstance.ephemeral() as instance, tableau:
        proposals["domains"] = domains
        yield defs, instance, wh, repo, proposals


def _load(defs, instance, partitions, assets=(RAW, ORDERS), ok=True):
    """One run over the contiguous range of ``partitions`` (the assets load a range in one run)."""
    job = defs.resolve_job_def("load")
    tags = {"dagster/asset_partition_range_start": partitions[0], "dagster/asset_partition_range_end": partitions[-1]}
    res = job.execute_in_process(instance=instance, tags=tags, asset_selection=list(assets), raise_on_error=False)
    assert res.success is ok, partitions


def _incident_to_receipt(defs, instance, repo):
    """Detect, diagnose, approve, merge, repair: (the change set, the stages run, the receipt on orders)."""
    first = defs.resolve_job_def("detect_orders").execute_in_process(instance=instance, raise_on_error=False)
    (ev,) = first.get_asset_check_evaluations()
    assert not ev.passed
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    assert len(daemon.tick("dw_check_incident_sensor").run_ids) == 1
    (cs,) = records.change_sets(instance)
    assert cs.new_tests and cs.diff.count("new file mode") == len(cs.new_tests)
    assert [*cs.target_asset, c.NEW_TESTS_CHECK] in cs.verify_checks
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    tick = daemon.tick("dw_remediation_sensor")
    assert not tick.run_ids  # the new test is part of the diff: nothing changes data before the owner merges it
    apply_change_set(cs, repo, OWNER)
    stages = []
    for _ in range(12):
        tick = daemon.tick("dw_remediation_sensor")
        assert not tick.failed_run_ids, stages
        if not tick.run_ids:
            break
        stages.append(instance.get_run_by_id(tick.run_ids[0]).tags[c.STAGE_TAG])
    (r,) = records.receipts(instance, ORDERS)
    return cs, stages, r


def _assert_receipt_names_the_test(cs, r):
    assert r.verified and r.outcome == "applied", receipt_markdown(r)
    named = r.evidence_summary[c.RECEIPT_NEW_TESTS]
    assert [t["test"] for t in named] == cs.new_tests and all(t["passed"] for t in named)
    md = receipt_markdown(r)
    assert all(f"`{t}` passed" in md for t in cs.new_tests)
    (check,) = [o for o in r.checks if o.check_name == c.NEW_TESTS_CHECK]
    assert check.passed


def test_upstream_failed_reruns_the_upstream_then_its_readers(world):
    defs, instance, wh, repo, proposals = world
    _load(defs, instance, DAYS[:3])
    STATE["fail_raw"] = {DAYS[3]}
    _load(defs, instance, [DAYS[3]], assets=(RAW,), ok=False)  # the upstream failed ...
    _load(defs, instance, [DAYS[3]], assets=(ORDERS,))  # ... and orders read the empty partition anyway
    _load(defs, instance, [DAYS[4]])
    STATE["fail_raw"] = set()
    proposals["needed_by"] = "23:59 America/Chicago"
    cs, stages, r = _incident_to_receipt(defs, instance, repo)
    assert proposals["finding"].kind == "upstream_not_refreshed_or_failed"
    assert cs.window == [DAYS[3]] and cs.asset_levels == [[["raw_orders"]], [["orders"]]]
    assert cs.new_tests == ["tests/dw_upstream_landed__app__orders.sql"]
    assert stages == ["snapshot", "window-1", "window-1-level2", "verify", "receipt"]
    runs = {s: instance.get_run_by_id(r.run_ids[s]) for s in ("window-1", "window-1-level2")}
    assert [sorted(k.to_user_string() for k in run.asset_selection) for run in runs.values()] == [["raw_orders"], ["orders"]]
    assert wh.fetch_all(f"SELECT count(*) FROM app.orders WHERE {_cond(DAYS[3])}")[0][0] == 4
    _assert_receipt_names_the_test(cs, r)
    # after the verified receipt: the Store P&L extract is refreshed (Tableau REST, loopback fake) before its deadline
    (obs,) = [e for e in instance.fetch_observations(ORDERS, limit=50).records
              if c.BI_REFRESHED_KEY in e.asset_observation.metadata]
    meta = obs.asset_observation.metadata
    (row,) = meta[c.BI_REFRESHED_KEY].value
    assert meta[c.RECEIPT_ID_KEY].value == r.id and row["exposure"] == "store_pnl" and row["tool"] == "tableau"
    assert row["refreshed_at"] and row["before_deadline"] is True and row["escalate"] is False


def test_upstream_stale_reruns_the_upstream_then_its_readers(world):
    defs, instance, wh, repo, proposals = world
    _load(defs, instance, DAYS)
    DuckDBDatabase(repo.parent / "src.duckdb").execute(  # a row lands at the source; raw_orders is not refreshed
        "INSERT INTO app.src_orders VALUES (21, TIMESTAMP '2024-03-05 23:00:00', 2.50, 'late')")
    time.sleep(1.2)
    _load(defs, instance, [DAYS[4]], assets=(ORDERS,))  # orders reruns on the stale upstream
    proposals["max_age"] = dt.timedelta(seconds=1)
    cs, stages, r = _incident_to_receipt(defs, instance, repo)
    finding = proposals["finding"]
    assert finding.kind == "upstream_not_refreshed_or_failed"
    assert finding.details["upstream"][0]["signals"] == ["stale"] and finding.window == []
    assert cs.window == [DAYS[4]] and "(stale)" in cs.summary  # the incident's window: stale reads no partition
    assert stages == ["snapshot", "window-1", "window-1-level2", "verify", "receipt"]
    assert wh.fetch_all(f"SELECT count(*) FROM app.orders WHERE {_cond(DAYS[4])}")[0][0] == 5
    _assert_receipt_names_the_test(cs, r)


def test_duplicated_load_replaces_the_partitions_guarded_by_the_distinct_keys(world):
    defs, instance, wh, repo, proposals = world
    _load(defs, instance, DAYS)
    STATE["append"] = True
    _load(defs, instance, [DAYS[2]], assets=(ORDERS,))  # an append-only retry: the partition twice
    STATE["append"] = False
    assert wh.fetch_all("SELECT count(*) FROM app.orders")[0][0] == 24
    cs, stages, r = _incident_to_receipt(defs, instance, repo)
    assert proposals["finding"].kind == "duplicate_load" and cs.hold_only and cs.window == [DAYS[2]]
    assert cs.new_tests == ["tests/dw_unique_merge_key__app__orders.sql"]
    assert stages == ["snapshot", "dedupe-1", "verify", "receipt"]  # held and kept, not rerun (it would append again)
    result = next(s.result for n, s in __import__("dw_dagster.core.ledger", fromlist=["x"]).ledger_for(instance)
                  .stages(cs.id, cs.version).items() if n == "dedupe-1")
    assert (result["rows_before"], result["distinct_keys_before"], result["rows_after"]) == (8, 4, 4)
    assert wh.fetch_all("SELECT count(*), count(DISTINCT id) FROM app.orders")[0] == (20, 20)
    assert wh.fetch_all("SELECT count(*) FROM dw_undo." + cs.undo_plan.table.replace(".", "__") + "__"
                        + cs.id.replace("-", "_") + "_" + cs.version[:12])[0][0] == 8  # the undo copy, as before
    _assert_receipt_names_the_test(cs, r)


def test_duplicates_whose_copies_differ_are_refused_with_what_to_do(world):
    defs, instance, wh, repo, proposals = world
    from dw_dagster.changes.dedupe import dedupe_step
    from dw_dagster.changes.steps import StepRefused

    wh.execute(f"ATTACH '{repo.parent / 'src.duckdb'}' AS s (READ_ONLY); INSERT INTO app.orders SELECT * FROM s.app.src_orders")
    wh.execute(f"INSERT INTO app.orders SELECT id, ts, amount + 1, note FROM app.orders WHERE {_cond(DAYS[1])}")
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


def test_schema_change_migrates_with_a_rollback_then_reloads(world):
    defs, instance, wh, repo, proposals = world
    snap = lambda: instance.report_runless_asset_event(  # noqa: E731
        dg.AssetObservation(RAW, metadata=schema_metadata(take_schema_snapshot(wh, "app.raw_orders"))))
    wh.execute("ALTER TABLE app.raw_orders ALTER COLUMN note SET NOT NULL")
    snap()
    _load(defs, instance, DAYS[:4])
    wh.execute("ALTER TABLE app.raw_orders ALTER COLUMN note DROP NOT NULL")  # the source relaxed it ...
    snap()
    src = DuckDBDatabase(repo.parent / "src.duckdb")
    src.execute(f"UPDATE app.src_orders SET note = NULL WHERE {_cond(DAYS[4])}")  # ... and sends NULLs
    _load(defs, instance, [DAYS[4]], assets=(RAW,))
    _load(defs, instance, [DAYS[4]], assets=(ORDERS,), ok=False)  # orders still requires note: the load fails
    cs, stages, r = _incident_to_receipt(defs, instance, repo)
    assert proposals["finding"].kind == "schema_change"
    assert cs.steps_first and cs.window == [DAYS[4]] and [s.kind for s in cs.steps] == ["migration"]
    assert cs.steps[0].rollback_sql and "NOT NULL" in " ".join(cs.steps[0].rollback_sql).upper()
    assert cs.new_tests == ["tests/dw_schema_contract__app__orders.sql"]
    assert stages == ["migration-1", "window-1", "verify", "receipt"]
    assert wh.fetch_all(f"SELECT count(*) FROM app.orders WHERE {_cond(DAYS[4])}")[0][0] == 4
    _assert_receipt_names_the_test(cs, r)


def test_a_rename_upstream_is_refused_with_what_a_person_must_do(world):
    defs, instance, wh, repo, proposals = world
    from dw_dagster.core.models import CauseFinding, Incident

    finding = CauseFinding(kind="schema_change", summary="renamed", confidence=0.5, explained_rows=0, unexplained_rows=4,
                           details={"changes": [{"table": "app.raw_orders", "changes": [
                               {"kind": "renamed", "column": "note", "new_column": "remark"}]}]})
    inc = Incident(id="inc-r", asset_key=["orders"], source="manual", detected_at=utcnow(), summary="x", gap_rows=4)
    diag = Diagnosis(id="dg-r", incident_id="inc-r", asset_key=["orders"], created_at=utcnow(), causes=[finding],
                     blast_radius=BlastRadius(root="orders"), gap_rows=4, unexplained_rows=4)
    ctx = FixContext(incident=inc, diagnosis=diag, domain=load_domains(repo.parent / "domains.yaml").get("orders"),
                     pipeline_root=repo, target_table="app.orders", merge_key=["id"], partition_column="ts",
                     resource_key="warehouse", database=wh, partitions_def=DAILY)
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
    defs, instance, wh, repo, proposals = world
    resources = {"source": DatabaseResource(url=f"duckdb:///{repo.parent / 'src.duckdb'}"),
                 "warehouse": DatabaseResource(url=f"duckdb:///{wh.path}")}
    d = _recorded_diagnoser(defs, repo, proposals["domains"])
    _load(defs, instance, DAYS)
    STATE["append"] = True
    _load(defs, instance, [DAYS[2]], assets=(ORDERS,))
    STATE["append"] = False
    diag, cs = d(dg.build_op_context(instance=instance, resources=resources), _incident(-4))
    assert diag.primary.kind == "duplicate_load" and cs.cause_kind == "duplicate_load"
    assert cs.window == [DAYS[2]] and [s.kind for s in cs.steps] == ["dedupe"] and cs.hold_only
    assert cs.new_tests == ["tests/dw_unique_merge_key__app__orders.sql"]
    # upstream failed on the next day: no finding counts rows, the upstream one acts
    wh.execute(f"DELETE FROM app.orders WHERE {_cond(DAYS[2])}; INSERT INTO app.orders SELECT * FROM app.raw_orders "
               f"WHERE {_cond(DAYS[2])}; DELETE FROM app.raw_orders WHERE {_cond(DAYS[3])}")
    STATE["fail_raw"] = {DAYS[3]}
    _load(defs, instance, [DAYS[3]], assets=(RAW,), ok=False)
    _load(defs, instance, [DAYS[3]], assets=(ORDERS,))
    diag, cs = d(dg.build_op_context(instance=instance, resources=resources), _incident(4, DAYS[3]))
    assert cs is not None and cs.cause_kind == "upstream_not_refreshed_or_failed", [c.summary for c in diag.causes]
    assert cs.window == [DAYS[3]] and cs.asset_levels == [[["raw_orders"]], [["orders"]]]
    assert cs.new_tests == ["tests/dw_upstream_landed__app__orders.sql"]
