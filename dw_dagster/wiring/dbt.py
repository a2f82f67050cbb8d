"""The dbt side of :func:`~dw_dagster.definitions.build_dw_definitions`: the ``dbt`` to run, the
manifest (parsed when missing, atomically), the models' asset keys, and a dbt incremental model's
diagnoser and ``dbt_window`` runner."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dw_dagster.dagster_private import public

from dw_dagster.config import DataOpsConfig
from dw_dagster.errors import DwConfigError


@public
def dbt_executable() -> str:
    """The ``dbt`` to run: ``$DW_DBT_EXECUTABLE`` (``dw-dagster mcp --dbt-executable``), else the one next to this Python (a venv's ``bin/``, found even when the venv
    is not activated), else ``dbt`` from ``PATH``.

    Returns:
        A path or the bare name ``dbt`` (for ``DbtCliResource(dbt_executable=...)``).
    """
    chosen = os.environ.get("DW_DBT_EXECUTABLE", "").strip()
    if chosen:
        return chosen
    local = Path(sys.executable).parent / "dbt"
    return str(local) if local.exists() else "dbt"


@public
def prepare_manifest(project_dir: Path, profiles_dir: Path | None = None) -> Path:
    """The dbt project's ``target/manifest.json``, running ``dbt parse`` once when it is missing.

    Unlike ``DbtProject.prepare_if_dev`` this parses wherever the code location loads (a demo, a
    test, ``dagster definitions validate``), not only under ``dagster dev``; delete the manifest
    to have it parsed again (e.g. after a merge adds a dbt test).

    Args:
        project_dir: the dbt project (holds ``dbt_project.yml``).
        profiles_dir: the folder of ``profiles.yml`` (default ``project_dir``).

    Returns:
        The manifest's path.

    Raises:
        dagster_dbt.errors.DagsterDbtCliRuntimeError: ``dbt parse`` failed (its message says why).
    """
    from dagster_dbt import DbtCliResource

    manifest = Path(project_dir) / "target" / "manifest.json"
    if not manifest.exists():
        cli = DbtCliResource(project_dir=str(project_dir), profiles_dir=str(profiles_dir or project_dir),
                             dbt_executable=dbt_executable())
        _parse_atomically(cli, Path(project_dir), manifest.parent)
    return manifest


def _parse_atomically(cli, project_dir: Path, target: Path) -> None:
    """``dbt parse`` into a folder of this process's own, then the new ``manifest.json`` renamed over
    ``target``'s: every process of a deployment (code server, daemon, run workers) may import the
    definitions at once, and none may read a manifest another is half-way through writing.
    dbt's partial-parse state is copied in first and back after, so a parse stays incremental."""
    import shutil
    import uuid

    target.mkdir(parents=True, exist_ok=True)
    aside = project_dir / f".dw_parse-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        aside.mkdir()
        state = target / "partial_parse.msgpack"
        if state.exists():
            shutil.copy2(state, aside / state.name)
        cli.cli(["--quiet", "parse"], target_path=aside).wait()
        if (aside / state.name).exists():
            os.replace(aside / state.name, state)
        os.replace(aside / "manifest.json", target / "manifest.json")
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def prepare_if_dev(project) -> None:
    """``DbtProject.prepare_if_dev`` with :func:`dbt_executable`: under ``dagster dev`` (``$DAGSTER_IS_DEV_CLI``)
    run ``dbt deps`` when the project has packages and ``dbt parse``, so edits to the project show at
    each reload; elsewhere nothing. dagster-dbt's own runs the ``dbt`` on ``PATH``, which a venv that
    is not activated does not have.

    Every process that loads the definitions comes here (the code server, the daemon, each run worker);
    a process that finds the manifest made from the project as it is now (:func:`_project_fingerprint`,
    kept beside the manifest) does not parse again: dagster-dbt's would start ``dbt --version`` and
    ``dbt parse``, seconds of CPU, in every run. The processes that do parse take turns (a lock file in
    the target folder), so one's ``dbt deps`` never empties ``dbt_packages`` under another's parse (the
    runs of a parallel backfill started after an edit; dagster#33993)."""
    from dagster_dbt import DbtCliResource

    from filelock import FileLock, Timeout

    if not os.getenv("DAGSTER_IS_DEV_CLI"):
        return
    project_dir, target = Path(project.project_dir), Path(project.project_dir) / project.target_path
    profiles_dir = Path(project.profiles_dir or project_dir)
    if _parsed(target, _project_fingerprint(project_dir, profiles_dir, target)):
        return
    target.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(target / ".dw_dagster_parse.lock"), timeout=PARSE_LOCK_SECONDS)
    try:
        lock.acquire()
    except Timeout:
        pass  # a parse that hangs elsewhere: parse anyway, as without the lock
    try:
        fingerprint = _project_fingerprint(project_dir, profiles_dir, target)  # the process before may have parsed it
        if _parsed(target, fingerprint):
            return
        cli = DbtCliResource(project_dir=project, dbt_executable=dbt_executable())
        if any((project_dir / f).exists() for f in ("dependencies.yml", "packages.yml")):
            cli.cli(["deps", "--quiet"], target_path=project.target_path).wait()
            fingerprint = _project_fingerprint(project_dir, profiles_dir, target)  # deps wrote package-lock.yml
        _parse_atomically(cli, project_dir, target)
        if fingerprint:
            _write_atomically(target / PARSED_MARK, fingerprint)
    finally:
        if lock.is_locked:
            lock.release()


