"""Cause: the schema of a source or target table changed (column added, dropped, renamed, retyped,
nullability changed), detected from schema snapshots kept as Dagster metadata between runs.

Recording. :func:`schema_snapshot` reads a table's columns from the database's catalog
(``information_schema.columns`` on DuckDB, PostgreSQL, Snowflake and other SQL engines; the
tables API on BigQuery, which also gives each field's ``REQUIRED``/``NULLABLE`` mode).
:func:`take_schema_snapshot` wraps it with the time, the table and the query it ran;
:func:`schema_metadata` turns it into a ``dw/schema`` JSON metadata entry to put on a
materialization (``MaterializeResult(metadata={**schema_metadata(snap), ...})``) or an
observation; :func:`record_schema_snapshot` logs that observation from any op or asset, and
:func:`build_schema_snapshot_check` is an asset check that records a snapshot on each evaluation
and fails when the schema changed since the previous one.

Comparing. :func:`diff_schemas` classifies the differences between two snapshots; see its
docstring for how a rename is told from a drop plus an add.

Diagnosing. :func:`diagnose_schema_change` reads the ``dw/schema`` snapshots of the given assets
back from the event log and compares, per table, the newest snapshot with the newest one that
differs from it (the "last two" distinct schemas), which brackets when the change happened.
A schema change counts no rows by itself: the finding's ``explained_rows`` is 0 and its
``confidence`` is a prior for how likely such a change is to lose rows (see the function).
"""

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any, Literal

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.databases import sql
from dw_dagster.databases import Database, DatabaseError
from dw_dagster.databases.snippets import DAGSTER_EVENT_LOG, lit, to_dialect
from dw_dagster.core.models import CauseFinding, Evidence, stable_hash, utcnow
from dw_dagster.core import keys as _keys
from dw_dagster.dagster_private import public

KIND = "schema_change"
SCHEMA_KEY = _keys.SCHEMA_KEY
SCHEMA_HASH_KEY = _keys.SCHEMA_HASH_KEY
#: changes that can make a sink reject or lose rows
BREAKING = ("dropped", "renamed", "retyped", "nullability_tightened")
#: confidence of a finding with at least one breaking change, and with only non-breaking ones
BREAKING_CONFIDENCE = 0.5
NON_BREAKING_CONFIDENCE = 0.1

_SIZED = {"NUMERIC", "DECIMAL", "NUMBER"}
_LENGTHED = {"CHARACTER VARYING", "VARCHAR", "CHARACTER", "CHAR", "BPCHAR", "NVARCHAR", "TEXT", "STRING"}


class ColumnInfo(BaseModel):
    """One column as the catalog describes it.

    ``data_type`` is upper case and carries precision/scale or length when the catalog gives
    them separately (PostgreSQL ``numeric`` → ``NUMERIC(18,2)``); ``nullable`` is None when the
    database does not say; ``position`` is the 1-based ordinal position.
    """

    name: str
    data_type: str
    nullable: bool | None
    position: int


class SchemaSnapshot(BaseModel):
    """A table's columns at one time, with the query that read them (for the evidence)."""

    table: str
    database: str
    taken_at: dt.datetime = Field(description="UTC")
    columns: list[ColumnInfo]
    sql: str
    hash: str = Field(description="stable hash of the (name, type, nullable, position) list")


class SchemaChange(BaseModel):
    """One difference between two snapshots of a table.

    ``kind``: ``added``, ``dropped``, ``renamed`` (``column`` → ``new_column``), ``retyped``,
    ``nullability_tightened`` (NULLABLE → REQUIRED) or ``nullability_relaxed`` (REQUIRED → NULLABLE).
    """

    kind: Literal["added", "dropped", "renamed", "retyped", "nullability_tightened", "nullability_relaxed"]
    column: str
    new_column: str | None = None
    before: ColumnInfo | None = None
    after: ColumnInfo | None = None
    description: str


