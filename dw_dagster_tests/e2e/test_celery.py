"""The store-sales repair stages on ``dagster-celery``: queued runs, run workers, two celery workers.

The loop up to the approval runs in this process as in :mod:`.test_store_sales_e2e` (detect,
diagnose, propose, the refused and the accepted approvals, the owner's merge), on a Dagster
instance with ``dagster-postgres`` storage in a fresh database on the loopback PostgreSQL server
and dw_dagster's ``GuardedRunCoordinator`` (Dagster's ``QueuedRunCoordinator``). Then the
deployment scales out (:mod:`dw_dagster_tests.harness.celery_cluster`): a code server serving
:mod:`.celery_location` (the same location, its loop's jobs on ``celery_executor``),
``dagster-daemon`` dequeuing runs, and two celery workers on the RabbitMQ broker at
127.0.0.1:5672. The remediation sensor is started in ``dagster-daemon`` (its ticks run in the code
server, so each ticket binds that location and tick); each stage it requests is submitted to the
queue, dequeued by the daemon, launched in a run worker, and each of its steps runs as a celery
task in one of the two workers. The stages, the ledger, the receipts and the gaps afterwards are
the ones the single-process test asserts.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import pytest

pytest.importorskip("dagster_celery")
pytest.importorskip("dagster_postgres")

from dw_dagster.core import keys as c  # noqa: E402
from dw_dagster.core import records  # noqa: E402
from dw_dagster.core.ledger import ledger_for  # noqa: E402
from dw_dagster.core.windows import RANGE_END_TAG, RANGE_START_TAG  # noqa: E402
from dw_dagster_examples.store_sales import home as h  # noqa: E402
from dw_dagster_examples.store_sales.definitions import build_definitions  # noqa: E402
from dw_dagster_examples.store_sales.demo import OWNER, prepare_incident_data  # noqa: E402
from dw_dagster_dev.demo import Timeline, demo_approvals, owner_merges, run_job  # noqa: E402
from dw_dagster.testing.local_daemon import LocalSensorDaemon  # noqa: E402
from dw_dagster_tests.e2e.celery_location import CELERY, LOCATION  # noqa: E402
from dw_dagster_tests.harness.celery_cluster import (  # noqa: E402
    celery_workers, code_server, dagster_daemon, run_stages_in_daemon)
from dw_dagster_tests.harness.dagster_dev import REPO, postgres_database, write_instance_yaml  # noqa: E402

SCALE = 0.002
NOT_LISTED = "sam.lee@grocer.example"
REGIONS = ("Midwest", "Northeast", "Southeast", "Southwest", "West")


@dataclass
class CeleryLoop:
    """What the loop through the queue and the celery workers produced."""

    postgres_url: str = ""
    change_set_id: str = ""
    refused: list[dict] = field(default_factory=list)
    run_ids: dict[str, str] = field(default_factory=dict)  # stage → run id
    runs: dict[str, dict] = field(default_factory=dict)  # stage → {status, job, tags, events, celery, steps}
    stage_states: dict[str, str] = field(default_factory=dict)
    receipts: list = field(default_factory=list)
    gap_before: dict[str, float] = field(default_factory=dict)
    gap_after: dict[str, float] = field(default_factory=dict)
    worker_names: list[str] = field(default_factory=list)
    stopped: dict[str, tuple] = field(default_factory=dict)  # process → (returncode, seconds, killed, leftover)
    database_dropped: bool | None = None
    timeline: dict[str, float] = field(default_factory=dict)


def _gaps(instance: dg.DagsterInstance, run_id: str) -> tuple[dict[str, float], bool]:
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        ev = entry.dagster_event.event_specific_data
        if ev.check_name == "region_compare":
            return {s["slice"]["region"]: s["gap_pct"] for s in records.metadata_json(ev.metadata, "dw/slices_json")}, ev.passed
    raise AssertionError(f"run {run_id} recorded no region_compare evaluation")


def _run_facts(instance: dg.DagsterInstance, run_id: str) -> dict:
    """A run's status, tags, event kinds, and the celery worker that ran each step."""
    run = instance.get_run_by_id(run_id)
    kinds, celery, steps = [], {}, set()
    for e in instance.all_logs(run_id):
        ev = e.dagster_event
        if ev is None:
            continue
        kinds.append(ev.event_type_value)
        if ev.is_step_start:
            steps.add(ev.step_key)
        if ev.event_type_value == "ENGINE_EVENT" and "in celery worker" in (e.message or ""):
            md = ev.engine_event_data.metadata
            celery[ev.step_key] = md["Celery worker"].value
    return {"status": run.status.value, "job": run.job_name, "tags": dict(run.tags), "events": kinds,
            "celery": celery, "steps": sorted(steps), "origin": run.remote_job_origin is not None}


