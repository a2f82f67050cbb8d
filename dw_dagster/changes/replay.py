"""Guarded replay of parked rows: the dead-letter table back into the target, on the key, in SQL.

Once the target accepts what it rejected (a REQUIRED column relaxed to NULLABLE), the rows a
sink parked in its dead-letter table (:mod:`dw_dagster.pipelines.sink`) are put into the target. The replay is a
step of a change set (kind ``replay``, class ``replay_dead_letter``) and is guarded:

- **Selection.** Parked rows whose ``error_reason`` is one of the change set's reasons, parked
  in its time range (``failed_at``), of a key that is not NULL and an insert/update; of several
  parked changes of one key the latest (``source_position`` of one source sorts in stream order;
  positions that are plain numbers compare as numbers) is the one replayed. A key whose latest
  parked change is a delete (a sink that parks a key's later changes behind a parked one parks
  its tombstone too) is not replayed: its earlier parked rows are recorded ``superseded``.
- **Expected row count.** The change set names how many rows the replay inserts. Each key of the
  selection is *new* (neither in the target nor replayed before), *replayed by this change set*
  (in the ledger, below), or neither (already in the target — a later accepted change of the
  key, newer than the parked one — or replayed by another change set). The replay runs only when
  ``new + replayed by this change set == expected``; any other count (more rows parked since the
  proposal, a key that landed meanwhile) refuses it with the counts and changes nothing.
- **Once per key.** Replayed keys are recorded in a ledger table (``<dead letter table>_replayed``:
  key, ``source_position``, ``change_set_id``, ``replayed_at``) before the target insert, and
  the insert is anti-joined on the target's key. Re-running inserts nothing twice, a crash
  between the two statements is completed by the next run, and a replayed key that is deleted at
  the source later is never put back by a second replay.
- **Rows that fail again stay parked.** Each payload field is cast to its column's type with
  ``TRY_CAST`` (``SAFE_CAST`` on BigQuery); a row with NULL in a column the target's catalog marks
  REQUIRED (the relax was not applied) or a value that does not fit its type (a decimal is never
  rounded: it must equal its reading to 9 decimal places, as the sink requires) is not inserted
  and not written to the ledger: it stays parked and is reported (count, first failing reason,
  a sample of keys).

Everything is pushed down: one classification query, the ledger ``INSERT ... SELECT`` and the
target ``INSERT ... SELECT`` from the parked payloads, written in DuckDB's dialect with sqlglot
identifiers and literals and transpiled to the warehouse's (BigQuery tested through its
emulator); no parked row passes through Python. On DuckDB the two inserts are one transaction;
elsewhere they run in that order, which makes an interrupted replay safe to run again.
Parked rows are never deleted from the dead-letter table: it stays the record of what was
rejected; the ledger says which of them were replayed, by which change set, and the view
``<dead letter table>_pending`` (:func:`ensure_replay_tables`) holds the ones still waiting — what
the location's dead-letter check counts, so a replayed row stops alerting.

**Every parked row ends in a recorded state.** The rows the replay rightly skips are written to
``<dead letter table>_resolved`` (key, ``source_position``, state, change set, time): an older
parked change of a key whose latest one was replayed or had landed is ``superseded`` (or
``duplicate`` when its payload equals that row's), the latest parked row of a key that reached the
target by a newer accepted change is ``already_landed``. The pending view leaves them out, so the
dead-letter check passes after a good repair; :func:`parked_states` counts the selection per state
(:data:`PARKED_STATES`), for the replay check and the receipt.

Undo (:func:`undo_replay`): delete the target rows of the keys this change set replayed (from
the ledger), then its ledger rows and its resolved rows.
"""

import datetime as dt
from collections.abc import Sequence
from typing import Any

import dagster as dg
import sqlglot
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dw_dagster.databases.snippets import lit as _lit
from dw_dagster.databases.snippets import q as _q
from dw_dagster.databases.snippets import t as _t
from dw_dagster.databases.snippets import to_dialect as _to
from dw_dagster.databases import Database, DatabaseError, DuckDBDatabase
from dw_dagster.core.domains import REPLAY_DEAD_LETTER
from dw_dagster.pipelines.sink import SinkTable
from dw_dagster.databases.sql import check_name, check_table_name
from dw_dagster.core.models import ChangeSet, ChangeStep
from dw_dagster.changes.steps import StepRefused

REPLAY = "replay"
REPLAY_UNDO = "replay_undo"
LEDGER_SUFFIX = "_replayed"
RESOLVED_SUFFIX = "_resolved"
#: where every parked row of a replay's selection ends: replayed (in the ledger), superseded by a
#: later parked change of its key, an exact duplicate of the row replayed (same payload), already
#: landed (its key reached the target by a newer accepted change), or still pending (it failed
#: again, or was not due)
PARKED_STATES = ("replayed", "superseded", "duplicate", "already_landed", "pending")