def _full_type(data_type: Any, length: Any, precision: Any, scale: Any) -> str:
    ty = str(data_type).upper().strip()
    if "(" in ty:
        return ty
    if ty in _SIZED and precision is not None:
        return f"{ty}({int(precision)},{int(scale or 0)})"
    if ty in _LENGTHED and length is not None:
        return f"{ty}({int(length)})"
    return ty


def _nullable(v: Any) -> bool | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return v
    s = str(v).strip().upper()
    return True if s in ("YES", "Y", "TRUE", "1") else False if s in ("NO", "N", "FALSE", "0") else None


def _bigquery_snapshot(db: Any, table: str) -> tuple[list[ColumnInfo], str]:
    parts = sql.table_parts(table)
    if len(parts) == 3:
        ref = ".".join(parts)
    elif len(parts) == 2:
        ref = ".".join([db.project, *parts] if db.project else parts)
    else:
        ref = ".".join(p for p in (db.project, db.dataset, *parts) if p)
    try:
        with db.client() as client:
            fields = client.get_table(ref).schema
    except Exception as e:
        raise DatabaseError(f"{db.name}: table {table} not found: {type(e).__name__}: {str(e).splitlines()[0]}") from e
    cols = []
    for i, f in enumerate(fields, start=1):
        ty = f.field_type.upper()
        if getattr(f, "precision", None) is not None:
            ty = _full_type(ty, None, f.precision, getattr(f, "scale", None))
        if f.mode == "REPEATED":
            ty = f"ARRAY<{ty}>"
        cols.append(ColumnInfo(name=f.name, data_type=ty, nullable=f.mode != "REQUIRED", position=i))
    return cols, f"bigquery tables.get {ref} (schema fields: name, field_type, mode)"


def _catalog_sql(db: Database, table: str) -> str:
    tb = sql.table(table)
    cond = f"LOWER(table_name) = {lit(tb.name.lower())}"
    if tb.args.get("db") is not None:
        cond += f" AND LOWER(table_schema) = {lit(tb.args['db'].name.lower())}"
    if tb.args.get("catalog") is not None:
        cond += f" AND LOWER(table_catalog) = {lit(tb.args['catalog'].name.lower())}"
    return to_dialect(
        "SELECT column_name, data_type, is_nullable, ordinal_position, character_maximum_length, numeric_precision, "
        f"numeric_scale FROM information_schema.columns WHERE {cond} ORDER BY ordinal_position", db.dialect)


@public
def schema_snapshot(db: Database, table: str) -> list[ColumnInfo]:
    """The columns of ``table`` in ``db``, in ordinal order.

    Args:
        db: any :class:`~dw_dagster.databases.Database`.
        table: ``[catalog.]schema.table``; names are matched case-insensitively.

    Returns:
        One :class:`ColumnInfo` per column.

    Raises:
        DatabaseError: the table does not exist (no columns visible) or the catalog query failed.
    """
    return _snapshot(db, table)[0]


def _snapshot(db: Database, table: str) -> tuple[list[ColumnInfo], str]:
    if db.dialect == "bigquery" and hasattr(db, "client"):
        return _bigquery_snapshot(db, table)
    q = _catalog_sql(db, table)
    rows = db.fetch_all(q)
    if not rows:
        raise DatabaseError(f"{db.name}: table {table} not found (no columns in information_schema)")
    return [ColumnInfo(name=str(r[0]), data_type=_full_type(r[1], r[4], r[5], r[6]), nullable=_nullable(r[2]),
                       position=int(r[3])) for r in rows], q


def required_columns(db: Database, table: str) -> list[str]:
    """Columns the catalog marks NOT NULL / REQUIRED (empty when it says none or does not say).

    Raises:
        DatabaseError: the table does not exist.
    """
    return [c.name for c in schema_snapshot(db, table) if c.nullable is False]


def _hash(columns: Sequence[ColumnInfo]) -> str:
    return stable_hash([[c.name, c.data_type, c.nullable, c.position] for c in columns], 16)


