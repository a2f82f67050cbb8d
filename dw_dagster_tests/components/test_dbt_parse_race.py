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


def example_project(tmp_path: Path) -> Path:
    """A copy of the example dbt project (without its target and logs) in ``tmp_path``."""
    project = tmp_path / "dbt_project"
    shutil.copytree(REPO / "examples" / "dw_dagster_examples" / "dbt_project", project, ignore=shutil.ignore_patterns("target", "logs"))
    return project


def local_package(tmp_path: Path) -> Path:
    """A dbt package with one macro, ``shared_macros.cents``, in ``tmp_path`` (outside any project)."""
    package = tmp_path / "shared_macros"
    (package / "macros").mkdir(parents=True)
    (package / "dbt_project.yml").write_text("name: shared_macros\nversion: '1.0'\nconfig-version: 2\n")
    (package / "macros" / "cents.sql").write_text("{% macro cents(x) %}({{ x }} * 100){% endmacro %}\n")
    return package


def load(project_dir: str) -> None:
    """What a process of ``dagster dev`` does when it imports definitions that name the dbt project."""
    from dagster_dbt import DbtProject

    from dw_dagster.wiring.dbt import prepare_if_dev

    prepare_if_dev(DbtProject(project_dir=project_dir, profiles_dir=project_dir))


def dev_process(project_dir: str, env: dict[str, str]) -> None:
    """A process of ``dagster dev`` (the target of a spawned process) with ``env`` added to its environment."""
    import os

    os.environ.update({"DAGSTER_IS_DEV_CLI": "1", **env})
    load(project_dir)


def test_parses_at_once_never_leave_a_half_written_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_IS_DEV_CLI", "1")
    project = example_project(tmp_path)
    load(str(project))  # a first manifest to read
    manifest = project / "target" / "manifest.json"
    assert json.loads(manifest.read_text())["nodes"]
    ctx = mp.get_context("spawn")
    # each with a variable of dbt's of its own, so none reuses another's parse: three parses at once
    workers = [ctx.Process(target=dev_process, args=(str(project), {"DBT_DW_TEST_PARSE_WORKER": str(i)})) for i in range(3)]
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


def test_a_process_that_finds_the_manifest_of_the_project_as_it_is_does_not_parse(tmp_path, monkeypatch):
    """Each run worker under ``dagster dev`` loads the definitions: the second load of an unchanged project
    keeps the manifest the first made (no ``dbt --version``, no ``dbt parse``); an edited model (even one whose
    size and modification time were kept), an edited profiles file, a variable a file names in ``env_var()`` or one of dbt's own parses again."""
    import os

    project = example_project(tmp_path)
    manifest = project / "target" / "manifest.json"

    def parsed_again() -> bool:
        before = manifest.stat().st_ino
        load(str(project))
        return manifest.stat().st_ino != before

    monkeypatch.setenv("DAGSTER_IS_DEV_CLI", "1")
    load(str(project))
    assert json.loads(manifest.read_text())["nodes"]
    assert not parsed_again()
    model = next(project.glob("models/**/*.sql"))
    os.utime(model, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns + 1_000_000))
    assert not parsed_again()  # touched, not changed
    mtime = model.stat().st_mtime_ns
    model.write_text(model.read_text().replace("select", "SELECT", 1))  # same size, the time kept (cp -p, rsync -t)
    os.utime(model, ns=(mtime, mtime))
    assert parsed_again() and not parsed_again()
    (project / "profiles.yml").write_text((project / "profiles.yml").read_text() + "\n")
    assert parsed_again()
    monkeypatch.setenv("DW_UNRELATED", "x")  # no file names it
    assert not parsed_again()
    model.write_text(model.read_text() + "\n-- {{ env_var('DW_SOME_SETTING', 'none') }}\n")
    assert parsed_again() and not parsed_again()
    monkeypatch.setenv("DW_SOME_SETTING", "x")  # a model reads it with env_var()
    assert parsed_again() and not parsed_again()
    monkeypatch.setenv("DBT_TARGET_PATH_UNUSED", "x")  # dbt's own variables
    assert parsed_again()
    # a local package: installed by `dbt deps` as a link in dbt_packages to a folder outside the project
    package = local_package(tmp_path)
    (project / "dbt_packages").mkdir()
    (project / "dbt_packages" / "shared_macros").symlink_to(package, target_is_directory=True)
    (package / "loop").symlink_to(package, target_is_directory=True)  # a link back up is walked once
    assert parsed_again() and not parsed_again()
    (package / "macros" / "cents.sql").write_text("{% macro cents(x) %}round({{ x }} * 100){% endmacro %}\n")
    assert parsed_again()


def test_the_fingerprint_reads_a_large_file_by_its_time_and_gives_up_on_a_huge_tree(tmp_path, monkeypatch):
    """A seed over 1 MiB counts by its size and time (not read at every load); a project past ``_MAX_FILES`` files
    (a link to a large folder) has no fingerprint, so it is parsed as before, and nothing is read past the limit."""
    import os

    from dw_dagster.wiring import dbt as wiring

    project = tmp_path / "p"
    (project / "seeds").mkdir(parents=True)
    seed = project / "seeds" / "big.csv"
    seed.write_bytes(b"a\n" * (wiring._CONTENT_LIMIT // 2 + 1))
    before = wiring._project_fingerprint(project, project, project / "target")
    st = seed.stat()
    seed.write_bytes(b"b\n" * (wiring._CONTENT_LIMIT // 2 + 1))  # same size, same time: not read
    os.utime(seed, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert wiring._project_fingerprint(project, project, project / "target") == before
    os.utime(seed, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert wiring._project_fingerprint(project, project, project / "target") not in ("", before)
    for i in range(3):
        (project / f"m{i}.sql").write_text("select 1")
    monkeypatch.setattr(wiring, "_MAX_FILES", 3)
    assert wiring._project_fingerprint(project, project, project / "target") == ""
