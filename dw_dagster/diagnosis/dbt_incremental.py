"""Diagnosis of a dbt incremental model: the late-rows cause over the runs its wrapper recorded.

A dbt incremental model is not partitioned: each run reads the source rows above the high-watermark
it found (:mod:`dw_dagster.pipelines.dbt_incremental`). The run responsible for a source row is the
last run whose lower bound (``watermark_low``) was below the row's watermark: it would have read
the row had the row been in the source when it started. So the recorded runs, taken from the
latest back, split the watermark axis into ranges ``(low_k, min(low_j for every later run j)]``,
each with that run's source snapshot; a full refresh (low None) ends the chain. Split by UTC day,
these ranges are the "partitions" :func:`~dw_dagster.diagnosis.causes.watermark.diagnose_late_rows`
tests with the watermark column as the partition column: a source row at or below the latest
run's bound that arrived after the snapshot of the run responsible for it, and is missing from the
model, is a late row.

Only runs recorded by :func:`~dw_dagster.pipelines.dbt_incremental.dbt_incremental_build` (or the
``dbt_window`` step) count; a materialization of the model without the record read something
unknown and is reported in the log.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from dw_dagster.core import records
from dw_dagster.core.domains import resolve_domains
from dw_dagster.core.models import BlastRadius, ChangeSet, Diagnosis, Incident
from dw_dagster.diagnosis.causes.watermark import PartitionLoad
from dw_dagster.diagnosis.job import IncrementalLoadDiagnoser, LoadShape, _naive
from dw_dagster.pipelines.dbt_incremental import INCREMENTAL_RUN_KEY, DbtIncrementalModel, DbtIncrementalRun, incremental_model
from dw_dagster.proposals.dbt_incremental import propose_dbt_incremental_fix

_TICK = dt.timedelta(microseconds=1)


def run_ranges(runs: list[DbtIncrementalRun]) -> list[tuple[dt.datetime | None, dt.datetime | None, DbtIncrementalRun]]:
    """``(above, up_to, run)``: the watermark values each run was the last to be able to read.

    Args:
        runs: recorded runs, oldest first.

    Returns:
        For each run still responsible for something, ``(low, upper)`` meaning watermark values
        ``low < w <= upper`` (``None`` low: from the beginning; ``None`` upper: no end), newest first.
    """
    out, upper = [], None
    for run in reversed(runs):
        low = run.watermark_low
        if upper is not None and low is not None and low >= upper:
            continue  # a later run's bound is lower: it is responsible for everything this one was
        out.append((low, upper, run))
        if low is None:
            break  # read every row: nothing before it is responsible for anything
        upper = low if upper is None else min(upper, low)
    return out


def day_loads(ranges, first: dt.datetime, last: dt.datetime) -> list[PartitionLoad]:
    """The ranges of :func:`run_ranges` clipped to ``[first, last)`` and split by UTC day."""
    loads = []
    for low, upper, run in ranges:
        start = max(first, low + _TICK) if low is not None else first
        end = min(last, upper + _TICK) if upper is not None else last
        day = dt.datetime.combine(start.date(), dt.time())
        while day < end:
            nxt = day + dt.timedelta(days=1)
            a, b = max(start, day), min(end, nxt)
            if a < b:
                loads.append(PartitionLoad(day.date().isoformat(), a, b, run.source_snapshot_ts, None))
            day = nxt
    return sorted(loads, key=lambda ld: ld.start)


@dataclass(kw_only=True)
class DbtIncrementalDiagnoser(IncrementalLoadDiagnoser):
    """Diagnoses incidents on a dbt incremental model (module docstring), and proposes its fix.

    ``pipeline_root`` is the git working copy holding the dbt project; ``pipeline_file`` the
    model's SQL file relative to it; ``partitions_def`` is None (the model is not partitioned).

    Attributes:
        model: the dbt model's name.
        project_dir: returns the dbt project directory.
        target_table: the model's table as the warehouse resource reads it (``schema.table``).
        arrival_column: when a row reached the model's source.
        key_column: the key the model merges on; default its ``unique_key`` (one column).
        source_table: the table its watermark follows; default the one the runs recorded.
        scan_runs: how many of the model's latest materializations are read for their records.
        scan_days: without an incident window, the days before the latest high-watermark examined.
        (the other attributes: :class:`~dw_dagster.diagnosis.job.IncrementalLoadDiagnoser`)
    """

    model: str
    project_dir: Callable[[], Path]
    target_table: str
    arrival_column: str
    key_column: str | None = None
    source_table: str | None = None
    scan_runs: int = 200
    scan_days: int = 31

    def _dbt_model(self) -> tuple[dict, DbtIncrementalModel]:
        if self.manifest_path is None:
            raise dg.Failure(description="a dbt incremental model is diagnosed from its dbt project's manifest: configure dbt")
        manifest = json.loads(Path(self.manifest_path()).read_text())
        return manifest, incremental_model(manifest, self.model)

    def _runs(self, context: dg.OpExecutionContext) -> list[tuple[DbtIncrementalRun, float]]:
        """The model's recorded runs (with their materialization time), oldest first."""
        found, unrecorded = [], 0
        for n, rec in enumerate(records.iter_materializations(context.instance, self.target_asset)):
            if n >= self.scan_runs:
                break
            data = records.metadata_json(rec.asset_materialization.metadata, INCREMENTAL_RUN_KEY)
            if data is None:
                unrecorded += 0 if found else 1
                continue
            found.append((DbtIncrementalRun.model_validate(data), rec.timestamp))
        if unrecorded:
            context.log.warning(f"{unrecorded} materialization(s) of {self.target_asset.to_user_string()} after its latest "
                                "recorded run carry no dw/incremental_run (built without dbt_incremental_build): what "
                                "they read is unknown")
        return list(reversed(found))

    def _recorded_loads(self, context: dg.OpExecutionContext, incident: Incident):
        from dw_dagster.core.asset_graph import asset_graph_of

        graph = asset_graph_of(context, self.asset_graph)
        if graph is not None and graph.has(self.target_asset) and graph.get(self.target_asset).partitions_def is not None:
            raise dg.Failure(description=f"{self.target_asset.to_user_string()} is a partitioned dbt model: dw_dagster "
                             "diagnoses unpartitioned incremental models only (a partitioned model's runs read their "
                             "partition's rows, not rows above a high-watermark)")
        runs = self._runs(context)
        if not runs:
            raise dg.Failure(description=f"no recorded runs of {self.target_asset.to_user_string()}; nothing to diagnose "
                             "(build the model with dw_dagster.dbt_incremental_build)")
        latest = runs[-1][0]
        hwm = latest.watermark_low
        if hwm is None:
            return {}, [], None
        if incident.window_start is not None:
            first = _naive(incident.window_start)
        else:
            first = dt.datetime.combine(hwm.date(), dt.time()) - dt.timedelta(days=self.scan_days)
        last = dt.datetime.combine(hwm.date(), dt.time()) + dt.timedelta(days=1)
        loads = day_loads(run_ranges([r for r, _ in runs]), first, last)
        meta: dict[str, dict] = {}
        for ld in loads:
            m = meta.setdefault(ld.partition_key, {"partition_start": ld.start, "partition_end": ld.end,
                                                   "timestamp": runs[-1][1]})
            m["partition_start"], m["partition_end"] = min(m["partition_start"], ld.start), max(m["partition_end"], ld.end)
        return meta, loads, hwm

    def _shape(self, context: dg.OpExecutionContext, loads_meta: Mapping[str, Mapping]) -> LoadShape:
        latest = self._runs(context)[-1][0]
        key = self.key_column
        if key is None:
            unique_key = self._dbt_model()[1].unique_key
            keys = [unique_key] if isinstance(unique_key, str) else list(unique_key or [])
            if len(keys) != 1:
                raise dg.Failure(description=f"model {self.model} has unique_key {unique_key!r}: give the one key column "
                                 "late rows are matched by (key)")
            key = keys[0]
        return LoadShape(source_table=self.source_table or latest.source_table, target_table=self.target_table,
                         merge_key=key, partition_column=latest.watermark_column,
                         watermark_column=latest.watermark_column, arrival_column=self.arrival_column)

    def _partition_keys(self, context, window):
        return None  # not partitioned: the upstream cause compares whole materializations

    def _blast_radius(self) -> BlastRadius:
        from dw_dagster.lineage import blast_radius, manifest_graph

        manifest, model = self._dbt_model()
        return blast_radius(manifest_graph(manifest), [model.unique_id], {u: list(k) for u, k in self.dbt_asset_keys.items()})

    def _propose(self, context: dg.OpExecutionContext, incident: Incident, diagnosis: Diagnosis, finding,
                 br: BlastRadius, shape) -> ChangeSet:
        from dw_dagster.databases.catalog import read_table_schema

        target = getattr(context.resources, self.target_resource_key).get_database()
        columns = {c.name.lower() for c in read_table_schema(target, self.target_table).columns}
        _, model = self._dbt_model()
        return propose_dbt_incremental_fix(
            incident=incident, diagnosis=diagnosis, finding=finding,
            domain=resolve_domains(self.domains_file).for_asset(self.target_asset.path),
            repo_root=self.pipeline_root(), project_dir=self.project_dir(), model=model, dialect=target.dialect,
            key_column=shape.merge_key, arrival_in_model=self.arrival_column.lower() in columns,
            target_resource_key=self.target_resource_key, target_table=self.target_table, source_table=shape.source_table,
            rebuild_assets=[m.asset_key for m in br.models if m.asset_key and list(m.asset_key) != list(self.target_asset.path)],
            verify_checks=self.verify_checks)


__all__ = ["DbtIncrementalDiagnoser", "day_loads", "run_ranges"]