@public
def take_schema_snapshot(db: Database, table: str, *, now: dt.datetime | None = None) -> SchemaSnapshot:
    """:func:`schema_snapshot` with the time (UTC), the table, the database name and the query.

    Raises:
        DatabaseError: the table does not exist.
    """
    cols, q = _snapshot(db, table)
    return SchemaSnapshot(table=table, database=db.name, taken_at=now or utcnow(), columns=cols, sql=q, hash=_hash(cols))


@public
def schema_metadata(snapshot: SchemaSnapshot) -> dict[str, dg.MetadataValue]:
    """The metadata entries that record ``snapshot``: ``dw/schema`` (JSON) and ``dw/schema_hash``.

    Put them on a materialization or an observation of the asset the table belongs to; the
    cause reads them back with :func:`schema_history`. One asset may carry snapshots of several
    tables (each entry names its table).
    """
    return {SCHEMA_KEY: dg.MetadataValue.json(snapshot.model_dump(mode="json")),
            SCHEMA_HASH_KEY: dg.MetadataValue.text(snapshot.hash)}


@public
def record_schema_snapshot(context: dg.OpExecutionContext | dg.AssetExecutionContext, asset_key: dg.AssetKey,
                           db: Database, table: str) -> SchemaSnapshot:
    """Take a snapshot of ``table`` and log it as an ``AssetObservation`` on ``asset_key``.

    Call it from the loader's asset or op (before or after it writes), or from any job.

    Raises:
        DatabaseError: the table does not exist.
    """
    snap = take_schema_snapshot(db, table)
    log = getattr(context, "op_execution_context", context)
    log.log_event(dg.AssetObservation(asset_key=asset_key, description=f"schema of {table}: {len(snap.columns)} columns",
                                      metadata=schema_metadata(snap)))
    return snap


def schema_history(instance: dg.DagsterInstance, asset_key: dg.AssetKey, table: str | None = None,
                   limit: int = 500) -> list[SchemaSnapshot]:
    """``dw/schema`` snapshots recorded on ``asset_key`` (observations and materializations), newest first.

    Args:
        instance: the Dagster instance.
        asset_key: the asset the snapshots were recorded on.
        table: only snapshots of this table (matched case-insensitively), or all.
        limit: read at most this many events of each kind (newest first).
    """
    out: list[SchemaSnapshot] = []
    for fetch, attr in ((instance.fetch_observations, "asset_observation"),
                        (instance.fetch_materializations, "asset_materialization")):
        for rec in fetch(asset_key, limit=limit).records:
            md = getattr(rec, attr).metadata if getattr(rec, attr) else {}
            if SCHEMA_KEY not in md:
                continue
            v = getattr(md[SCHEMA_KEY], "value", md[SCHEMA_KEY])
            data = json.loads(v) if isinstance(v, str) else v
            snap = SchemaSnapshot.model_validate(data)
            if table is None or snap.table.lower() == table.lower():
                out.append(snap)
    return sorted(out, key=lambda s: s.taken_at, reverse=True)


def _desc(c: ColumnInfo) -> str:
    return f"{c.data_type} {'NULLABLE' if c.nullable else 'REQUIRED' if c.nullable is False else '(nullability unknown)'}"