class ReplayRefused(StepRefused):
    """The replay did not run as the change set expected (counts in ``details``); nothing was written
    when the count guard refused."""


class ReplaySpec(BaseModel):
    """What to replay and what the change set expects (JSON in the ``replay`` step's ``spec``).

    Attributes:
        target_table: ``schema.table`` the rows go into (plain names).
        dead_letter_table: where the sink parked them (``key, payload, error_reason, failed_at,
            source_position, source_ts, op``; the layout of :mod:`dw_dagster.pipelines.sink`).
        ledger_table: the replay ledger (created when missing).
        key: the key column (the target's and the dead-letter table's).
        columns: ``[name, type]`` of the target's columns in order, types in DuckDB's dialect.
        reasons: the ``error_reason`` values to replay (empty: any reason).
        parked_since, parked_until: bounds on ``failed_at`` (naive UTC, inclusive); None = open.
        expected_rows: rows the replay inserts.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    target_table: str
    dead_letter_table: str
    ledger_table: str
    key: str
    columns: list[tuple[str, str]]
    reasons: list[str] = Field(default_factory=list)
    parked_since: dt.datetime | None = None
    parked_until: dt.datetime | None = None
    expected_rows: int = Field(ge=0)

    @field_validator("target_table", "dead_letter_table", "ledger_table")
    @classmethod
    def _table(cls, v: str) -> str:
        return check_table_name(v)

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        return check_name(v, "key column")

    @field_validator("columns")
    @classmethod
    def _columns(cls, v: list[tuple[str, str]]) -> list[tuple[str, str]]:
        for name, type_text in v:
            check_name(name, "column")
            sqlglot.exp.DataType.build(type_text, dialect="duckdb")  # raises on an unknown type
        return v

    @field_validator("parked_since", "parked_until")
    @classmethod
    def _naive_utc(cls, v: dt.datetime | None) -> dt.datetime | None:
        return v.astimezone(dt.timezone.utc).replace(tzinfo=None) if v is not None and v.tzinfo else v

    @classmethod
    def for_sink_table(cls, table: SinkTable, *, expected_rows: int, reasons: Sequence[str] = (),
                       parked_since: dt.datetime | None = None, parked_until: dt.datetime | None = None,
                       ledger_table: str | None = None) -> "ReplaySpec":
        """The spec for a :class:`~dw_dagster.pipelines.sink.SinkTable`'s target and dead-letter table."""
        return cls(target_table=table.table, dead_letter_table=table.dead_letter_table,
                   ledger_table=ledger_table or table.dead_letter_table + LEDGER_SUFFIX, key=table.key,
                   columns=[(c.name, c.type) for c in table.columns], reasons=list(reasons),
                   parked_since=parked_since, parked_until=parked_until, expected_rows=expected_rows)


class ReplayCounts(BaseModel):
    """The selection classified against the target and the ledger (rows = keys; one row per key).

    Attributes:
        selected: keys in the selection.
        new: neither in the target nor in the ledger: the replay inserts these (less ``rejected``).
        rejected: of ``new``, rows that fail again (REQUIRED column NULL, or a value that does not fit).
        replayed_here: keys this change set replayed already (in its ledger rows).
        replayed_here_in_target: of those, keys present in the target.
        in_target_not_replayed: keys already in the target by other means (a newer accepted change).
        replayed_elsewhere: keys another change set replayed.
    """

    selected: int
    new: int
    rejected: int
    replayed_here: int
    replayed_here_in_target: int
    in_target_not_replayed: int
    replayed_elsewhere: int


class ReplayResult(BaseModel):
    """What :func:`replay_dead_letter` did (counts in rows).

    Attributes:
        expected_rows: what the change set expected the replay to insert.
        inserted_rows: rows inserted into the target by this call.
        already_replayed_rows: rows this change set had replayed before this call (a re-run).
        rejected_rows: rows that failed again and stay parked.
        rejected_reasons: rejected rows per first failing reason.
        rejected_sample: up to 20 rejected keys.
        required_columns: the target's REQUIRED columns the rows were checked against.
        before, after: the classification before and after the writes.
        sql: the statements run, in order (classification, ledger insert, target insert).
    """

    change_set_id: str
    expected_rows: int
    inserted_rows: int
    already_replayed_rows: int
    rejected_rows: int
    rejected_reasons: dict[str, int] = Field(default_factory=dict)
    rejected_sample: list[Any] = Field(default_factory=list)
    required_columns: list[str]
    before: ReplayCounts
    after: ReplayCounts
    sql: list[str] = Field(default_factory=list)
    states: dict[str, int] = Field(default_factory=dict, description="the selection's parked rows per recorded state "
                                   "after the replay (:data:`PARKED_STATES`)")


