"""The small real worlds of issue 31's cause tests, built once for the in-process tests
(:mod:`.test_cause_fixes`, :mod:`.test_cause_fix_contract`) and for the daemon's code location
(:mod:`dw_dagster_tests.e2e.cause_location`).

An :class:`OrdersWorld` is a folder: a source DuckDB ``src.duckdb`` (``app.src_orders``), a
warehouse DuckDB ``wh.duckdb`` (``app.raw_orders``, the asset ``raw_orders``, and ``app.orders``,
the asset ``orders`` that reads it; daily partitions), a git pipeline repository ``repo`` the owner
merges into, and ``state.json``: what the test tells the assets and the diagnoser (the partitions
whose upstream load fails, an append-only load of ``orders``, the staleness bound, the Store P&L's
deadline). The state is a file, so a run worker of a ``dagster dev`` reads what the test wrote.
Several worlds share one code location by giving their assets a key prefix, their jobs a suffix and
their databases their own resource keys.

A :class:`ContractWorld` is the dbt-contract case: ``app.raw_orders`` feeding the dbt model
``orders_contracted`` (DuckDB, an enforced contract) in the pipeline repository's ``dbt`` folder.

The stories (what goes wrong before the incident) and the checks of what the repair did are here
too, so the in-process tests and the daemon's test assert the same things.
"""

import datetime as dt
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import dagster as dg

from dw_dagster.checks import build_reconciliation_checks
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.domains import load_domains
from dw_dagster.core.ledger import asset_str, ledger_for
from dw_dagster.core.models import BlastRadius, ChangeSet, Diagnosis, ExposureRef, Receipt, utcnow
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.diagnosis.causes.duplicates import diagnose_duplicates
from dw_dagster.diagnosis.causes.schema_change import diagnose_schema_change, schema_metadata, take_schema_snapshot
from dw_dagster.diagnosis.causes.upstream import diagnose_upstream
from dw_dagster.diagnosis.combine import combine_findings
from dw_dagster.diagnosis.contracts import contract_fix_args
from dw_dagster.diagnosis.fixes import (FixContext, propose_contract_fix, propose_duplicate_fix, propose_schema_fix,
                                        propose_upstream_fix)
from dw_dagster.receipts.job import receipt_markdown
from dw_dagster.repair.new_tests import build_new_tests_check

