"""Cause: an upstream asset was not refreshed, or its runs failed, before the incident's asset ran.

Read from Dagster's own history, for each parent of the asset in the asset graph
(``context.repository_def.asset_graph`` in an op, ``defs.resolve_asset_graph()`` elsewhere):

1. **Failed runs**: runs that planned a materialization of the parent after its last successful
   materialization (``fetch_planned_materializations``) and ended FAILURE or CANCELED
   (``get_run_records``) — the parent failed and has not recovered.
2. **Read before it landed** (both assets partitioned with the same keys): partitions of the
   asset whose latest materialization is older than the parent's materialization of the same
   partition, or whose parent partition was never materialized — the asset read it too early.
3. **Not refreshed between runs** (the asset is unpartitioned): the parent's last materialization
   is older than the asset's *previous* materialization, so the asset's last run re-read the same
   upstream data. (A partitioned asset materializes once per partition, so two of its
   materializations say nothing about its upstream.)
4. **Freshness** (``max_age`` given): the parent's last materialization (or observation, for an
   external asset) was older than ``max_age`` when the asset last ran.

An external parent (an ``AssetSpec`` nothing materializes) with no observation gives no
evidence either way and is listed as "no record", not blamed.

This cause counts no rows (``explained_rows`` 0, ``unexplained_rows`` = |gap|). Its confidence
is a prior for how directly the evidence points at the parent: failed runs 0.8, a partition read
before its upstream landed 0.7, not refreshed / stale 0.5, nothing found 0.0. ``window`` lists
the partitions read too early.
"""

import datetime as dt
from collections.abc import Sequence
from typing import Any

import dagster as dg

from dw_dagster.databases.snippets import DAGSTER_EVENT_LOG, aware_utc
from dw_dagster.core.models import CauseFinding, Evidence, utcnow
from dw_dagster.dagster_private import public

KIND = "upstream_not_refreshed_or_failed"
FAILED_CONFIDENCE = 0.8
EARLY_READ_CONFIDENCE = 0.7
STALE_CONFIDENCE = 0.5
_FAILED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


def upstream_keys(asset_graph: Any, asset_key: dg.AssetKey) -> list[dg.AssetKey]:
    """The parents of ``asset_key`` in a Dagster asset graph, sorted (empty when it is not in the graph)."""
    try:
        node = asset_graph.get(asset_key)
    except Exception:
        return []
    return sorted(node.parent_keys, key=lambda k: k.to_user_string())


def _ts(rec) -> dt.datetime:
    return aware_utc(rec.timestamp)


