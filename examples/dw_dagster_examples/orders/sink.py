"""The orders sink: CDC change events merged into the warehouse, rejected rows parked in a dead-letter table.

:class:`CdcSink` applies :class:`~.cdc.ChangeEvent` s (from :class:`~.cdc.BinlogSource` or
:class:`~.cdc.ReplaySource`) to a warehouse table through the :class:`~dw_dagster.databases.Database`
protocol, the way a streaming sink into BigQuery behaves:

- **Validation before writing.** Each insert/update's after-row is checked against the target's
  schema (:class:`SinkTable`): a REQUIRED column that is NULL or absent, or a value that does not
  fit its type, rejects the row. A rejected row is **parked** in the dead-letter table with its
  payload, the reason (``"shipping_country: missing required field"``; several reasons are joined
  with ``"; "``), when it was parked and its source position; the sink keeps going, so the stream
  stays green while the target goes short. Deletes are never parked (they need only the key).
- **Batched merge.** Events are taken ``batch_rows`` at a time. Per key, the batch's last accepted
  event wins (a parked event changes nothing, as if applied one at a time); the net rows are
  staged — as an Arrow table registered in the same DuckDB connection, or as an inline
  ``VALUES`` relation on any other database — and merged with one ``MERGE`` on the key
  (update/insert = upsert, delete = delete). Parked rows go in with one ``MERGE`` too.
- **Idempotent.** The target merge is an upsert on the key, and the dead-letter table is keyed by
  (key, ``source_position``): re-running the sink over events it has already applied — e.g. from
  an older saved position after a crash — leaves the same target rows and adds no parked row
  twice. (The same change read from two *different* sources, binlog and replay, has two
  positions and would be parked twice.)
- **Durable position.** Every batch reports the cursor to resume from (``position``, a
  :class:`~.cdc.SourcePosition`); :meth:`SinkResult.metadata` gives it as Dagster metadata
  (``dw/cdc_position``). With ``SinkTable.state_table`` set (the default for the orders), the
  position is also written to the warehouse in the batch's transaction on DuckDB, and
  :meth:`CdcSink.run` resumes from it.

On DuckDB each batch (dead letters, target merge, position) is one transaction. On other
databases the statements run one by one through :meth:`Database.execute`; each is a single
``MERGE`` and idempotent, so a batch interrupted halfway is completed by running it again.

SQL is written once in DuckDB's dialect with sqlglot-built identifiers and transpiled to the
database's dialect; names from configuration must be plain names (:func:`~.cdc.check_name`) and
are refused otherwise.

Replay of parked rows (after the REQUIRED column is relaxed) is someone else's job; the pieces
it needs are here: :func:`payload_to_row` (a parked payload back to a target row, in Python),
:func:`replay_select_sql` (the same in SQL, over the dead-letter table) and
:meth:`SinkTable.with_nullable` (the schema after the relaxation). Guards such a replay needs:
insert only keys absent from the target (a later accepted change of the key is newer than the
parked one); of several parked changes of one key take the latest (``source_position`` strings
of one source sort in stream order); a parked key deleted at the source later is not in the
dead-letter table's knowledge (the delete was applied to a target that did not have the row),
so compare with the source. In the orders scenario every parked row is an insert of a gift-card
order that is never updated or deleted, one parked row per key.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import pyarrow as pa
import sqlglot
from sqlglot import exp

from dw_dagster import Database, DatabaseError, SinkColumn, SinkTable
from dw_dagster.databases import DuckDBDatabase, sql
from dw_dagster_examples.orders.cdc import ChangeEvent, ChangeSource, SourcePosition

Column = SinkColumn  # the target's columns (dw_dagster's sink shape)
_OP = SinkTable.OP_COLUMN
MISSING_REQUIRED = SinkTable.MISSING_REQUIRED
_kind = SinkColumn.type_kind

#: Dagster metadata key of the sink's position
POSITION_METADATA_KEY = "dw/cdc_position"
_STAGE, _DLQ_STAGE = "dw_cdc_stage", "dw_cdc_dlq_stage"


ORDERS_COLUMNS = (
    Column("order_id", "BIGINT"),
    Column("customer_id", "BIGINT"),
    Column("order_ts", "TIMESTAMP"),
    Column("amount", "DECIMAL(18,2)"),
    Column("currency", "VARCHAR"),
    Column("payment_method", "VARCHAR"),
    Column("shipping_country", "VARCHAR"),
    Column("status", "VARCHAR"),
    Column("updated_at", "TIMESTAMP"),
)


ORDERS_TABLE = SinkTable(table="analytics.orders", dead_letter_table="analytics.orders_dlq", key="order_id",
                         columns=ORDERS_COLUMNS, state_table="analytics.orders_cdc_state")


# -- pure row functions ---------------------------------------------------------------------------


def _coerce(value: object, type_text: str) -> object:
    """``value`` as the Python type of ``type_text``; ValueError when it does not fit."""
    kind, p, s = _kind(type_text)
    if kind == "int":
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int):
            return value
        if isinstance(value, (float, Decimal)) and value == int(value):
            return int(value)
        if isinstance(value, str):
            return int(value.strip())
        raise ValueError
    if kind == "decimal":
        if isinstance(value, bool):
            raise ValueError
        d = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else str(value).strip())
        if not d.is_finite():
            raise ValueError
        q = d.quantize(Decimal(1).scaleb(-s))
        if q != d or abs(q) >= Decimal(10) ** (p - s):
            raise ValueError  # more decimals than the scale, or out of range: never rounded silently
        return q
    if kind == "float":
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ValueError
    if kind == "date":
        if isinstance(value, dt.datetime):
            raise ValueError
        if isinstance(value, dt.date):
            return value
        return dt.date.fromisoformat(str(value))
    if kind == "timestamp":
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value.strip())
        elif isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            value = dt.datetime.combine(value, dt.time())
        if not isinstance(value, dt.datetime):
            raise ValueError
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise ValueError


def coerce_row(row: dict | None, table: SinkTable = ORDERS_TABLE) -> tuple[dict | None, str | None]:
    """Validate one source row against the target schema (pure).

    Args:
        row: column name → value (e.g. a change event's after-row). Extra keys are ignored.
        table: the target schema.

    Returns:
        ``(target_row, None)`` with every column of ``table`` coerced to its Python type
        (int, ``Decimal`` quantized to the scale, naive UTC ``datetime``, str …), or
        ``(None, reason)`` — ``"<column>: missing required field"`` for a NULL or absent REQUIRED
        column, ``"<column>: not a <TYPE>: <value>"`` for a value that does not fit; several
        reasons are joined with ``"; "`` in column order.
    """
    row = row or {}
    out: dict = {}
    errors: list[str] = []
    for c in table.columns:
        v = row.get(c.name)
        if v is None:
            if c.required or c.name == table.key:
                errors.append(MISSING_REQUIRED.format(column=c.name))
            out[c.name] = None
            continue
        try:
            out[c.name] = _coerce(v, c.type)
        except (ValueError, TypeError, InvalidOperation, OverflowError):
            errors.append(f"{c.name}: not a {c.type}: {str(v)[:60]!r}")
    return (None, "; ".join(errors)) if errors else (out, None)


def _json_default(v: object) -> object:
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, dt.datetime):
        return (v.astimezone(dt.timezone.utc).replace(tzinfo=None) if v.tzinfo else v).isoformat(sep=" ")
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def payload_json(row: dict) -> str:
    """A parked row's payload: the source row as JSON (decimals as strings, times ``YYYY-MM-DD HH:MM:SS`` UTC)."""
    return json.dumps(row, default=_json_default, sort_keys=False, separators=(",", ":"))


def payload_to_row(payload: str | dict, table: SinkTable = ORDERS_TABLE) -> dict:
    """Turn a dead-letter payload back into the target row (pure; for the replay of parked rows).

    Every column of ``table`` is coerced to its Python type; a column that is NULL or absent in
    the payload is None — REQUIRED is *not* enforced here (the replay runs after the column is
    relaxed; check with :func:`coerce_row` and ``table.with_nullable(...)`` if needed).

    Args:
        payload: the ``payload`` column's text (or the parsed dict).
        table: the target schema.

    Returns:
        Column name → value, in ``table.columns`` order.

    Raises:
        ValueError: the payload is not a JSON object, or a value does not fit its column's type.
    """
    data = json.loads(payload) if isinstance(payload, str) else payload
    if not isinstance(data, dict):
        raise ValueError("a dead-letter payload is a JSON object")
    out = {}
    for c in table.columns:
        v = data.get(c.name)
        try:
            out[c.name] = None if v is None else _coerce(v, c.type)
        except (ValueError, TypeError, InvalidOperation, OverflowError) as e:
            raise ValueError(f"{c.name}: not a {c.type}: {str(v)[:60]!r}") from e
    return out


def _q(name: str) -> str:
    return sql.identifier(name).sql("duckdb")


def _t(name: str) -> str:
    return sql.table(name).sql("duckdb")


def replay_select_sql(table: SinkTable = ORDERS_TABLE, dialect: str = "duckdb", *, where: str | None = None) -> str:
    """SQL that turns the dead-letter table's payloads back into target rows (the SQL twin of :func:`payload_to_row`).

    ``SELECT <key> AS dw_dlq_key, source_position, CAST(<payload field> AS <type>) AS <column>, …
    FROM <dead_letter_table>``, one row per parked row, for a guarded ``MERGE`` into the relaxed
    target. ``where`` is a DuckDB-dialect condition over the dead-letter columns (e.g. on
    ``failed_at``) written by the caller, never from outside input.

    Returns:
        The query in ``dialect``.
    """
    payload = _q("payload")
    src = f"CAST({payload} AS JSON)" if dialect in ("postgres",) else payload
    cols = [f"{_q(table.key)} AS dw_dlq_key", _q("source_position")]
    # column names are plain names (checked), so the JSON path literal is safe
    cols += [f"CAST({src} ->> '$.{c.name}' AS {c.type}) AS {_q(c.name)}" for c in table.columns]
    text = f"SELECT {', '.join(cols)} FROM {_t(table.dead_letter_table)}" + (f" WHERE {where}" if where else "")
    return sqlglot.transpile(text, read="duckdb", write=dialect)[0]


# -- reports ----------------------------------------------------------------------------------------


@dataclass
class BatchReport:
    """One batch the sink applied (counts in change events unless noted).

    Attributes:
        events: change events in the batch.
        applied: events accepted (written, or superseded within the batch by a later event of the key).
        parked: events rejected to the dead-letter table.
        upserted: keys whose net change was an upsert (rows).
        deleted: keys whose net change was a delete (rows, whether or not they existed).
        reasons: parked events per reason.
        first_position: the first event's position.
        position: the cursor to resume from after this batch (the last event's ``next_position``).
        seconds: wall time of the batch's writes.
    """

    events: int
    applied: int
    parked: int
    upserted: int
    deleted: int
    reasons: dict[str, int]
    first_position: SourcePosition
    position: SourcePosition
    seconds: float = 0.0


@dataclass
class SinkResult:
    """All batches of one :meth:`CdcSink.apply` call; ``position`` is the cursor after the last
    one (the start position when there were no events; None if that was None too)."""

    batches: list[BatchReport] = field(default_factory=list)
    position: SourcePosition | None = None

    @property
    def events(self) -> int:
        return sum(b.events for b in self.batches)

    @property
    def applied(self) -> int:
        return sum(b.applied for b in self.batches)

    @property
    def parked(self) -> int:
        return sum(b.parked for b in self.batches)

    @property
    def reasons(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for b in self.batches:
            total.update(b.reasons)
        return dict(total.most_common())

    def metadata(self) -> dict:
        """Plain values for a Dagster ``MaterializeResult``: the position (``dw/cdc_position``) and counts."""
        return {
            POSITION_METADATA_KEY: str(self.position) if self.position else "",
            "dw/cdc_events": self.events,
            "dw/cdc_applied": self.applied,
            "dw/cdc_parked": self.parked,
            "dw/cdc_batches": len(self.batches),
            "dw/cdc_parked_reasons": dict(self.reasons),
        }


def position_from_metadata(metadata: dict) -> SourcePosition | None:
    """The position stored under ``dw/cdc_position`` (a string or a Dagster ``TextMetadataValue``), or None."""
    v = metadata.get(POSITION_METADATA_KEY)
    v = getattr(v, "value", v) if v is not None else None
    return SourcePosition.parse(v) if v else None


# -- the sink -----------------------------------------------------------------------------------------


def utc_now(_event: ChangeEvent | None = None) -> dt.datetime:
    """``failed_at`` clock: the wall clock (naive UTC) — when the sink parked the row. The default."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def commit_time(event: ChangeEvent) -> dt.datetime:
    """``failed_at`` clock for a simulated timeline: the change's commit time (``event.ts``, naive UTC)."""
    return event.ts


def _arrow_type(type_text: str) -> pa.DataType:
    kind, p, s = _kind(type_text)
    return {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "date": pa.date32(),
            "timestamp": pa.timestamp("us"), "str": pa.string()}.get(kind) or pa.decimal128(p, s)


def _chunks(events: Iterable[ChangeEvent], n: int) -> Iterator[list[ChangeEvent]]:
    chunk: list[ChangeEvent] = []
    for e in events:
        chunk.append(e)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class CdcSink:
    """Apply change events to a warehouse table with a dead-letter queue (module docstring).

    Args:
        db: the warehouse (:class:`~dw_dagster.databases.DuckDBDatabase` by default in the
            example; any :class:`~dw_dagster.databases.Database` whose dialect has ``MERGE``).
        table: target, dead-letter and state tables and the target's schema.
        batch_rows: change events per batch.
        failed_at: the clock for ``failed_at``, given the parked event (default :func:`utc_now`;
            :func:`commit_time` puts parked rows on the source's timeline).

    Raises:
        ValueError: ``batch_rows`` < 1.
    """

    def __init__(self, db: Database, table: SinkTable = ORDERS_TABLE, *, batch_rows: int = 10_000,
                 failed_at: Callable[[ChangeEvent], dt.datetime] = utc_now) -> None:
        if batch_rows < 1:
            raise ValueError("batch_rows must be at least 1")
        self.db, self.table, self.batch_rows, self.failed_at = db, table, batch_rows, failed_at
        self._ready = False

    # DDL -------------------------------------------------------------------------------------
    def ddl(self) -> list[str]:
        """``CREATE SCHEMA/TABLE IF NOT EXISTS`` for the target, dead-letter and state tables, in the db's dialect."""
        t = self.table
        schemas = {".".join(n.split(".")[:-1]) for n in (t.table, t.dead_letter_table, t.state_table) if n}
        out = [f"CREATE SCHEMA IF NOT EXISTS {_t(s)}" for s in sorted(schemas)]
        cols = ", ".join(f"{_q(c.name)} {c.type}" + (" NOT NULL" if c.required or c.name == t.key else "")
                         for c in t.columns)
        out.append(f"CREATE TABLE IF NOT EXISTS {_t(t.table)} ({cols})")
        out.append(f"CREATE TABLE IF NOT EXISTS {_t(t.dead_letter_table)} ({_q(t.key)} {t.key_column.type}, "
                   "payload VARCHAR NOT NULL, error_reason VARCHAR NOT NULL, failed_at TIMESTAMP NOT NULL, "
                   "source_position VARCHAR NOT NULL, source_ts TIMESTAMP, op VARCHAR NOT NULL)")
        if t.state_table:
            out.append(f"CREATE TABLE IF NOT EXISTS {_t(t.state_table)} (target_table VARCHAR NOT NULL, "
                       "position VARCHAR NOT NULL, updated_at TIMESTAMP NOT NULL)")
        return [sqlglot.transpile(s, read="duckdb", write=self.db.dialect)[0] for s in out]

    def ensure_tables(self) -> None:
        """Create the target, dead-letter and state tables if they do not exist (once per sink object)."""
        if not self._ready:
            for s in self.ddl():
                self.db.execute(s)
            self._ready = True

    def last_position(self) -> SourcePosition | None:
        """The position stored in the state table (None: no state table, or nothing applied yet)."""
        if not self.table.state_table:
            return None
        q = sql.render("SELECT position FROM :s WHERE target_table = :name", self.db.dialect,
                       s=sql.table(self.table.state_table), name=self.table.table)
        rows = self.db.fetch_all(q)
        return SourcePosition.parse(rows[0][0]) if rows else None

    # SQL ---------------------------------------------------------------------------------------
    def _merge_template(self) -> str:
        t = self.table
        k = _q(t.key)
        cast = {c.name: f"CAST(s.{_q(c.name)} AS {c.type})" for c in t.columns}
        sets = ", ".join(f"{_q(c.name)} = {cast[c.name]}" for c in t.columns if c.name != t.key)
        names = ", ".join(_q(c.name) for c in t.columns)
        values = ", ".join(cast[c.name] for c in t.columns)
        return (f"MERGE INTO {_t(t.table)} AS t USING (SELECT * FROM :stage) AS s ON t.{k} = s.{k} "
                f"WHEN MATCHED AND s.{_OP} = 'delete' THEN DELETE "
                f"WHEN MATCHED THEN UPDATE SET {sets} "
                f"WHEN NOT MATCHED AND s.{_OP} = 'upsert' THEN INSERT ({names}) VALUES ({values})")

    def _dlq_template(self) -> str:
        t = self.table
        k = _q(t.key)
        cols = [t.key, "payload", "error_reason", "failed_at", "source_position", "source_ts", "op"]
        types = {t.key: t.key_column.type, "payload": "VARCHAR", "error_reason": "VARCHAR", "failed_at": "TIMESTAMP",
                 "source_position": "VARCHAR", "source_ts": "TIMESTAMP", "op": "VARCHAR"}
        return (f"MERGE INTO {_t(t.dead_letter_table)} AS d USING (SELECT * FROM :stage) AS s "
                f"ON d.source_position = s.source_position AND (d.{k} = s.{k} OR (d.{k} IS NULL AND s.{k} IS NULL)) "
                f"WHEN NOT MATCHED THEN INSERT ({', '.join(_q(c) for c in cols)}) "
                f"VALUES ({', '.join(f'CAST(s.{_q(c)} AS {types[c]})' for c in cols)})")

    def _state_template(self) -> str:
        return (f"MERGE INTO {_t(self.table.state_table)} AS d USING (SELECT * FROM :stage) AS s "
                "ON d.target_table = s.target_table "
                "WHEN MATCHED THEN UPDATE SET position = s.position, updated_at = CAST(s.updated_at AS TIMESTAMP) "
                "WHEN NOT MATCHED THEN INSERT (target_table, position, updated_at) "
                "VALUES (s.target_table, s.position, CAST(s.updated_at AS TIMESTAMP))")

    # batches -----------------------------------------------------------------------------------
    def _split(self, events: Sequence[ChangeEvent]) -> tuple[dict, list[dict], Counter]:
        """Net change per key (accepted events only) and the parked rows of a batch."""
        t = self.table
        net: dict = {}
        parked: list[dict] = []
        reasons: Counter[str] = Counter()
        key_type = t.key_column.type

        def key_of(e: ChangeEvent):
            v = e.row.get(t.key)
            try:
                return None if v is None else _coerce(v, key_type)
            except (ValueError, TypeError, InvalidOperation, OverflowError):
                return None

        for e in events:
            if e.op == "delete":
                k = key_of(e)
                if k is not None:
                    net[k] = ("delete", None)
                    continue
                v = e.row.get(t.key)
                reason = (MISSING_REQUIRED.format(column=t.key) if v is None
                          else f"{t.key}: not a {key_type}: {str(v)[:60]!r}")
            else:
                row, reason = coerce_row(e.after, t)
                if reason is None:
                    net[row[t.key]] = ("upsert", row)
                    continue
            parked.append({t.key: key_of(e), "payload": payload_json(e.row), "error_reason": reason,
                           "failed_at": self.failed_at(e), "source_position": str(e.position),
                           "source_ts": e.ts, "op": e.op})
            reasons[reason] += 1
        return net, parked, reasons

    def _stage_rows(self, net: dict) -> tuple[list[str], list[tuple]]:
        t = self.table
        names = [c.name for c in t.columns] + [_OP]
        rows = []
        for k, (op, row) in net.items():
            if op == "delete":
                rows.append(tuple(k if c.name == t.key else None for c in t.columns) + ("delete",))
            else:
                rows.append(tuple(row[c.name] for c in t.columns) + ("upsert",))
        return names, rows

    def _dlq_columns(self) -> list[tuple[str, str]]:
        t = self.table
        return [(t.key, t.key_column.type), ("payload", "VARCHAR"), ("error_reason", "VARCHAR"),
                ("failed_at", "TIMESTAMP"), ("source_position", "VARCHAR"), ("source_ts", "TIMESTAMP"), ("op", "VARCHAR")]

    def _write(self, net: dict, parked: list[dict], position: SourcePosition) -> None:
        t = self.table
        names, rows = self._stage_rows(net)
        state = None
        if t.state_table:
            state = (["target_table", "position", "updated_at"], [(t.table, str(position), utc_now())])
        dlq_cols = self._dlq_columns()
        if isinstance(self.db, DuckDBDatabase):
            self._write_duckdb(names, rows, parked, dlq_cols, state)
            return
        # any other database: inline VALUES relations, one idempotent MERGE each
        d = self.db.dialect

        def values(alias: str, cols: list[str], data: list[tuple], decimals: set[int]) -> exp.Expression:
            # decimals travel as strings (BigQuery reads a numeric literal as FLOAT64) and are CAST back
            fixed = [tuple(str(v) if i in decimals and v is not None else v for i, v in enumerate(r)) for r in data]
            return sql.values_table(alias, cols, fixed)

        dec_target = {i for i, c in enumerate(t.columns) if _kind(c.type)[0] == "decimal"}
        if parked:
            dec = {0} if _kind(t.key_column.type)[0] == "decimal" else set()
            data = [tuple(p[c] for c, _ in dlq_cols) for p in parked]
            self.db.execute(sql.render(self._dlq_template(), d, stage=values("v", [c for c, _ in dlq_cols], data, dec)))
        if rows:
            self.db.execute(sql.render(self._merge_template(), d, stage=values("v", names, rows, dec_target)))
        if state:
            self.db.execute(sql.render(self._state_template(), d, stage=values("v", state[0], state[1], set())))

    def _write_duckdb(self, names, rows, parked, dlq_cols, state) -> None:
        t = self.table
        types = [_arrow_type(c.type) for c in t.columns] + [pa.string()]
        stage = pa.table({n: pa.array([r[i] for r in rows], type=ty) for i, (n, ty) in enumerate(zip(names, types))})
        dlq = pa.table({c: pa.array([p[c] for p in parked], type=_arrow_type(ty)) for c, ty in dlq_cols})
        with self.db.connect() as con:
            try:
                con.execute("BEGIN TRANSACTION")
                if parked:
                    con.register(_DLQ_STAGE, dlq)
                    con.execute(sql.render(self._dlq_template(), "duckdb", stage=exp.to_table(_DLQ_STAGE)))
                if rows:
                    con.register(_STAGE, stage)
                    con.execute(sql.render(self._merge_template(), "duckdb", stage=exp.to_table(_STAGE)))
                if state:
                    st = pa.table({"target_table": [state[1][0][0]], "position": [state[1][0][1]],
                                   "updated_at": pa.array([state[1][0][2]], type=pa.timestamp("us"))})
                    con.register("dw_cdc_state_stage", st)
                    con.execute(sql.render(self._state_template(), "duckdb", stage=exp.to_table("dw_cdc_state_stage")))
                con.execute("COMMIT")
            except Exception as e:
                try:
                    con.execute("ROLLBACK")
                except Exception:
                    pass
                raise DatabaseError(f"{self.db.name}: CDC batch failed and was rolled back: {e}") from e

    def apply(self, events: Iterable[ChangeEvent], *, start: SourcePosition | None = None,
              on_batch: Callable[[BatchReport], None] | None = None) -> SinkResult:
        """Apply ``events`` in batches of ``batch_rows``; park what the target would reject.

        Args:
            events: change events in commit order (e.g. ``source.read(position)``).
            start: the position ``events`` start from (reported as ``position`` if there are none).
            on_batch: called after each batch is written (e.g. to log it or persist the position).

        Returns:
            A :class:`SinkResult` with one :class:`BatchReport` per batch and the final position.

        Raises:
            dw_dagster.databases.DatabaseError: a write failed (on DuckDB the batch is rolled back;
                its position was not reported, so re-running from the last reported one is safe).
        """
        import time

        self.ensure_tables()
        result = SinkResult(position=start)
        for batch in _chunks(events, self.batch_rows):
            net, parked, reasons = self._split(batch)
            position = batch[-1].next_position
            t0 = time.perf_counter()
            self._write(net, parked, position)
            report = BatchReport(
                events=len(batch), applied=len(batch) - len(parked), parked=len(parked),
                upserted=sum(1 for op, _ in net.values() if op == "upsert"),
                deleted=sum(1 for op, _ in net.values() if op == "delete"),
                reasons=dict(reasons), first_position=batch[0].position, position=position,
                seconds=round(time.perf_counter() - t0, 3))
            result.batches.append(report)
            result.position = position
            if on_batch:
                on_batch(report)
        return result

    def run(self, source: ChangeSource, start: SourcePosition | None = None, **kwargs) -> SinkResult:
        """Read ``source`` from ``start`` (default: the stored position, else the beginning) and apply it.

        Returns:
            As :meth:`apply`.
        """
        self.ensure_tables()
        start = start or self.last_position()
        return self.apply(source.read(start), start=start, **kwargs)


__all__ = [
    "BatchReport", "CdcSink", "Column", "MISSING_REQUIRED", "ORDERS_COLUMNS", "ORDERS_TABLE", "POSITION_METADATA_KEY",
    "SinkResult", "SinkTable", "coerce_row", "commit_time", "payload_json", "payload_to_row", "position_from_metadata",
    "replay_select_sql", "utc_now",
]
