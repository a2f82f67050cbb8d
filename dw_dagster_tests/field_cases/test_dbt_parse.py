"""Field cases of the dbt parse every process of a ``dagster dev`` deployment runs when it loads the definitions."""

import multiprocessing as mp
from pathlib import Path

from dw_dagster_tests.components.test_dbt_parse_race import dev_process, example_project, load, local_package
from dw_dagster_tests.field_cases.kinds import kind

W = "dw_dagster/wiring/dbt.py"
KINDS = [
    kind("dbt-parse-in-every-run", "dependencies", "every run worker re-parses the dbt project before its first op "
         "(dbt --version and dbt parse: seconds of CPU per run)", "https://github.com/dagster-io/dagster/issues/29744", W,
         "test_a_run_worker_of_an_unchanged_project_does_not_parse", True),
    kind("dbt-deps-races-parse", "dependencies", "the runs of a parallel backfill started at once each run dbt deps "
         "while another parses: 'found 1 package(s) specified in packages.yml, but only 0 installed'",
         "https://github.com/dagster-io/dagster/issues/33993", W,
         "test_runs_starting_at_once_after_an_edit_take_turns_at_deps_and_parse", True),
]


def _project(tmp_path: Path) -> Path:
    """The example dbt project with a local package (``dbt deps`` links it into ``dbt_packages``, offline)."""
    project = example_project(tmp_path)
    local_package(tmp_path)
    (project / "packages.yml").write_text("packages:\n  - local: ../shared_macros\n")
    return project


def _in_processes(project: Path, envs: list[dict[str, str]]) -> list[int]:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=dev_process, args=(str(project), env)) for env in envs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    return [p.exitcode for p in procs]


def test_a_run_worker_of_an_unchanged_project_does_not_parse(tmp_path, monkeypatch):
    """https://github.com/dagster-io/dagster/issues/29744: the code server (here, this process) parsed; two run
    workers of the same deployment (same project, same environment) load the definitions and keep its manifest."""
    project = _project(tmp_path)
    monkeypatch.setenv("DAGSTER_IS_DEV_CLI", "1")
    load(str(project))
    manifest = project / "target" / "manifest.json"
    first = manifest.stat().st_ino
    assert (project / "dbt_packages" / "shared_macros").exists()
    assert _in_processes(project, [{}, {}]) == [0, 0]
    assert manifest.stat().st_ino == first


def test_runs_starting_at_once_after_an_edit_take_turns_at_deps_and_parse(tmp_path, monkeypatch):
    """https://github.com/dagster-io/dagster/issues/33993: the runs of a parallel backfill start at once after an
    edit and each must prepare the project; one's ``dbt deps`` empties and refills ``dbt_packages`` while another
    parses. They take turns: while another holds the turn (here this test, through the same lock file), a process
    that must parse waits in the lock and runs neither deps nor parse; once the turn is free it runs both."""
    import sys
    import threading
    import time

    from filelock import FileLock

    import dw_dagster.wiring.dbt as wiring

    project = _project(tmp_path)
    monkeypatch.setenv("DAGSTER_IS_DEV_CLI", "1")
    calls: list[str] = []
    monkeypatch.setattr(wiring, "_parse_atomically", lambda cli, project_dir, target: calls.append("parse") or
                        (target / "manifest.json").write_text("{}"))
    (project / "target").mkdir()
    with FileLock(str(project / "target" / ".dw_dagster_parse.lock")):
        loader = threading.Thread(target=load, args=(str(project),))
        loader.start()

        def waiting_in_the_lock() -> bool:
            frame = sys._current_frames().get(loader.ident)
            while frame is not None:
                if "filelock" in frame.f_code.co_filename:
                    return True
                frame = frame.f_back
            return False

        deadline = time.monotonic() + 120
        while not waiting_in_the_lock() and not calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert calls == [] and waiting_in_the_lock() and not (project / "dbt_packages").exists()
    loader.join(300)
    assert calls == ["parse"] and (project / "dbt_packages" / "shared_macros").exists()
    assert (project / "target" / wiring.PARSED_MARK).exists()