class ReplayVerification(BaseModel):
    """Every key of the selection in the target exactly once? (counts in keys)"""

    parked_keys: int
    present_once: int
    missing: int
    duplicated: int
    missing_sample: list[Any] = Field(default_factory=list)
    sql: str

    @property
    def passed(self) -> bool:
        return self.parked_keys == self.present_once and not self.missing and not self.duplicated


# -- SQL (DuckDB dialect text, identifiers and literals from dw_dagster.databases.sql) ---------------------


def _selection_filter(spec: ReplaySpec, alias: str = "d") -> str:
    conds = [f"{alias}.{_q(spec.key)} IS NOT NULL", f"{alias}.op <> 'delete'"]
    if spec.reasons:
        conds.append(f"{alias}.error_reason IN ({', '.join(_lit(r) for r in spec.reasons)})")
    if spec.parked_since is not None:
        conds.append(f"{alias}.failed_at >= {_lit(spec.parked_since)}")
    if spec.parked_until is not None:
        conds.append(f"{alias}.failed_at <= {_lit(spec.parked_until)}")
    return " AND ".join(conds)


def _stream_order(alias: str = "d") -> str:
    """``ORDER BY`` terms putting a key's parked changes newest first by ``source_position``.

    Positions of one source sort in stream order as text (binlog file:offset, zero-padded
    sequence numbers), except positions that are plain numbers of different lengths (Kafka offsets
    ``9`` and ``10``): those are ordered as numbers (leading zeros dropped, the longer one larger),
    so the latest change is never an older one that happens to sort higher as text."""
    p = f"{alias}.source_position"
    digits = f"({p} <> '' AND LTRIM({p}, '0123456789') = '')"
    return (f"CASE WHEN {digits} THEN LENGTH(LTRIM({p}, '0')) ELSE -1 END DESC, "
            f"CASE WHEN {digits} THEN LTRIM({p}, '0') ELSE {p} END DESC")


def selected_sql(spec: ReplaySpec) -> str:
    """The selection: the latest parked row of each selected key (``dw_key, dw_position, dw_payload``).

    A delete of the key parked after it (a tombstone some sinks park with the key's earlier
    changes, in stream order) is that key's latest change: the key is then not selected at all,
    so a row deleted at the source is never put back."""
    k = _q(spec.key)
    window = f"d.{k} IS NOT NULL AND (({_selection_filter(spec)}) OR d.op = 'delete')"
    return (f"SELECT dw_key, dw_position, dw_payload FROM (SELECT d.{k} AS dw_key, d.source_position AS dw_position, "
            f"d.payload AS dw_payload, d.op AS dw_op, ROW_NUMBER() OVER (PARTITION BY d.{k} ORDER BY {_stream_order()}) "
            f"AS dw_rn FROM {_t(spec.dead_letter_table)} AS d WHERE {window}) AS dw_sel "
            "WHERE dw_rn = 1 AND dw_op <> 'delete'")


def _deleted_sql(spec: ReplaySpec) -> str:
    """Keys of the selection whose latest parked change is a delete (``dw_key``)."""
    k = _q(spec.key)
    window = f"d.{k} IS NOT NULL AND (({_selection_filter(spec)}) OR d.op = 'delete')"
    return (f"SELECT dw_key FROM (SELECT d.{k} AS dw_key, d.op AS dw_op, ROW_NUMBER() OVER (PARTITION BY d.{k} "
            f"ORDER BY {_stream_order()}) AS dw_rn FROM {_t(spec.dead_letter_table)} AS d WHERE {window}) AS dw_del "
            "WHERE dw_rn = 1 AND dw_op = 'delete'")


