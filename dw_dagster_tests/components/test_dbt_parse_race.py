"""Under ``dagster dev`` every process that imports the definitions (code server, daemon, each run
worker) re-parses the dbt project. They once wrote ``target/manifest.json`` in place, and a run
worker importing the definitions while another process was writing it failed its run with a
JSONDecodeError (seen in the daemon end-to-end test). Three parses at once while a reader keeps
loading the manifest: the reader never sees a half-written file."""

import json
import multiprocessing as mp
import shutil
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _parse(project_dir: str) -> None:
    import os

    from dagster_dbt import DbtProject

    from dw_dagster.wiring.dbt import prepare_if_dev

    os.environ["DAGSTER_IS_DEV_CLI"] = "1"
    prepare_if_dev(DbtProject(project_dir=project_dir, profiles_dir=project_dir))


def test_parses_at_once_never_leave_a_half_written_manifest(tmp_path):
    project = tmp_path / "dbt_project"
    shutil.copytree(REPO / "examples" / "dw_dagster_examples" / "dbt_project", project, ignore=shutil.ignore_patterns("target", "logs"))
    _parse(str(project))  # a first manifest to read
    manifest = project / "target" / "manifest.json"
    assert json.loads(manifest.read_text())["nodes"]
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=_parse, args=(str(project),)) for _ in range(3)]
    for w in workers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in workers):
        json.loads(manifest.read_text())  # raises on a half-written file
        reads += 1
        time.sleep(0.005)
    for w in workers:
        w.join()
        assert w.exitcode == 0
    assert reads > 10 and json.loads(manifest.read_text())["nodes"]
    assert not list(project.glob(".dw_parse-*"))  # each parse cleaned up its own folder