OWNER = "dana.ortiz@grocer.example"
DAILY = dg.DailyPartitionsDefinition(start_date="2024-03-01", end_date="2024-03-06")
DAYS = DAILY.get_partition_keys()
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # a run's own log, on the console
STATE_DEFAULTS = {"fail_raw": [], "append": False, "max_age_s": None, "needed_by": None}
CONTRACT_SCHEMA = """\
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


def cond(pk: str) -> str:
    """The SQL predicate of one daily partition on ``ts``."""
    a = dt.date.fromisoformat(pk)
    return f"ts >= TIMESTAMP '{a} 00:00:00' AND ts < TIMESTAMP '{a + dt.timedelta(days=1)} 00:00:00'"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", *args], cwd=repo, check=True, capture_output=True)


def init_repo(repo: Path) -> None:
    """A git repository with one commit of what ``repo`` holds."""
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "init")


@dataclass
class World:
    """What both kinds of world have: a folder, a domain (``name``, also the suffix of its job names),
    a warehouse DuckDB and its resource key, a pipeline repository."""

    root: Path
    name: str = "orders"
    wh_key: str = "warehouse"
    seen: dict = field(default_factory=dict)  # what the diagnoser acted on, in the process that ran it

    @cached_property
    def wh(self) -> DuckDBDatabase:
        return DuckDBDatabase(self.root / "wh.duckdb")

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    def job(self, base: str) -> str:
        return f"{base}_{self.name}"

    def domain_keys(self) -> list[dg.AssetKey]:
        raise NotImplementedError

    def domain_yaml(self, extra: str = "") -> str:
        assets = ", ".join(json.dumps(list(k.path)) for k in self.domain_keys())
        return textwrap.indent(f"- name: {self.name}\n  assets: [{assets}]\n  approvers: [{OWNER}]\n  autonomy: L2\n"
                               f"  identity: unverified\n{extra}", "  ")


@dataclass
class OrdersWorld(World):
    """One partitioned world (see the module docstring); ``prefix`` keys its assets."""

    prefix: tuple[str, ...] = ()
    src_key: str = "source"

    @property
    def raw(self) -> dg.AssetKey:
        return dg.AssetKey([*self.prefix, "raw_orders"])

    @property
    def orders(self) -> dg.AssetKey:
        return dg.AssetKey([*self.prefix, "orders"])

    @property
    def compare(self) -> dg.AssetCheckKey:
        return dg.AssetCheckKey(self.orders, "compare")

    @cached_property
    def src(self) -> DuckDBDatabase:
        return DuckDBDatabase(self.root / "src.duckdb")

    def state(self) -> dict:
        path = self.root / "state.json"
        return {**STATE_DEFAULTS, **(json.loads(path.read_text()) if path.exists() else {})}

    def set_state(self, **changes) -> None:
        (self.root / "state.json").write_text(json.dumps({**self.state(), **changes}))

    def domain_keys(self) -> list[dg.AssetKey]:
        return [self.orders, self.raw]

    def domain_yaml(self, extra: str = "") -> str:
        return super().domain_yaml("  max_window_partitions: 5\n" + extra)

    def rows(self, pk: str) -> int:
        return self.wh.fetch_all(f"SELECT count(*) FROM app.orders WHERE {cond(pk)}")[0][0]


def domains_file(path: Path, worlds: Sequence) -> Path:
    path.write_text("domains:\n" + "".join(w.domain_yaml() for w in worlds))
    return path


def create_orders_world(w: OrdersWorld) -> None:
    """The databases (4 source rows a day, 03-01..03-05; empty warehouse tables) and the repository."""
    (w.repo / "tests").mkdir(parents=True)
    (w.repo / "tests" / "README").write_text("singular tests\n")
    init_repo(w.repo)
    w.set_state()
    w.src.execute("CREATE SCHEMA app; CREATE TABLE app.src_orders (id INT, ts TIMESTAMP, amount DECIMAL(18,2), note VARCHAR)")
    w.src.execute("INSERT INTO app.src_orders SELECT i, TIMESTAMP '2024-03-01 06:00:00' + INTERVAL ((i - 1) // 4) DAY "
                  "+ INTERVAL (i % 4) HOUR, 2.50, 'n' || i FROM range(1, 21) t(i)")
    w.wh.execute("CREATE SCHEMA app; CREATE TABLE app.raw_orders (id INT, ts TIMESTAMP, amount DECIMAL(18,2), note VARCHAR);"
                 "CREATE TABLE app.orders (id INT NOT NULL, ts TIMESTAMP, amount DECIMAL(18,2), note VARCHAR NOT NULL)")


def _orders_assets(w: OrdersWorld) -> list[dg.AssetsDefinition]:
    @dg.asset(key=w.raw, partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run(),
              required_resource_keys={w.wh_key})
    def raw_orders(context: dg.AssetExecutionContext) -> None:
        fail = set(w.state()["fail_raw"])
        for pk in context.partition_keys:
            if pk in fail:
                raise RuntimeError(f"source unreachable for {pk}")
            getattr(context.resources, w.wh_key).get_database().execute(
                f"DELETE FROM app.raw_orders WHERE {cond(pk)}; ATTACH '{w.src.path}' AS s (READ_ONLY); "
                f"INSERT INTO app.raw_orders SELECT * FROM s.app.src_orders WHERE {cond(pk)}; DETACH s")

    @dg.asset(key=w.orders, partitions_def=DAILY, deps=[raw_orders], backfill_policy=dg.BackfillPolicy.single_run(),
              required_resource_keys={w.wh_key})
    def orders(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        from dw_dagster.pipelines.incremental import LoadResult, load_metadata

        append, loads = w.state()["append"], []
        db = getattr(context.resources, w.wh_key).get_database()
        for pk in context.partition_keys:  # append-only when the state says so, else replace the partition
            n = db.fetch_all(f"SELECT count(*) FROM app.raw_orders WHERE {cond(pk)}")[0][0]
            db.execute(f"{'' if append else f'DELETE FROM app.orders WHERE {cond(pk)}; '}"
                       f"INSERT INTO app.orders SELECT * FROM app.raw_orders WHERE {cond(pk)}")
            start = dt.datetime.fromisoformat(pk)
            loads.append(LoadResult(partition_key=pk, partition_start=start, partition_end=start + dt.timedelta(days=1),
                                    watermark_column="ts", watermark_low=None, source_snapshot_ts=None, rows_read=n,
                                    rows_inserted=n))
        return dg.MaterializeResult(metadata=load_metadata(loads))  # what each load did (RecordedLoadDiagnoser reads it)

    return [raw_orders, orders]


def _orders_diagnoser(w: OrdersWorld, domains: Path, graph: Callable):
    def diagnoser(context, incident):
        """The real causes, combined; the change set of the one to act on (as IncrementalLoadDiagnoser does)."""
        state = w.state()
        gap_days = [pk for pk in DAYS if w.rows(pk)
                    != w.src.fetch_all(f"SELECT count(*) FROM app.src_orders WHERE {cond(pk)}")[0][0]]
        max_age = dt.timedelta(seconds=state["max_age_s"]) if state["max_age_s"] is not None else None
        found = [diagnose_duplicates(w.wh, target_table="app.orders", key_columns=["id"], partition_column="ts",
                                     gap_rows=incident.gap_rows),
                 diagnose_upstream(context.instance, graph(), w.orders, gap_rows=incident.gap_rows, partitions=gap_days,
                                   max_age=max_age),
                 diagnose_schema_change(context.instance, [w.orders, w.raw], gap_rows=incident.gap_rows)]
        combined = combine_findings(incident.gap_rows, [f for f in found if f.details.get("tested", True)])
        pnl = ExposureRef(unique_id="exposure.shop.store_pnl", name="store_pnl", label="Store P&L", depth=2,
                          needed_by=state["needed_by"], bi={"tool": "tableau", "workbook": "Store P&L"})
        diag = Diagnosis(id="dg-" + incident.id, incident_id=incident.id, asset_key=incident.asset_key, created_at=utcnow(),
                         causes=combined.findings, blast_radius=BlastRadius(root=asset_str(w.orders), exposures=[pnl]),
                         gap_rows=incident.gap_rows, unexplained_rows=combined.unexplained_rows)
        counting = [f for f in combined.findings if f.explained_rows > 0]
        act = counting[0] if counting else max((f for f in combined.findings if f.kind != "unexplained"),
                                                key=lambda f: f.confidence)
        ctx = FixContext(incident=incident, diagnosis=diag, domain=load_domains(domains).get(w.name), pipeline_root=w.repo,
                         target_table="app.orders", merge_key=["id"], partition_column="ts", resource_key=w.wh_key,
                         database=w.wh, partitions_def=DAILY, verify_checks=[[*w.orders.path, "compare"]], tests_dir="tests")
        if act.kind == "duplicate_load":
            cs = propose_duplicate_fix(ctx, act)
        elif act.kind == "schema_change":
            cs = propose_schema_fix(ctx, act, rerun_window=gap_days)
        else:
            cs = propose_upstream_fix(ctx, act, instance=context.instance, graph=graph(),
                                      upstream_tables={asset_str(w.raw): "app.raw_orders"}, stale_window=gap_days)
        w.seen["finding"] = act
        return diag, cs

    return diagnoser


@dataclass
class WorldParts:
    """What a world adds to a code location; the repair's shared jobs (steps, undo, receipt) are the caller's."""

    assets: list
    checks: list
    jobs: dict[str, dg.JobDefinition]  # detect, verify, window (and load for a partitioned world)
    diagnoser: Callable
    resources: dict
    remediation: dict  # the world's arguments of build_remediation_sensor


def orders_parts(w: OrdersWorld, domains: Path, graph: Callable) -> WorldParts:
    """The assets, checks, jobs, diagnoser and resources of a partitioned world; ``graph()`` is the
    location's asset graph (read when diagnosing)."""
    raw, orders = _orders_assets(w)
    recon = build_reconciliation_checks(asset=w.orders, source_asset=[*w.prefix, "src_orders"], source_table="app.src_orders",
                                        target_table="app.orders", key_columns=["id"], slice_by=[], source_resource_key=w.src_key,
                                        target_resource_key=w.wh_key, name="compare", partition_column="ts",
                                        partitions_def=DAILY)
    new_tests = build_new_tests_check(w.orders, resource_key=w.wh_key, pipeline_root=w.repo, tests_dir="tests")
    jobs = {"detect": dg.define_asset_job(w.job("detect"), selection=dg.AssetSelection.checks(w.compare)),
            "verify": dg.define_asset_job(w.job("verify"), selection=dg.AssetSelection.checks(
                w.compare, dg.AssetCheckKey(w.orders, c.NEW_TESTS_CHECK))),
            "window": dg.define_asset_job(w.job("rerun_window"), selection=dg.AssetSelection.assets(w.raw, w.orders),
                                          partitions_def=DAILY),
            "load": dg.define_asset_job(w.job("load"), selection=dg.AssetSelection.assets(w.raw, w.orders),
                                        partitions_def=DAILY)}
    return WorldParts(
        assets=[raw, orders, dg.AssetSpec([*w.prefix, "src_orders"])], checks=[recon, new_tests], jobs=jobs,
        diagnoser=_orders_diagnoser(w, domains, graph),
        resources={w.src_key: DatabaseResource(url=f"duckdb:///{w.src.path}"),
                   w.wh_key: DatabaseResource(url=f"duckdb:///{w.wh.path}")},
        remediation=dict(partitions_def=DAILY, window_job=jobs["window"], verify_job=jobs["verify"], pipeline_root=w.repo))


