"""Parity of one table pair, kind by kind: schema, counts and sums per slice, key diff, Lightup's compare metric.

Each kind returns a :class:`KindResult` — passed or not, a description naming what differs, the
numbers compared (``values``) and every SQL statement it ran — which :mod:`dw_dagster.migration.checks`
turns into an asset check result on the pair's target asset.

- **schema**: columns present on both sides, each source type mapped onto the target's
  (:mod:`dw_dagster.migration.types`: a narrowing fails, a harmless change is named), nullability
  (a target column refusing NULLs the source holds fails), and key uniqueness on both sides (keys
  held by more than one row, one pushed-down query per side);
- **counts**: rows and exact sums per slice, the existing reconciliation
  (:func:`~dw_dagster.checks.reconcile.reconcile`), on closed partitions only when the pair has a
  ``time_column``;
- **key_diff**: the cross-database key diff (:func:`~dw_dagster.checks.rowdiff.row_diff_across`),
  in full below the configured size, sampled by key buckets above it;
- **lightup**: the pair's compare metric's latest datapoint must read 0.

A table that is missing or a query that fails is a failed result naming the error (a dropped
target table fails every kind, it never crashes the evaluation).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import dagster as dg
import sqlglot

from dw_dagster.core import keys as k
from dw_dagster.databases import Database, DatabaseError, sql
from dw_dagster.databases.catalog import CatalogError, read_table_schema, resolve_column
from dw_dagster.errors import DwDagsterError
from dw_dagster.migration.config import KeyDiffRule, PairConfig
from dw_dagster.migration.types import compare, family


@dataclass
class KindResult:
    """One parity kind's outcome for one pair."""

    kind: str
    passed: bool
    description: str
    values: dict[str, Any] = field(default_factory=dict)
    sql: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def check_metadata(self, pair: PairConfig) -> dict[str, Any]:
        """The asset check result's metadata: kind, pair, values (JSON), SQL (markdown), and the kind's own."""
        md = {k.PARITY_KIND_KEY: self.kind, k.PARITY_PAIR_KEY: pair.label,
              k.PARITY_VALUES_KEY: dg.MetadataValue.json(_jsonable(self.values)),
              k.PARITY_SQL_KEY: dg.MetadataValue.md("\n\n".join(f"```sql\n{q}\n```" for q in self.sql) or "none"),
              k.PARITY_SECONDS_KEY: round(self.seconds, 3)}
        md.update(self.metadata)
        return md


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(a): _jsonable(b) for a, b in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    return v


def _failed(kind: str, e: BaseException, sql_run: list[str] | None = None) -> KindResult:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return KindResult(kind, False, f"could not be compared: {text}"[:1000], {"error": text}, sql_run or [])


# -- schema -------------------------------------------------------------------------------------------

def _duplicate_keys_sql(db: Database, table: str, key: list[str]) -> str:
    cols = [sql.column(c) for c in key]
    inner = (sqlglot.exp.select(*cols).from_(sql.table(table)).group_by(*cols)
             .having(sqlglot.exp.Count(this=sqlglot.exp.Star()) > 1).subquery("dw_d"))
    return sqlglot.exp.select(sqlglot.exp.Count(this=sqlglot.exp.Star())).from_(inner).sql(dialect=db.dialect)


def _unique_by_constraint(db: Database, table: str, key: list[str]) -> str | None:
    """The catalog query proving ``key`` unique (PostgreSQL: a valid unique index on exactly those columns),
    or None when the catalog does not prove it here."""
    if db.dialect != "postgres":
        return None
    t = sql.table(table)
    q = ("SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
         f"i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass({sql.literal(t.sql(dialect='postgres')).sql('postgres')}) "
         "AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL GROUP BY i.indexrelid")
    try:
        rows = db.fetch_all(q)
    except DatabaseError:
        return None
    want = sorted(c.lower() for c in key)
    return q if any(sorted(str(c).lower() for c in (r[0] or [])) == want for r in rows) else None


