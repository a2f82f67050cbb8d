"""Execution seconds for engines without billing (DuckDB, PostgreSQL...): Dagster step timings and dbt node timings.

There is no meter to read, so the meter is Dagster's own record of the period's runs:

- each finished step's seconds (``STEP_START`` → end, from the run's step stats), and
- each dbt node's seconds, from dbt's ``run_results.json`` (``execution_time``) as dagster-dbt
  records them on the node's materialization or check evaluation (``Execution Duration``,
  ``unique_id``, ``invocation_id``), or from ``run_results.json`` files given for dbt runs outside
  Dagster (an invocation already seen in a run is not counted twice).

A dbt node's seconds go to its node, its asset (a test's to the asset it tests) and its run; the
rest of a step (dbt's start-up, an asset's own Python) to the step's asset and partition (split
evenly over the asset partitions a step materialized) and its run. Everything is run inside a Dagster run or a dbt node,
so ``unattributed`` is 0 and so is ``idle``: the report still says so with its numbers.

The event log is read only for the period's runs (runs created in it), one query per run for the
step stats and one for its materializations and check evaluations: the cost grows with the
period's runs, not with the event log.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dw_dagster.cost import sqlbuild as sb
from dw_dagster.cost.models import CostError, CostReport, Period

TEMPLATE = """
WITH node_sum AS (
  SELECT run_id, step_key, SUM(seconds) AS seconds FROM nodes WHERE run_id IS NOT NULL GROUP BY run_id, step_key
), step_assets AS (
  SELECT run_id, step_key, asset_key, part, COUNT(*) OVER (PARTITION BY run_id, step_key) AS n
  FROM (SELECT DISTINCT run_id, step_key, asset_key, part FROM assets) AS d
), remainder AS (
  SELECT s.run_id, s.step_key, GREATEST(s.seconds - COALESCE(ns.seconds, 0), 0) AS seconds
  FROM steps AS s LEFT JOIN node_sum AS ns ON ns.run_id = s.run_id AND ns.step_key = s.step_key
), parts AS (
  SELECT run_id, node_id, asset_key, NULL AS part, seconds, 1 AS executions FROM nodes
  UNION ALL
  SELECT r.run_id, NULL, a.asset_key, a.part, r.seconds / COALESCE(a.n, 1), 1
  FROM remainder AS r LEFT JOIN step_assets AS a ON a.run_id = r.run_id AND a.step_key = r.step_key
), pm AS (
  SELECT run_id, node_id, asset_key AS asset, part, 'dagster' AS wh, seconds, executions,
         CASE WHEN node_id IS NOT NULL OR asset_key IS NOT NULL OR run_id IS NOT NULL THEN 'attributed'
              ELSE 'unattributed' END AS mapped
  FROM parts
)
SELECT CASE WHEN GROUPING(part) = 0 THEN 'partition' WHEN GROUPING(node_id) = 0 THEN 'model'
            WHEN GROUPING(asset) = 0 THEN 'asset' WHEN GROUPING(run_id) = 0 THEN 'run'
            WHEN GROUPING(wh) = 0 THEN 'warehouse' ELSE 'mapped' END AS dim,
       CASE WHEN GROUPING(part) = 0 THEN asset || CHR(31) || part ELSE COALESCE(node_id, asset, run_id, wh, mapped) END AS key,
       SUM(seconds) AS amount, SUM(executions) AS queries, NULL AS beside
