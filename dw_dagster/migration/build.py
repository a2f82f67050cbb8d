"""What a configured migration adds to the loop's ``Definitions`` (called by :func:`~dw_dagster.definitions.build_dw_definitions`).

Per wave: the parity multi-check on the pairs' target assets, the wave asset, the wave job and,
with ``schedule``, a schedule. For the loop: the parity checks are watched by the incident sensor
(a failing pair opens an incident) and proved by the verify stage; a target asset without a
pipeline of its own is diagnosed from its parity evidence (:mod:`dw_dagster.migration.diagnose`);
the ``wave_sign_off`` step runner records sign-offs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from dw_dagster.core import keys as k
from dw_dagster.migration.config import MigrationConfig
from dw_dagster.migration.resolve import ConfigSource, check_references, resolve_migration


@dataclass
class MigrationDefs:
    """The pieces a migration contributes."""

    checks: list = field(default_factory=list)
    assets: list = field(default_factory=list)
    jobs: list = field(default_factory=list)
    schedules: list = field(default_factory=list)
    detect_keys: list[dg.AssetCheckKey] = field(default_factory=list)
    verify_keys: list[dg.AssetCheckKey] = field(default_factory=list)
    step_runners: dict[str, Any] = field(default_factory=dict)
    diagnosers: dict[tuple[str, ...], Any] = field(default_factory=dict)


def build_migration(migration: MigrationConfig, *, resources: Mapping[str, Any], database_names: list[str], domains,
                    lightup_resource_key: str | None, source: ConfigSource | None = None,
                    domains_model=None) -> MigrationDefs:
    """Resolve the migration against the catalogs and build its definitions.

    Raises:
        DwConfigError: an unknown database, domain, table or column (``file:line: field: problem``).
    """
    from dw_dagster.migration.checks import build_wave_parity_check, wave_check_keys
    from dw_dagster.migration.diagnose import MigrationPairDiagnoser
    from dw_dagster.migration.gate import make_sign_off_runner
    from dw_dagster.migration.wave import build_migration_schedule, build_wave_asset, build_wave_job

    check_references(migration, database_names, domains_model, source)
    if migration.resolve_at_load:
        opened: dict[str, Any] = {}

        def open_database(name: str):
            if name not in opened:
                res = resources.get(name)
                try:
                    opened[name] = res.get_database() if res is not None else None
                except Exception:  # noqa: BLE001 - unreachable at load: checked when the checks run
                    opened[name] = None
            return opened[name]

        resolve_migration(migration, open_database, source)
    out = MigrationDefs()
    lightup = lightup_resource_key is not None
    for wave in migration.waves:
        resource_key = wave.pairs[0].target.database
        out.checks.append(build_wave_parity_check(migration, wave, lightup_resource_key=lightup_resource_key))
        out.assets.append(build_wave_asset(migration, wave, domains=domains, resource_key=resource_key, lightup=lightup))
        out.jobs.append(build_wave_job(migration, wave, lightup=lightup))
        keys = wave_check_keys(wave, lightup)
        out.detect_keys += keys
        out.verify_keys += keys
        for p in wave.pairs:
            out.diagnosers[tuple(dg.AssetKey.from_user_string(p.target.asset).path)] = MigrationPairDiagnoser(
                migration=migration, wave=wave, pair=p, domains=domains)
    out.schedules = build_migration_schedule(migration, out.jobs)
    out.step_runners[k.WAVE_SIGN_OFF] = make_sign_off_runner({migration.name: migration}, lightup=lightup)
    return out


__all__ = ["MigrationDefs", "build_migration"]