def schema_parity(pair: PairConfig, src: Database, tgt: Database) -> KindResult:
    """Columns, types across the two engines, nullability and key uniqueness (see the module docstring)."""
    t0, run = time.perf_counter(), []
    try:
        s_schema, t_schema = read_table_schema(src, pair.source.table), read_table_schema(tgt, pair.target.table)
    except (DatabaseError, CatalogError, DwDagsterError) as e:
        return _failed(k.PARITY_SCHEMA, e)
    problems, notes, rows = [], [], []
    t_names = [c.name for c in t_schema.columns]
    for c in s_schema.columns:
        other = resolve_column(t_names, c.name, tgt.dialect, pair.target.table)
        if other is None:
            problems.append(f"{c.name} is missing in the target")
            rows.append({"column": c.name, "source": c.type, "target": "(missing)", "mapping": "missing", "ok": False})
            continue
        tc = next(x for x in t_schema.columns if x.name == other)
        m = compare(family(c.type, src.dialect), family(tc.type, tgt.dialect),
                    timestamp_precision=pair.timestamp_precision, trim_trailing_blanks=pair.trim_trailing_blanks)
        ok = m is None or m.ok
        if m is not None:
            (notes if m.ok else problems).append(f"{c.name}: {m.words}")
        if c.nullable and not tc.nullable:
            notes.append(f"{c.name}: the target refuses NULLs the source allows")
        rows.append({"column": c.name, "source": f"{c.type}{'' if c.nullable else ' NOT NULL'}",
                     "target": f"{tc.type}{'' if tc.nullable else ' NOT NULL'}",
                     "mapping": "same" if m is None else m.words.split(": ", 1)[-1], "ok": ok})
    extra = [n for n in t_names if resolve_column([c.name for c in s_schema.columns], n, src.dialect) is None]
    notes += [f"{n} is only in the target" for n in extra]
    dups = {}
    for side, db, table in (("source", src, pair.source.table), ("target", tgt, pair.target.table)):
        proof = _unique_by_constraint(db, table, pair.key)
        if proof is not None:  # a primary key or unique index on exactly the key: no scan needed
            run.append(proof)
            dups[side] = 0
            continue
        q = _duplicate_keys_sql(db, table, pair.key)
        run.append(q)
        try:
            dups[side] = int(db.fetch_all(q)[0][0] or 0)
        except DatabaseError as e:
            return _failed(k.PARITY_SCHEMA, e, run)
        if dups[side]:
            problems.append(f"{dups[side]} key(s) of {', '.join(pair.key)} are held by more than one row in the {side}")
    desc = "; ".join(problems[:6]) if problems else (f"columns and types match ({len(notes)} note(s): "
                                                      f"{'; '.join(notes[:3])})" if notes else "columns and types match")
    from dw_dagster.checks.metadata import metadata_table

    return KindResult(k.PARITY_SCHEMA, not problems, desc[:1000],
                      {"columns_source": len(s_schema.columns), "columns_target": len(t_schema.columns),
                       "type_problems": len(problems), "notes": notes, "duplicate_keys_source": dups["source"],
                       "duplicate_keys_target": dups["target"],
                       "types": {r["column"]: [r["source"], r["target"]] for r in rows}},
                      run, {k.PARITY_COLUMNS_KEY: metadata_table(rows, [("column", "text"), ("source", "text"), ("target", "text"),
                                                                ("mapping", "text"), ("ok", "bool")])},
                      time.perf_counter() - t0)


# -- counts -------------------------------------------------------------------------------------------

_CADENCE = {"hourly": dg.HourlyPartitionsDefinition, "daily": dg.DailyPartitionsDefinition,
            "weekly": dg.WeeklyPartitionsDefinition, "monthly": dg.MonthlyPartitionsDefinition}


def closed_scope(pair: PairConfig, now: dt.datetime | None = None):
    """(condition, scope) limiting a pair to closed partitions of its ``time_column``; (None, {}) without one."""
    from dw_dagster.checks.reconcile import comparison_scope

    if not pair.time_column:
        return None, {}
    start = "1970-01-01-00:00" if pair.partition_cadence == "hourly" else "1970-01-01"
    pdef = _CADENCE[pair.partition_cadence](start_date=start)
    return comparison_scope(pdef, pair.time_column, closed_only=True, now=now)