@public
def diff_schemas(before: Sequence[ColumnInfo], after: Sequence[ColumnInfo]) -> list[SchemaChange]:
    """Classify how ``after`` differs from ``before``.

    Columns are matched by name (case-insensitively). A column only in ``before`` is *dropped*,
    one only in ``after`` is *added*, unless the two form a **rename**: a dropped column and an
    added column are a rename when they have the same data type, the same nullability and the
    same ordinal position, and no other dropped or added column also fits that pairing
    (``ALTER TABLE ... RENAME COLUMN`` keeps type, nullability and position on DuckDB,
    PostgreSQL and Snowflake). Anything weaker — same type at another position, two candidates —
    stays a drop plus an add, because a wrongly guessed rename would hide lost data. A column
    present in both with another data type is *retyped*; with another nullability it is
    *nullability_tightened* (NULLABLE → REQUIRED) or *nullability_relaxed*; both can apply to one
    column. A position that moved only because another column was added or dropped is not a change.

    Returns:
        Changes ordered by kind (dropped, renamed, retyped, nullability, added), then by column.
    """
    b = {c.name.lower(): c for c in before}
    a = {c.name.lower(): c for c in after}
    dropped = [b[n] for n in b if n not in a]
    added = [a[n] for n in a if n not in b]
    changes: list[SchemaChange] = []
    renamed_from, renamed_to = set(), set()
    for d in dropped:
        fits = [x for x in added if x.data_type == d.data_type and x.nullable == d.nullable and x.position == d.position]
        if len(fits) != 1:
            continue
        x = fits[0]
        rivals = [y for y in dropped if y is not d and y.data_type == x.data_type and y.nullable == x.nullable
                  and y.position == x.position]
        if rivals:
            continue
        renamed_from.add(d.name.lower())
        renamed_to.add(x.name.lower())
        changes.append(SchemaChange(kind="renamed", column=d.name, new_column=x.name, before=d, after=x,
                                    description=f"{d.name} renamed to {x.name} ({_desc(x)}, position {x.position})"))
    for d in dropped:
        if d.name.lower() not in renamed_from:
            changes.append(SchemaChange(kind="dropped", column=d.name, before=d, description=f"{d.name} dropped (was {_desc(d)})"))
    for x in added:
        if x.name.lower() not in renamed_to:
            changes.append(SchemaChange(kind="added", column=x.name, after=x, description=f"{x.name} added ({_desc(x)})"))
    for n, old in b.items():
        new = a.get(n)
        if new is None:
            continue
        if old.data_type != new.data_type:
            changes.append(SchemaChange(kind="retyped", column=new.name, before=old, after=new,
                                        description=f"{new.name} retyped {old.data_type} → {new.data_type}"))
        if old.nullable is not None and new.nullable is not None and old.nullable != new.nullable:
            kind = "nullability_tightened" if not new.nullable else "nullability_relaxed"
            changes.append(SchemaChange(
                kind=kind, column=new.name, before=old, after=new,
                description=f"{new.name} {'NULLABLE → REQUIRED' if kind == 'nullability_tightened' else 'REQUIRED → NULLABLE'}"))
    order = {"dropped": 0, "renamed": 1, "retyped": 2, "nullability_tightened": 3, "nullability_relaxed": 4, "added": 5}
    return sorted(changes, key=lambda ch: (order[ch.kind], ch.column.lower()))


def latest_change(history: Sequence[SchemaSnapshot]) -> tuple[SchemaSnapshot, SchemaSnapshot, SchemaSnapshot] | None:
    """In a newest-first history of one table: (last snapshot with the old schema, first snapshot
    with the current schema, newest snapshot), or None when every snapshot has the same schema."""
    if not history:
        return None
    newest = history[0]
    first_new = newest
    for snap in history[1:]:
        if snap.hash != newest.hash:
            return snap, first_new, newest
        first_new = snap
    return None


