"""``build_dw_definitions``: the whole loop on a project's own assets, as one ``Definitions``.

Detect → diagnose → propose → approve → repair → receipt, wired together here so that nothing a
user writes has to match a job name, an op name or a stage prefix: the asset checks (and, with
Lightup, its incident sensor) detect; the incident sensor launches the diagnosis job, whose
diagnoser is chosen per asset from its pipeline kind; the approval job records a verified
person's decision; the remediation sensor runs the approved stages through the window, step,
rebuild, verify, undo and receipt jobs; the expiry and notification sensors and the stop/resume
jobs close the loop. The domains, databases and integrations reach every op and sensor as
arguments and resources, never as process-wide environment settings, so two code locations with
different domains work side by side.

The assets themselves stay the project's: pass them in (Python) or define them in other
``defs`` folders (the Component); jobs select them by key, so they must exist in the same code
location. Partitioned watched assets must share one time-window partitions definition (the window
a change set reruns is ordered by it); give it as ``partitions_def`` or let it be read from the
assets passed in.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from dw_dagster.dagster_private import public

from dw_dagster.config import DataOpsConfig, WatchedAssetConfig
from dw_dagster.core import keys as c
from dw_dagster.databases import DatabaseResource
from dw_dagster.core.domains import DomainsFileError, DomainsSource, resolve_domains
from dw_dagster.errors import DwConfigError
from dw_dagster.wiring.fixes import CauseFixes
from dw_dagster.wiring.tickets import tickets_and_email
from dw_dagster.wiring.warehouse import build_warehouse_change_definitions, not_a_warehouse_change

def _key(s: str) -> dg.AssetKey:
    return dg.AssetKey.from_user_string(s)


def _check_key(s: str) -> dg.AssetCheckKey:
    asset, sep, name = s.rpartition(":")
    if not sep or not asset or not name:
        raise DwConfigError(f"{s!r} is not asset/key:check_name")
    return dg.AssetCheckKey(_key(asset), name)


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


def _prepare_if_dev(project) -> None:
    """``DbtProject.prepare_if_dev`` with :func:`dbt_executable`: under ``dagster dev`` (``$DAGSTER_IS_DEV_CLI``)
    run ``dbt deps`` when the project has packages and ``dbt parse``, so edits to the project show at
    each reload; elsewhere nothing. dagster-dbt's own runs the ``dbt`` on ``PATH``, which a venv that
    is not activated does not have."""
    from dagster_dbt import DbtCliResource

    if not os.getenv("DAGSTER_IS_DEV_CLI"):
        return
    cli = DbtCliResource(project_dir=project, dbt_executable=dbt_executable())
    if any((Path(project.project_dir) / f).exists() for f in ("dependencies.yml", "packages.yml")):
        cli.cli(["deps", "--quiet"], target_path=project.target_path).wait()
    _parse_atomically(cli, Path(project.project_dir), Path(project.project_dir) / project.target_path)


def dbt_asset_keys(manifest: Mapping[str, Any], translator=None) -> dict[str, list[str]]:
    """dbt model unique id → Dagster asset key path, as ``translator`` (default: dagster-dbt's) names them."""
    from dagster_dbt import DagsterDbtTranslator

    translator = translator or DagsterDbtTranslator()
    return {uid: list(translator.get_asset_spec(manifest, uid, None).key.path)
            for uid, n in manifest.get("nodes", {}).items() if n.get("resource_type") in ("model", "seed", "snapshot")}


class _ByAsset:
    """The diagnosis job's diagnoser: the watched asset's own (by the incident's asset key)."""

    def __init__(self, diagnosers: Mapping[tuple[str, ...], Any]) -> None:
        self.diagnosers = dict(diagnosers)

    def __call__(self, context: dg.OpExecutionContext, incident):
        d = self.diagnosers.get(tuple(incident.asset_key))
        if d is None:
            raise dg.Failure(description=f"no pipeline is configured for {'/'.join(incident.asset_key)}: "
                             "dw_dagster records the incident but cannot diagnose it (add pipeline: to the asset)")
        return d(context, incident)


def _day(text: str | None):
    """``as_of`` of a check: a callable returning the configured day, or None (today)."""
    if not text:
        return None
    try:
        day = dt.date.fromisoformat(text)
    except ValueError as e:
        raise DwConfigError(f"as_of: {text!r} is not a YYYY-MM-DD date") from e
    return lambda: day


def _partition_scope(r, partitions_def) -> dict[str, Any]:
    """The reconciliation check's partition scope from its configuration (none without a partition column)."""
    if r.partition_column is None:
        if r.closed_partitions_only:
            raise DwConfigError(f"checks.reconciliation {r.name}: closed_partitions_only needs partition_column")
        return {}
    if partitions_def is None:
        raise DwConfigError(f"checks.reconciliation {r.name}: partition_column needs the asset's time-window partitions")
    return {"partition_column": r.partition_column, "partitions_def": partitions_def,
            "closed_partitions_only": r.closed_partitions_only}


def _checks_for(a: WatchedAssetConfig, sink_view: str | None, prepare=None,
                partitions_def: dg.PartitionsDefinition | None = None) -> list[dg.AssetChecksDefinition]:
    from dw_dagster.checks import (
        build_dead_letter_check,
        build_freshness_check,
        build_null_rate_check,
        build_reconciliation_checks,
        build_row_diff_check,
        build_volume_check,
    )

    key, c = _key(a.key), a.checks
    out = []
    if c.reconciliation is not None:
        r = c.reconciliation
        out.append(build_reconciliation_checks(
            asset=key, source_asset=_key(r.source.asset) if r.source.asset else None, source_table=r.source.table,
            target_table=a.table, slice_by=r.slice_by, measures=r.measures, key_columns=r.key_columns,
            source_resource_key=r.source.database, target_resource_key=a.database, name=r.name,
            **_partition_scope(r, partitions_def)))
    if c.row_diff is not None:
        r = c.row_diff
        out.append(build_row_diff_check(
            asset=key, source_asset=_key(r.source.asset) if r.source.asset else None, source_table=r.source.table,
            target_table=a.table, key_columns=r.key_columns, compare_columns=r.compare_columns,
            source_resource_key=r.source.database, target_resource_key=a.database, name=r.name,
            timestamp_precision=r.timestamp_precision, timestamp_rounding=r.timestamp_rounding,
            case_insensitive_keys=r.case_insensitive_keys, trim_trailing_blanks=r.trim_trailing_blanks,
            source_char_columns=r.source_char_columns, target_char_columns=r.target_char_columns))
    if c.volume is not None:
        v = c.volume
        out.append(build_volume_check(
            asset=key, table=a.table, timestamp_column=v.timestamp_column, resource_key=a.database, name=v.name,
            evaluate_days=v.evaluate_days, training_days=v.training_days, sensitivity=v.sensitivity,
            min_band_pct=v.min_band_pct, method=v.method, as_of=_day(v.as_of)))
    if c.null_rate is not None:
        n = c.null_rate
        out.append(build_null_rate_check(
            asset=key, table=a.table, columns=n.columns, timestamp_column=n.timestamp_column, resource_key=a.database,
            name=n.name, tolerance_pct=n.tolerance_pct, as_of=_day(n.as_of)))
    if c.freshness is not None:
        f = c.freshness
        out.append(build_freshness_check(
            asset=key, table=a.table, timestamp_column=f.timestamp_column,
            max_lag=dt.timedelta(hours=f.max_lag_hours) if f.max_lag_hours is not None else None,
            max_lag_days=f.max_lag_days, deadline_timezone=f.deadline_timezone,
            resource_key=a.database, name=f.name, naive_timezone=f.naive_timezone))
    if c.dead_letter is not None:
        d = c.dead_letter
        out.append(build_dead_letter_check(
            asset=key, table=d.table or sink_view, timestamp_column=d.timestamp_column, reason_column=d.reason_column,
            resource_key=a.database, name=d.name, lookback_hours=d.lookback_hours, max_rows=d.max_rows,
            prepare=prepare if d.table is None else None))
    return out


@public
def build_dw_definitions(
    config: DataOpsConfig | Mapping[str, Any] | str | os.PathLike[str],
    *,
    assets: Sequence[dg.AssetsDefinition | dg.AssetSpec] = (),
    partitions_def: dg.TimeWindowPartitionsDefinition | None = None,
    dbt_translator=None,
    base_dir: str | Path | None = None,
    scope: Mapping[str, Any] | None = None,
    executor: dg.ExecutorDefinition | None = None,
    config_source: Any = None,
) -> dg.Definitions:
    """The complete dw_dagster loop for the watched assets of ``config``, as one ``Definitions``.

    Merge it with the project's own (``dg.Definitions.merge(project_defs, build_dw_definitions(...))``)
    or return it from a ``defs`` folder through :class:`~dw_dagster.components.DataOpsComponent`.

    Args:
        config: a :class:`~dw_dagster.config.DataOpsConfig`, the same as a mapping, or the path
            of a YAML file holding it (templated like a ``defs.yaml``:
            :func:`~dw_dagster.config.load_dataops_config`).
        assets: the project's assets, when they are at hand (Python): partitioned ones give the
            window's partitions definition. Not added to the result (they stay the project's).
        partitions_def: the watched assets' time-window partitions (else read from ``assets``);
            needed when a change set reruns a window.
        dbt_translator: the ``DagsterDbtTranslator`` the project's dbt assets use (their keys in
            the blast radius); default dagster-dbt's.
        base_dir: relative paths in ``config`` (domains file, pipeline repo, dbt project) resolve
            against it; default the YAML file's folder when ``config`` is a path, else the
            working directory.
        scope: template values for a YAML file besides ``env`` (name → value, e.g.
            ``{"home": "/srv/sales"}`` for ``{{ home }}``); only with a path.
        executor: the executor that runs the steps of the loop's jobs (repair stages, checks,
            receipts, undo, step jobs) and the default of the result, always behind
            :func:`~dw_dagster.guarded_executor`; default Dagster's in-process executor. Pass
            ``dagster_celery.celery_executor`` (configured with its broker), ``dagster_k8s``'s
            ``k8s_job_executor`` or ``dg.multiprocess_executor`` to spread the steps over workers
            (README, "Scaling out"); it must be one the run's job can be reconstructed for.
        config_source: where ``config`` was read from, for ``file:line`` in errors
            (:class:`~dw_dagster.migration.resolve.ConfigSource`; the Component passes its ``defs.yaml``).

    Returns:
        ``Definitions`` holding the asset checks (with ``dw_new_tests`` on each incrementally loaded
        asset: the tests its cause fixes add, run in the verify stage); the control asset ``dw/control``; the jobs
        ``dw_diagnose_incident``, ``dw_approve_change_set``, ``dw_rerun_window``, ``dw_rebuild_downstream``,
        ``dw_verify``, ``dw_write_receipts``, ``dw_undo_snapshot``/``dw_undo_restore``, the step jobs,
        ``dw_stop``/``dw_resume``; the sensors ``dw_check_incident_sensor``, ``dw_remediation_sensor``,
        ``dw_expiry_sensor`` (and ``dw_lightup_incident_sensor``, ``dw_notification_sensor`` with
        integrations); one ``DatabaseResource`` per database given by URL; the guarded executor.

    Raises:
        DwConfigError: the configuration does not fit together (the message names the field): a
            YAML file that cannot be read or does not validate (the message starts with the
            file), ``scope`` without a file, an unreadable domains file, a domain without approvers, a watched partitioned asset
            without partitions, partitions that differ between watched assets.
    """
    from dw_dagster.diagnosis.sink_diagnoser import DeadLetterDiagnoser
    from dw_dagster.diagnosis.job import IncrementalLoadDiagnoser, RecordedLoadDiagnoser, build_diagnosis_job
    from dw_dagster.lineage import load_manifest
    from dw_dagster.approval.job import build_approval_job
    from dw_dagster.repair.sensor import build_remediation_sensor
    from dw_dagster.detection.incidents import build_check_incident_sensor
    from dw_dagster.receipts.job import build_receipt_job
    from dw_dagster.guard.stop import build_control_jobs, control_asset_spec
    from dw_dagster.guard.admission import guarded_executor
    from dw_dagster.repair.jobs import build_rebuild_job, build_verify_job, build_window_job
    from dw_dagster.changes.replay import LEDGER_SUFFIX, REPLAY, REPLAY_UNDO, ReplaySpec, pending_view_name
    from dw_dagster.changes.replay import run_replay_step, run_replay_undo_step
    from dw_dagster.repair.replay_checks import build_replay_checks
    from dw_dagster.repair.steps import build_step_jobs
    from dw_dagster.repair.undo import build_undo_jobs

    if isinstance(config, (str, os.PathLike)):
        from dw_dagster.config import load_dataops_config

        cfg = load_dataops_config(config, scope=scope)
        base = Path(base_dir) if base_dir is not None else Path(config).resolve().parent
        if config_source is None:
            from dw_dagster.migration.resolve import ConfigSource

            config_source = ConfigSource(Path(config), Path(config).read_text())
    elif scope is not None:
        raise DwConfigError("scope: template values apply to a YAML file; pass the file's path as config")
    else:
        cfg = config if isinstance(config, DataOpsConfig) else DataOpsConfig.model_validate(config)
        base = Path(base_dir) if base_dir is not None else Path.cwd()

    def path(p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else (base / q).resolve()

    # -- domains: read when used (edits apply at once), validated now so a mistake shows at load
    domains: DomainsSource = cfg.domains_model() or path(cfg.domains)
    try:
        resolve_domains(domains)
    except DomainsFileError as e:
        from dw_dagster.config import did_you_mean

        near = ""
        if isinstance(domains, Path) and not domains.exists() and domains.parent.is_dir():
            near = did_you_mean(domains.name, [f.name for f in domains.parent.iterdir() if f.suffix in (".yaml", ".yml")])
        where = ""
        if isinstance(config, (str, os.PathLike)):
            lines = Path(config).read_text().splitlines()
            where = f"{config}:{next((i + 1 for i, ln in enumerate(lines) if ln.startswith('domains:')), 1)}: "
        raise DwConfigError(f"{where}domains: {e}{near}") from e

    # -- databases
    resources: dict[str, Any] = {name: DatabaseResource(url=d.url) for name, d in cfg.databases.items() if d.url}

    # -- partitions of the watched assets
    watched = [_key(a.key) for a in cfg.assets]
    if partitions_def is None:
        found = {}
        for ad in assets:
            specs = [ad] if isinstance(ad, dg.AssetSpec) else list(ad.specs)
            for spec in specs:
                if spec.key in watched and spec.partitions_def is not None:
                    found[spec.key] = spec.partitions_def
        distinct = {repr(p): p for p in found.values()}
        if len(distinct) > 1:
            raise DwConfigError(f"assets: the watched assets {sorted(k.to_user_string() for k in found)} have different "
                                "partitions; one dw_dagster loop reruns windows of one time-window partitions definition")
        partitions_def = next(iter(distinct.values()), None)
    if partitions_def is not None and not isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        raise DwConfigError("assets: windows are reruns of time-window partitions (daily, hourly ...); "
                            f"got {type(partitions_def).__name__}")

    # -- dbt
    manifest_path: Path | None = None
    if cfg.dbt is not None:
        if cfg.dbt.manifest:
            manifest_path = path(cfg.dbt.manifest)
        else:
            from dagster_dbt import DbtProject

            project_dir = path(cfg.dbt.project_dir)
            profiles_dir = path(cfg.dbt.profiles_dir) if cfg.dbt.profiles_dir else project_dir
            _prepare_if_dev(DbtProject(project_dir=project_dir, profiles_dir=profiles_dir))  # re-parsed under `dagster dev`
            manifest_path = prepare_manifest(project_dir, profiles_dir)
        if not manifest_path.exists():
            raise DwConfigError(f"dbt: no manifest at {manifest_path}")
    keys_by_uid = dbt_asset_keys(load_manifest(manifest_path), dbt_translator) if manifest_path else {}
    dbt_dir = path(cfg.dbt.project_dir) if cfg.dbt is not None and cfg.dbt.project_dir else None
    manifest_fn = (lambda: manifest_path) if manifest_path else None

    # -- checks, detection and verification per asset
    checks: list[dg.AssetChecksDefinition] = []
    detect_keys: list[dg.AssetCheckKey] = []
    verify_keys: list[dg.AssetCheckKey] = []
    diagnosers: dict[tuple[str, ...], Any] = {}
    pipeline_root: Path | None = None
    step_runners: dict[str, Any] = {}
    dbt_window_target: str | None = None
    dbt_windowed = False  # a dbt_incremental asset: its rebuild keeps a snapshot first, as windows do
    fixes = CauseFixes()  # the new-tests checks, step runners and upstream assets of the cause fixes
    built: list[dg.Definitions] = []
    mig = _migration(cfg, resources, domains, config_source)
    parity_of: dict[dg.AssetKey, list[dg.AssetCheckKey]] = {}
    for ck in (mig.verify_keys if mig else []):
        parity_of.setdefault(ck.asset_key, []).append(ck)
    for a in cfg.assets:
        key = _key(a.key)
        sink = a.pipeline.dead_letter_sink if a.pipeline else None
        sink_table = None
        if sink is not None:
            sink_table = _SinkRef(table=a.table, dead_letter_table=sink.dead_letter_table, key=sink.key)
        view = pending_view_name(ReplaySpec(target_table=a.table, dead_letter_table=sink.dead_letter_table,
                                            ledger_table=sink.dead_letter_table + LEDGER_SUFFIX, key=sink.key,
                                            columns=[], expected_rows=0)) if sink else None
        own = _checks_for(a, view, sink_table.prepare if sink_table is not None else None, partitions_def)
        checks += own
        names = [next(iter(c.check_keys)).name for c in own]
        detect_keys += [dg.AssetCheckKey(key, n) for n in (a.detect if a.detect is not None else names)]
        asset_verify = [dg.AssetCheckKey(key, n) for n in names] + parity_of.get(key, [])  # a migrated pair's parity
        if sink is not None:
            replay_checks = build_replay_checks(asset=key, sink_table=sink_table, resource_key=a.database)
            checks += replay_checks
            asset_verify += [next(iter(c.check_keys)) for c in replay_checks]
            step_runners.update({REPLAY: run_replay_step, REPLAY_UNDO: run_replay_undo_step})
        mage_source = _mage_source(cfg, a, resources)
        if mage_source is not None and mage_source.reads:
            from dw_dagster.repair.mage_rerun import build_mage_rerun_check

            rerun_check = build_mage_rerun_check(asset=key, pipelines=mage_source.reads, resource_key=mage_source.resource_key,
                                                 timeout_s=mage_source.rerun_timeout_s, poll_s=mage_source.poll_s)
            checks.append(rerun_check)
            asset_verify.append(next(iter(rerun_check.check_keys)))
        try:
            asset_verify += [_check_key(s) for s in a.verify]
        except DwConfigError as e:
            raise DwConfigError(f"assets[{a.key}].verify: {e}") from e
        verify_keys += asset_verify
        if a.pipeline is None:
            continue
        own_verify = [[*k.asset_key.path, k.name] for k in dict.fromkeys(asset_verify)]
        if a.pipeline.incremental_load is not None:
            il = a.pipeline.incremental_load
            repo = path(il.repo)
            if not (repo / il.file).exists():
                raise DwConfigError(f"assets[{a.key}].pipeline.incremental_load.file: {repo / il.file} does not exist")
            pipeline_root = repo
            from dw_dagster.proposals.watermark import DbtCountTest

            diagnosers[tuple(key.path)] = IncrementalLoadDiagnoser(
                target_asset=key, source_resource_key=il.source_database, target_resource_key=a.database,
                pipeline_root=lambda r=repo: r, pipeline_file=il.file,
                manifest_path=manifest_fn, partitions_def=partitions_def, domains_file=domains,
                dbt_asset_keys=keys_by_uid, verify_checks=own_verify, group_by=il.group_by,
                dbt_test=DbtCountTest(model=il.dbt_test.dbt_model, count_column=il.dbt_test.count_column,
                                      source_name=il.dbt_test.source_name, source_table=il.dbt_test.source_table,
                                      group=il.dbt_test.group) if il.dbt_test else None,
                asset_graph=lambda: built[0].resolve_asset_graph() if built else None,
                **fixes.diagnoser_settings(il, cfg=cfg, a=a, key=key, repo=repo, dbt_project_dir=dbt_dir))
        elif a.pipeline.recorded_load is not None:
            rl = a.pipeline.recorded_load
            field = f"assets[{a.key}].pipeline.recorded_load"
            repo = path(rl.repo)
            pipeline_root = _one_repo(pipeline_root, repo, f"{field}.repo")
            _check_settings_file(repo / rl.settings_file, (rl.watermark_key, rl.lookback_key), f"{field}.settings_file")
            diagnosers[tuple(key.path)] = RecordedLoadDiagnoser(
                target_asset=key, source_resource_key=rl.source_database, target_resource_key=a.database,
                pipeline_root=lambda r=repo: r, pipeline_file=rl.settings_file,
                manifest_path=manifest_fn, partitions_def=partitions_def, domains_file=domains,
                dbt_asset_keys=keys_by_uid, verify_checks=own_verify, group_by=rl.group_by, dbt_test=_dbt_test(rl.dbt_test),
                asset_graph=lambda: built[0].resolve_asset_graph() if built else None,
                source_table=rl.source_table, target_table=a.table, key_column=rl.key,
                partition_column=rl.partition_column, arrival_column=rl.arrival_column,
                watermark_key=rl.watermark_key, lookback_key=rl.lookback_key,
                **fixes.diagnoser_settings(rl, cfg=cfg, a=a, key=key, repo=repo, dbt_project_dir=dbt_dir))
        elif a.pipeline.dbt_incremental is not None:
            di = a.pipeline.dbt_incremental
            field = f"assets[{a.key}].pipeline.dbt_incremental"
            repo = path(di.repo)
            pipeline_root = _one_repo(pipeline_root, repo, f"{field}.repo")
            diagnosers[tuple(key.path)], runner = _dbt_incremental(
                di, field, key=key, table=a.table, database=a.database, repo=repo, project_dir=path(cfg.dbt.project_dir),
                profiles_dir=path(cfg.dbt.profiles_dir) if cfg.dbt.profiles_dir else None, manifest_path=manifest_path,
                domains=domains, dbt_asset_keys=keys_by_uid, verify_checks=own_verify, translator=dbt_translator,
                asset_graph=lambda: built[0].resolve_asset_graph() if built else None)
            if dbt_window_target not in (None, di.dbt_target):
                raise DwConfigError(f"{field}.dbt_target: {di.dbt_target!r} is not {dbt_window_target!r}, the target of "
                                    "another dbt_incremental asset; one code location rebuilds with one dbt target")
            dbt_window_target, dbt_windowed = di.dbt_target, True
            step_runners[runner[0]] = runner[1]
        else:
            volume = next((dg.AssetCheckKey(key, c.name) for kind, c in a.checks.configured() if kind == "volume"), None)
            diagnosers[tuple(key.path)] = DeadLetterDiagnoser(
                target_asset=key, sink_table=sink_table, source_table=sink.source_table,
                source_resource_key=sink.source_database, target_resource_key=a.database,
                partition_column=sink.partition_column, group_column=sink.group_column,
                volume_check=volume or dg.AssetCheckKey(key, c.VOLUME_CHECK), manifest_path=manifest_fn,
                dbt_asset_keys=keys_by_uid, domains_file=domains, verify_checks=own_verify, mage=mage_source)

    checks += fixes.checks()
    verify_keys += fixes.verify_keys()
    step_runners.update(fixes.step_runners(pipeline_root=pipeline_root, dbt_project_dir=dbt_dir, dbt_profiles_dir=(
        path(cfg.dbt.profiles_dir) if dbt_dir is not None and cfg.dbt.profiles_dir else None)))
    db_keys = sorted(cfg.databases)
    status = dg.DefaultSensorStatus.RUNNING if cfg.sensors_running else dg.DefaultSensorStatus.STOPPED
    if mig is not None:
        checks += mig.checks
        detect_keys += mig.detect_keys
        verify_keys += mig.verify_keys
        step_runners.update(mig.step_runners)
        for target, diagnoser in mig.diagnosers.items():
            diagnosers.setdefault(target, diagnoser)  # a watched asset's own pipeline diagnoses it first
    diagnosis_job = build_diagnosis_job(diagnoser=_ByAsset(diagnosers), domains=domains,
                                        required_resource_keys=db_keys + (["mage"] if "mage" in resources else []))
    windowed = [_key(a.key) for a in cfg.assets if a.pipeline is not None
                and (a.pipeline.incremental_load is not None or a.pipeline.recorded_load is not None)]
    windowed += [k for k in fixes.upstream_assets if k not in windowed]  # an upstream fix reruns them first
    # without a partitions definition at hand, the job takes the assets' own when the location resolves
    guarded = guarded_executor(executor or dg.in_process_executor)
    window_job = build_window_job(c.WINDOW_JOB, windowed, partitions_def, executor=guarded) if windowed else None
    downstream = dg.AssetSelection.assets(*watched).downstream(include_self=False)
    rebuild_job = build_rebuild_job(c.REBUILD_JOB, downstream, executor=guarded)
    verify_job = build_verify_job(c.VERIFY_JOB, list(dict.fromkeys(verify_keys)), executor=guarded)
    receipt_job = build_receipt_job(executor=guarded if executor is not None else None)
    undo_jobs = build_undo_jobs(db_keys, executor=guarded)
    step_jobs = build_step_jobs(step_runners, resource_keys=db_keys, executor=guarded)
    stop_job, resume_job = build_control_jobs(domains)
    sensors = [
        build_check_incident_sensor(check_keys=list(dict.fromkeys(detect_keys)), diagnosis_job_name=diagnosis_job.name,
                                    domains=domains, default_status=status),
        build_remediation_sensor(partitions_def=partitions_def, partitions_of=windowed[0] if windowed else None,
                                 window_job=window_job, rebuild_job=rebuild_job,
                                 verify_job=verify_job, receipt_job=receipt_job, pipeline_root=pipeline_root,
                                 undo_jobs=undo_jobs if window_job is not None or dbt_windowed else None,
                                 step_jobs=step_jobs,
                                 domains=domains, default_status=status, accepts=not_a_warehouse_change),
    ]
    more_checks, more_sensors = _integrations(cfg, resources, diagnosis_job.name, domains, status)
    defs = dg.Definitions(
        assets=[control_asset_spec(), *(mig.assets if mig else [])],
        asset_checks=[*checks, *more_checks],
        jobs=[j for j in (diagnosis_job, build_approval_job(domains), window_job, rebuild_job, verify_job, receipt_job,
                          stop_job, resume_job, *undo_jobs, *step_jobs.values(), *(mig.jobs if mig else []))
              if j is not None],
        schedules=mig.schedules if mig else [],
        sensors=[*sensors, *more_sensors],
        resources=resources,
        executor=guarded,
    )
    built.append(defs)
    return defs


def _migration(cfg: DataOpsConfig, resources: dict, domains, source):
    """The migration's definitions (:mod:`dw_dagster.migration.build`), or None without one."""
    if cfg.migration is None:
        return None
    from dw_dagster.core.domains import resolve_domains
    from dw_dagster.migration.build import build_migration

    lightup = cfg.integrations.lightup
    lightup_key = "lightup" if lightup is not None and (not lightup.optional or _lightup_credentials_set()) else None
    return build_migration(cfg.migration, resources=resources, database_names=sorted(cfg.databases), domains=domains,
                           lightup_resource_key=lightup_key, source=source, domains_model=resolve_domains(domains))


def _dbt_incremental(di, field: str, *, key: dg.AssetKey, table: str, database: str, repo: Path, project_dir: Path,
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


def _one_repo(current: Path | None, repo: Path, field: str) -> Path:
    """The pipeline repository of the location: the remediation sensor waits for merges in one working copy."""
    if current is not None and current != repo:
        raise DwConfigError(f"{field}: {repo} is not {current}, the pipeline repository another watched asset names; "
                            "one code location's change sets are merged in one working copy")
    return repo


def _check_settings_file(file: Path, keys: Sequence[str], field: str) -> None:
    """An asset's own settings file exists and holds each key as a top-level ``key: value`` line."""
    import re

    if not file.exists():
        raise DwConfigError(f"{field}: {file} does not exist")
    text = file.read_text()
    missing = [k for k in keys if not re.search(rf"^{re.escape(k)}:", text, re.M)]
    if missing:
        raise DwConfigError(f"{field}: {file} has no top-level line for {', '.join(missing)} (the fix changes them)")


def _dbt_test(cfg):
    """The proposal's regression test from its configuration (None when not configured)."""
    if cfg is None:
        return None
    from dw_dagster.proposals.watermark import DbtCountTest

    return DbtCountTest(model=cfg.dbt_model, count_column=cfg.count_column, source_name=cfg.source_name,
                        source_table=cfg.source_table, group=cfg.group)


class _SinkRef:
    """A sink's tables and key; the columns are read from the target's catalog when it is diagnosed."""

    def __init__(self, *, table: str, dead_letter_table: str, key: str) -> None:
        from dw_dagster.databases.sql import check_name, check_table_name

        self.table, self.dead_letter_table, self.key = (check_table_name(table), check_table_name(dead_letter_table),
                                                        check_name(key, "key column"))

    def __call__(self, db):
        """The :class:`~dw_dagster.pipelines.sink.SinkTable` as ``db``'s catalog has the target now."""
        from dw_dagster.pipelines.sink import sink_table_from_catalog

        return sink_table_from_catalog(db, self.table, self.dead_letter_table, self.key)

    def prepare(self, db) -> None:
        """Create the replay ledger and the view of the rows still parked, when missing."""
        from dw_dagster.changes.replay import ReplaySpec, ensure_replay_tables

        ensure_replay_tables(db, ReplaySpec.for_sink_table(self(db), expected_rows=0))


def _mage_source(cfg: DataOpsConfig, a: WatchedAssetConfig, resources: dict):
    """The asset's Mage pipelines (``assets[].mage``) with the server's settings, adding the ``mage``
    resource once; None without them, or when an ``optional`` Mage has no URL now."""
    m = cfg.integrations.mage
    if a.mage is None or m is None:
        return None
    from dw_dagster.integrations.mage import URL_ENV, MageResource
    from dw_dagster.diagnosis.mage_evidence import MageSource

    if m.optional and not (m.url or os.environ.get(URL_ENV)):
        return None
    if "mage" not in resources:
        env = lambda name: dg.EnvVar(name) if os.environ.get(name) else None  # noqa: E731 - read at run time when set
        resources["mage"] = MageResource(url=m.url, ui_url=m.ui_url, api_key=env(m.api_key_env),
                                         email=env(m.email_env), password=env(m.password_env))
    return MageSource(writes=a.mage.writes, reads=tuple(a.mage.reads), resource_key="mage",
                      lookback=dt.timedelta(hours=a.mage.lookback_hours), rerun_timeout_s=m.rerun_timeout_s,
                      poll_s=m.poll_s)


def _credentials_set(*names: str) -> bool:
    return all(os.environ.get(n) for n in names)


def _lightup_credentials_set() -> bool:
    from dw_dagster.integrations.lightup import CREDENTIAL_FILE_ENV, REFRESH_TOKEN_ENV, SERVER_ENV

    return _credentials_set(CREDENTIAL_FILE_ENV) or _credentials_set(SERVER_ENV, REFRESH_TOKEN_ENV)


def _integrations(cfg: DataOpsConfig, resources: dict, diagnosis_job_name: str, domains, status):
    """Lightup, PagerDuty and Slack as configured (their secrets read from the named env vars at run
    time); an ``optional`` one whose credentials are not in the environment now is left out."""
    from dw_dagster.approval.autonomy import build_expiry_sensor

    integ = cfg.integrations
    lightup = integ.lightup if integ.lightup and (not integ.lightup.optional or _lightup_credentials_set()) else None
    pager = (integ.pagerduty if integ.pagerduty and (not integ.pagerduty.optional
                                                     or _credentials_set(integ.pagerduty.routing_key_env)) else None)
    slack = integ.slack if integ.slack and (not integ.slack.optional or _credentials_set(integ.slack.bot_token_env)) else None
    checks, sensors = [], []
    if lightup is not None:
        from dw_dagster.integrations.lightup import LightupResource
        from dw_dagster.detection.lightup import build_lightup_compare_check, build_lightup_incident_sensor

        resources["lightup"] = LightupResource(workspace=lightup.workspace)
        sensors.append(build_lightup_incident_sensor(table_assets={t: _key(k) for t, k in lightup.tables.items()},
                                                     diagnosis_job_name=diagnosis_job_name, domains=domains,
                                                     default_status=status))
        if lightup.compare_metrics:
            watched = {a.key for a in cfg.assets}
            target = lightup.compare_asset or next((k for k in lightup.tables.values() if k in watched),
                                                   next(iter(lightup.tables.values()), None))
            if target is None:
                raise DwConfigError("integrations.lightup.compare_asset: no asset for the compare check (tables is empty)")
            checks.append(build_lightup_compare_check(asset=_key(target), compare_metric_uuids=lightup.compare_metrics))
    if pager is not None:
        from dw_dagster.integrations.pagerduty import PagerDutyResource

        token = pager.api_token_env if pager.api_token_env and (not pager.optional or _credentials_set(pager.api_token_env)) else None
        resources["pager"] = PagerDutyResource(
            routing_key=dg.EnvVar(pager.routing_key_env), api_token=dg.EnvVar(token) if token else None,
            from_email=pager.from_email, events_base_url=pager.events_url, rest_base_url=pager.api_url)
    if slack is not None:
        from dw_dagster.integrations.slack import SlackResource

        resources["slack"] = SlackResource(bot_token=dg.EnvVar(slack.bot_token_env), base_url=slack.api_url,
                                           default_channel=slack.channel)
    sensors.append(build_expiry_sensor(domains=domains, default_status=status))
    tickets, email = tickets_and_email(integ, resources)
    if lightup or pager or slack or tickets or email:
        from dw_dagster.integrations.notifications import build_notification_sensor

        sensors.append(build_notification_sensor(
            dagster_url=integ.dagster_url, location_name=cfg.location_name, review_url=integ.review_url,
            lightup_resource_key="lightup" if lightup else None,
            pager_resource_key="pager" if pager else None,
            slack_resource_key="slack" if slack else None, slack_channel=slack.channel if slack else None,
            email_resource_key="email" if email else None, ticket_resource_keys=tickets, domains=domains,
            default_status=status))
    return checks, sensors


__all__ = ["build_dw_definitions", "build_warehouse_change_definitions", "dbt_asset_keys", "dbt_executable",
           "prepare_manifest"]
