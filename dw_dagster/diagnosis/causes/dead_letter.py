"""Cause: NULLs in a REQUIRED column, routed to a dead-letter table — or dropped when there is none.

A sink whose target column is REQUIRED (``NOT NULL``) rejects a row that carries NULL there. A
well-behaved sink parks the row in a dead-letter table (DLQ) with the error and keeps going; a
careless one drops it. Either way the stream stays green and the target goes short
(``shared/cases/PUBLIC_CASES.md`` C19).

Evidence (one aggregate query and one key query; only counts and bounded key lists come back):

1. **Missing keys**: source keys with no row in the target (NULL-safe key match), per day of
   ``partition_column`` when given, restricted to ``window`` on both sides when given.
2. **NULLs**: of those, the ones with NULL in a REQUIRED column (per column). REQUIRED columns
   are given, or read from the target's catalog (``is_nullable = 'NO'``).
3. **Dead letter**: of those, the ones whose key is in the DLQ (keys matched as text, so a DLQ
   that stores the key as a string still matches), the DLQ's size and its errors.

Where it runs. When source, target and DLQ are one database the queries are pushed down whole.
Across databases, each side's *keys* (with the NULL flags and the day; no payload) are streamed
as Arrow batches of ``batch_rows`` into a local in-memory DuckDB and the same SQL runs there —
the key sets are compared in bounded batches, never fetched as Python rows.
(:func:`dw_dagster.checks.rowdiff.row_diff_across` moves less for a full-table diff, but it
reports a bounded sample of keys and cannot carry the NULL flags or a window, which this cause needs.)

Outcome. Explained = missing rows with a NULL in a REQUIRED column, plus missing rows parked in
the DLQ for another reason; capped at the gap. The rest (missing, no NULL, no DLQ record) is
reported as unexplained with a sample of its keys — never put on this cause. Confidence =
explained / gap × certainty, where certainty is 1.0 when every missing NULL key is in the DLQ
and 0.6 when none is ("dropped, no dead-letter record": the NULL makes the rejection likely, but
no record proves it), linear in between.

Remediation this implies is **not** a partition backfill: rerunning the partition reads the
same NULLs and the sink rejects them again. Fix the NULLs upstream (or relax the column to
NULLABLE, with rollback SQL), then replay the parked rows guarded on the key, then verify.
"""

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from dw_dagster.lineage.sensitive import mask_keyed, rules_in_force
from dw_dagster.databases import Database, DatabaseError, LocalDuckDB
from dw_dagster.databases.snippets import (
    iso,
    key_match,
    key_text,
    lit,
    naive_utc,
    q,
    same_database,
    t,
    to_dialect,
    window_predicate,
)
from dw_dagster.diagnosis.causes.schema_change import required_columns as catalog_required_columns
from dw_dagster.diagnosis.causes.schema_change import schema_snapshot
from dw_dagster.core.models import CauseFinding, Evidence
from dw_dagster.dagster_private import public

KIND = "required_null_dead_letter"
#: certainty when no missing NULL key has a dead-letter record
NO_RECORD_CERTAINTY = 0.6


@public
@dataclass(frozen=True)
class DeadLetterTable:
    """Where a sink parks the rows it rejects.

    Attributes:
        table: ``[catalog.]schema.table``.
        key_columns: the DLQ's columns holding the row key, in the order of the source key
            columns (compared as text; a key inside a JSON payload needs a view that extracts it).
        payload_column: the rejected row as the sink saw it (shown in the evidence sample).
        error_column: the failure reason.
        timestamp_column: when the row was parked; with ``since``, only rows parked at or after it count.
        since: naive or aware UTC.
        database: the database holding the DLQ; None = the target database.
    """

    table: str
    key_columns: Sequence[str]
    payload_column: str | None = None
    error_column: str | None = None
    timestamp_column: str | None = None
    since: dt.datetime | None = None
    database: Database | None = None


def _label(columns: Sequence[str]) -> str:
    return f"REQUIRED column{'s' if len(columns) > 1 else ''} {', '.join(columns)}"