@public
def build_schema_snapshot_check(
    *,
    asset: dg.AssetKey | str | Sequence[str],
    table: str,
    resource_key: str = "warehouse",
    name: str = _keys.SCHEMA_CHANGE_CHECK,
    fail_on: Sequence[str] = BREAKING,
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.WARN,
) -> dg.AssetChecksDefinition:
    """An asset check that records a ``dw/schema`` snapshot of ``table`` and compares it with the previous one.

    Each evaluation reads the previous snapshot of ``table`` from the asset's event log, takes a
    new one, logs it as an ``AssetObservation`` on the asset (so :func:`diagnose_schema_change`
    finds it), and fails when :func:`diff_schemas` finds a change whose kind is in ``fail_on``
    (default: dropped, renamed, retyped, nullability tightened). The first evaluation passes
    (nothing to compare with).

    Args:
        asset: the asset the table belongs to.
        table: ``[catalog.]schema.table``.
        resource_key: the ``DatabaseResource`` holding the table.
        name: the check name.
        fail_on: change kinds that fail the check; the others are reported in metadata only.

    Returns:
        An ``AssetChecksDefinition``; metadata ``dw/schema_changes`` (JSON list), ``dw/schema_hash``.
    """
    sql.table(table)
    key = dg.AssetKey.from_coercible(asset) if not isinstance(asset, dg.AssetKey) else asset

    @dg.asset_check(asset=key, name=name, blocking=blocking, required_resource_keys={resource_key},
                    metadata={_keys.CHECK_KIND_KEY: KIND, _keys.TABLE_KEY: table},
                    description=f"Records the schema of {table} and fails when a column is dropped, renamed, retyped or made REQUIRED.")
    def _schema_check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        db = getattr(context.resources, resource_key).get_database()
        previous = next(iter(schema_history(context.instance, key, table)), None)
        snap = take_schema_snapshot(db, table)
        context.op_execution_context.log_event(dg.AssetObservation(
            asset_key=key, description=f"schema of {table}: {len(snap.columns)} columns", metadata=schema_metadata(snap)))
        changes = diff_schemas(previous.columns, snap.columns) if previous else []
        failing = [ch for ch in changes if ch.kind in fail_on]
        since = f" since {previous.taken_at.isoformat()}" if previous else " (first snapshot)"
        return dg.AssetCheckResult(
            passed=not failing, severity=severity,
            description=(f"{len(changes)} schema change(s) in {table}{since}: " + "; ".join(ch.description for ch in changes))
            if changes else f"schema of {table} unchanged{since}",
            metadata={_keys.SCHEMA_CHANGES_KEY: dg.MetadataValue.json([ch.model_dump(mode="json") for ch in changes]),
                      SCHEMA_HASH_KEY: snap.hash, _keys.QUERY_KEY: dg.MetadataValue.md(f"```sql\n{snap.sql}\n```")},
        )

    return _schema_check