# -- the dbt contract world ------------------------------------------------------------------------


@dataclass
class ContractWorld(World):
    """The dbt-contract world (module docstring)."""

    raw: dg.AssetKey = dg.AssetKey("raw_orders")
    model: dg.AssetKey = dg.AssetKey("orders_contracted")

    @property
    def project(self) -> Path:
        return self.repo / "dbt"

    @property
    def compare(self) -> dg.AssetCheckKey:
        return dg.AssetCheckKey(self.model, "compare")

    def domain_keys(self) -> list[dg.AssetKey]:
        return [self.model, self.raw]

    def dbt_build(self) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).parent / "dbt"), "build", "--project-dir", str(self.project),
                               "--profiles-dir", str(self.project)], capture_output=True, text=True, cwd=self.project)


def create_contract_world(w: ContractWorld) -> None:
    """``app.raw_orders`` (16 rows), the dbt project with its contracted model, built once."""
    w.wh.execute("CREATE SCHEMA app; CREATE TABLE app.raw_orders (id INT NOT NULL, note VARCHAR NOT NULL);"
                 "INSERT INTO app.raw_orders SELECT i, 'n' || i FROM range(1, 17) t(i)")
    (w.project / "models").mkdir(parents=True)
    (w.project / "dbt_project.yml").write_text("name: shop\nversion: '1.0'\nconfig-version: 2\nprofile: shop\n"
                                               "model-paths: [models]\n")
    (w.project / "profiles.yml").write_text(f"shop:\n  target: dev\n  outputs:\n    dev:\n      type: duckdb\n"
                                            f"      path: {w.wh.path}\n      schema: main\n      threads: 1\n")
    (w.project / "models" / "sources.yml").write_text("version: 2\nsources:\n  - name: app\n    schema: app\n"
                                                      "    tables:\n      - name: raw_orders\n")
    (w.project / "models" / "orders_contracted.sql").write_text("select id, note from {{ source('app', 'raw_orders') }}\n")
    (w.project / "models" / "schema.yml").write_text(CONTRACT_SCHEMA)
    init_repo(w.repo)
    built = w.dbt_build()
    assert built.returncode == 0, built.stdout[-2000:]
    assert w.wh.fetch_all("SELECT count(*) FROM main.orders_contracted")[0][0] == 16