def _classified_sql(spec: ReplaySpec, change_set_id: str, required: Sequence[str], ledger: bool = True) -> str:
    """Each selected key with its typed columns, its first failing reason (``dw_reject``, NULL when the
    row fits the target), and whether it is in the target / the ledger (this change set, another).
    ``ledger=False``: the ledger does not exist yet (nothing was replayed)."""
    k = _q(spec.key)
    req = {c.lower() for c in required}
    cols, reject = [], []
    for name, type_text in spec.columns:
        raw = f"(s.dw_payload ->> {_lit('$.' + name)})"
        typed = f"TRY_CAST({raw} AS {type_text})"
        cols.append(f"{typed} AS {_q(name)}")
        if name.lower() in req or name == spec.key:
            reject.append(f"WHEN {raw} IS NULL THEN {_lit(f'{name}: missing required field')}")
        misfit = f"{typed} IS NULL"
        if sqlglot.exp.DataType.build(type_text, dialect="duckdb").this == sqlglot.exp.DataType.Type.DECIMAL:
            # never rounded silently (as the sink): the value must equal its exact reading (9 decimals)
            misfit = f"({typed} IS NULL OR {typed} <> TRY_CAST({raw} AS DECIMAL(38, 9)))"
        reject.append(f"WHEN {raw} IS NOT NULL AND {misfit} THEN {_lit(f'{name}: not a {type_text}')}")
    cs = _lit(change_set_id)
    parsed = (f"SELECT s.dw_key, s.dw_position, {', '.join(cols)}, CASE {' '.join(reject)} ELSE NULL END AS dw_reject "
              f"FROM ({selected_sql(spec)}) AS s")
    in_target = (f"LEFT JOIN (SELECT DISTINCT o.{k} AS dw_key FROM {_t(spec.target_table)} AS o "
                 f"WHERE o.{k} IN (SELECT dw_key FROM ({selected_sql(spec)}) AS z)) AS t ON t.dw_key = p.dw_key")
    if not ledger:
        return (f"SELECT p.*, CASE WHEN t.dw_key IS NULL THEN 0 ELSE 1 END AS dw_in_target, 0 AS dw_here, 0 AS dw_other "
                f"FROM ({parsed}) AS p {in_target}")
    return (f"SELECT p.*, CASE WHEN t.dw_key IS NULL THEN 0 ELSE 1 END AS dw_in_target, "
            f"COALESCE(l.dw_here, 0) AS dw_here, COALESCE(l.dw_other, 0) AS dw_other "
            f"FROM ({parsed}) AS p {in_target} "
            f"LEFT JOIN (SELECT g.{k} AS dw_key, MAX(CASE WHEN g.change_set_id = {cs} THEN 1 ELSE 0 END) AS dw_here, "
            f"MAX(CASE WHEN g.change_set_id <> {cs} THEN 1 ELSE 0 END) AS dw_other "
            f"FROM {_t(spec.ledger_table)} AS g GROUP BY g.{k}) AS l ON l.dw_key = p.dw_key")


_NEW = "dw_in_target = 0 AND dw_here = 0 AND dw_other = 0"


def _counts_sql(classified: str) -> str:
    return ("SELECT COUNT(*), "
            f"COUNT(CASE WHEN {_NEW} THEN 1 END), "
            f"COUNT(CASE WHEN {_NEW} AND dw_reject IS NOT NULL THEN 1 END), "
            "COUNT(CASE WHEN dw_here = 1 THEN 1 END), "
            "COUNT(CASE WHEN dw_here = 1 AND dw_in_target = 1 THEN 1 END), "
            "COUNT(CASE WHEN dw_in_target = 1 AND dw_here = 0 AND dw_other = 0 THEN 1 END), "
            "COUNT(CASE WHEN dw_other = 1 AND dw_here = 0 THEN 1 END) "
            f"FROM ({classified}) AS c")


def ledger_ddl(spec: ReplaySpec, dialect: str, key_type: str | None = None) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for the ledger, in ``dialect``."""
    key_type = key_type or dict(spec.columns).get(spec.key, "BIGINT")
    return _to(f"CREATE TABLE IF NOT EXISTS {_t(spec.ledger_table)} ({_q(spec.key)} {key_type} NOT NULL, "
               "source_position VARCHAR NOT NULL, change_set_id VARCHAR NOT NULL, replayed_at TIMESTAMP NOT NULL)", dialect)


def resolved_table_name(spec: ReplaySpec) -> str:
    """``<dead letter table>_resolved``: the parked rows the replay skipped, each with its state."""
    return spec.dead_letter_table + RESOLVED_SUFFIX


def resolved_ddl(spec: ReplaySpec, dialect: str, key_type: str | None = None) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for the resolved rows, in ``dialect``."""
    key_type = key_type or dict(spec.columns).get(spec.key, "BIGINT")
    return _to(f"CREATE TABLE IF NOT EXISTS {_t(resolved_table_name(spec))} ({_q(spec.key)} {key_type} NOT NULL, "
               "source_position VARCHAR NOT NULL, state VARCHAR NOT NULL, change_set_id VARCHAR NOT NULL, "
               "resolved_at TIMESTAMP NOT NULL)", dialect)