def _latest_per_partition(instance: dg.DagsterInstance, key: dg.AssetKey, wanted: set[str] | None, limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cursor = None
    read = 0
    while read < limit:
        res = instance.fetch_materializations(key, limit=min(500, limit - read), cursor=cursor)
        for rec in res.records:
            pk = rec.partition_key
            if pk is not None and pk not in out and (wanted is None or pk in wanted):
                out[pk] = rec
        read += len(res.records)
        if not res.has_more or not res.records:
            break
        cursor = res.cursor
    return out


@public
def diagnose_upstream(
    instance: dg.DagsterInstance,
    asset_graph: Any,
    asset_key: dg.AssetKey,
    *,
    max_age: dt.timedelta | None = None,
    partitions: Sequence[str] | None = None,
    lookback: dt.timedelta = dt.timedelta(days=7),
    gap_rows: int = 0,
    now: dt.datetime | None = None,
    history_limit: int = 2000,
) -> CauseFinding:
    """Check each parent of ``asset_key`` for failed runs and missed refreshes (module docstring).

    Args:
        instance: the Dagster instance.
        asset_graph: the asset graph (``BaseAssetGraph``: ``get(key).parent_keys``,
            ``.is_materializable``, ``.partitions_def``).
        asset_key: the incident's asset.
        max_age: a parent older than this when the asset last ran is stale; None skips the test.
        partitions: only these partition keys (e.g. the incident's window); None = all recorded.
        lookback: how far back to look for failed runs of a parent never materialized.
        gap_rows: the incident's gap, carried into ``unexplained_rows``.
        now: the current time (UTC), for tests.
        history_limit: materialization records read per asset at most.

    Returns:
        A :class:`~dw_dagster.core.models.CauseFinding` of kind ``upstream_not_refreshed_or_failed``;
        ``details["tested"]`` is False when the asset has no parent with any record.
    """
    now = aware_utc(now) if now else utcnow()
    parents = upstream_keys(asset_graph, asset_key)
    child_node = asset_graph.get(asset_key) if parents else None
    child_recent = instance.fetch_materializations(asset_key, limit=2).records
    child_last = _ts(child_recent[0]) if child_recent else None
    child_prev = _ts(child_recent[1]) if len(child_recent) > 1 else None
    wanted = set(partitions) if partitions else None
    evidence, per_parent, window = [], [], set()
    confidence, tested = 0.0, 0
    for p in parents:
        node = asset_graph.get(p)
        name = p.to_user_string()
        info: dict[str, Any] = {"asset": name, "materializable": bool(node.is_materializable), "signals": []}
        last = instance.fetch_materializations(p, limit=1).records
        last_ts = _ts(last[0]) if last else None
        info["last_materialization"] = {"run_id": last[0].run_id, "timestamp": last_ts.isoformat()} if last else None
        calls = [f"instance.fetch_materializations(dg.AssetKey({list(p.path)!r}), limit=1)"]
        seen_ts = last_ts
        if not node.is_materializable:
            obs = instance.fetch_observations(p, limit=1).records
            seen_ts = _ts(obs[0]) if obs else seen_ts
            info["last_observation"] = _ts(obs[0]).isoformat() if obs else None
            calls.append(f"instance.fetch_observations(dg.AssetKey({list(p.path)!r}), limit=1)")
            if seen_ts is None:
                info["status"] = "external asset with no materialization or observation: no record, not judged"
                per_parent.append(info)
                continue
        tested += 1
        # 1. failed runs since the last success
        after = last_ts.timestamp() if last_ts else (now - lookback).timestamp()
        planned = instance.fetch_planned_materializations(dg.AssetRecordsFilter(asset_key=p, after_timestamp=after), limit=100).records
        run_ids = sorted({r.run_id for r in planned})
        failed = []
        if run_ids:
            for rr in instance.get_run_records(filters=dg.RunsFilter(run_ids=run_ids)):
                if rr.dagster_run.status in _FAILED:
                    failed.append({"run_id": rr.dagster_run.run_id, "status": rr.dagster_run.status.value,
                                   "job": rr.dagster_run.job_name,
                                   "started": aware_utc(rr.start_time).isoformat() if rr.start_time else None,
                                   "ended": aware_utc(rr.end_time).isoformat() if rr.end_time else None})
        calls.append(f"instance.fetch_planned_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey({list(p.path)!r}), "
                     f"after_timestamp={after!r}), limit=100); instance.get_run_records(dg.RunsFilter(run_ids=[...]))")
        info["failed_runs_since_last_success"] = sorted(failed, key=lambda f: f["started"] or "")
        if failed:
            info["signals"].append("failed")
            confidence = max(confidence, FAILED_CONFIDENCE)
        # 2. partitions read before the upstream landed
        if node.partitions_def is not None and child_node is not None and child_node.partitions_def is not None:
            if node.partitions_def == child_node.partitions_def:
                mine = _latest_per_partition(instance, asset_key, wanted, history_limit)
                theirs = _latest_per_partition(instance, p, set(mine), history_limit)
                early = []
                for pk, rec in sorted(mine.items()):
                    up = theirs.get(pk)
                    if up is None or up.timestamp > rec.timestamp:
                        early.append({"partition": pk, "asset_materialized": _ts(rec).isoformat(), "asset_run_id": rec.run_id,
                                      "upstream_materialized": _ts(up).isoformat() if up else None,
                                      "upstream_run_id": up.run_id if up else None})
                calls.append("per partition: the latest instance.fetch_materializations(...) record of both assets")
                info["partitions_read_before_upstream_landed"] = early
                if early:
                    info["signals"].append("read_before_upstream_landed")
                    window.update(e["partition"] for e in early)
                    confidence = max(confidence, EARLY_READ_CONFIDENCE)
            else:
                info["partition_note"] = "different partitions definitions; per-partition order not compared"
        elif (child_node is not None and child_node.partitions_def is None and child_prev is not None
              and seen_ts is not None and seen_ts < child_prev):
            # 3. unpartitioned: not refreshed between the asset's last two runs
            info["signals"].append("not_refreshed_between_runs")
            info["asset_previous_materialization"] = child_prev.isoformat()
            confidence = max(confidence, STALE_CONFIDENCE)
        # 4. freshness window
        if max_age is not None and seen_ts is not None:
            at = child_last or now
            age = at - seen_ts
            info["age_hours_when_asset_ran"] = round(age.total_seconds() / 3600, 3)
            if age > max_age:
                info["signals"].append("stale")
                confidence = max(confidence, STALE_CONFIDENCE)
        evidence.append(Evidence(description=f"refresh and run history of upstream {name}", database=DAGSTER_EVENT_LOG,
                                 sql=";\n".join(calls), values=info))
        per_parent.append(info)
    gap = abs(gap_rows)
    details = {"tested": bool(tested), "upstream": per_parent, "asset_last_materialization": child_last.isoformat() if child_last else None,
               "max_age_hours": max_age.total_seconds() / 3600 if max_age else None}
    blamed = [i for i in per_parent if i["signals"]]
    if not parents:
        summary = f"{asset_key.to_user_string()} has no upstream asset in the asset graph; cannot test this cause"
    elif not tested:
        summary = (f"no upstream of {asset_key.to_user_string()} has a record in this instance "
                   f"({', '.join(i['asset'] for i in per_parent)}: external, never observed); cannot test this cause")
    elif not blamed:
        summary = (f"every upstream of {asset_key.to_user_string()} with a record ({tested}) was refreshed in time and has no "
                   "failed run since its last materialization")
    else:
        bits = []
        for i in blamed:
            s = []
            if "failed" in i["signals"]:
                f = i["failed_runs_since_last_success"]
                s.append(f"{len(f)} failed run(s) since its last materialization "
                         f"({', '.join(x['run_id'][:8] + ' at ' + (x['started'] or '?')[:19] for x in f[:3])})")
            if "read_before_upstream_landed" in i["signals"]:
                e = i["partitions_read_before_upstream_landed"]
                s.append(f"{len(e)} partition(s) of {asset_key.to_user_string()} read before it landed "
                         f"({', '.join(x['partition'] for x in e[:5])})")
            if "not_refreshed_between_runs" in i["signals"]:
                s.append(f"not refreshed since before {asset_key.to_user_string()}'s previous run at {i['asset_previous_materialization'][:19]}")
            if "stale" in i["signals"]:
                s.append(f"{i['age_hours_when_asset_ran']} h old when {asset_key.to_user_string()} ran (allowed {details['max_age_hours']} h)")
            last = i["last_materialization"]["timestamp"][:19] if i["last_materialization"] else "never"
            bits.append(f"{i['asset']} (last materialized {last}): " + "; ".join(s))
        summary = "upstream not refreshed or failed — " + " | ".join(bits) + ". Rows are not counted by this finding."
    return CauseFinding(kind=KIND, summary=summary, confidence=confidence if blamed else 0.0, explained_rows=0,
                        unexplained_rows=gap, window=sorted(window), details=details, evidence=evidence)
