"""The ledger's tables, in the Dagster instance's own database (SQLite, or PostgreSQL with dagster-postgres).

Unique keys carry the ledger's promises: one decision per change set version
(``dw_ledger_decisions``), one ticket per stage (``dw_ledger_stages``), one receipt chain head per
asset (``dw_ledger_receipt_heads``), one incident per external id (``dw_ledger_incidents``). The
state machine that writes them is :class:`dw_dagster.core.ledger.Ledger`; the rows it reads back are
the frozen dataclasses at the end (:class:`StageRow`, :class:`ChangeSetRow`, :class:`IncidentRow`,
:class:`ReceiptLink`).
"""

import json
import os
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

SCHEMA_VERSION = 1
_meta = sa.MetaData()

#: change set states (latest version's lifecycle)
PROPOSED, APPROVED, REJECTED, EXPIRED, SUPERSEDED = "proposed", "approved", "rejected", "expired", "superseded"
RUNNING, HALTED, APPLIED, FAILED = "running", "halted", "applied", "failed"
#: states the remediation sensor looks at
ACTIVE_STATES = (PROPOSED, APPROVED, RUNNING, HALTED)
#: states whose window is held (an approved repair not yet ended), whichever version is latest
HELD_STATES = (APPROVED, RUNNING, HALTED)
#: states that end a version without a repair that proved itself: its incident may be diagnosed again
ENDED_STATES = (REJECTED, EXPIRED, FAILED)
#: stage states
ISSUED, STARTED, SUCCEEDED, STAGE_FAILED, ABANDONED = "issued", "started", "succeeded", "failed", "abandoned"