def _resolve_sql(spec: ReplaySpec, change_set_id: str, now: dt.datetime) -> str:
    """Record the state of each selected parked row the replay skipped (DuckDB dialect text)."""
    k = _q(spec.key)
    anchor = (f"SELECT s.dw_key, s.dw_position, CAST(s.dw_payload AS VARCHAR) AS dw_payload, "
              f"CASE WHEN EXISTS (SELECT 1 FROM {_t(spec.ledger_table)} AS l WHERE l.{k} = s.dw_key "
              f"AND l.source_position = s.dw_position) THEN 'replayed' "
              f"WHEN EXISTS (SELECT 1 FROM {_t(spec.target_table)} AS o WHERE o.{k} = s.dw_key) THEN 'landed' END AS dw_how "
              f"FROM ({selected_sql(spec)}) AS s")
    state = ("CASE WHEN d.source_position = a.dw_position THEN 'already_landed' "
             "WHEN CAST(d.payload AS VARCHAR) = a.dw_payload THEN 'duplicate' ELSE 'superseded' END")
    not_recorded = (f"NOT EXISTS (SELECT 1 FROM {_t(spec.ledger_table)} AS l WHERE l.{k} = d.{k} "
                    f"AND l.source_position = d.source_position) "
                    f"AND NOT EXISTS (SELECT 1 FROM {_t(resolved_table_name(spec))} AS r WHERE r.{k} = d.{k} "
                    f"AND r.source_position = d.source_position)")
    # the parked changes of a key deleted after them: superseded by the delete, never replayed
    deleted = (f"SELECT DISTINCT d.{k}, d.source_position, 'superseded', {_lit(change_set_id)}, {_lit(now)} "
               f"FROM {_t(spec.dead_letter_table)} AS d WHERE {_selection_filter(spec)} "
               f"AND d.{k} IN (SELECT dw_key FROM ({_deleted_sql(spec)}) AS x) AND {not_recorded}")
    return (f"INSERT INTO {_t(resolved_table_name(spec))} ({k}, source_position, state, change_set_id, resolved_at) "
            f"SELECT DISTINCT d.{k}, d.source_position, {state}, {_lit(change_set_id)}, {_lit(now)} "
            f"FROM {_t(spec.dead_letter_table)} AS d JOIN ({anchor}) AS a ON a.dw_key = d.{k} "
            f"WHERE {_selection_filter(spec)} AND a.dw_how IS NOT NULL AND {not_recorded} UNION ALL {deleted}")


def parked_states(db: Database, spec: ReplaySpec) -> dict[str, int]:
    """The selection's parked rows per state (:data:`PARKED_STATES`; rows, every state present).

    Raises:
        dw_dagster.databases.DatabaseError: a table is missing or the query failed.
    """
    k = _q(spec.key)
    # read only (a verification check calls it): a ledger or resolved table not created yet is empty
    replayed = (f"WHEN EXISTS (SELECT 1 FROM {_t(spec.ledger_table)} AS l WHERE l.{k} = d.{k} "
                f"AND l.source_position = d.source_position) THEN 'replayed' " if _ledger_exists(db, spec) else "")
    resolved = _table_exists(db, resolved_table_name(spec))
    state = (f"(SELECT MIN(r.state) FROM {_t(resolved_table_name(spec))} AS r WHERE r.{k} = d.{k} "
             f"AND r.source_position = d.source_position)" if resolved else "NULL")
    q = _to(f"SELECT CASE {replayed}WHEN {state} IS NOT NULL THEN {state} ELSE 'pending' END AS dw_state, COUNT(*) "
            f"FROM {_t(spec.dead_letter_table)} AS d WHERE {_selection_filter(spec)} GROUP BY 1", db.dialect)
    out = dict.fromkeys(PARKED_STATES, 0)
    for state, n in db.fetch_all(q):
        out[str(state)] = int(n or 0)
    return out


def pending_view_name(spec: ReplaySpec) -> str:
    """``<dead letter table>_pending``: the parked rows not replayed yet."""
    return spec.dead_letter_table + "_pending"


def ensure_replay_tables(db: Database, spec: ReplaySpec) -> str:
    """Create the ledger (if missing) and the view of parked rows still waiting (replace); returns the view's name.

    The view holds the dead-letter table's rows whose (key, ``source_position``) is neither in the
    ledger nor resolved (superseded, duplicate, already landed): what a dead-letter check should
    count, so that a replayed or rightly skipped row stops alerting while the dead-letter table
    keeps the record.
    """
    view = pending_view_name(spec)
    k = _q(spec.key)
    db.execute(ledger_ddl(spec, db.dialect))
    db.execute(resolved_ddl(spec, db.dialect))
    db.execute(_to(f"CREATE OR REPLACE VIEW {_t(view)} AS SELECT d.* FROM {_t(spec.dead_letter_table)} AS d "
                   f"WHERE NOT EXISTS (SELECT 1 FROM {_t(spec.ledger_table)} AS l WHERE l.{k} = d.{k} "
                   "AND l.source_position = d.source_position) "
                   f"AND NOT EXISTS (SELECT 1 FROM {_t(resolved_table_name(spec))} AS r WHERE r.{k} = d.{k} "
                   "AND r.source_position = d.source_position)", db.dialect))
    return view


def _counts(db: Database, q: str) -> ReplayCounts:
    row = db.fetch_all(q)[0]
    names = list(ReplayCounts.model_fields)
    return ReplayCounts(**{n: int(v or 0) for n, v in zip(names, row)})