FROM pm GROUP BY GROUPING SETS ((node_id), (asset), (run_id), (wh), (mapped), (asset, part))
UNION ALL SELECT 'total', 'steps', SUM(seconds), COUNT(*), NULL FROM steps
UNION ALL SELECT 'total', 'outside_runs', SUM(seconds), COUNT(*), NULL FROM nodes WHERE run_id IS NULL
"""

STEPS = [("run_id", "VARCHAR"), ("step_key", "VARCHAR"), ("seconds", "DOUBLE")]
NODES = [("run_id", "VARCHAR"), ("step_key", "VARCHAR"), ("node_id", "VARCHAR"), ("asset_key", "VARCHAR"),
         ("seconds", "DOUBLE")]
ASSETS = [("run_id", "VARCHAR"), ("step_key", "VARCHAR"), ("asset_key", "VARCHAR"), ("part", "VARCHAR")]


@dataclass
class Timings:
    """The rows the statement allocates: finished steps, dbt nodes, the assets (and partitions) each step materialized."""

    steps: list[tuple] = field(default_factory=list)
    nodes: list[tuple] = field(default_factory=list)
    assets: list[tuple] = field(default_factory=list)
    invocations: set[str] = field(default_factory=set)
    unfinished: int = 0


def _value(v: Any) -> Any:
    return getattr(v, "value", v)


def runs_in(instance: Any, period: Period) -> list[Any]:
    """The runs created in ``period`` (one query)."""
    import dagster as dg

    start = period.start.replace(tzinfo=dt.timezone.utc)
    end = period.end.replace(tzinfo=dt.timezone.utc)
    return list(instance.get_runs(filters=dg.RunsFilter(created_after=start, created_before=end)))


def read_runs(instance: Any, runs: Iterable[Any], out: Timings | None = None) -> Timings:
    """Step timings, dbt node timings and materialized assets of ``runs`` from the event log."""
    import dagster as dg

    out = out or Timings()
    kinds = {dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.ASSET_CHECK_EVALUATION}
    for run in runs:
        for st in instance.get_run_step_stats(run.run_id):
            if st.start_time is None or st.end_time is None:
                out.unfinished += 1
                continue
            out.steps.append((run.run_id, st.step_key, max(float(st.end_time) - float(st.start_time), 0.0)))
        for entry in instance.all_logs(run.run_id, of_type=kinds):
            ev = entry.dagster_event
            data = ev.event_specific_data
            mat = getattr(data, "materialization", None)
            md = dict((mat.metadata if mat is not None else getattr(data, "metadata", None)) or {})
            asset = (mat.asset_key if mat is not None else data.asset_key).to_user_string()
            node = _value(md.get("unique_id"))
            if node and md.get("Execution Duration") is not None:
                out.nodes.append((run.run_id, entry.step_key, str(node), asset, float(_value(md["Execution Duration"]))))
                if md.get("invocation_id"):
                    out.invocations.add(str(_value(md["invocation_id"])))
            if mat is not None:
                out.assets.append((run.run_id, entry.step_key, asset, mat.partition))
    return out


class RunTimingsCache:
    """:func:`read_runs` with each finished run read from the event log once (a finished run's steps and
    events do not change); a run still going is read again each time. Thread-safe, at most ``size`` runs kept.

    A long-lived reader (the MCP server answering ``explain_table`` again and again) pays for the runs it
    has not seen yet only.
    """

    def __init__(self, size: int = 2048) -> None:
        import threading
        from collections import OrderedDict

        self._runs: OrderedDict[str, Timings] = OrderedDict()
        self._lock, self._size = threading.Lock(), size

    def read(self, instance: Any, runs: Iterable[Any]) -> Timings:
        """The timings of ``runs``, as :func:`read_runs` gives them."""
        out = Timings()
        for run in runs:
            with self._lock:
                part = self._runs.get(run.run_id)
                if part is not None:
                    self._runs.move_to_end(run.run_id)
            if part is None:
                part = read_runs(instance, [run])
                if run.is_finished:
                    with self._lock:
                        self._runs[run.run_id] = part
                        while len(self._runs) > self._size:
                            self._runs.popitem(last=False)
            out.steps += part.steps
            out.nodes += part.nodes
            out.assets += part.assets
            out.invocations |= part.invocations
            out.unfinished += part.unfinished
        return out


def read_run_results(paths: Sequence[str | Path], node_assets: dict[str, str], out: Timings) -> Timings:
    """dbt nodes of ``run_results.json`` files (``execution_time``), unless their invocation was already
    read from a Dagster run.

    Raises:
        CostError: a file that is missing or not a dbt run_results.json.
    """
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
            invocation = (doc.get("metadata") or {}).get("invocation_id")
            results = doc["results"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CostError(f"{path}: not a dbt run_results.json ({type(e).__name__}: {e})") from None
        if invocation in out.invocations:
            continue
        for res in results:
            uid = res.get("unique_id")
            if uid and res.get("execution_time") is not None:
                out.nodes.append((None, None, uid, node_assets.get(uid), float(res["execution_time"])))
        if invocation:
            out.invocations.add(invocation)
    return out


@dataclass
class DagsterTimingCost:
    """Seconds of the period's Dagster steps and dbt nodes as a cost source (DuckDB and other engines
    without billing).

    Args:
        instance: the Dagster instance whose runs are read.
        run_results: dbt ``run_results.json`` files of dbt runs outside Dagster.
        node_assets: dbt node id → Dagster asset key ``a/b`` for those files' nodes.
        engine: the name the report carries (``duckdb`` by default).
    """

    instance: Any
    run_results: Sequence[str | Path] = ()
    node_assets: dict[str, str] = field(default_factory=dict)
    engine: str = "duckdb"

    unit = "seconds"

    def timings(self, period: Period, runs: Sequence[Any] | None = None) -> Timings:
        t = read_runs(self.instance, runs if runs is not None else runs_in(self.instance, period))
        return read_run_results(self.run_results, self.node_assets, t)

    def report(self, period: Period, runs: Sequence[Any] | None = None) -> CostReport:
        """Seconds of ``period`` (or of ``runs``) by dbt node, asset and run; one statement over the timings."""
        return report_from_timings(self.timings(period, runs), period, engine=self.engine)


def report_from_timings(t: Timings, period: Period, *, engine: str = "duckdb") -> CostReport:
    """Load the timings in an in-memory DuckDB and run :data:`TEMPLATE` over them."""
    from dw_dagster.databases import LocalDuckDB

    local = LocalDuckDB()
    try:
        for name, columns, rows in (("steps", STEPS, t.steps), ("nodes", NODES, t.nodes), ("assets", ASSETS, t.assets)):
            local.load(name, columns, [_batch(columns, rows)] if rows else [])
        text = sb.build(TEMPLATE, "duckdb").sql(dialect="duckdb")
        rows = local.fetch_all(text)
    finally:
        local.close()
    parts = sb.rows_to_parts(rows)
    total = {k: v[0] for k, v in parts.get("total", {}).items()}
    mapped = parts.get("mapped", {})
    att, un = mapped.get("attributed", (0.0, 0, None)), mapped.get("unattributed", (0.0, 0, None))
    steps = parts.get("total", {}).get("steps", (0.0, 0, None))
    outside = parts.get("total", {}).get("outside_runs", (0.0, 0, None))
    report = CostReport(
        period=period, engine=engine, unit="seconds", metered=total.get("steps", 0.0) + total.get("outside_runs", 0.0),
        attributed=att[0], idle=0.0, unattributed=un[0],
        by_model=sb.amounts(parts.get("model", {})), by_asset=sb.amounts(parts.get("asset", {})),
        by_run=sb.amounts(parts.get("run", {})), by_warehouse=sb.amounts(parts.get("warehouse", {})),
        by_partition=sb.partitions(parts.get("partition", {})),
        queries={"total": steps[1] + outside[1], "attributed": steps[1] + outside[1], "unattributed": 0},
        queries_by={d: sb.counts(parts.get(d, {})) for d in ("model", "asset", "run", "warehouse")},
        unattributed_detail={"seconds_mapping_to_nothing": un[0]},
        extra={"steps": steps[1], "step_seconds": steps[0], "dbt_nodes_outside_runs": outside[1],
               "unfinished_steps_left_out": t.unfinished},
        sql=text,
        notes=["no billing meter: the meter is the seconds of finished Dagster steps (and of dbt nodes run "
               "outside Dagster); dbt node seconds come from dbt's run_results (dagster-dbt's Execution Duration)",
               "queries count step and dbt node executions"])
    return report.sealed()


def _batch(columns: list[tuple[str, str]], rows: list[tuple]):
    import pyarrow as pa

    types = {"VARCHAR": pa.string(), "DOUBLE": pa.float64()}
    return pa.RecordBatch.from_arrays([pa.array([r[i] for r in rows], type=types[ty]) for i, (_, ty) in enumerate(columns)],
                                      names=[c for c, _ in columns])


__all__ = ["DagsterTimingCost", "RunTimingsCache", "TEMPLATE", "Timings", "read_run_results", "read_runs", "report_from_timings", "runs_in"]
