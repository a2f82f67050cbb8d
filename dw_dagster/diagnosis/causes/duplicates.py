"""Cause: a duplicate load — merge keys held by more than one row, a partition loaded twice.

A load that appends instead of merging, or a partition that ran twice without replacing its
rows, leaves the target with *more* rows than the source: a negative gap (source − target < 0).
The surplus is exactly the rows beyond the first for each duplicated key.

Evidence:

1. **Merge-key violations** (target, pushed down): keys held by more than one row (``GROUP BY``
   the key, so NULL keys group together), counted per day of ``partition_column`` (the day of the
   key's earliest row) with the surplus rows (Σ copies − 1) and the most copies of one key.
2. **A sample** of duplicated keys with their copy counts, most copies first.
3. **Partitions loaded twice** (Dagster event log, when an instance and asset are given): per
   partition, every materialization with the rows its load inserted (``dw/loads`` or
   ``dw/rows_inserted``); a partition materialized more than once whose later loads inserted
   rows while its day holds duplicate rows is a double load, and the run ids say which runs.

Outcome. With a negative gap, explained = min(surplus, |gap|); the rest of the surplus gap is
unexplained. With a positive gap duplicates explain none of it — but they *hide* missing rows
(a duplicate and a missing row cancel in a count), so ``details["masked_missing_rows"]`` says
how many more rows are really missing than the gap shows.
"""

import datetime as dt
from collections.abc import Sequence
from typing import Any

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.databases import Database
from dw_dagster.databases.snippets import DAGSTER_EVENT_LOG, iso, naive_utc, q, t, to_dialect, window_predicate
from dw_dagster.core.models import CauseFinding, Evidence
from dw_dagster.core import records
from dw_dagster.dagster_private import public

KIND = "duplicate_load"