def _database_exists(url: str) -> bool:
    import psycopg

    server, name = url.rsplit("/", 1)
    with psycopg.connect(f"{server}/postgres", connect_timeout=10) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> CeleryLoop:
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    from dw_dagster_dev.fakes.oidc_server import start_oidc_server

    root = tmp_path_factory.mktemp("celery")
    home, dagster_home = root / "store_sales", root / "dagster_home"
    res, log, t0 = CeleryLoop(), Timeline(), time.monotonic()

    def mark(stage: str, msg: str) -> None:
        res.timeline[stage] = round(time.monotonic() - t0, 1)
        log(stage, msg)

    with ExitStack() as stack:
        res.postgres_url = stack.enter_context(postgres_database())
        write_instance_yaml(dagster_home, res.postgres_url)
        instance = stack.enter_context(dg.DagsterInstance.from_config(str(dagster_home)))
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        for k in list(os.environ):
            if k.startswith(("LIGHTUP_", "PAGERDUTY_", "SLACK_", "DW_POS_SOURCE_URL")):
                mp.delenv(k)
        idp = start_oidc_server(users={e: {"sub": f"sub-{e.split('@')[0]}", "email_verified": True} for e in (OWNER, NOT_LISTED)},
                                clients={"dw-dagster": {"redirect_uris": ["http://127.0.0.1/callback"]}})
        stack.callback(idp.stop)
        mp.setenv(h.HOME_ENV, str(home))
        mp.setenv("DW_OIDC_ISSUER", idp.url)
        mp.setenv("DAGSTER_HOME", str(dagster_home))
        h.ensure_home(home)
        mark("storage", f"dagster-postgres {res.postgres_url}; run coordinator {type(instance.run_coordinator).__name__}")

        # the loop up to the merge, in this process (as test_store_sales_e2e)
        defs = prepare_incident_data(home, instance, SCALE, log)
        checks = run_job(defs.resolve_job_def("dw_verify"), instance, "checks")
        res.gap_before, passed = _gaps(instance, checks.run_id)
        assert not passed, "region_compare passed on the incident's data"
        daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
        assert daemon.tick("dw_check_incident_sensor").run_ids, "the incident sensor launched no diagnosis"
        cs = records.change_sets(instance)[0]
        res.change_set_id = cs.id
        mark("propose", f"change set {cs.id}, window {cs.window[0]}..{cs.window[-1]}")
        demo_approvals(instance, daemon, cs.id, owner=OWNER, not_listed=NOT_LISTED, comment="reviewed (celery test)",
                       refused=res.refused, log=log, owner_role="the listed approver", domains_file=h.domains_path(home))
        owner_merges(cs, h.repo_dir(home), OWNER)
        (h.dbt_dir(home) / "target" / "manifest.json").unlink(missing_ok=True)
        # parsed once here, before any other process reads the merged project
        build_definitions(home, executor=CELERY)
        mark("merge", f"{OWNER} merged; the celery location's definitions built")

        # scale out: one code server, dagster-daemon, two celery workers
        env = {**os.environ, "PYTHONPATH": str(REPO), "DAGSTER_HOME": str(dagster_home),
               "DAGSTER_TELEMETRY_DISABLED": "1"}
        server = stack.enter_context(code_server("dw_dagster_tests.e2e.celery_location", LOCATION, env, root))
        workers = stack.enter_context(celery_workers(2, env, root))
        res.worker_names = [w.worker_name for w in workers]
        dmn = stack.enter_context(dagster_daemon(server.workspace, env, root))
        mark("scale out", f"code server :{server.port}, dagster-daemon pid {dmn.proc.pid}, celery workers {res.worker_names}")
        workspace = stack.enter_context(WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[str(server.workspace)])))
        try:
            res.run_ids.update(run_stages_in_daemon(instance, workspace, LOCATION, change_set_id=cs.id,
                                                    stage_tag=c.STAGE_TAG))
        except Exception as e:
            tails = "\n".join(p.log_tail(30) for p in (*workers, dmn, server.proc))
            raise AssertionError(f"{e}\n{tails}") from e
        for stage, rid in res.run_ids.items():
            log("receipt" if stage == "receipt" else "repair", f"{stage} run {rid[:8]} succeeded; steps on "
                f"{sorted(set(_run_facts(instance, rid)['celery'].values()))}")
        mark("repaired", f"stages {list(res.run_ids)}")
        res.runs = {stage: _run_facts(instance, rid) for stage, rid in res.run_ids.items()}
        res.stage_states = {s: st.state for s, st in ledger_for(instance).stages(cs.id, cs.version).items()}
        res.receipts = [r for r in records.receipts(instance) if r.change_set_id == cs.id]
        res.gap_after, _ = _gaps(instance, res.run_ids["verify"])
        procs = {"dagster_daemon": dmn, "code_server": server.proc, **{w.name: w for w in workers}}
        t_stop = time.monotonic()
    # leaving the block stopped the daemon, the workers and the code server, then dropped the database
    res.stopped = {n: (p.returncode, p.stop_seconds, p.killed, p.leftover) for n, p in procs.items()}
    res.database_dropped = not _database_exists(res.postgres_url)
    mark("stopped", f"in {time.monotonic() - t_stop:.1f} s: {res.stopped}")
    return res


