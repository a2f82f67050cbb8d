"""The cause fixes wired from a dataops configuration: ``build_dw_definitions`` on
docs/snippets/causes/dataops_fixes.yaml (a ``defs.yaml``-style file) proposes, repairs, verifies
and receipts a duplicated load with nothing wired by hand.

A real world in a temporary folder: a source DuckDB (``app.src_orders``), a warehouse DuckDB with
``app.raw_orders`` (the asset ``raw_orders``) and ``app.orders`` (the asset ``orders``, loaded by
its own code from ``raw_orders`` and recorded with ``load_metadata``: the ``recorded_load`` shape),
daily partitions, a git pipeline repository, a temporary Dagster instance and the
LocalSensorDaemon. An append-only retry loads one day twice; the location's reconciliation check
fails, the incident sensor diagnoses a duplicated load, the change set carries the uniqueness test
on the merge key, the owner approves and merges, the remediation sensor keeps the window, replaces
it (``dedupe``), and the verify run holds ``dw_new_tests``, which runs the new test: the receipt is
verified and names it.

Field case: each failed-sync retry appends the records again, https://github.com/airbytehq/airbyte/issues/12336.
"""

import datetime as dt
import subprocess
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.databases import DatabaseResource

SNIPPET = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "causes/dataops_fixes.yaml"
OWNER = "dana.ortiz@grocer.example"
DAILY = dg.DailyPartitionsDefinition(start_date="2024-03-01", end_date="2024-03-06")
DAYS = DAILY.get_partition_keys()
RAW, ORDERS = dg.AssetKey("raw_orders"), dg.AssetKey("orders")
STATE = {"append": False}
COLUMNS = "(id INT NOT NULL, ts TIMESTAMP, region VARCHAR, amount DECIMAL(18,2))"


def _cond(pk: str) -> str:
    a = dt.date.fromisoformat(pk)
    return f"ts >= TIMESTAMP '{a} 00:00:00' AND ts < TIMESTAMP '{a + dt.timedelta(days=1)} 00:00:00'"


def _project_assets(src_path: Path):
    from dw_dagster.pipelines.incremental import LoadResult, load_metadata

    @dg.asset(key=RAW, partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run())
    def raw_orders(context: dg.AssetExecutionContext, warehouse: DatabaseResource) -> None:
        for pk in context.partition_keys:
            warehouse.get_database().execute(
                f"DELETE FROM app.raw_orders WHERE {_cond(pk)}; ATTACH '{src_path}' AS s (READ_ONLY); "
                f"INSERT INTO app.raw_orders SELECT * FROM s.app.src_orders WHERE {_cond(pk)}; DETACH s")

    @dg.asset(key=ORDERS, partitions_def=DAILY, deps=[raw_orders], backfill_policy=dg.BackfillPolicy.single_run())
    def orders(context: dg.AssetExecutionContext, warehouse: DatabaseResource) -> dg.MaterializeResult:
        loads = []
        for pk in context.partition_keys:  # append-only when STATE["append"] (a retry), else the partition replaced
            db = warehouse.get_database()
            n = db.fetch_all(f"SELECT count(*) FROM app.raw_orders WHERE {_cond(pk)}")[0][0]
            delete = "" if STATE["append"] else f"DELETE FROM app.orders WHERE {_cond(pk)}; "
            db.execute(f"{delete}INSERT INTO app.orders SELECT * FROM app.raw_orders WHERE {_cond(pk)}")
            start = dt.datetime.fromisoformat(pk)
            loads.append(LoadResult(partition_key=pk, partition_start=start, partition_end=start + dt.timedelta(days=1),
                                    watermark_column="ts", watermark_low=None, source_snapshot_ts=None, rows_read=n,
                                    rows_inserted=n))
        return dg.MaterializeResult(metadata=load_metadata(loads))

    return raw_orders, orders