@public
def diagnose_required_nulls(
    source: Database,
    target: Database,
    *,
    source_table: str,
    target_table: str,
    key_columns: Sequence[str],
    required_columns: Sequence[str] | None = None,
    dead_letter: DeadLetterTable | None = None,
    partition_column: str | None = None,
    window: tuple[dt.datetime, dt.datetime] | None = None,
    gap_rows: int | None = None,
    sample_size: int = 20,
    key_list_limit: int = 10_000,
    batch_rows: int = 100_000,
) -> CauseFinding:
    """Explain missing rows by NULLs in REQUIRED columns and the dead-letter table (module docstring).

    Args:
        source, target: the databases (may be the same object or two handles on one database).
        source_table, target_table: ``[catalog.]schema.table`` on each side.
        key_columns: the row key (compound keys allowed; NULL-safe).
        required_columns: the REQUIRED columns; None reads them from the target's catalog.
        dead_letter: the DLQ; None when the sink has none (the "dropped" variant).
        partition_column: a timestamp/date column whose UTC day is the partition; gives the
            per-day breakdown and the finding's ``window``.
        window: (start, end) half-open on ``partition_column`` (UTC), applied to source and target.
        gap_rows: the incident's gap (source − target rows); None = the missing keys counted here.
        sample_size: keys listed in the evidence for each class (explained, unexplained).
        key_list_limit: the explained keys are listed in ``details["explained_keys"]`` when at
            most this many (for :func:`~dw_dagster.diagnosis.combine.combine_findings`).
        batch_rows: Arrow batch size when streaming keys across databases.

    Returns:
        A :class:`~dw_dagster.core.models.CauseFinding` of kind ``required_null_dead_letter``;
        ``details["variant"]`` is ``dead_letter``, ``partly_dead_lettered``,
        ``dropped_no_dead_letter_record`` or ``no_required_nulls``.

    Raises:
        ValueError: ``window`` without ``partition_column``, or no key columns.
        dw_dagster.databases.DatabaseError: a table is missing or a query fails.
    """
    if not key_columns:
        raise ValueError("key_columns must name at least one column")
    if window is not None and partition_column is None:
        raise ValueError("a window needs partition_column")
    diagnosis = _RequiredNulls(source, target, source_table=source_table, target_table=target_table,
                               key_columns=key_columns, required_columns=required_columns, dead_letter=dead_letter,
                               partition_column=partition_column, window=window, gap_rows=gap_rows,
                               sample_size=sample_size, key_list_limit=key_list_limit, batch_rows=batch_rows)
    return diagnosis.untestable() or diagnosis.finding()


