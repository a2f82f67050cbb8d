"""Cause: late-arriving rows behind a high-watermark (including rows tied with it).

An incremental load that reads ``watermark_column > HWM`` never sees a row that reaches the
source *after* the load covering its partition ran but carries a watermark value at or below the
HWM of every later load: back-dated sales posted after an outage, or a row stamped exactly at the
HWM under a strict ``>`` (``shared/cases/PUBLIC_CASES.md`` C18).

Evidence, all computed in the databases (only per-partition/per-group counts come back):

1. **Late rows** (source): rows with ``watermark ≤ HWM`` whose ``arrival_column`` is later than
   the source snapshot of the load that covered their partition, per partition and group, split
   into *below* and *tied with* the HWM, with the longest watermark-to-arrival delay.
2. **Gap** (source and target): row counts per partition and group in those partitions, so the
   late rows are matched against what is really missing: explained = Σ min(late, gap) per cell;
   the rest of the gap is reported as unexplained, never forced onto this cause.
3. **Sample** (source, then target): up to ``sample_size`` late keys, each classified below/tied,
   and how many of them are present in the target (expected: none).

The remediation it implies: an inclusive read by arrival with a lookback of at least the longest
delay (rounded up to whole days), and a rerun of exactly the partitions holding late rows.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass


from dw_dagster import sql
from dw_dagster.diagnosis._common import lit as _lit
from dw_dagster.diagnosis._common import q as _q
from dw_dagster.diagnosis._common import t as _t
from dw_dagster.diagnosis._common import to_dialect as _to
from dw_dagster.databases import Database
from dw_dagster.models import CauseFinding, Evidence

KIND = "late_rows_behind_watermark"


@dataclass(frozen=True)
class PartitionLoad:
    """The latest load of one partition, as the loader recorded it (naive UTC times)."""

    partition_key: str
    start: dt.datetime
    end: dt.datetime
    source_snapshot_ts: dt.datetime | None
    run_id: str | None = None


def diagnose_late_rows(
    source: Database,
    target: Database,
    *,
    source_table: str,
    target_table: str,
    key_column: str,
    partition_column: str,
    watermark_column: str,
    arrival_column: str,
    loads: Sequence[PartitionLoad],
    high_watermark: dt.datetime,
    gap_rows: int | None = None,
    group_by: Sequence[str] = (),
    sample_size: int = 20,
    lookback_round_hours: int = 24,
) -> CauseFinding:
    """Look for rows the high-watermark skipped and measure how much of the gap they explain.

    Args:
        source, target: the source database and the warehouse.
        source_table, target_table: ``schema.table`` on each side.
        key_column: the merge key (used for the sample only).
        partition_column: the column whose UTC day is the daily partition.
        watermark_column: the column the load compares with the HWM.
        arrival_column: when a row reached the source (``posted_ts``, ``ingested_at``).
        loads: the latest load of each partition with its source snapshot (max arrival when it ran).
        high_watermark: the HWM the latest load read from (its strict lower bound), naive UTC.
        gap_rows: the incident's total gap (source − target rows); None to use the gap measured
            in the partitions examined.
        group_by: columns for the per-group breakdown (e.g. ``["store_id"]``).
        sample_size: how many late keys to list.
        lookback_round_hours: the proposed lookback is the longest delay rounded up to this.

    Returns:
        A :class:`~dw_dagster.models.CauseFinding` of kind ``late_rows_behind_watermark``;
        ``confidence`` is 0 when no late rows exist.

    Raises:
        dw_dagster.databases.DatabaseError: a query failed on either side.
    """
    loads = [ld for ld in loads if ld.source_snapshot_ts is not None]
    if not loads:
        return CauseFinding(kind=KIND, summary="no load recorded a source snapshot; cannot test this cause",
                            confidence=0.0, explained_rows=0, unexplained_rows=gap_rows or 0)
    g_cols = [_q(c) for c in group_by]
    g_sel = "".join(f", s.{c}" for c in g_cols)
    loads_rel = sql.values_table(
        "l", ["partition_key", "partition_start", "partition_end", "snapshot_ts"],
        [(ld.partition_key, ld.start, ld.end, ld.source_snapshot_ts) for ld in loads],
    ).sql("duckdb")
    wm, arr, pc = _q(watermark_column), _q(arrival_column), _q(partition_column)
    hwm = _lit(high_watermark)
    late_sql = (
        f"SELECT l.partition_key{g_sel}, COUNT(*) AS late_rows, "
        f"COUNT(CASE WHEN s.{wm} < {hwm} THEN 1 END) AS below_rows, "
        f"COUNT(CASE WHEN s.{wm} = {hwm} THEN 1 END) AS tied_rows, "
        f"MIN(s.{arr}) AS first_arrival, MAX(s.{arr}) AS last_arrival, "
        f"MAX(DATE_DIFF('second', s.{wm}, s.{arr})) AS max_delay_s "
        f"FROM {_t(source_table)} AS s JOIN {loads_rel} "
        f"ON s.{pc} >= l.partition_start AND s.{pc} < l.partition_end "
        f"WHERE s.{wm} <= {hwm} AND s.{arr} > l.snapshot_ts "
        f"GROUP BY l.partition_key{g_sel} ORDER BY l.partition_key{g_sel}"
    )
    late_sql = _to(late_sql, source.dialect)
    late_rows = source.fetch_all(late_sql)
    n_g = len(group_by)
    cells: dict[tuple, dict] = {}
    for r in late_rows:
        key = (r[0], *r[1 : 1 + n_g])
        late, below, tied, first_a, last_a, max_delay = r[1 + n_g :]
        cells[key] = {"late_rows": int(late), "below_rows": int(below), "tied_rows": int(tied),
                      "first_arrival": first_a, "last_arrival": last_a, "max_delay_s": int(max_delay or 0)}
    evidence = [Evidence(
        description=f"source rows with {watermark_column} ≤ the high-watermark ({high_watermark}) that reached "
        f"the source ({arrival_column}) after the load of their partition had read it",
        database=source.name, sql=late_sql,
        values=[{"partition": k[0], **dict(zip(group_by, k[1:])), **{x: (str(y) if isinstance(y, dt.datetime) else y) for x, y in v.items()}}
                for k, v in sorted(cells.items())][:200],
    )]
    total_late = sum(c["late_rows"] for c in cells.values())
    if not cells:
        return CauseFinding(kind=KIND, summary=f"no source row at or below the high-watermark {high_watermark} arrived "
                            "after its partition was loaded", confidence=0.0, explained_rows=0,
                            unexplained_rows=gap_rows or 0, evidence=evidence,
                            details={"high_watermark": str(high_watermark), "late_rows": 0})

    # Measure the gap in the partitions that hold late rows, per partition and group.
    parts = sorted({k[0] for k in cells})
    by_key = {ld.partition_key: ld for ld in loads}
    lo, hi = min(by_key[p].start for p in parts), max(by_key[p].end for p in parts)
    gap_tmpl = (
        f"SELECT CAST({pc} AS DATE) AS d{''.join(', ' + c for c in g_cols)}, COUNT(*) AS n FROM {{t}} "
        f"WHERE {pc} >= {_lit(lo)} AND {pc} < {_lit(hi)} GROUP BY 1{''.join(', ' + str(i + 2) for i in range(n_g))}"
    )
    src_count_sql = _to(gap_tmpl.format(t=_t(source_table)), source.dialect)
    tgt_count_sql = _to(gap_tmpl.format(t=_t(target_table)), target.dialect)

    def counts(db: Database, q: str) -> dict[tuple, int]:
        out = {}
        for r in db.fetch_all(q):
            d = r[0].date() if isinstance(r[0], dt.datetime) else r[0]
            out[(d.isoformat(), *r[1 : 1 + n_g])] = int(r[1 + n_g])
        return out

    src_counts, tgt_counts = counts(source, src_count_sql), counts(target, tgt_count_sql)
    explained = 0
    per_partition: dict[str, dict] = {}
    for key in set(src_counts) | set(tgt_counts) | set(cells):
        gap = src_counts.get(key, 0) - tgt_counts.get(key, 0)
        late = cells.get(key, {}).get("late_rows", 0)
        matched = max(0, min(late, gap))
        explained += matched
        pp = per_partition.setdefault(key[0], {"partition": key[0], "late_rows": 0, "below_rows": 0, "tied_rows": 0,
                                               "source_rows": 0, "target_rows": 0, "gap_rows": 0, "explained_rows": 0})
        pp["source_rows"] += src_counts.get(key, 0)
        pp["target_rows"] += tgt_counts.get(key, 0)
        pp["gap_rows"] += gap
        pp["explained_rows"] += matched
        for f in ("late_rows", "below_rows", "tied_rows"):
            pp[f] += cells.get(key, {}).get(f, 0)
    measured_gap = sum(p["gap_rows"] for p in per_partition.values())
    total_gap = gap_rows if gap_rows is not None else measured_gap
    evidence.append(Evidence(
        description="rows per partition and group in the source and the target, in the partitions holding late rows",
        database=f"{source.name} | {target.name}", sql=f"{src_count_sql};\n{tgt_count_sql}",
        values=sorted(per_partition.values(), key=lambda p: p["partition"]),
    ))

    # A sample of late keys, classified, and checked against the target.
    sample_sql = _to(
        f"SELECT s.{_q(key_column)}, s.{wm}, s.{arr}, CASE WHEN s.{wm} = {hwm} THEN 'tied' ELSE 'below' END AS class "
        f"FROM {_t(source_table)} AS s JOIN {loads_rel} ON s.{pc} >= l.partition_start AND s.{pc} < l.partition_end "
        f"WHERE s.{wm} <= {hwm} AND s.{arr} > l.snapshot_ts ORDER BY s.{_q(key_column)} LIMIT {int(sample_size)}",
        source.dialect,
    )
    sample = source.fetch_all(sample_sql)
    present = 0
    if sample:
        keys_sql = ", ".join(_lit(r[0]) for r in sample)
        present_sql = _to(f"SELECT COUNT(*) FROM {_t(target_table)} WHERE {_q(key_column)} IN ({keys_sql})", target.dialect)
        present = int(target.fetch_all(present_sql)[0][0])
        evidence.append(Evidence(
            description=f"{len(sample)} late keys from the source, classified against the high-watermark; "
            f"{present} of them are present in the target",
            database=f"{source.name} | {target.name}", sql=f"{sample_sql};\n{present_sql}",
            values=[{"key": r[0], watermark_column: str(r[1]), arrival_column: str(r[2]), "class": r[3]} for r in sample],
        ))

    max_delay_h = max(c["max_delay_s"] for c in cells.values()) / 3600
    proposed = max(lookback_round_hours, math.ceil(max_delay_h / lookback_round_hours) * lookback_round_hours)
    window = sorted(p for p, v in per_partition.items() if v["explained_rows"] > 0)
    below = sum(c["below_rows"] for c in cells.values())
    tied = sum(c["tied_rows"] for c in cells.values())
    groups_hit = sorted({k[1:] for k, v in cells.items()}) if group_by else []
    confidence = round(min(1.0, explained / total_gap), 4) if total_gap > 0 else 0.0
    summary = (
        f"{total_late} source rows at or below the high-watermark {high_watermark} on {watermark_column} arrived "
        f"after their partition was loaded ({below} below it, {tied} tied with it under a strict '>'); "
        f"they explain {explained} of {total_gap} missing rows in {len(window)} partition(s)"
        + (f" across {len(groups_hit)} {'/'.join(group_by)} value(s)" if group_by else "")
        + f". Longest {watermark_column}→{arrival_column} delay {max_delay_h:.1f} h."
    )
    return CauseFinding(
        kind=KIND,
        summary=summary,
        confidence=confidence,
        explained_rows=explained,
        unexplained_rows=max(0, total_gap - explained),
        window=window,
        details={
            "high_watermark": str(high_watermark),
            "watermark_column": watermark_column,
            "arrival_column": arrival_column,
            "late_rows": total_late,
            "below_watermark_rows": below,
            "tied_with_watermark_rows": tied,
            "max_delay_hours": round(max_delay_h, 3),
            "min_lookback_hours": round(max_delay_h, 3),
            "proposed_lookback_hours": proposed,
            "per_partition": sorted(per_partition.values(), key=lambda p: p["partition"]),
            "groups": [dict(zip(group_by, g)) for g in groups_hit],
            "group_by": list(group_by),
            "sample_present_in_target": present,
            "sample_size": len(sample),
        },
        evidence=evidence,
    )