def _parsed(target: Path, fingerprint: str) -> bool:
    """Whether the manifest in ``target`` was made from the project with this fingerprint."""
    return bool(fingerprint) and (target / "manifest.json").exists() and _read_text(target / PARSED_MARK) == fingerprint


#: beside the manifest: the fingerprint of the project the last parse under ``dagster dev`` read
PARSED_MARK = ".dw_dagster_parsed"
#: how long a process waits for another's ``dbt deps`` and ``dbt parse`` before it parses anyway
PARSE_LOCK_SECONDS = 900
_NOT_PARSED = frozenset({"target", "logs"})


def _project_fingerprint(project_dir: Path, profiles_dir: Path, target: Path) -> str:
    """What a parse reads: every project file's path and content, installed packages included (outputs, logs
    and hidden files aside; contents, not modification times, which a copy or a checkout can keep while the
    text changes; a file over 1 MiB by its size and time), the profiles file, the environment variables they
    name in ``env_var()`` and dbt's own (``DBT_*``), the ``dbt`` executable and the installed dbt
    distributions' versions. Reading the files costs a fraction of one ``dbt parse``. Taken before the parse,
    so an edit made during it is parsed the next time; ``""`` (the parse runs) when a file vanished while it
    was read or there are more than :data:`_MAX_FILES`."""
    import hashlib

    h = hashlib.sha256(f"{dbt_executable()}\n{_dbt_versions()}\n".encode())
    named: set[str] = set()
    try:
        for path in _project_files(project_dir, target):
            named |= _hash_file(h, str(path.relative_to(project_dir)), path)
        profiles = profiles_dir / "profiles.yml"
        if profiles.exists():
            named |= _hash_file(h, f"profiles {profiles}", profiles)
    except (OSError, _TooLarge):
        return ""
    for k in sorted(k for k in os.environ if k in named or k.startswith("DBT_")):
        h.update(f"{k}={os.environ[k]}\0".encode())
    return h.hexdigest()


def _project_files(project_dir: Path, target: Path):
    """The project's files in a stable order, through links as dbt reads them (a local package is a link in
    ``dbt_packages``), each real folder once; stops after :data:`_MAX_FILES` (a link to a large folder)."""
    seen: set[str] = set()
    count = 0
    for root, dirs, files in os.walk(project_dir, followlinks=True):
        here = Path(root)
        if os.path.realpath(here) in seen:
            dirs[:] = []
            continue
        seen.add(os.path.realpath(here))
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NOT_PARSED and here / d != target)
        for name in sorted(files):
            if not name.startswith("."):
                count += 1
                if count > _MAX_FILES:
                    raise _TooLarge(project_dir)
                yield here / name


class _TooLarge(Exception):
    """More files than a fingerprint reads: the parse runs, as it did without one."""


#: past this many files the project is parsed without looking (dbt reads them all anyway)
_MAX_FILES = 50_000
#: a file larger than this counts by its size and modification time, not its content (a large seed; dbt
#: itself checks seeds over 1 MiB by path only)
_CONTENT_LIMIT = 1 << 20
_ENV_VAR = re.compile(rb"""env_var\(\s*['"]([^'"]+)['"]""")