def _required_now(db: Database, spec: ReplaySpec) -> list[str]:
    from dw_dagster.databases.catalog import read_table_schema

    schema = read_table_schema(db, spec.target_table)
    return [c.name for c in schema.columns if not c.nullable]


def _ledger_exists(db: Database, spec: ReplaySpec) -> bool:
    return _table_exists(db, spec.ledger_table)


def _table_exists(db: Database, table: str) -> bool:
    try:
        db.fetch_all(_to(f"SELECT 1 FROM {_t(table)} WHERE 1 = 0", db.dialect))
    except DatabaseError:
        return False
    return True


def classify(db: Database, spec: ReplaySpec, change_set_id: str, *, required_columns: Sequence[str] | None = None) -> ReplayCounts:
    """Classify the selection against the target and the ledger without writing anything (see
    :class:`ReplayCounts`); a missing ledger counts as empty.

    Args:
        db: the warehouse holding the target, dead-letter and ledger tables.
        spec: the replay.
        change_set_id: whose ledger rows count as "replayed here".
        required_columns: the target's REQUIRED columns; None reads them from the catalog
            (:func:`~dw_dagster.changes.migrations.read_table_schema`).

    Raises:
        dw_dagster.databases.DatabaseError: a table is missing or a query failed.
    """
    required = list(required_columns) if required_columns is not None else _required_now(db, spec)
    classified = _classified_sql(spec, change_set_id, required, ledger=_ledger_exists(db, spec))
    return _counts(db, _to(_counts_sql(classified), db.dialect))


def replay_dead_letter(db: Database, spec: ReplaySpec, change_set_id: str, *,
                       required_columns: Sequence[str] | None = None, now: dt.datetime | None = None,
                       sample_size: int = 20) -> ReplayResult:
    """Replay the selected parked rows into the target, guarded (module docstring).

    Args:
        db: the warehouse (DuckDB, BigQuery, Snowflake, or any :class:`Database` with
            ``INSERT ... SELECT``).
        spec: selection, tables, columns and the expected row count.
        change_set_id: the change set the rows are replayed for (ledger rows carry it).
        required_columns: the target's REQUIRED columns now; None reads them from the catalog.
            Rows with NULL in one of them fail again and stay parked.
        now: ``replayed_at`` (default: now, UTC).
        sample_size: rejected keys listed in the result.

    Returns:
        A :class:`ReplayResult`; ``rejected_rows`` > 0 means some rows stay parked.

    Raises:
        ReplayRefused: the selection's count is not what the change set expected (nothing written).
        dw_dagster.databases.DatabaseError: a table is missing or a statement failed.
    """
    d = db.dialect
    db.execute(ledger_ddl(spec, d))
    required = list(required_columns) if required_columns is not None else _required_now(db, spec)
    classified = _classified_sql(spec, change_set_id, required)
    counts_q = _to(_counts_sql(classified), d)
    before = _counts(db, counts_q)
    details = {"expected_rows": spec.expected_rows, **before.model_dump()}
    if before.new + before.replayed_here != spec.expected_rows:
        raise ReplayRefused(
            f"the replay expected {spec.expected_rows} row(s) but the selection holds {before.new} not yet replayed "
            f"+ {before.replayed_here} replayed by {change_set_id} (of {before.selected} parked key(s); "
            f"{before.in_target_not_replayed} already in {spec.target_table} by a newer change, "
            f"{before.replayed_elsewhere} replayed by another change set); nothing was replayed — propose it again",
            details)
    now = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc).replace(tzinfo=None)
    k = _q(spec.key)
    names = ", ".join(_q(n) for n, _ in spec.columns)
    ledger_ins = _to(
        f"INSERT INTO {_t(spec.ledger_table)} ({k}, source_position, change_set_id, replayed_at) "
        f"SELECT dw_key, dw_position, {_lit(change_set_id)}, {_lit(now)} FROM ({classified}) AS c "
        f"WHERE {_NEW} AND dw_reject IS NULL", d)
    target_ins = _to(
        f"INSERT INTO {_t(spec.target_table)} ({names}) SELECT {names} FROM ({classified}) AS c "
        "WHERE dw_here = 1 AND dw_in_target = 0 AND dw_reject IS NULL", d)
    statements = []
    if before.new - before.rejected > 0 or before.replayed_here > before.replayed_here_in_target:
        if isinstance(db, DuckDBDatabase):
            db.execute(f"BEGIN TRANSACTION; {ledger_ins}; {target_ins}; COMMIT")
        else:
            db.execute(ledger_ins)
            db.execute(target_ins)
        statements = [ledger_ins, target_ins]
    # the rows the replay rightly skipped end in a recorded state, never "pending" for good
    db.execute(resolved_ddl(spec, d))
    resolve = _to(_resolve_sql(spec, change_set_id, now), d)
    db.execute(resolve)
    statements.append(resolve)
    after = _counts(db, counts_q)
    rejected_reasons: dict[str, int] = {}
    sample: list[Any] = []
    if after.rejected:
        rows = db.fetch_all(_to(f"SELECT dw_reject, COUNT(*) FROM ({classified}) AS c WHERE {_NEW} AND dw_reject IS NOT NULL "
                                "GROUP BY dw_reject ORDER BY 2 DESC, 1", d))
        rejected_reasons = {str(r): int(n) for r, n in rows}
        sample = [r[0] for r in db.fetch_all(_to(
            f"SELECT dw_key FROM ({classified}) AS c WHERE {_NEW} AND dw_reject IS NOT NULL ORDER BY dw_key "
            f"LIMIT {int(sample_size)}", d))]
    return ReplayResult(
        change_set_id=change_set_id, expected_rows=spec.expected_rows,
        inserted_rows=after.replayed_here_in_target - before.replayed_here_in_target,
        already_replayed_rows=before.replayed_here_in_target, rejected_rows=after.rejected,
        rejected_reasons=rejected_reasons, rejected_sample=sample, required_columns=required,
        before=before, after=after, sql=[counts_q, *statements], states=parked_states(db, spec))


