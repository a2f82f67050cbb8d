"""Field cases of the dbt parse every process of a ``dagster dev`` deployment runs when it loads the definitions."""

import multiprocessing as mp
import shutil
from pathlib import Path

from dw_dagster_tests.field_cases.kinds import kind

REPO = Path(__file__).resolve().parents[2]
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
    project = tmp_path / "dbt_project"
    shutil.copytree(REPO / "examples" / "dw_dagster_examples" / "dbt_project", project, ignore=shutil.ignore_patterns("target", "logs"))
    package = tmp_path / "shared_macros"
    (package / "macros").mkdir(parents=True)
    (package / "dbt_project.yml").write_text("name: shared_macros\nversion: '1.0'\nconfig-version: 2\n")
    (package / "macros" / "cents.sql").write_text("{% macro cents(x) %}({{ x }} * 100){% endmacro %}\n")
    (project / "packages.yml").write_text("packages:\n  - local: ../shared_macros\n")
    return project


def _load(project_dir: str) -> None:
    """What a process of ``dagster dev`` does when it imports definitions that name the dbt project."""
    from dagster_dbt import DbtProject

    from dw_dagster.wiring.dbt import prepare_if_dev

    prepare_if_dev(DbtProject(project_dir=project_dir, profiles_dir=project_dir))


def _worker(project_dir: str, env: dict[str, str]) -> None:
    import os

    os.environ.update({"DAGSTER_IS_DEV_CLI": "1", **env})
    _load(project_dir)


def _in_processes(project: Path, envs: list[dict[str, str]]) -> list[int]:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(str(project), env)) for env in envs]
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
    _load(str(project))
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
        loader = threading.Thread(target=_load, args=(str(project),))
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