def counts_parity(pair: PairConfig, src: Database, tgt: Database, now: dt.datetime | None = None) -> KindResult:
    """Rows and exact sums per slice (the reconciliation), closed partitions only with a ``time_column``."""
    from dw_dagster.checks.reconcile import reconcile, reconciliation_metadata

    t0 = time.perf_counter()
    where, scope = closed_scope(pair, now)
    try:
        r = reconcile(src, tgt, pair.source.table, pair.target.table, pair.slice_by, pair.sums, (), where,
                      stable_read_attempts=2, retry_wait_s=1.0)
    except (DatabaseError, CatalogError, DwDagsterError) as e:
        return _failed(k.PARITY_COUNTS, e)
    md = reconciliation_metadata(r, pair.sums)
    md.pop(k.QUERIES_KEY, None)
    if scope.get("compared_up_to"):
        md[k.COMPARED_UP_TO_KEY] = scope["compared_up_to"]
    worst = max(r.slices, key=lambda s: abs(s.gap_pct), default=None)
    values = {"source_rows": sum(s.source_rows for s in r.slices), "target_rows": sum(s.target_rows for s in r.slices),
              "gap_rows": r.gap_rows, "worst_gap_pct": worst.gap_pct if worst else 0.0,
              "failing_slices": len(r.failing),
              "slices": {json.dumps(s.slice, sort_keys=True, default=str): [s.source_rows, s.target_rows, s.source_sums,
                                                                            s.target_sums] for s in r.slices}}
    if r.inconclusive:
        desc = f"inconclusive: {r.unstable[-1]}"
    elif r.failing:
        desc = "; ".join(f"{json.dumps(s.slice, default=str)}: {s.gap_words()}"
                         + ("" if all(g in ("0", "0.00", "0.0") or g.startswith("0E") for g in s.sum_gaps.values())
                            else f", sums differ by {', '.join(f'{m} {g}' for m, g in s.sum_gaps.items())}")
                         for s in r.failing[:5])
    else:
        desc = f"{values['source_rows']:,} rows in {len(r.slices)} slice(s) match, sums exact"
    if scope.get("compared_up_to"):
        desc += f" (rows before {scope['compared_up_to']} UTC: closed partitions only)"
    return KindResult(k.PARITY_COUNTS, r.passed, desc[:1000], values, [r.source_sql, r.target_sql], md,
                      time.perf_counter() - t0)


# -- key diff -----------------------------------------------------------------------------------------

def _source_rows(db: Database, table: str, where) -> tuple[int, str]:
    """The table's rows as the catalog estimates them (PostgreSQL ``reltuples``, DuckDB ``estimated_size``),
    else ``COUNT(*)``: only the choice between a full and a sampled diff depends on it."""
    t = sql.table(table)
    text = None
    if db.dialect == "postgres":
        text = f"SELECT CAST(reltuples AS BIGINT) FROM pg_class WHERE oid = to_regclass({sql.literal(t.sql(dialect='postgres')).sql('postgres')})"
    elif db.dialect == "duckdb" and t.args.get("db") is not None:
        text = (f"SELECT estimated_size FROM duckdb_tables() WHERE schema_name = {sql.literal(t.args['db'].name).sql('duckdb')} "
                f"AND table_name = {sql.literal(t.name).sql('duckdb')}")
    if text is not None:
        found = db.fetch_all(text)
        if found and found[0][0] is not None and int(found[0][0]) >= 0:
            return int(found[0][0]), text
    q = sqlglot.exp.select(sqlglot.exp.Count(this=sqlglot.exp.Star())).from_(sql.table(table)).where(where)
    text = q.sql(dialect=db.dialect)
    return int(db.fetch_all(text)[0][0] or 0), text