def verify_replay(db: Database, spec: ReplaySpec, *, sample_size: int = 20) -> ReplayVerification:
    """Is every key of the selection in the target exactly once? (one pushed-down query + a sample)

    Raises:
        dw_dagster.databases.DatabaseError: a table is missing or a query failed.
    """
    k = _q(spec.key)
    keys = f"SELECT DISTINCT s.dw_key FROM ({selected_sql(spec)}) AS s"  # a key deleted after it was parked is not due
    per_key = (f"SELECT s.dw_key, COALESCE(n.dw_n, 0) AS dw_n FROM ({keys}) AS s LEFT JOIN "
               f"(SELECT o.{k} AS dw_key, COUNT(*) AS dw_n FROM {_t(spec.target_table)} AS o "
               f"WHERE o.{k} IN (SELECT dw_key FROM ({keys}) AS z) GROUP BY o.{k}) AS n ON n.dw_key = s.dw_key")
    q = _to(f"SELECT COUNT(*), COUNT(CASE WHEN dw_n = 1 THEN 1 END), COUNT(CASE WHEN dw_n = 0 THEN 1 END), "
            f"COUNT(CASE WHEN dw_n > 1 THEN 1 END) FROM ({per_key}) AS x", db.dialect)
    total, once, missing, dup = (int(v or 0) for v in db.fetch_all(q)[0])
    sample = []
    if missing:
        sample = [r[0] for r in db.fetch_all(_to(f"SELECT dw_key FROM ({per_key}) AS x WHERE dw_n = 0 ORDER BY dw_key "
                                                 f"LIMIT {int(sample_size)}", db.dialect))]
    return ReplayVerification(parked_keys=total, present_once=once, missing=missing, duplicated=dup,
                              missing_sample=sample, sql=q)


def undo_replay(db: Database, spec: ReplaySpec, change_set_id: str) -> int:
    """Delete the target rows of the keys ``change_set_id`` replayed, then its ledger rows.

    Rows changed by the stream since the replay are deleted too (they are the same keys).

    Returns:
        Ledger rows removed (keys).

    Raises:
        dw_dagster.databases.DatabaseError: a statement failed.
    """
    d = db.dialect
    db.execute(ledger_ddl(spec, d))
    k, cs = _q(spec.key), _lit(change_set_id)
    n = int(db.fetch_all(_to(f"SELECT COUNT(*) FROM {_t(spec.ledger_table)} WHERE change_set_id = {cs}", d))[0][0] or 0)
    delete_t = _to(f"DELETE FROM {_t(spec.target_table)} WHERE {k} IN "
                   f"(SELECT {k} FROM {_t(spec.ledger_table)} WHERE change_set_id = {cs})", d)
    delete_l = _to(f"DELETE FROM {_t(spec.ledger_table)} WHERE change_set_id = {cs}", d)
    db.execute(resolved_ddl(spec, d))
    delete_r = _to(f"DELETE FROM {_t(resolved_table_name(spec))} WHERE change_set_id = {cs}", d)
    if isinstance(db, DuckDBDatabase):
        db.execute(f"BEGIN TRANSACTION; {delete_t}; {delete_l}; {delete_r}; COMMIT")
    else:
        db.execute(delete_t)
        db.execute(delete_l)
        db.execute(delete_r)
    return n


