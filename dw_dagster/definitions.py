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

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from dw_dagster.dagster_private import public

from dw_dagster.config import DataOpsConfig
from dw_dagster.databases import DatabaseResource
from dw_dagster.wiring.checks import asset_key
from dw_dagster.wiring.dbt import dbt_asset_keys, dbt_executable, dbt_manifest, prepare_manifest
from dw_dagster.wiring.loop import LoopWiring, domains_source, load_config, resolver, watched_partitions
from dw_dagster.wiring.warehouse import build_warehouse_change_definitions


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
    cfg, base, config_source = load_config(config, base_dir=base_dir, scope=scope, config_source=config_source)
    path = resolver(base)
    domains = domains_source(cfg, config, path)
    resources: dict[str, Any] = {name: DatabaseResource(url=d.url) for name, d in cfg.databases.items() if d.url}
    partitions_def = watched_partitions([asset_key(a.key) for a in cfg.assets], assets, partitions_def)
    wiring = LoopWiring(cfg, path=path, resources=resources, domains=domains, partitions_def=partitions_def,
                        manifest_path=dbt_manifest(cfg, path), translator=dbt_translator, config_source=config_source)
    for a in cfg.assets:  # checks, detection and verification per asset
        wiring.add_asset(a)
    return wiring.definitions(executor)


__all__ = ["build_dw_definitions", "build_warehouse_change_definitions", "dbt_asset_keys", "dbt_executable",
           "prepare_manifest"]