@pytest.fixture
def location(tmp_path):
    """(the merged Definitions, the warehouse, the pipeline repository) of a project and its dataops file."""
    from dw_dagster import build_dw_definitions
    from dw_dagster.databases import DuckDBDatabase

    STATE["append"] = False
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "settings.yaml").write_text("watermark_column: ts\nlookback_hours: 0\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qm", "init"], cwd=repo, check=True)
    src, wh = DuckDBDatabase(tmp_path / "src.duckdb"), DuckDBDatabase(tmp_path / "wh.duckdb")
    src.execute(f"CREATE SCHEMA app; CREATE TABLE app.src_orders {COLUMNS}")
    src.execute("INSERT INTO app.src_orders SELECT i, TIMESTAMP '2024-03-01 06:00:00' + INTERVAL ((i - 1) // 4) DAY "
                "+ INTERVAL (i % 4) HOUR, CASE WHEN i % 2 = 0 THEN 'east' ELSE 'west' END, 2.50 FROM range(1, 21) t(i)")
    wh.execute(f"CREATE SCHEMA app; CREATE TABLE app.raw_orders {COLUMNS}; CREATE TABLE app.orders {COLUMNS}")
    raw_orders, orders = _project_assets(src.path)
    project = dg.Definitions(assets=[dg.AssetSpec("src_orders"), raw_orders, orders],
                             jobs=[dg.define_asset_job("load", selection=[RAW, ORDERS], partitions_def=DAILY)])
    loop = build_dw_definitions(SNIPPET, assets=[raw_orders, orders], base_dir=repo, scope={"home": str(tmp_path)})
    return dg.Definitions.merge(project, loop), wh, repo


def _load(defs, instance, days, assets=(RAW, ORDERS)) -> None:
    tags = {"dagster/asset_partition_range_start": days[0], "dagster/asset_partition_range_end": days[-1]}
    assert defs.resolve_job_def("load").execute_in_process(instance=instance, tags=tags, asset_selection=list(assets)).success


def _new_tests_evaluations(defs, instance) -> list:
    """Run ``dw_verify`` by hand (no change set: CI or a person) and return its ``dw_new_tests`` evaluations."""
    run = defs.resolve_job_def("dw_verify").execute_in_process(instance=instance, raise_on_error=False)
    return [e for e in run.get_asset_check_evaluations() if e.check_name == c.NEW_TESTS_CHECK]