def partition_load_history(instance: dg.DagsterInstance, asset_key: dg.AssetKey, limit: int = 5000) -> dict[str, list[dict[str, Any]]]:
    """Every recorded materialization of each partition of ``asset_key``, oldest first.

    Each entry: ``run_id``, ``timestamp`` (UTC ISO), ``rows_inserted``, ``rows_read``,
    ``rows_updated`` (None when the materialization did not record them; read from the
    partition's ``dw/loads`` entry, else ``dw/rows_inserted``), ``row_count`` (``dagster/row_count``).

    Args:
        limit: read at most this many materializations, newest first.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for i, rec in enumerate(records.iter_materializations(instance, asset_key)):
        if i >= limit:
            break
        pk = rec.partition_key
        if pk is None:
            continue
        md = rec.asset_materialization.metadata
        loads = records.metadata_json(md, c.LOADS_KEY) or {}
        ld = loads.get(pk, {}) if isinstance(loads, dict) else {}
        inserted = ld.get("rows_inserted")
        if inserted is None and c.ROWS_INSERTED_KEY in md and len(loads) <= 1:
            inserted = getattr(md[c.ROWS_INSERTED_KEY], "value", md[c.ROWS_INSERTED_KEY])
        rc = md.get("dagster/row_count")
        out.setdefault(pk, []).append({
            "run_id": rec.run_id, "timestamp": dt.datetime.fromtimestamp(rec.timestamp, dt.timezone.utc).isoformat(),
            "rows_inserted": inserted, "rows_read": ld.get("rows_read"), "rows_updated": ld.get("rows_updated"),
            "row_count": getattr(rc, "value", rc)})
    return {pk: sorted(v, key=lambda m: m["timestamp"]) for pk, v in sorted(out.items())}


@public
def diagnose_duplicates(
    target: Database,
    *,
    target_table: str,
    key_columns: Sequence[str],
    partition_column: str | None = None,
    window: tuple[dt.datetime, dt.datetime] | None = None,
    gap_rows: int | None = None,
    instance: dg.DagsterInstance | None = None,
    asset_key: dg.AssetKey | None = None,
    sample_size: int = 20,
) -> CauseFinding:
    """Count duplicated merge keys in the target and find partitions loaded twice (module docstring).

    Args:
        target: the warehouse.
        target_table: ``[catalog.]schema.table``.
        key_columns: the merge key.
        partition_column: a timestamp/date column; its UTC day is the partition (per-day counts).
        window: (start, end) half-open on ``partition_column`` (UTC); None scans the whole table.
        gap_rows: the incident's gap, source − target rows (negative = target has more); None =
            treat the surplus found as the gap.
        instance, asset_key: the Dagster instance and the loaded asset, to read the materializations
            of each partition (optional).
        sample_size: duplicated keys listed in the evidence.

    Returns:
        A :class:`~dw_dagster.core.models.CauseFinding` of kind ``duplicate_load``
        (``details["direction"] == "surplus"``).

    Raises:
        ValueError: ``window`` without ``partition_column``, or no key columns.
        dw_dagster.databases.DatabaseError: a query fails.
    """
    if not key_columns:
        raise ValueError("key_columns must name at least one column")
    if window is not None and partition_column is None:
        raise ValueError("a window needs partition_column")
    keys = ", ".join(q(k) for k in key_columns)
    where = f" WHERE {window_predicate(partition_column, window)}" if window else ""
    day = f", MIN(CAST(CAST({q(partition_column)} AS DATE) AS VARCHAR)) AS dw_day" if partition_column else ""
    inner = f"SELECT COUNT(*) AS dw_n{day} FROM {t(target_table)}{where} GROUP BY {keys} HAVING COUNT(*) > 1"
    agg_sql = to_dialect(
        (f"SELECT dw_day, COUNT(*), SUM(dw_n - 1), MAX(dw_n) FROM ({inner}) AS x GROUP BY dw_day ORDER BY dw_day"
         if partition_column else f"SELECT COUNT(*), SUM(dw_n - 1), MAX(dw_n) FROM ({inner}) AS x"), target.dialect)
    per_day = []
    for r in target.fetch_all(agg_sql):
        r = list(r)
        d = r.pop(0) if partition_column else None
        if not r[0]:
            continue
        per_day.append({"partition": d, "duplicate_keys": int(r[0]), "surplus_rows": int(r[1] or 0), "max_copies": int(r[2] or 0)})
    sample_sql = to_dialect(f"SELECT {keys}, COUNT(*) FROM {t(target_table)}{where} GROUP BY {keys} HAVING COUNT(*) > 1 "
                            f"ORDER BY COUNT(*) DESC, {keys} LIMIT {int(sample_size)}", target.dialect)
    sample = [{"key": [iso(v) for v in r[:-1]], "copies": int(r[-1])} for r in target.fetch_all(sample_sql)] if per_day else []
    evidence = [Evidence(
        description=f"keys of {target_table} held by more than one row" + (", per day of the key's first row" if partition_column else "")
        + " (surplus = copies beyond the first)", database=target.name, sql=agg_sql, values=per_day)]
    if sample:
        evidence.append(Evidence(description=f"the {len(sample)} most duplicated keys", database=target.name, key_columns=list(key_columns),
                                 sql=sample_sql, values=sample))

    double_loads = []
    if instance is not None and asset_key is not None:
        hist = partition_load_history(instance, asset_key)
        surplus_by_day = {d["partition"]: d["surplus_rows"] for d in per_day}
        win = (naive_utc(window[0]).date().isoformat(), naive_utc(window[1]).date().isoformat()) if window else None
        for pk, mats in hist.items():
            if len(mats) < 2 or (win and not (win[0] <= pk[:10] < win[1])):
                continue
            later = [m for m in mats[1:] if (m["rows_inserted"] or 0) > 0]
            surplus = surplus_by_day.get(pk, surplus_by_day.get(pk[:10], 0))
            if later and surplus > 0:
                double_loads.append({"partition": pk, "materializations": mats, "surplus_rows": surplus,
                                     "rows_inserted_by_later_loads": sum(m["rows_inserted"] for m in later)})
        evidence.append(Evidence(
            description="materializations of each partition with the rows each load inserted; partitions loaded more than "
            "once whose later loads inserted rows while the day holds duplicates",
            database=DAGSTER_EVENT_LOG,
            sql=f"dw_dagster.diagnosis.causes.duplicates.partition_load_history(instance, dg.AssetKey({list(asset_key.path)!r}))",
            values={"partitions_materialized_more_than_once": sorted(pk for pk, m in hist.items() if len(m) > 1),
                    "double_loads": double_loads}))

    surplus = sum(d["surplus_rows"] for d in per_day)
    dup_keys = sum(d["duplicate_keys"] for d in per_day)
    gap = gap_rows if gap_rows is not None else -surplus
    window_days = [d["partition"] for d in per_day if d["partition"] is not None]
    details: dict[str, Any] = {
        "direction": "surplus", "duplicate_keys": dup_keys, "surplus_rows": surplus,
        "per_partition": [{"partition": d["partition"], "gap_rows": -d["surplus_rows"], "explained_rows": d["surplus_rows"],
                           "duplicate_keys": d["duplicate_keys"]} for d in per_day] if partition_column else [],
        "double_loads": double_loads, "sample": sample,
        "window": [iso(naive_utc(w)) for w in window] if window else None,
    }
    if gap < 0:
        explained = min(surplus, -gap)
        unexplained = -gap - explained
        confidence = round(explained / -gap, 4)
        loads_txt = (f"; partition(s) {', '.join(d['partition'] for d in double_loads)} were loaded more than once "
                     f"(runs {', '.join(m['run_id'][:8] for d in double_loads for m in d['materializations'])})") if double_loads else ""
        summary = (f"duplicate load: {dup_keys} key(s) of {target_table} are held by more than one row, {surplus} surplus row(s)"
                   f"{' in ' + str(len(window_days)) + ' partition(s)' if window_days else ''}{loads_txt}; they explain "
                   f"{explained} of the {-gap} extra target row(s); {unexplained} unexplained.")
        if surplus == 0:
            summary = f"no key of {target_table} is held by more than one row; the {-gap} extra target row(s) stay unexplained."
    else:
        explained, unexplained, confidence = 0, gap, 0.0
        details["masked_missing_rows"] = surplus
        summary = (f"{dup_keys} key(s) of {target_table} are held by more than one row ({surplus} surplus row(s)); the target "
                   f"is short, not long, so they explain none of the gap — they hide {surplus} missing row(s): "
                   f"{gap + surplus} row(s) are really missing, not {gap}.") if surplus else (
            f"no key of {target_table} is held by more than one row" + (" in the window" if window else "")
            + "; no duplicate load.")
    return CauseFinding(kind=KIND, summary=summary, confidence=confidence, explained_rows=explained,
                        unexplained_rows=unexplained, window=window_days if explained else [], details=details,
                        evidence=evidence)
