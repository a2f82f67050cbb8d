"""Cause: late-arriving rows behind a high-watermark (including rows tied with it).

An incremental load that reads ``watermark_column > HWM`` never sees a row that reaches the
source *after* the load covering its partition ran but carries a watermark value at or below the
HWM of every later load: back-dated sales posted after an outage, or a row stamped exactly at the
HWM under a strict ``>`` (``shared/cases/PUBLIC_CASES.md`` C18).

Evidence, all computed in the databases (only per-partition/per-group counts come back):

1. **Late rows** (source): rows with ``watermark ≤ HWM`` whose ``arrival_column`` is later than
   the source snapshot of the load that covered their partition, per partition and group, split
   into *below* and *tied with* the HWM, with the longest watermark-to-arrival delay.
2. **Late and missing** (source and target): the late rows' keys are anti-joined with the
   target's keys in those partitions (one query when both tables are in one database; otherwise
   the late keys and the target's keys of those partitions are streamed into a local DuckDB,
   never the whole table), so a late row that has since landed explains nothing.
3. **Gap** (source and target): row counts per partition and group in those partitions:
   explained = Σ min(late and missing, gap) per cell, capped at the incident's gap; the rest of
   the gap is reported as unexplained, never forced onto this cause. The explained keys are
   listed (up to ``key_list_limit``) so :func:`~dw_dagster.diagnosis.combine.combine_findings`
   counts a row two causes share once.
4. **Sample**: up to ``sample_size`` late keys, each classified below/tied, and whether it is in
   the target.

The remediation it implies: an inclusive read by arrival with a lookback of at least the longest
delay (rounded up to whole days), and a rerun of exactly the partitions holding late rows.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass


from dw_dagster.databases import sql
from dw_dagster.databases.snippets import iso, key_match, key_text, same_database
from dw_dagster.databases.snippets import lit as _lit
from dw_dagster.databases.snippets import q as _q
from dw_dagster.databases.snippets import t as _t
from dw_dagster.databases.snippets import to_dialect as _to
from dw_dagster.databases import Database, LocalDuckDB
from dw_dagster.core.models import CauseFinding, Evidence

KIND = "late_rows_behind_watermark"


def _sort_key(cell: tuple) -> tuple:
    """Order cells/groups with NULL first and mixed types safely."""
    return tuple((v is not None, str(v)) for v in cell)


@dataclass(frozen=True)
class PartitionLoad:
    """The latest load of one partition, as the loader recorded it (naive UTC times).

    ``partition_key`` is the asset's own partition key (an hour, a day in the definition's zone, a
    week...) and ``[start, end)`` its time window converted to naive UTC (see
    :func:`dw_dagster.core.windows.partition_window_utc`): late rows, the gap and the window are all
    counted per key over that window, never per UTC date. Several loads may share a key when each
    covered part of it (the runs of an unpartitioned incremental model, each responsible for a
    range of the watermark).
    """

    partition_key: str
    start: dt.datetime
    end: dt.datetime
    source_snapshot_ts: dt.datetime | None
    run_id: str | None = None


def _aware(db: Database, table: str, columns: Sequence[str]) -> set[str]:
    """Which of ``columns`` (lower case) are time-zone aware in ``table``; none when the catalog
    cannot say (the columns are then compared as they are, as before)."""
    from dw_dagster.databases.catalog import table_columns

    try:
        types = {n.lower(): (ty or "").upper() for n, ty in table_columns(db, table)}
    except Exception:
        return set()
    aware = ("TIMESTAMPTZ", "TIMESTAMP_TZ", "TIMESTAMP_LTZ")
    return {c.lower() for c in columns if "WITH TIME ZONE" in types.get(c.lower(), "")
            or types.get(c.lower(), "").split("(")[0] in aware}


def _utc(ref: str, name: str, aware: set[str]) -> str:
    return f"CAST({ref} AT TIME ZONE 'UTC' AS TIMESTAMP)" if name.lower() in aware else ref


def partition_spans(loads: Sequence[PartitionLoad]) -> list[tuple[str, dt.datetime, dt.datetime]]:
    """``(partition_key, start, end)`` per stretch of the partition column the loads cover (naive UTC).

    Loads of one key whose ranges overlap or touch are merged, so a row is counted once per key;
    the spans of different keys never overlap when each key is its own time window.
    """
    out: list[tuple[str, dt.datetime, dt.datetime]] = []
    for key in sorted({ld.partition_key for ld in loads}):
        for a, b in sorted((ld.start, ld.end) for ld in loads if ld.partition_key == key):
            if out and out[-1][0] == key and a <= out[-1][2]:
                out[-1] = (key, out[-1][1], max(out[-1][2], b))
            else:
                out.append((key, a, b))
    return out


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
    key_list_limit: int = 10_000,
    batch_rows: int = 100_000,
) -> CauseFinding:
    """Look for rows the high-watermark skipped and measure how much of the gap they explain.

    Args:
        source, target: the source database and the warehouse.
        source_table, target_table: ``schema.table`` on each side.
        key_column: the merge key: late rows are matched with the target by it (NULL-safe, as text).
        partition_column: the column the partitions' time windows are ranges of (naive UTC values).
        watermark_column: the column the load compares with the HWM.
        arrival_column: when a row reached the source (``posted_ts``, ``ingested_at``).
        loads: the latest load of each partition with its source snapshot (max arrival when it ran).
        high_watermark: the HWM the latest load read from (its strict lower bound), naive UTC.
        gap_rows: the incident's total gap (source − target rows); None to use the gap measured
            in the partitions examined.
        group_by: columns for the per-group breakdown (e.g. ``["store_id"]``).
        sample_size: how many late keys to list.
        lookback_round_hours: the proposed lookback is the longest delay rounded up to this.
        key_list_limit: the explained keys are listed in ``details["explained_keys"]`` when at
            most this many (``details["explained_keys_complete"]`` says whether all are there).
        batch_rows: rows per Arrow batch when keys are streamed between two databases.

    Returns:
        A :class:`~dw_dagster.core.models.CauseFinding` of kind ``late_rows_behind_watermark``;
        ``confidence`` is 0 when no late rows exist.

    Raises:
        dw_dagster.databases.DatabaseError: a query failed on either side.
    """
    loads = [ld for ld in loads if ld.source_snapshot_ts is not None]
    if not loads:
        return CauseFinding(kind=KIND, summary="no load recorded a source snapshot; cannot test this cause",
                            confidence=0.0, explained_rows=0, unexplained_rows=gap_rows or 0)
    return _LateRows(source, target, source_table=source_table, target_table=target_table, key_column=key_column,
                     partition_column=partition_column, watermark_column=watermark_column, arrival_column=arrival_column,
                     loads=loads, high_watermark=high_watermark, gap_rows=gap_rows, group_by=group_by,
                     sample_size=sample_size, lookback_round_hours=lookback_round_hours, key_list_limit=key_list_limit,
                     batch_rows=batch_rows).finding()


class _LateRows:
    """One run of :func:`diagnose_late_rows`: the late rows per cell (partition and group), the gap
    in their partitions, which late rows are missing from the target, then the finding."""

    def __init__(self, source: Database, target: Database, *, source_table: str, target_table: str, key_column: str,
                 partition_column: str, watermark_column: str, arrival_column: str, loads: Sequence[PartitionLoad],
                 high_watermark: dt.datetime, gap_rows: int | None, group_by: Sequence[str], sample_size: int,
                 lookback_round_hours: int, key_list_limit: int, batch_rows: int) -> None:
        self.source, self.target, self.source_table, self.target_table = source, target, source_table, target_table
        self.key_column, self.partition_column = key_column, partition_column
        self.watermark_column, self.arrival_column = watermark_column, arrival_column
        self.loads, self.high_watermark, self.gap_rows, self.group_by = loads, high_watermark, gap_rows, group_by
        self.sample_size, self.lookback_round_hours = sample_size, lookback_round_hours
        self.key_list_limit, self.batch_rows = key_list_limit, batch_rows
        self.g_cols = [_q(c) for c in group_by]
        self.n_g = len(group_by)
        self.evidence: list[Evidence] = []

    def _late_cells(self) -> None:
        """The late rows per partition and group (source), split below/tied, with the longest delay."""
        source, target, partition_column = self.source, self.target, self.partition_column
        watermark_column, arrival_column, n_g = self.watermark_column, self.arrival_column, self.n_g
        g_sel = "".join(f", s.{c}" for c in self.g_cols)
        loads_rel = sql.values_table(
            "l", ["partition_key", "partition_start", "partition_end", "snapshot_ts"],
            [(ld.partition_key, ld.start, ld.end, ld.source_snapshot_ts) for ld in self.loads],
        ).sql("duckdb")
        wm, arr, self.pc = _q(watermark_column), _q(arrival_column), _q(partition_column)
        # aware columns as their UTC wall clock: the windows, snapshot and HWM are naive UTC, and an
        # aware column compared with them directly is read in the session's time zone
        self.s_aw = _aware(source, self.source_table, (partition_column, watermark_column, arrival_column))
        t_aw = _aware(target, self.target_table, (partition_column,))
        s_pc, self.s_wm, self.s_arr = (_utc(f"s.{c}", n, self.s_aw) for c, n in ((self.pc, partition_column),
                                                                                  (wm, watermark_column),
                                                                                  (arr, arrival_column)))
        s_wm, s_arr = self.s_wm, self.s_arr
        self.x_pc, self.t_pc = _utc(f"x.{self.pc}", partition_column, t_aw), _utc(self.pc, partition_column, t_aw)
        self.hwm = hwm = _lit(self.high_watermark)
        # the late rows: at or below the HWM, arrived after the load of their partition read the source
        self.late_rows_from = (f"FROM {_t(self.source_table)} AS s JOIN {loads_rel} ON {s_pc} >= l.partition_start "
                               f"AND {s_pc} < l.partition_end WHERE {s_wm} <= {hwm} AND {s_arr} > l.snapshot_ts")
        late_sql = (
            f"SELECT l.partition_key{g_sel}, COUNT(*) AS late_rows, "
            f"COUNT(CASE WHEN {s_wm} < {hwm} THEN 1 END) AS below_rows, "
            f"COUNT(CASE WHEN {s_wm} = {hwm} THEN 1 END) AS tied_rows, "
            f"MIN({s_arr}) AS first_arrival, MAX({s_arr}) AS last_arrival, "
            f"MAX(DATE_DIFF('microsecond', {s_wm}, {s_arr})) AS max_delay_us "
            f"{self.late_rows_from} GROUP BY l.partition_key{g_sel} ORDER BY l.partition_key{g_sel}"
        )
        late_sql = _to(late_sql, source.dialect)
        late_rows = source.fetch_all(late_sql)
        self.cells = cells = {}
        for r in late_rows:
            key = (r[0], *r[1 : 1 + n_g])
            late, below, tied, first_a, last_a, max_delay = r[1 + n_g :]
            cells[key] = {"late_rows": int(late), "below_rows": int(below), "tied_rows": int(tied),
                          "first_arrival": first_a, "last_arrival": last_a, "max_delay_us": int(max_delay or 0)}
        self.evidence.append(Evidence(
            description=f"source rows with {watermark_column} ≤ the high-watermark ({self.high_watermark}) that reached "
            f"the source ({arrival_column}) after the load of their partition had read it",
            database=source.name, sql=late_sql,
            values=[{"partition": k[0], **dict(zip(self.group_by, k[1:])),
                     **{x: (str(y) if isinstance(y, dt.datetime) else y) for x, y in v.items()}}
                    for k, v in sorted(cells.items(), key=lambda kv: _sort_key(kv[0]))][:200],
        ))
        self.total_late = sum(c["late_rows"] for c in cells.values())

    def _gap_counts(self) -> None:
        """Rows per partition key and group on each side, in the partitions holding late rows.

        Rows are counted in each partition's own [start, end) (its hour, its zone's day, its week),
        never per UTC date, so the gap, the late rows and the window all speak in the asset's
        partition keys."""
        g_cols, n_g, pc = self.g_cols, self.n_g, self.pc
        parts = sorted({k[0] for k in self.cells})
        spans = partition_spans([ld for ld in self.loads if ld.partition_key in parts])
        # a partition may be covered by several loads (an unpartitioned model's runs, split by day)
        self.lo = lo = min(a for _, a, _ in spans)
        self.hi = hi = max(b for _, _, b in spans)
        parts_rel = sql.values_table("p", ["partition_key", "partition_start", "partition_end"], spans).sql("duckdb")
        gap_tmpl = (
            f"SELECT p.partition_key{''.join(', x.' + c for c in g_cols)}, COUNT(*) AS n FROM {{t}} AS x "
            f"JOIN {parts_rel} ON {{xpc}} >= p.partition_start AND {{xpc}} < p.partition_end "
            f"WHERE {{xpc}} >= {_lit(lo)} AND {{xpc}} < {_lit(hi)} GROUP BY p.partition_key{''.join(', x.' + c for c in g_cols)}"
        )
        self.src_count_sql = _to(gap_tmpl.format(t=_t(self.source_table), xpc=_utc(f"x.{pc}", self.partition_column, self.s_aw)),
                                 self.source.dialect)
        self.tgt_count_sql = _to(gap_tmpl.format(t=_t(self.target_table), xpc=self.x_pc), self.target.dialect)

        def counts(db: Database, q: str) -> dict[tuple, int]:
            return {(str(r[0]), *r[1 : 1 + n_g]): int(r[1 + n_g]) for r in db.fetch_all(q)}

        self.src_counts, self.tgt_counts = counts(self.source, self.src_count_sql), counts(self.target, self.tgt_count_sql)

    def _late_missing(self) -> None:
        """Which late rows are really missing from the target: an anti-join on the key."""
        source, target, key_column, n_g, s_wm, s_arr = self.source, self.target, self.key_column, self.n_g, self.s_wm, self.s_arr
        late_rel_sql = (
            f"SELECT l.partition_key AS dw_p{''.join(f', s.{c} AS dw_g{i}' for i, c in enumerate(self.g_cols))}, "
            f"s.{_q(key_column)} AS dw_k0, {', '.join(key_text([key_column], 's'))}, "
            f"CAST({s_wm} AS VARCHAR) AS dw_wm, CAST({s_arr} AS VARCHAR) AS dw_arr, "
            f"CASE WHEN {s_wm} = {self.hwm} THEN 'tied' ELSE 'below' END AS dw_class {self.late_rows_from}"
        )
        tgt_keys_sql = (f"SELECT {', '.join(key_text([key_column]))} FROM {_t(self.target_table)} "
                        f"WHERE {self.t_pc} >= {_lit(self.lo)} AND {self.t_pc} < {_lit(self.hi)}")
        if same_database(source, target):
            run_db, rel_l, rel_t, local = source, f"({late_rel_sql})", f"({tgt_keys_sql})", None
            self.match_db = source.name
        else:
            local = LocalDuckDB()
            kt = [("dw_kc0", "VARCHAR"), ("dw_kn0", "INTEGER")]
            late_types = ([("dw_p", "VARCHAR")] + [(f"dw_g{i}", None) for i in range(n_g)] + [("dw_k0", None)] + kt
                          + [("dw_wm", "VARCHAR"), ("dw_arr", "VARCHAR"), ("dw_class", "VARCHAR")])
            local.load("dw_late", late_types, source.fetch_batches(_to(late_rel_sql, source.dialect), self.batch_rows))
            local.load("dw_tkeys", kt, target.fetch_batches(_to(tgt_keys_sql, target.dialect), self.batch_rows))
            run_db, rel_l, rel_t = local, "(SELECT * FROM dw_late)", "(SELECT * FROM dw_tkeys)"
            self.match_db = LocalDuckDB.name
        g_list = "".join(f", dw_g{i}" for i in range(n_g))
        ctes = (f"WITH dw_l AS {rel_l}, dw_t AS {rel_t}, dw_x AS (SELECT l.*, CASE WHEN EXISTS (SELECT 1 FROM dw_t AS t "
                f"WHERE {key_match(1, 't', 'l')}) THEN 1 ELSE 0 END AS dw_in FROM dw_l AS l) ")
        self.missing_sql = _to(ctes + f"SELECT dw_p{g_list}, COUNT(CASE WHEN dw_in = 0 THEN 1 END) FROM dw_x GROUP BY dw_p{g_list}",
                               run_db.dialect)
        keys_sql = _to(ctes + f"SELECT dw_k0 FROM dw_x WHERE dw_in = 0 ORDER BY dw_k0 NULLS FIRST LIMIT {int(self.key_list_limit) + 1}",
                       run_db.dialect)
        self.sample_sql = _to(ctes + f"SELECT dw_k0, dw_wm, dw_arr, dw_class, dw_in FROM dw_x ORDER BY dw_k0 NULLS FIRST "
                              f"LIMIT {int(self.sample_size)}", run_db.dialect)
        try:
            self.late_missing = {(r[0], *r[1 : 1 + n_g]): int(r[1 + n_g] or 0) for r in run_db.fetch_all(self.missing_sql)}
            self.missing_keys = [r[0] for r in run_db.fetch_all(keys_sql)]
            self.sample = run_db.fetch_all(self.sample_sql)
        finally:
            if local is not None:
                local.close()

    def _explain(self) -> None:
        """Per cell, the late and missing rows that fit in its gap; per partition the sums; the evidence."""
        src_counts, tgt_counts, cells = self.src_counts, self.tgt_counts, self.cells
        explained = 0
        self.per_partition = per_partition = {}
        for key in set(src_counts) | set(tgt_counts) | set(cells):
            gap = src_counts.get(key, 0) - tgt_counts.get(key, 0)
            missing = self.late_missing.get(key, 0)
            matched = max(0, min(missing, gap))
            explained += matched
            pp = per_partition.setdefault(key[0], {"partition": key[0], "late_rows": 0, "late_missing_rows": 0,
                                                   "below_rows": 0, "tied_rows": 0, "source_rows": 0, "target_rows": 0,
                                                   "gap_rows": 0, "explained_rows": 0})
            pp["source_rows"] += src_counts.get(key, 0)
            pp["target_rows"] += tgt_counts.get(key, 0)
            pp["gap_rows"] += gap
            pp["explained_rows"] += matched
            pp["late_missing_rows"] += missing
            for f in ("late_rows", "below_rows", "tied_rows"):
                pp[f] += cells.get(key, {}).get(f, 0)
        measured_gap = sum(p["gap_rows"] for p in per_partition.values())
        self.total_gap = total_gap = self.gap_rows if self.gap_rows is not None else measured_gap
        self.explained = max(0, min(explained, total_gap))  # never more than the incident's gap
        self.evidence.append(Evidence(
            description="rows per partition and group in the source and the target, in the partitions holding late rows, "
            "and how many of the late rows are missing from the target (matched by key)",
            database=f"{self.source.name} | {self.target.name} | {self.match_db}",
            sql=f"{self.src_count_sql};\n{self.tgt_count_sql};\n{self.missing_sql}",
            values=sorted(per_partition.values(), key=lambda p: p["partition"]),
        ))
        sample = self.sample
        self.present = present = sum(1 for r in sample if r[4])
        if sample:
            self.evidence.append(Evidence(
                description=f"{len(sample)} late keys from the source, classified against the high-watermark; "
                f"{present} of them are present in the target",
                database=self.match_db, sql=self.sample_sql,
                values=[{"key": iso(r[0]), self.watermark_column: r[1], self.arrival_column: r[2], "class": r[3],
                         "in_target": bool(r[4])} for r in sample],
            ))

    def finding(self) -> CauseFinding:
        """Run the queries and compose the finding."""
        self._late_cells()
        if not self.cells:
            return CauseFinding(kind=KIND, summary=f"no source row at or below the high-watermark {self.high_watermark} "
                                "arrived after its partition was loaded", confidence=0.0, explained_rows=0,
                                unexplained_rows=self.gap_rows or 0, evidence=self.evidence,
                                details={"high_watermark": str(self.high_watermark), "late_rows": 0})
        self._gap_counts()
        self._late_missing()
        self._explain()
        return self._result()

    def _result(self) -> CauseFinding:
        cells, group_by, explained, total_gap = self.cells, self.group_by, self.explained, self.total_gap
        watermark_column, arrival_column, per_partition = self.watermark_column, self.arrival_column, self.per_partition
        late_missing, missing_keys, key_list_limit = self.late_missing, self.missing_keys, self.key_list_limit
        lookback_round_hours = self.lookback_round_hours
        max_delay_h = max(c["max_delay_us"] for c in cells.values()) / 3_600_000_000
        proposed = max(lookback_round_hours, math.ceil(max_delay_h / lookback_round_hours) * lookback_round_hours)
        window = sorted(p for p, v in per_partition.items() if v["explained_rows"] > 0)
        below = sum(c["below_rows"] for c in cells.values())
        tied = sum(c["tied_rows"] for c in cells.values())
        groups_hit = sorted({k[1:] for k, v in cells.items()}, key=_sort_key) if group_by else []
        confidence = round(min(1.0, explained / total_gap), 4) if total_gap > 0 else 0.0
        summary = (
            f"{self.total_late} source rows at or below the high-watermark {self.high_watermark} on {watermark_column} arrived "
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
                "high_watermark": str(self.high_watermark),
                "watermark_column": watermark_column,
                "arrival_column": arrival_column,
                "late_rows": self.total_late,
                "below_watermark_rows": below,
                "tied_with_watermark_rows": tied,
                "max_delay_hours": round(max_delay_h, 3),
                "min_lookback_hours": math.ceil(max_delay_h * 1000) / 1000,  # rounded up: it must cover the latest row
                "proposed_lookback_hours": proposed,
                "per_partition": sorted(per_partition.values(), key=lambda p: p["partition"]),
                "groups": [dict(zip(group_by, g)) for g in groups_hit],
                "group_by": list(group_by),
                "sample_present_in_target": self.present,
                "sample_size": len(self.sample),
                "late_missing_rows": sum(late_missing.values()),
                "explained_keys": [[iso(k)] for k in missing_keys[:key_list_limit]] if explained else [],
                "explained_keys_complete": len(missing_keys) <= key_list_limit and explained == sum(late_missing.values()),
            },
            evidence=self.evidence,
        )