def _contract_diagnoser(w: ContractWorld, domains: Path):
    def diagnoser(context, incident):
        f = diagnose_schema_change(context.instance, [w.model, w.raw], gap_rows=incident.gap_rows)
        diag = Diagnosis(id="dg-" + incident.id, incident_id=incident.id, asset_key=incident.asset_key,
                         created_at=utcnow(), causes=[f], blast_radius=BlastRadius(root="orders_contracted"),
                         gap_rows=incident.gap_rows, unexplained_rows=f.unexplained_rows)
        ctx = FixContext(incident=incident, diagnosis=diag, domain=load_domains(domains).get(w.name), pipeline_root=w.repo,
                         target_table="main.orders_contracted", merge_key=["id"], partition_column="id",
                         resource_key=w.wh_key, database=w.wh, partitions_def=None,
                         verify_checks=[["orders_contracted", "compare"]], tests_dir="dbt/tests")
        # what IncrementalLoadDiagnoser/RecordedLoadDiagnoser do for a schema change: the contracted model found
        # in the manifest (the diagnosed asset itself) and its properties file, relative to the pipeline repository
        args = contract_fix_args(w.project / "target" / "manifest.json", w.model.path, {}, w.repo, f, "main.orders_contracted")
        w.seen.update(finding=f, args=args)
        return diag, propose_contract_fix(ctx, f, **args)

    return diagnoser