@public
def diagnose_schema_change(
    instance: dg.DagsterInstance,
    asset_keys: Sequence[dg.AssetKey],
    *,
    tables: Sequence[str] | None = None,
    as_of: dt.datetime | None = None,
    gap_rows: int = 0,
) -> CauseFinding:
    """Look for a schema change in the ``dw/schema`` snapshots recorded on ``asset_keys``.

    Per (asset, database, table): the snapshots taken at or before ``as_of`` (the incident's
    detection time; a change first seen later cannot have caused it), newest first; the newest
    is compared with the newest snapshot whose schema differs (:func:`latest_change`), and the
    change is dated between the last snapshot with the old schema and the first with the new one.

    Confidence is a prior, because a schema change counts no rows: ``0.5`` when some change can
    reject or lose rows (dropped, renamed, retyped, nullability tightened), ``0.1`` when only
    columns were added or relaxed, ``0.0`` when nothing changed or fewer than two snapshots exist.
    ``explained_rows`` is 0 and ``unexplained_rows`` is ``abs(gap_rows)``: the rows are counted by
    the cause the change leads to (e.g. a REQUIRED column now receiving NULLs → dead letter).

    Args:
        instance: the Dagster instance holding the snapshots.
        asset_keys: assets to read (the incident's asset and its upstream sources).
        tables: only these tables (case-insensitive), or every table with snapshots.
        as_of: ignore snapshots taken after this time (UTC); None reads all.
        gap_rows: the incident's gap, carried into ``unexplained_rows``.

    Returns:
        A :class:`~dw_dagster.core.models.CauseFinding` of kind ``schema_change``;
        ``details["tested"]`` is False when no table had two snapshots to compare.
    """
    wanted = {t.lower() for t in tables} if tables else None
    cutoff = as_of.astimezone(dt.timezone.utc) if as_of and as_of.tzinfo else (
        as_of.replace(tzinfo=dt.timezone.utc) if as_of else None)
    found, unchanged, evidence = [], [], []
    tested = 0
    for ak in asset_keys:
        groups: dict[tuple[str, str], list[SchemaSnapshot]] = {}
        for snap in schema_history(instance, ak):
            taken = snap.taken_at if snap.taken_at.tzinfo else snap.taken_at.replace(tzinfo=dt.timezone.utc)
            if cutoff is not None and taken > cutoff:
                continue
            if wanted is not None and snap.table.lower() not in wanted:
                continue
            groups.setdefault((snap.database, snap.table.lower()), []).append(snap)
        for (database, _), hist in sorted(groups.items()):
            if len(hist) < 2:
                continue
            tested += 1
            change = latest_change(hist)
            call = (f"dw_dagster.diagnosis.causes.schema_change.schema_history(instance, dg.AssetKey({list(ak.path)!r}), "
                    f"{hist[0].table!r})")
            if change is None:
                unchanged.append({"asset": ak.to_user_string(), "table": hist[0].table, "snapshots": len(hist),
                                  "since": hist[-1].taken_at.isoformat()})
                evidence.append(Evidence(
                    description=f"{len(hist)} schema snapshots of {hist[0].table} on {ak.to_user_string()}, all the same",
                    database=DAGSTER_EVENT_LOG, sql=call,
                    values={"hash": hist[0].hash, "first": hist[-1].taken_at.isoformat(), "last": hist[0].taken_at.isoformat()}))
                continue
            old, first_new, newest = change
            changes = diff_schemas(old.columns, newest.columns)
            found.append({"asset": ak.to_user_string(), "table": newest.table, "database": database,
                          "changed_after": old.taken_at.isoformat(), "changed_by": first_new.taken_at.isoformat(),
                          "changes": [ch.model_dump(mode="json") for ch in changes]})
            evidence.append(Evidence(
                description=f"schema of {newest.table} last seen unchanged at {old.taken_at.isoformat()} and first seen "
                f"changed at {first_new.taken_at.isoformat()} (dw/schema snapshots on {ak.to_user_string()})",
                database=DAGSTER_EVENT_LOG, sql=call,
                values={"before": [c.model_dump() for c in old.columns], "after": [c.model_dump() for c in newest.columns],
                        "changes": [ch.description for ch in changes]}))
            evidence.append(Evidence(
                description=f"the catalog query each snapshot of {newest.table} ran", database=database,
                sql=newest.sql, values={"hash_before": old.hash, "hash_after": newest.hash}))
    gap = abs(gap_rows)
    if not tested:
        return CauseFinding(kind=KIND, summary="fewer than two dw/schema snapshots of any table; cannot test for a schema change",
                            confidence=0.0, explained_rows=0, unexplained_rows=gap, details={"tested": False})
    if not found:
        return CauseFinding(kind=KIND, summary=f"no schema change in {tested} table(s) with snapshots",
                            confidence=0.0, explained_rows=0, unexplained_rows=gap, evidence=evidence,
                            details={"tested": True, "changes": [], "unchanged": unchanged})
    kinds = {ch["kind"] for f in found for ch in f["changes"]}
    breaking = sorted(kinds & set(BREAKING))
    parts = [f"{f['table']} between {f['changed_after'][:19]} and {f['changed_by'][:19]} UTC: "
             + "; ".join(ch["description"] for ch in f["changes"]) for f in found]
    summary = ("schema changed — " + " | ".join(parts)
               + (". Rows are not counted by this finding; a change like this can make the sink reject or drop rows."
                  if breaking else ". Only additive changes; unlikely to lose rows by itself."))
    return CauseFinding(
        kind=KIND, summary=summary, confidence=BREAKING_CONFIDENCE if breaking else NON_BREAKING_CONFIDENCE,
        explained_rows=0, unexplained_rows=gap, evidence=evidence,
        details={"tested": True, "changes": found, "unchanged": unchanged, "breaking_kinds": breaking,
                 "columns_tightened": sorted({ch["column"] for f in found for ch in f["changes"]
                                              if ch["kind"] == "nullability_tightened"})},
    )