def _dbt_versions() -> str:
    """The installed dbt distributions (dbt-core, the adapters) and their versions: an upgrade parses again."""
    from importlib.metadata import distributions

    names = {(d.metadata["Name"] or "").lower(): d.version for d in distributions()}
    return ",".join(f"{n}={v}" for n, v in sorted(names.items()) if n.startswith("dbt"))


def _hash_file(h, name: str, path: Path) -> set[str]:
    """Hash the file's name and content (a large file: its size and time); return the environment variables it
    reads with ``env_var()``."""
    st = path.stat()
    if st.st_size > _CONTENT_LIMIT:
        h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        return set()
    data = path.read_bytes()
    h.update(f"{name}\0{len(data)}\0".encode())
    h.update(data)
    return {m.decode(errors="replace") for m in _ENV_VAR.findall(data)}


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write_atomically(path: Path, text: str) -> None:
    import uuid

    tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(text)
    os.replace(tmp, path)


def dbt_asset_keys(manifest: Mapping[str, Any], translator=None) -> dict[str, list[str]]:
    """dbt model unique id → Dagster asset key path, as ``translator`` (default: dagster-dbt's) names them."""
    from dagster_dbt import DagsterDbtTranslator

    translator = translator or DagsterDbtTranslator()
    return {uid: list(translator.get_asset_spec(manifest, uid, None).key.path)
            for uid, n in manifest.get("nodes", {}).items() if n.get("resource_type") in ("model", "seed", "snapshot")}


def dbt_manifest(cfg: DataOpsConfig, path: Callable[[str], Path]) -> Path | None:
    """The configured dbt project's manifest (prepared when it is missing), or None without dbt."""
    if cfg.dbt is None:
        return None
    if cfg.dbt.manifest:
        manifest_path = path(cfg.dbt.manifest)
    else:
        from dagster_dbt import DbtProject

        project_dir = path(cfg.dbt.project_dir)
        profiles_dir = path(cfg.dbt.profiles_dir) if cfg.dbt.profiles_dir else project_dir
        prepare_if_dev(DbtProject(project_dir=project_dir, profiles_dir=profiles_dir))  # re-parsed under `dagster dev`
        manifest_path = prepare_manifest(project_dir, profiles_dir)
    if not manifest_path.exists():
        raise DwConfigError(f"dbt: no manifest at {manifest_path}")
    return manifest_path


def dbt_incremental(di, field: str, *, key: dg.AssetKey, table: str, database: str, repo: Path, project_dir: Path,
                     profiles_dir: Path | None, manifest_path: Path, domains, dbt_asset_keys, verify_checks, translator,
                     asset_graph):
    """The diagnoser of a dbt incremental model and the runner of its ``dbt_window`` steps.

    Raises:
        DwConfigError: the model is not an incremental model of the manifest, or its file is not in ``repo``.
    """
    from dw_dagster.diagnosis.dbt_incremental import DbtIncrementalDiagnoser
    from dw_dagster.lineage import load_manifest
    from dw_dagster.pipelines.dbt_incremental import DbtIncrementalError, incremental_model
    from dw_dagster.proposals.dbt_incremental import DBT_WINDOW
    from dw_dagster.repair.dbt_window import dbt_window_runner

    try:
        model = incremental_model(load_manifest(manifest_path), di.dbt_model)
    except DbtIncrementalError as e:
        raise DwConfigError(f"{field}.dbt_model: {e}") from e
    try:
        model_file = (project_dir / model.file).resolve().relative_to(repo.resolve()).as_posix()
    except ValueError as e:
        raise DwConfigError(f"{field}.repo: the model's file {project_dir / model.file} is not inside {repo}") from e
    diagnoser = DbtIncrementalDiagnoser(
        target_asset=key, source_resource_key=di.source_database or database, target_resource_key=database,
        pipeline_root=lambda: repo, pipeline_file=model_file, manifest_path=lambda: manifest_path, partitions_def=None,
        domains_file=domains, dbt_asset_keys=dbt_asset_keys, verify_checks=verify_checks, group_by=di.group_by,
        asset_graph=asset_graph, model=di.dbt_model, project_dir=lambda: project_dir, target_table=table,
        arrival_column=di.arrival_column, key_column=di.key, source_table=di.source_table)
    runner = dbt_window_runner(project_dir=project_dir, profiles_dir=profiles_dir, manifest_path=lambda: manifest_path,
                               dbt_executable=dbt_executable(), target=di.dbt_target, translator=translator)
    return diagnoser, (DBT_WINDOW, runner)