change_sets_t = sa.Table(
    "dw_ledger_change_sets", _meta,
    sa.Column("change_set_id", sa.String(255), primary_key=True),
    sa.Column("version", sa.String(64), primary_key=True),
    sa.Column("content_key", sa.String(64), nullable=False),
    sa.Column("target_asset", sa.String(1024), nullable=False),
    sa.Column("incident_id", sa.String(255), nullable=False),
    sa.Column("domain", sa.String(255), nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("latest", sa.Boolean, nullable=False),
    sa.Column("recorded_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("note", sa.Text, nullable=False, default=""),
    sa.Column("body", sa.Text, nullable=False),
    sa.Index("dw_ledger_cs_target", "target_asset"),
    sa.Index("dw_ledger_cs_incident", "incident_id"),
    sa.Index("dw_ledger_cs_state", "state", "latest"),
    sa.Index("dw_ledger_cs_content", "change_set_id", "content_key"),
)

decisions_t = sa.Table(
    "dw_ledger_decisions", _meta,
    sa.Column("approval_id", sa.String(64), primary_key=True),
    sa.Column("change_set_id", sa.String(255), nullable=False),
    sa.Column("version", sa.String(64), nullable=False),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("approver", sa.String(320), nullable=False),
    sa.Column("method", sa.String(32), nullable=False),
    sa.Column("decided_at", sa.Float, nullable=False),
    sa.Column("active", sa.Boolean, nullable=False),
    sa.Column("withdrawn_reason", sa.Text, nullable=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Index("dw_ledger_decision_once", "change_set_id", "version", unique=True,
             sqlite_where=sa.text("active = 1"), postgresql_where=sa.text("active")),
    sa.Index("dw_ledger_decision_cs", "change_set_id"),
)

credentials_t = sa.Table(
    "dw_ledger_credentials", _meta,
    sa.Column("credential_id", sa.String(128), primary_key=True),
    sa.Column("purpose", sa.String(512), nullable=False),
    sa.Column("used_at", sa.Float, nullable=False),
)

stages_t = sa.Table(
    "dw_ledger_stages", _meta,
    sa.Column("change_set_id", sa.String(255), primary_key=True),
    sa.Column("version", sa.String(64), primary_key=True),
    sa.Column("stage", sa.String(64), primary_key=True),
    sa.Column("approval_id", sa.String(64), nullable=False),
    sa.Column("ticket", sa.String(64), nullable=False, unique=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("job_name", sa.String(255), nullable=True),
    sa.Column("expect", sa.Text, nullable=True),
    # who dispatched the ticket (JSON): the sensor's code location and repository and the daemon ticks
    # whose reserved run ids may take it (see dw_dagster.guard.admission); NULL for a ticket issued in process
    sa.Column("dispatch", sa.Text, nullable=True),
    sa.Column("issued_at", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float, nullable=True),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("result", sa.Text, nullable=True),
    sa.Index("dw_ledger_stage_run", "run_id"),
)

receipts_t = sa.Table(
    "dw_ledger_receipts", _meta,
    sa.Column("asset_key", sa.String(1024), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("receipt_id", sa.String(64), nullable=False, unique=True),
    sa.Column("hash", sa.String(64), nullable=False),
    sa.Column("previous_hash", sa.String(64), nullable=True),
    sa.Column("change_set_id", sa.String(255), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

receipt_heads_t = sa.Table(
    "dw_ledger_receipt_heads", _meta,
    sa.Column("asset_key", sa.String(1024), primary_key=True),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("hash", sa.String(64), nullable=False),
)

incidents_t = sa.Table(
    "dw_ledger_incidents", _meta,
    sa.Column("incident_id", sa.String(255), primary_key=True),
    sa.Column("asset_key", sa.String(1024), nullable=False),
    sa.Column("source", sa.String(32), nullable=False),
    sa.Column("external_id", sa.String(255), nullable=True),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("linked_to", sa.String(255), nullable=True),
    sa.Column("opened_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("note", sa.Text, nullable=False, default=""),
    sa.Column("body", sa.Text, nullable=False),
    sa.Index("dw_ledger_incident_asset", "asset_key", "state"),
    sa.Index("dw_ledger_incident_external", "source", "external_id"),
)

control_t = sa.Table(
    "dw_ledger_control", _meta,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
)

audit_t = sa.Table(
    "dw_ledger_audit", _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("subject", sa.String(1024), nullable=False),
    sa.Column("by", sa.String(320), nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Index("dw_ledger_audit_subject", "kind", "subject"),
)

quarantine_t = sa.Table(
    "dw_ledger_quarantine", _meta,
    sa.Column("ref", sa.String(512), primary_key=True),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("asset_key", sa.String(1024), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("first_seen", sa.Float, nullable=False),
    sa.Column("last_seen", sa.Float, nullable=False),
)

access_t = sa.Table(
    "dw_ledger_access", _meta,
    sa.Column("request_id", sa.String(64), primary_key=True),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("grantee", sa.String(320), nullable=False),
    sa.Column("requested_by", sa.String(320), nullable=False),
    sa.Column("database", sa.String(1024), nullable=False),
    sa.Column("content_key", sa.String(64), nullable=False),
    sa.Column("requested_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("granted_at", sa.Float, nullable=True),
    sa.Column("revoked_at", sa.Float, nullable=True),
    sa.Column("reminder_claimed_at", sa.Float, nullable=True),
    sa.Column("reminded_at", sa.Float, nullable=True),
    sa.Column("revoke_attempts", sa.Integer, nullable=False, default=0),
    sa.Column("next_revoke_at", sa.Float, nullable=True),
    sa.Column("incident_id", sa.String(255), nullable=True),
    sa.Column("note", sa.Text, nullable=False, default=""),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("result", sa.Text, nullable=False, default="{}"),
    sa.Index("dw_ledger_access_state", "state", "expires_at"),
    sa.Index("dw_ledger_access_content", "content_key"),
)

ladder_t = sa.Table(
    "dw_ledger_ladder", _meta,
    sa.Column("subject", sa.String(512), primary_key=True),
    sa.Column("step", sa.String(32), primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("change_set_id", sa.String(255), nullable=False),
    sa.Column("version", sa.String(64), nullable=False),
    sa.Column("incident_id", sa.String(255), nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("shown", sa.Boolean, nullable=False, default=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Index("dw_ledger_ladder_cs", "change_set_id"),
    sa.Index("dw_ledger_ladder_incident", "incident_id"),
    sa.Index("dw_ledger_ladder_shown", "shown"),
)

sessions_t = sa.Table(  # the review page's server-side sessions (dw_dagster.approval.sessions)
    "dw_ledger_sessions", _meta,
    sa.Column("id_hash", sa.String(64), primary_key=True),  # SHA-256 of the cookie's id: the table never holds the id
    sa.Column("origin", sa.String(512), nullable=False),  # the server (scheme://host:port) the session was made for
    sa.Column("kind", sa.String(16), nullable=False),  # login (in progress) or session
    sa.Column("email", sa.String(320), nullable=True),
    sa.Column("csrf", sa.String(128), nullable=True),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("dw_ledger_sessions_expiry", "expires_at"),
    sa.Index("dw_ledger_sessions_email", "email"),
)

meta_t = sa.Table(
    "dw_ledger_meta", _meta,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(255), nullable=False),
)


# -- rows as the ledger reads them back ----------------------------------------------------------

@dataclass(frozen=True)
class StageRow:
    """One stage of one change set version, as the ledger holds it.

    ``state``: issued (ticket given to a run request), started (a run presented the ticket and
    holds it), succeeded / failed (completed by the stage's own code or reconciled from the
    bound run's end), abandoned (its bound run disappeared or ended without completing).
    """

    change_set_id: str
    version: str
    stage: str
    approval_id: str
    ticket: str
    state: str
    run_id: str | None
    job_name: str | None
    expect: str | None
    issued_at: float
    started_at: float | None
    finished_at: float | None
    result: dict | None
    #: ``{"location", "repository", "ticks": [tick ids]}`` of the sensor evaluation that issued the ticket
    #: (None: issued in process, e.g. by the LocalSensorDaemon; then only runs without a code location take it)
    dispatch: dict | None = None


@dataclass(frozen=True)
class ChangeSetRow:
    """A recorded change set version: its state and its body (JSON of the ChangeSet)."""

    change_set_id: str
    version: str
    content_key: str
    target_asset: str
    incident_id: str
    domain: str
    state: str
    latest: bool
    recorded_at: float
    expires_at: float
    updated_at: float
    note: str
    body: str


@dataclass(frozen=True)
class IncidentRow:
    incident_id: str
    asset_key: str
    source: str
    external_id: str | None
    state: str
    linked_to: str | None
    opened_at: float
    updated_at: float
    attempts: int
    note: str
    body: str


@dataclass(frozen=True)
class AccessRow:
    """One access request as the ledger holds it (:mod:`dw_dagster.core.ledger_access`); times are epoch seconds."""

    request_id: str
    state: str
    grantee: str
    requested_by: str
    database: str
    content_key: str
    requested_at: float
    expires_at: float
    updated_at: float
    granted_at: float | None
    revoked_at: float | None
    reminder_claimed_at: float | None
    reminded_at: float | None
    revoke_attempts: int
    next_revoke_at: float | None
    incident_id: str | None
    note: str
    body: str
    result: dict


@dataclass(frozen=True)
class ReceiptLink:
    asset_key: str
    seq: int
    receipt_id: str
    hash: str
    previous_hash: str | None
    change_set_id: str
    run_id: str | None
    created_at: float


@dataclass(frozen=True)
class LadderRow:
    """One step of an escalation ladder as the ledger holds it (see :mod:`dw_dagster.core.ledger_ladder`)."""

    subject: str
    step: str
    kind: str
    change_set_id: str
    version: str
    incident_id: str
    at: float
    shown: bool
    body: dict


def _row(cls, r) -> Any:
    d = dict(r._mapping)
    d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
    if cls is StageRow:
        d["result"] = json.loads(d["result"]) if d.get("result") else None
        d["dispatch"] = json.loads(d["dispatch"]) if d.get("dispatch") else None
    if cls is AccessRow:
        d["result"] = json.loads(d["result"]) if d.get("result") else {}
    if cls is LadderRow:
        d["body"] = json.loads(d["body"]) if d.get("body") else {}
        d["shown"] = bool(d["shown"])
    return cls(**d)


#: columns added after a table was first created: (table, column), added by :func:`add_missing_columns`
ADDED_COLUMNS = ((stages_t, "dispatch"),)


def add_missing_columns(engine: Engine) -> None:
    """``ALTER TABLE ... ADD COLUMN`` for each of :data:`ADDED_COLUMNS` a ledger made by an earlier
    dw_dagster lacks (all nullable: rows written before read back as before)."""
    inspector = sa.inspect(engine)
    for table, name in ADDED_COLUMNS:
        have = {c["name"] for c in inspector.get_columns(table.name)}
        if name in have:
            continue
        col = table.c[name]
        ddl = f'ALTER TABLE {table.name} ADD COLUMN {name} {col.type.compile(dialect=engine.dialect)}'
        with engine.begin() as conn:
            conn.exec_driver_sql(ddl)


def stored_schema(engine: Engine) -> int | None:
    """The schema version a ledger database records (``dw_ledger_meta``), or None (a new database)."""
    if not sa.inspect(engine).has_table(meta_t.name):
        return None
    with engine.connect() as conn:
        value = conn.execute(sa.select(meta_t.c.value).where(meta_t.c.key == "schema")).scalar()
    return int(value) if value is not None else None


def missing_columns(engine: Engine) -> dict[str, list[str]]:
    """``{table: [columns]}`` the ledger's tables lack in ``engine``'s database (empty when none does)."""
    inspector = sa.inspect(engine)
    out: dict[str, list[str]] = {}
    for table in _meta.sorted_tables:
        have = {c["name"] for c in inspector.get_columns(table.name)}
        lacking = [c.name for c in table.columns if c.name not in have]
        if lacking:
            out[table.name] = lacking
    return out


# -- where an instance's ledger lives -------------------------------------------------------------

def _sqlite_engine(url: str) -> Engine:
    engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False}, poolclass=sa.pool.NullPool)

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):  # pragma: no cover - exercised by every test
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (pysqlite's implicit BEGIN is deferred)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout = 60000")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn):  # pragma: no cover
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # take the write lock up front: no upgrade deadlocks

    return engine


def ledger_url(instance: Any) -> str | None:
    """The SQLAlchemy URL of ``instance``'s ledger, or None for an in-memory instance."""
    rs = instance.run_storage
    url = getattr(rs, "postgres_url", None)
    if url:
        return url
    conn_string = getattr(rs, "_conn_string", None)
    if conn_string and conn_string.startswith("sqlite:///"):
        path = conn_string[len("sqlite:///"):]
        folder = os.path.dirname(path)
        return f"sqlite:///{os.path.join(folder, 'dw_ledger.db')}"
    return None
