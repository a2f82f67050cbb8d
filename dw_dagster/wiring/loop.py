"""The loop's parts per watched asset, gathered for :func:`~dw_dagster.definitions.build_dw_definitions`:
the configuration read, its domains and partitions checked, then :class:`LoopWiring` takes the
watched assets one by one (checks, detection and verification keys, each asset's diagnoser and
step runners) and builds the jobs, sensors and resources of one ``Definitions``."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from dw_dagster.config import DataOpsConfig, WatchedAssetConfig
from dw_dagster.core import keys as dwk
from dw_dagster.core.domains import DomainsFileError, DomainsSource, resolve_domains
from dw_dagster.errors import DwConfigError
from dw_dagster.wiring.checks import SinkRef, asset_key, check_key, checks_for
from dw_dagster.wiring.dbt import dbt_asset_keys, dbt_incremental
from dw_dagster.wiring.fixes import CauseFixes
from dw_dagster.wiring.integrations import integration_definitions, migration_definitions
from dw_dagster.wiring.warehouse import not_a_warehouse_change


def load_config(config, *, base_dir, scope, config_source) -> tuple[DataOpsConfig, Path, Any]:
    """The configuration, the folder its relative paths resolve against, and where it was read from."""
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
    return cfg, base, config_source


def resolver(base: Path) -> Callable[[str], Path]:
    """A configured path, absolute (relative ones against ``base``)."""

    def path(p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else (base / q).resolve()

    return path


def domains_source(cfg: DataOpsConfig, config, path: Callable[[str], Path]) -> DomainsSource:
    """The domains: read when used (edits apply at once), validated now so a mistake shows at load."""
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
    return domains


def watched_partitions(watched: Sequence[dg.AssetKey], assets: Sequence[dg.AssetsDefinition | dg.AssetSpec],
                       partitions_def: dg.TimeWindowPartitionsDefinition | None):
    """The watched assets' one time-window partitions definition: the given one, else the assets' own."""
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
    return partitions_def


class LoopWiring:
    """What the watched assets add to the loop, gathered one asset at a time, then built into the
    loop's ``Definitions`` (:meth:`definitions`)."""

    def __init__(self, cfg: DataOpsConfig, *, path: Callable[[str], Path], resources: dict[str, Any],
                 domains: DomainsSource, partitions_def, manifest_path: Path | None, translator, config_source) -> None:
        from dw_dagster.lineage import load_manifest

        self.cfg, self.path, self.resources, self.domains = cfg, path, resources, domains
        self.partitions_def, self.manifest_path, self.translator = partitions_def, manifest_path, translator
        self.keys_by_uid = dbt_asset_keys(load_manifest(manifest_path), translator) if manifest_path else {}
        self.dbt_dir = path(cfg.dbt.project_dir) if cfg.dbt is not None and cfg.dbt.project_dir else None
        self.manifest_fn = (lambda: manifest_path) if manifest_path else None
        self.checks: list[dg.AssetChecksDefinition] = []
        self.detect_keys: list[dg.AssetCheckKey] = []
        self.verify_keys: list[dg.AssetCheckKey] = []
        self.diagnosers: dict[tuple[str, ...], Any] = {}
        self.pipeline_root: Path | None = None
        self.step_runners: dict[str, Any] = {}
        self.dbt_window_target: str | None = None
        self.dbt_windowed = False  # a dbt_incremental asset: its rebuild keeps a snapshot first, as windows do
        self.fixes = CauseFixes()  # the new-tests checks, step runners and upstream assets of the cause fixes
        self.built: list[dg.Definitions] = []
        self.mig = migration_definitions(cfg, resources, domains, config_source)
        self.parity_of: dict[dg.AssetKey, list[dg.AssetCheckKey]] = {}
        for ck in (self.mig.verify_keys if self.mig else []):
            self.parity_of.setdefault(ck.asset_key, []).append(ck)

    def asset_graph(self):
        """The built location's asset graph (None until it is built)."""
        return self.built[0].resolve_asset_graph() if self.built else None

    def add_asset(self, a: WatchedAssetConfig) -> None:
        """One watched asset's checks, detection and verification keys, and its pipeline's diagnoser."""
        from dw_dagster.changes.replay import LEDGER_SUFFIX, REPLAY, REPLAY_UNDO, ReplaySpec, pending_view_name
        from dw_dagster.changes.replay import run_replay_step, run_replay_undo_step
        from dw_dagster.repair.replay_checks import build_replay_checks

        key = asset_key(a.key)
        sink = a.pipeline.dead_letter_sink if a.pipeline else None
        sink_table = None
        if sink is not None:
            sink_table = SinkRef(table=a.table, dead_letter_table=sink.dead_letter_table, key=sink.key)
        view = pending_view_name(ReplaySpec(target_table=a.table, dead_letter_table=sink.dead_letter_table,
                                            ledger_table=sink.dead_letter_table + LEDGER_SUFFIX, key=sink.key,
                                            columns=[], expected_rows=0)) if sink else None
        own = checks_for(a, view, sink_table.prepare if sink_table is not None else None, self.partitions_def)
        self.checks += own
        names = [next(iter(c.check_keys)).name for c in own]
        self.detect_keys += [dg.AssetCheckKey(key, n) for n in (a.detect if a.detect is not None else names)]
        asset_verify = [dg.AssetCheckKey(key, n) for n in names] + self.parity_of.get(key, [])  # a migrated pair's parity
        if sink is not None:
            replay_checks = build_replay_checks(asset=key, sink_table=sink_table, resource_key=a.database)
            self.checks += replay_checks
            asset_verify += [next(iter(c.check_keys)) for c in replay_checks]
            self.step_runners.update({REPLAY: run_replay_step, REPLAY_UNDO: run_replay_undo_step})
        mage_source = _mage_source(self.cfg, a, self.resources)
        if mage_source is not None and mage_source.reads:
            from dw_dagster.repair.mage_rerun import build_mage_rerun_check

            rerun_check = build_mage_rerun_check(asset=key, pipelines=mage_source.reads, resource_key=mage_source.resource_key,
                                                 timeout_s=mage_source.rerun_timeout_s, poll_s=mage_source.poll_s)
            self.checks.append(rerun_check)
            asset_verify.append(next(iter(rerun_check.check_keys)))
        try:
            asset_verify += [check_key(s) for s in a.verify]
        except DwConfigError as e:
            raise DwConfigError(f"assets[{a.key}].verify: {e}") from e
        self.verify_keys += asset_verify
        if a.pipeline is None:
            return
        own_verify = [[*k.asset_key.path, k.name] for k in dict.fromkeys(asset_verify)]
        if a.pipeline.incremental_load is not None:
            self._incremental_load(a, key, own_verify)
        elif a.pipeline.recorded_load is not None:
            self._recorded_load(a, key, own_verify)
        elif a.pipeline.dbt_incremental is not None:
            self._dbt_incremental(a, key, own_verify)
        else:
            self._dead_letter_sink(a, key, own_verify, sink, sink_table, mage_source)

    def _incremental_load(self, a: WatchedAssetConfig, key: dg.AssetKey, own_verify: list[list[str]]) -> None:
        from dw_dagster.diagnosis.job import IncrementalLoadDiagnoser
        from dw_dagster.proposals.watermark import DbtCountTest

        il = a.pipeline.incremental_load
        repo = self.path(il.repo)
        if not (repo / il.file).exists():
            raise DwConfigError(f"assets[{a.key}].pipeline.incremental_load.file: {repo / il.file} does not exist")
        self.pipeline_root = repo
        self.diagnosers[tuple(key.path)] = IncrementalLoadDiagnoser(
            target_asset=key, source_resource_key=il.source_database, target_resource_key=a.database,
            pipeline_root=lambda r=repo: r, pipeline_file=il.file,
            manifest_path=self.manifest_fn, partitions_def=self.partitions_def, domains_file=self.domains,
            dbt_asset_keys=self.keys_by_uid, verify_checks=own_verify, group_by=il.group_by,
            dbt_test=DbtCountTest(model=il.dbt_test.dbt_model, count_column=il.dbt_test.count_column,
                                  source_name=il.dbt_test.source_name, source_table=il.dbt_test.source_table,
                                  group=il.dbt_test.group) if il.dbt_test else None,
            asset_graph=self.asset_graph,
            **self.fixes.diagnoser_settings(il, cfg=self.cfg, a=a, key=key, repo=repo, dbt_project_dir=self.dbt_dir))

    def _recorded_load(self, a: WatchedAssetConfig, key: dg.AssetKey, own_verify: list[list[str]]) -> None:
        from dw_dagster.diagnosis.job import RecordedLoadDiagnoser

        rl = a.pipeline.recorded_load
        field = f"assets[{a.key}].pipeline.recorded_load"
        repo = self.path(rl.repo)
        self.pipeline_root = _one_repo(self.pipeline_root, repo, f"{field}.repo")
        _check_settings_file(repo / rl.settings_file, (rl.watermark_key, rl.lookback_key), f"{field}.settings_file")
        self.diagnosers[tuple(key.path)] = RecordedLoadDiagnoser(
            target_asset=key, source_resource_key=rl.source_database, target_resource_key=a.database,
            pipeline_root=lambda r=repo: r, pipeline_file=rl.settings_file,
            manifest_path=self.manifest_fn, partitions_def=self.partitions_def, domains_file=self.domains,
            dbt_asset_keys=self.keys_by_uid, verify_checks=own_verify, group_by=rl.group_by, dbt_test=_dbt_test(rl.dbt_test),
            asset_graph=self.asset_graph,
            source_table=rl.source_table, target_table=a.table, key_column=rl.key,
            partition_column=rl.partition_column, arrival_column=rl.arrival_column,
            watermark_key=rl.watermark_key, lookback_key=rl.lookback_key,
            **self.fixes.diagnoser_settings(rl, cfg=self.cfg, a=a, key=key, repo=repo, dbt_project_dir=self.dbt_dir))

    def _dbt_incremental(self, a: WatchedAssetConfig, key: dg.AssetKey, own_verify: list[list[str]]) -> None:
        cfg, path = self.cfg, self.path
        di = a.pipeline.dbt_incremental
        field = f"assets[{a.key}].pipeline.dbt_incremental"
        repo = path(di.repo)
        self.pipeline_root = _one_repo(self.pipeline_root, repo, f"{field}.repo")
        self.diagnosers[tuple(key.path)], runner = dbt_incremental(
            di, field, key=key, table=a.table, database=a.database, repo=repo, project_dir=path(cfg.dbt.project_dir),
            profiles_dir=path(cfg.dbt.profiles_dir) if cfg.dbt.profiles_dir else None, manifest_path=self.manifest_path,
            domains=self.domains, dbt_asset_keys=self.keys_by_uid, verify_checks=own_verify, translator=self.translator,
            asset_graph=self.asset_graph)
        if self.dbt_window_target not in (None, di.dbt_target):
            raise DwConfigError(f"{field}.dbt_target: {di.dbt_target!r} is not {self.dbt_window_target!r}, the target of "
                                "another dbt_incremental asset; one code location rebuilds with one dbt target")
        self.dbt_window_target, self.dbt_windowed = di.dbt_target, True
        self.step_runners[runner[0]] = runner[1]

    def _dead_letter_sink(self, a: WatchedAssetConfig, key: dg.AssetKey, own_verify: list[list[str]], sink, sink_table,
                          mage_source) -> None:
        from dw_dagster.diagnosis.sink_diagnoser import DeadLetterDiagnoser

        volume = next((dg.AssetCheckKey(key, c.name) for kind, c in a.checks.configured() if kind == "volume"), None)
        self.diagnosers[tuple(key.path)] = DeadLetterDiagnoser(
            target_asset=key, sink_table=sink_table, source_table=sink.source_table,
            source_resource_key=sink.source_database, target_resource_key=a.database,
            partition_column=sink.partition_column, group_column=sink.group_column,
            volume_check=volume or dg.AssetCheckKey(key, dwk.VOLUME_CHECK), manifest_path=self.manifest_fn,
            dbt_asset_keys=self.keys_by_uid, domains_file=self.domains, verify_checks=own_verify, mage=mage_source)

    def _add_fixes_and_migration(self) -> None:
        """The cause fixes' checks and step runners, and the migration's parts."""
        cfg, path, dbt_dir, mig = self.cfg, self.path, self.dbt_dir, self.mig
        self.checks += self.fixes.checks()
        self.verify_keys += self.fixes.verify_keys()
        self.step_runners.update(self.fixes.step_runners(pipeline_root=self.pipeline_root, dbt_project_dir=dbt_dir,
                                                         dbt_profiles_dir=(path(cfg.dbt.profiles_dir) if dbt_dir is not None
                                                                           and cfg.dbt.profiles_dir else None)))
        if mig is not None:
            self.checks += mig.checks
            self.detect_keys += mig.detect_keys
            self.verify_keys += mig.verify_keys
            self.step_runners.update(mig.step_runners)
            for target, diagnoser in mig.diagnosers.items():
                self.diagnosers.setdefault(target, diagnoser)  # a watched asset's own pipeline diagnoses it first

    def definitions(self, executor: dg.ExecutorDefinition | None) -> dg.Definitions:
        """The loop's jobs and sensors over what the assets added, with the resources, as one ``Definitions``."""
        from dw_dagster.approval.job import build_approval_job
        from dw_dagster.detection.incidents import build_check_incident_sensor
        from dw_dagster.diagnosis.job import build_diagnosis_job
        from dw_dagster.receipts.job import build_receipt_job
        from dw_dagster.guard.stop import build_control_jobs, control_asset_spec
        from dw_dagster.guard.admission import guarded_executor
        from dw_dagster.repair.jobs import build_rebuild_job, build_verify_job, build_window_job
        from dw_dagster.repair.sensor import build_remediation_sensor
        from dw_dagster.repair.steps import build_step_jobs
        from dw_dagster.repair.undo import build_undo_jobs

        self._add_fixes_and_migration()
        cfg, resources, domains, mig, partitions_def = self.cfg, self.resources, self.domains, self.mig, self.partitions_def
        db_keys = sorted(cfg.databases)
        status = dg.DefaultSensorStatus.RUNNING if cfg.sensors_running else dg.DefaultSensorStatus.STOPPED
        diagnosis_job = build_diagnosis_job(diagnoser=ByAsset(self.diagnosers), domains=domains,
                                            required_resource_keys=db_keys + (["mage"] if "mage" in resources else []))
        windowed = [asset_key(a.key) for a in cfg.assets if a.pipeline is not None
                    and (a.pipeline.incremental_load is not None or a.pipeline.recorded_load is not None)]
        windowed += [k for k in self.fixes.upstream_assets if k not in windowed]  # an upstream fix reruns them first
        # without a partitions definition at hand, the job takes the assets' own when the location resolves
        guarded = guarded_executor(executor or dg.in_process_executor)
        window_job = build_window_job(dwk.WINDOW_JOB, windowed, partitions_def, executor=guarded) if windowed else None
        downstream = dg.AssetSelection.assets(*[asset_key(a.key) for a in cfg.assets]).downstream(include_self=False)
        rebuild_job = build_rebuild_job(dwk.REBUILD_JOB, downstream, executor=guarded)
        verify_job = build_verify_job(dwk.VERIFY_JOB, list(dict.fromkeys(self.verify_keys)), executor=guarded)
        from dw_dagster.wiring.bi import bi_refresh_factory

        receipt_job = build_receipt_job(executor=guarded if executor is not None else None,
                                        bi_refresh=bi_refresh_factory(cfg.integrations))
        undo_jobs = build_undo_jobs(db_keys, executor=guarded)
        step_jobs = build_step_jobs(self.step_runners, resource_keys=db_keys, executor=guarded)
        stop_job, resume_job = build_control_jobs(domains)
        sensors = [
            build_check_incident_sensor(check_keys=list(dict.fromkeys(self.detect_keys)), diagnosis_job_name=diagnosis_job.name,
                                        domains=domains, default_status=status, minimum_interval_seconds=cfg.sensor_interval_seconds),
            build_remediation_sensor(partitions_def=partitions_def, partitions_of=windowed[0] if windowed else None,
                                     window_job=window_job, rebuild_job=rebuild_job,
                                     verify_job=verify_job, receipt_job=receipt_job, pipeline_root=self.pipeline_root,
                                     undo_jobs=undo_jobs if window_job is not None or self.dbt_windowed else None,
                                     step_jobs=step_jobs,
                                     domains=domains, default_status=status, accepts=not_a_warehouse_change,
                                     minimum_interval_seconds=cfg.sensor_interval_seconds),
        ]
        more_checks, more_sensors = integration_definitions(cfg, resources, diagnosis_job.name, domains, status)
        defs = dg.Definitions(
            assets=[control_asset_spec(), *(mig.assets if mig else [])],
            asset_checks=[*self.checks, *more_checks],
            jobs=[j for j in (diagnosis_job, build_approval_job(domains), window_job, rebuild_job, verify_job, receipt_job,
                              stop_job, resume_job, *undo_jobs, *step_jobs.values(), *(mig.jobs if mig else []))
                  if j is not None],
            schedules=mig.schedules if mig else [],
            sensors=[*sensors, *more_sensors],
            resources=resources,
            executor=guarded,
        )
        self.built.append(defs)
        return defs


class ByAsset:
    """The diagnosis job's diagnoser: the watched asset's own (by the incident's asset key)."""

    def __init__(self, diagnosers: Mapping[tuple[str, ...], Any]) -> None:
        self.diagnosers = dict(diagnosers)

    def __call__(self, context: dg.OpExecutionContext, incident):
        d = self.diagnosers.get(tuple(incident.asset_key))
        if d is None:
            raise dg.Failure(description=f"no pipeline is configured for {'/'.join(incident.asset_key)}: "
                             "dw_dagster records the incident but cannot diagnose it (add pipeline: to the asset)")
        return d(context, incident)


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