def key_diff_parity(pair: PairConfig, src: Database, tgt: Database, rule: KeyDiffRule) -> KindResult:
    """The cross-database key diff, in full below ``rule.full_below_rows`` source rows, sampled above."""
    from dw_dagster.checks.rowdiff import row_diff_across, row_diff_metadata, row_diff_summary

    t0, run = time.perf_counter(), []
    try:
        rows, q = _source_rows(src, pair.source.table, None)
        run.append(q)
        sample = tuple(rule.sample) if rows >= rule.full_below_rows else None

        def diff(sample):
            return row_diff_across(src, tgt, pair.source.table, pair.target.table, pair.key, pair.compare_columns,
                                   case_insensitive_keys=pair.case_insensitive_keys,
                                   trim_trailing_blanks=pair.trim_trailing_blanks,
                                   timestamp_precision=pair.timestamp_precision,
                                   max_download_rows=rule.max_download_rows, sample_limit=20, sample=sample,
                                   transfer=rule.transfer)
        try:
            r = diff(sample)
        except ValueError as e:  # sampling needs an integer key: compared in full instead, and said so
            if sample is None or "sampling by key buckets" not in str(e):
                raise
            sample = None
            r = diff(None)
            r.warnings.append(f"{e}; compared in full")
    except (DatabaseError, CatalogError, DwDagsterError, ValueError, NotImplementedError) as e:
        return _failed(k.PARITY_KEY_DIFF, e, run)
    md = row_diff_metadata(r)
    md.pop(k.QUERIES_KEY, None)
    values = {"source_rows": rows, "sampled": bool(sample), "sample": list(sample) if sample else None,
              "missing": r.missing, "extra": r.extra, "changed": r.changed, "duplicated_source": r.duplicated_source,
              "duplicated_target": r.duplicated_target, "changed_columns": r.changed_columns,
              "rows_downloaded": r.rows_downloaded, "transfer": r.transfer, "bytes_fetched": r.bytes_fetched}
    desc = row_diff_summary(r)
    if sample:
        desc += f" (sampled: key buckets 0..{sample[0] - 1} of {sample[1]}, {rows:,} source rows)"
    return KindResult(k.PARITY_KEY_DIFF, r.identical and not r.unstable, desc[:1000], values, run + list(r.queries), md,
                      time.perf_counter() - t0)


# -- Lightup --------------------------------------------------------------------------------------------

def lightup_parity(pair: PairConfig, client, now: float | None = None, lookback_s: float = 14 * 86400) -> KindResult:
    """The pair's compare metric: its latest datapoint (every slice at the latest event time) must read 0."""
    t0 = time.perf_counter()
    metric = pair.lightup_compare_metric
    now = now if now is not None else time.time()
    try:
        points = client.datapoints(metric, now - lookback_s, now + 1)
    except Exception as e:  # noqa: BLE001 - the vendor's errors, retried by the client already
        return _failed(k.PARITY_LIGHTUP, e)
    req = f"GET /api/v1/ws/{{ws}}/metrics/{metric}/datapoints?start_ts={now - lookback_s:.0f}&end_ts={now + 1:.0f}"
    if not points:
        return KindResult(k.PARITY_LIGHTUP, False, f"compare metric {metric} has no datapoint in the last "
                          f"{lookback_s / 86400:.0f} days", {"metric": metric, "datapoints": 0}, [req],
                          seconds=time.perf_counter() - t0)
    latest = max(p.get("eventTs") or 0 for p in points)
    last = [p for p in points if (p.get("eventTs") or 0) == latest]
    values = {json.dumps(p.get("slice") or {}, sort_keys=True): p.get("value") for p in last}
    bad = {s: v for s, v in values.items() if v is None or float(v) != 0.0}
    when = dt.datetime.fromtimestamp(latest, dt.timezone.utc).isoformat()
    desc = (f"compare metric {metric} reads 0 at {when} in {len(values)} slice(s)" if not bad else
            f"compare metric {metric} at {when}: " + ", ".join(f"{s} = {v}" for s, v in list(bad.items())[:5]))
    return KindResult(k.PARITY_LIGHTUP, not bad, desc[:1000], {"metric": metric, "event_ts": latest, "values": values},
                      [req], {k.LIGHTUP_METRIC_KEY: metric}, time.perf_counter() - t0)


__all__ = ["KindResult", "closed_scope", "counts_parity", "key_diff_parity", "lightup_parity", "schema_parity"]