def undo_sql(spec: ReplaySpec, change_set_id: str, dialect: str = "duckdb") -> list[str]:
    """The statements :func:`undo_replay` runs, for the change set's undo text."""
    k, cs = _q(spec.key), _lit(change_set_id)
    return [_to(f"DELETE FROM {_t(spec.target_table)} WHERE {k} IN "
                f"(SELECT {k} FROM {_t(spec.ledger_table)} WHERE change_set_id = {cs})", dialect),
            _to(f"DELETE FROM {_t(spec.ledger_table)} WHERE change_set_id = {cs}", dialect),
            _to(f"DELETE FROM {_t(resolved_table_name(spec))} WHERE change_set_id = {cs}", dialect)]


def replay_step(spec: ReplaySpec, *, resource_key: str, change_set_id: str, dialect: str = "duckdb",
                required_columns: Sequence[str] = ()) -> ChangeStep:
    """A ``replay`` step for a change set (its SQL shown to the owner in ``dialect``).

    Args:
        spec: the replay.
        resource_key: the warehouse resource.
        change_set_id: names the ledger rows in the shown SQL and the undo (the runner uses the id
            of the change set it runs for).
        dialect: the warehouse's dialect, for the shown SQL.
        required_columns: the target's REQUIRED columns once the change set's migration ran, for
            the shown SQL (at run time they are read from the catalog).
    """
    classified = _classified_sql(spec, change_set_id, required_columns)
    names = ", ".join(_q(n) for n, _ in spec.columns)
    shown = _to(f"INSERT INTO {_t(spec.target_table)} ({names}) SELECT {names} FROM ({classified}) AS c "
                "WHERE dw_here = 1 AND dw_in_target = 0 AND dw_reject IS NULL", dialect)
    reasons = "; ".join(repr(r) for r in spec.reasons) or "any reason"
    return ChangeStep(
        kind=REPLAY, change_class=REPLAY_DEAD_LETTER, resource_key=resource_key, expected_rows=spec.expected_rows,
        summary=(f"Replay {spec.expected_rows} parked row(s) from {spec.dead_letter_table} ({reasons}) into "
                 f"{spec.target_table}, guarded on {spec.key}: refused unless exactly {spec.expected_rows} are due; "
                 f"each key once (ledger {spec.ledger_table}); rows that fail again stay parked"),
        spec=spec.model_dump(mode="json"), sql=[shown], rollback_sql=undo_sql(spec, change_set_id, dialect))


def run_replay_step(context: dg.OpExecutionContext, cs: ChangeSet, step: ChangeStep, db: Database) -> dict:
    """The step runner for ``replay`` steps (:func:`dw_dagster.repair.steps.build_step_jobs`).

    Raises:
        ReplayRefused: the count guard refused (nothing written), or rows failed again (the
            valid ones were replayed; the rest stay parked; the counts are in ``details``).
    """
    spec = ReplaySpec.model_validate(step.spec)
    result = replay_dead_letter(db, spec, cs.id)
    data = result.model_dump(mode="json")
    context.log.info(f"replayed {result.inserted_rows} row(s) into {spec.target_table} "
                     f"({result.already_replayed_rows} replayed before, {result.rejected_rows} stay parked); parked rows "
                     f"by state: {', '.join(f'{k} {v}' for k, v in result.states.items())}")
    if result.rejected_rows:
        raise ReplayRefused(f"{result.rejected_rows} parked row(s) failed again and stay parked "
                            f"({', '.join(f'{n} × {r!r}' for r, n in result.rejected_reasons.items())}); "
                            f"{result.inserted_rows} were replayed", data)
    return data


__all__ = [
    "LEDGER_SUFFIX", "PARKED_STATES", "REPLAY", "RESOLVED_SUFFIX", "ReplayCounts", "ReplayRefused", "ReplayResult", "ReplaySpec", "ReplayVerification",
    "classify", "ensure_replay_tables", "ledger_ddl", "parked_states", "pending_view_name", "resolved_table_name", "replay_dead_letter", "replay_step", "run_replay_step", "selected_sql", "undo_replay",
    "undo_sql", "verify_replay",
]


def run_replay_undo_step(context: dg.OpExecutionContext, cs: ChangeSet, step: ChangeStep, db: Database) -> dict:
    """The step runner for ``replay_undo`` steps (an undo change set's step): delete the keys the
    original change set replayed, and their ledger rows (:func:`undo_replay`); the parked rows
    stay in the dead-letter table and count as pending again.

    Returns:
        ``{deleted_keys, of_change_set, statements}``.
    """
    spec = ReplaySpec.model_validate(step.spec["replay"])
    of = step.spec["of_change_set"]
    n = undo_replay(db, spec, of)
    context.log.info(f"undid the replay of {of}: deleted {n} replayed key(s) from {spec.target_table}")
    return {"deleted_keys": n, "of_change_set": of, "statements": undo_sql(spec, of, db.dialect)}