def test_a_duplicated_load_from_the_dataops_file_ends_in_a_verified_receipt_naming_its_test(location, tmp_path):
    from dw_dagster import load_dataops_config, records, verify_receipts
    from dw_dagster.approval.job import approve_in_process
    from dw_dagster.core.ledger import ledger_for
    from dw_dagster.proposals.watermark import apply_change_set
    from dw_dagster.receipts.job import receipt_markdown
    from dw_dagster.testing.local_daemon import LocalSensorDaemon

    defs, wh, repo = location
    dg.Definitions.validate_loadable(defs)
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"dw_step_dedupe", "dw_step_migration", "dw_rerun_window", "dw_verify"} <= jobs
    window = defs.resolve_job_def("dw_rerun_window")
    assert {RAW, ORDERS} <= set(window.asset_layer.executable_asset_keys)  # upstream_tables: the upstream fix reruns it
    (tmp_path / "dagster_home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster_home")) as instance:
        _load(defs, instance, DAYS)
        STATE["append"] = True
        _load(defs, instance, [DAYS[2]], assets=(ORDERS,))  # an append-only retry: the day twice
        STATE["append"] = False
        assert wh.fetch_all("SELECT count(*) FROM app.orders")[0][0] == 24
        assert _new_tests_evaluations(defs, instance) == []  # no test added yet: the check records nothing

        daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
        tick = daemon.tick("dw_check_incident_sensor")
        assert len(tick.run_ids) == 1 and not tick.failed_run_ids, tick.skip_reason
        (cs,) = records.change_sets(instance)
        assert cs.cause_kind == "duplicate_load" and cs.hold_only and cs.window == [DAYS[2]], cs.summary
        assert [s.kind for s in cs.steps] == ["dedupe"]
        assert cs.new_tests == ["tests/dw_unique_merge_key__app__orders.sql"]
        assert cs.verify_checks == [["orders", "reconciliation"], ["orders", c.NEW_TESTS_CHECK]]

        domains = load_dataops_config(SNIPPET, scope={"home": str(tmp_path)}).domains_model()
        ok, msg = approve_in_process(instance, cs.id, approver=OWNER, domains=domains)
        assert ok, msg
        assert not daemon.tick("dw_remediation_sensor").run_ids  # the new test is in the diff: merged first
        apply_change_set(cs, repo, OWNER)
        stages = []
        for _ in range(8):
            tick = daemon.tick("dw_remediation_sensor")
            assert not tick.failed_run_ids, (stages, daemon.refusals)
            if not tick.run_ids:
                break
            stages.append(instance.get_run_by_id(tick.run_ids[0]).tags[c.STAGE_TAG])
        assert stages == ["snapshot", "dedupe-1", "verify", "receipt"]
        result = ledger_for(instance).stages(cs.id, cs.version)["dedupe-1"].result
        assert (result["rows_before"], result["distinct_keys_before"], result["rows_after"]) == (8, 4, 4)
        assert wh.fetch_all("SELECT count(*), count(DISTINCT id) FROM app.orders")[0] == (20, 20)

        (r,) = records.receipts(instance, ORDERS)
        md = receipt_markdown(r)
        assert r.verified and r.outcome == "applied", md
        assert [(t["test"], t["passed"]) for t in r.evidence_summary[c.RECEIPT_NEW_TESTS]] == [(cs.new_tests[0], True)]
        assert f"`{cs.new_tests[0]}` passed" in md
        assert sorted((o.check_name, o.passed) for o in r.checks) == [(c.NEW_TESTS_CHECK, True), ("reconciliation", True)]
        n, problems = verify_receipts(instance)
        assert n >= 1 and not problems, problems
        # merged, the test runs in every later verify run (CI, a person): it passes now, and catches a repeat
        (ev,) = _new_tests_evaluations(defs, instance)
        assert ev.passed and ev.metadata[c.NEW_TESTS_RUN_KEY].value == 1
        STATE["append"] = True
        _load(defs, instance, [DAYS[1]], assets=(ORDERS,))
        (ev,) = _new_tests_evaluations(defs, instance)
        assert not ev.passed and "dw_unique_merge_key__app__orders.sql" in ev.description


def test_the_tests_folder_defaults_to_the_dbt_projects_own(tmp_path):
    """tests_dir: configured, else the dbt project's first test-paths folder inside the repository,
    else ``tests``; upstream_tables: the other watched assets and check sources in the asset's
    database, then the configured ones."""
    from dw_dagster import load_dataops_config
    from dw_dagster.wiring.fixes import tests_dir_for, upstream_tables_for

    repo = tmp_path / "repo"
    (repo / "dbt").mkdir(parents=True)
    assert tests_dir_for(None, repo, repo / "dbt") == "dbt/tests"
    (repo / "dbt" / "dbt_project.yml").write_text("name: shop\ntest-paths: [checks, more]\n")
    assert tests_dir_for(None, repo, repo / "dbt") == "dbt/checks"
    assert tests_dir_for(None, repo, tmp_path / "elsewhere") == "tests"
    assert tests_dir_for(None, repo, None) == "tests"
    assert tests_dir_for("sql/tests/", repo, repo / "dbt") == "sql/tests"
    cfg = load_dataops_config(SNIPPET, scope={"home": str(tmp_path)})
    (orders,) = cfg.assets
    assert upstream_tables_for(cfg, orders, {}) == {}  # its check's source is in another database
    assert upstream_tables_for(cfg, orders, dict(orders.pipeline.recorded_load.upstream_tables)) == {
        "raw_orders": "app.raw_orders"}