def contract_parts(w: ContractWorld, domains: Path) -> WorldParts:
    """The assets, checks, jobs, diagnoser and resource of the dbt-contract world; its ``dbt_build``
    step job is the caller's (:func:`dw_dagster.repair.dbt_build.dbt_build_runner` on ``w.repo``)."""
    recon = build_reconciliation_checks(asset=w.model, source_asset=w.raw, source_table="app.raw_orders",
                                        target_table="main.orders_contracted", key_columns=["id"], slice_by=[],
                                        source_resource_key=w.wh_key, target_resource_key=w.wh_key, name="compare")
    new_tests = build_new_tests_check(w.model, resource_key=w.wh_key, pipeline_root=w.repo, tests_dir="dbt/tests")
    jobs = {"detect": dg.define_asset_job(w.job("detect"), selection=dg.AssetSelection.checks(w.compare)),
            "verify": dg.define_asset_job(w.job("verify"), selection=dg.AssetSelection.checks(
                w.compare, dg.AssetCheckKey(w.model, c.NEW_TESTS_CHECK)))}
    return WorldParts(assets=[dg.AssetSpec(w.raw), dg.AssetSpec(w.model, deps=[w.raw])], checks=[recon, new_tests],
                      jobs=jobs, diagnoser=_contract_diagnoser(w, domains),
                      resources={w.wh_key: DatabaseResource(url=f"duckdb:///{w.wh.path}")},
                      remediation=dict(verify_job=jobs["verify"], pipeline_root=w.repo))


# -- the stories: what goes wrong before each incident ---------------------------------------------


def load(defs: dg.Definitions, instance: dg.DagsterInstance, w: OrdersWorld, partitions: Sequence[str],
         assets: Sequence[dg.AssetKey] | None = None, ok: bool = True) -> None:
    """One run over the contiguous range of ``partitions`` (the assets load a range in one run; no check runs:
    the incident comes from the detect job, once the story is told)."""
    job = defs.resolve_job_def(w.job("load")).get_subset(asset_selection=set(assets or (w.raw, w.orders)),
                                                         asset_check_selection=set())
    tags = {"dagster/asset_partition_range_start": partitions[0], "dagster/asset_partition_range_end": partitions[-1]}
    res = job.execute_in_process(instance=instance, tags=tags, raise_on_error=False, run_config=QUIET)
    assert res.success is ok, partitions


def upstream_failed_story(defs, instance, w: OrdersWorld) -> None:
    load(defs, instance, w, DAYS[:3])
    w.set_state(fail_raw=[DAYS[3]])
    load(defs, instance, w, [DAYS[3]], assets=[w.raw], ok=False)  # the upstream failed ...
    load(defs, instance, w, [DAYS[3]], assets=[w.orders])  # ... and orders read the empty partition anyway
    load(defs, instance, w, [DAYS[4]])
    w.set_state(fail_raw=[], needed_by="23:59 America/Chicago")


def upstream_stale_story(defs, instance, w: OrdersWorld) -> None:
    load(defs, instance, w, DAYS)
    w.src.execute(  # a row lands at the source; raw_orders is not refreshed
        "INSERT INTO app.src_orders VALUES (21, TIMESTAMP '2024-03-05 23:00:00', 2.50, 'late')")
    time.sleep(1.2)
    load(defs, instance, w, [DAYS[4]], assets=[w.orders])  # orders reruns on the stale upstream
    w.set_state(max_age_s=1)


def duplicated_load_story(defs, instance, w: OrdersWorld) -> None:
    load(defs, instance, w, DAYS)
    w.set_state(append=True)
    load(defs, instance, w, [DAYS[2]], assets=[w.orders])  # an append-only retry: the partition twice
    w.set_state(append=False)
    assert w.wh.fetch_all("SELECT count(*) FROM app.orders")[0][0] == 24


def _snap(instance, key: dg.AssetKey, db: DuckDBDatabase) -> None:
    instance.report_runless_asset_event(dg.AssetObservation(key, metadata=schema_metadata(take_schema_snapshot(db, "app.raw_orders"))))


