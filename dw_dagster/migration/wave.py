"""One asset per wave (``migration/<migration>/<wave>``) and the job that evaluates it.

The wave job (``dw_migration__<migration>__<wave>``) runs the wave's parity checks and then
materializes the wave asset (its op has a low ``dagster/priority``, so it runs after the checks
of its run, and it waits for their evaluations under an executor that runs steps side by side).
Each materialization records, per pair, its parity state as a table (``dw/migration_pairs``),
the wave's state and JSON, and numbers the UI plots over time: ``dw/pairs_holding``,
``dw/pairs_total``, ``dw/rows_compared``, ``dw/largest_gap_pct``; then the gate moves
(:func:`~dw_dagster.migration.gate.gate_step`). An optional schedule runs every wave job.
"""

from __future__ import annotations

import time

import dagster as dg

from dw_dagster.core import keys as k
from dw_dagster.core.domains import DomainsSource
from dw_dagster.migration.checks import wave_check_keys
from dw_dagster.migration.config import MigrationConfig, WaveConfig, wave_asset_key, wave_job_name
from dw_dagster.migration.state import WaveState, read_wave_state

#: seconds the wave op waits for its run's check evaluations (steps side by side)
EVALUATION_WAIT_S = 300.0


def wave_metadata(ws: WaveState) -> dict:
    """The wave asset's materialization metadata (module docstring)."""
    from dw_dagster.checks.metadata import metadata_table

    rows = [{"pair": p.pair, "target": p.target, "state": p.state, "streak": p.streak,
             "rows_compared": p.rows_compared, "gap_pct": p.gap_pct} for p in ws.pairs]
    signed = ws.gate.get("signed_off") or {}
    return {
        k.SUMMARY_KEY: f"{ws.state}: {ws.holding}/{len(ws.pairs)} pairs holding"
                       + (f"; signed off by {signed.get('by')} ({signed.get('method')})" if signed else ""),
        k.MIGRATION_STATE_KEY: ws.state,
        k.MIGRATION_PAIRS_TABLE_KEY: metadata_table(rows, [("pair", "text"), ("target", "text"), ("state", "text"),
                                                           ("streak", "int"), ("rows_compared", "int"),
                                                           ("gap_pct", "float")]),
        k.MIGRATION_PAIRS_HOLDING_KEY: ws.holding,
        k.MIGRATION_PAIRS_TOTAL_KEY: len(ws.pairs),
        k.MIGRATION_ROWS_COMPARED_KEY: sum(p.rows_compared for p in ws.pairs),
        k.MIGRATION_LARGEST_GAP_KEY: max((abs(p.gap_pct) for p in ws.pairs), default=0.0),
        k.MIGRATION_EVIDENCE_HASH_KEY: ws.evidence_hash or signed.get("evidence_hash") or "",
        k.MIGRATION_WAVE_KEY: dg.MetadataValue.json(ws.as_json()),
    }


def wave_materialization(ws: WaveState) -> dg.AssetMaterialization:
    """The wave's state as a materialization of its asset (logged by the sign-off step)."""
    return dg.AssetMaterialization(asset_key=wave_asset_key(ws.migration, ws.wave), metadata=wave_metadata(ws),
                                   description=f"wave {ws.wave} of {ws.migration}: {ws.state}")


def _wait_for_evaluations(context: dg.AssetExecutionContext, wanted: set[dg.AssetCheckKey]) -> None:
    """Wait until this run recorded an evaluation of every wanted check (or the wait ends)."""
    deadline = time.monotonic() + EVALUATION_WAIT_S
    while True:
        seen = {dg.AssetCheckKey(e.dagster_event.event_specific_data.asset_key, e.dagster_event.event_specific_data.check_name)
                for e in context.instance.all_logs(context.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)}
        if wanted <= seen or time.monotonic() > deadline:
            return
        time.sleep(1.0)


def build_wave_asset(migration: MigrationConfig, wave: WaveConfig, *, domains: DomainsSource, resource_key: str,
                     lightup: bool = True) -> dg.AssetsDefinition:
    """The wave's asset: its materialization reads the wave's state and moves the gate (module docstring)."""
    from dw_dagster.migration.gate import gate_step

    key = wave_asset_key(migration.name, wave.name)
    checks = set(wave_check_keys(wave, lightup))

    @dg.asset(key=key, deps=[dg.AssetKey.from_user_string(p.target.asset) for p in wave.pairs],
              group_name=f"migration_{migration.name}", kinds={"dw"}, op_tags={"dagster/priority": "-10"},
              owners=None, tags={k.MIGRATION_TAG: migration.name, k.WAVE_TAG: wave.name},
              description=f"Wave {wave.name} of migration {migration.name}: {len(wave.pairs)} table pairs, owned by "
                          f"domain {wave.domain}; per pair its parity state, and the completion gate.")
    def _wave(context):
        selected = {c for c in checks if c in set(context.selected_asset_check_keys or ())} or checks
        _wait_for_evaluations(context, selected)
        ws = read_wave_state(context.instance, migration, wave, current_run=context.run_id, lightup=lightup)
        events = gate_step(context.instance, migration, wave, ws, domains, resource_key=resource_key,
                           run_id=context.run_id)
        for event in events:
            context.log_event(event)
        if events:  # the gate moved (a request, a withdrawal, a reopening): the pairs' states follow it
            ws = read_wave_state(context.instance, migration, wave, current_run=context.run_id, lightup=lightup)
        context.log.info(f"wave {wave.name}: {ws.state}, {ws.holding}/{len(ws.pairs)} pairs holding")
        return dg.MaterializeResult(metadata=wave_metadata(ws))

    return _wave


def build_wave_job(migration: MigrationConfig, wave: WaveConfig, *, lightup: bool = True):
    """The wave's job: its parity checks, then its asset (tags name the migration and the wave)."""
    return dg.define_asset_job(
        wave_job_name(migration.name, wave.name),
        selection=dg.AssetSelection.assets(wave_asset_key(migration.name, wave.name))
        | dg.AssetSelection.checks(*wave_check_keys(wave, lightup)),
        tags={k.MIGRATION_TAG: migration.name, k.WAVE_TAG: wave.name},
        description=f"Evaluate the parity of wave {wave.name} of migration {migration.name} and move its gate.")


def build_migration_schedule(migration: MigrationConfig, jobs: list) -> list[dg.ScheduleDefinition]:
    """One schedule per wave job on the migration's cron (none without ``schedule``)."""
    if not migration.schedule:
        return []
    return [dg.ScheduleDefinition(name=f"{k.MIGRATION_SCHEDULE_PREFIX}{migration.name}__{w.name}",
                                  cron_schedule=migration.schedule, job=job)
            for w, job in zip(migration.waves, jobs)]


__all__ = ["build_migration_schedule", "build_wave_asset", "build_wave_job", "wave_materialization", "wave_metadata"]
