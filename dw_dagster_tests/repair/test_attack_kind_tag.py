"""A launch's tags never change what a job is: the ``dw/kind`` override, at both doors.

Dagster merges the tags typed at launch over the job's own tags, so ``dagster job execute ...
--tags '{"dw/kind": "manual", ...range tags...}'`` (or GraphQL ``launchRun`` with the same tags) once
made dw_dagster's window job look like any other job: it reran the window with no approval, no
ticket, no undo copy and no receipt. Each test launches dw_dagster's real window and rebuild jobs
(:mod:`dw_dagster.repair.jobs`, guarded executor included) against a real instance, through the run
worker's door (``dagster job execute`` in a subprocess: the guarded executor) and through the
webserver's door (:class:`~dw_dagster.guard.admission.GuardedRunCoordinator` at submission), and shows
that nothing ran: the assets' code never wrote a line.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster.guard.admission import KIND_TAG

RANGE = {"dagster/asset_partition_range_start": "2026-11-03", "dagster/asset_partition_range_end": "2026-11-04"}
DEFS = """\
    import os
    from pathlib import Path

    import dagster as dg

    from dw_dagster.repair.jobs import build_rebuild_job, build_window_job

    DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-06")
    WRITES = Path(os.environ["DW_TEST_WRITES"])


    @dg.asset(partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run())
    def orders(context: dg.AssetExecutionContext) -> None:
        r = context.partition_key_range
        with WRITES.open("a") as f:
            f.write(f"orders {r.start}..{r.end}\\n")


    @dg.asset(deps=[orders])
    def orders_daily() -> None:
        with WRITES.open("a") as f:
            f.write("orders_daily\\n")


    defs = dg.Definitions(assets=[orders, orders_daily], jobs=[
        build_window_job("rerun_orders", [orders.key], DAILY),
        build_rebuild_job("rebuild_orders", dg.AssetSelection.assets(orders_daily))])
    """

#: (job, the tags a colleague types): the window job with the range, the rebuild job as it is
LAUNCHES = {"window": ("rerun_orders", RANGE), "rebuild": ("rebuild_orders", {})}
#: what the colleague puts in dw/kind: another kind, an empty one, the job's own (still no ticket)
OVERRIDES = {"manual": "manual", "empty": "", "own": None}


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A code location on disk, a DAGSTER_HOME with dw_dagster's run coordinator, and the file the
    assets' code appends to when it runs."""
    (tmp_path / "defs.py").write_text(textwrap.dedent(DEFS))
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(textwrap.dedent("""\
        telemetry:
          enabled: false
        run_coordinator:
          module: dw_dagster.guard
          class: GuardedRunCoordinator
        """))
    writes = tmp_path / "writes.log"
    monkeypatch.setenv("DW_TEST_WRITES", str(writes))
    return tmp_path, home, writes


def _tags(kind_override: str | None, base: dict) -> dict:
    """The colleague's tags: ``base`` plus ``dw/kind`` set to ``kind_override`` (None: not typed)."""
    return {**base, KIND_TAG: kind_override} if kind_override is not None else dict(base)


@pytest.mark.parametrize("override", ["manual", "empty"])
@pytest.mark.parametrize("what", ["window", "rebuild"])
def test_dagster_job_execute_with_an_overridden_kind_tag_is_refused(place, what, override):
    """`dagster job execute -j <repair job> --tags '{"dw/kind": ...}'`: the run worker's guarded
    executor reads the kind from the job definition and refuses before any step."""
    root, home, writes = place
    job, base = LAUNCHES[what]
    tags = {**base, KIND_TAG: OVERRIDES[override]}
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    p = subprocess.run([str(Path(sys.executable).parent / "dagster"), "job", "execute", "-f", str(root / "defs.py"),
                        "-a", "defs", "-j", job, "--tags", json.dumps(tags)],
                       env=env, cwd=str(root), capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    assert "dw_dagster refused" in out and f"is a dw_dagster {what} job" in out, out[-3000:]
    assert not writes.exists(), writes.read_text()  # the assets' code never ran
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.FAILURE and run.tags[KIND_TAG] == OVERRIDES[override]


def _submit(place, job_name: str, tags: dict) -> tuple[dg.DagsterRun, str]:
    """What the webserver does for a Launchpad or GraphQL ``launchRun``: the job's tags with the typed
    ones merged over them (``dagster_graphql``'s ``merge_dicts(remote_job.tags, ...)``), the run
    created from the code location's job (its snapshot stored with it), then handed to the
    instance's run coordinator."""
    import importlib.util

    from dagster._core.run_coordinator.base import SubmitRunContext

    from dw_dagster.guard.admission import GuardedRunCoordinator

    root, home, _ = place
    spec = importlib.util.spec_from_file_location("kind_defs", root / "defs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_coordinator, GuardedRunCoordinator)
        job = mod.defs.resolve_job_def(job_name)
        run = instance.create_run_for_job(job, tags={**job.tags, **tags})
        submitted = instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))
        failure = next((e.message for e in instance.all_logs(run.run_id)
                        if e.dagster_event and e.dagster_event.event_type_value == "PIPELINE_FAILURE"), "")
        return submitted, failure


@pytest.mark.parametrize("override", sorted(OVERRIDES))
@pytest.mark.parametrize("what", ["window", "rebuild"])
def test_the_run_coordinator_refuses_a_repair_job_whatever_its_tags_say(place, what, override):
    """Launchpad / GraphQL `launchRun` of the window or rebuild job by hand: with the job's own kind,
    another kind or an empty one, the coordinator refuses at submission (the run never queues)."""
    _, _, writes = place
    job, base = LAUNCHES[what]
    run, failure = _submit(place, job, _tags(OVERRIDES[override], base))
    assert run.status == dg.DagsterRunStatus.FAILURE, run.status
    assert failure.startswith("dw_dagster refused run"), failure
    if OVERRIDES[override] is None:
        assert "no dw/ticket" in failure
    else:
        assert f"is a dw_dagster {what} job" in failure and "dw/kind" in failure
    assert not writes.exists()


def test_an_ordinary_job_claiming_a_repair_kind_is_still_held_to_it(place):
    """The other way round: a run whose tags claim a repair kind on a job that is none is refused too
    (it asked to be a repair); the same job without that claim is admitted as usual."""
    from dw_dagster.guard.admission import RunFacts, RunRefused, admit_run, run_job_tags

    root, home, _ = place
    (root / "defs.py").write_text(textwrap.dedent(DEFS) + textwrap.dedent("""\
        defs = dg.Definitions.merge(defs, dg.Definitions(jobs=[dg.define_asset_job("plain", selection=[orders_daily])]))
        """))
    run, failure = _submit(place, "plain", {KIND_TAG: "window"})
    assert run.status == dg.DagsterRunStatus.FAILURE and "no dw/ticket" in failure
    import importlib.util

    spec = importlib.util.spec_from_file_location("kind_defs_plain", root / "defs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        plain = instance.create_run_for_job(mod.defs.resolve_job_def("plain"))
        admit_run(instance, RunFacts.of_run(plain, ["orders_daily"], job_tags=run_job_tags(instance, plain)))
        window = instance.create_run_for_job(mod.defs.resolve_job_def("rerun_orders"), tags={KIND_TAG: "window", **RANGE})
        with pytest.raises(RunRefused, match="no dw/ticket"):
            admit_run(instance, RunFacts.of_run(window, ["orders"], job_tags=run_job_tags(instance, window)))