def schema_change_story(defs, instance, w: OrdersWorld) -> None:
    w.wh.execute("ALTER TABLE app.raw_orders ALTER COLUMN note SET NOT NULL")
    _snap(instance, w.raw, w.wh)
    load(defs, instance, w, DAYS[:4])
    w.wh.execute("ALTER TABLE app.raw_orders ALTER COLUMN note DROP NOT NULL")  # the source relaxed it ...
    _snap(instance, w.raw, w.wh)
    w.src.execute(f"UPDATE app.src_orders SET note = NULL WHERE {cond(DAYS[4])}")  # ... and sends NULLs
    load(defs, instance, w, [DAYS[4]], assets=[w.raw])
    load(defs, instance, w, [DAYS[4]], assets=[w.orders], ok=False)  # orders still requires note: the load fails


def contract_story(instance, w: ContractWorld) -> None:
    _snap(instance, w.raw, w.wh)
    w.wh.execute("ALTER TABLE app.raw_orders ALTER COLUMN note DROP NOT NULL;"  # upstream relaxes note ...
                 "INSERT INTO app.raw_orders SELECT i, NULL FROM range(17, 21) t(i)")  # ... and sends NULLs
    _snap(instance, w.raw, w.wh)
    failed = w.dbt_build()
    assert failed.returncode != 0 and "constraint" in failed.stdout.lower()  # the contract rejects the build


STORIES = {"upstream_failed": upstream_failed_story, "upstream_stale": upstream_stale_story,
           "duplicated_load": duplicated_load_story, "schema_change": schema_change_story}


def tick_stages(daemon, instance: dg.DagsterInstance, sensor: str = c.REMEDIATION_SENSOR, limit: int = 12) -> list[str]:
    """Tick the remediation sensor of a LocalSensorDaemon until it launches nothing; the stages it ran, in order."""
    stages: list[str] = []
    for _ in range(limit):
        tick = daemon.tick(sensor)
        assert not tick.failed_run_ids, stages
        if not tick.run_ids:
            break
        stages.append(instance.get_run_by_id(tick.run_ids[0]).tags[c.STAGE_TAG])
    return stages


# -- what each repair must have done ---------------------------------------------------------------


def acted_finding(instance: dg.DagsterInstance, cs: ChangeSet):
    """The finding of the recorded diagnosis the change set acts on."""
    (diag,) = [d for d in records.diagnoses(instance) if d.id == cs.diagnosis_id]
    return next(f for f in diag.causes if f.kind == cs.cause_kind)


def assert_change_set_names_its_test(cs: ChangeSet, verify_check: Sequence[str]) -> None:
    assert cs.new_tests and cs.diff.count("new file mode") == len(cs.new_tests)
    assert [*verify_check, c.NEW_TESTS_CHECK] in cs.verify_checks


def assert_receipt_names_the_test(cs: ChangeSet, r: Receipt) -> None:
    assert r.verified and r.outcome == "applied", receipt_markdown(r)
    named = r.evidence_summary[c.RECEIPT_NEW_TESTS]
    assert [t["test"] for t in named] == cs.new_tests and all(t["passed"] for t in named)
    md = receipt_markdown(r)
    assert all(f"`{t}` passed" in md for t in cs.new_tests)
    (check,) = [o for o in r.checks if o.check_name == c.NEW_TESTS_CHECK]
    assert check.passed


def check_upstream_failed(instance, w: OrdersWorld, cs: ChangeSet, stages: list[str], r: Receipt) -> None:
    assert acted_finding(instance, cs).kind == "upstream_not_refreshed_or_failed"
    assert cs.window == [DAYS[3]] and cs.asset_levels == [[list(w.raw.path)], [list(w.orders.path)]]
    assert cs.new_tests == ["tests/dw_upstream_landed__app__orders.sql"]
    assert stages == ["snapshot", "window-1", "window-1-level2", "verify", "receipt"]
    runs = [instance.get_run_by_id(r.run_ids[s]) for s in ("window-1", "window-1-level2")]
    assert [sorted(k.to_user_string() for k in run.asset_selection) for run in runs] == [
        [w.raw.to_user_string()], [w.orders.to_user_string()]]
    assert w.rows(DAYS[3]) == 4
    assert_receipt_names_the_test(cs, r)
    # after the verified receipt: the Store P&L extract is refreshed (Tableau REST, loopback fake) before its deadline
    (obs,) = [e for e in instance.fetch_observations(w.orders, limit=50).records
              if c.BI_REFRESHED_KEY in e.asset_observation.metadata]
    meta = obs.asset_observation.metadata
    (row,) = meta[c.BI_REFRESHED_KEY].value
    assert meta[c.RECEIPT_ID_KEY].value == r.id and row["exposure"] == "store_pnl" and row["tool"] == "tableau"
    assert row["refreshed_at"] and row["before_deadline"] is True and row["escalate"] is False