def test_every_repair_stage_ran_once_in_order_through_the_queue(loop):
    """The same stages as on one process, each a run the coordinator queued and the daemon dequeued."""
    assert list(loop.run_ids) == ["snapshot", "window-1", "rebuild", "verify", "receipt"]
    assert loop.stage_states == {s: "succeeded" for s in loop.run_ids}
    for stage, run in loop.runs.items():
        assert run["status"] == "SUCCESS" and run["tags"][c.STAGE_TAG] == stage
        assert run["tags"]["dagster/sensor_name"] == "dw_remediation_sensor" and run["origin"]
        # queued at submission, launched by the daemon's dequeue (RUN_STARTING), then run by a run worker
        order = [ev.index(t.value) for t in (dg.DagsterEventType.RUN_ENQUEUED, dg.DagsterEventType.RUN_STARTING,
                                               dg.DagsterEventType.RUN_START, dg.DagsterEventType.RUN_SUCCESS)
                 for ev in [run["events"]]]
        assert order == sorted(order), (stage, run["events"])
    window = loop.runs["window-1"]
    assert (window["job"], window["tags"][RANGE_START_TAG], window["tags"][RANGE_END_TAG]) == (
        "dw_rerun_window", "2026-11-26", "2026-11-27")


def test_every_step_ran_in_one_of_the_two_celery_workers(loop):
    """Each step of each stage was a celery task; the two workers the test started shared them."""
    used = set()
    for stage, run in loop.runs.items():
        assert run["steps"] and set(run["celery"]) == set(run["steps"]), (stage, run["celery"], run["steps"])
        used |= set(run["celery"].values())
    assert used <= set(loop.worker_names) and len(used) == 2, (used, loop.worker_names)
    assert len(loop.runs["verify"]["steps"]) >= 3  # the checks run as parallel steps


def test_approvals_are_the_single_process_ones(loop):
    refused = {r["approver"]: r["reason"] for r in loop.refused}
    assert set(refused) == {c.PROPOSER, f"{OWNER} (typed, not logged in)", f"{NOT_LISTED} (logged in)"}
    assert "needs a verified identity" in refused[f"{OWNER} (typed, not logged in)"]
    assert "not an approver" in refused[f"{NOT_LISTED} (logged in)"]


def test_receipts_verified_on_the_four_assets_and_no_gap_left(loop):
    assert loop.gap_before["Southwest"] == pytest.approx(1.8, abs=0.01)
    assert loop.gap_after == {r: 0.0 for r in REGIONS}
    assert sorted("/".join(r.asset_key) for r in loop.receipts) == [
        "fct_store_sales_daily", "region_sales_daily", "region_sales_mtd", "store_sales_line"]
    assert all(r.verified and r.signature_valid and r.approver == OWNER for r in loop.receipts)
    (line,) = [r for r in loop.receipts if r.asset_key == ["store_sales_line"]]
    assert set(line.run_ids) == {"snapshot", "window-1", "rebuild", "verify"}
    assert {s: line.run_ids[s] for s in line.run_ids} == {s: loop.run_ids[s] for s in line.run_ids}
    assert {o.check_name for o in line.checks} == {"region_compare", "daily_volume", "null_rate"}
    (fct,) = [r for r in loop.receipts if r.asset_key == ["fct_store_sales_daily"]]
    assert any(o.check_name.startswith("assert_fct_store_sales_daily_counts") and o.passed for o in fct.checks)


def test_workers_daemon_and_code_server_stopped_cleanly(loop):
    """SIGTERM (celery's warm shutdown) and SIGINT end every process; nothing is killed; the database is dropped."""
    assert set(loop.stopped) == {"dagster_daemon", "code_server", "celery_worker_1", "celery_worker_2"}
    for name, (code, seconds, killed, leftover) in loop.stopped.items():
        assert not killed and seconds < 60, (name, code, seconds, leftover)
        if name.startswith("celery"):
            assert code == 0, (name, code)
    assert loop.database_dropped is True
    print(f"\ntimeline {loop.timeline}")