class _RequiredNulls:
    """One run of :func:`diagnose_required_nulls`: the REQUIRED columns and the dead-letter table
    resolved, the relations built and placed (pushed down, or keys streamed into a local DuckDB),
    the missing keys counted and listed, the dead-letter table described, then the finding."""

    def __init__(self, source: Database, target: Database, *, source_table: str, target_table: str,
                 key_columns: Sequence[str], required_columns: Sequence[str] | None, dead_letter: DeadLetterTable | None,
                 partition_column: str | None, window: tuple[dt.datetime, dt.datetime] | None, gap_rows: int | None,
                 sample_size: int, key_list_limit: int, batch_rows: int) -> None:
        self.source, self.target, self.source_table, self.target_table = source, target, source_table, target_table
        self.key_columns, self.partition_column, self.window, self.gap_rows = key_columns, partition_column, window, gap_rows
        self.sample_size, self.key_list_limit, self.batch_rows = sample_size, key_list_limit, batch_rows
        self.n = len(key_columns)
        self.required_given = required_columns is not None
        required = list(required_columns) if self.required_given else catalog_required_columns(target, target_table)
        source_cols = {c.name.lower(): c.name for c in schema_snapshot(source, source_table)}
        self.not_in_source = [c for c in required if c.lower() not in source_cols]
        # A REQUIRED key column counts too: a source row whose key is NULL cannot land either (the
        # key match is NULL-safe, so such a row is found missing like any other).
        self.required = [c for c in required if c.lower() in source_cols]
        self.dlq, self.dlq_db, self.dlq_note = self._dead_letter_table(dead_letter)

    def _dead_letter_table(self, dlq: DeadLetterTable | None):
        """The DLQ (None when there is none or it is missing), its database, and a note when missing."""
        dlq_db = (dlq.database or self.target) if dlq else None
        dlq_note = None
        if dlq is not None:
            if len(dlq.key_columns) != self.n:
                raise ValueError(f"the dead-letter table has {len(dlq.key_columns)} key column(s), the source {self.n}")
            try:
                schema_snapshot(dlq_db, dlq.table)
            except DatabaseError as e:
                dlq_note = f"dead-letter table {dlq.table} not found: {str(e).splitlines()[0]}"
                dlq = None
        return dlq, dlq_db, dlq_note

    def untestable(self) -> CauseFinding | None:
        """The finding when there is nothing to test (no REQUIRED column and no DLQ), else None."""
        if self.required or self.dlq is not None:
            return None
        return CauseFinding(
            kind=KIND, summary=f"no REQUIRED column in {self.target_table}" + (f" ({self.dlq_note})" if self.dlq_note else "")
            + " and no dead-letter table; cannot test this cause",
            confidence=0.0, explained_rows=0, unexplained_rows=max(0, self.gap_rows or 0),
            details={"tested": False, "required_columns": [], "required_not_in_source": self.not_in_source})

    def _relations(self) -> None:
        """The three relations (source keys with NULL flags, target keys, DLQ keys), in DuckDB's dialect."""
        key_columns, required, dlq = self.key_columns, self.required, self.dlq
        self.pc = pc = q(self.partition_column) if self.partition_column else None
        nulls = [f"CASE WHEN {q(c)} IS NULL THEN 1 ELSE 0 END AS dw_null{j}" for j, c in enumerate(required)]
        any_null = " OR ".join(f"{q(c)} IS NULL" for c in required) or "1 = 0"
        s_cols = [f"{q(k)} AS dw_k{i}" for i, k in enumerate(key_columns)] + key_text(key_columns) + nulls
        s_cols.append(f"CASE WHEN {any_null} THEN 1 ELSE 0 END AS dw_null")
        if pc:
            s_cols.append(f"CAST(CAST({pc} AS DATE) AS VARCHAR) AS dw_day")
        where = f" WHERE {window_predicate(self.partition_column, self.window)}" if self.window else ""
        self.s_sql = f"SELECT {', '.join(s_cols)} FROM {t(self.source_table)}{where}"
        self.t_sql = f"SELECT {', '.join(key_text(key_columns))} FROM {t(self.target_table)}{where}"
        self.d_sql = None
        if dlq is not None:
            d_cols = key_text(dlq.key_columns)
            d_cols.append(f"CAST({q(dlq.error_column)} AS VARCHAR) AS dw_err" if dlq.error_column else "CAST(NULL AS VARCHAR) AS dw_err")
            since = naive_utc(dlq.since)
            cond = f" WHERE {q(dlq.timestamp_column)} >= {lit(since)}" if (dlq.timestamp_column and since) else ""
            self.d_sql = f"SELECT {', '.join(d_cols)} FROM {t(dlq.table)}{cond}"

    def _place(self) -> None:
        """Push the relations down to one database, or stream each side's keys into a local DuckDB."""
        source, n, s_sql, t_sql, d_sql = self.source, self.n, self.s_sql, self.t_sql, self.d_sql
        self.local = None
        self.pushed = same_database(source, self.target) and (self.dlq is None or same_database(source, self.dlq_db))
        self.evidence_db = source.name if self.pushed else LocalDuckDB.name
        self.streamed = []
        if self.pushed:
            self.dialect = source.dialect
            self.rel_s, self.rel_t, self.rel_d = f"({s_sql})", f"({t_sql})", (f"({d_sql})" if d_sql else None)
        else:
            local = self.local = LocalDuckDB()
            self.dialect = "duckdb"
            key_types = [(f"dw_k{i}", None) for i in range(n)]
            kt = [(f"dw_kc{i}", "VARCHAR") for i in range(n)] + [(f"dw_kn{i}", "INTEGER") for i in range(n)]
            s_types = key_types + kt + [(f"dw_null{j}", "INTEGER") for j in range(len(self.required))] + [("dw_null", "INTEGER")]
            if self.pc:
                s_types.append(("dw_day", "VARCHAR"))
            for name, db, query, types in (("dw_src", source, s_sql, s_types), ("dw_tgt", self.target, t_sql, kt),
                                           *((("dw_dlq", self.dlq_db, d_sql, kt + [("dw_err", "VARCHAR")]),) if d_sql else ())):
                qq = to_dialect(query, db.dialect)
                rows = local.load(name, types, db.fetch_batches(qq, self.batch_rows))
                self.streamed.append({"table": name, "database": db.name, "sql": qq, "rows": rows})
            self.rel_s, self.rel_t = "(SELECT * FROM dw_src)", "(SELECT * FROM dw_tgt)"
            self.rel_d = "(SELECT * FROM dw_dlq)" if d_sql else None
        self.run_db = source if self.pushed else self.local

    def _count_missing(self) -> None:
        """The missing keys per day: with a NULL in a REQUIRED column, dead-lettered, per column."""
        n, pc, required, rel_d = self.n, self.pc, self.required, self.rel_d
        self.kc = kc = ", ".join(f"dw_kc{i}, dw_kn{i}" for i in range(n))
        self.ctes = ctes = (
            f"WITH dw_s AS {self.rel_s}, dw_t AS {self.rel_t}, "
            + (f"dw_d AS (SELECT DISTINCT {kc} FROM {rel_d} AS z), " if rel_d else "")
            + f"dw_m AS (SELECT s.* FROM dw_s AS s WHERE NOT EXISTS (SELECT 1 FROM dw_t AS t WHERE {key_match(n, 't', 's')})), "
            + "dw_x AS (SELECT m.*, " + (f"CASE WHEN EXISTS (SELECT 1 FROM dw_d AS d WHERE {key_match(n, 'd', 'm')}) THEN 1 ELSE 0 END"
                                          if rel_d else "0") + " AS dw_in FROM dw_m AS m) ")
        per_col = "".join(f", COUNT(CASE WHEN dw_null{j} = 1 THEN 1 END)" for j in range(len(required)))
        self.agg_sql = to_dialect(
            ctes + ("SELECT dw_day, " if pc else "SELECT ")
            + "COUNT(*), COUNT(CASE WHEN dw_null = 1 THEN 1 END), COUNT(CASE WHEN dw_null = 1 AND dw_in = 1 THEN 1 END), "
            f"COUNT(CASE WHEN dw_null = 0 AND dw_in = 1 THEN 1 END){per_col} FROM dw_x"
            + (" GROUP BY dw_day ORDER BY dw_day" if pc else ""), self.dialect)
        self.days = days = []
        for r in self.run_db.fetch_all(self.agg_sql):
            r = list(r)
            day = r.pop(0) if pc else None
            missing, missing_null, null_parked, other_parked = (int(x or 0) for x in r[:4])
            if missing == 0:
                continue
            days.append({"partition": day, "missing_rows": missing, "missing_with_null": missing_null,
                         "null_rows_dead_lettered": null_parked, "other_rows_dead_lettered": other_parked,
                         "nulls_per_column": {c: int(v or 0) for c, v in zip(required, r[4:])}})

    def _list_keys(self) -> None:
        """The explained keys (up to the list limit) and a sample of the unexplained ones."""
        n, sample_size = self.n, self.sample_size
        keys_sel = ", ".join(f"dw_k{i}" for i in range(n))
        order = ", ".join(f"dw_k{i} NULLS FIRST" for i in range(n))
        self.keys_sql = to_dialect(
            self.ctes + f"SELECT {keys_sel}, dw_null, dw_in, cls FROM (SELECT {keys_sel}, dw_null, dw_in, "
            "CASE WHEN dw_null = 1 OR dw_in = 1 THEN 1 ELSE 0 END AS cls, "
            f"ROW_NUMBER() OVER (PARTITION BY CASE WHEN dw_null = 1 OR dw_in = 1 THEN 1 ELSE 0 END ORDER BY {order}) AS rn "
            f"FROM dw_x) AS y WHERE (cls = 1 AND rn <= {int(self.key_list_limit) + 1}) OR (cls = 0 AND rn <= {int(sample_size)}) "
            f"ORDER BY cls DESC, {order}", self.dialect)
        key_rows = self.run_db.fetch_all(self.keys_sql)
        self.explained_keys = [list(r[:n]) for r in key_rows if r[n + 2] == 1]
        self.unexplained_sample = [list(r[:n]) for r in key_rows if r[n + 2] == 0]
        self.explained_sample = [{"key": list(r[:n]), "null_in_required": bool(r[n]), "dead_lettered": bool(r[n + 1])}
                                 for r in key_rows if r[n + 2] == 1][:sample_size]

    def _dead_letter_evidence(self) -> list[Evidence]:
        """The dead-letter table itself: its rows, distinct keys and errors, and the parked missing keys' payloads."""
        dlq, dlq_db, n, d_sql, sample_size = self.dlq, self.dlq_db, self.n, self.d_sql, self.sample_size
        self.dlq_info = dlq_info = {"table": dlq.table if dlq else None, "present": dlq is not None}
        if self.dlq_note:
            dlq_info["note"] = self.dlq_note
        evidence: list[Evidence] = []
        if dlq is None:
            return evidence
        stats_sql = to_dialect(
            f"SELECT COUNT(*), (SELECT COUNT(*) FROM (SELECT DISTINCT {self.kc} FROM ({d_sql}) AS a) AS b) FROM ({d_sql}) AS c",
            dlq_db.dialect)
        err_sql = to_dialect(f"SELECT dw_err, COUNT(*) FROM ({d_sql}) AS e GROUP BY dw_err ORDER BY 2 DESC, 1 LIMIT 10",
                             dlq_db.dialect)
        rows_, keys_ = dlq_db.fetch_all(stats_sql)[0]
        errors = [{"error": e, "rows": int(c)} for e, c in dlq_db.fetch_all(err_sql)]
        dlq_info.update(rows=int(rows_), distinct_keys=int(keys_), errors=errors)
        evidence.append(Evidence(description=f"rows and distinct keys parked in {dlq.table}, and their errors",
                                 database=dlq_db.name, sql=f"{stats_sql};\n{err_sql}",
                                 values={"rows": int(rows_), "distinct_keys": int(keys_), "errors": errors}))
        parked = [s["key"] for s in self.explained_sample if s["dead_lettered"]]
        if parked and dlq.payload_column:
            kcols = [q(c) for c in dlq.key_columns]
            match = " OR ".join("(" + " AND ".join(
                f"{c} IS NULL" if v is None else f"CAST({c} AS VARCHAR) = {lit(str(v))}" for c, v in zip(kcols, key)) + ")"
                for key in parked)
            err = f", CAST({q(dlq.error_column)} AS VARCHAR)" if dlq.error_column else ""
            pay_sql = to_dialect(f"SELECT {', '.join(kcols)}{err}, CAST({q(dlq.payload_column)} AS VARCHAR) FROM {t(dlq.table)} "
                                 f"WHERE {match} ORDER BY {', '.join(kcols)} LIMIT {int(sample_size)}", dlq_db.dialect)
            evidence.append(Evidence(
                description=f"dead-letter records of the first {len(parked)} parked missing keys, with their payload",
                database=dlq_db.name, sql=pay_sql, key_columns=list(dlq.key_columns),
                values=[{"key": list(r[:n]), **({"error": r[n]} if err else {}), "payload": (r[-1] or "")[:500]}
                        for r in dlq_db.fetch_all(pay_sql)]))
        return evidence

    def _totals(self) -> None:
        """Sums over the days, the gap, explained and unexplained rows, certainty and confidence."""
        days, required = self.days, self.required
        self.missing = sum(d["missing_rows"] for d in days)
        self.missing_null = missing_null = sum(d["missing_with_null"] for d in days)
        self.null_parked = null_parked = sum(d["null_rows_dead_lettered"] for d in days)
        self.other_parked = sum(d["other_rows_dead_lettered"] for d in days)
        self.per_column = {c: sum(d["nulls_per_column"][c] for d in days) for c in required}
        self.gap = gap = self.gap_rows if self.gap_rows is not None else self.missing
        raw_explained = missing_null + self.other_parked
        self.explained = explained = max(0, min(raw_explained, gap))
        self.unexplained = max(0, gap - explained)
        self.certainty = certainty = ((NO_RECORD_CERTAINTY + (1 - NO_RECORD_CERTAINTY) * null_parked / missing_null)
                                      if missing_null else 1.0)
        self.confidence = round(min(1.0, explained / gap) * certainty, 4) if gap > 0 else 0.0
        self.null_cols = [c for c in required if self.per_column[c]] or required
        dlq_keys = self.dlq_info.get("distinct_keys")
        self.keys_equal = bool(self.dlq is not None and missing_null and dlq_keys == null_parked == missing_null
                               and self.other_parked == 0)

    def _summary(self) -> str:
        """The variant (``details["variant"]``) and the finding's summary sentence."""
        dlq, dlq_info, dlq_note, required = self.dlq, self.dlq_info, self.dlq_note, self.required
        missing, missing_null, null_parked, other_parked = self.missing, self.missing_null, self.null_parked, self.other_parked
        null_cols, unexplained, unexplained_sample = self.null_cols, self.unexplained, self.unexplained_sample
        label = _label(null_cols)
        if missing_null == 0:
            variant, head = "no_required_nulls", f"no missing row has a NULL in {_label(required) if required else 'a REQUIRED column'}"
            if other_parked:
                head += f"; {other_parked} missing row(s) are parked in {dlq.table} for another reason"
        elif null_parked == missing_null:
            variant, head = "dead_letter", f"NULL in {label} → dead letter"
        elif null_parked == 0:
            variant, head = "dropped_no_dead_letter_record", f"NULL in {label} → dropped, no dead-letter record"
        else:
            variant, head = "partly_dead_lettered", f"NULL in {label} → dead letter ({null_parked} of {missing_null}), the rest dropped with no record"
        self.variant = variant
        parts = [head + ":"]
        if missing_null:
            parts.append(f"{missing_null} of {missing} missing row(s) have {' or '.join(null_cols)} NULL in the source;")
            if dlq is None:
                parts.append("there is no dead-letter table" + (f" ({dlq_note})" if dlq_note else "") + ", so they were dropped without a record;")
            elif null_parked == 0:
                parts.append(f"none of them is in {dlq.table} ({dlq_info['rows']} row(s) parked), so they were dropped without a record;")
            else:
                errs = ", ".join(f"{e['error']!r} ×{e['rows']}" for e in dlq_info["errors"][:3])
                parts.append(f"{'all ' if null_parked == missing_null else ''}{null_parked} of them are parked in {dlq.table} ({errs})"
                             + ("; the dead-letter keys equal the missing NULL keys;" if self.keys_equal else ";"))
        parts.append(f"explains {self.explained} of {self.gap} missing row(s); {unexplained} unexplained"
                     + (f" (missing, no NULL in a REQUIRED column, no dead-letter record: e.g. keys "
                        f"{mask_keyed(unexplained_sample[:5], list(self.key_columns), rules_in_force())[0]})"
                        if unexplained and unexplained_sample else "") + ".")
        return " ".join(parts)

    def _count_evidence(self) -> list[Evidence]:
        """The evidence of the count (pushed down, or streamed then counted locally) and of the key lists."""
        pc, days, streamed, evidence_db = self.pc, self.days, self.streamed, self.evidence_db
        if self.pushed:
            first = Evidence(
                description="missing source keys (no row in the target), how many have a NULL in a REQUIRED column, and how "
                "many of those are in the dead-letter table" + (", per day" if pc else ""),
                database=evidence_db, sql=self.agg_sql, values=days)
        else:
            first = Evidence(
                description="keys streamed from each database into a local DuckDB (Arrow batches), then the missing keys, "
                "their NULLs and dead-letter records counted there" + (", per day" if pc else ""),
                database=" | ".join(s["database"] for s in streamed) + f" → {evidence_db}",
                sql=";\n".join(s["sql"] for s in streamed) + f";\n-- local:\n{self.agg_sql}",
                values={"streamed_rows": {s["table"]: s["rows"] for s in streamed}, "per_day": days})
        keys = Evidence(
            description=f"missing keys explained (NULL in a REQUIRED column or dead-lettered; first {len(self.explained_sample)}) "
            f"and unexplained (first {len(self.unexplained_sample)})",
            database=evidence_db, sql=self.keys_sql, key_columns=list(self.key_columns),
            values={"explained": self.explained_sample, "unexplained": self.unexplained_sample})
        return [first, keys]

    def _details(self) -> dict:
        """``CauseFinding.details``: the counts, the DLQ, the key lists and the remediation this implies."""
        dlq, required, null_cols, missing_null, other_parked = self.dlq, self.required, self.null_cols, self.missing_null, self.other_parked
        return {
            "tested": True,
            "variant": self.variant,
            "required_columns": required,
            "required_columns_source": "given" if self.required_given else "target catalog (is_nullable = 'NO')",
            "required_not_in_source": self.not_in_source,
            "missing_rows": self.missing,
            "missing_with_null": missing_null,
            "nulls_per_column": self.per_column,
            "null_rows_dead_lettered": self.null_parked,
            "other_rows_dead_lettered": other_parked,
            "dead_letter": self.dlq_info,
            "dlq_keys_equal_missing_null_keys": self.keys_equal,
            "certainty": round(self.certainty, 4),
            "unexplained_sample": self.unexplained_sample,
            "explained_keys": [[iso(v) for v in k] for k in self.explained_keys[:self.key_list_limit]],
            "explained_keys_complete": len(self.explained_keys) <= self.key_list_limit,
            "per_partition": [{"partition": d["partition"], "gap_rows": d["missing_rows"],
                               "explained_rows": d["missing_with_null"] + d["other_rows_dead_lettered"]}
                              for d in self.days] if self.pc else [],
            "pushed_down": self.pushed,
            "window": [iso(naive_utc(w)) for w in self.window] if self.window else None,
            "remediation": (
                "Not a partition backfill: a rerun reads the same NULLs and the sink rejects them again. Fix the NULLs "
                "upstream (or relax " + ", ".join(null_cols or required) + " to NULLABLE, with rollback SQL), then replay the "
                + (f"parked rows from {dlq.table}" if dlq is not None else "missing rows from the source")
                + f" guarded on {', '.join(self.key_columns)} (expected {missing_null + other_parked} row(s)), then verify."
            ) if (missing_null or other_parked) else None,
        }

    def finding(self) -> CauseFinding:
        """Run the queries and compose the finding."""
        self._relations()
        self._place()
        self._count_missing()
        self._list_keys()
        evidence = self._dead_letter_evidence()
        self._totals()
        summary = self._summary()
        evidence = self._count_evidence() + evidence
        if self.local is not None:
            self.local.close()
        days = self.days
        window_days = sorted(d["partition"] for d in days if d["missing_with_null"] + d["other_rows_dead_lettered"] > 0) if self.pc else []
        return CauseFinding(kind=KIND, summary=summary, confidence=self.confidence, explained_rows=self.explained,
                            unexplained_rows=self.unexplained, window=window_days, details=self._details(), evidence=evidence)