def check_upstream_stale(instance, w: OrdersWorld, cs: ChangeSet, stages: list[str], r: Receipt) -> None:
    finding = acted_finding(instance, cs)
    assert finding.kind == "upstream_not_refreshed_or_failed"
    assert finding.details["upstream"][0]["signals"] == ["stale"] and finding.window == []
    assert cs.window == [DAYS[4]] and "(stale)" in cs.summary  # the incident's window: stale reads no partition
    assert stages == ["snapshot", "window-1", "window-1-level2", "verify", "receipt"]
    assert w.rows(DAYS[4]) == 5
    assert_receipt_names_the_test(cs, r)


def check_duplicated_load(instance, w: OrdersWorld, cs: ChangeSet, stages: list[str], r: Receipt) -> None:
    assert acted_finding(instance, cs).kind == "duplicate_load" and cs.hold_only and cs.window == [DAYS[2]]
    assert cs.new_tests == ["tests/dw_unique_merge_key__app__orders.sql"]
    assert stages == ["snapshot", "dedupe-1", "verify", "receipt"]  # held and kept, not rerun (it would append again)
    result = ledger_for(instance).stages(cs.id, cs.version)["dedupe-1"].result
    assert (result["rows_before"], result["distinct_keys_before"], result["rows_after"]) == (8, 4, 4)
    assert w.wh.fetch_all("SELECT count(*), count(DISTINCT id) FROM app.orders")[0] == (20, 20)
    assert w.wh.fetch_all("SELECT count(*) FROM dw_undo." + cs.undo_plan.table.replace(".", "__") + "__"
                          + cs.id.replace("-", "_") + "_" + cs.version[:12])[0][0] == 8  # the undo copy, as before
    assert_receipt_names_the_test(cs, r)


def check_schema_change(instance, w: OrdersWorld, cs: ChangeSet, stages: list[str], r: Receipt) -> None:
    assert acted_finding(instance, cs).kind == "schema_change"
    assert cs.steps_first and cs.window == [DAYS[4]] and [s.kind for s in cs.steps] == ["migration"]
    assert cs.steps[0].rollback_sql and "NOT NULL" in " ".join(cs.steps[0].rollback_sql).upper()
    assert cs.new_tests == ["tests/dw_schema_contract__app__orders.sql"]
    assert stages == ["migration-1", "window-1", "verify", "receipt"]
    assert w.rows(DAYS[4]) == 4
    assert_receipt_names_the_test(cs, r)


CHECKS = {"upstream_failed": check_upstream_failed, "upstream_stale": check_upstream_stale,
          "duplicated_load": check_duplicated_load, "schema_change": check_schema_change}


def check_contract_proposal(w: ContractWorld, cs: ChangeSet) -> None:
    """The change set of the contract case: the contract's diff, a dbt build, the schema contract test."""
    assert cs.new_tests == ["dbt/tests/dw_schema_contract__main__orders_contracted.sql"]
    assert "-          - type: not_null" in cs.diff and "dbt/models/schema.yml" in cs.diff
    assert [s.kind for s in cs.steps] == ["dbt_build"] and cs.window == []
    manifest = w.project / "target" / "manifest.json"
    assert contract_fix_args(manifest, w.raw.path, {}, w.repo, None, "app.raw_orders") is None  # the raw table has no contract


def check_contract_repair(instance, w: ContractWorld, cs: ChangeSet, stages: list[str], r: Receipt) -> None:
    import yaml

    assert acted_finding(instance, cs).kind == "schema_change" and "note" in acted_finding(instance, cs).summary
    after = yaml.safe_load((w.project / "models" / "schema.yml").read_text())["models"][0]
    assert [col.get("constraints") for col in after["columns"]] == [[{"type": "not_null"}], None]
    assert stages == ["dbt_build-1", "verify", "receipt"]
    assert w.wh.fetch_all("SELECT count(*), count(note) FROM main.orders_contracted")[0] == (20, 16)
    assert_receipt_names_the_test(cs, r)
